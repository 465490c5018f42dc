"""kafka-python's ``KafkaProducer`` on kafka-sidecar: code written for kafka-python runs with one import changed.

    from client_stub.compat.kafka_python import KafkaProducer   # was: from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers="ignored", value_serializer=str.encode)
    metadata = producer.send("events", "value").get(timeout=10)
    producer.flush()

``send()`` returns a :class:`FutureRecordMetadata` (``get(timeout)``, ``add_callback``, ``add_errback``,
``succeeded()``, ``failed()``, ``value``, ``exception``) whose callbacks run on the client's I/O thread, as
kafka-python runs them on its sender thread. Errors are kafka-python's own classes where it is installed, else
stand-ins of ``kafka.errors``' names and hierarchy (:class:`KafkaTimeoutError`, :class:`MessageSizeTooLargeError`,
:class:`UnknownTopicOrPartitionError`...). Serializers are taken as kafka-python takes them: a callable, or an
object with ``serialize()`` (:class:`Serializer`, :class:`DefaultSerializer`, :class:`JsonSerializer`, or
kafka.serializer's). As kafka-python's, a producer not closed is closed (after a flush of up to a second) when it is
garbage-collected or the interpreter exits.

Settings: docs/migration/kafka-python.md says which are honoured, which the daemon owns (checked against the
daemon's: a difference is a :class:`~client_stub.compat.DaemonSettingWarning`), and which mean nothing here. An
unknown keyword raises ValueError, as kafka-python's does. The daemon's endpoint is ``sidecar_endpoint``, else
``$KAFKA_SIDECAR_ENDPOINT``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .. import errors
from ..futures import RecordMetadata as _SidecarRecordMetadata
from ..producer import Producer as _SidecarProducer
from ._settings import SettingsCheck, close_producer, whole_ms

__all__ = ["BrokerResponseError", "DefaultSerializer", "FutureRecordMetadata", "IllegalStateError", "JsonSerializer",
           "KafkaConfigurationError", "KafkaConnectionError", "KafkaError", "KafkaProducer", "KafkaTimeoutError",
           "MessageSizeTooLargeError", "RecordMetadata", "Serializer", "TopicPartition",
           "UnknownTopicOrPartitionError"]

log = logging.getLogger(__name__)


# -- kafka.errors ---------------------------------------------------------------------------------------------


class KafkaError(Exception):
    """kafka-python's base error: ``retriable`` if trying again may succeed, ``invalid_metadata`` if the
    metadata was stale."""

    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False

    def __str__(self) -> str:
        if not self.args:
            return type(self).__name__
        return f"{type(self).__name__}: {super().__str__()}"


class RetriableError(KafkaError):
    """Trying again may succeed."""

    retriable = True


class InvalidMetadataError(RetriableError):
    """The metadata was stale."""

    invalid_metadata = True


class IllegalArgumentError(KafkaError):
    """An argument is not allowed."""


class IllegalStateError(KafkaError):
    """The producer cannot do this now (it is closed)."""


class KafkaConfigurationError(KafkaError):
    """A setting that cannot be used."""


class KafkaConnectionError(InvalidMetadataError):
    """The connection to the cluster failed."""


class KafkaTimeoutError(RetriableError):
    """Something did not happen in time: the daemon, the topic's metadata, memory, a record's delivery."""


class BrokerResponseError(KafkaError):
    """An error code of the broker's: ``errno`` is its number, ``message`` its Kafka name, ``description`` what it
    means."""

    errno: ClassVar[int | None] = None
    message: ClassVar[str | None] = None
    description: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.description = " ".join((cls.__doc__ or "").split()) or None

    def __str__(self) -> str:
        return f"[Error {self.errno}] {super().__str__()}"


class AuthorizationError(BrokerResponseError):
    """The principal is not allowed to do this."""


class UnknownError(BrokerResponseError):
    """An unexpected server error."""

    errno = -1
    message = "UNKNOWN"


class CorruptRecordError(BrokerResponseError):
    """This message has failed its CRC checksum, exceeds the valid size, or is otherwise corrupt."""

    errno = 2
    message = "CORRUPT_MESSAGE"


class UnknownTopicOrPartitionError(InvalidMetadataError, BrokerResponseError):
    """This request is for a topic or partition that does not exist on this broker."""

    errno = 3
    message = "UNKNOWN_TOPIC_OR_PARTITION"


class LeaderNotAvailableError(InvalidMetadataError, BrokerResponseError):
    """This error is thrown if we are in the middle of a leadership election and there is currently no leader for this
    partition and hence it is unavailable for writes.
    """

    errno = 5
    message = "LEADER_NOT_AVAILABLE"


class NotLeaderForPartitionError(InvalidMetadataError, BrokerResponseError):
    """This error is thrown if the client attempts to send messages to a replica that is not the leader for some
    partition. It indicates that the clients metadata is out of date.
    """

    errno = 6
    message = "NOT_LEADER_FOR_PARTITION"


class RequestTimedOutError(RetriableError, BrokerResponseError):
    """This error is thrown if the request exceeds the user-specified time limit in the request."""

    errno = 7
    message = "REQUEST_TIMED_OUT"


class MessageSizeTooLargeError(BrokerResponseError):
    """The server has a configurable maximum message size to avoid unbounded memory allocation. This error is thrown if
    the client attempt to produce a message larger than this maximum.
    """

    errno = 10
    message = "MESSAGE_SIZE_TOO_LARGE"


class NetworkExceptionError(InvalidMetadataError, BrokerResponseError):
    """Network exception."""

    errno = 13
    message = "NETWORK_EXCEPTION"


class InvalidTopicError(BrokerResponseError):
    """For a request which attempts to access an invalid topic (e.g. one which has an illegal name), or if an attempt
    is made to write to an internal topic (such as the consumer offsets topic).
    """

    errno = 17
    message = "INVALID_TOPIC"


class RecordListTooLargeError(BrokerResponseError):
    """If a message batch in a produce request exceeds the maximum configured segment size."""

    errno = 18
    message = "RECORD_LIST_TOO_LARGE"


class NotEnoughReplicasError(RetriableError, BrokerResponseError):
    """Returned from a produce request when the number of in-sync replicas is lower than the configured minimum and
    requiredAcks is -1.
    """

    errno = 19
    message = "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(RetriableError, BrokerResponseError):
    """Returned from a produce request when the message was written to the log, but with fewer in-sync replicas than
    required.
    """

    errno = 20
    message = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class InvalidRequiredAcksError(BrokerResponseError):
    """Returned from a produce request if the requested requiredAcks is invalid (anything other than -1, 1, or 0)."""

    errno = 21
    message = "INVALID_REQUIRED_ACKS"


class TopicAuthorizationFailedError(AuthorizationError):
    """Returned by the broker when the client is not authorized to access the requested topic."""

    errno = 29
    message = "TOPIC_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(AuthorizationError):
    """Returned by the broker when the client is not authorized to use an inter-broker or administrative API."""

    errno = 31
    message = "CLUSTER_AUTHORIZATION_FAILED"


class InvalidTimestampError(BrokerResponseError):
    """The timestamp of the message is out of acceptable range."""

    errno = 32
    message = "INVALID_TIMESTAMP"


class UnsupportedSaslMechanismError(BrokerResponseError):
    """The broker does not support the requested SASL mechanism."""

    errno = 33
    message = "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslStateError(BrokerResponseError):
    """Request is not valid given the current SASL state."""

    errno = 34
    message = "ILLEGAL_SASL_STATE"


class UnsupportedVersionError(BrokerResponseError):
    """The version of API is not supported."""

    errno = 35
    message = "UNSUPPORTED_VERSION"


class UnsupportedForMessageFormatError(BrokerResponseError):
    """The message format version on the broker does not support this request."""

    errno = 43
    message = "UNSUPPORTED_FOR_MESSAGE_FORMAT"


class PolicyViolationError(BrokerResponseError):
    """Request parameters do not satisfy the configured policy."""

    errno = 44
    message = "POLICY_VIOLATION"


class OutOfOrderSequenceNumberError(BrokerResponseError):
    """The broker received an out of order sequence number."""

    errno = 45
    message = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class DuplicateSequenceNumberError(BrokerResponseError):
    """The broker received a duplicate sequence number."""

    errno = 46
    message = "DUPLICATE_SEQUENCE_NUMBER"


class InvalidProducerEpochError(BrokerResponseError):
    """Producer attempted to produce with an old epoch."""

    errno = 47
    message = "INVALID_PRODUCER_EPOCH"


class KafkaStorageError(InvalidMetadataError, BrokerResponseError):
    """Disk error when trying to access log file on the disk."""

    errno = 56
    message = "KAFKA_STORAGE_ERROR"


class SaslAuthenticationFailedError(BrokerResponseError):
    """SASL Authentication failed."""

    errno = 58
    message = "SASL_AUTHENTICATION_FAILED"


class UnknownProducerIdError(BrokerResponseError):
    """This exception is raised by the broker if it could not locate the producer metadata associated with the
    producerId in question. This could happen if, for instance, the producer's records were deleted because their
    retention time had elapsed. Once the last records of the producerId are removed, the producer's metadata is
    removed from the broker, and future appends by the producer will return this exception.
    """

    errno = 59
    message = "UNKNOWN_PRODUCER_ID"


class UnsupportedCompressionTypeError(BrokerResponseError):
    """The requesting client does not support the compression type of given partition."""

    errno = 76
    message = "UNSUPPORTED_COMPRESSION_TYPE"


class InvalidRecordError(BrokerResponseError):
    """This record has failed the validation on broker and hence will be rejected."""

    errno = 87
    message = "INVALID_RECORD"


class ThrottlingQuotaExceededError(RetriableError, BrokerResponseError):
    """The throttling quota has been exceeded."""

    errno = 89
    message = "THROTTLING_QUOTA_EXCEEDED"


class ProducerFencedError(BrokerResponseError):
    """There is a newer producer with the same transactionalId which fences the current one."""

    errno = 90
    message = "PRODUCER_FENCED"


def _broker_errors(cls: type[BrokerResponseError]) -> list[type[BrokerResponseError]]:
    return [cls, *(sub for direct in cls.__subclasses__() for sub in _broker_errors(direct))]


# kafka.errors.kafka_errors: the classes above by error code.
kafka_errors: dict[int, type[BrokerResponseError]] = {cls.errno: cls for cls in _broker_errors(BrokerResponseError)
                                                      if cls.errno is not None}


def for_code(error_code: int) -> type[BrokerResponseError]:
    """kafka.errors.for_code: the class of a broker's error code (one made on the spot for a code not above)."""
    cls = kafka_errors.get(error_code)
    if cls is None:
        cls = type("UnrecognizedBrokerError", (UnknownError,), {"errno": error_code})
    return cls


