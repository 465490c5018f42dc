"""The client's fast path without a daemon: batches written in memory, futures completed from reports.

Every test runs against both twins (the ``fastpath`` fixture): the C extension
``client_stub._fastpath`` and ``client_stub._fastpath_py``, unless it says why it cannot.
OpenBatch writes records into a bytearray here as it does into shared memory, and publishes
them in a control area of its own; a Completer is made as the producer makes its own (its
callback errors go to the producer's log); RecordFutures are made both ways the producer makes
them: by their ``__init__`` (the Python path of send()) and by the fast path (Appender.send).
The slot protocol runs on a real segment, the daemon's side claiming as the daemon does
(client_stub.contract.batch_slots), in a process of its own where it must run while an append
does (an append holds the GIL throughout).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import itertools
import logging
import mmap
import random
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub import _fastpath_py, block_grants
from client_stub.contract import batch_slots, ipc
from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.records import decode_records
from client_stub.contract.shared_memory import Layout
from client_stub.errors import InvalidRecordError, KafkaError, KafkaTimeoutError
from client_stub.futures import _CONDITION_LOCK, RecordFuture, RecordMetadata, _callback_failed
from tests.support.fastpath import CLIENT, MappedSegment, c_extension, mapped_segment
from tests.support.waiting import HANG_S
from tests.unit.test_partitioner import KAFKA_VECTORS

BASE_TS = 1_700_000_000_000
TOPIC = "t"
C_FASTPATH = c_extension("client_stub._fastpath")
c_only = pytest.mark.skipif(C_FASTPATH is None, reason="client_stub._fastpath is not built")


@pytest.fixture(params=CLIENT)
def fastpath(request: pytest.FixtureRequest) -> ModuleType:
    """One twin of the fast path: the C extension or its pure-Python twin."""
    return request.param


@pytest.fixture
def completer(fastpath: ModuleType) -> Any:
    """A Completer of that twin, made as the producer makes its own."""
    return fastpath.Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)


def fail(completer: Any, futures: list[RecordFuture], error: KafkaError) -> None:
    """What the producer does with records it gives up on (client_stub.futures.fail)."""
    completer.complete(futures, 0, len(futures), "", -1, -1, -1, error)


def control_area(blocks: int = 1) -> mmap.mmap:
    """A control area of its own for batches on ``blocks`` blocks (aligned as a segment's is)."""
    return mmap.mmap(-1, batch_slots.control_size(blocks))


def new_batch(fastpath: ModuleType, capacity: int, *, partition: int = 0,
              control: mmap.mmap | None = None) -> tuple[Any, bytearray]:
    """An OpenBatch over a fresh bytearray (filled with 0xAA), its base timestamp BASE_TS, on block ``partition``
    of ``control`` (a control area of its own if None)."""
    memory = bytearray([0xAA]) * capacity
    if control is None:
        control = control_area(partition + 1)
    return fastpath.OpenBatch(1, TOPIC, partition, partition, 1, memory, BASE_TS, time.monotonic(), control,
                              0), memory


def snapshot(batch: Any, memory: bytearray) -> tuple:
    return (batch.pos, batch.record_count, list(batch.futures), batch.max_timestamp, bytes(memory))


class Calls:
    """An on_delivery callback that keeps its calls; ``fail_on`` makes it raise for that metadata offset."""

    def __init__(self, fail_on: int | None = None, raising: type[BaseException] = RuntimeError) -> None:
        self.calls: list[tuple[object, object]] = []
        self.fail_on = fail_on
        self.raising = raising

    def __call__(self, err: object, metadata: RecordMetadata | None) -> None:
        self.calls.append((err, metadata))
        if metadata is not None and metadata.offset == self.fail_on:
            raise self.raising(f"callback failed at offset {metadata.offset}")


# What the fast path handed to the Python path (the Appender's slow_send), and what it answered.
slow_sends: list[tuple] = []
DECLINED = object()


def slow_send(*args: object) -> object:
    slow_sends.append(args)
    return DECLINED


def never_woken() -> None:
    """The Appender's wakeup(), for an Appender that opens no batch."""
    raise AssertionError("wakeup() without a batch opened")


def appender_with_batches(fastpath: ModuleType, partitions: int, *, capacity: int = 1024,
                          control: mmap.mmap | None = None) -> tuple[Any, threading.Lock, list[Any],
                                                                     dict[tuple[str, int], Any]]:
    """An enabled Appender (murmur2_random) for TOPIC with an open batch on every partition (that of partition p
    on block p of ``control``, if given), what its seal() got (the batches sealed with no record), and its open
    batches."""
    lock = threading.Lock()
    slow_sends.clear()
    sealed: list[Any] = []

    def seal(batch: Any) -> None:
        assert lock.locked(), "seal() runs with the producer's lock held"
        sealed.append(batch)

    open_batches = {(TOPIC, partition): new_batch(fastpath, capacity, partition=partition, control=control)[0]
                    for partition in range(partitions)}
    appender = fastpath.Appender(lock, open_batches, {TOPIC: partitions}, RecordFuture, seal, slow_send, {}, True,
                                 {}, {}, itertools.count(1), never_woken)
    appender.enable()
    return appender, lock, sealed, open_batches


def init_futures(fastpath: ModuleType, count: int, on_delivery: Callable | None = None) -> list[RecordFuture]:
    """Futures as the Python path of send() makes them (key of 3 bytes, null value)."""
    return [RecordFuture(on_delivery, BASE_TS + n, 3, -1) for n in range(count)]


def appender_futures(fastpath: ModuleType, count: int, on_delivery: Callable | None = None) -> list[RecordFuture]:
    """Futures as the fast path of send() makes them, in its slots (key of 3 bytes, null value)."""
    appender, _, _, _ = appender_with_batches(fastpath, 1, capacity=1 << 16)
    futures = [appender.send(TOPIC, None, b"key", timestamp_ms=BASE_TS + n, on_delivery=on_delivery)
               for n in range(count)]
    assert all(type(f) is RecordFuture for f in futures)
    return futures


MAKERS = [pytest.param(init_futures, id="init-made"), pytest.param(appender_futures, id="appender-made")]


# -- OpenBatch --------------------------------------------------------------------------------------


RECORDS = [
    # (key, value, headers, timestamp): later, earlier and equal to the batch's base timestamp.
    (b"k0", b"value-0", (), BASE_TS),
    (None, b"value-1", [(b"h", b"x"), (b"nil", None)], BASE_TS + 250),
    (b"k2", None, (), BASE_TS - 40),
    (b"", b"", [(b"only", b"")], BASE_TS + 100_000),
    (bytearray(b"k4"), memoryview(b"v" * 300), (), BASE_TS + 3),
]


def test_append_writes_what_encode_record_writes_with_deltas_from_the_batch(fastpath: ModuleType) -> None:
    batch, memory = new_batch(fastpath, 2048)
    futures = init_futures(fastpath, len(RECORDS))
    for (key, value, headers, timestamp), future in zip(RECORDS, futures, strict=True):
        assert batch.append(key, value, headers, timestamp, future) is True
    expected = b"".join(fastpath.encode_record(n, timestamp - BASE_TS, key, value, headers)
                        for n, (key, value, headers, timestamp) in enumerate(RECORDS))
    assert bytes(memory[:batch.pos]) == expected
    assert batch.pos == len(expected) and batch.record_count == len(RECORDS)
    assert batch.futures == futures  # in offset order
    assert batch.base_timestamp == BASE_TS
    assert batch.max_timestamp == BASE_TS + 100_000
    assert memory[batch.pos:] == bytearray([0xAA]) * (2048 - batch.pos)  # nothing written past the records


def test_append_that_does_not_fit_leaves_the_batch_unchanged(fastpath: ModuleType) -> None:
    first = fastpath.encode_record(0, 0, b"k", b"v" * 40, ())
    second = fastpath.encode_record(1, 7, None, b"w" * 30, [(b"h", b"x")])
    batch, memory = new_batch(fastpath, len(first) + len(second))
    assert batch.append(b"k", b"v" * 40, (), BASE_TS, RecordFuture(None, BASE_TS, 1, 40))
    before = snapshot(batch, memory)
    # One byte more than is left, then anything at all once the batch is exactly full.
    assert batch.append(None, b"w" * 31, [(b"h", b"x")], BASE_TS + 7, RecordFuture(None, BASE_TS + 7, -1, 31)) is False
    assert snapshot(batch, memory) == before
    assert batch.append(None, b"w" * 30, [(b"h", b"x")], BASE_TS + 7, RecordFuture(None, BASE_TS + 7, -1, 30))
    assert bytes(memory) == first + second
    full = snapshot(batch, memory)
    assert batch.append(None, None, (), BASE_TS + 99, RecordFuture(None, BASE_TS + 99, -1, -1)) is False
    assert snapshot(batch, memory) == full
    assert batch.max_timestamp == BASE_TS + 7  # the refused record's timestamp counts for nothing


def test_a_released_batch_refuses_records_and_lets_go_of_its_memory(fastpath: ModuleType) -> None:
    control = control_area()
    batch, memory = new_batch(fastpath, 256, control=control)
    assert batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1))
    with pytest.raises(BufferError):
        memory.extend(b"x")  # the batch holds the buffer: shared memory could not be closed under it
    with pytest.raises(BufferError):
        control.close()  # nor its control area
    written = bytes(memory)
    batch.release()
    batch.release()  # a second release is harmless
    assert batch.capacity == 0
    memory.extend(b"x")  # let go of: the segment can be closed now
    control.close()
    with pytest.raises(ValueError, match="sealed"):
        batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1))
    assert batch.record_count == 1 and bytes(memory[:-1]) == written


