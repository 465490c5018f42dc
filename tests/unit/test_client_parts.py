"""The client's accumulator and block grants, without a daemon: the bookkeeping that must survive a lost
session and a daemon that reports a batch twice, and what the accumulator tells the daemon of its batches (a
real segment, the daemon's side of its control area read and claimed as the daemon does)."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from client_stub import block_grants, futures
from client_stub.accumulator import RecordAccumulator
from client_stub.block_grants import BlockGrants
from client_stub.contract import batch_slots, ipc
from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout
from client_stub.errors import KafkaError
from client_stub.fastpath import Appender, OpenBatch
from client_stub.futures import RecordFuture, completer
from client_stub.partitioner import Partitioner
from tests.support.fastpath import MappedSegment, mapped_segment

BASE_TS = 1_700_000_000_000
LAYOUT = Layout(4096, 8)


def test_a_grant_for_a_lost_session_is_not_the_waiters() -> None:
    posted: list[ipc.Message] = []
    grants = BlockGrants(posted.append)
    request = grants.request(3, True, 1000)
    grants.granted(ipc.Grant(request.request_id, [4, 5, 6]))
    assert request.blocks == [4, 5, 6]
    grants.forget()  # the session is lost before the waiter wakes: blocks 4-6 may be another client's now
    assert grants.finished(request) is False


def test_a_waiter_that_gives_up_sends_a_late_grant_back() -> None:
    posted: list[ipc.Message] = []
    grants = BlockGrants(posted.append)
    request = grants.request(2, True, 1000)
    assert grants.finished(request) is True  # timed out, in this session
    grants.granted(ipc.Grant(request.request_id, [7, 8]))
    assert posted[-1] == ipc.Release([7, 8])


class SpareGrants(NamedTuple):
    """A client's block grants (``posted``: what they ask the daemon), and both sides of its segment's control
    area; the grants are attached to a session by the test (with :meth:`policy` for the Appender's)."""

    grants: BlockGrants
    posted: list[ipc.Message]
    client: ControlArea
    daemon: ControlArea
    policies: list[tuple[list[int] | None, int, int, int]]

    def policy(self, spare: list[int] | None, floor: int, until_ns: int, wanted_base: int) -> int:
        """An Appender's spare_policy() that takes no block itself: what it was told."""
        self.policies.append((spare, floor, until_ns, wanted_base))
        return 0

    def wanted(self) -> int:
        """The spare blocks the header says the client would take, as the daemon reads it."""
        return self.daemon.header(batch_slots.SPARE_WANTED)


@pytest.fixture
def spare() -> Iterator[SpareGrants]:
    posted: list[ipc.Message] = []
    with mapped_segment(LAYOUT) as shared:
        client = ControlArea(shared.segment.control, LAYOUT.block_count)
        try:
            yield SpareGrants(BlockGrants(posted.append), posted, client, shared.daemon, [])
        finally:
            client.release()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """BlockGrants' clock (time.monotonic()), which the test moves on."""
    now = [1000.0]
    monkeypatch.setattr(block_grants, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_the_header_says_how_many_spare_blocks_the_client_would_take_and_blocks_handed_back_are_spare(
        spare: SpareGrants) -> None:
    grants, posted = spare.grants, spare.posted
    grants.handed_back([1])  # no session yet: not this client's
    assert grants.spare == []
    grants.attach(spare.client, spare.policy)
    assert spare.wanted() == 4  # a grant's worth
    assert grants.take_spare(1000) is None
    [request] = posted
    assert isinstance(request, ipc.Blocks) and request.count == 4
    assert spare.wanted() == 0  # asked for already
    grants.granted(ipc.Grant(request.request_id, [0, 1, 2, 3]))
    assert spare.wanted() == 0
    assert grants.take_spare(1000) == 3
    assert spare.wanted() == 1 and len(posted) == 1  # more than half of the grant left: none asked for
    grants.handed_back([5])
    assert grants.spare == [0, 1, 2, 5] and spare.wanted() == 0
    grants.give_back_spare()  # the pool is short
    assert posted[-1] == ipc.Release([0, 1, 2, 5]) and spare.wanted() == 4
    grants.forget()
    grants.handed_back([7])  # of the session that is gone
    assert grants.spare == []


def test_after_a_burst_the_spare_blocks_handed_back_fall_to_what_the_rate_needs(
        spare: SpareGrants, clock: list[float]) -> None:
    grants, posted = spare.grants, spare.posted
    grants.pool_blocks = 4096
    grants.attach(spare.client, spare.policy)
    fresh = itertools.count()

    def send(every_s: float) -> None:
        """A batch opened ``every_s`` after the last, and one batch reported, as the daemon does: a block handed
        back if the header asks for one; a request granted at once."""
        clock[0] += every_s
        grants.take_spare(1000)
        for request in [m for m in posted if isinstance(m, ipc.Blocks)]:
            grants.granted(ipc.Grant(request.request_id, [next(fresh) for _ in range(request.count)]))
        posted.clear()
        if spare.wanted():
            grants.handed_back([next(fresh)])

    for _ in range(2000):  # 40 000 a second
        send(0.000025)
    after_burst = len(grants.spare)
    assert after_burst >= 100  # a grant's worth at that rate
    for _ in range(200):  # 50 a second: a few spare blocks are enough, and none comes back
        send(0.02)
    assert spare.wanted() == 0
    assert len(grants.spare) <= after_burst - 195


def test_blocks_send_took_itself_count_for_the_rate_and_send_takes_none_past_its_horizon(
        spare: SpareGrants, clock: list[float]) -> None:
    grants = spare.grants
    grants.pool_blocks = 4096
    taken_by_send = [0]

    def policy(at_hand: list[int] | None, floor: int, until_ns: int, wanted_base: int) -> int:
        """An Appender's spare_policy() whose send() took ``taken_by_send`` blocks since the last call."""
        spare.policies.append((at_hand, floor, until_ns, wanted_base))
        taken, taken_by_send[0] = taken_by_send[0], 0
        return taken

    grants.attach(spare.client, policy)
    assert spare.policies[-1][1:] == (4 // 2 + 2, 0, 4)  # no rate measured yet: the first block is take_spare()'s
    grants.take_spare(1000)  # none at hand: asked for
    assert spare.policies[-1][1:] == (1, int((1000.0 + block_grants._GRANT_HORIZON_S) * 1e9), 0)
    # send() took 99 blocks itself in the 30 ms that follow, and then leaves the next to take_spare(): the rate
    # is of those 99 (3 300 a second), and a grant 25 ms of it.
    taken_by_send[0] = 99
    clock[0] += 0.030
    grants.take_spare(1000)
    assert spare.wanted() == math.ceil(99 / 0.030 * block_grants._GRANT_HORIZON_S) - 4  # less the 4 asked for
    # Blocks send() took count when the session ends too: 5 in the next 30 ms, a grant of 5 asked for after them.
    taken_by_send[0] = 5
    grants.forget()
    grants.attach(spare.client, policy)
    clock[0] += 0.030
    grants.take_spare(1000)
    assert isinstance(spare.posted[-1], ipc.Blocks) and spare.posted[-1].count == 5


def test_a_grant_that_falls_below_what_is_asked_for_wants_nothing_more(
        spare: SpareGrants, clock: list[float]) -> None:
    # A burst asks for a large grant; before it comes, the rate falls and so does a grant's worth.
    grants, posted = spare.grants, spare.posted
    grants.pool_blocks = 4096
    appender = Appender(threading.Lock(), {}, {}, RecordFuture, print, print, {}, True, {}, {}, itertools.count(1),
                        print)
    grants.attach(spare.client, appender.spare_policy)
    fresh = itertools.count()
    for _ in range(2000):  # 40 000 blocks a second, each request granted at once
        clock[0] += 0.000025
        grants.take_spare(1000)
        for request in [m for m in posted if isinstance(m, ipc.Blocks)]:
            grants.granted(ipc.Grant(request.request_id, [next(fresh) for _ in range(request.count)]))
        posted.clear()
    while not posted:  # the next request is not granted yet
        clock[0] += 0.000025
        grants.take_spare(1000)
    [asked] = posted
    assert isinstance(asked, ipc.Blocks) and asked.count > 4
    clock[0] += 1.0  # then nothing for a second: a grant's worth falls to the least, below what is asked for
    grants.take_spare(1000)
    assert spare.wanted() == 0 and posted == [asked]


def test_a_request_for_spare_blocks_says_so_in_the_header(spare: SpareGrants) -> None:
    spare.grants.attach(spare.client, spare.policy)
    assert spare.wanted() == 4
    spare.grants.top_up(1000)  # as a send() waiting for a block does
    [request] = spare.posted
    assert isinstance(request, ipc.Blocks) and spare.wanted() == 0
    spare.grants.granted(ipc.Grant(request.request_id, [0, 1]))  # fewer than asked: the pool had no more
    assert spare.wanted() == 2
    # A segment taken back by the next session does not say what this one wanted.
    spare.grants.forget()
    assert spare.wanted() == 0


# -- the accumulator ----------------------------------------------------------------------------------


@pytest.fixture
def shared() -> Iterator[MappedSegment]:
    """The session's segment, and the daemon's side of its control area."""
    with mapped_segment(LAYOUT) as mapped:
        yield mapped


@pytest.fixture
def posted() -> list[ipc.Message]:
    """What the accumulator posted for the daemon."""
    return []


@pytest.fixture
def accumulator(shared: MappedSegment, posted: list[ipc.Message]) -> Iterator[RecordAccumulator]:
    """An accumulator in a session on ``shared``, as the I/O thread opens it."""
    made = RecordAccumulator(Partitioner("murmur2_random"), posted.append)
    made.control = ControlArea(shared.segment.control, LAYOUT.block_count)
    yield made
    made.release_open()
    made.control.release()


@pytest.fixture
def appender(accumulator: RecordAccumulator) -> Appender[RecordFuture]:
    """The producer's Appender over ``accumulator``, as the producer makes it: what counts the reports."""
    return Appender(threading.Lock(), accumulator.open, {"t": 3, "u": 2}, RecordFuture, accumulator.seal_if_open,
                    print, {}, True, {"t": 0, "u": 1}, accumulator.unreported, accumulator.batch_ids, print)


def open_on(accumulator: RecordAccumulator, shared: MappedSegment, blocks: list[int], *, topic: str = "t",
            partition: int = 0, records: int = 0) -> OpenBatch[RecordFuture]:
    """A batch opened on ``blocks`` (the session's topic 0), with ``records`` records appended."""
    batch = accumulator.open_batch(topic, 0, partition, blocks, shared.segment.blocks(blocks[0], len(blocks)),
                                   BASE_TS)
    for n in range(records):
        assert batch.append(b"k", b"v%d" % n, (), BASE_TS + n, RecordFuture(None, BASE_TS + n, 1, 2))
    return batch


def closed_batch(accumulator: RecordAccumulator, shared: MappedSegment, records: int) -> OpenBatch[RecordFuture]:
    batch = open_on(accumulator, shared, [0], records=records)
    accumulator.seal(batch)
    return batch


def test_a_batch_is_never_counted_out_for_more_records_than_it_holds(accumulator: RecordAccumulator,
                                                                     appender: Appender[RecordFuture],
                                                                     shared: MappedSegment) -> None:
    # The records outstanding are counted down by these counts, and may not go below zero: a daemon that
    # reported records twice would otherwise leave flush() waiting on a count that never comes down.
    batch = closed_batch(accumulator, shared, 5)
    _, delivered, failed = appender.reported([[batch.batch_id, 0, 3, 10, -1, None],
                                              [batch.batch_id, 0, 3, 10, -1, None],
                                              [batch.batch_id, 0, ipc.WHOLE_BATCH, 10, -1, None]])
    assert (delivered, failed) == (5, 0)
    assert batch.batch_id not in accumulator.unreported


def test_a_batch_reported_in_part_and_then_whole_completes_the_rest(accumulator: RecordAccumulator,
                                                                    appender: Appender[RecordFuture],
                                                                    shared: MappedSegment) -> None:
    # The daemon split a batch and reported its first part; then it died, and the daemon that took the
    # session back sent the whole batch again and reports it whole: the other records complete now.
    batch = closed_batch(accumulator, shared, 10)
    assert appender.reported([[batch.batch_id, 0, 4, 100, -1, None]]) == ([(batch, 0, 4, 100, -1, None)], 4, 0)
    completer.complete(batch.futures, 0, 4, "t", 0, 100, -1, None)
    assert appender.reported([[batch.batch_id, 0, ipc.WHOLE_BATCH, 500, -1, None]]) == (
        [(batch, 0, 10, 500, -1, None)], 6, 0)
    completer.complete(batch.futures, 0, 10, "t", 0, 500, -1, None)
    assert [f.result(0).offset for f in batch.futures] == [100, 101, 102, 103, 504, 505, 506, 507, 508, 509]
    assert batch.batch_id not in accumulator.unreported


def test_a_failed_report_counts_its_records_failed(accumulator: RecordAccumulator, appender: Appender[RecordFuture],
                                                   shared: MappedSegment) -> None:
    delivered, failed = closed_batch(accumulator, shared, 2), closed_batch(accumulator, shared, 3)
    error = ipc.error_to_wire(KafkaError("refused"))
    rows = [[delivered.batch_id, 0, ipc.WHOLE_BATCH, 7, -1, None], [failed.batch_id, 0, ipc.WHOLE_BATCH, -1, -1, error],
            [12345, 0, 1, 0, -1, None]]  # of no batch here: of a lost session, or given up on
    assert appender.reported(rows) == ([(delivered, 0, 2, 7, -1, None), (failed, 0, 3, -1, -1, error)], 2, 3)
    assert accumulator.unreported == {}


@pytest.mark.parametrize(("row", "exception"), [
    ([1, 0, 1, 0, -1], ValueError),  # five fields
    ([1, "0", 1, 0, -1, None], TypeError),
    ([1, 0, None, 0, -1, None], TypeError),
    ([1, -1, 1, 0, -1, None], ValueError),
    (7, TypeError),
])
def test_a_report_that_is_not_one_is_refused(accumulator: RecordAccumulator, appender: Appender[RecordFuture],
                                             shared: MappedSegment, row: object, exception: type[Exception]) -> None:
    batch = closed_batch(accumulator, shared, 1)
    assert batch.batch_id == 1
    with pytest.raises(exception):
        appender.reported([row])
    assert accumulator.unreported == {1: batch} and batch.reported == 0


def test_seal_all_closes_every_open_batch_and_says_wakeup_once(accumulator: RecordAccumulator,
                                                               shared: MappedSegment,
                                                               posted: list[ipc.Message]) -> None:
    full = [open_on(accumulator, shared, [0, 1], partition=0, records=2),
            open_on(accumulator, shared, [3], topic="u", partition=1, records=1)]
    empty = open_on(accumulator, shared, [5, 6], partition=2)
    posted.clear()
    accumulator.seal_all()
    assert accumulator.open == {}
    # Published full, for the daemon to claim at once; the empty batch's blocks go back.
    for batch in full:
        assert batch_slots.unpack_published(shared.daemon.published(batch.first_block)) == (
            batch.record_count, batch.pos, True)
    assert posted == [ipc.Release([5, 6]), ipc.Wakeup()]
    assert list(accumulator.unreported.values()) == full
    posted.clear()
    accumulator.seal_all()
    assert posted == []  # nothing open: nothing to say
    assert empty.batch_id not in accumulator.unreported


def test_blocks_granted_again_close_the_open_batch_that_was_on_them(accumulator: RecordAccumulator,
                                                                    shared: MappedSegment) -> None:
    # The daemon claimed a batch, sent it and freed its blocks before this process saw the claim; it grants one of
    # them again: that batch takes no more records.
    claimed = open_on(accumulator, shared, [2, 3], partition=0, records=2)
    other = open_on(accumulator, shared, [5], partition=1, records=1)
    assert shared.daemon.claim(2) == (2, claimed.pos)
    accumulator.granted([6])
    assert accumulator.open == {("t", 0): claimed, ("t", 1): other}
    accumulator.granted([3, 6])
    assert accumulator.open == {("t", 1): other}
    assert claimed.capacity == 0 and claimed.batch_id in accumulator.unreported  # its report is still to come


def test_a_report_of_a_batch_still_open_closes_it(accumulator: RecordAccumulator, appender: Appender[RecordFuture],
                                                  shared: MappedSegment, posted: list[ipc.Message]) -> None:
    # The daemon claimed it at its linger and reports it before this process appended again.
    batch = open_on(accumulator, shared, [1], records=3)
    shared.daemon.claim(1)
    posted.clear()
    assert appender.reported([[batch.batch_id, 0, ipc.WHOLE_BATCH, 40, -1, None]]) == (
        [(batch, 0, 3, 40, -1, None)], 3, 0)
    assert accumulator.open == {} and accumulator.unreported == {} and batch.capacity == 0
    assert posted == []  # its blocks are the daemon's to free


def test_a_report_of_a_batch_still_open_moves_its_topics_records_without_a_key_on(
        accumulator: RecordAccumulator, shared: MappedSegment) -> None:
    # As a batch the fast path fills: the sticky partition of records without a key was the batch's.
    sticky = {"t": 2, "u": 2}
    appender = Appender(threading.Lock(), accumulator.open, {"t": 3, "u": 3}, RecordFuture, accumulator.seal_if_open,
                        print, sticky, True, {"t": 0, "u": 1}, accumulator.unreported, accumulator.batch_ids, print)
    batch = open_on(accumulator, shared, [1], partition=2, records=1)
    appender.reported([[batch.batch_id, 0, ipc.WHOLE_BATCH, 40, -1, None]])
    assert sticky == {"u": 2}


def test_resume_notices_name_every_batch_not_wholly_reported_in_the_order_opened(
        accumulator: RecordAccumulator, appender: Appender[RecordFuture], shared: MappedSegment) -> None:
    reported = open_on(accumulator, shared, [0], partition=0, records=1)
    in_part = open_on(accumulator, shared, [1, 2], partition=1, records=4)
    unreported = open_on(accumulator, shared, [4], topic="u", partition=0, records=2)
    appender.reported([[reported.batch_id, 0, ipc.WHOLE_BATCH, 0, -1, None], [in_part.batch_id, 0, 2, 0, -1, None]])
    accumulator.seal_all()  # the session ends: every batch is closed before the next HELLO offers them
    now = unreported.created + 1.5
    assert accumulator.resume_notices(now) == [
        ipc.SealNotice(batch.batch_id, batch.first_block, batch.block_count, batch.topic, batch.partition,
                       batch.record_count, batch.pos, BASE_TS, batch.max_timestamp, int((now - batch.created) * 1000))
        for batch in (in_part, unreported)]
    assert [in_part.record_count, in_part.block_count, unreported.max_timestamp] == [4, 2, BASE_TS + 1]


def test_batches_unreported_past_the_limit_are_forgotten_an_open_one_closed(accumulator: RecordAccumulator,
                                                                           shared: MappedSegment) -> None:
    closed = closed_batch(accumulator, shared, 1)
    still_open = open_on(accumulator, shared, [3], partition=1, records=1)
    assert accumulator.overdue(still_open.created + 1.0, 1.5) == []
    assert accumulator.overdue(still_open.created + 2.0, 1.5) == [closed, still_open]
    assert accumulator.open == {} and accumulator.unreported == {} and still_open.capacity == 0


def test_a_future_first_waited_on_or_watched_says_so_and_completed_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    watched = []
    monkeypatch.setattr(futures, "on_watch", lambda: watched.append(1))
    future = RecordFuture(None, BASE_TS, 1, 2)
    # The producer's own look (a report counted again) is no waiting: the future stays settled in place.
    assert not future.completed() and watched == [] and future._cond is None
    future.add_done_callback(lambda f: None)
    assert watched == [1]
    future.done()  # once: the Condition is made once
    assert watched == [1]
    completer.complete([future], 0, 1, "t", 0, 7, -1, None)
    assert future.completed() and future.result(0).offset == 7