# The classes above stand in for kafka.errors' where kafka-python is not installed. Where it is, its own are used
# (its for_code and kafka_errors too, whose table has every code), so that the application's ``except
# kafka.errors.KafkaTimeoutError`` holds; the type checker sees the above, of the same names and hierarchy.
_OWN_ERRORS: dict[str, type[KafkaError]] = {name: cls for name, cls in list(globals().items())
                                             if isinstance(cls, type) and issubclass(cls, KafkaError)}
if not TYPE_CHECKING:
    with contextlib.suppress(ImportError):
        import kafka.errors

        globals().update({name: getattr(kafka.errors, name) for name in _OWN_ERRORS},
                         for_code=kafka.errors.for_code, kafka_errors=kafka.errors.kafka_errors)


# The class kafka-python raises for each of kafka-sidecar's errors that is not the broker's (the first that fits).
_LOCAL_ERRORS: tuple[tuple[type[errors.KafkaError], type[KafkaError]], ...] = (
    (errors.KafkaTimeoutError, KafkaTimeoutError),  # BufferExhaustedError too, as kafka-python's
    (errors.SidecarUnavailableError, KafkaTimeoutError),  # kafka-python times out waiting for the metadata
    (errors.RecordTooLargeError, MessageSizeTooLargeError),
    (errors.ProducerClosedError, IllegalStateError),
    (errors.NetworkError, KafkaConnectionError),
    (errors.ConfigError, KafkaConfigurationError),
)


