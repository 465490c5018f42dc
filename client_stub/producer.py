"""Producer: what applications use to send records through the node's kafka-sidecar daemon.

``send()`` serializes and partitions a record and writes it, in Kafka's v2
record format, straight into this process's open batch of shared memory for the
partition, and publishes it there; no message to the daemon is needed for that.
The daemon claims the batch when it is due (linger_ms after its first record, or
up to the daemon's linger.ms sooner with another batch that is due, full, flush()
and close(), the pool exhausted, this process gone), sends it and
reports its outcome back; the I/O thread then completes each record's Future.
A record is safe once send() returned: if this process dies, the daemon still
claims and sends what it published.

The parts, as the Java producer splits them: this module holds the API and the
life cycle; :mod:`.accumulator` the open batches and those awaiting their reports, and expiry;
:mod:`.block_grants` this process's blocks of the BufferPool; :mod:`.session`
the session with the daemon, its states; :mod:`.io_thread` the thread that keeps
it, and :mod:`.outbox` what waits for it to be sent; :mod:`.futures` the
records' futures. The per-record work (the common case of send(), and completing
the futures) is the fast path's (:mod:`.fastpath`, in C or pure Python).

Thread-safe; fork-safe (a child process starts afresh as a new client).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from . import futures
from .accumulator import RecordAccumulator
from .block_grants import BlockGrants
from .contract import PROTOCOL_VERSION, ipc
from .contract.records import BATCH_HEADER_SIZE, Header
from .errors import (
    BufferExhaustedError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SidecarUnavailableError,
)
from .fastpath import Appender, OpenBatch, record_size
from .futures import DeliveryCallback, RecordFuture, RecordMetadata
from .io_thread import IoThread
from .metadata import ProducerMetadata, TopicInfo
from .outbox import Outbox
from .partitioner import Partitioner
from .session import Session

__all__ = ["Producer", "Serializer"]

# key_serializer and value_serializer: what they return is taken as send() takes a key or value (str as UTF-8).
Serializer = Callable[[Any], "bytes | bytearray | memoryview | str | None"]

_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    futures.reinit_after_fork()
    for producer in list(_producers):
        producer._forget_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _future_watched() -> None:
    """A record future is waited on or watched: this process's producers want their reports at once."""
    pid = os.getpid()
    while True:
        try:
            producers = list(_producers)
            break
        except RuntimeError:
            continue  # another thread made or closed a producer while this one walked the set: walk it again
    for producer in producers:
        if producer._pid == pid:
            producer._accumulator.want_reports(wakeup=True)


