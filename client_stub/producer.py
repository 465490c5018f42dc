"""Producer: what applications use to send records through the node's kafka-sidecar daemon.

``send()`` serializes and partitions a record and writes it, in Kafka's v2
record format, straight into this process's open block of shared memory for the
partition; no message to the daemon is needed for that. A block is sealed when
full, when linger_ms has passed, on flush() and close(), and when the daemon
asks; the seal notice hands the batch to the daemon, which sends it and reports
its outcome back; the I/O thread then completes each record's Future.

Thread-safe; fork-safe (a child process starts afresh as a new client).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, RUNNING
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from . import ipc
from .errors import (
    BufferExhaustedError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SidecarUnavailableError,
)
from .partitioner import Partitioner
from .records import Header, encode_record
from .shm import Segment

log = logging.getLogger(__name__)

# Spare blocks kept at hand so that opening a batch needs no round trip.
_SPARE_LOW = 4
_BLOCKS_PER_GRANT = 8
# A batch not reported this long after the daemon's delivery.timeout.ms is given up on.
_REPORT_GRACE_MS = 30_000
# pyzmq's flags are enum.Flag members, whose & runs Python code: plain ints for the per-message calls.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
# The batch header the daemon writes around a block's records (counted against max.request.size).
_BATCH_OVERHEAD = 61
# Sealed batches of a partition awaiting their reports beyond which its open batch is not sealed at
# linger_ms: it keeps filling until full (or flush), as a Java batch that is ready but not yet drained
# does. Without it, many clients each sealing a batch every linger_ms queue more batches per partition
# than the daemon can send (one per partition per request), and the queue only grows.
_SEALED_PER_PARTITION = 1

Serializer = Callable[[Any], "bytes | None"]
DeliveryCallback = Callable[["KafkaError | None", "RecordMetadata | None"], None]


class RecordMetadata(NamedTuple):
    """Where a record landed."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    serialized_key_size: int
    serialized_value_size: int


_new_tuple = tuple.__new__

# Guards the first use of a RecordFuture's Condition against its completion.
_CONDITION_LOCK = threading.Lock()


class RecordFuture(Future):
    """The Future of one record, with what its RecordMetadata needs.

    A plain Future makes a threading.Condition when created: the largest cost of a
    send(). Most record futures are never waited on one by one (flush() waits for
    all of them), so this one makes its Condition on first use, and a future that
    nobody waits on or watches completes without one (see _complete_all). Both
    paths hold _CONDITION_LOCK, so a waiter arriving during completion either finds
    the Condition to be notified on or the result already set.
    """

    # Until completion sets them on the instance: one store fewer each per send().
    _result = None
    _exception: BaseException | None = None
    _cond: threading.Condition | None = None

    def __init__(self, on_delivery: DeliveryCallback | None, timestamp_ms: int, key_size: int,
                 value_size: int) -> None:
        # Future.__init__ is skipped on purpose: it makes the Condition.
        self._state = RUNNING
        self._waiters: list = []
        self._done_callbacks: list = []
        self.on_delivery = on_delivery
        self.timestamp_ms = timestamp_ms
        self.key_size = key_size
        self.value_size = value_size

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _CONDITION_LOCK:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def _notify(self, result: RecordMetadata | None, error: KafkaError | None) -> None:
        if error is None:
            self.set_result(result)
        else:
            self.set_exception(error)
        if self.on_delivery is not None:
            self._run_callback(result, error)

    def _run_callback(self, result: RecordMetadata | None, error: KafkaError | None) -> None:
        try:
            self.on_delivery(error, result)  # type: ignore[misc]
        except Exception:
            log.exception("error in an on_delivery callback")


def _complete_all(outcomes: list[tuple[RecordFuture, RecordMetadata | None, KafkaError | None]]) -> None:
    """Complete record futures (the I/O thread), taking _CONDITION_LOCK once rather than once each."""
    watched = []
    quiet = []
    with _CONDITION_LOCK:
        for outcome in outcomes:
            future, result, error = outcome
            if future._cond is None:
                future._result, future._exception, future._state = result, error, FINISHED
                if future.on_delivery is not None:
                    quiet.append(outcome)
            else:
                watched.append(outcome)
    for future, result, error in watched:
        future._notify(result, error)
    for future, result, error in quiet:  # _run_callback inlined: once per record
        try:
            future.on_delivery(error, result)  # type: ignore[misc]
        except Exception:
            log.exception("error in an on_delivery callback")