def _error(exc: errors.KafkaError) -> KafkaError:
    """The error kafka-python would raise or report for an error of kafka-sidecar's."""
    if exc.code is not None:
        error: KafkaError = for_code(exc.code)(exc.message or exc.name)
    else:
        cls = next((cls for ours, cls in _LOCAL_ERRORS if isinstance(exc, ours)), KafkaError)
        error = cls(str(exc))
    error.__cause__ = exc
    return error


# -- kafka.serializer -----------------------------------------------------------------------------------------


class Serializer(ABC):
    """kafka.serializer.Serializer: turns a key or value into bytes."""

    @abstractmethod
    def serialize(self, topic: str, headers: list[tuple[str, bytes]], data: Any) -> Any:
        """The bytes of ``data``, a key or value for ``topic`` (bytes, bytearray, memoryview or None)."""

    def close(self) -> None:  # noqa: B027 (kafka-python's: a serializer need not have one)
        """Called when the producer closes."""


class DefaultSerializer(Serializer):
    """Bytes as they are, text encoded (in utf-8 unless told)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = encoding

    def serialize(self, topic: str, headers: list[tuple[str, bytes]], data: Any) -> Any:
        if data is None or isinstance(data, (bytes, bytearray, memoryview)):
            return data
        return data.encode(self.encoding)


class JsonSerializer(DefaultSerializer):
    """Values as JSON text (None stays None)."""

    def serialize(self, topic: str, headers: list[tuple[str, bytes]], data: Any) -> Any:
        if data is None:
            return None
        return super().serialize(topic, headers, json.dumps(data))


_SerializeFunction = Callable[[str, list[tuple[str, bytes]], Any], Any]


def _serializer(serializer: object, what: str) -> _SerializeFunction | None:
    """A serializer as kafka-python takes it (duck-typed, as it does), as one function of (topic, headers, data):
    a callable is given the data; an object's serialize() (a kafka.serializer.Serializer's) the topic, headers
    and data, or the topic and data if that is its signature (kafka-python 2's)."""
    if serializer is None:
        return None
    if callable(serializer):
        return lambda topic, headers, data: serializer(data)
    serialize = getattr(serializer, "serialize", None)
    if not callable(serialize):
        raise TypeError(f"{what} must be callable or have serialize(topic, headers, data), "
                        f"not {type(serializer).__name__}")
    try:
        inspect.signature(serialize).bind("topic", [], None)
    except TypeError:
        return lambda topic, headers, data: serialize(topic, data)
    return serialize  # type: ignore[no-any-return]


# -- kafka.producer.future ------------------------------------------------------------------------------------


class TopicPartition(NamedTuple):
    """kafka.structs.TopicPartition."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """kafka-python's RecordMetadata: where a record landed (``checksum`` is None, as for any record of Kafka's v2
    format; a size is -1 where there was nothing)."""

    topic: str
    partition: int
    topic_partition: TopicPartition
    offset: int
    timestamp: int
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class FutureRecordMetadata:
    """kafka-python's FutureRecordMetadata: the outcome of one send(), a :class:`RecordMetadata` or an error.

    Callbacks and errbacks run once it is done, on the client's I/O thread (at once, on the calling thread, if it
    is done already); one that raises is logged.
    """

    def __init__(self, future: Future[_SidecarRecordMetadata], serialized_header_size: int) -> None:
        self._future = future
        self._header_size = serialized_header_size
        self._value: RecordMetadata | None = None
        self._exception: KafkaError | None = None

    @property
    def is_done(self) -> bool:
        """Whether the record is delivered or failed."""
        return self._future.done()

    @property
    def value(self) -> RecordMetadata | None:
        """The record's metadata once delivered, else None."""
        if self._value is None and self.succeeded():
            ours = self._future.result()
            self._value = RecordMetadata(ours.topic, ours.partition, TopicPartition(ours.topic, ours.partition),
                                         ours.offset, ours.timestamp_ms, None, ours.serialized_key_size,
                                         ours.serialized_value_size, self._header_size)
        return self._value

    @property
    def exception(self) -> KafkaError | None:
        """Why the record failed (kafka-python's error class), else None."""
        if self._exception is None and self._future.done():
            cause = self._future.exception()
            if cause is not None:
                ours = cause if isinstance(cause, errors.KafkaError) else errors.KafkaError(str(cause))
                self._exception = _error(ours)
        return self._exception

    def succeeded(self) -> bool:
        """Whether the record was delivered."""
        return self._future.done() and self._future.exception() is None

    def failed(self) -> bool:
        """Whether the record failed."""
        return self._future.done() and self._future.exception() is not None

    def retriable(self) -> bool:
        """Whether the record failed with an error that may pass if it is sent again."""
        return isinstance(self.exception, RetriableError)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for the outcome: the RecordMetadata, or the
        error raised; KafkaTimeoutError if it does not come in time."""
        try:
            self._future.exception(timeout)
        except TimeoutError:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.") from None
        error = self.exception
        if error is not None:
            raise error
        value = self.value
        assert value is not None
        return value

    def add_callback(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``f(*args, value, **kwargs)`` once the record is delivered."""
        self._future.add_done_callback(functools.partial(self._done, functools.partial(f, *args, **kwargs), False))
        return self

    def add_errback(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``f(*args, exception, **kwargs)`` if the record fails."""
        self._future.add_done_callback(functools.partial(self._done, functools.partial(f, *args, **kwargs), True))
        return self

    def add_both(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``f(*args, value or exception, **kwargs)`` whatever the outcome."""
        return self.add_callback(f, *args, **kwargs).add_errback(f, *args, **kwargs)

    def _done(self, f: Callable[[Any], Any], errback: bool, _: Future[_SidecarRecordMetadata]) -> None:
        if self.failed() != errback:
            return
        try:
            f(self.exception if errback else self.value)
        except Exception:
            log.exception("Error processing %s", "errback" if errback else "callback")


# -- kafka.KafkaProducer ----------------------------------------------------------------------------------------

# kafka-python's names of the daemon's settings, by the daemon's (Kafka's) name: accepted, and checked against
# the daemon's.
_DAEMON_OWNED: dict[str, str] = {
    "acks": "acks",
    "compression_type": "compression.type",
    "enable_idempotence": "enable.idempotence",
    "retries": "retries",
    "delivery_timeout_ms": "delivery.timeout.ms",
    "request_timeout_ms": "request.timeout.ms",
    "batch_size": "batch.size",
    "max_request_size": "max.request.size",
    "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection",
    "retry_backoff_ms": "retry.backoff.ms",
    "allow_auto_create_topics": "allow.auto.create.topics",
}

# Those that mean here what they mean to kafka-python, and kafka-sidecar's own.
_HONOURED = frozenset({"sidecar_endpoint", "client_id", "key_serializer", "value_serializer", "linger_ms",
                       "max_block_ms"})

# Those that would change what the producer does in a way it cannot (refused unless None).
_REFUSED = frozenset({"transactional_id", "partitioner"})

# kafka-python's other settings (KafkaProducer.DEFAULT_CONFIG of 2.0 to 3.0): accepted, with no meaning here
# (docs/migration/kafka-python.md lists them).
_IGNORED = frozenset({
    "bootstrap_servers", "transaction_timeout_ms", "connections_max_idle_ms", "metadata_max_age_ms",
    "client_dns_lookup", "receive_message_max_bytes", "receive_buffer_bytes", "send_buffer_bytes", "socket_options",
    "reconnect_backoff_ms", "reconnect_backoff_max_ms", "security_protocol", "ssl_context", "ssl_check_hostname",
    "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile", "ssl_password", "ssl_ciphers", "api_version",
    "api_version_auto_timeout_ms", "bootstrap_timeout_ms", "bootstrap_topics_filter", "metric_reporters",
    "metrics_enabled", "metrics_num_samples", "metrics_sample_window_ms", "selector", "sasl_mechanism",
    "sasl_plain_username", "sasl_plain_password", "sasl_kerberos_name", "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name", "sasl_oauth_token_provider", "proxy_url", "socks5_proxy", "kafka_client",
    "buffer_memory", "sock_chunk_bytes", "sock_chunk_buffer_count"})


def _close_at_exit(producer: weakref.ref[KafkaProducer]) -> None:
    alive = producer()
    if alive is not None:
        alive.close(timeout=1)


class KafkaProducer:
    """kafka-python's KafkaProducer on the kafka-sidecar daemon (see the module's docstring).

    ``key_serializer`` and ``value_serializer``: a :class:`Serializer` or a callable. ``linger_ms`` and
    ``max_block_ms`` default to the daemon's linger.ms and max.block.ms.
    """

    def __init__(self, **configs: Any) -> None:
        self._closed = True  # till it is made
        unknown = {name: value for name, value in configs.items()
                   if name not in _HONOURED | _IGNORED | _REFUSED | _DAEMON_OWNED.keys()}
        if unknown:
            raise ValueError(f"Unrecognized configs: {unknown}")
        for name in _REFUSED:
            if configs.get(name) is not None:
                raise KafkaConfigurationError(f"{name} is not supported by kafka-sidecar: its producer is not "
                                              "transactional, and partitions records as kafka-python's default "
                                              "partitioner does (murmur2 of the key)")
        self._check = SettingsCheck({kafka_name: (name, configs[name]) for name, kafka_name in _DAEMON_OWNED.items()
                                     if name in configs})
        self._serializers = (configs.get("key_serializer"), configs.get("value_serializer"))
        self._serialize_key = _serializer(configs.get("key_serializer"), "key_serializer")
        self._serialize_value = _serializer(configs.get("value_serializer"), "value_serializer")
        try:
            linger_ms, max_block_ms = (None if configs.get(name) is None else whole_ms(configs[name])
                                       for name in ("linger_ms", "max_block_ms"))
        except (TypeError, ValueError, OverflowError) as exc:
            raise KafkaConfigurationError(f"linger_ms and max_block_ms are numbers of milliseconds: {exc}") from None
        self._producer = _SidecarProducer(configs.get("sidecar_endpoint"), linger_ms=linger_ms,
                                          max_block_ms=max_block_ms, partitioner="murmur2_random",
                                          client_name=configs.get("client_id"))
        self._closed = False
        self._cleanup = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._cleanup)

    def send(self, topic: str, value: Any = None, key: Any = None, headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Hand a record over (serialized by the producer's serializers); its future's value is its RecordMetadata.

        Blocks up to max_block_ms for the daemon, the topic's metadata and memory: KafkaTimeoutError then.
        MessageSizeTooLargeError past max.request.size, IllegalStateError once closed, ValueError without key
        and value, or for a partition the topic does not have.
        """
        if self._closed:
            raise IllegalStateError("KafkaProducer already closed!")
        if value is None and key is None:
            raise ValueError("Need at least one: key or value")
        header_list = headers or []
        key_bytes = key if self._serialize_key is None else self._serialize_key(topic, header_list, key)
        value_bytes = value if self._serialize_value is None else self._serialize_value(topic, header_list, value)
        header_size = sum(len(name.encode("utf-8")) + len(data or b"") for name, data in headers) if headers else -1
        try:
            future = self._producer.send(topic, value_bytes, key_bytes, partition=partition, timestamp_ms=timestamp_ms,
                                         headers=headers)
        except errors.KafkaError as exc:
            if exc.code is None or exc.retriable:
                raise _error(exc) from None
            # The cluster's final error on the topic (TOPIC_AUTHORIZATION_FAILED...): a failed future, as
            # kafka-python's.
            future = Future()
            future.set_exception(exc)
        self._check.check(self._producer.daemon_settings)
        return FutureRecordMetadata(future, header_size)

    def flush(self, timeout: float | None = None) -> None:
        """Send every record now and wait up to ``timeout`` seconds (None: as long as it takes) for their outcomes;
        KafkaTimeoutError if some are still waiting then."""
        try:
            waiting = self._producer.flush(timeout)
        except errors.KafkaError as exc:
            raise _error(exc) from None
        if waiting:
            raise KafkaTimeoutError(f"Timeout waiting for {waiting} records after {timeout} secs.")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), end the session with the daemon, close the serializers. Records not
        delivered by then fail with IllegalStateError. From a callback (the I/O thread) the timeout is 0, as
        kafka-python's on its sender thread: waiting there would wait for the thread itself."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._cleanup)
        close_producer(self._producer, timeout)
        for serializer in self._serializers:
            close = getattr(serializer, "close", None)
            if callable(close):  # kafka-python's: a serializer need not have one
                close()

    def partitions_for(self, topic: str) -> set[int]:
        """The topic's partitions, waiting up to max_block_ms for its metadata (KafkaTimeoutError then)."""
        try:
            return set(self._producer.partitions_for(topic))
        except errors.KafkaError as exc:
            raise _error(exc) from None

    def metrics(self) -> dict[str, dict[str, float]]:
        """This producer's metrics by group, as kafka-python's: ``producer-metrics``, whose names are Kafka's
        (record-send-total, record-error-total...). The daemon's, for the whole host: ``kafka-sidecar stats``."""
        return {"producer-metrics": self._producer.metrics()}

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # As kafka-python's: a producer nobody closed sends what it holds before it goes.
        try:
            self.close(timeout=1)
        except Exception:
            log.debug("closing a KafkaProducer that was garbage-collected failed", exc_info=True)