# -- the slot protocol: what a batch publishes in its segment, and the daemon's claims ----------------------

SLOT_LAYOUT = Layout(4096, 4)
CREATED = 1234.567891  # when the slot tests' batches open (time.monotonic()): the same for both twins


@pytest.fixture
def shared() -> Iterator[MappedSegment]:
    """A segment of four blocks, and the daemon's side of its control area."""
    with mapped_segment(SLOT_LAYOUT) as mapped:
        yield mapped


def open_on(fastpath: ModuleType, shared: MappedSegment, block: int, *, block_count: int = 1, batch_id: int = 7,
            topic_index: int = 3, partition: int = 2) -> Any:
    """A batch on ``block_count`` blocks of the segment from ``block``, publishing in the segment's control area."""
    return fastpath.OpenBatch(batch_id, TOPIC, partition, block, block_count,
                              shared.segment.blocks(block, block_count), BASE_TS, CREATED, shared.segment.control,
                              topic_index)


def slot_word(block: int, word: int) -> int:
    """The index of a word of ``block``'s slot among the control area's words (ControlArea.words)."""
    return batch_slots.HEADER_SIZE // 8 + block * batch_slots.SLOT_SIZE // 8 + word


def batch_state(batch: Any) -> tuple[int, int, list[RecordFuture], int]:
    return batch.pos, batch.record_count, list(batch.futures), batch.max_timestamp


def append_small(batch: Any, count: int) -> None:
    for n in range(count):
        assert batch.append(b"k", b"v%d" % n, (), BASE_TS + n, RecordFuture(None, BASE_TS + n, 1, 2))


def test_opening_a_batch_describes_it_in_its_slot_and_publishes_no_record(fastpath: ModuleType,
                                                                           shared: MappedSegment) -> None:
    batch = open_on(fastpath, shared, 1, block_count=2)
    assert shared.daemon.snapshot(1) == batch_slots.SlotSnapshot(
        record_count=0, length=0, full=False, base_timestamp=BASE_TS, max_timestamp=BASE_TS, batch_id=7,
        topic_index=3, partition=2, block_count=2, opened_ns=int(CREATED * 1e9))
    assert shared.daemon.claim_word(1) == 0 and not batch.claimed()
    batch.release()


def test_each_append_publishes_the_records_their_length_and_the_largest_timestamp(fastpath: ModuleType,
                                                                                   shared: MappedSegment) -> None:
    batch = open_on(fastpath, shared, 0)
    for key, value, headers, timestamp in RECORDS:
        assert batch.append(key, value, headers, timestamp, RecordFuture(None, timestamp, -1, -1))
        slot = shared.daemon.snapshot(0)
        assert (slot.record_count, slot.length, slot.full, slot.max_timestamp) == (
            batch.record_count, batch.pos, False, batch.max_timestamp)
    assert shared.daemon.snapshot(0).max_timestamp == BASE_TS + 100_000
    assert shared.daemon.claim_word(0) == 0 and not batch.claimed()
    # What the daemon claims is what was published, and the records are in the batch's blocks.
    assert shared.daemon.claim(0) == (len(RECORDS), batch.pos)
    expected = b"".join(fastpath.encode_record(n, timestamp - BASE_TS, key, value, headers)
                        for n, (key, value, headers, timestamp) in enumerate(RECORDS))
    assert bytes(shared.segment.blocks(0)[:batch.pos]) == expected
    batch.release()


def test_opening_a_batch_clears_what_its_block_last_published_and_the_claim_it_still_holds(
        fastpath: ModuleType, shared: MappedSegment) -> None:
    # The daemon claimed the block's last batch (full), sent it, freed the block and granted it again.
    old = open_on(fastpath, shared, 1, batch_id=6)
    append_small(old, 3)
    old.release()
    assert shared.daemon.claim(1) == (3, old.pos)
    assert old.claimed()
    left = shared.daemon.words[slot_word(1, 0):slot_word(2, 0)].tolist()
    # A batch on blocks 0-1 describes itself in block 0's slot only: block 1's keeps its claim, which keeps the
    # daemon off it (it reads the claim first).
    spanning = open_on(fastpath, shared, 0, block_count=2, batch_id=8)
    append_small(spanning, 1)
    assert shared.daemon.words[slot_word(1, 0):slot_word(2, 0)].tolist() == left
    spanning.release()
    # A batch on block 1 again: nothing published, nothing claimed; it takes records.
    batch = open_on(fastpath, shared, 1, batch_id=9)
    assert batch_slots.unpack_published(shared.daemon.published(1)) == (0, 0, False)
    assert shared.daemon.claim_word(1) == 0 and not batch.claimed()
    append_small(batch, 2)
    assert shared.daemon.snapshot(1)[:3] == (2, batch.pos, False)
    batch.release()


def test_an_append_to_a_batch_the_daemon_claimed_is_refused_and_changes_nothing(fastpath: ModuleType,
                                                                                shared: MappedSegment) -> None:
    batch = open_on(fastpath, shared, 2)
    append_small(batch, 2)
    assert shared.daemon.claim(2) == (2, batch.pos)
    before = batch_state(batch)
    slot = shared.daemon.words[slot_word(2, 0):slot_word(3, 0)].tolist()
    blocks = bytes(shared.segment.blocks(2))
    assert batch.append(b"k", b"late", (), BASE_TS + 99, RecordFuture(None, BASE_TS + 99, 1, 4)) is False
    assert batch_state(batch) == before
    assert shared.daemon.words[slot_word(2, 0):slot_word(3, 0)].tolist() == slot
    assert bytes(shared.segment.blocks(2)) == blocks
    assert batch.claimed()
    batch.release()


@pytest.mark.parametrize("records", [0, 3])
def test_release_publishes_the_batch_full(fastpath: ModuleType, shared: MappedSegment, records: int) -> None:
    batch = open_on(fastpath, shared, 3)
    append_small(batch, records)
    length = batch.pos
    batch.release()
    assert batch_slots.unpack_published(shared.daemon.published(3)) == (records, length, True)
    assert shared.daemon.claim(3) == (records, length)


def test_claimed_says_whether_the_daemon_claimed_the_batch_or_is_claiming_it(fastpath: ModuleType,
                                                                           shared: MappedSegment) -> None:
    batch = open_on(fastpath, shared, 0)
    assert not batch.claimed()
    append_small(batch, 1)
    assert not batch.claimed()
    words = shared.daemon.words
    words[slot_word(0, batch_slots.CLAIM)] = batch_slots.CLAIMING  # between the daemon's fence and its answer
    assert batch.claimed()
    assert batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1)) is False
    words[slot_word(0, batch_slots.CLAIM)] = batch_slots.CLAIMED | 1
    assert batch.claimed() and batch.record_count == 1
    other = open_on(fastpath, shared, 1)
    other.release()
    assert other.claimed()  # released: it takes no more records, claimed or not
    batch.release()


@c_only
@pytest.mark.parametrize(("batch_id", "topic_index", "partition"), [(7, 3, 2), (2**62, 2**32 - 1, 2**31 - 1),
                                                                     (-2, -1, -1)])
def test_the_twins_write_the_same_slots_and_records(shared: MappedSegment, batch_id: int, topic_index: int,
                                                    partition: int) -> None:
    # The daemon reads what either wrote: word for word and byte for byte the same, the C twin's on blocks 0-1,
    # the Python twin's on blocks 2-3.
    batches = [open_on(twin, shared, block, block_count=2, batch_id=batch_id, topic_index=topic_index,
                       partition=partition) for twin, block in ((C_FASTPATH, 0), (_fastpath_py, 2))]

    def written(block: int) -> tuple[list[int], bytes]:
        return shared.daemon.words[slot_word(block, 0):slot_word(block + 1, 0)].tolist(), bytes(
            shared.segment.blocks(block, 2))

    assert written(0) == written(2)
    for key, value, headers, timestamp in RECORDS:
        for batch in batches:
            assert batch.append(key, value, headers, timestamp, RecordFuture(None, timestamp, -1, -1))
        assert written(0) == written(2)
    for batch in batches:
        batch.release()
    assert written(0) == written(2)
    assert shared.daemon.snapshot(0)[:3] == (len(RECORDS), batches[0].pos, True)


def test_a_control_area_without_an_aligned_slot_for_the_batch_is_refused(fastpath: ModuleType) -> None:
    control = control_area(2)
    whole = memoryview(control)
    for area, first_block in ((whole[1:], 0), (whole[8:], 1)):  # not 8-byte aligned; no room for block 1's slot
        with pytest.raises(ValueError, match="no slot for first_block"):
            fastpath.OpenBatch(1, TOPIC, 0, first_block, 1, bytearray(64), BASE_TS, CREATED, area, 0)
    assert bytes(control) == bytes(len(control))  # nothing written
    fastpath.OpenBatch(1, TOPIC, 0, 0, 1, bytearray(64), BASE_TS, CREATED, whole[8:], 0).release()


