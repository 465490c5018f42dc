"""client_stub._fastpath without a daemon: batches written in memory, futures completed from reports.

OpenBatch writes records into a bytearray here as it does into shared memory; the
Completer is the producer's own (its callback errors go to the producer's log);
RecordFutures are made both ways the producer makes them: by their ``__init__``
(the Python path of send()) and by the C fast path (Appender.send).
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import threading
import time
from collections.abc import Callable

import pytest

from client_stub import _fastpath
from client_stub.errors import InvalidRecordError, KafkaTimeoutError
from client_stub.producer import RecordFuture, RecordMetadata, _completer, _fail
from tests.unit.test_partitioner import KAFKA_VECTORS

BASE_TS = 1_700_000_000_000
TOPIC = "t"


def new_batch(capacity: int, *, partition: int = 0) -> tuple[_fastpath.OpenBatch, bytearray]:
    """An OpenBatch over a fresh bytearray (filled with 0xAA), its base timestamp BASE_TS."""
    memory = bytearray([0xAA]) * capacity
    return _fastpath.OpenBatch(1, TOPIC, partition, 0, 1, memory, BASE_TS, time.monotonic()), memory


def snapshot(batch: _fastpath.OpenBatch, memory: bytearray) -> tuple:
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


def appender_with_batches(partitions: int, *, capacity: int = 1024) -> tuple[
        _fastpath.Appender, threading.Lock, list[_fastpath.OpenBatch], dict[tuple[str, int], _fastpath.OpenBatch]]:
    """An enabled Appender (murmur2_random) for TOPIC with an open batch on every partition, what its seal()
    got, and its open batches."""
    lock = threading.Lock()
    slow_sends.clear()
    sealed: list[_fastpath.OpenBatch] = []

    def seal(batch: _fastpath.OpenBatch) -> None:
        assert lock.locked(), "seal() runs with the producer's lock held"
        sealed.append(batch)

    open_batches = {(TOPIC, partition): new_batch(capacity, partition=partition)[0]
                    for partition in range(partitions)}
    appender = _fastpath.Appender(lock, open_batches, {TOPIC: partitions}, RecordFuture, seal, slow_send, {}, True)
    appender.enable()
    return appender, lock, sealed, open_batches


def python_futures(count: int, on_delivery: Callable | None = None) -> list[RecordFuture]:
    """Futures as the Python path of send() makes them (key of 3 bytes, null value)."""
    return [RecordFuture(on_delivery, BASE_TS + n, 3, -1) for n in range(count)]


def c_futures(count: int, on_delivery: Callable | None = None) -> list[RecordFuture]:
    """Futures as the C fast path of send() makes them (key of 3 bytes, null value)."""
    appender, _, _, _ = appender_with_batches(1, capacity=1 << 16)
    futures = [appender.send(TOPIC, None, b"key", timestamp_ms=BASE_TS + n, on_delivery=on_delivery)
               for n in range(count)]
    assert all(type(f) is RecordFuture for f in futures)
    return futures


MAKERS = [pytest.param(python_futures, id="python-made"), pytest.param(c_futures, id="c-made")]


# -- OpenBatch --------------------------------------------------------------------------------------


RECORDS = [
    # (key, value, headers, timestamp): later, earlier and equal to the batch's base timestamp.
    (b"k0", b"value-0", (), BASE_TS),
    (None, b"value-1", [(b"h", b"x"), (b"nil", None)], BASE_TS + 250),
    (b"k2", None, (), BASE_TS - 40),
    (b"", b"", [(b"only", b"")], BASE_TS + 100_000),
    (bytearray(b"k4"), memoryview(b"v" * 300), (), BASE_TS + 3),
]


def test_append_writes_what_encode_record_writes_with_deltas_from_the_batch() -> None:
    batch, memory = new_batch(2048)
    futures = python_futures(len(RECORDS))
    for (key, value, headers, timestamp), future in zip(RECORDS, futures, strict=True):
        assert batch.append(key, value, headers, timestamp, future) is True
    expected = b"".join(_fastpath.encode_record(n, timestamp - BASE_TS, key, value, headers)
                        for n, (key, value, headers, timestamp) in enumerate(RECORDS))
    assert bytes(memory[:batch.pos]) == expected
    assert batch.pos == len(expected) and batch.record_count == len(RECORDS)
    assert batch.futures == futures  # in offset order
    assert batch.base_timestamp == BASE_TS
    assert batch.max_timestamp == BASE_TS + 100_000
    assert memory[batch.pos:] == bytearray([0xAA]) * (2048 - batch.pos)  # nothing written past the records


def test_append_that_does_not_fit_leaves_the_batch_unchanged() -> None:
    first = _fastpath.encode_record(0, 0, b"k", b"v" * 40, ())
    second = _fastpath.encode_record(1, 7, None, b"w" * 30, [(b"h", b"x")])
    batch, memory = new_batch(len(first) + len(second))
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


def test_a_released_batch_refuses_records_and_lets_go_of_its_memory() -> None:
    batch, memory = new_batch(256)
    assert batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1))
    with pytest.raises(BufferError):
        memory.extend(b"x")  # the batch holds the buffer: shared memory could not be closed under it
    written = bytes(memory)
    batch.release()
    batch.release()  # a second release is harmless
    assert batch.capacity == 0
    memory.extend(b"x")  # let go of: the segment can be closed now
    with pytest.raises(ValueError, match="sealed"):
        batch.append(b"k", b"v", (), BASE_TS, RecordFuture(None, BASE_TS, 1, 1))
    assert batch.record_count == 1 and bytes(memory[:-1]) == written


# -- encode_record_into -----------------------------------------------------------------------------


def test_encode_record_into_raises_when_the_record_does_not_fit() -> None:
    size = _fastpath.record_size(0, 5, b"key", b"value", [(b"h", None)])
    memory = bytearray([0xAA]) * (size + 10)
    for pos in (11, len(memory), len(memory) + 1, -1):
        with pytest.raises(ValueError, match="does not fit"):
            _fastpath.encode_record_into(memory, pos, 0, 5, b"key", b"value", [(b"h", None)])
    assert memory == bytearray([0xAA]) * (size + 10)  # untouched
    assert _fastpath.encode_record_into(memory, 10, 0, 5, b"key", b"value", [(b"h", None)]) == len(memory)
    assert bytes(memory[10:]) == _fastpath.encode_record(0, 5, b"key", b"value", [(b"h", None)])


# -- Completer --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MAKERS)
def test_complete_a_slice_of_the_futures(make) -> None:
    calls = Calls()
    futures = make(6, calls)
    # A report on records 2-4 (a part of a split batch: its own base offset), then the others.
    _completer.complete(futures, 2, 3, TOPIC, 4, 50, -1, None)
    assert [f.done() for f in futures] == [False, False, True, True, True, False]
    assert [f.result(0) for f in futures[2:5]] == [RecordMetadata(TOPIC, 4, 50 + n, BASE_TS + 2 + n, 3, -1)
                                                   for n in range(3)]
    _completer.complete(futures, 0, 2, TOPIC, 4, 40, BASE_TS + 999, None)  # LogAppendTime: the broker's time
    assert [f.result(0) for f in futures[:2]] == [RecordMetadata(TOPIC, 4, 40 + n, BASE_TS + 999, 3, -1)
                                                  for n in range(2)]
    _completer.complete(futures, 5, 10, TOPIC, 4, -1, -1, None)  # acks=0: no offset; a count past the end
    assert futures[5].result(0) == RecordMetadata(TOPIC, 4, -1, BASE_TS + 5, 3, -1)
    assert [err for err, _ in calls.calls] == [None] * 6
    assert [md for _, md in calls.calls] == [futures[n].result(0) for n in (2, 3, 4, 0, 1, 5)]


@pytest.mark.parametrize("make", MAKERS)
def test_complete_with_an_error_fails_every_future_of_the_slice(make) -> None:
    calls = Calls()
    futures = make(4, calls)
    error = InvalidRecordError("the broker refused the record")
    _completer.complete(futures, 1, 3, TOPIC, 0, 77, -1, error)
    assert not futures[0].done()
    for future in futures[1:]:
        assert future.exception(0) is error
        with pytest.raises(InvalidRecordError):
            future.result(0)
    assert calls.calls == [(error, None)] * 3


@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_callback_that_raises_is_logged_and_the_others_still_run(make, watched: bool, caplog) -> None:
    calls = Calls(fail_on=11)
    futures = make(4, calls)
    if watched:  # a done-callback makes the future's Condition: it completes through _notify
        for future in futures:
            future.add_done_callback(lambda f: None)
    with caplog.at_level(logging.ERROR, logger="client_stub.producer"):
        _completer.complete(futures, 0, 4, TOPIC, 0, 10, -1, None)
    assert [md.offset for _, md in calls.calls] == [10, 11, 12, 13]
    assert [f.result(0).offset for f in futures] == [10, 11, 12, 13]
    [logged] = [r for r in caplog.records if "on_delivery" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert isinstance(logged.exc_info[1], RuntimeError) and "offset 11" in str(logged.exc_info[1])


@pytest.mark.parametrize("raising", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_callback_that_raises_a_base_exception_completes_every_future_then_raises_it(
        make, watched: bool, raising: type[BaseException], caplog) -> None:
    calls = Calls(fail_on=11, raising=raising)
    futures = make(4, calls)
    if watched:
        for future in futures:
            future.add_done_callback(lambda f: None)
    with caplog.at_level(logging.ERROR, logger="client_stub.producer"), \
            pytest.raises(raising, match="callback failed at offset 11"):
        _completer.complete(futures, 0, 4, TOPIC, 0, 10, -1, None)
    # Not swallowed (nothing logged in its place), and no future of the report left pending:
    # every callback ran.
    assert not [r for r in caplog.records if "on_delivery" in r.getMessage()]
    assert [f.result(0).offset for f in futures] == [10, 11, 12, 13]
    assert [md.offset for _, md in calls.calls] == [10, 11, 12, 13]


@pytest.mark.parametrize("watched", [False, True], ids=["settled-in-place", "watched"])
@pytest.mark.parametrize("make", MAKERS)
def test_a_future_completes_once(make, watched: bool) -> None:
    calls = Calls()
    futures = make(3, calls)
    done_callbacks: list[RecordFuture] = []
    if watched:
        for future in futures:
            future.add_done_callback(done_callbacks.append)
    # The first record was failed as lost (the session went away); its report comes after all.
    lost = KafkaTimeoutError("lost")
    _fail(futures[:1], lost)
    _completer.complete(futures, 0, 3, TOPIC, 0, 0, -1, None)
    _completer.complete(futures, 0, 3, TOPIC, 0, 500, -1, KafkaTimeoutError("late"))
    assert futures[0].exception(0) is lost
    assert [f.result(0).offset for f in futures[1:]] == [1, 2]
    assert calls.calls == [(lost, None), (None, futures[1].result(0)), (None, futures[2].result(0))]
    if watched:
        assert sorted(map(id, done_callbacks)) == sorted(map(id, futures))


@pytest.mark.parametrize("make", MAKERS)
def test_a_future_waited_on_in_another_thread_is_woken(make) -> None:
    futures = make(3)
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
    _completer.complete(futures, 0, 2, TOPIC, 1, 7, -1, None)
    for waiter in waiters:
        waiter.join(10)
    assert not any(w.is_alive() for w in waiters)
    assert got == {"result": RecordMetadata(TOPIC, 1, 7, BASE_TS, 3, -1), "wait": {futures[1]}}


def test_c_made_futures_are_back_in_the_garbage_collectors_sight_once_complete() -> None:
    futures = c_futures(2)
    _completer.complete(futures, 0, 1, TOPIC, 0, 0, -1, None)
    _fail(futures[1:], KafkaTimeoutError("lost"))
    # Done futures may end up in cycles (a traceback, a callback holding its future): the collector must see them.
    assert all(gc.is_tracked(f) for f in futures)


# -- Appender: the fast path of send() ----------------------------------------------------------------


def test_keyed_records_go_where_kafka_puts_them() -> None:
    # Kafka's murmur2 test vectors, through the fast path's own choice of partition: toPositive(hash) % count.
    for partitions in (3, 12, 50):
        appender, _, _, open_batches = appender_with_batches(partitions)
        for key, expected in KAFKA_VECTORS.items():
            future = appender.send(TOPIC, b"v", key)
            assert future is not DECLINED
            [(partition, batch)] = [(p, b) for (_, p), b in open_batches.items() if future in b.futures]
            assert partition == (expected & 0x7FFFFFFF) % partitions, (key, partitions)
        assert appender.outstanding == len(KAFKA_VECTORS)


def test_the_fast_path_appends_and_seals_a_full_batch() -> None:
    record = _fastpath.encode_record(0, 0, b"key", b"v" * 100, ())
    appender, _, sealed, open_batches = appender_with_batches(1, capacity=len(record) * 3 + 10)
    batch = open_batches[(TOPIC, 0)]
    futures = [appender.send(TOPIC, b"v" * 100, b"key", partition=0, timestamp_ms=BASE_TS + n) for n in range(3)]
    assert batch.futures == futures and batch.record_count == 3
    assert [f.timestamp_ms for f in futures] == [BASE_TS + n for n in range(3)]
    # The third left too little room for a fourth like it: sealed at once, with the producer's lock held.
    assert sealed == [batch]


@pytest.mark.parametrize("case", ["disabled", "unknown-topic", "str-key", "bad-partition", "no-room", "locked",
                                  "no-batch", "no-sticky-partition-yet", "headers"])
def test_the_fast_path_declines_and_leaves_everything_unchanged(case: str) -> None:
    appender, lock, sealed, open_batches = appender_with_batches(2, capacity=64)
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
    elif case == "no-room":
        args["value"] = b"v" * 64
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


def test_the_appender_alone_counts_outstanding_records() -> None:
    appender, _, _, _ = appender_with_batches(1)
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


def test_send_takes_its_arguments_as_python_would() -> None:
    appender, _, _, _ = appender_with_batches(1)
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


@pytest.mark.parametrize("cls", [_fastpath.OpenBatch, _fastpath.Appender, _fastpath.Completer])
def test_the_c_types_do_not_exist_uninitialised(cls: type) -> None:
    # __new__ without __init__ left NULL fields that the methods read: a segfault at the first call.
    with pytest.raises(TypeError, match="missing required argument"):
        cls.__new__(cls)


def test_header_values_of_a_bytes_subclass_are_taken_as_bytes_however_many() -> None:
    class Tagged(bytes):
        """What a serializer may return: bytes with a tag."""

    headers = [(b"h%d" % n, Tagged(b"v%d" % n)) for n in range(100)]  # more than the 64 buffers held at once
    plain = [(key, bytes(value)) for key, value in headers]
    assert _fastpath.encode_record(0, 0, b"k", b"v", headers) == _fastpath.encode_record(0, 0, b"k", b"v", plain)
    # Any iterable of pairs, copied before any field is read; anything else is refused with the rule.
    assert _fastpath.encode_record(0, 0, None, None, iter(plain)) == _fastpath.encode_record(0, 0, None, None, plain)
    with pytest.raises(TypeError, match=r"headers must be a sequence of \(key, value\) pairs"):
        _fastpath.encode_record(0, 0, None, None, 42)


def test_negative_timestamps_are_refused_so_that_no_delta_overflows() -> None:
    memory = bytearray(1024)
    with pytest.raises(ValueError, match="timestamp_ms must not be negative"):
        _fastpath.OpenBatch(1, TOPIC, 0, 0, 1, memory, -(2**63), time.monotonic())
    batch, memory = new_batch(1024)
    before = snapshot(batch, memory)
    for timestamp in (-1, -(2**63)):
        with pytest.raises(ValueError, match="timestamp_ms must not be negative"):
            batch.append(b"k", b"v", (), timestamp, RecordFuture(None, timestamp, 1, 1))
    assert snapshot(batch, memory) == before
    # The largest timestamp is a delta of 2**63 - 1 - BASE_TS from the base: within int64.
    assert batch.append(b"k", b"v", (), 2**63 - 1, RecordFuture(None, 2**63 - 1, 1, 1)) is True