futures.on_watch = _future_watched


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
        self._session = Session(self.endpoint)
        self._outbox = Outbox()
        self._accumulator = RecordAccumulator(self._partitioner, self._outbox.post)
        self._grants = BlockGrants(self._outbox.post)
        self._metadata = ProducerMetadata()
        self._appender = Appender(self._lock, self._accumulator.open, self._metadata.partition_counts, RecordFuture,
                                  self._accumulator.seal_if_open, self._send,
                                  None if self._partitioner_name == "random" else self._partitioner.sticky,
                                  self._partitioner_name == "murmur2_random", self._metadata.indexes,
                                  self._accumulator.unreported, self._accumulator.batch_ids,
                                  functools.partial(self._outbox.post, ipc.Wakeup()))
        # Each instance's send() is its Appender's: no Python frame per record (see Producer.send). It takes the
        # same arguments, which mypy cannot see (a method is not assigned to, as a rule).
        self.send = self._appender.send  # type: ignore[method-assign]
        self._io = IoThread(self.endpoint, self._cond, self._session, self._outbox, self._accumulator,
                            self._grants, self._metadata, self._appender, hello=self._hello,
                            linger_ms=lambda: self.linger_ms, max_block_ms=lambda: self.max_block_ms,
                            fast_path_allowed=self._fast_path_allowed)
        self._closing = False
        self._bufferpool_wait_ns = 0

    def _forget_parent(self) -> None:
        # In a forked child: the parent's sockets, threads, blocks and records are the
        # parent's. Drop them without closing anything the parent still uses, but this process's copies of
        # its connection and segment: the daemon must see the parent's end when it comes.
        self._io.close_inherited()
        # A send() bound before the fork is the old Appender's: it must neither append to the parent's batches nor
        # open one on the parent's blocks, and leaves every record to the Python path, which starts afresh.
        self._appender.disable()
        self._appender.detach()
        self._abandoned = (self._io, self._outbox, self._appender, self._accumulator)
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
            self._io.start()
            self._pid = os.getpid()

    def _hello(self) -> ipc.Hello:
        return ipc.Hello(PROTOCOL_VERSION, os.getpid(), self._client_name,
                         ipc.HelloOptions(linger_ms=self.linger_ms, partitioner=self._partitioner_name,
                                          retriable_topic_errors=True, shutdown_notice=True))

    def _fast_path_allowed(self) -> bool:
        # The fast path takes records once there is a session, unless serializers must run.
        return self._key_serializer is None and self._value_serializer is None and not self._closing

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records handed off and not yet reported."""
        return self._appender.outstanding

    def metrics(self) -> dict[str, float]:
        """This producer's own metrics in this process, by Kafka's names where Kafka has one: records handed to
        send() (``record-send-total``), reported delivered (``records-delivered-total``) and failed
        (``record-error-total``), still waiting for their report (``records-outstanding``), and the time send()
        waited for blocks of the BufferPool (``bufferpool-wait-time-ns-total``). The daemon's metrics, for every
        process of the host: ``kafka-sidecar stats``."""
        with self._lock:
            outstanding = self._appender.outstanding
            delivered, failed = self._io.records_delivered, self._io.records_failed
            waited = self._bufferpool_wait_ns
        return {"record-send-total": float(delivered + failed + outstanding),
                "records-delivered-total": float(delivered), "record-error-total": float(failed),
                "records-outstanding": float(outstanding), "bufferpool-wait-time-ns-total": float(waited)}

    @property
    def linger_ms(self) -> int:
        """This producer's linger_ms, else the daemon's linger.ms."""
        if self._linger_ms is not None:
            return self._linger_ms
        settings = self._session.settings
        return 5 if settings is None else settings.linger_ms

    @property
    def max_block_ms(self) -> int:
        """This producer's max_block_ms, else the daemon's max.block.ms (60000 until it has said)."""
        if self._max_block_ms is not None:
            return self._max_block_ms
        settings = self._session.settings
        return 60000 if settings is None else settings.max_block_ms

    @property
    def daemon_settings(self) -> ipc.WelcomeSettings | None:
        """The settings of the daemon that last welcomed this producer (None until one has)."""
        return self._session.settings

    # -- send ------------------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None = None,
             on_delivery: DeliveryCallback | None = None) -> Future[RecordMetadata]:
        """Hand a record over; the Future's result is its RecordMetadata.

        Blocks up to max_block_ms for the daemon's welcome, the topic's metadata
        and free memory, then raises SidecarUnavailableError, KafkaTimeoutError or
        BufferExhaustedError. RecordTooLargeError if the record exceeds max.request.size.

        ``on_delivery(error, metadata)`` runs on the producer's I/O thread once the record
        is delivered or has failed. To give it a record's context, bind it with
        ``functools.partial``: the C fast path keeps a partial, like the record's future,
        out of the garbage collector's sight while the record is in flight, where a closure
        made per record is promoted to the collector's oldest generation at high rates.
        """
        # The class's send() is what help(), autospec mocks and subclasses see; an instance calls its
        # Appender's send() directly (bound in _init_state), which appends the common case itself.
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
        info = self._metadata.topics.get(topic)
        if info is None or not info.partition_count:
            # The first send to a topic: check it, and wait for the daemon and the metadata.
            ipc.check_topic(topic)
            started = time.monotonic()
            info = self._wait_for_metadata(topic, started, None)
            deadline = started + self.max_block_ms / 1000
        # The ignores: a topic waited for has its partition count, which mypy cannot see through the wait.
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
                headers: Sequence[Header], future: RecordFuture, info: TopicInfo, deadline: float) -> None:
        timestamp = future.timestamp_ms
        accumulator = self._accumulator
        with self._lock:
            while True:
                self._check_open()
                self._check_session()
                partition = explicit
                if partition is None:
                    # send() waited for the topic's partition count, which mypy cannot see.
                    partition = self._partitioner.partition(topic, key, info.partition_count,  # type: ignore[arg-type]
                                                            info.available)
                batch = accumulator.open.get((topic, partition))
                if batch is None:
                    batch = self._new_batch(topic, partition, key, value, headers, timestamp, deadline)
                    if batch is None:
                        continue  # the lock was released while waiting for blocks: look again
                before = batch.pos
                if not batch.append(key, value, headers, timestamp, future):
                    if not batch.record_count:
                        raise RecordTooLargeError("the record does not fit in the blocks taken for it")
                    accumulator.seal(batch)
                    continue
                self._appender.count_appended()
                if future.on_delivery is not None:
                    accumulator.want_reports(wakeup=False)
                if batch.record_count == 1:
                    self._appender.first_published(batch)
                # Full, or nearly: the next record like this one would not fit.
                if batch.capacity - batch.pos < batch.pos - before:
                    accumulator.seal(batch)
                return

    def _new_batch(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header], timestamp_ms: int, deadline: float) -> OpenBatch[RecordFuture] | None:
        """A batch on fresh blocks for the record; None if the lock was released to wait."""
        if not deadline:
            deadline = time.monotonic() + self.max_block_ms / 1000
        welcome = self._session.welcome
        if welcome is None:
            # The session was lost, and a new one is on its way.
            self._wait(deadline, lambda: self._session.welcome is None, lambda: self._unavailable(self.max_block_ms))
            return None
        info = self._metadata.topics[topic]
        if info.index < 0:
            # A new session, which has not told its number for the topic yet.
            self._wait(deadline, lambda: info.index < 0, lambda: self._unavailable(self.max_block_ms))
            return None
        size = record_size(0, 0, key, value, headers)
        limit = welcome.settings.max_request_size
        if size + BATCH_HEADER_SIZE > limit:
            raise RecordTooLargeError(
                f"The message is {size + BATCH_HEADER_SIZE} bytes when serialized which is larger than {limit}, "
                "which is the value of the max.request.size configuration.")
        count = -(-size // welcome.block_size)
        if count > welcome.block_count:
            raise RecordTooLargeError(
                f"The message is {size} bytes when serialized which is larger than the total memory buffer you "
                f"have configured with the buffer.memory configuration ({welcome.settings.buffer_memory}).")
        blocks = self._take_blocks(count, deadline)
        if blocks is None:
            return None
        assert self._io.segment is not None
        return self._accumulator.open_batch(topic, info.index, partition, blocks,
                                            self._io.segment.blocks(blocks[0], len(blocks)), timestamp_ms)

    def _take_blocks(self, count: int, deadline: float) -> list[int] | None:
        """``count`` blocks (contiguous if more than one), or None after waiting (lock released).

        With max_block_ms 0, as Java's max.block.ms=0, nothing waits for memory the pool does not have now: the
        wait is for the daemon's answer alone, and a refusal is BufferExhaustedError at once.
        """
        grants = self._grants
        # Without a deadline for memory, the wait ends with the daemon's answer (or the session).
        memory_deadline = deadline if self.max_block_ms else None
        if count == 1:
            refusals = grants.refusals
            block = grants.take_spare(self.max_block_ms)
            if block is not None:
                return [block]

            def waiting() -> bool:
                if self._session.welcome is None:
                    return False  # the session ended (the daemon went, or shuts down): look again
                if memory_deadline is None and grants.refusals != refusals:
                    raise exhausted()
                # Spare blocks may go back to the daemon meanwhile (SEAL_NOW): ask again if so.
                grants.top_up(self.max_block_ms)
                return not grants.spare

            def exhausted() -> BufferExhaustedError:
                return BufferExhaustedError(f"Failed to allocate memory within the configured max blocking time "
                                            f"{self.max_block_ms} ms.")

            self._wait_for_memory(memory_deadline, waiting, exhausted)
            return None
        request = grants.request(count, True, self.max_block_ms)
        failed = f"Failed to allocate {count} consecutive blocks for a large record within {self.max_block_ms} ms"
        try:
            self._wait_for_memory(memory_deadline, lambda: request.blocks is None and request.error is None
                                  and self._session.welcome is not None, lambda: BufferExhaustedError(failed + "."))
        finally:
            current = grants.finished(request)  # given up on, a late grant goes back to the daemon
        if not current:
            return None  # the session was lost meanwhile, and its blocks with it: look again
        if request.error is not None:
            # The daemon waits max.block.ms too, and its refusal may come first: the same error either way.
            raise BufferExhaustedError(f"{failed}: {request.error}")
        return request.blocks

    def _wait_for_memory(self, deadline: float | None, waiting: Callable[[], bool],
                         timeout_error: Callable[[], KafkaError]) -> None:
        """:meth:`_wait` for blocks of the BufferPool, timed (bufferpool-wait-time-ns-total)."""
        started = time.monotonic_ns()
        try:
            self._wait(deadline, waiting, timeout_error)
        finally:
            self._bufferpool_wait_ns += time.monotonic_ns() - started

    def _wait(self, deadline: float | None, waiting: Callable[[], bool],
              timeout_error: Callable[[], KafkaError]) -> None:
        """Wait on the condition while ``waiting()`` (lock held); raise ``timeout_error()`` at the deadline
        (None: no deadline, ``waiting()`` ends the wait)."""
        while waiting():
            self._check_session()
            self._check_open()
            self._check_not_io_thread("send() would have to wait")
            remaining = None
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise timeout_error()
            self._cond.wait(remaining)

    def _check_session(self) -> None:
        if self._session.error is not None:
            raise self._session.error

    def _check_open(self) -> None:
        if self._closing:
            raise ProducerClosedError("Cannot send after the producer is closed.")

    def _check_not_io_thread(self, what: str) -> None:
        # Callbacks run on the I/O thread: waiting there for what only the I/O thread brings never ends.
        if self._io.is_current():
            raise KafkaError(f"{what} in an on_delivery callback, on the producer's I/O thread, which delivers "
                             "what it would wait for: hand the work to another thread")

    def _wait_for_welcome(self, started: float, deadline: float) -> None:
        if self._session.welcome is not None:
            return
        with self._lock:
            self._wait(deadline, lambda: self._session.welcome is None,
                       lambda: self._unavailable(round((deadline - started) * 1000)))

    def _unavailable(self, waited_ms: int) -> SidecarUnavailableError:
        """Why no session came in the ``waited_ms`` a caller waited for one."""
        if self._session.shutdown_reason is not None:
            return SidecarUnavailableError(f"the kafka-sidecar daemon at {self.endpoint} shut down "
                                           f"({self._session.shutdown_reason}) and no daemon took its place within "
                                           f"{waited_ms} ms")
        refused = "" if self._session.last_refusal is None else f" ({self._session.last_refusal})"
        return SidecarUnavailableError(f"no kafka-sidecar daemon answered at {self.endpoint} "
                                       f"within {waited_ms} ms{refused}")

    def wait_for_daemon(self, timeout: float | None = None) -> None:
        """Start this producer's session if it has none, and wait up to ``timeout`` seconds (None: max_block_ms)
        for the daemon's welcome: SidecarUnavailableError if none comes. A health check."""
        self._ensure_started()
        started = time.monotonic()
        self._wait_for_welcome(started, started + (self.max_block_ms / 1000 if timeout is None else timeout))

    def partitions_for(self, topic: str, timeout: float | None = None) -> list[int]:
        """The partitions of ``topic``, as Java's partitionsFor: waits up to ``timeout`` seconds (None: max_block_ms)
        for the daemon and the topic's metadata, then raises SidecarUnavailableError or KafkaTimeoutError (whose
        ``__cause__`` is the cluster's last error on the topic, if it gave one); the cluster's final error on the
        topic (TOPIC_AUTHORIZATION_FAILED...) at once."""
        ipc.check_topic(topic)
        self._ensure_started()
        info = self._wait_for_metadata(topic, time.monotonic(), timeout)
        return list(range(info.partition_count))  # type: ignore[arg-type]

    def _wait_for_metadata(self, topic: str, started: float, timeout: float | None) -> TopicInfo:
        """The topic's metadata, waiting from ``started`` up to ``timeout`` seconds for the daemon's welcome and
        for the topic (None: max_block_ms, the daemon's once its welcome has come)."""
        def deadline() -> float:
            return started + (self.max_block_ms / 1000 if timeout is None else timeout)

        self._wait_for_welcome(started, deadline())
        return self._wait_for_topic(topic, started, deadline())

    def _wait_for_topic(self, topic: str, started: float, deadline: float) -> TopicInfo:
        info = self._metadata.topics.get(topic)
        if info is not None and info.partition_count:
            return info
        with self._lock:
            if topic not in self._metadata.topics:
                self._metadata.topics[topic] = TopicInfo()
                self._outbox.post(ipc.Metadata(topic))
            info = self._metadata.topics[topic]

            def waiting() -> bool:
                if info.error is not None and not info.error.retriable:
                    raise info.error
                return not info.partition_count

            def timed_out() -> KafkaTimeoutError:
                cause = f" (the cluster answers {info.error.name})" if info.error is not None else ""
                error = KafkaTimeoutError(f"Topic {topic} not present in metadata after "
                                          f"{round((deadline - started) * 1000)} ms{cause}.")
                error.__cause__ = info.error
                return error

            self._wait(deadline, waiting, timed_out)
            return info

    # -- flush and close -------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> int:
        """Have the daemon claim everything now and wait for the outcomes; returns how many records are still
        undelivered."""
        if self._pid != os.getpid():
            return 0  # nothing was sent from this process
        self._check_not_io_thread("flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._accumulator.seal_all()
            while self._appender.outstanding and self._session.error is None:
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
                self._io.stop()
            self._io.join()
            self._fail_unconfirmed()
        self._closed = True
        _producers.discard(self)

    def _fail_unconfirmed(self) -> None:
        error = ProducerClosedError("the producer closed before the delivery of this record was confirmed")
        with self._lock:
            unconfirmed = self._accumulator.abandon()
            self._io.count_done(failed=self._appender.outstanding)
        futures.fail(unconfirmed, error)


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