# The daemon's side of one slot, in a process of its own (an append holds the GIL throughout: the daemon's side
# must run beside it, as the daemon does). Arguments: what it does, the segment's file descriptor, block size and
# count, the block. It says "ready" once it has mapped the segment, then does one thing for each line it reads,
# and answers with a line:
# - "race": the line is "RECORDS DELAY ANSWER_DELAY"; once the batch has published RECORDS records (the appending
#   side is at work) it waits DELAY turns of a loop, claims the batch (CLAIMING, a full fence, loads published,
#   then ANSWER_DELAY turns later CLAIMED | records) and answers with the records and length it claimed.
# - "answer": the line is "WATCHED EXPECTED BEFORE INCLUDE"; it says "watching", waits until the word WATCHED of
#   the blocks is EXPECTED (a record is being written), stores CLAIMING, a full fence, loads published. If it
#   holds BEFORE records (the record is not published yet: the appending side will wait for the answer), it
#   waits until the record is published and answers CLAIMED | BEFORE + INCLUDE ("between"); else it claims what
#   it loaded ("after": it looked too late).
DAEMON_SIDE = """
import sys
from client_stub.contract import batch_slots
from client_stub.contract.batch_slots import CLAIMED, CLAIMING, ControlArea, full_fence, unpack_published
from client_stub.contract.shared_memory import Layout, Segment

mode = sys.argv[1]
fd, block_size, block_count, block = map(int, sys.argv[2:6])
segment = Segment(fd, Layout(block_size, block_count))
words = ControlArea(segment.control, block_count).words
blocks = segment.blocks(0, block_count).cast("Q")
slot = batch_slots.HEADER_SIZE // 8 + block * batch_slots.SLOT_SIZE // 8
published, claim = slot + batch_slots.PUBLISHED, slot + batch_slots.CLAIM
print("ready", flush=True)

for line in sys.stdin:
    if mode == "race":
        records, delay, answer_delay = map(int, line.split())
        while unpack_published(words[published])[0] < records:
            pass
        for _ in range(delay):
            pass
        words[claim] = CLAIMING
        full_fence()
        records, length, _ = unpack_published(words[published])
        for _ in range(answer_delay):
            pass
        words[claim] = CLAIMED | records
        print(records, length, flush=True)
    else:
        watched, expected, before, include = map(int, line.split())
        print("watching", flush=True)
        while blocks[watched] != expected:
            pass
        words[claim] = CLAIMING
        full_fence()
        records = unpack_published(words[published])[0]
        if records == before:
            while unpack_published(words[published])[0] == before:
                pass
            words[claim] = CLAIMED | (before + include)
            print("between", flush=True)
        else:
            words[claim] = CLAIMED | records
            print("after", flush=True)
"""


