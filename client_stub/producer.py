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
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import zmq

from . import ipc
from .errors import BufferExhaustedError, KafkaError, KafkaTimeoutError, RecordTooLargeError, SidecarUnavailableError
from .partitioner import Partitioner
from .records import Header, encode_record_into, record_size
from .shm import Segment

log = logging.getLogger(__name__)

# Spare blocks kept at hand so that opening a batch needs no round trip.
_SPARE_LOW = 2
_BLOCKS_PER_GRANT = 4
# The batch header the daemon writes around a block's records (counted against max.request.size).
_BATCH_OVERHEAD = 61

Serializer = Callable[[Any], "bytes | None"]
DeliveryCallback = Callable[["KafkaError | None", "RecordMetadata | None"], None]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record landed."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    serialized_key_size: int
    serialized_value_size: int


class _Pending:
    """One record handed off and not yet reported."""

    __slots__ = ("future", "on_delivery", "timestamp_ms", "key_size", "value_size")

    def __init__(self, future: Future, on_delivery: DeliveryCallback | None, timestamp_ms: int,
                 key_size: int, value_size: int) -> None:
        self.future = future
        self.on_delivery = on_delivery
        self.timestamp_ms = timestamp_ms
        self.key_size = key_size
        self.value_size = value_size


class _Batch:
    """A batch being written into this process's blocks, then sealed and awaiting its report."""

    __slots__ = ("batch_id", "topic", "partition", "first_block", "block_count", "view", "pos", "base_ts",
                 "max_ts", "created", "pending", "reported")

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
        self.pending: list[_Pending] = []
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
        self._topics: dict[str, _Topic] = {}
        self._requests: dict[int, _BlockRequest] = {}
        self._outbox: deque[bytes] = deque()
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
            raise KafkaError("the producer is closed")
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
        self._ensure_started()
        ipc.check_topic(topic)
        key_bytes = self._serialize(key, self._key_serializer, "key")
        value_bytes = self._serialize(value, self._value_serializer, "value")
        header_list = _headers(headers)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool) or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative integer, got {timestamp_ms!r}")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool)
                                      or partition < 0):
            raise ValueError(f"partition must be a non-negative integer, got {partition!r}")
        deadline = time.monotonic() + self.max_block_ms / 1000
        welcome = self._wait_for_welcome(deadline)
        size = record_size(0, 0, key_bytes, value_bytes, header_list)
        limit = welcome["settings"]["max_request_size"]
        if size + _BATCH_OVERHEAD > limit:
            raise RecordTooLargeError(
                f"The message is {size + _BATCH_OVERHEAD} bytes when serialized which is larger than {limit}, "
                "which is the value of the max.request.size configuration.")
        info = self._wait_for_topic(topic, deadline)
        if partition is not None and partition >= info.partition_count:
            raise ValueError(f"partition {partition} of topic {topic} does not exist: it has "
                             f"{info.partition_count} partitions (0-{info.partition_count - 1})")
        future: Future = Future()
        future.set_running_or_notify_cancel()
        pending = _Pending(future, on_delivery, timestamp_ms, -1 if key_bytes is None else len(key_bytes),
                           -1 if value_bytes is None else len(value_bytes))
        self._append(topic, partition, key_bytes, value_bytes, header_list, pending, info, deadline)
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
                headers: list[Header], pending: _Pending, info: _Topic, deadline: float) -> None:
        block_size = self._welcome["block_size"]  # type: ignore[index]
        with self._lock:
            while True:
                self._check_session()
                partition = explicit
                if partition is None:
                    partition = self._partitioner.partition(topic, key, info.partition_count,  # type: ignore[arg-type]
                                                            info.available)
                batch = self._open.get((topic, partition))
                if batch is not None:
                    size = record_size(len(batch.pending), pending.timestamp_ms - batch.base_ts, key, value, headers)
                    if batch.pos + size <= len(batch.view):
                        self._write(batch, size, key, value, headers, pending)
                        return
                    self._seal(batch)
                    continue
                size = record_size(0, 0, key, value, headers)
                count = -(-size // block_size)
                blocks = self._take_blocks(count, deadline)
                if blocks is None:
                    continue  # the lock was released while waiting: look again
                batch = self._open_batch(topic, partition, blocks, pending.timestamp_ms)
                self._write(batch, size, key, value, headers, pending)
                return

    def _write(self, batch: _Batch, size: int, key: bytes | None, value: bytes | None, headers: list[Header],
               pending: _Pending) -> None:
        batch.pos = encode_record_into(batch.view, batch.pos, len(batch.pending),
                                       pending.timestamp_ms - batch.base_ts, key, value, headers)
        batch.pending.append(pending)
        if pending.timestamp_ms > batch.max_ts:
            batch.max_ts = pending.timestamp_ms
        self._outstanding += 1
        # Full, or nearly: the next record like this one would not fit.
        if len(batch.view) - batch.pos < size:
            self._seal(batch)

    def _open_batch(self, topic: str, partition: int, blocks: list[int], timestamp_ms: int) -> _Batch:
        assert self._segment is not None
        view = self._segment.blocks(blocks[0], len(blocks))
        batch = _Batch(self._next_batch_id, topic, partition, blocks[0], len(blocks), view, timestamp_ms)
        self._next_batch_id += 1
        self._open[(topic, partition)] = batch
        self._wake()  # the I/O thread's linger timer must know of the new batch
        return batch

    def _take_blocks(self, count: int, deadline: float) -> list[int] | None:
        """``count`` blocks (contiguous if more than one), or None after waiting (lock released)."""
        if count == 1 and self._spare:
            blocks = [self._spare.pop()]
            if len(self._spare) < _SPARE_LOW:
                self._request_blocks(_BLOCKS_PER_GRANT, contiguous=False)
            return blocks
        if count == 1:
            if not any(not r.contiguous for r in self._requests.values()):
                self._request_blocks(_BLOCKS_PER_GRANT, contiguous=False)
            self._wait(deadline, lambda: not self._spare,
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
        if not batch.pending:
            self._post(ipc.RELEASE, list(range(batch.first_block, batch.first_block + batch.block_count)))
            return
        self._sealed[batch.batch_id] = batch
        ago = int((time.monotonic() - batch.created) * 1000)
        self._post(ipc.SEAL, [[batch.batch_id, batch.first_block, batch.block_count, batch.topic, batch.partition,
                               len(batch.pending), batch.pos, batch.base_ts, batch.max_ts, ago]])

    def _seal_all(self) -> None:
        for batch in list(self._open.values()):
            self._seal(batch)

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
                self._post(ipc.GOODBYE)
            if self._io_thread is not None:
                self._io_thread.join()
            self._fail_unconfirmed()
        self._closed = True
        _producers.discard(self)

    def _fail_unconfirmed(self) -> None:
        error = KafkaTimeoutError("the producer closed before the delivery of this record was confirmed")
        with self._lock:
            pending = [p for batch in self._sealed.values() for p in batch.pending if not p.future.done()]
            self._sealed.clear()
            self._outstanding = 0
        for p in pending:
            p.future.set_exception(error)
            if p.on_delivery is not None:
                try:
                    p.on_delivery(error, None)
                except Exception:
                    log.exception("error in an on_delivery callback")

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
        poller.register(self._wake_r, zmq.POLLIN)
        sock.send(ipc.pack(ipc.HELLO, ipc.PROTOCOL_VERSION, os.getpid(), self._client_name,
                           {"linger_ms": self.linger_ms, "partitioner": self._partitioner_name,
                            "process": ipc.process_identity(os.getpid())}))
        next_heartbeat = time.monotonic() + 1.0
        try:
            while True:
                timeout = self._next_linger_deadline() - time.monotonic()
                events = dict(poller.poll(max(min(timeout, next_heartbeat - time.monotonic()), 0) * 1000))
                if self._wake_r in events:
                    _drain(self._wake_r)
                if sock in events:
                    self._receive_all(sock)
                self._seal_lingered()
                while self._outbox:
                    sock.send(self._outbox.popleft())
                if time.monotonic() >= next_heartbeat:
                    sock.send(ipc.pack(ipc.HEARTBEAT))
                    interval = (self._welcome or {}).get("settings", {}).get("heartbeat_interval_ms", 1000)
                    next_heartbeat = time.monotonic() + interval / 1000
                if self._stopping and not self._outbox:
                    break
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

    def _linger_s(self) -> float:
        return self.linger_ms / 1000

    def _next_linger_deadline(self) -> float:
        with self._lock:
            oldest = min((b.created for b in self._open.values()), default=None)
        return time.monotonic() + 1.0 if oldest is None else oldest + self._linger_s()

    def _seal_lingered(self) -> None:
        now = time.monotonic()
        limit = self._linger_s()
        with self._lock:
            for batch in list(self._open.values()):
                if now - batch.created >= limit:
                    self._seal(batch)

    def _receive_all(self, sock: zmq.Socket) -> None:
        while True:
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
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
                self._refused(message[1])
            self._cond.notify_all()

    def _welcomed(self, message: list[Any]) -> None:
        _, version, client_id, segment, block_size, block_count, settings, daemon_id = message
        self._segment = Segment(segment)
        self._welcome = {"client_id": client_id, "block_size": block_size, "block_count": block_count,
                         "settings": settings, "daemon_id": daemon_id}
        log.debug("connected to kafka-sidecar at %s as client %s", self.endpoint, client_id)

    def _refused(self, text: str) -> None:
        log.error("the kafka-sidecar daemon refused a message: %s", text)
        if self._welcome is None:
            # Refused before the welcome: the handshake itself (e.g. a version mismatch).
            self._session_error = SidecarUnavailableError(f"kafka-sidecar at {self.endpoint}: {text}")

    def _deliver(self, reports: list[list[Any]]) -> None:
        done: list[tuple[_Pending, KafkaError | None, RecordMetadata | None]] = []
        with self._lock:
            for batch_id, first, count, base_offset, log_append_time, error_wire in reports:
                batch = self._sealed.get(batch_id)
                if batch is None:
                    continue
                error = ipc.error_from_wire(error_wire)
                for i, pending in enumerate(batch.pending[first:first + count], start=first):
                    if error is not None:
                        done.append((pending, error, None))
                        continue
                    metadata = RecordMetadata(
                        batch.topic, batch.partition, base_offset + i if base_offset >= 0 else -1,
                        log_append_time if log_append_time >= 0 else pending.timestamp_ms,
                        pending.key_size, pending.value_size)
                    done.append((pending, None, metadata))
                batch.reported += min(count, len(batch.pending) - first)
                if batch.reported >= len(batch.pending):
                    del self._sealed[batch_id]
            self._outstanding -= len(done)
            self._cond.notify_all()
        for pending, error, metadata in done:
            if error is None:
                pending.future.set_result(metadata)
            else:
                pending.future.set_exception(error)
            if pending.on_delivery is not None:
                try:
                    pending.on_delivery(error, metadata)
                except Exception:
                    log.exception("error in an on_delivery callback")

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
