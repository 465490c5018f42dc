"""Errors raised by kafka-sidecar, and Kafka's error code table.

Every broker error code maps to one exception class. The classes form families
that mirror the Java client's exception hierarchy, so that applications can catch
what they care about (``RetriableError``, ``AuthorizationError``, ...) while each
instance still carries the exact Kafka error name and code.

The table lives in the client stub because both sides need it: the daemon decides
with it what to retry, and the client turns the codes in delivery reports back
into exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class KafkaError(Exception):
    """Base class of every error kafka-sidecar raises or reports.

    ``code`` is the Kafka error code (None for errors that are not the broker's),
    ``name`` its Kafka name and ``retriable`` whether retrying may succeed.
    """

    def __init__(self, message: str = "", *, code: int | None = None, name: str | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.name = name or type(self).__name__
        self.retriable = self._default_retriable if retriable is None else retriable

    _default_retriable = False

    def __str__(self) -> str:
        if self.code is None:
            return self.message or self.name
        if self.message:
            return f"{self.name} ({self.code}): {self.message}"
        return f"{self.name} ({self.code})"

    def __reduce__(self) -> tuple[Callable[..., KafkaError], tuple[object, ...]]:
        # Keep the keyword-only attributes when errors cross process boundaries.
        return (_rebuild_error, (type(self), self.message, self.code, self.name, self.retriable))


def _rebuild_error(cls: type[KafkaError], message: str, code: int | None, name: str,
                   retriable: bool) -> KafkaError:
    err = cls.__new__(cls)
    KafkaError.__init__(err, message, code=code, name=name, retriable=retriable)
    return err


class RetriableError(KafkaError):
    """A transient condition: the same request may succeed later."""

    _default_retriable = True


class InvalidMetadataError(RetriableError):
    """The client's metadata is stale (leader moved, topic unknown): refresh and retry."""


class KafkaTimeoutError(RetriableError):
    """Something did not happen in time: a request, a delivery, a metadata wait."""


class NetworkError(RetriableError):
    """The connection to a broker failed or was closed."""


class BufferExhaustedError(KafkaTimeoutError):
    """No room in the BufferPool within max_block_ms."""


class SidecarUnavailableError(KafkaError):
    """No sender daemon answered at the endpoint."""


class ProducerClosedError(KafkaError):
    """The producer (the client's, or the daemon's on shutdown) closed before the record was delivered."""


class RecordTooLargeError(KafkaError):
    """A record or batch is larger than the broker or the producer accepts."""


class InvalidRecordError(KafkaError):
    """The broker refused the records themselves (corrupt, invalid, bad timestamp)."""


class AuthorizationError(KafkaError):
    """The principal is not allowed to do this."""


class AuthenticationError(KafkaError):
    """SASL or TLS authentication failed."""


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake with a broker failed: its certificate is not trusted or not for its name, or the two
    sides share no protocol version or cipher."""


class ProducerStateError(KafkaError):
    """Idempotence or transaction state the broker does not accept (sequence, epoch, id)."""


class UnsupportedError(KafkaError):
    """The broker does not support a version, codec or feature the request needs."""


class InvalidRequestError(KafkaError):
    """The broker refused the request as malformed or against its policy."""


class ConfigError(KafkaError, ValueError):
    """A setting has a value that is not allowed or contradicts another."""


class BrokerError(KafkaError):
    """Any other broker-side error."""


@dataclass(frozen=True, slots=True)
class ErrorCode:
    """One row of Kafka's error table."""

    code: int
    name: str
    retriable: bool
    invalid_metadata: bool
    exception: type[KafkaError]
    description: str = ""


def _table() -> dict[int, ErrorCode]:
    R, M = True, True
    rows: list[tuple[int, str, bool, bool, type[KafkaError]]] = [
        # code, name, retriable, stale metadata, family
        (-1, "UNKNOWN_SERVER_ERROR", False, False, BrokerError),
        (0, "NONE", False, False, KafkaError),
        (1, "OFFSET_OUT_OF_RANGE", False, False, BrokerError),
        (2, "CORRUPT_MESSAGE", R, False, InvalidRecordError),
        (3, "UNKNOWN_TOPIC_OR_PARTITION", R, M, InvalidMetadataError),
        (4, "INVALID_FETCH_SIZE", False, False, InvalidRequestError),
        (5, "LEADER_NOT_AVAILABLE", R, M, InvalidMetadataError),
        (6, "NOT_LEADER_OR_FOLLOWER", R, M, InvalidMetadataError),
        (7, "REQUEST_TIMED_OUT", R, False, KafkaTimeoutError),
        (8, "BROKER_NOT_AVAILABLE", False, False, BrokerError),
        (9, "REPLICA_NOT_AVAILABLE", R, M, InvalidMetadataError),
        (10, "MESSAGE_TOO_LARGE", False, False, RecordTooLargeError),
        (11, "STALE_CONTROLLER_EPOCH", False, False, BrokerError),
        (12, "OFFSET_METADATA_TOO_LARGE", False, False, InvalidRequestError),
        (13, "NETWORK_EXCEPTION", R, M, NetworkError),
        (14, "COORDINATOR_LOAD_IN_PROGRESS", R, False, RetriableError),
        (15, "COORDINATOR_NOT_AVAILABLE", R, False, RetriableError),
        (16, "NOT_COORDINATOR", R, False, RetriableError),
        (17, "INVALID_TOPIC_EXCEPTION", False, False, InvalidRequestError),
        (18, "RECORD_LIST_TOO_LARGE", False, False, RecordTooLargeError),
        (19, "NOT_ENOUGH_REPLICAS", R, False, RetriableError),
        (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", R, False, RetriableError),
        (21, "INVALID_REQUIRED_ACKS", False, False, InvalidRequestError),
        (22, "ILLEGAL_GENERATION", False, False, BrokerError),
        (23, "INCONSISTENT_GROUP_PROTOCOL", False, False, BrokerError),
        (24, "INVALID_GROUP_ID", False, False, BrokerError),
        (25, "UNKNOWN_MEMBER_ID", False, False, BrokerError),
        (26, "INVALID_SESSION_TIMEOUT", False, False, BrokerError),
        (27, "REBALANCE_IN_PROGRESS", False, False, BrokerError),
        (28, "INVALID_COMMIT_OFFSET_SIZE", False, False, BrokerError),
        (29, "TOPIC_AUTHORIZATION_FAILED", False, False, AuthorizationError),
        (30, "GROUP_AUTHORIZATION_FAILED", False, False, AuthorizationError),
        (31, "CLUSTER_AUTHORIZATION_FAILED", False, False, AuthorizationError),
        (32, "INVALID_TIMESTAMP", False, False, InvalidRecordError),
        (33, "UNSUPPORTED_SASL_MECHANISM", False, False, AuthenticationError),
        (34, "ILLEGAL_SASL_STATE", False, False, AuthenticationError),
        (35, "UNSUPPORTED_VERSION", False, False, UnsupportedError),
        (36, "TOPIC_ALREADY_EXISTS", False, False, InvalidRequestError),
        (37, "INVALID_PARTITIONS", False, False, InvalidRequestError),
        (38, "INVALID_REPLICATION_FACTOR", False, False, InvalidRequestError),
        (39, "INVALID_REPLICA_ASSIGNMENT", False, False, InvalidRequestError),
        (40, "INVALID_CONFIG", False, False, InvalidRequestError),
        (41, "NOT_CONTROLLER", R, False, RetriableError),
        (42, "INVALID_REQUEST", False, False, InvalidRequestError),
        (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", False, False, UnsupportedError),
        (44, "POLICY_VIOLATION", False, False, InvalidRequestError),
        (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False, False, ProducerStateError),
        (46, "DUPLICATE_SEQUENCE_NUMBER", False, False, ProducerStateError),
        (47, "INVALID_PRODUCER_EPOCH", False, False, ProducerStateError),
        (48, "INVALID_TXN_STATE", False, False, ProducerStateError),
        (49, "INVALID_PRODUCER_ID_MAPPING", False, False, ProducerStateError),
        (50, "INVALID_TRANSACTION_TIMEOUT", False, False, ProducerStateError),
        (51, "CONCURRENT_TRANSACTIONS", R, False, RetriableError),
        (52, "TRANSACTION_COORDINATOR_FENCED", False, False, ProducerStateError),
        (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", False, False, AuthorizationError),
        (54, "SECURITY_DISABLED", False, False, AuthenticationError),
        (55, "OPERATION_NOT_ATTEMPTED", False, False, BrokerError),
        (56, "KAFKA_STORAGE_ERROR", R, M, InvalidMetadataError),
        (57, "LOG_DIR_NOT_FOUND", False, False, BrokerError),
        (58, "SASL_AUTHENTICATION_FAILED", False, False, AuthenticationError),
        (59, "UNKNOWN_PRODUCER_ID", False, False, ProducerStateError),
        (60, "REASSIGNMENT_IN_PROGRESS", False, False, BrokerError),
        (61, "DELEGATION_TOKEN_AUTH_DISABLED", False, False, AuthenticationError),
        (62, "DELEGATION_TOKEN_NOT_FOUND", False, False, AuthenticationError),
        (63, "DELEGATION_TOKEN_OWNER_MISMATCH", False, False, AuthenticationError),
        (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", False, False, AuthenticationError),
        (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", False, False, AuthorizationError),
        (66, "DELEGATION_TOKEN_EXPIRED", False, False, AuthenticationError),
        (67, "INVALID_PRINCIPAL_TYPE", False, False, InvalidRequestError),
        (68, "NON_EMPTY_GROUP", False, False, BrokerError),
        (69, "GROUP_ID_NOT_FOUND", False, False, BrokerError),
        (70, "FETCH_SESSION_ID_NOT_FOUND", R, False, RetriableError),
        (71, "INVALID_FETCH_SESSION_EPOCH", R, False, RetriableError),
        (72, "LISTENER_NOT_FOUND", R, M, InvalidMetadataError),
        (73, "TOPIC_DELETION_DISABLED", False, False, BrokerError),
        (74, "FENCED_LEADER_EPOCH", R, M, InvalidMetadataError),
        (75, "UNKNOWN_LEADER_EPOCH", R, False, RetriableError),
        (76, "UNSUPPORTED_COMPRESSION_TYPE", False, False, UnsupportedError),
        (77, "STALE_BROKER_EPOCH", False, False, BrokerError),
        (78, "OFFSET_NOT_AVAILABLE", R, False, RetriableError),
        (79, "MEMBER_ID_REQUIRED", False, False, BrokerError),
        (80, "PREFERRED_LEADER_NOT_AVAILABLE", R, M, InvalidMetadataError),
        (81, "GROUP_MAX_SIZE_REACHED", False, False, BrokerError),
        (82, "FENCED_INSTANCE_ID", False, False, BrokerError),
        (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", R, M, InvalidMetadataError),
        (84, "ELECTION_NOT_NEEDED", R, M, InvalidMetadataError),
        (85, "NO_REASSIGNMENT_IN_PROGRESS", False, False, BrokerError),
        (86, "GROUP_SUBSCRIBED_TO_TOPIC", False, False, BrokerError),
        (87, "INVALID_RECORD", False, False, InvalidRecordError),
        (88, "UNSTABLE_OFFSET_COMMIT", R, False, RetriableError),
        (89, "THROTTLING_QUOTA_EXCEEDED", R, False, RetriableError),
        (90, "PRODUCER_FENCED", False, False, ProducerStateError),
        (91, "RESOURCE_NOT_FOUND", False, False, BrokerError),
        (92, "DUPLICATE_RESOURCE", False, False, BrokerError),
        (93, "UNACCEPTABLE_CREDENTIAL", False, False, AuthenticationError),
        (94, "INCONSISTENT_VOTER_SET", False, False, BrokerError),
        (95, "INVALID_UPDATE_VERSION", False, False, BrokerError),
        (96, "FEATURE_UPDATE_FAILED", False, False, BrokerError),
        (97, "PRINCIPAL_DESERIALIZATION_FAILURE", False, False, BrokerError),
        (98, "SNAPSHOT_NOT_FOUND", False, False, BrokerError),
        (99, "POSITION_OUT_OF_RANGE", False, False, BrokerError),
        (100, "UNKNOWN_TOPIC_ID", R, M, InvalidMetadataError),
        (101, "DUPLICATE_BROKER_REGISTRATION", False, False, BrokerError),
        (102, "BROKER_ID_NOT_REGISTERED", False, False, BrokerError),
        (103, "INCONSISTENT_TOPIC_ID", R, M, InvalidMetadataError),
        (104, "INCONSISTENT_CLUSTER_ID", False, False, BrokerError),
        (105, "TRANSACTIONAL_ID_NOT_FOUND", False, False, ProducerStateError),
        (106, "FETCH_SESSION_TOPIC_ID_ERROR", R, False, RetriableError),
        (107, "INELIGIBLE_REPLICA", False, False, BrokerError),
        (108, "NEW_LEADER_ELECTED", False, False, BrokerError),
        (109, "OFFSET_MOVED_TO_TIERED_STORAGE", False, False, BrokerError),
        (110, "FENCED_MEMBER_EPOCH", False, False, BrokerError),
        (111, "UNRELEASED_INSTANCE_ID", False, False, BrokerError),
        (112, "UNSUPPORTED_ASSIGNOR", False, False, BrokerError),
        (113, "STALE_MEMBER_EPOCH", False, False, BrokerError),
        (114, "MISMATCHED_ENDPOINT_TYPE", False, False, BrokerError),
        (115, "UNSUPPORTED_ENDPOINT_TYPE", False, False, UnsupportedError),
        (116, "UNKNOWN_CONTROLLER_ID", False, False, BrokerError),
        (117, "UNKNOWN_SUBSCRIPTION_ID", False, False, BrokerError),
        (118, "TELEMETRY_TOO_LARGE", False, False, BrokerError),
        (119, "INVALID_REGISTRATION", False, False, BrokerError),
        (120, "TRANSACTION_ABORTABLE", False, False, ProducerStateError),
        (121, "INVALID_RECORD_STATE", False, False, BrokerError),
        (122, "SHARE_SESSION_NOT_FOUND", R, False, RetriableError),
        (123, "INVALID_SHARE_SESSION_EPOCH", R, False, RetriableError),
        (124, "FENCED_STATE_EPOCH", False, False, BrokerError),
        (125, "INVALID_VOTER_KEY", False, False, BrokerError),
        (126, "DUPLICATE_VOTER", False, False, BrokerError),
        (127, "VOTER_NOT_FOUND", False, False, BrokerError),
        (128, "INVALID_REGULAR_EXPRESSION", False, False, InvalidRequestError),
        (129, "REBOOTSTRAP_REQUIRED", False, False, BrokerError),
        (130, "STREAMS_INVALID_TOPOLOGY", False, False, BrokerError),
        (131, "STREAMS_INVALID_TOPOLOGY_EPOCH", False, False, BrokerError),
        (132, "STREAMS_TOPOLOGY_FENCED", False, False, BrokerError),
        (133, "SHARE_SESSION_LIMIT_REACHED", R, False, RetriableError),
    ]
    return {code: ErrorCode(code, name, retriable, stale, exc) for code, name, retriable, stale, exc in rows}


ERROR_CODES: dict[int, ErrorCode] = _table()
ERRORS_BY_NAME: dict[str, ErrorCode] = {e.name: e for e in ERROR_CODES.values()}

NONE = 0


def error_code(code: int) -> ErrorCode:
    """The table row of ``code``; an unknown code is a non-retriable broker error."""
    row = ERROR_CODES.get(code)
    if row is None:
        return ErrorCode(code, f"UNKNOWN_ERROR_CODE_{code}", False, False, BrokerError)
    return row


def for_code(code: int, message: str | None = None) -> KafkaError:
    """The exception for a Kafka error code, carrying the broker's message if any."""
    row = error_code(code)
    return row.exception(message or "", code=code, name=row.name, retriable=row.retriable)