class DaemonSide:
    """The daemon's side of a slot, in its process (DAEMON_SIDE)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def tell(self, *numbers: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(" ".join(map(str, numbers)) + "\n")
        self.process.stdin.flush()

    def answer(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            pytest.fail(f"the daemon's side ended: {self.process.stderr.read()}")
        return line.strip()


@contextlib.contextmanager
def daemon_side(shared: MappedSegment, block: int, mode: str) -> Iterator[DaemonSide]:
    layout = shared.segment.layout
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DAEMON_SIDE), mode, str(shared.fd),
                                str(layout.block_size), str(layout.block_count), str(block)],
                               pass_fds=(shared.fd,), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        side = DaemonSide(process)
        assert side.answer() == "ready"
        yield side
    finally:
        process.stdin.close()  # it ends when its input does
        try:
            process.wait(HANG_S)
        except subprocess.TimeoutExpired:
            process.kill()  # waiting for what a failed test never did
            process.wait()
        process.stdout.close()
        process.stderr.close()


# A record this long takes the appending side long enough to write (after it found its batch open) that the daemon's
# side, watching it being written, claims the batch before it is published; attempts until it does.
BIG_VALUE = 16 << 20
CLAIM_ATTEMPTS = 50


@pytest.mark.parametrize("included", [True, False], ids=["the-claim-holds-it", "the-claim-leaves-it-out"])
def test_a_record_published_while_the_daemon_claims_is_in_the_batch_as_the_claims_answer_says(
        fastpath: ModuleType, included: bool) -> None:
    with mapped_segment(Layout(BIG_VALUE + 4096, 1)) as shared, daemon_side(shared, 0, "answer") as daemon:
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            batch = open_on(fastpath, shared, 0)
            append_small(batch, 2)
            before = batch_state(batch)
            value = bytes([attempt]) * BIG_VALUE  # each attempt's bytes differ from the last one's
            watched = (batch.pos + BIG_VALUE // 4) // 8  # a word of the value, written well before its end
            daemon.tell(watched, int.from_bytes(value[:8], "little"), 2, int(included))
            assert daemon.answer() == "watching"
            appended = batch.append(b"k", value, (), BASE_TS + 50, RecordFuture(None, BASE_TS + 50, 1, BIG_VALUE))
            when = daemon.answer()
            claim = shared.daemon.claim_word(0)
            if when == "after":
                # It looked once the record was published: the record is in the claim, as in the batch.
                assert appended is True and batch.record_count == 3 and claim == batch_slots.CLAIMED | 3
                batch.release()
                continue
            assert when == "between"
            assert appended is included
            if included:
                assert batch.record_count == 3 and batch.max_timestamp == BASE_TS + 50
                assert batch.pos == before[0] + fastpath.record_size(2, 50, b"k", value)
            else:
                assert batch_state(batch) == before  # the record is not in the batch: the caller writes it again
            assert claim == batch_slots.CLAIMED | batch.record_count
            assert batch.claimed()
            assert batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1)) is False
            batch.release()
            return
        pytest.fail(f"the daemon's side never claimed while a record was written, in {CLAIM_ATTEMPTS} attempts")


def test_every_record_is_in_the_claim_or_refused_never_both_never_lost(fastpath: ModuleType) -> None:
    # An appending thread against the daemon's side claiming the same slot, again and again, each time at another
    # point of the appends and answering a while after its fence: each claim holds exactly the records whose append
    # returned True (a record published after the daemon's load and refused is not in it; none is in it twice).
    rng = random.Random(39)
    with mapped_segment(Layout(1 << 16, 1)) as shared, daemon_side(shared, 0, "race") as daemon:
        for trial in range(1000):
            batch = open_on(fastpath, shared, 0, batch_id=trial)
            daemon.tell(rng.randrange(50), rng.randrange(200), rng.randrange(50))
            n = 0
            while batch.append(b"k", b"v%d" % n, (), BASE_TS + n, RecordFuture(None, BASE_TS + n, 1, 2)) or (
                    not batch.claimed()):
                n += 1
            records, length = map(int, daemon.answer().split())
            assert (records, length) == (batch.record_count, batch.pos), f"trial {trial}"
            assert shared.daemon.claim_word(0) == batch_slots.CLAIMED | records
            decoded = decode_records(shared.segment.blocks(0)[:length], records)
            assert [r.offset_delta for r in decoded] == list(range(records))
            batch.release()


# -- encode_record_into -----------------------------------------------------------------------------


def test_encode_record_into_raises_when_the_record_does_not_fit(fastpath: ModuleType) -> None:
    size = fastpath.record_size(0, 5, b"key", b"value", [(b"h", None)])
    memory = bytearray([0xAA]) * (size + 10)
    for pos in (11, len(memory), len(memory) + 1, -1):
        with pytest.raises(ValueError, match="does not fit"):
            fastpath.encode_record_into(memory, pos, 0, 5, b"key", b"value", [(b"h", None)])
    assert memory == bytearray([0xAA]) * (size + 10)  # untouched
    assert fastpath.encode_record_into(memory, 10, 0, 5, b"key", b"value", [(b"h", None)]) == len(memory)
    assert bytes(memory[10:]) == fastpath.encode_record(0, 5, b"key", b"value", [(b"h", None)])


# -- Completer --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MAKERS)
def test_complete_a_slice_of_the_futures(fastpath: ModuleType, completer: Any, make: Callable) -> None:
    calls = Calls()
    futures = make(fastpath, 6, calls)
    # A report on records 2-4 (a part of a split batch: its own base offset), then the others.
    completer.complete(futures, 2, 3, TOPIC, 4, 50, -1, None)
    assert [f.done() for f in futures] == [False, False, True, True, True, False]
    assert [f.result(0) for f in futures[2:5]] == [RecordMetadata(TOPIC, 4, 50 + n, BASE_TS + 2 + n, 3, -1)
                                                   for n in range(3)]
    completer.complete(futures, 0, 2, TOPIC, 4, 40, BASE_TS + 999, None)  # LogAppendTime: the broker's time
    assert [f.result(0) for f in futures[:2]] == [RecordMetadata(TOPIC, 4, 40 + n, BASE_TS + 999, 3, -1)
                                                  for n in range(2)]
    completer.complete(futures, 5, 10, TOPIC, 4, -1, -1, None)  # acks=0: no offset; a count past the end
    assert futures[5].result(0) == RecordMetadata(TOPIC, 4, -1, BASE_TS + 5, 3, -1)
    assert [err for err, _ in calls.calls] == [None] * 6
    assert [md for _, md in calls.calls] == [futures[n].result(0) for n in (2, 3, 4, 0, 1, 5)]


@pytest.mark.parametrize("make", MAKERS)
def test_complete_with_an_error_fails_every_future_of_the_slice(fastpath: ModuleType, completer: Any,
                                                                make: Callable) -> None:
    calls = Calls()
    futures = make(fastpath, 4, calls)
    error = InvalidRecordError("the broker refused the record")
    completer.complete(futures, 1, 3, TOPIC, 0, 77, -1, error)
    assert not futures[0].done()
    for future in futures[1:]:
        assert future.exception(0) is error
        with pytest.raises(InvalidRecordError):
            future.result(0)
    assert calls.calls == [(error, None)] * 3


@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_callback_that_raises_is_logged_and_the_others_still_run(fastpath: ModuleType, completer: Any,
                                                                   make: Callable, watched: bool, caplog) -> None:
    calls = Calls(fail_on=11)
    futures = make(fastpath, 4, calls)
    if watched:  # a done-callback makes the future's Condition: it completes through _notify
        for future in futures:
            future.add_done_callback(lambda f: None)
    with caplog.at_level(logging.ERROR, logger="client_stub.producer"):
        completer.complete(futures, 0, 4, TOPIC, 0, 10, -1, None)
    assert [md.offset for _, md in calls.calls] == [10, 11, 12, 13]
    assert [f.result(0).offset for f in futures] == [10, 11, 12, 13]
    [logged] = [r for r in caplog.records if "on_delivery" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert isinstance(logged.exc_info[1], RuntimeError) and "offset 11" in str(logged.exc_info[1])


@pytest.mark.parametrize("raising", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_callback_that_raises_a_base_exception_completes_every_future_then_raises_it(
        fastpath: ModuleType, completer: Any, make: Callable, watched: bool, raising: type[BaseException],
        caplog) -> None:
    calls = Calls(fail_on=11, raising=raising)
    futures = make(fastpath, 4, calls)
    if watched:
        for future in futures:
            future.add_done_callback(lambda f: None)
    with caplog.at_level(logging.ERROR, logger="client_stub.producer"), \
            pytest.raises(raising, match="callback failed at offset 11"):
        completer.complete(futures, 0, 4, TOPIC, 0, 10, -1, None)
    # Not swallowed (nothing logged in its place), and no future of the report left pending:
    # every callback ran.
    assert not [r for r in caplog.records if "on_delivery" in r.getMessage()]
    assert [f.result(0).offset for f in futures] == [10, 11, 12, 13]
    assert [md.offset for _, md in calls.calls] == [10, 11, 12, 13]


@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_future_completes_once(fastpath: ModuleType, completer: Any, make: Callable, watched: bool) -> None:
    calls = Calls()
    futures = make(fastpath, 3, calls)
    done_callbacks: list[RecordFuture] = []
    if watched:
        for future in futures:
            future.add_done_callback(done_callbacks.append)
    # The first record was failed as lost (the session went away); its report comes after all.
    lost = KafkaTimeoutError("lost")
    fail(completer, futures[:1], lost)
    completer.complete(futures, 0, 3, TOPIC, 0, 0, -1, None)
    completer.complete(futures, 0, 3, TOPIC, 0, 500, -1, KafkaTimeoutError("late"))
    assert futures[0].exception(0) is lost
    assert [f.result(0).offset for f in futures[1:]] == [1, 2]
    assert calls.calls == [(lost, None), (None, futures[1].result(0)), (None, futures[2].result(0))]
    if watched:
        assert sorted(map(id, done_callbacks)) == sorted(map(id, futures))


@pytest.mark.parametrize("make", MAKERS)
def test_a_future_waited_on_in_another_thread_is_woken(fastpath: ModuleType, completer: Any, make: Callable) -> None:
    futures = make(fastpath, 3)
    got: dict[str, object] = {}

    def wait_for_result() -> None:
        got["result"] = futures[0].result(30)

    def wait_for_any() -> None:
        done, _ = concurrent.futures.wait(futures[1:], 30, concurrent.futures.FIRST_COMPLETED)
        got["wait"] = done

    waiters = [threading.Thread(target=wait_for_result), threading.Thread(target=wait_for_any)]
    for waiter in waiters:
        waiter.start()
    # Until both wait (their Conditions exist): otherwise complete() would settle them in place.
    deadline = time.monotonic() + 10
    while any(f._cond is None for f in futures[:2]) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    completer.complete(futures, 0, 2, TOPIC, 1, 7, -1, None)
    for waiter in waiters:
        waiter.join(10)
    assert not any(w.is_alive() for w in waiters)
    assert got == {"result": RecordMetadata(TOPIC, 1, 7, BASE_TS, 3, -1), "wait": {futures[1]}}


def test_appender_made_futures_are_in_the_garbage_collectors_sight_once_complete(fastpath: ModuleType,
                                                                                 completer: Any) -> None:
    # The C fast path keeps its futures out of the collector's sight while in flight; the Python twin never does.
    futures = appender_futures(fastpath, 2)
    completer.complete(futures, 0, 1, TOPIC, 0, 0, -1, None)
    fail(completer, futures[1:], KafkaTimeoutError("lost"))
    # Done futures may end up in cycles (a traceback, a callback holding its future): the collector must see them.
    assert all(gc.is_tracked(f) for f in futures)


@c_only
def test_the_c_fast_path_hides_a_records_partial_callback_from_the_collector_until_it_completes() -> None:
    # Applications make a callback per record to carry its context, a functools.partial often, which lives while
    # its record is in flight: long enough to be promoted to the collector's oldest generation, whose full
    # collections then come often and scan the whole heap. None can be garbage while its future holds it.
    completer = C_FASTPATH.Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)
    appender, _, _, _ = appender_with_batches(C_FASTPATH, 1, capacity=1 << 16)
    ran: list[tuple[int, KafkaError | None]] = []

    def report(n: int, err: KafkaError | None, metadata: RecordMetadata | None) -> None:
        ran.append((n, err))

    callbacks = [functools.partial(report, n) for n in range(3)]
    assert all(gc.is_tracked(c) for c in callbacks)
    futures = [appender.send(TOPIC, None, b"key", timestamp_ms=BASE_TS, on_delivery=c) for c in callbacks]
    assert not any(gc.is_tracked(c) for c in callbacks)
    completer.complete(futures, 0, 2, TOPIC, 0, 0, -1, None)
    assert [gc.is_tracked(c) for c in callbacks] == [True, True, False]
    lost = KafkaTimeoutError("lost")
    fail(completer, futures[2:], lost)
    assert all(gc.is_tracked(c) for c in callbacks)
    assert ran == [(0, None), (1, None), (2, lost)]


@c_only
def test_one_partial_of_many_records_is_in_the_collectors_sight_once_any_completes() -> None:
    completer = C_FASTPATH.Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)
    calls = Calls()
    callback = functools.partial(calls)
    futures = appender_futures(C_FASTPATH, 3, callback)
    completer.complete(futures, 0, 1, TOPIC, 0, 0, -1, None)
    # Tracked again while two of its records are in flight: the collector sees more, never less, than it should.
    assert gc.is_tracked(callback)
    completer.complete(futures, 1, 2, TOPIC, 0, 1, -1, None)
    assert len(calls.calls) == 3 and gc.is_tracked(callback)


class InACycle:
    """A callback in a reference cycle: only the collector can free it."""

    def __init__(self) -> None:
        self.cycle = self

    def __call__(self, err: KafkaError | None, metadata: RecordMetadata | None) -> None:
        pass


@pytest.mark.parametrize("make", [InACycle, lambda: functools.partial(InACycle())], ids=["object", "partial"])
def test_a_callback_in_a_reference_cycle_is_collected_once_its_record_completes(
        fastpath: ModuleType, completer: Any, make: Callable[[], Callable]) -> None:
    callback = make()
    collected = weakref.ref(callback)
    futures = appender_futures(fastpath, 1, callback)
    callback = None
    completer.complete(futures, 0, 1, TOPIC, 0, 0, -1, None)
    del futures
    gc.collect()
    assert collected() is None


# Callbacks the fast path must leave in the collector's sight, and partials whose records never complete: freed
# while untracked, a function, a lambda or a bound method crashes the interpreter (their deallocators assume they
# are tracked); a partial's does not. The process must exit cleanly; each case is named before it runs, so that a
# crash (with faulthandler's traceback) says which.
CALLBACKS_NEVER_COMPLETED = """
import functools, gc, itertools, mmap, sys, threading, time
from client_stub import _fastpath
from client_stub.futures import RecordFuture

class Owner:
    def on_delivery(self, err, metadata):
        pass

def function(err, metadata):
    pass

def make_closure():
    captured = []
    return lambda err, metadata: captured.append(err)

class SubPartial(functools.partial):
    pass

def appender(declined):
    batch = _fastpath.OpenBatch(1, "t", 0, 0, 1, bytearray(1 << 16), 1, time.monotonic(), mmap.mmap(-1, 128), 0)
    def slow_send(*args):
        raise RuntimeError("the Python path refuses it (a BufferExhaustedError, say)")
    made = _fastpath.Appender(threading.Lock(), {} if declined else {("t", 0): batch}, {"t": 1}, RecordFuture,
                              print, slow_send, {}, True, {}, {}, itertools.count(1), print)
    made.enable()
    return made, batch