class _Batch:
    """A batch being written into this process's blocks, then sealed and awaiting its report."""

    __slots__ = ("batch_id", "topic", "partition", "first_block", "block_count", "view", "pos", "base_ts",
                 "max_ts", "created", "sealed", "futures", "reported")

    def __init__(self, batch_id: int, topic: str, partition: int, first_block: int, block_count: int,
                 view: memoryview, timestamp_ms: int) -> None:
        self.batch_id = batch_id
        self.topic = topic
        self.partition = partition
        self.first_block = first_block
        self.block_count = block_count
        self.view = view
        self.pos = 0
        self.base_ts = timestamp_ms
        self.max_ts = timestamp_ms
        self.created = time.monotonic()
        self.sealed = 0.0
        self.futures: list[RecordFuture] = []
        self.reported = 0


@dataclass(slots=True)
class _Topic:
    partition_count: int | None = None
    available: tuple[int, ...] = ()
    error: KafkaError | None = None


class _BlockRequest:
    __slots__ = ("count", "contiguous", "blocks", "error")

    def __init__(self, count: int, contiguous: bool) -> None:
        self.count = count
        self.contiguous = contiguous
        self.blocks: list[int] | None = None
        self.error: str | None = None


_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_producers):
        producer._forget_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Producer:
    """Sends records to Kafka through the kafka-sidecar daemon at ``endpoint``.

    ``endpoint`` defaults to ``$KAFKA_SIDECAR_ENDPOINT``, else
    ``ipc:///run/kafka-sidecar/sidecar.sock``. Options: ``linger_ms`` and
    ``max_block_ms`` (when not given, the daemon's linger.ms and max.block.ms:
    5 and 60000 by default), ``key_serializer``, ``value_serializer`` and
    ``partitioner`` ("murmur2_random", "consistent_random" or "random"). Kafka
    settings (acks, retries, compression...) are the daemon's.
    """

    def __init__(self, endpoint: str | None = None, *, linger_ms: int | None = None,
                 max_block_ms: int | None = None,
                 key_serializer: Serializer | None = None, value_serializer: Serializer | None = None,
                 partitioner: str = "murmur2_random", client_name: str | None = None) -> None:
        for name, value in (("linger_ms", linger_ms), ("max_block_ms", max_block_ms)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self.endpoint = endpoint or ipc.default_endpoint()
        self._linger_ms = linger_ms
        self._max_block_ms = max_block_ms
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._partitioner_name = partitioner
        self._partitioner = Partitioner(partitioner)
        self._client_name = client_name or f"python-{os.getpid()}"
        self._closed = False
        self._pid = -1
        self._init_state()
        _producers.add(self)

    # -- life cycle ------------------------------------------------------------------------------

    def _init_state(self) -> None:
        """Fresh per-process state (at construction, and in a forked child)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._welcome: dict[str, Any] | None = None
        self._session_error: KafkaError | None = None
        self._segment: Segment | None = None
        self._spare: list[int] = []
        self._open: dict[tuple[str, int], _Batch] = {}
        self._sealed: dict[int, _Batch] = {}
        # Per (topic, partition): how many of the sealed batches await their reports.
        self._unreported: dict[tuple[str, int], int] = {}
        self._topics: dict[str, _Topic] = {}
        self._requests: dict[int, _BlockRequest] = {}
        self._outbox: deque[bytes] = deque()
        self._seal_notices: list[list[Any]] = []
        self._hello_sent = False
        self._linger_s = (self._linger_ms if self._linger_ms is not None else 5) / 1000
        self._io_wakes_at = 0.0
        self._lost: list[tuple[RecordFuture, RecordMetadata | None, KafkaError | None]] = []
        self._next_batch_id = 1
        self._next_request_id = 1
        self._outstanding = 0
        self._io_thread: threading.Thread | None = None
        self._stopping = False
        self._context: zmq.Context | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    def _forget_parent(self) -> None:
        # In a forked child: the parent's sockets, threads, blocks and records are the
        # parent's. Drop them without closing anything the parent still uses.
        self._abandoned = (self._context, self._wake_r, self._wake_w, self._segment, self._open, self._sealed)
        self._init_state()
        self._pid = -1

    def _ensure_started(self) -> None:
        """Start the I/O thread in this process (again after a fork)."""
        if self._closed:
            raise KafkaError("Cannot send after the producer is closed.")
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._context = zmq.Context()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._stopping = False
            self._io_thread = threading.Thread(target=self._io_loop, name="kafka-sidecar-io", daemon=True)
            self._pid = os.getpid()
            self._io_thread.start()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records handed off and not yet reported."""
        return self._outstanding

    # -- send ------------------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None = None,
             on_delivery: DeliveryCallback | None = None) -> Future:
        """Hand a record over; the Future's result is its RecordMetadata.

        Blocks up to max_block_ms for the daemon's welcome, the topic's metadata
        and free memory, then raises SidecarUnavailableError, KafkaTimeoutError or
        BufferExhaustedError. RecordTooLargeError if the record exceeds max.request.size.
        """
        # A forked child has _pid -1 (the at-fork hook resets it): no getpid() per record.
        if self._pid < 0 or self._closed:
            self._ensure_started()
        if self._key_serializer is not None or (key is not None and type(key) is not bytes):
            key = self._serialize(key, self._key_serializer, "key")
        if self._value_serializer is not None or (value is not None and type(value) is not bytes):
            value = self._serialize(value, self._value_serializer, "value")
        header_list = _headers(headers) if headers else ()
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative integer, got {timestamp_ms!r}")
        if partition is not None and (type(partition) is not int or partition < 0):
            raise ValueError(f"partition must be a non-negative integer, got {partition!r}")
        deadline = 0.0
        info = self._topics.get(topic)
        if info is None or not info.partition_count:
            # The first send to a topic: check it, and wait for the daemon and the metadata.
            ipc.check_topic(topic)
            deadline = time.monotonic() + self.max_block_ms / 1000
            self._wait_for_welcome(deadline)
            info = self._wait_for_topic(topic, deadline)
        if partition is not None and partition >= info.partition_count:  # type: ignore[operator]
            raise ValueError(f"partition {partition} of topic {topic} does not exist: it has "
                             f"{info.partition_count} partitions (0-{info.partition_count - 1})")  # type: ignore[operator]
        future = RecordFuture(on_delivery, timestamp_ms, -1 if key is None else len(key),
                              -1 if value is None else len(value))
        self._append(topic, partition, key, value, header_list, future, info, deadline)
        return future

    @staticmethod
    def _serialize(data: Any, serializer: Serializer | None, what: str) -> bytes | None:
        if serializer is not None:
            data = serializer(data)
        if data is None or isinstance(data, bytes):
            return data
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        raise TypeError(f"{what} must be bytes, str or None (or give a {what}_serializer), "
                        f"got {type(data).__name__}")

    def _append(self, topic: str, explicit: int | None, key: bytes | None, value: bytes | None,
                headers: Sequence[Header], future: RecordFuture, info: _Topic, deadline: float) -> None:
        timestamp = future.timestamp_ms
        with self._lock:
            while True:
                partition = explicit
                if partition is None:
                    partition = self._partitioner.partition(topic, key, info.partition_count,  # type: ignore[arg-type]
                                                            info.available)
                batch = self._open.get((topic, partition))
                if batch is None:
                    data = encode_record(0, 0, key, value, headers)
                    batch = self._new_batch(topic, partition, len(data), timestamp, deadline)
                    if batch is None:
                        continue  # the lock was released while waiting for blocks: look again
                else:
                    data = encode_record(len(batch.futures), timestamp - batch.base_ts, key, value, headers)
                    if batch.pos + len(data) > len(batch.view):
                        self._seal(batch)
                        continue
                pos = batch.pos
                end = batch.pos = pos + len(data)
                batch.view[pos:end] = data
                batch.futures.append(future)
                if timestamp > batch.max_ts:
                    batch.max_ts = timestamp
                self._outstanding += 1
                # Full, or nearly: the next record like this one would not fit.
                if len(batch.view) - end < len(data):
                    self._seal(batch)
                return

    def _new_batch(self, topic: str, partition: int, size: int, timestamp_ms: int,
                   deadline: float) -> _Batch | None:
        """A batch on fresh blocks for a record of ``size`` bytes; None if the lock was released to wait."""
        self._check_session()
        welcome = self._welcome
        assert welcome is not None
        limit = welcome["settings"]["max_request_size"]
        if size + _BATCH_OVERHEAD > limit:
            raise RecordTooLargeError(
                f"The message is {size + _BATCH_OVERHEAD} bytes when serialized which is larger than {limit}, "
                "which is the value of the max.request.size configuration.")
        if not deadline:
            deadline = time.monotonic() + self.max_block_ms / 1000
        blocks = self._take_blocks(-(-size // welcome["block_size"]), deadline)
        if blocks is None:
            return None
        return self._open_batch(topic, partition, blocks, timestamp_ms)

    def _open_batch(self, topic: str, partition: int, blocks: list[int], timestamp_ms: int) -> _Batch:
        assert self._segment is not None
        view = self._segment.blocks(blocks[0], len(blocks))
        batch = _Batch(self._next_batch_id, topic, partition, blocks[0], len(blocks), view, timestamp_ms)
        self._next_batch_id += 1
        self._open[(topic, partition)] = batch
        if (batch.created + self._linger_s < self._io_wakes_at
                and self._unreported.get((topic, partition), 0) < _SEALED_PER_PARTITION):
            self._wake()  # the I/O thread must wake sooner than it planned, for this batch's linger
        return batch

    def _take_blocks(self, count: int, deadline: float) -> list[int] | None:
        """``count`` blocks (contiguous if more than one), or None after waiting (lock released)."""
        if count == 1:
            self._maybe_request_spare()
            if self._spare:
                return [self._spare.pop()]

            def waiting() -> bool:
                # Spare blocks may go back to the daemon meanwhile (SEAL_NOW): ask again if so.
                self._maybe_request_spare()
                return not self._spare

            self._wait(deadline, waiting,
                       lambda: BufferExhaustedError(f"Failed to allocate memory within the configured max "
                                                    f"blocking time {self.max_block_ms} ms."))
            return None
        request_id = self._request_blocks(count, contiguous=True)
        request = self._requests[request_id]
        try:
            self._wait(deadline, lambda: request.blocks is None and request.error is None,
                       lambda: BufferExhaustedError(f"Failed to allocate {count} consecutive blocks for a large "
                                                    f"record within {self.max_block_ms} ms."))
        except BufferExhaustedError:
            request.error = "abandoned"  # a late grant goes back to the daemon
            raise
        del self._requests[request_id]
        if request.error is not None:
            raise BufferExhaustedError(request.error)
        return request.blocks

    def _maybe_request_spare(self) -> None:
        # One grant request at a time: spare blocks are for the next few batches, not a hoard.
        if len(self._spare) <= _SPARE_LOW and not any(not r.contiguous for r in self._requests.values()):
            self._request_blocks(self._grant_size(), contiguous=False)

    def _grant_size(self) -> int:
        # A few blocks at a time, but never a large share of a small pool.
        block_count = self._welcome["block_count"] if self._welcome else _BLOCKS_PER_GRANT
        return max(1, min(_BLOCKS_PER_GRANT, block_count // 16))

    def _request_blocks(self, count: int, contiguous: bool) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        self._requests[request_id] = _BlockRequest(count, contiguous)
        self._post(ipc.BLOCKS, request_id, count, contiguous, self.max_block_ms)
        return request_id

    def _wait(self, deadline: float, waiting: Callable[[], bool], timeout_error: Callable[[], KafkaError]) -> None:
        """Wait on the condition while ``waiting()`` (lock held); raise ``timeout_error()`` at the deadline."""
        while waiting():
            self._check_session()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error()
            self._cond.wait(remaining)

    def _check_session(self) -> None:
        if self._session_error is not None:
            raise self._session_error

    def _wait_for_welcome(self, deadline: float) -> dict[str, Any]:
        if self._welcome is not None:
            return self._welcome
        with self._lock:
            self._wait(deadline, lambda: self._welcome is None,
                       lambda: SidecarUnavailableError(f"no kafka-sidecar daemon answered at {self.endpoint} "
                                                       f"within {self.max_block_ms} ms"))
            return self._welcome  # type: ignore[return-value]

    def _wait_for_topic(self, topic: str, deadline: float) -> _Topic:
        info = self._topics.get(topic)
        if info is not None and info.partition_count:
            return info
        with self._lock:
            if topic not in self._topics:
                self._topics[topic] = _Topic()
                self._post(ipc.METADATA, topic)
            info = self._topics[topic]

            def waiting() -> bool:
                if info.error is not None:
                    raise info.error
                return not info.partition_count

            self._wait(deadline, waiting, lambda: KafkaTimeoutError(
                f"Topic {topic} not present in metadata after {self.max_block_ms} ms."))
            return info

    # -- sealing ---------------------------------------------------------------------------------

    def _seal(self, batch: _Batch) -> None:
        """Hand a batch to the daemon (lock held)."""
        del self._open[(batch.topic, batch.partition)]
        self._partitioner.batch_sealed(batch.topic, batch.partition)
        batch.view.release()
        if not batch.futures:
            self._post(ipc.RELEASE, list(range(batch.first_block, batch.first_block + batch.block_count)))
            return
        self._sealed[batch.batch_id] = batch
        key = (batch.topic, batch.partition)
        self._unreported[key] = self._unreported.get(key, 0) + 1
        batch.sealed = time.monotonic()
        ago = int((batch.sealed - batch.created) * 1000)
        # Notices wait for the I/O thread, which sends all it finds in one SEAL message.
        self._seal_notices.append([batch.batch_id, batch.first_block, batch.block_count, batch.topic,
                                   batch.partition, len(batch.futures), batch.pos, batch.base_ts, batch.max_ts,
                                   ago])
        if len(self._seal_notices) == 1:
            self._wake()

    def _seal_all(self) -> None:
        for batch in list(self._open.values()):
            self._seal(batch)

    def _forget_sealed(self, batch: _Batch) -> None:
        """A sealed batch is reported in full, or given up on (lock held)."""
        del self._sealed[batch.batch_id]
        key = (batch.topic, batch.partition)
        left = self._unreported[key] - 1
        if left:
            self._unreported[key] = left
        else:
            del self._unreported[key]

    def _clear_sealed(self) -> None:
        self._sealed.clear()
        self._unreported.clear()

    def flush(self, timeout: float | None = None) -> int:
        """Seal everything and wait for the outcomes; returns how many records are still undelivered."""
        if self._pid != os.getpid():
            return 0  # nothing was sent from this process
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._seal_all()
            while self._outstanding and self._session_error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._outstanding

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then disconnect. Records not confirmed by then fail."""
        if self._closed:
            return
        if self._pid == os.getpid():
            self.flush(timeout)
            with self._lock:
                self._stopping = True
                self._queue_seal_notices()
                self._post(ipc.GOODBYE)
            if self._io_thread is not None:
                self._io_thread.join()
            self._fail_unconfirmed()
        self._closed = True
        _producers.discard(self)

    def _fail_unconfirmed(self) -> None:
        error = ProducerClosedError("the producer closed before the delivery of this record was confirmed")
        with self._lock:
            futures = [f for batch in self._sealed.values() for f in batch.futures if not f.done()]
            self._clear_sealed()
            self._outstanding = 0
        _complete_all([(future, None, error) for future in futures])

    # -- messages to the daemon ------------------------------------------------------------------

    def _post(self, *message: Any) -> None:
        """Queue a message for the I/O thread (lock held or not: deque appends are atomic)."""
        self._outbox.append(ipc.pack(*message))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\x00")  # type: ignore[union-attr]
        except (BlockingIOError, AttributeError):
            pass  # already woken (the pipe is full), or not started

    # -- the I/O thread --------------------------------------------------------------------------

    def _io_loop(self) -> None:
        assert self._context is not None and self._wake_r is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        # zmq.Poller reports a plain socket by its file descriptor, not as the object registered.
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        sock.send(ipc.pack(*self._hello()))
        next_heartbeat = time.monotonic() + 1.0
        try:
            while True:
                wake_at = min(self._seal_lingered(), next_heartbeat)
                while self._outbox:
                    sock.send(self._outbox.popleft())
                if self._stopping and not self._outbox:
                    break
                # In whole milliseconds, rounded up: rounding down would spin until the deadline.
                events = dict(poller.poll(max(math.ceil((wake_at - time.monotonic()) * 1000), 0)))
                if wake_fd in events:
                    _drain(self._wake_r)
                if sock in events:
                    self._receive_all(sock)
                if self._lost:
                    lost, self._lost = self._lost, []
                    _complete_all(lost)
                if time.monotonic() >= next_heartbeat:
                    sock.send(ipc.pack(ipc.HEARTBEAT))
                    self._expire_unreported()
                    interval = (self._welcome or {}).get("settings", {}).get("heartbeat_interval_ms", 1000)
                    next_heartbeat = time.monotonic() + interval / 1000
        finally:
            sock.close()
            self._context.term()
            self._release_segment()

    def _setting(self, given: int | None, name: str, default: int) -> int:
        if given is not None:
            return given
        return (self._welcome or {}).get("settings", {}).get(name, default)

    @property
    def linger_ms(self) -> int:
        """This producer's linger_ms, else the daemon's linger.ms."""
        return self._setting(self._linger_ms, "linger_ms", 5)

    @property
    def max_block_ms(self) -> int:
        """This producer's max_block_ms, else the daemon's max.block.ms (60000 until it has said)."""
        return self._setting(self._max_block_ms, "max_block_ms", 60000)

    def _expire_unreported(self) -> None:
        """Fail batches the daemon has not reported on long after its delivery.timeout.ms: it is gone."""
        settings = (self._welcome or {}).get("settings", {})
        limit = (settings.get("delivery_timeout_ms", 120_000) + _REPORT_GRACE_MS) / 1000
        now = time.monotonic()
        with self._lock:
            overdue = [b for b in self._sealed.values() if now - b.sealed > limit]
            for batch in overdue:
                self._forget_sealed(batch)
                self._outstanding -= len(batch.futures) - batch.reported
            self._cond.notify_all()
        if overdue:
            error = KafkaTimeoutError(f"no delivery report from the kafka-sidecar daemon at {self.endpoint} "
                                      f"{limit:.0f} s after sealing: is it running?")
            _complete_all([(f, None, error) for b in overdue for f in b.futures if not f.done()])

    def _seal_lingered(self) -> float:
        """Once a batch has waited linger_ms, seal it and every other open batch; returns when to look again.

        Sealing the younger batches too is what the Java producer does in effect (a
        ready node takes the first batch of each of its partitions, lingered or not),
        and it puts them all in one SEAL message, one wake-up of the I/O thread.
        Batches of partitions with _SEALED_PER_PARTITION batches awaiting reports
        stay open: a report wakes the I/O thread, which looks again then.
        """
        now = time.monotonic()
        with self._lock:
            unreported = self._unreported
            due = [b for key, b in self._open.items() if unreported.get(key, 0) < _SEALED_PER_PARTITION]
            oldest = min((b.created for b in due), default=None)
            if oldest is not None and oldest + self._linger_s <= now:
                for batch in due:
                    self._seal(batch)
                oldest = None
            next_due = now + 1.0 if oldest is None else oldest + self._linger_s
            self._io_wakes_at = next_due
            self._queue_seal_notices()
        return next_due

    def _queue_seal_notices(self) -> None:
        """Move the waiting seal notices to the outbox as one SEAL message (lock held)."""
        if self._seal_notices:
            self._outbox.append(ipc.pack(ipc.SEAL, self._seal_notices))
            self._seal_notices = []

    def _receive_all(self, sock: zmq.Socket) -> None:
        # Asking for the events is cheaper than raising zmq.Again at the end of every batch.
        while sock.getsockopt(_EVENTS) & _POLLIN:
            data = sock.recv(_NOBLOCK)
            try:
                message = ipc.unpack(data)
                self._handle(message)
            except Exception:
                log.exception("cannot handle a message from the daemon")

    def _handle(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == ipc.DELIVERY:
            self._deliver(message[1])
            return
        with self._lock:
            if kind == ipc.GRANT:
                _, request_id, blocks = message
                request = self._requests.get(request_id)
                if request is not None and request.contiguous:
                    if request.error is not None:
                        self._post(ipc.RELEASE, blocks)
                        del self._requests[request_id]
                    else:
                        request.blocks = blocks
                else:
                    self._requests.pop(request_id, None)
                    self._spare.extend(blocks)
            elif kind == ipc.GRANT_FAILED:
                _, request_id, reason = message
                request = self._requests.pop(request_id, None)
                if request is not None and request.contiguous:
                    request.error = reason
                    self._requests[request_id] = request
            elif kind == ipc.TOPIC:
                _, topic, count, available, error = message
                info = self._topics.setdefault(topic, _Topic())
                info.partition_count = count
                info.available = tuple(available)
                info.error = ipc.error_from_wire(error)
            elif kind == ipc.WELCOME:
                self._welcomed(message)
            elif kind == ipc.SEAL_NOW:
                self._seal_all()
                if self._spare:
                    self._post(ipc.RELEASE, self._spare)
                    self._spare = []
            elif kind == ipc.ERROR:
                self._refused(message[1], message[2])
            self._cond.notify_all()

    def _welcomed(self, message: list[Any]) -> None:
        _, version, client_id, segment, block_size, block_count, settings, daemon_id = message
        if self._welcome is not None:
            self._forget_session()
        self._segment = Segment(segment)
        self._welcome = {"client_id": client_id, "block_size": block_size, "block_count": block_count,
                         "settings": settings, "daemon_id": daemon_id}
        self._hello_sent = False
        self._linger_s = self.linger_ms / 1000
        log.debug("connected to kafka-sidecar at %s as client %s", self.endpoint, client_id)

    def _refused(self, code: str, text: str) -> None:
        if self._welcome is None:
            # Refused before the welcome: the handshake itself (e.g. a version mismatch).
            log.error("the kafka-sidecar daemon refused the handshake: %s", text)
            self._session_error = SidecarUnavailableError(f"kafka-sidecar at {self.endpoint}: {text}")
        elif code == ipc.ERROR_UNKNOWN_CLIENT:
            # The daemon restarted, or ended the session (it took this process for dead): start again.
            if not self._hello_sent:
                log.warning("the kafka-sidecar daemon does not know this client any more: connecting again")
                self._hello_sent = True
                self._post(*self._hello())
        else:
            log.error("the kafka-sidecar daemon refused a message: %s", text)

    def _forget_session(self) -> None:
        """A new session (lock held): what the old one held is gone, and its records' fate unknown."""
        error = SidecarUnavailableError("the kafka-sidecar daemon lost this client's session (it restarted, or "
                                        "took the client for dead): the delivery of this record is unknown")
        lost = [f for batch in [*self._open.values(), *self._sealed.values()] for f in batch.futures
                if not f.done()]
        for batch in self._open.values():
            batch.view.release()
        self._open.clear()
        self._clear_sealed()
        self._spare.clear()
        self._requests.clear()
        self._outstanding -= len(lost)
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        if lost:
            log.error("%d record(s) handed to the lost session are failed as unknown", len(lost))
            # Completed on the I/O thread after the lock is released, as deliveries are.
            self._lost = [(f, None, error) for f in lost]

    def _hello(self) -> tuple[Any, ...]:
        return (ipc.HELLO, ipc.PROTOCOL_VERSION, os.getpid(), self._client_name,
                {"linger_ms": self.linger_ms, "partitioner": self._partitioner_name,
                 "process": ipc.process_identity(os.getpid())})

    def _deliver(self, reports: list[list[Any]]) -> None:
        # Only the bookkeeping holds the lock: send() must not wait while futures complete.
        outcomes = []
        with self._lock:
            for batch_id, first, count, base_offset, log_append_time, error_wire in reports:
                batch = self._sealed.get(batch_id)
                if batch is None:
                    continue
                futures = batch.futures[first:first + count]
                batch.reported += len(futures)
                if batch.reported >= len(batch.futures):
                    self._forget_sealed(batch)
                self._outstanding -= len(futures)
                outcomes.append((batch.topic, batch.partition, futures, base_offset, first, log_append_time,
                                 error_wire))
            self._cond.notify_all()
        done: list[tuple[RecordFuture, RecordMetadata | None, KafkaError | None]] = []
        for topic, partition, futures, base_offset, first, log_append_time, error_wire in outcomes:
            error = ipc.error_from_wire(error_wire)
            if error is not None:
                done += [(future, None, error) for future in futures]
                continue
            offset = base_offset + first if base_offset >= 0 else -1
            step = 1 if base_offset >= 0 else 0
            for future in futures:
                # RecordMetadata(...) without the NamedTuple's Python-level __new__: once per record.
                done.append((future, _new_tuple(RecordMetadata, (
                    topic, partition, offset, log_append_time if log_append_time >= 0 else future.timestamp_ms,
                    future.key_size, future.value_size)), None))
                offset += step
        _complete_all(done)

    def _release_segment(self) -> None:
        with self._lock:
            for batch in self._open.values():
                batch.view.release()
            self._open.clear()
            if self._segment is not None:
                self._segment.close()
                self._segment = None


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass


def _headers(headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None) -> list[Header]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[Header] = []
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise TypeError("headers are (name, value) pairs or a dict") from None
        if not isinstance(name, str):
            raise TypeError(f"a header name must be a str, got {type(name).__name__}")
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif value is not None and not isinstance(value, bytes):
            if not isinstance(value, (bytearray, memoryview)):
                raise TypeError(f"header {name!r}: a value must be bytes, str or None, got {type(value).__name__}")
            value = bytes(value)
        out.append((name.encode("utf-8"), value))
    return out
