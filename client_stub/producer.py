"""Producer: what applications use to send records through the node's kafka-sidecar daemon.

``send()`` serializes and partitions a record and writes it, in Kafka's v2
record format, straight into this process's open block of shared memory for the
partition; no message to the daemon is needed for that. A block is sealed when
full, when linger_ms has passed, on flush() and close(), and when the daemon
asks; the seal notice hands the batch to the daemon, which sends it and reports
its outcome back; the I/O thread then completes each record's Future.

The per-record work is in C (client_stub._fastpath): the common case of send()
(a known topic, bytes keys and values, a batch with room) and the completion of
the futures. Everything else, and all the logic around batches, is here.

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
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import RUNNING
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from .contract import PROTOCOL_VERSION, ipc
from ._fastpath import Appender, Completer, OpenBatch
from .errors import (
    BufferExhaustedError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SidecarUnavailableError,
)
from .partitioner import Partitioner
from .contract.records import BATCH_HEADER_SIZE, Header, record_size
from .contract.shared_memory import Segment

log = logging.getLogger(__name__)

# Spare blocks kept at hand so that opening a batch needs no round trip: a grant is what this process
# used in the last _GRANT_HORIZON_S (at least _MIN_GRANT, at most 1/_MAX_GRANT_SHARE of the pool), and
# the next one is asked for when half is left. A spare block is memory that nobody else can use, and
# once written, shared memory that stays resident: no more than the process needs.
_MIN_GRANT = 4
_GRANT_HORIZON_S = 0.025
_MAX_GRANT_SHARE = 16
# A batch not reported this long after the daemon's delivery.timeout.ms is given up on.
_REPORT_GRACE_MS = 30_000
# pyzmq's flags are enum.Flag members, whose & runs Python code: plain ints for the per-message calls.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_HEARTBEAT = ipc.encode(ipc.Heartbeat())
# Reports are slow when they take this many linger_ms (smoothed, or the oldest awaited one so far).
# The daemon or the broker is then behind, and a partition's open batch is not sealed at linger_ms
# while its previous sealed batch awaits its report: it keeps filling until full (or flush), as a
# Java batch that is ready but not yet drained does. Without that, many clients each sealing a batch
# every linger_ms queue more batches per partition than the daemon can send (one per partition per
# request), and the queue only grows. While reports come back quickly, holding a batch would only
# add the previous one's round trip to the latency of its records.
_SLOW_REPORT_LINGERS = 2

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


# Guards the first use of a RecordFuture's Condition against its completion.
_CONDITION_LOCK = threading.Lock()


class RecordFuture(Future):
    """The Future of one record, with what its RecordMetadata needs.

    A plain Future makes a threading.Condition and two lists when created: most of
    the cost of a send(), and memory held while the record is in flight. Most record
    futures are never waited on one by one (flush() waits for all of them), so this
    one keeps its state in slots and makes the Condition and lists on first use; a
    future that nobody waits on or watches is completed in place, without them.
    Both paths hold _CONDITION_LOCK, so a waiter arriving during completion either
    finds the Condition to be notified on or the result already set. Record futures
    cannot be cancelled: the record is handed off.

    The C fast path of send() makes these without running ``__init__`` (object.__new__,
    then the slots that ``__init__`` sets), and completes them in their slots.
    """

    __slots__ = ("on_delivery", "timestamp_ms", "key_size", "value_size", "_state", "_result", "_exception",
                 "_cond", "_waiter_list", "_callback_list")

    def __init__(self, on_delivery: DeliveryCallback | None, timestamp_ms: int, key_size: int,
                 value_size: int) -> None:
        # Future.__init__ is skipped on purpose: see the class docstring.
        self.on_delivery = on_delivery
        self.timestamp_ms = timestamp_ms
        self.key_size = key_size
        self.value_size = value_size
        self._state = RUNNING
        self._result: RecordMetadata | None = None
        self._exception: BaseException | None = None
        self._cond: threading.Condition | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _CONDITION_LOCK:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    @property
    def _waiters(self) -> list:  # type: ignore[override]
        try:
            return self._waiter_list
        except AttributeError:
            self._waiter_list: list = []
            return self._waiter_list

    @property
    def _done_callbacks(self) -> list:  # type: ignore[override]
        try:
            return self._callback_list
        except AttributeError:
            self._callback_list: list = []
            return self._callback_list

    def _notify(self, result: RecordMetadata | None, error: KafkaError | None) -> None:
        """Complete a watched future (its Condition exists), then run its callback."""
        try:
            if error is None:
                self.set_result(result)
            else:
                self.set_exception(error)
        except InvalidStateError:
            return  # completed already: a record completes once
        if self.on_delivery is not None:
            try:
                self.on_delivery(error, result)
            except Exception as exc:
                _callback_failed(exc)


def _callback_failed(exc: BaseException) -> None:
    log.error("error in an on_delivery callback", exc_info=exc)


# Completes record futures from delivery reports (the I/O thread), in C.
_completer = Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)


def _fail(futures: list[RecordFuture], error: KafkaError) -> None:
    """Complete ``futures`` with ``error`` (those still pending), and run their callbacks."""
    _completer.complete(futures, 0, len(futures), "", -1, -1, -1, error)


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
    # The parent's I/O thread may have held the lock at the fork: in the child nobody will release it.
    _CONDITION_LOCK._at_fork_reinit()  # type: ignore[attr-defined]
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
        # A new random source per process: forked workers must not all pick the same sticky partitions.
        self._partitioner = Partitioner(self._partitioner_name)
        # (topic, partition) -> the open batch; the C fast path appends to them, and only reads the dict.
        self._open: dict[tuple[str, int], OpenBatch] = {}
        # topic -> partition count, for the topics the fast path may take (read there only).
        self._partition_counts: dict[str, int] = {}
        self._appender = Appender(self._lock, self._open, self._partition_counts, RecordFuture, self._seal_filled,
                                  self._send, None if self._partitioner_name == "random" else self._partitioner.sticky,
                                  self._partitioner_name == "murmur2_random")
        # send() is the Appender's, in C: no Python frame per record (Producer.send documents it).
        self.send = self._appender.send
        self._welcome: ipc.Welcome | None = None
        self._session_error: KafkaError | None = None
        self._segment: Segment | None = None
        self._spare: list[int] = []
        self._grant = _MIN_GRANT
        self._blocks_taken = 0  # since the last grant request
        self._grant_asked = 0.0  # time.monotonic() of the last grant request
        self._spare_requested = False
        self._sealed: dict[int, OpenBatch] = {}
        # Per (topic, partition): how many of the sealed batches await their reports.
        self._unreported: dict[tuple[str, int], int] = {}
        # Seal to report, smoothed; and whether reports were slow when the I/O thread last looked.
        self._report_time_s = 0.0
        self._holding = False
        self._topics: dict[str, _Topic] = {}
        self._requests: dict[int, _BlockRequest] = {}
        self._outbox: deque[bytes] = deque()
        self._seal_notices: list[ipc.SealNotice] = []
        self._hello_sent = False
        self._closing = False
        self._linger_s = (self._linger_ms if self._linger_ms is not None else 5) / 1000
        self._io_wakes_at = 0.0
        self._lost: list[RecordFuture] = []
        self._lost_error: KafkaError | None = None
        self._next_batch_id = 1
        self._next_request_id = 1
        self._io_thread: threading.Thread | None = None
        self._stopping = False
        self._context: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._wake_pending = False
        self._io_ident: int | None = None

    def _forget_parent(self) -> None:
        # In a forked child: the parent's sockets, threads, blocks and records are the
        # parent's. Drop them without closing anything the parent still uses.
        self._abandoned = (self._context, self._sock, self._wake_r, self._wake_w, self._segment, self._appender,
                           self._sealed)
        self._init_state()
        self._pid = -1

    def _ensure_started(self) -> None:
        """Start the I/O thread in this process (again after a fork)."""
        if self._closed or self._closing:
            raise ProducerClosedError("Cannot send after the producer is closed.")
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._pid > 0:
                # Forked without the at-fork hooks (a C extension's fork): start afresh all the same.
                self._forget_parent()
            self._context, self._sock = self._connect()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._stopping = False
            self._io_thread = threading.Thread(target=self._io_loop, name="kafka-sidecar-io", daemon=True)
            self._pid = os.getpid()
            self._io_thread.start()

    def _connect(self) -> tuple[zmq.Context, zmq.Socket]:
        """A context of this process and its socket to the daemon (which the I/O thread then uses alone).

        Made here, not on the I/O thread: what ZeroMQ allocates for the socket (its pipes, ~50 KB)
        then comes from the process's main malloc arena, which has room, rather than from a new arena
        of the I/O thread's, pages that stay resident in every client process.
        """
        context = zmq.Context()
        # One socket is all it holds: the default of 1023 would size the context's socket tables
        # (~12 KB) for a thousand.
        context.set(zmq.MAX_SOCKETS, 8)
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            context.term()
            raise ValueError(f"cannot connect to the kafka-sidecar endpoint {self.endpoint!r}: {exc}") from None
        return context, sock

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records handed off and not yet reported."""
        return self._appender.outstanding

    # -- send ------------------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None = None,
             on_delivery: DeliveryCallback | None = None) -> Future:
        """Hand a record over; the Future's result is its RecordMetadata.

        Blocks up to max_block_ms for the daemon's welcome, the topic's metadata
        and free memory, then raises SidecarUnavailableError, KafkaTimeoutError or
        BufferExhaustedError. RecordTooLargeError if the record exceeds max.request.size.
        """
        # Instances call the Appender's send() directly (see _init_state); it appends the common case in
        # C and hands the rest to _send.
        return self._appender.send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms,
                                   headers=headers, on_delivery=on_delivery)

    def _send(self, topic: str, value: Any, key: Any, partition: int | None, timestamp_ms: int | None,
              headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None,
              on_delivery: DeliveryCallback | None) -> RecordFuture:
        """send() in full: checks, serializers, headers, the first send to a topic, new batches."""
        if self._pid != os.getpid() or self._closed or self._closing:
            self._ensure_started()
        if self._key_serializer is not None or (key is not None and type(key) is not bytes):
            key = self._serialize(key, self._key_serializer, "key")
        if self._value_serializer is not None or (value is not None and type(value) is not bytes):
            value = self._serialize(value, self._value_serializer, "value")
        header_list = _headers(headers) if headers else ()
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or not 0 <= timestamp_ms < 2**63:
            # Checked before any block is taken for the record: Kafka's timestamps are int64.
            raise ValueError(f"timestamp_ms must be an integer from 0 to 2**63-1, got {timestamp_ms!r}")
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
                self._check_open()
                self._check_session()
                partition = explicit
                if partition is None:
                    partition = self._partitioner.partition(topic, key, info.partition_count,  # type: ignore[arg-type]
                                                            info.available)
                batch = self._open.get((topic, partition))
                if batch is None:
                    batch = self._new_batch(topic, partition, key, value, headers, timestamp, deadline)
                    if batch is None:
                        continue  # the lock was released while waiting for blocks: look again
                before = batch.pos
                if not batch.append(key, value, headers, timestamp, future):
                    if not batch.record_count:
                        raise RecordTooLargeError("the record does not fit in the blocks taken for it")
                    self._seal(batch)
                    continue
                self._appender.count_appended()
                # Full, or nearly: the next record like this one would not fit.
                if batch.capacity - batch.pos < batch.pos - before:
                    self._seal(batch)
                return

    def _new_batch(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header], timestamp_ms: int, deadline: float) -> OpenBatch | None:
        """A batch on fresh blocks for the record; None if the lock was released to wait."""
        if not deadline:
            deadline = time.monotonic() + self.max_block_ms / 1000
        if self._welcome is None:
            # The session was lost, and a new one is on its way.
            self._wait(deadline, lambda: self._welcome is None, self._unavailable)
            return None
        welcome = self._welcome
        size = record_size(0, 0, key, value, headers)
        limit = welcome.settings.max_request_size
        if size + BATCH_HEADER_SIZE > limit:
            raise RecordTooLargeError(
                f"The message is {size + BATCH_HEADER_SIZE} bytes when serialized which is larger than {limit}, "
                "which is the value of the max.request.size configuration.")
        count = -(-size // welcome.block_size)
        if count > welcome.block_count:
            buffer_memory = welcome.settings.buffer_memory
            raise RecordTooLargeError(
                f"The message is {size} bytes when serialized which is larger than the total memory buffer you "
                f"have configured with the buffer.memory configuration ({buffer_memory}).")
        blocks = self._take_blocks(count, deadline)
        if blocks is None:
            return None
        return self._open_batch(topic, partition, blocks, timestamp_ms)

    def _open_batch(self, topic: str, partition: int, blocks: list[int], timestamp_ms: int) -> OpenBatch:
        assert self._segment is not None
        key = (topic, partition)
        opened = self._open.get(key)
        if opened is not None:
            # Another thread opened one while this one waited for its blocks: it goes first.
            self._seal(opened)
        batch = OpenBatch(self._next_batch_id, topic, partition, blocks[0], len(blocks),
                          self._segment.blocks(blocks[0], len(blocks)), timestamp_ms, time.monotonic())
        self._next_batch_id += 1
        self._open[key] = batch
        if (self._linger_deadline(batch.created) < self._io_wakes_at
                and not (self._holding and key in self._unreported)):
            self._wake()  # the I/O thread must wake sooner than it planned, for this batch's linger
        return batch

    def _take_blocks(self, count: int, deadline: float) -> list[int] | None:
        """``count`` blocks (contiguous if more than one), or None after waiting (lock released)."""
        if count == 1:
            if self._spare:
                block = self._spare.pop()
                self._blocks_taken += 1
                self._maybe_request_spare()  # the next blocks are asked for before they are needed
                return [block]
            self._maybe_request_spare()

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
        failed = f"Failed to allocate {count} consecutive blocks for a large record within {self.max_block_ms} ms"
        try:
            self._wait(deadline, lambda: request.blocks is None and request.error is None,
                       lambda: BufferExhaustedError(failed + "."))
        except KafkaError:
            request.error = "abandoned"  # a late grant goes back to the daemon
            raise
        del self._requests[request_id]
        if request.error is not None:
            # The daemon waits max.block.ms too, and its refusal may come first: the same error either way.
            raise BufferExhaustedError(f"{failed}: {request.error}")
        return request.blocks

    def _maybe_request_spare(self) -> None:
        # One grant request at a time: spare blocks are for the next few batches, not a hoard.
        if self._spare_requested or len(self._spare) > self._grant // 2:
            return
        now = time.monotonic()
        if self._grant_asked:
            rate = self._blocks_taken / max(now - self._grant_asked, 0.001)
            self._grant = min(max(math.ceil(rate * _GRANT_HORIZON_S), _MIN_GRANT), self._max_grant())
        self._blocks_taken = 0
        self._grant_asked = now
        self._spare_requested = True
        self._request_blocks(self._grant, contiguous=False)

    def _max_grant(self) -> int:
        # Never a large share of a small pool.
        block_count = self._welcome.block_count if self._welcome else _MIN_GRANT
        return max(1, block_count // _MAX_GRANT_SHARE)

    def _request_blocks(self, count: int, contiguous: bool) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        self._requests[request_id] = _BlockRequest(count, contiguous)
        self._post(ipc.Blocks(request_id, count, contiguous, self.max_block_ms))
        return request_id

    def _wait(self, deadline: float, waiting: Callable[[], bool], timeout_error: Callable[[], KafkaError]) -> None:
        """Wait on the condition while ``waiting()`` (lock held); raise ``timeout_error()`` at the deadline."""
        while waiting():
            self._check_session()
            self._check_open()
            self._check_not_io_thread("send() would have to wait")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error()
            self._cond.wait(remaining)

    def _check_session(self) -> None:
        if self._session_error is not None:
            raise self._session_error

    def _check_open(self) -> None:
        if self._closing:
            raise ProducerClosedError("Cannot send after the producer is closed.")

    def _check_not_io_thread(self, what: str) -> None:
        # Callbacks run on the I/O thread: waiting there for what only the I/O thread brings never ends.
        if threading.current_thread() is self._io_thread:
            raise KafkaError(f"{what} in an on_delivery callback, on the producer's I/O thread, which delivers "
                             "what it would wait for: hand the work to another thread")

    def _wait_for_welcome(self, deadline: float) -> ipc.Welcome:
        if self._welcome is not None:
            return self._welcome
        with self._lock:
            self._wait(deadline, lambda: self._welcome is None, self._unavailable)
            return self._welcome  # type: ignore[return-value]

    def _unavailable(self) -> SidecarUnavailableError:
        return SidecarUnavailableError(f"no kafka-sidecar daemon answered at {self.endpoint} "
                                       f"within {self.max_block_ms} ms")

    def _wait_for_topic(self, topic: str, deadline: float) -> _Topic:
        info = self._topics.get(topic)
        if info is not None and info.partition_count:
            return info
        with self._lock:
            if topic not in self._topics:
                self._topics[topic] = _Topic()
                self._post(ipc.Metadata(topic))
            info = self._topics[topic]

            def waiting() -> bool:
                if info.error is not None and not info.error.retriable:
                    raise info.error
                return not info.partition_count

            def timed_out() -> KafkaTimeoutError:
                cause = f" (the cluster answers {info.error.name})" if info.error is not None else ""
                return KafkaTimeoutError(f"Topic {topic} not present in metadata after {self.max_block_ms} ms{cause}.")

            self._wait(deadline, waiting, timed_out)
            return info

    # -- sealing ---------------------------------------------------------------------------------

    def _seal_filled(self, batch: OpenBatch) -> None:
        """Seal a batch the C fast path filled (lock held), unless another thread sealed it meanwhile."""
        if self._open.get((batch.topic, batch.partition)) is batch:
            self._seal(batch)

    def _seal(self, batch: OpenBatch) -> None:
        """Hand a batch to the daemon (lock held)."""
        key = (batch.topic, batch.partition)
        del self._open[key]
        self._partitioner.batch_sealed(batch.topic, batch.partition)
        batch.release()
        if not batch.record_count:
            self._post(ipc.Release(list(range(batch.first_block, batch.first_block + batch.block_count))))
            return
        self._sealed[batch.batch_id] = batch
        self._unreported[key] = self._unreported.get(key, 0) + 1
        batch.sealed = time.monotonic()
        ago = int((batch.sealed - batch.created) * 1000)
        # Notices wait for the I/O thread, which sends all it finds in one SEAL message.
        self._seal_notices.append(ipc.SealNotice(batch.batch_id, batch.first_block, batch.block_count, batch.topic,
                                                 batch.partition, batch.record_count, batch.pos,
                                                 batch.base_timestamp, batch.max_timestamp, ago))
        if len(self._seal_notices) == 1:
            self._wake()

    def _seal_all(self) -> None:
        for batch in list(self._open.values()):
            self._seal(batch)

    def _forget_sealed(self, batch: OpenBatch) -> None:
        """A sealed batch is reported in full, or given up on (lock held)."""
        del self._sealed[batch.batch_id]
        key = (batch.topic, batch.partition)
        left = self._unreported[key] - 1
        if left:
            self._unreported[key] = left
        else:
            del self._unreported[key]

    def _drop_sealed(self) -> None:
        """Forget every sealed batch and count no record outstanding (lock held; the caller fails them)."""
        self._sealed.clear()
        self._unreported.clear()

    def flush(self, timeout: float | None = None) -> int:
        """Seal everything and wait for the outcomes; returns how many records are still undelivered."""
        if self._pid != os.getpid():
            return 0  # nothing was sent from this process
        self._check_not_io_thread("flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._seal_all()
            while self._appender.outstanding and self._session_error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._appender.outstanding

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then disconnect. Records not confirmed by then fail."""
        if self._closed:
            return
        if self._pid == os.getpid():
            self._check_not_io_thread("close()")
            with self._lock:
                # From now on send() refuses: what flush() seals is all there is.
                self._closing = True
                self._appender.disable()
            self.flush(timeout)
            with self._lock:
                self._stopping = True
                self._queue_seal_notices()
                self._post(ipc.Goodbye())
            if self._io_thread is not None:
                self._io_thread.join()
            self._fail_unconfirmed()
        self._closed = True
        _producers.discard(self)

    def _fail_unconfirmed(self) -> None:
        error = ProducerClosedError("the producer closed before the delivery of this record was confirmed")
        with self._lock:
            futures = [f for batch in self._sealed.values() for f in batch.futures]
            self._drop_sealed()
            self._appender.count_done(self._appender.outstanding)
        _fail(futures, error)

    # -- messages to the daemon ------------------------------------------------------------------

    def _post(self, message: ipc.Message) -> None:
        """Queue a message for the I/O thread (lock held or not: deque appends are atomic)."""
        self._outbox.append(ipc.encode(message))
        self._wake()

    def _wake(self) -> None:
        # The I/O thread sends what was queued before it polls again; a wake-up pending is enough.
        if self._wake_pending or threading.get_ident() == self._io_ident:
            return
        self._wake_pending = True
        try:
            self._wake_w.send(b"\x00")  # type: ignore[union-attr]
        except (BlockingIOError, AttributeError):
            pass  # already woken (the pipe is full), or not started

    # -- the I/O thread --------------------------------------------------------------------------

    def _io_loop(self) -> None:
        assert self._context is not None and self._sock is not None and self._wake_r is not None
        self._io_ident = threading.get_ident()
        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        # zmq.Poller reports a plain socket by its file descriptor, not as the object registered.
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        self._hello_sent = True
        sock.send(ipc.encode(self._hello()))
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
                    # Drained before the flag is cleared, and both before the queues are read: a wake-up
                    # written after the drain stays in the pipe; one skipped because the flag was still
                    # set asked for what the queues are about to show. (Cleared first, a wake-up written
                    # between the two was drained with the flag left set, and every later _wake() skipped.)
                    _drain(self._wake_r)
                    self._wake_pending = False
                if sock in events:
                    self._receive_all(sock)
                if self._lost:
                    self._fail_lost()
                if time.monotonic() >= next_heartbeat:
                    sock.send(_HEARTBEAT)
                    self._expire_unreported()
                    interval = self._welcome.settings.heartbeat_interval_ms if self._welcome else 1000
                    next_heartbeat = time.monotonic() + interval / 1000
        except BaseException as exc:
            # A callback raised SystemExit, say, or a bug: nothing will report this process's records any
            # more. Each send() and flush() says so from now on, and the records waiting fail with it.
            self._io_stopped(exc)
            raise
        finally:
            sock.close()
            self._context.term()
            self._release_segment()

    def _io_stopped(self, exc: BaseException) -> None:
        error = KafkaError(f"the producer's I/O thread stopped ({type(exc).__name__}: {exc}): "
                           "this producer can send no more; make a new one")
        with self._lock:
            self._session_error = error
            self._appender.disable()
            futures = [f for batch in [*self._open.values(), *self._sealed.values()] for f in batch.futures]
            self._drop_sealed()
            self._appender.count_done(self._appender.outstanding)
            self._cond.notify_all()
        _fail(futures, error)

    def _setting(self, given: int | None, name: str, default: int) -> int:
        if given is not None:
            return given
        return getattr(self._welcome.settings, name) if self._welcome else default

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
        delivery_timeout_ms = self._welcome.settings.delivery_timeout_ms if self._welcome else 120_000
        limit = (delivery_timeout_ms + _REPORT_GRACE_MS) / 1000
        now = time.monotonic()
        with self._lock:
            overdue = [b for b in self._sealed.values() if now - b.sealed > limit]
            for batch in overdue:
                self._forget_sealed(batch)
        if overdue:
            error = KafkaTimeoutError(f"no delivery report from the kafka-sidecar daemon at {self.endpoint} "
                                      f"{limit:.0f} s after sealing: is it running?")
            _fail([f for b in overdue for f in b.futures], error)
            with self._lock:
                self._appender.count_done(sum(b.record_count - b.reported for b in overdue))
                self._cond.notify_all()

    def _seal_lingered(self) -> float:
        """Once a batch has waited linger_ms, seal it and every other open batch; returns when to look again.

        Sealing the younger batches too is what the Java producer does in effect (a
        ready node takes the first batch of each of its partitions, lingered or not),
        and it puts them all in one SEAL message, one wake-up of the I/O thread.
        While reports are slow, batches of partitions with a batch awaiting its
        report stay open: a report wakes the I/O thread, which looks again then.
        """
        now = time.monotonic()
        with self._lock:
            self._holding = self._reports_slow(now)
            if self._holding:
                unreported = self._unreported
                due = [b for key, b in self._open.items() if key not in unreported]
            else:
                due = list(self._open.values())
            oldest = min((b.created for b in due), default=None)
            if oldest is not None and self._linger_deadline(oldest) <= now:
                for batch in due:
                    self._seal(batch)
                oldest = None
            next_due = now + 1.0 if oldest is None else self._linger_deadline(oldest)
            self._io_wakes_at = next_due
            self._queue_seal_notices()
        return next_due

    def _linger_deadline(self, created: float) -> float:
        """When a batch opened at ``created`` has lingered: linger_ms later on a clock of whole
        milliseconds, as the Java producer counts a batch's waited time."""
        return math.floor(created * 1000) / 1000 + self._linger_s

    def _reports_slow(self, now: float) -> bool:
        """Whether reports take _SLOW_REPORT_LINGERS x linger_ms, lately or the oldest awaited (lock held)."""
        # Sealed batches are kept in the order they were sealed: the first one waited longest.
        oldest = next(iter(self._sealed.values()), None)
        waited = now - oldest.sealed if oldest is not None else 0.0
        return max(self._report_time_s, waited) >= _SLOW_REPORT_LINGERS * self._linger_s

    def _queue_seal_notices(self) -> None:
        """Move the waiting seal notices to the outbox as one SEAL message (lock held)."""
        if self._seal_notices:
            self._outbox.append(ipc.encode(ipc.Seal(self._seal_notices)))
            self._seal_notices = []

    def _receive_all(self, sock: zmq.Socket) -> None:
        # Asking for the events is cheaper than raising zmq.Again at the end of every batch.
        while sock.getsockopt(_EVENTS) & _POLLIN:
            data = sock.recv(_NOBLOCK)
            try:
                self._handle(ipc.decode(data))
            except ipc.VersionMismatchError as exc:
                with self._lock:
                    self._session_error = SidecarUnavailableError(
                        f"kafka-sidecar at {self.endpoint} speaks protocol version {exc.version!r}, this client "
                        f"{PROTOCOL_VERSION}: upgrade kafka-sidecar on one side")
                    self._cond.notify_all()
            except Exception:
                log.exception("cannot handle a message from the daemon")

    def _handle(self, message: ipc.Message) -> None:
        if isinstance(message, ipc.Delivery):
            self._deliver(message.reports)
            return
        with self._lock:
            if isinstance(message, ipc.Grant):
                request = self._requests.get(message.request_id)
                if request is None or (request.contiguous and request.error is not None):
                    # Not asked for (by this session), or no longer wanted: they go back.
                    self._requests.pop(message.request_id, None)
                    self._post(ipc.Release(message.blocks))
                elif request.contiguous:
                    request.blocks = message.blocks
                else:
                    del self._requests[message.request_id]
                    self._spare_requested = False
                    self._spare.extend(message.blocks)
            elif isinstance(message, ipc.GrantFailed):
                request = self._requests.get(message.request_id)
                if request is not None and request.contiguous and request.error is None:
                    request.error = message.reason  # the waiting send() raises it
                elif request is not None:
                    del self._requests[message.request_id]
                    self._spare_requested = self._spare_requested and request.contiguous
            elif isinstance(message, ipc.Topic):
                info = self._topics.setdefault(message.topic, _Topic())
                count = info.partition_count = message.partition_count
                info.available = tuple(message.available_partitions)
                info.error = ipc.error_from_wire(message.error)
                if count and (info.error is None or info.error.retriable):
                    self._partition_counts[message.topic] = count
                else:
                    self._partition_counts.pop(message.topic, None)
            elif isinstance(message, ipc.Welcome):
                self._welcomed(message)
            elif isinstance(message, ipc.SealNow):
                self._seal_all()
                if self._spare:
                    self._post(ipc.Release(self._spare))
                    self._spare = []
            elif isinstance(message, ipc.Error):
                self._refused(message.code, message.message)
            self._cond.notify_all()

    def _welcomed(self, welcome: ipc.Welcome) -> None:
        if self._welcome is not None:
            self._forget_session()
        try:
            self._segment = Segment(welcome.segment)
        except (OSError, ValueError) as exc:
            # Say why, rather than letting send() time out waiting for a session that cannot work.
            self._session_error = SidecarUnavailableError(
                f"cannot map the shared memory {welcome.segment!r} of the kafka-sidecar daemon at {self.endpoint}: "
                f"{exc}")
            return
        self._welcome = welcome
        self._hello_sent = False
        self._linger_s = self.linger_ms / 1000
        # The C fast path takes records once there is a session, unless serializers must run.
        if self._key_serializer is None and self._value_serializer is None and not self._closing:
            self._appender.enable()
        for topic in self._topics:
            self._post(ipc.Metadata(topic))  # a new session: follow the topics again
        log.debug("connected to kafka-sidecar at %s as client %s", self.endpoint, welcome.client_id)

    def _refused(self, code: str, text: str) -> None:
        if code == ipc.ERROR_UNKNOWN_CLIENT:
            # The daemon restarted, or ended the session (it took this process for dead): start again.
            # The blocks of the old session are not ours any more: stop writing to them at once.
            if not self._hello_sent:
                log.warning("the kafka-sidecar daemon does not know this client any more: connecting again")
                self._forget_session()
                self._hello_sent = True
                self._post(self._hello())
        elif self._welcome is None:
            # Refused before the welcome: the handshake itself (e.g. a version mismatch).
            log.error("the kafka-sidecar daemon refused the handshake: %s", text)
            self._session_error = SidecarUnavailableError(f"kafka-sidecar at {self.endpoint}: {text}")
        else:
            log.error("the kafka-sidecar daemon refused a message: %s", text)

    def _forget_session(self) -> None:
        """The session is gone (lock held): what it held is gone, and its records' fate unknown."""
        error = SidecarUnavailableError("the kafka-sidecar daemon lost this client's session (it restarted, or "
                                        "took the client for dead): the delivery of this record is unknown")
        self._appender.disable()
        lost = [f for batch in [*self._open.values(), *self._sealed.values()] for f in batch.futures]
        for batch in self._open.values():
            batch.release()
        self._open.clear()
        # Their records stay outstanding until the I/O thread has failed them: a flush() that returned
        # before would say that everything was delivered.
        self._drop_sealed()
        self._seal_notices.clear()
        self._spare.clear()
        self._requests.clear()
        self._spare_requested = False
        self._welcome = None
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        if lost:
            log.error("%d record(s) handed to the lost session are failed as unknown", len(lost))
            # Completed on the I/O thread after the lock is released, as deliveries are.
            self._lost += lost
            self._lost_error = error

    def _fail_lost(self) -> None:
        """Fail the records of a lost session (I/O thread), then count them out as _deliver does."""
        with self._lock:
            lost, self._lost = self._lost, []
            pending = sum(1 for future in lost if not future.done())
        _fail(lost, self._lost_error)  # type: ignore[arg-type]
        with self._lock:
            self._appender.count_done(pending)
            self._cond.notify_all()

    def _hello(self) -> ipc.Hello:
        return ipc.Hello(PROTOCOL_VERSION, os.getpid(), self._client_name,
                         ipc.HelloOptions(linger_ms=self.linger_ms, partitioner=self._partitioner_name,
                                          process=ipc.process_identity(os.getpid()), retriable_topic_errors=True))

    def _deliver(self, rows: list[Any]) -> None:
        # Only the bookkeeping holds the lock: send() must not wait while futures complete.
        reported = []
        now = time.monotonic()
        with self._lock:
            for row in rows:
                batch_id, first, count, base_offset, log_append_time, error_wire = ipc.DeliveryReport._make(row)
                batch = self._sealed.get(batch_id)
                if batch is None:
                    continue
                # WHOLE_BATCH and anything past the batch's end count up to its last record.
                count = max(min(count, batch.record_count - first), 0)
                batch.reported += count
                if batch.reported >= batch.record_count:
                    self._forget_sealed(batch)
                    # Smoothed as TCP smooths its round-trip time (RFC 6298): one slow report is not slow reports.
                    self._report_time_s += (now - batch.sealed - self._report_time_s) / 8
                reported.append((batch, first, count, base_offset, log_append_time, error_wire))
        try:
            for batch, first, count, base_offset, log_append_time, error_wire in reported:
                _completer.complete(batch.futures, first, count, batch.topic, batch.partition, base_offset,
                                    log_append_time, ipc.error_from_wire(error_wire))
        finally:
            # Counted out after the callbacks ran: flush() returns once they have, as in the Java client.
            with self._lock:
                self._appender.count_done(sum(r[2] for r in reported))
                self._cond.notify_all()

    def _release_segment(self) -> None:
        with self._lock:
            for batch in self._open.values():
                batch.release()
            self._open.clear()
            if self._segment is not None:
                self._segment.close()
                self._segment = None


def _drain(sock: socket.socket) -> None:
    # One read: a wake-up is one byte, and whatever is left wakes the next poll at once. A small read
    # comes from Python's object allocator; a page-sized one would be a malloc() in this thread's own
    # arena, whose pages stay resident in every client process.
    try:
        sock.recv(64)
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