for declined in (False, True):
    for make in (lambda: function, lambda: lambda err, metadata: None, make_closure, lambda: Owner().on_delivery,
                 lambda: SubPartial(function), lambda: functools.partial(function)):
        callback = make()
        print(type(callback).__name__, "declined" if declined else "appended", flush=True)
        sender, batch = appender(declined)
        try:
            sender.send("t", b"v", b"k", partition=0, timestamp_ms=1, on_delivery=callback)
        except RuntimeError:
            assert declined
        hidden = not gc.is_tracked(callback)
        assert hidden == (type(callback) is functools.partial and not declined), (callback, declined)
        del sender, batch, callback  # the record's future is dropped, never completed
        gc.collect()
print("no crash")
"""


@c_only
def test_callbacks_of_records_never_completed_are_freed_safely() -> None:
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(CALLBACKS_NEVER_COMPLETED)],
                         capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.strip().splitlines()[-1:]) == (0, ["no crash"]), run.stdout + run.stderr


def test_complete_converts_its_arguments_in_order_and_stops_at_the_first_bad_one(completer: Any) -> None:
    converted: list[str] = []

    class Offset:
        def __index__(self) -> int:
            converted.append("base_offset")
            return 0

    futures = [RecordFuture(None, BASE_TS, 3, -1)]
    with pytest.raises(TypeError):
        completer.complete(futures, "0", 1, TOPIC, 0, Offset(), -1, None)
    assert converted == []  # the C code called __index__ with the first error still set
    completer.complete(futures, 0, 1, TOPIC, 0, Offset(), -1, None)
    assert converted == ["base_offset"] and futures[0].result(0).offset == 0


# A finalizer of cyclic garbage that empties the list being completed, run by a collection in the middle of
# complete()'s first loop (where it allocates RecordMetadata): its futures were read from the list there, and the
# C code read past the emptied list. The fast path's futures are untracked until that loop tracks them again:
# that is how the finalizer knows where it is.
EMPTIED_IN_COMPLETE = """
import gc, itertools, mmap, threading, time
from client_stub import _fastpath
from client_stub.futures import _CONDITION_LOCK, RecordFuture, RecordMetadata, _callback_failed

batch = _fastpath.OpenBatch(1, "t", 0, 0, 1, bytearray(1 << 20), 1, time.monotonic(), mmap.mmap(-1, 128), 0)
appender = _fastpath.Appender(threading.Lock(), {("t", 0): batch}, {"t": 1}, RecordFuture, print, print, {}, True,
                              {}, {}, itertools.count(1), print)
appender.enable()
for _ in range(1000):
    appender.send("t", b"v", b"k", partition=0, timestamp_ms=1)
futures = batch.futures
held = list(futures)

class EmptiesTheList:
    def __init__(self):
        self.cycle = self

    def __del__(self):
        if futures and gc.is_tracked(futures[0]) and not gc.is_tracked(futures[-1]):
            futures.clear()
        else:
            EmptiesTheList()

