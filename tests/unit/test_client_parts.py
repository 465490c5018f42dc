"""The client's accumulator and block grants, without a daemon: the bookkeeping that must survive a lost
session and a daemon that reports a batch twice."""

from __future__ import annotations

import time

from client_stub.accumulator import RecordAccumulator
from client_stub.block_grants import BlockGrants
from client_stub.contract import ipc
from client_stub.futures import RecordFuture, completer
from client_stub.partitioner import Partitioner

BASE_TS = 1_700_000_000_000


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


def sealed_batch(accumulator: RecordAccumulator, records: int) -> object:
    view = memoryview(bytearray(4096))
    batch = accumulator.open_batch("t", 0, [0], view, BASE_TS)
    for n in range(records):
        assert batch.append(b"k", b"v%d" % n, (), BASE_TS + n, RecordFuture(None, BASE_TS + n, 1, 2))
    accumulator.seal(batch)
    return batch


def test_a_batch_is_never_counted_out_for_more_records_than_it_holds() -> None:
    # The records outstanding are counted down by these counts, and may not go below zero: a daemon that
    # reported records twice would otherwise leave flush() waiting on a count that never comes down.
    accumulator = RecordAccumulator(Partitioner("murmur2_random"), lambda message: None, lambda: None)
    batch = sealed_batch(accumulator, 5)
    counted = accumulator.reported([[batch.batch_id, 0, 3, 10, -1, None],
                                    [batch.batch_id, 0, 3, 10, -1, None],
                                    [batch.batch_id, 0, ipc.WHOLE_BATCH, 10, -1, None]], time.monotonic())
    assert sum(fresh for _, _, fresh in counted) == 5
    assert batch.batch_id not in accumulator.sealed


def test_a_batch_reported_in_part_and_then_whole_completes_the_rest() -> None:
    # The daemon split a batch and reported its first part; then it died, and the daemon that took the
    # session back sent the whole batch again and reports it whole: the other records complete now.
    accumulator = RecordAccumulator(Partitioner("murmur2_random"), lambda message: None, lambda: None)
    batch = sealed_batch(accumulator, 10)
    [(_, first_part, fresh)] = accumulator.reported([[batch.batch_id, 0, 4, 100, -1, None]], time.monotonic())
    assert (first_part.first_record, first_part.record_count, fresh) == (0, 4, 4)
    completer.complete(batch.futures, 0, 4, "t", 0, 100, -1, None)
    [(_, whole, fresh)] = accumulator.reported([[batch.batch_id, 0, ipc.WHOLE_BATCH, 500, -1, None]],
                                               time.monotonic())
    assert (whole.first_record, whole.record_count, fresh) == (0, 10, 6)
    completer.complete(batch.futures, 0, 10, "t", 0, 500, -1, None)
    assert [f.result(0).offset for f in batch.futures] == [100, 101, 102, 103, 504, 505, 506, 507, 508, 509]
    assert batch.batch_id not in accumulator.sealed
