"""confluent-kafka's Producer on the client's producer: produce() hands a record over or keeps it waiting here,
poll() and flush() run the delivery callbacks on the application's thread."""

from __future__ import annotations

import functools
import logging
import operator
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ... import errors
from ...contract import ipc
from ...futures import RecordMetadata
from ...producer import Producer as _SidecarProducer
from ...producer import _headers as _record_headers
from .._settings import close_producer
from .errors import DESCRIPTIONS, KafkaError, KafkaException, as_kafka_error, invalid_arg, unexpected_error
from .message import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, DeliveryCallback, Message
from .metadata import ClusterMetadata, PartitionMetadata, TopicMetadata
from .settings import read_settings

__all__ = ["Headers", "Producer"]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]

# While a record cannot be handed off for want of memory or of a daemon, it is tried again this often.
_RETRY_S = 0.05


class _Record(NamedTuple):
    """A record produce() took: its topic, Message (the delivery report), timestamp, the partition asked for
    (None: the partitioner's), its callback."""

    topic: str
    message: Message
    timestamp_ms: int
    partition: int | None
    callback: DeliveryCallback | None
    produced_at: float  # time.monotonic()


_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_producers):
        producer._forget_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Producer:
    """confluent_kafka.Producer on the kafka-sidecar daemon (see the docstring of client_stub.compat.confluent).

    ``Producer(config)`` or ``Producer(**config)``, as confluent-kafka's; ``len(producer)`` is the number of
    records not yet reported to the application (waiting here, at the daemon, or in a report not yet served).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._settings = read_settings({**(config or {}), **kwargs})
        self._producer = _SidecarProducer(self._settings.endpoint, linger_ms=self._settings.linger_ms,
                                          # produce() waits for nothing: no memory free now is BufferError
                                          max_block_ms=0, partitioner=self._settings.partitioner,
                                          client_name=self._settings.client_id)
        self._closed = False
        # As confluent-kafka's, a producer dropped without close() ends its session (what it had not flushed is
        # lost, as librdkafka purges it). A record in flight holds the producer (its report does): none is.
        # The finalizer holds the client's producer, not this one, which it would keep alive.
        self._close = weakref.finalize(self, close_producer, self._producer, 0)
        self._init_state()
        _producers.add(self)

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._in_flight = 0  # handed off, not reported
        self._waiting: dict[str, deque[_Record]] = {}  # by topic: not handed off yet, in order
        self._waiting_count = 0
        self._reports: deque[tuple[DeliveryCallback, Message]] = deque()  # reported, callback not run yet
        self._topics: set[str] = set()  # produced to: what list_topics() without a topic lists

    def _forget_parent(self) -> None:
        # In a forked child: the records were the parent's, and so were the threads that handed them off.
        self._init_state()

    def __len__(self) -> int:
        with self._lock:
            return self._in_flight + self._waiting_count + len(self._reports)

    # -- produce -------------------------------------------------------------------------------------------

    def produce(self, topic: str, value: str | bytes | None = None, key: str | bytes | None = None,
                partition: int = -1, callback: DeliveryCallback | None = None,
                on_delivery: DeliveryCallback | None = None, timestamp: int = 0,
                headers: Headers | None = None) -> None:
        """Hand a record over; ``on_delivery(err, msg)`` (alias ``callback``; else the configuration's) runs
        inside a later poll() or flush() on the calling thread.

        Never waits: BufferError if the BufferPool has no room now or ``queue.buffering.max.messages`` records
        are waiting; KafkaException(MSG_SIZE_TOO_LARGE) past max.request.size, (_UNKNOWN_PARTITION) for a
        partition the topic does not have, (_INVALID_ARG) for an invalid topic name or timestamp, or an endpoint that
        cannot be connected to.
        """
        if self._closed:
            raise RuntimeError("Producer has been closed")
        self._settings.check.check(self._producer.daemon_settings)
        try:
            ipc.check_topic(topic)
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None
        try:
            # Any integer (a numpy one too), as librdkafka takes a C integer.
            partition, timestamp = operator.index(partition), operator.index(timestamp)
        except TypeError:
            raise invalid_arg(f"partition and timestamp are integers, got {partition!r} and {timestamp!r}") from None
        if partition < -1:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        if not 0 <= timestamp < 2**63:
            raise invalid_arg(f"timestamp must be milliseconds from 0 to 2**63-1, got {timestamp!r}")
        timestamp = timestamp or time.time_ns() // 1_000_000
        explicit = None if partition == -1 else partition
        # An explicit partition is the report's even if the delivery fails, as confluent-kafka's.
        message = Message(topic, explicit, key=_bytes(key, "key"), value=_bytes(value, "value"),
                          headers=_headers(headers), timestamp=(TIMESTAMP_CREATE_TIME, timestamp))
        record = _Record(topic, message, timestamp, explicit,
                         callback or on_delivery or self._settings.on_delivery, time.monotonic())
        with self._lock:
            self._topics.add(topic)
            limit = self._settings.max_messages
            if limit and self._in_flight + self._waiting_count + len(self._reports) >= limit:
                raise BufferError(DESCRIPTIONS[KafkaError._QUEUE_FULL])
            if topic in self._waiting:
                self._wait_here(record)  # behind the topic's records that wait
                return
            self._in_flight += 1
        try:
            self._hand_off(record)
        except errors.BufferExhaustedError:
            self._not_handed_off()
            raise BufferError(DESCRIPTIONS[KafkaError._QUEUE_FULL]) from None
        except (errors.KafkaTimeoutError, errors.SidecarUnavailableError):
            # The topic's metadata has not come yet, or no daemon answers now: the record waits here.
            with self._lock:
                self._in_flight -= 1
                self._wait_here(record)
        except errors.RecordTooLargeError:
            self._not_handed_off()
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)) from None
        except ValueError as exc:
            self._not_handed_off()
            raise KafkaException(self._refusal(record, exc)) from None
        except errors.KafkaError as exc:
            # The cluster's final error on the topic: reported as a delivery's.
            self._finish(record, as_kafka_error(exc))
        except BaseException:
            self._not_handed_off()
            raise

    def _hand_off(self, record: _Record) -> None:
        message = record.message
        self._producer.send(record.topic, message._value, message._key, partition=record.partition,
                            timestamp_ms=record.timestamp_ms, headers=message._headers,
                            on_delivery=functools.partial(self._delivered, record))

    def _refusal(self, record: _Record, exc: ValueError) -> KafkaError:
        """librdkafka's error for a record the client refused: _UNKNOWN_PARTITION for a partition the topic does
        not have, else _INVALID_ARG (an endpoint that cannot be connected to, a ConfigError) with the reason."""
        if record.partition is not None:
            try:  # the topic's metadata has come if the partition was checked against it
                known = self._producer.partitions_for(record.topic, 0)
            except (ValueError, errors.KafkaError):
                known = None
            if known is not None and record.partition not in known:
                return KafkaError(KafkaError._UNKNOWN_PARTITION)
        if isinstance(exc, errors.KafkaError):
            return as_kafka_error(exc)
        return KafkaError(KafkaError._INVALID_ARG, str(exc))

    def _not_handed_off(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._cond.notify_all()

    def _delivered(self, record: _Record, error: errors.KafkaError | None, metadata: RecordMetadata | None) -> None:
        """A record's delivery report, on the client's I/O thread: queued for poll() and flush()."""
        message = record.message
        if metadata is not None:
            message._partition, message._offset = metadata.partition, metadata.offset
            if metadata.timestamp_ms != record.timestamp_ms:
                message._timestamp = (TIMESTAMP_LOG_APPEND_TIME, metadata.timestamp_ms)
        self._finish(record, None if error is None else as_kafka_error(error))

    def _finish(self, record: _Record, error: KafkaError | None, *, handed_off: bool = True) -> None:
        """The record's outcome, for poll() or flush() to report (only failures, with delivery.report.only.error)."""
        record.message._error = error
        record.message._latency = time.monotonic() - record.produced_at
        with self._lock:
            if handed_off:
                self._in_flight -= 1
            else:
                self._waiting_count -= 1
            callback = record.callback if error is not None or not self._settings.only_errors else None
            if callback is not None:
                self._reports.append((callback, record.message))
            # What poll() and flush() wait for: a report to serve, or (flush) no record outstanding.
            if callback is not None or not (self._in_flight or self._waiting_count):
                self._cond.notify_all()

    # -- records that wait here ----------------------------------------------------------------------------

    def _wait_here(self, record: _Record) -> None:
        """Keep the record until it can be handed off, behind its topic's (lock held)."""
        self._waiting_count += 1
        queue = self._waiting.get(record.topic)
        if queue is None:
            queue = self._waiting[record.topic] = deque()
            threading.Thread(target=self._hand_off_waiting, args=(record.topic,),
                             name=f"kafka-sidecar-unassigned-{record.topic}", daemon=True).start()
        queue.append(record)

    def _hand_off_waiting(self, topic: str) -> None:
        """The thread of a topic's records that wait here: hands them off, in order, once the topic's metadata
        has come and the daemon has room, or fails them as librdkafka fails its unassigned messages."""
        try:
            self._hand_off_topic(topic)
        except Exception as exc:
            # A bug: the records that wait fail, saying so, rather than keep flush() and close() waiting forever;
            # the topic's next record starts a thread anew.
            log.exception("handing off the records of topic %s that waited failed", topic)
            with self._lock:
                failed = self._waiting.pop(topic)
            for record in failed:
                self._finish(record, unexpected_error(exc), handed_off=False)

    def _hand_off_topic(self, topic: str) -> None:
        unknown_after = time.monotonic() + self._settings.propagation_ms / 1000
        while True:
            with self._lock:
                queue = self._waiting[topic]
                if not queue:
                    del self._waiting[topic]
                    return
                first = queue[0]
            now = time.monotonic()
            expires = first.produced_at + self._message_timeout_s()
            if now >= expires:
                self._fail_waiting(topic, KafkaError(KafkaError._MSG_TIMED_OUT), now)
                continue
            # Till the topic may be called unknown, wait for its metadata; after, look often: the first word that
            # the cluster does not have it fails its records.
            until = min(expires, unknown_after if now < unknown_after else now + _RETRY_S)
            try:
                self._producer.partitions_for(topic, until - now)
            except errors.KafkaTimeoutError as exc:
                if (isinstance(exc.__cause__, errors.KafkaError) and exc.__cause__.code == _UNKNOWN_TOPIC
                        and time.monotonic() >= unknown_after):
                    self._fail_waiting(topic, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
                continue
            except errors.SidecarUnavailableError:
                with self._lock:
                    self._cond.wait(_RETRY_S)  # the daemon may refuse at once: not a busy loop
                continue
            except errors.KafkaError as exc:
                self._fail_waiting(topic, as_kafka_error(exc))  # the cluster's final error on the topic, or closed
                continue
            self._hand_off_queue(topic)

    def _hand_off_queue(self, topic: str) -> None:
        """Hand off the topic's waiting records in order, until none is left or one must wait again."""
        while True:
            with self._lock:
                queue = self._waiting[topic]
                if not queue:
                    self._cond.notify_all()  # for flush(), which has the daemon claim what was handed off meanwhile
                    return
                record = queue.popleft()
                self._waiting_count -= 1
                self._in_flight += 1
            try:
                self._hand_off(record)
            except (errors.KafkaTimeoutError, errors.SidecarUnavailableError):
                with self._lock:  # no room, or no daemon now: it waits at the head again
                    self._in_flight -= 1
                    self._waiting_count += 1
                    queue.appendleft(record)
                    self._cond.wait(_RETRY_S)
                return
            except ValueError as exc:
                self._finish(record, self._refusal(record, exc))
            except errors.KafkaError as exc:
                self._finish(record, as_kafka_error(exc))
            except Exception as exc:
                self._finish(record, unexpected_error(exc))
                raise

    def _fail_waiting(self, topic: str, error: KafkaError, expired_at: float | None = None) -> None:
        """Fail the topic's waiting records (those produced before ``expired_at`` minus the message timeout, if
        given)."""
        with self._lock:
            queue = self._waiting[topic]
            failed = []
            while queue and (expired_at is None
                             or queue[0].produced_at + self._message_timeout_s() <= expired_at):
                failed.append(queue.popleft())
        for record in failed:
            self._finish(record, error, handed_off=False)

    def _message_timeout_s(self) -> float:
        """How long a record may wait for its delivery: the daemon's delivery.timeout.ms, else (before it has
        said) the configured message.timeout.ms (0: no limit), else the daemon's default."""
        settings = self._producer.daemon_settings
        if settings is not None:
            return settings.delivery_timeout_ms / 1000
        configured = self._settings.message_timeout_ms
        if configured == 0:
            return float("inf")
        return (120_000 if configured is None else configured) / 1000

    # -- reports -----------------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> int:
        """Run the callbacks of the delivery reports that have come, on this thread, waiting up to ``timeout``
        seconds (None or negative: as long as it takes) for one; returns how many ran. An exception a callback
        raises comes out of poll(); the reports after it wait for the next call."""
        self._settings.check.check(self._producer.daemon_settings)
        return self._serve(_deadline(timeout), until_done=False)

    def flush(self, timeout: float | None = None) -> int:
        """Hand every record over now (as if linger.ms had passed) and run delivery callbacks until no record is
        waiting or ``timeout`` seconds (None or negative: no limit) have passed; returns len()."""
        self._settings.check.check(self._producer.daemon_settings)
        deadline = _deadline(timeout)
        while True:
            self._producer.flush(0)  # seals the open batches
            self._serve(deadline, until_done=True)
            remaining = len(self)
            if not remaining or (deadline is not None and time.monotonic() >= deadline):
                return remaining

    def _serve(self, deadline: float | None, *, until_done: bool) -> int:
        """Wait for reports (or, ``until_done``, for no record to be waiting) until the deadline; run their
        callbacks."""
        with self._lock:
            while not self._reports and not (until_done and not (self._in_flight or self._waiting_count)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
                if until_done:
                    break  # a record handed off meanwhile is sealed by flush() before it waits again
            reports, self._reports = self._reports, deque()
        served = 0
        try:
            while reports:
                callback, message = reports.popleft()
                served += 1
                callback(message._error, message)
        finally:
            if reports:
                with self._lock:
                    self._reports.extendleft(reversed(reports))
        return served

    # -- metadata and the end ----------------------------------------------------------------------------

    def list_topics(self, topic: str | None = None, timeout: float | None = -1) -> ClusterMetadata:
        """The metadata of ``topic`` (its partitions, or the cluster's error on it), waiting up to ``timeout``
        seconds (negative: the daemon's max.block.ms). Without a topic, a health check as confluent-kafka's users
        write one: KafkaException(_TRANSPORT) unless the daemon answers within ``timeout``; the topics listed are
        those this producer has produced to whose metadata it has (the cluster's are the daemon's to know)."""
        if timeout is None or timeout < 0:
            settings = self._producer.daemon_settings
            timeout = (60_000 if settings is None else settings.max_block_ms) / 1000
        if topic is not None:
            found = self._topic_metadata(topic, timeout)
            if found is None:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no metadata for {topic} within "
                                                                       f"{timeout:g} s"))
            return ClusterMetadata({topic: found})
        try:
            self._producer.wait_for_daemon(timeout)
        except errors.SidecarUnavailableError as exc:
            raise KafkaException(as_kafka_error(exc)) from None
        with self._lock:
            topics = sorted(self._topics)
        listed = {name: self._topic_metadata(name, 0) for name in topics}
        return ClusterMetadata({name: found for name, found in listed.items() if found is not None})

    def _topic_metadata(self, topic: str, timeout: float) -> TopicMetadata | None:
        """``topic``'s partitions or the cluster's error on it; None if its metadata does not come within
        ``timeout`` seconds."""
        try:
            partitions = self._producer.partitions_for(topic, timeout)
        except errors.KafkaTimeoutError as exc:
            cause = exc.__cause__
            return TopicMetadata(topic, {}, as_kafka_error(cause)) if isinstance(cause, errors.KafkaError) else None
        except errors.SidecarUnavailableError as exc:
            raise KafkaException(as_kafka_error(exc)) from None
        except errors.KafkaError as exc:
            return TopicMetadata(topic, {}, as_kafka_error(exc))
        return TopicMetadata(topic, {p: PartitionMetadata(p) for p in partitions})

    def close(self) -> bool:
        """Flush (every record delivered or failed, its callback run), then end the session with the daemon."""
        if self._closed:
            return True
        self.flush()
        self._closed = True
        self._close()
        _producers.discard(self)
        return True


_UNKNOWN_TOPIC = errors.ERRORS_BY_NAME["UNKNOWN_TOPIC_OR_PARTITION"].code


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None or timeout < 0 else time.monotonic() + timeout


def _bytes(data: object, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be str, bytes or None, not {type(data).__name__}")


def _headers(headers: Headers | None) -> list[tuple[str, bytes | None]] | None:
    """Headers as (name, bytes) pairs (None if there are none), from a dict or pairs: as the record will have them."""
    if not headers:
        return None
    return [(name.decode("utf-8"), value) for name, value in _record_headers(headers)]