EmptiesTheList()
gc.set_threshold(1)
completer = _fastpath.Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)
completer.complete(futures, 0, len(futures), "t", 0, 0, -1, None)
gc.set_threshold(700)
assert not futures, "the finalizer did not run inside complete()"
assert [f.result(0).offset for f in held] == list(range(1000))
print("all complete")
"""


@c_only
def test_complete_holds_the_futures_it_completes_before_anything_can_change_the_list() -> None:
    # C only (the Python twin slices the list before anything else), and in a process of its own: it crashed.
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(EMPTIED_IN_COMPLETE)], capture_output=True,
                         text=True, timeout=60)
    assert (run.returncode, run.stdout.strip()) == (0, "all complete"), run.stderr


# -- Appender: the fast path of send() ----------------------------------------------------------------


def test_keyed_records_go_where_kafka_puts_them(fastpath: ModuleType) -> None:
    # Kafka's murmur2 test vectors, through the fast path's own choice of partition: toPositive(hash) % count.
    for partitions in (3, 12, 50):
        appender, _, _, open_batches = appender_with_batches(fastpath, partitions)
        for key, expected in KAFKA_VECTORS.items():
            future = appender.send(TOPIC, b"v", key)
            assert future is not DECLINED
            [(partition, batch)] = [(p, b) for (_, p), b in open_batches.items() if future in b.futures]
            assert partition == (expected & 0x7FFFFFFF) % partitions, (key, partitions)
        assert appender.outstanding == len(KAFKA_VECTORS)


def test_the_fast_path_appends_and_seals_a_full_batch(fastpath: ModuleType) -> None:
    record = fastpath.encode_record(0, 0, b"key", b"v" * 100, ())
    appender, _, sealed, open_batches = appender_with_batches(fastpath, 1, capacity=len(record) * 3 + 10)
    batch = open_batches[(TOPIC, 0)]
    futures = [appender.send(TOPIC, b"v" * 100, b"key", partition=0, timestamp_ms=BASE_TS + n) for n in range(3)]
    assert batch.futures == futures and batch.record_count == 3
    assert [f.timestamp_ms for f in futures] == [BASE_TS + n for n in range(3)]
    # The third left too little room for a fourth like it: sealed at once (published full, out of the open batches).
    assert open_batches == {} and batch.capacity == 0 and sealed == []
    assert type(appender.send(TOPIC, b"v", b"key", partition=0)) is not RecordFuture  # the Python path opens one


class SpareBlocks:
    """A session's segment as the producer attaches it to its Appender: blocks of ``block_size`` bytes and their
    control area, the spare ones, take_spare() (each call checked to run with the lock held) and the WAKEUPs said."""

    def __init__(self, lock: threading.Lock, blocks: int, block_size: int) -> None:
        self.lock = lock
        self.memory = bytearray(blocks * block_size)
        self.control = control_area(blocks)
        self.spare = list(range(blocks))
        self.taken = 0
        self.wakeups = 0
        self.raising: BaseException | None = None
        self.returning: object = None  # what take_spare() gives instead of a spare block, if not None

    def take_spare(self) -> object:
        assert self.lock.locked(), "take_spare() runs with the producer's lock held"
        if self.raising is not None:
            raise self.raising
        if self.returning is not None:
            return self.returning
        self.taken += 1
        return self.spare.pop(0) if self.spare else None

    def wakeup(self) -> None:
        self.wakeups += 1

    def watched(self, until_ns: int, scan_interval_ns: int) -> None:
        """Say in the header, as the daemon does, that it looks at the open batches this often until then."""
        area = ControlArea(memoryview(self.control), 1)
        area.set_header(batch_slots.WATCHED_UNTIL_NS, until_ns)
        area.set_header(batch_slots.SCAN_INTERVAL_NS, scan_interval_ns)
        area.release()


TOPIC_INDEX = 7
OTHER = "other"  # a topic with partitions known, not numbered in the session
LINGER_NS = 5_000_000


def appender_on_spare_blocks(fastpath: ModuleType, blocks: int, block_size: int = 256,
                             linger_ns: int = LINGER_NS) -> tuple[
        Any, SpareBlocks, list[Any], dict[tuple[str, int], Any], dict[int, Any]]:
    """An enabled Appender with no open batch, attached to a segment of ``blocks`` spare blocks, and TOPIC numbered
    TOPIC_INDEX in its session; what its seal() got (the batches sealed with no record: it removes them from the
    open batches, as the producer's does), its open batches and its unreported batches."""
    lock = threading.Lock()
    slow_sends.clear()
    spare = SpareBlocks(lock, blocks, block_size)
    open_batches: dict[tuple[str, int], Any] = {}
    unreported: dict[int, Any] = {}
    sealed: list[Any] = []

    def seal(batch: Any) -> None:
        assert lock.locked(), "seal() runs with the producer's lock held"
        sealed.append(batch)
        del open_batches[(batch.topic, batch.partition)]

    appender = fastpath.Appender(lock, open_batches, {TOPIC: 2, OTHER: 2}, RecordFuture, seal, slow_send, {}, True,
                                 {TOPIC: TOPIC_INDEX}, unreported, itertools.count(1), spare.wakeup)
    appender.attach(memoryview(spare.memory), memoryview(spare.control), block_size, block_size, linger_ns,
                    spare.take_spare)
    appender.enable()
    return appender, spare, sealed, open_batches, unreported


def test_the_fast_path_opens_a_batch_on_a_spare_block(fastpath: ModuleType) -> None:
    appender, spare, sealed, open_batches, unreported = appender_on_spare_blocks(fastpath, 2)
    first = appender.send(TOPIC, b"v" * 10, b"key", partition=1, timestamp_ms=BASE_TS)
    assert type(first) is RecordFuture
    [batch] = unreported.values()
    assert open_batches == {(TOPIC, 1): batch} and unreported == {1: batch} and batch.futures == [first]
    assert (batch.batch_id, batch.topic, batch.partition, batch.first_block, batch.block_count) == (1, TOPIC, 1, 0, 1)
    assert batch.base_timestamp == BASE_TS and 0 <= time.monotonic() - batch.created < HANG_S
    # Its slot says what the daemon needs to claim and send it; the daemon does not watch: it is told.
    daemon = ControlArea(memoryview(spare.control), 2)
    slot = daemon.snapshot(0)
    assert (slot.record_count, slot.length, slot.full, slot.batch_id, slot.topic_index, slot.partition,
            slot.block_count, slot.base_timestamp) == (1, batch.pos, False, 1, TOPIC_INDEX, 1, 1, BASE_TS)
    daemon.release()
    assert spare.wakeups == 1
    second = appender.send(TOPIC, None, b"k2", partition=1, timestamp_ms=BASE_TS + 5)
    assert spare.taken == 1 and batch.futures == [first, second]
    records = decode_records(spare.memory[:batch.pos], 2)
    assert [(r.offset_delta, r.timestamp_delta, r.key, r.value) for r in records] == [
        (0, 0, b"key", b"v" * 10), (1, 5, b"k2", None)]
    # The daemon watches past the linger of a batch opened now, at least as often: no WAKEUP.
    spare.watched(time.monotonic_ns() + int(HANG_S * 1e9), LINGER_NS)
    third = appender.send(TOPIC, b"v", b"k3", partition=0, timestamp_ms=BASE_TS)
    assert open_batches[(TOPIC, 0)].futures == [third] and open_batches[(TOPIC, 0)].first_block == 1
    assert spare.wakeups == 1 and list(unreported) == [1, 2]
    assert not spare.lock.locked() and sealed == [] and slow_sends == [] and appender.outstanding == 3


@pytest.mark.parametrize(("linger_ms", "scan_interval_ms", "watched_for_ms", "wakeup"), [
    pytest.param(5, 0, 0, True, id="not-watched"),
    pytest.param(5, 5, 60_000, False, id="watched-past-its-linger"),
    pytest.param(5, 5, 0, True, id="the-watch-ends-before-its-linger"),
    pytest.param(5, 10, 60_000, True, id="looked-at-less-often-than-its-linger"),
    pytest.param(0, 1, 60_000, True, id="no-linger"),
])
def test_a_batchs_first_record_says_wakeup_unless_the_daemon_will_look_at_it_in_time(
        fastpath: ModuleType, linger_ms: int, scan_interval_ms: int, watched_for_ms: int, wakeup: bool) -> None:
    appender, spare, _, open_batches, _ = appender_on_spare_blocks(fastpath, 1, linger_ns=linger_ms * 1_000_000)
    # The daemon writes in the header until when it looks at the segment's open batches, and how often.
    spare.watched(time.monotonic_ns() + watched_for_ms * 1_000_000, scan_interval_ms * 1_000_000)
    appender.send(TOPIC, b"v", b"k", partition=0)  # a batch opened by the fast path
    assert spare.wakeups == wakeup
    # One the Python path opened is told of the same way.
    appender.first_published(open_batches[(TOPIC, 0)])
    assert spare.wakeups == 2 * wakeup
    with pytest.raises(TypeError, match="first_published"):
        appender.first_published(object())


def test_a_record_that_fills_the_batch_it_opens_seals_it(fastpath: ModuleType) -> None:
    appender, spare, sealed, open_batches, unreported = appender_on_spare_blocks(fastpath, 1, block_size=128)
    future = appender.send(TOPIC, b"v" * 100, b"key", partition=0)
    [batch] = unreported.values()
    assert batch.futures == [future] and spare.wakeups == 1 and open_batches == {} and batch.capacity == 0
    assert not spare.lock.locked() and sealed == []


@pytest.mark.parametrize("spare_left", [1, 0])
@pytest.mark.parametrize("case", ["no-room", "claimed"])
def test_a_batch_that_refuses_the_record_is_sealed_and_another_opened(fastpath: ModuleType, case: str,
                                                                       spare_left: int) -> None:
    appender, spare, sealed, open_batches, unreported = appender_on_spare_blocks(fastpath, 1 + spare_left,
                                                                                 block_size=128)
    first = appender.send(TOPIC, b"v" * 10, b"key", partition=0)
    [refusing] = unreported.values()
    value = b"v" * 10
    if case == "no-room":
        value = b"v" * 100  # not in what is left of the block
    else:
        daemon = ControlArea(memoryview(spare.control), 2)
        daemon.claim(0)  # the daemon claimed the batch after its linger.ms
        daemon.release()
    second = appender.send(TOPIC, value, b"key", partition=0)
    assert refusing.capacity == 0 and refusing.futures == [first] and sealed == []
    if spare_left:
        [_, opened] = unreported.values()
        assert opened.futures == [second] and spare.wakeups == 2 and slow_sends == [] and appender.outstanding == 2
        # A record too large for what was left fills most of a block: the next like it would not fit there either.
        assert open_batches == ({} if case == "no-room" else {(TOPIC, 0): opened})
    else:
        # No spare block at hand: the Python path waits for one.
        assert second is DECLINED and len(slow_sends) == 1 and open_batches == {} and appender.outstanding == 1
    assert not spare.lock.locked()


def test_an_appender_disabled_while_a_refusing_batch_is_sealed_takes_the_record_no_further(
        fastpath: ModuleType) -> None:
    # Sealing a batch that took no record runs Python code (its blocks go back), which may let another thread close
    # the producer (disable its Appender) meanwhile. This one was opened by the Python path, on a block too small.
    lock = threading.Lock()
    slow_sends.clear()
    spare = SpareBlocks(lock, 2, 128)
    open_batches: dict[tuple[str, int], Any] = {(TOPIC, 0): new_batch(fastpath, 64)[0]}

    def seal(batch: Any) -> None:
        del open_batches[(batch.topic, batch.partition)]
        appender.disable()

    appender = fastpath.Appender(lock, open_batches, {TOPIC: 2}, RecordFuture, seal, slow_send, {}, True,
                                 {TOPIC: TOPIC_INDEX}, {}, itertools.count(1), spare.wakeup)
    appender.attach(memoryview(spare.memory), memoryview(spare.control), 128, 128, LINGER_NS, spare.take_spare)
    appender.enable()
    assert appender.send(TOPIC, b"v" * 100, b"key", partition=0) is DECLINED  # refused: sealed, and disabled
    assert spare.taken == 0 and open_batches == {} and len(slow_sends) == 1 and not lock.locked()


@pytest.mark.parametrize("case", ["no-spare-block", "larger-than-a-block", "topic-not-numbered", "detached"])
def test_the_fast_path_without_a_batch_it_can_open_declines(fastpath: ModuleType, case: str) -> None:
    appender, spare, sealed, open_batches, unreported = appender_on_spare_blocks(fastpath, 1, block_size=128)
    topic, value = TOPIC, b"v"
    if case == "no-spare-block":
        spare.spare.clear()
    elif case == "larger-than-a-block":
        value = b"v" * 200
    elif case == "topic-not-numbered":
        topic = OTHER  # its partitions known, its number in this session not yet: the Python path waits for it
    elif case == "detached":
        appender.detach()
    assert appender.send(topic, value, b"key", partition=0) is DECLINED
    assert len(slow_sends) == 1 and sealed == [] and open_batches == unreported == {}
    assert spare.taken == (1 if case == "no-spare-block" else 0) and not spare.lock.locked()


def test_take_spare_failing_fails_the_send_and_lets_go_of_the_lock(fastpath: ModuleType) -> None:
    appender, spare, sealed, open_batches, unreported = appender_on_spare_blocks(fastpath, 1)
    spare.raising = OSError("the wake-up pipe is closed")
    with pytest.raises(OSError, match="wake-up pipe"):
        appender.send(TOPIC, b"v", b"k", partition=0)
    spare.raising = None
    for bad in (99, -1, 2**64):
        spare.returning = bad
        with pytest.raises(ValueError, match="a block that is not one of the segment's"):
            appender.send(TOPIC, b"v", b"k", partition=0)
    assert not spare.lock.locked() and appender.outstanding == 0 and slow_sends == [] and sealed == []
    assert open_batches == unreported == {}


@pytest.mark.parametrize("case", ["disabled", "unknown-topic", "str-key", "bad-partition", "locked", "no-batch",
                                  "no-sticky-partition-yet", "headers"])
def test_the_fast_path_declines_and_leaves_everything_unchanged(fastpath: ModuleType, case: str) -> None:
    control = control_area(2)
    appender, lock, sealed, open_batches = appender_with_batches(fastpath, 2, capacity=64, control=control)
    args = {"topic": TOPIC, "value": b"value", "key": b"key", "partition": None, "timestamp_ms": None,
            "headers": None, "on_delivery": None}
    if case == "disabled":
        appender.disable()
    elif case == "unknown-topic":
        args["topic"] = "other"
    elif case == "str-key":
        args["key"] = "key"
    elif case == "bad-partition":
        args["partition"] = 2
    elif case == "locked":
        lock.acquire()
    elif case == "no-batch":
        open_batches.clear()
    elif case == "no-sticky-partition-yet":
        args["key"] = None  # the Python path picks one
    elif case == "headers":
        args["headers"] = [("h", b"v")]
    before = {key: (b.pos, b.record_count) for key, b in open_batches.items()}
    assert appender.send(**args) is DECLINED
    assert slow_sends == [tuple(args.values())]
    assert {key: (b.pos, b.record_count) for key, b in open_batches.items()} == before
    assert appender.outstanding == 0 and sealed == []


def test_the_appender_alone_counts_outstanding_records(fastpath: ModuleType) -> None:
    appender, _, _, _ = appender_with_batches(fastpath, 1)
    appender.send(TOPIC, b"v", b"k")
    appender.count_appended()  # a record the Python path appended
    assert appender.outstanding == 2
    with pytest.raises(AttributeError):
        appender.outstanding = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        appender.enabled = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="outstanding"):
        appender.count_done(3)  # more than were handed off: a bookkeeping bug, not a count below zero
    with pytest.raises(ValueError):
        appender.count_done(-1)
    appender.count_done(2)
    assert appender.outstanding == 0


def test_send_takes_its_arguments_as_python_would(fastpath: ModuleType) -> None:
    appender, _, _, _ = appender_with_batches(fastpath, 1)
    with pytest.raises(TypeError, match="missing required argument 'topic'"):
        appender.send()
    with pytest.raises(TypeError, match="at most 3 positional arguments"):
        appender.send(TOPIC, b"v", b"k", 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'partitions'"):
        appender.send(TOPIC, partitions=0)
    with pytest.raises(TypeError, match="multiple values for argument 'topic'"):
        appender.send(TOPIC, topic=TOPIC)
    future = appender.send(value=b"v", key=b"k", topic=TOPIC, partition=0)
    assert type(future) is RecordFuture and future.key_size == 1 and future.value_size == 1
    assert slow_sends == []


def test_the_fast_path_refuses_an_open_batch_that_is_not_its_own(fastpath: ModuleType) -> None:
    # The C code wrote into whatever the producer's dict held (a segfault); the twins' batches do not mix.
    appender, _, _, open_batches = appender_with_batches(fastpath, 1)
    strangers = [object()]
    other = _fastpath_py if fastpath is C_FASTPATH else C_FASTPATH
    if other is not None:
        strangers.append(new_batch(other, 1024)[0])
    for stranger in strangers:
        open_batches[(TOPIC, 0)] = stranger
        with pytest.raises(TypeError, match="open batches must be"):
            appender.send(TOPIC, b"v", b"k", partition=0)
        assert appender.outstanding == 0


def test_concurrent_sends_append_whole_records_in_offset_order(fastpath: ModuleType) -> None:
    # The C fast path appends under the GIL; the Python twin under the producer's lock, taken per record
    # (declining to the Python path when another thread holds it). Threads switch as often as they can here.
    sealed: list[Any] = []
    batch, memory = new_batch(fastpath, 1 << 20)
    appender = fastpath.Appender(threading.Lock(), {(TOPIC, 0): batch}, {TOPIC: 1}, RecordFuture, sealed.append,
                                 slow_send, {}, True, {}, {}, itertools.count(1), never_woken)
    appender.enable()
    appended: list[list[RecordFuture]] = [[] for _ in range(4)]

    def send(mine: list[RecordFuture]) -> None:
        for n in range(500):
            future = appender.send(TOPIC, b"v" * (n % 50), b"k%d" % n, partition=0, timestamp_ms=BASE_TS + n)
            if future is not DECLINED:
                mine.append(future)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=send, args=(mine,)) for mine in appended]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    taken = sum(map(len, appended))
    assert taken and appender.outstanding == taken == batch.record_count and sealed == []
    assert sorted(map(id, batch.futures)) == sorted(id(f) for mine in appended for f in mine)
    records = decode_records(memory[:batch.pos], taken)
    assert [r.offset_delta for r in records] == list(range(taken))
    assert [r.timestamp_delta for r in records] == [f.timestamp_ms - BASE_TS for f in batch.futures]


@pytest.mark.parametrize("name", ["OpenBatch", "Appender", "Completer"])
def test_the_types_do_not_exist_uninitialised(fastpath: ModuleType, name: str) -> None:
    # In C, __new__ without __init__ left NULL fields that the methods read: a segfault at the first call. Both
    # twins make and initialise an instance in __new__.
    cls = getattr(fastpath, name)
    with pytest.raises(TypeError, match="missing"):
        cls.__new__(cls)


def test_header_values_of_a_bytes_subclass_are_taken_as_bytes_however_many(fastpath: ModuleType) -> None:
    class Tagged(bytes):
        """What a serializer may return: bytes with a tag."""

    headers = [(b"h%d" % n, Tagged(b"v%d" % n)) for n in range(100)]  # more than the 64 buffers held at once
    plain = [(key, bytes(value)) for key, value in headers]
    assert fastpath.encode_record(0, 0, b"k", b"v", headers) == fastpath.encode_record(0, 0, b"k", b"v", plain)
    # Any iterable of pairs, copied before any field is read; anything else is refused with the rule.
    assert fastpath.encode_record(0, 0, None, None, iter(plain)) == fastpath.encode_record(0, 0, None, None, plain)
    with pytest.raises(TypeError, match=r"headers must be a sequence of \(key, value\) pairs"):
        fastpath.encode_record(0, 0, None, None, 42)


def test_a_record_of_more_than_64_buffers_that_are_not_bytes_is_refused(fastpath: ModuleType) -> None:
    # The C encoder holds 64 buffers at most while it writes a record: both twins take the same records.
    headers = [(b"h", bytearray(b"v"))] * 64
    assert fastpath.encode_record(0, 0, None, None, headers) == fastpath.encode_record(0, 0, None, None,
                                                                                       [(b"h", b"v")] * 64)
    with pytest.raises(ValueError, match=r"too many non-bytes buffers in one record \(64 at most\)"):
        fastpath.encode_record(0, 0, bytearray(b"k"), None, headers)


def test_negative_timestamps_are_refused_so_that_no_delta_overflows(fastpath: ModuleType) -> None:
    memory = bytearray(1024)
    with pytest.raises(ValueError, match="timestamp_ms must not be negative"):
        fastpath.OpenBatch(1, TOPIC, 0, 0, 1, memory, -(2**63), time.monotonic(), control_area(), 0)
    batch, memory = new_batch(fastpath, 1024)
    before = snapshot(batch, memory)
    for timestamp in (-1, -(2**63)):
        with pytest.raises(ValueError, match="timestamp_ms must not be negative"):
            batch.append(b"k", b"v", (), timestamp, RecordFuture(None, timestamp, 1, 1))
    assert snapshot(batch, memory) == before
    # The largest timestamp is a delta of 2**63 - 1 - BASE_TS from the base: within int64.
    assert batch.append(b"k", b"v", (), 2**63 - 1, RecordFuture(None, 2**63 - 1, 1, 1)) is True


# -- Appender.reported: delivery reports counted against their batches ---------------------------------------

REPORT_FIELD = st.one_of(st.integers(-3, 12), st.just(ipc.WHOLE_BATCH), st.just(2**70), st.just(-(2**70)),
                         st.sampled_from([None, "2", 1.5]))
REPORT_ROWS = st.lists(st.one_of(
    st.tuples(st.integers(0, 5), REPORT_FIELD, REPORT_FIELD, st.integers(-1, 9), st.just(-1),
              st.sampled_from([None, ["KafkaError", 2, "CORRUPT_MESSAGE", "bad", False]])).map(list),
    st.lists(st.integers(0, 3), max_size=7), st.just(5)), max_size=8)


def reported_by(twin: ModuleType, records: list[int], completed: list[int], sticky: dict[str, int],
                rows: list[Any]) -> tuple[object, ...]:
    """What a twin's Appender.reported(rows) returns (batches by id) or raises, and what it leaves: batches 1.. with
    ``records`` records each, open on partition id - 1 (all but batch 2), the first ``completed`` of each completed
    and counted reported already."""
    lock = threading.Lock()
    open_batches: dict[tuple[str, int], Any] = {}
    unreported: dict[int, Any] = {}
    sealed: list[int] = []
    for batch_id, (count, done) in enumerate(zip(records, completed, strict=True), start=1):
        batch = twin.OpenBatch(batch_id, TOPIC, batch_id - 1, batch_id - 1, 1, bytearray(1024), BASE_TS,
                               time.monotonic(), control_area(batch_id), 0)
        futures = [RecordFuture(None, BASE_TS, 1, 1) for _ in range(count)]
        for future in futures:
            assert batch.append(b"k", b"v", (), BASE_TS, future)
        twin.Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed).complete(
            futures, 0, min(done, count), TOPIC, 0, 0, -1, None)
        batch.reported = min(done, count)
        unreported[batch_id] = batch
        if batch_id != 2:
            open_batches[(TOPIC, batch_id - 1)] = batch

    def seal(batch: Any) -> None:  # as the producer's: a batch that took no record, sealed if still open
        if open_batches.get((batch.topic, batch.partition)) is batch:
            sealed.append(batch.batch_id)
            del open_batches[(batch.topic, batch.partition)]

    appender = twin.Appender(lock, open_batches, {TOPIC: 8}, RecordFuture, seal, slow_send, sticky, True, {TOPIC: 0},
                             unreported, itertools.count(10), never_woken)
    try:
        rows_out, delivered, failed = appender.reported(rows)
        outcome: object = ([(b.batch_id, *rest) for b, *rest in rows_out], delivered, failed)
    except Exception as exc:
        outcome = type(exc)
    return (outcome, sorted(unreported), {b: unreported[b].reported for b in unreported}, sorted(open_batches),
            sticky, sealed)


@c_only
@settings(max_examples=300, deadline=None)
@given(records=st.lists(st.integers(0, 4), min_size=4, max_size=4),
       completed=st.lists(st.integers(0, 4), min_size=4, max_size=4), sticky=st.integers(0, 4), rows=REPORT_ROWS)
def test_the_twins_count_any_reports_alike(records: list[int], completed: list[int], sticky: int,
                                           rows: list[Any]) -> None:
    # Whatever the daemon sends: the same rows out, counts, error, and batches left unreported, open and sticky.
    assert (reported_by(C_FASTPATH, records, completed, {TOPIC: sticky}, rows)
            == reported_by(_fastpath_py, records, completed, {TOPIC: sticky}, rows))


def test_reports_close_the_batches_still_open_and_forget_those_wholly_reported(fastpath: ModuleType) -> None:
    error = ["KafkaError", 2, "CORRUPT_MESSAGE", "bad", False]
    outcome, unreported, counted, still_open, sticky, sealed = reported_by(
        fastpath, [3, 2, 0, 4], [0, 0, 0, 2], {TOPIC: 0},
        [[1, 0, 2, 100, -1, None], [2, 0, ipc.WHOLE_BATCH, -1, -1, error], [3, 0, ipc.WHOLE_BATCH, 7, -1, None],
         [4, 0, ipc.WHOLE_BATCH, 50, -1, None], [99, 0, 1, 0, -1, None]])
    # Batch 1 in part, 2 failed whole, 3 (no record: sealed by seal(), which gives its blocks back), 4 the records
    # not reported before; a report of no batch here counts nothing.
    assert outcome == ([(1, 0, 2, 100, -1, None), (2, 0, 2, -1, -1, error), (3, 0, 0, 7, -1, None),
                        (4, 0, 4, 50, -1, None)], 2 + 2, 2)
    assert unreported == [1] and counted == {1: 2}
    # Each reported is sealed (the daemon claimed it): out of the open batches, its partition no longer sticky.
    assert still_open == [] and sticky == {} and sealed == [3]


# -- spare blocks taken by send() itself --------------------------------------------------------------------

SPARE_BLOCKS = 64


def batches_opened(fastpath: ModuleType, monkeypatch: pytest.MonkeyPatch, *, quick: bool) -> tuple[list[tuple], int]:
    """A producer's Appender and BlockGrants opening a batch at every send() on a segment of SPARE_BLOCKS blocks of
    256 bytes, the daemon granting each request at once and handing back a spare block with the report of every
    other batch when the header asks for one (as the daemon does, with reports that come for two batches at a
    time); with ``quick``, send() takes spare blocks itself where the grants' policy lets it, else never.

    BlockGrants' clock stands still, far ahead of the Appender's: every step is within the horizon of the rate. The
    Appender's side of that horizon is :func:`test_send_leaves_the_spare_blocks_to_take_spare_past_the_policy`'s,
    BlockGrants' is test_client_parts.py's. What each step showed (record taken, on which block, what was asked of
    the daemon, the header's spare_wanted), and the take_spare() calls."""
    now = time.monotonic() + 1e6
    monkeypatch.setattr(block_grants, "time", SimpleNamespace(monotonic=lambda: now))
    lock = threading.Lock()
    slow_sends.clear()
    posted: list[ipc.Message] = []
    grants = block_grants.BlockGrants(posted.append)
    grants.pool_blocks = 4096
    calls = [0]

    def take_spare() -> int | None:
        calls[0] += 1
        return grants.take_spare(1000)

    open_batches: dict[tuple[str, int], Any] = {}
    appender = fastpath.Appender(lock, open_batches, {TOPIC: 1}, RecordFuture, print, slow_send, {}, True,
                                 {TOPIC: TOPIC_INDEX}, {}, itertools.count(1), lambda: None)
    memory, control = bytearray(SPARE_BLOCKS * 256), control_area(SPARE_BLOCKS)
    area = ControlArea(memoryview(control), SPARE_BLOCKS)

    def never(spare: list[int] | None, floor: int, until_ns: int, wanted_base: int) -> int:
        return int(appender.spare_policy(None, floor, until_ns, wanted_base))

    grants.attach(area, appender.spare_policy if quick else never)
    appender.attach(memoryview(memory), memoryview(control), 256, 256, LINGER_NS, take_spare)
    appender.enable()
    fresh = itertools.count()
    steps = []
    for step in range(300):
        taken = type(appender.send(TOPIC, b"v", b"k", partition=0)) is RecordFuture
        batch = open_batches.pop((TOPIC, 0), None)
        if batch is not None:
            batch.release()
        asked = list(posted)
        posted.clear()
        with lock:
            for request in asked:
                if isinstance(request, ipc.Blocks):
                    grants.granted(ipc.Grant(request.request_id,
                                             [next(fresh) % SPARE_BLOCKS for _ in range(request.count)]))
            if step % 2 and area.header(batch_slots.SPARE_WANTED):
                grants.handed_back([next(fresh) % SPARE_BLOCKS])
        steps.append((taken, None if batch is None else batch.first_block, asked,
                      area.header(batch_slots.SPARE_WANTED)))
    area.release()
    return steps, calls[0]


def test_send_takes_spare_blocks_itself_where_take_spare_would_do_nothing_more(
        fastpath: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every step the same: the same blocks, the same requests and the same header; take_spare() runs only where a
    # request may be due (half a grant's worth left, none asked for).
    quick, quick_calls = batches_opened(fastpath, monkeypatch, quick=True)
    slow, slow_calls = batches_opened(fastpath, monkeypatch, quick=False)
    assert quick == slow
    # The first send() finds no spare block (the Python path waits for the first grant); every other takes one.
    assert [taken for taken, *_ in quick] == [False] + [True] * 299 and any(asked for _, _, asked, _ in quick[1:])
    assert slow_calls == 300 and quick_calls < 150


@pytest.mark.parametrize(("held", "floor", "until_s", "quick"), [
    pytest.param(3, 3, 60, True, id="allowed"),
    pytest.param(2, 3, 60, False, id="fewer-than-the-floor"),
    pytest.param(3, 3, -1, False, id="past-its-time"),
    pytest.param(0, 0, 60, False, id="none-at-hand"),
])
def test_send_leaves_the_spare_blocks_to_take_spare_past_the_policy(fastpath: ModuleType, held: int, floor: int,
                                                                    until_s: float, quick: bool) -> None:
    appender, spare, _, open_batches, _ = appender_on_spare_blocks(fastpath, 8)
    at_hand = [5, 6, 7][:held]
    assert appender.spare_policy(at_hand, floor, time.monotonic_ns() + int(until_s * 1e9), 6) == 0
    appender.send(TOPIC, b"v", b"k", partition=0)
    [batch] = open_batches.values()
    header = ControlArea(memoryview(spare.control), 8)
    if quick:
        # The last block at hand, without take_spare(); the header says the spare blocks wanted as it would have.
        assert batch.first_block == 7 and at_hand == [5, 6] and spare.taken == 0
        assert header.header(batch_slots.SPARE_WANTED) == 6 - 2
        assert appender.spare_policy(None, 0, 0, 0) == 1
    else:
        assert batch.first_block == 0 and spare.taken == 1 and len(at_hand) == held
        assert appender.spare_policy(None, 0, 0, 0) == 0
    header.release()


def test_a_spare_policy_is_checked(fastpath: ModuleType) -> None:
    appender, _, _, _ = appender_with_batches(fastpath, 1)
    with pytest.raises(TypeError):
        appender.spare_policy((1, 2), 1, 0, 0)
    with pytest.raises(TypeError):
        appender.spare_policy([1], 1.5, 0, 0)
    with pytest.raises(OverflowError):
        appender.spare_policy([1], 1, 2**64, 0)
    with pytest.raises(ValueError):
        appender.spare_policy([1], -1, 0, 0)
    with pytest.raises(ValueError):
        appender.spare_policy([1], 1, 0, -(2**62))
    assert appender.spare_policy([1], 1, 0, 0) == 0


def test_a_spare_list_that_is_not_blocks_leaves_the_record_to_the_python_path(fastpath: ModuleType) -> None:
    appender, spare, _, open_batches, _ = appender_on_spare_blocks(fastpath, 8)
    at_hand: list[Any] = [None]
    appender.spare_policy(at_hand, 1, time.monotonic_ns() + 60 * 10**9, 0)
    assert appender.send(TOPIC, b"v", b"k", partition=0) is DECLINED
    assert at_hand == [] and open_batches == {} and spare.taken == 0 and len(slow_sends) == 1
    assert appender.spare_policy(None, 0, 0, 0) == 1


def test_a_report_row_changed_as_its_batch_is_sealed_counts_as_it_came(fastpath: ModuleType) -> None:
    # Sealing a batch that took no record runs Python code (seal()), which could change the row being counted.
    row = [1, 0, ipc.WHOLE_BATCH, 7, -1, None]
    batch = fastpath.OpenBatch(1, TOPIC, 0, 0, 1, bytearray(256), BASE_TS, time.monotonic(), control_area(1), 0)
    open_batches: dict[tuple[str, int], Any] = {(TOPIC, 0): batch}

    def seal(sealed: Any) -> None:
        del open_batches[(sealed.topic, sealed.partition)]
        row.clear()

    appender = fastpath.Appender(threading.Lock(), open_batches, {TOPIC: 1}, RecordFuture, seal, slow_send, {}, True,
                                 {TOPIC: 0}, {1: batch}, itertools.count(2), never_woken)
    assert appender.reported([row]) == ([(batch, 0, 0, 7, -1, None)], 0, 0)
    assert open_batches == {} and row == []
