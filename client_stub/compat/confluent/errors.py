"""confluent-kafka's errors: KafkaError (librdkafka's error codes, names and descriptions) and KafkaException,
confluent-kafka's own classes where it is installed; the KafkaError reported for each error of kafka-sidecar's."""

from __future__ import annotations

import builtins
import contextlib
from typing import TYPE_CHECKING, ClassVar

from ... import errors

__all__ = ["DESCRIPTIONS", "KafkaError", "KafkaException", "as_kafka_error", "invalid_arg", "unexpected_error"]


class KafkaError:
    """confluent_kafka.KafkaError: one of librdkafka's error codes, with its name, a reason and flags.

    Compares equal to its code (``err == KafkaError._MSG_TIMED_OUT``) and to another KafkaError of that code.
    """

    # librdkafka's error codes (rd_kafka_resp_err_t, from its src/rdkafka.h): the local ones below 0, the
    # broker's as Kafka numbers them.
    _BAD_MSG: ClassVar[int] = -199
    _BAD_COMPRESSION: ClassVar[int] = -198
    _DESTROY: ClassVar[int] = -197
    _FAIL: ClassVar[int] = -196
    _TRANSPORT: ClassVar[int] = -195
    _CRIT_SYS_RESOURCE: ClassVar[int] = -194
    _RESOLVE: ClassVar[int] = -193
    _MSG_TIMED_OUT: ClassVar[int] = -192
    _PARTITION_EOF: ClassVar[int] = -191
    _UNKNOWN_PARTITION: ClassVar[int] = -190
    _FS: ClassVar[int] = -189
    _UNKNOWN_TOPIC: ClassVar[int] = -188
    _ALL_BROKERS_DOWN: ClassVar[int] = -187
    _INVALID_ARG: ClassVar[int] = -186
    _TIMED_OUT: ClassVar[int] = -185
    _QUEUE_FULL: ClassVar[int] = -184
    _ISR_INSUFF: ClassVar[int] = -183
    _NODE_UPDATE: ClassVar[int] = -182
    _SSL: ClassVar[int] = -181
    _WAIT_COORD: ClassVar[int] = -180
    _UNKNOWN_GROUP: ClassVar[int] = -179
    _IN_PROGRESS: ClassVar[int] = -178
    _PREV_IN_PROGRESS: ClassVar[int] = -177
    _EXISTING_SUBSCRIPTION: ClassVar[int] = -176
    _ASSIGN_PARTITIONS: ClassVar[int] = -175
    _REVOKE_PARTITIONS: ClassVar[int] = -174
    _CONFLICT: ClassVar[int] = -173
    _STATE: ClassVar[int] = -172
    _UNKNOWN_PROTOCOL: ClassVar[int] = -171
    _NOT_IMPLEMENTED: ClassVar[int] = -170
    _AUTHENTICATION: ClassVar[int] = -169
    _NO_OFFSET: ClassVar[int] = -168
    _OUTDATED: ClassVar[int] = -167
    _TIMED_OUT_QUEUE: ClassVar[int] = -166
    _UNSUPPORTED_FEATURE: ClassVar[int] = -165
    _WAIT_CACHE: ClassVar[int] = -164
    _INTR: ClassVar[int] = -163
    _KEY_SERIALIZATION: ClassVar[int] = -162
    _VALUE_SERIALIZATION: ClassVar[int] = -161
    _KEY_DESERIALIZATION: ClassVar[int] = -160
    _VALUE_DESERIALIZATION: ClassVar[int] = -159
    _PARTIAL: ClassVar[int] = -158
    _READ_ONLY: ClassVar[int] = -157
    _NOENT: ClassVar[int] = -156
    _UNDERFLOW: ClassVar[int] = -155
    _INVALID_TYPE: ClassVar[int] = -154
    _RETRY: ClassVar[int] = -153
    _PURGE_QUEUE: ClassVar[int] = -152
    _PURGE_INFLIGHT: ClassVar[int] = -151
    _FATAL: ClassVar[int] = -150
    _INCONSISTENT: ClassVar[int] = -149
    _GAPLESS_GUARANTEE: ClassVar[int] = -148
    _MAX_POLL_EXCEEDED: ClassVar[int] = -147
    _UNKNOWN_BROKER: ClassVar[int] = -146
    _NOT_CONFIGURED: ClassVar[int] = -145
    _FENCED: ClassVar[int] = -144
    _APPLICATION: ClassVar[int] = -143
    _ASSIGNMENT_LOST: ClassVar[int] = -142
    _NOOP: ClassVar[int] = -141
    _AUTO_OFFSET_RESET: ClassVar[int] = -140
    _LOG_TRUNCATION: ClassVar[int] = -139
    _INVALID_DIFFERENT_RECORD: ClassVar[int] = -138
    _DESTROY_BROKER: ClassVar[int] = -137
    UNKNOWN: ClassVar[int] = -1
    NO_ERROR: ClassVar[int] = 0
    OFFSET_OUT_OF_RANGE: ClassVar[int] = 1
    INVALID_MSG: ClassVar[int] = 2
    UNKNOWN_TOPIC_OR_PART: ClassVar[int] = 3
    INVALID_MSG_SIZE: ClassVar[int] = 4
    LEADER_NOT_AVAILABLE: ClassVar[int] = 5
    NOT_LEADER_FOR_PARTITION: ClassVar[int] = 6
    REQUEST_TIMED_OUT: ClassVar[int] = 7
    BROKER_NOT_AVAILABLE: ClassVar[int] = 8
    REPLICA_NOT_AVAILABLE: ClassVar[int] = 9
    MSG_SIZE_TOO_LARGE: ClassVar[int] = 10
    STALE_CTRL_EPOCH: ClassVar[int] = 11
    OFFSET_METADATA_TOO_LARGE: ClassVar[int] = 12
    NETWORK_EXCEPTION: ClassVar[int] = 13
    COORDINATOR_LOAD_IN_PROGRESS: ClassVar[int] = 14
    COORDINATOR_NOT_AVAILABLE: ClassVar[int] = 15
    NOT_COORDINATOR: ClassVar[int] = 16
    TOPIC_EXCEPTION: ClassVar[int] = 17
    RECORD_LIST_TOO_LARGE: ClassVar[int] = 18
    NOT_ENOUGH_REPLICAS: ClassVar[int] = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: ClassVar[int] = 20
    INVALID_REQUIRED_ACKS: ClassVar[int] = 21
    ILLEGAL_GENERATION: ClassVar[int] = 22
    INCONSISTENT_GROUP_PROTOCOL: ClassVar[int] = 23
    INVALID_GROUP_ID: ClassVar[int] = 24
    UNKNOWN_MEMBER_ID: ClassVar[int] = 25
    INVALID_SESSION_TIMEOUT: ClassVar[int] = 26
    REBALANCE_IN_PROGRESS: ClassVar[int] = 27
    INVALID_COMMIT_OFFSET_SIZE: ClassVar[int] = 28
    TOPIC_AUTHORIZATION_FAILED: ClassVar[int] = 29
    GROUP_AUTHORIZATION_FAILED: ClassVar[int] = 30
    CLUSTER_AUTHORIZATION_FAILED: ClassVar[int] = 31
    INVALID_TIMESTAMP: ClassVar[int] = 32
    UNSUPPORTED_SASL_MECHANISM: ClassVar[int] = 33
    ILLEGAL_SASL_STATE: ClassVar[int] = 34
    UNSUPPORTED_VERSION: ClassVar[int] = 35
    TOPIC_ALREADY_EXISTS: ClassVar[int] = 36
    INVALID_PARTITIONS: ClassVar[int] = 37
    INVALID_REPLICATION_FACTOR: ClassVar[int] = 38
    INVALID_REPLICA_ASSIGNMENT: ClassVar[int] = 39
    INVALID_CONFIG: ClassVar[int] = 40
    NOT_CONTROLLER: ClassVar[int] = 41
    INVALID_REQUEST: ClassVar[int] = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT: ClassVar[int] = 43
    POLICY_VIOLATION: ClassVar[int] = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER: ClassVar[int] = 45
    DUPLICATE_SEQUENCE_NUMBER: ClassVar[int] = 46
    INVALID_PRODUCER_EPOCH: ClassVar[int] = 47
    INVALID_TXN_STATE: ClassVar[int] = 48
    INVALID_PRODUCER_ID_MAPPING: ClassVar[int] = 49
    INVALID_TRANSACTION_TIMEOUT: ClassVar[int] = 50
    CONCURRENT_TRANSACTIONS: ClassVar[int] = 51
    TRANSACTION_COORDINATOR_FENCED: ClassVar[int] = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ClassVar[int] = 53
    SECURITY_DISABLED: ClassVar[int] = 54
    OPERATION_NOT_ATTEMPTED: ClassVar[int] = 55
    KAFKA_STORAGE_ERROR: ClassVar[int] = 56
    LOG_DIR_NOT_FOUND: ClassVar[int] = 57
    SASL_AUTHENTICATION_FAILED: ClassVar[int] = 58
    UNKNOWN_PRODUCER_ID: ClassVar[int] = 59
    REASSIGNMENT_IN_PROGRESS: ClassVar[int] = 60
    DELEGATION_TOKEN_AUTH_DISABLED: ClassVar[int] = 61
    DELEGATION_TOKEN_NOT_FOUND: ClassVar[int] = 62
    DELEGATION_TOKEN_OWNER_MISMATCH: ClassVar[int] = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED: ClassVar[int] = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED: ClassVar[int] = 65
    DELEGATION_TOKEN_EXPIRED: ClassVar[int] = 66
    INVALID_PRINCIPAL_TYPE: ClassVar[int] = 67
    NON_EMPTY_GROUP: ClassVar[int] = 68
    GROUP_ID_NOT_FOUND: ClassVar[int] = 69
    FETCH_SESSION_ID_NOT_FOUND: ClassVar[int] = 70
    INVALID_FETCH_SESSION_EPOCH: ClassVar[int] = 71
    LISTENER_NOT_FOUND: ClassVar[int] = 72
    TOPIC_DELETION_DISABLED: ClassVar[int] = 73
    FENCED_LEADER_EPOCH: ClassVar[int] = 74
    UNKNOWN_LEADER_EPOCH: ClassVar[int] = 75
    UNSUPPORTED_COMPRESSION_TYPE: ClassVar[int] = 76
    STALE_BROKER_EPOCH: ClassVar[int] = 77
    OFFSET_NOT_AVAILABLE: ClassVar[int] = 78
    MEMBER_ID_REQUIRED: ClassVar[int] = 79
    PREFERRED_LEADER_NOT_AVAILABLE: ClassVar[int] = 80
    GROUP_MAX_SIZE_REACHED: ClassVar[int] = 81
    FENCED_INSTANCE_ID: ClassVar[int] = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE: ClassVar[int] = 83
    ELECTION_NOT_NEEDED: ClassVar[int] = 84
    NO_REASSIGNMENT_IN_PROGRESS: ClassVar[int] = 85
    GROUP_SUBSCRIBED_TO_TOPIC: ClassVar[int] = 86
    INVALID_RECORD: ClassVar[int] = 87
    UNSTABLE_OFFSET_COMMIT: ClassVar[int] = 88
    THROTTLING_QUOTA_EXCEEDED: ClassVar[int] = 89
    PRODUCER_FENCED: ClassVar[int] = 90
    RESOURCE_NOT_FOUND: ClassVar[int] = 91
    DUPLICATE_RESOURCE: ClassVar[int] = 92
    UNACCEPTABLE_CREDENTIAL: ClassVar[int] = 93
    INCONSISTENT_VOTER_SET: ClassVar[int] = 94
    INVALID_UPDATE_VERSION: ClassVar[int] = 95
    FEATURE_UPDATE_FAILED: ClassVar[int] = 96
    PRINCIPAL_DESERIALIZATION_FAILURE: ClassVar[int] = 97
    UNKNOWN_TOPIC_ID: ClassVar[int] = 100
    INCONSISTENT_TOPIC_ID: ClassVar[int] = 103
    FENCED_MEMBER_EPOCH: ClassVar[int] = 110
    UNRELEASED_INSTANCE_ID: ClassVar[int] = 111
    UNSUPPORTED_ASSIGNOR: ClassVar[int] = 112
    STALE_MEMBER_EPOCH: ClassVar[int] = 113
    MISMATCHED_ENDPOINT_TYPE: ClassVar[int] = 114
    UNSUPPORTED_ENDPOINT_TYPE: ClassVar[int] = 115
    UNKNOWN_CONTROLLER_ID: ClassVar[int] = 116
    UNKNOWN_SUBSCRIPTION_ID: ClassVar[int] = 117
    TELEMETRY_TOO_LARGE: ClassVar[int] = 118
    INVALID_REGISTRATION: ClassVar[int] = 119
    TRANSACTION_ABORTABLE: ClassVar[int] = 120
    INVALID_RECORD_STATE: ClassVar[int] = 121
    SHARE_SESSION_NOT_FOUND: ClassVar[int] = 122
    INVALID_SHARE_SESSION_EPOCH: ClassVar[int] = 123
    FENCED_STATE_EPOCH: ClassVar[int] = 124
    INVALID_VOTER_KEY: ClassVar[int] = 125
    DUPLICATE_VOTER: ClassVar[int] = 126
    VOTER_NOT_FOUND: ClassVar[int] = 127
    INVALID_REGULAR_EXPRESSION: ClassVar[int] = 128
    REBOOTSTRAP_REQUIRED: ClassVar[int] = 129
    STREAMS_INVALID_TOPOLOGY: ClassVar[int] = 130
    STREAMS_INVALID_TOPOLOGY_EPOCH: ClassVar[int] = 131
    STREAMS_TOPOLOGY_FENCED: ClassVar[int] = 132
    SHARE_SESSION_LIMIT_REACHED: ClassVar[int] = 133

    def __init__(self, error: int, reason: builtins.str | None = None, fatal: bool = False, retriable: bool = False,
                 txn_requires_abort: bool = False) -> None:
        self._code = error
        self._reason = reason
        self._fatal = fatal
        self._retriable = retriable
        self._txn_requires_abort = txn_requires_abort

    def code(self) -> int:
        """The error code (a KafkaError class attribute)."""
        return self._code

    def name(self) -> builtins.str:
        """The code's name, as librdkafka's rd_kafka_err2name gives it."""
        return _NAMES.get(self._code, f"ERR_{self._code}?")

    def str(self) -> builtins.str:
        """The reason given, else the code's description (librdkafka's rd_kafka_err2str)."""
        if self._reason:
            return self._reason
        return DESCRIPTIONS.get(self._code, f"Err-{self._code}?")

    def fatal(self) -> bool:
        """Whether the producer cannot go on (never so here: the daemon holds the producer's state)."""
        return self._fatal

    def retriable(self) -> bool:
        """Whether the operation may succeed if tried again."""
        return self._retriable

    def txn_requires_abort(self) -> bool:
        """Whether a transaction must be aborted (never so here: no transactions)."""
        return self._txn_requires_abort

    def __str__(self) -> builtins.str:
        return f'KafkaError{{code={self.name()},val={self._code},str="{self.str()}"}}'

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _OwnKafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)


# librdkafka's rd_kafka_err2str.
DESCRIPTIONS: dict[int, str] = {
    -199: 'Local: Bad message format',
    -198: 'Local: Invalid compressed data',
    -197: 'Local: Broker handle destroyed for termination',
    -196: 'Local: Communication failure with broker',
    -195: 'Local: Broker transport failure',
    -194: 'Local: Critical system resource failure',
    -193: 'Local: Host resolution failure',
    -192: 'Local: Message timed out',
    -191: 'Broker: No more messages',
    -190: 'Local: Unknown partition',
    -189: 'Local: File or filesystem error',
    -188: 'Local: Unknown topic',
    -187: 'Local: All broker connections are down',
    -186: 'Local: Invalid argument or configuration',
    -185: 'Local: Timed out',
    -184: 'Local: Queue full',
    -183: 'Local: ISR count insufficient',
    -182: 'Local: Broker node update',
    -181: 'Local: SSL error',
    -180: 'Local: Waiting for coordinator',
    -179: 'Local: Unknown group',
    -178: 'Local: Operation in progress',
    -177: 'Local: Previous operation in progress',
    -176: 'Local: Existing subscription',
    -175: 'Local: Assign partitions',
    -174: 'Local: Revoke partitions',
    -173: 'Local: Conflicting use',
    -172: 'Local: Erroneous state',
    -171: 'Local: Unknown protocol',
    -170: 'Local: Not implemented',
    -169: 'Local: Authentication failure',
    -168: 'Local: No offset stored',
    -167: 'Local: Outdated',
    -166: 'Local: Timed out in queue',
    -165: 'Local: Required feature not supported by broker',
    -164: 'Local: Awaiting cache update',
    -163: 'Local: Operation interrupted',
    -162: 'Local: Key serialization error',
    -161: 'Local: Value serialization error',
    -160: 'Local: Key deserialization error',
    -159: 'Local: Value deserialization error',
    -158: 'Local: Partial response',
    -157: 'Local: Read-only object',
    -156: 'Local: No such entry',
    -155: 'Local: Read underflow',
    -154: 'Local: Invalid type',
    -153: 'Local: Retry operation',
    -152: 'Local: Purged in queue',
    -151: 'Local: Purged in flight',
    -150: 'Local: Fatal error',
    -149: 'Local: Inconsistent state',
    -148: 'Local: Gap-less ordering would not be guaranteed if proceeding',
    -147: 'Local: Maximum application poll interval (max.poll.interval.ms) exceeded',
    -146: 'Local: Unknown broker',
    -145: 'Local: Functionality not configured',
    -144: 'Local: This instance has been fenced by a newer instance',
    -143: 'Local: Application generated error',
    -142: 'Local: Group partition assignment lost',
    -141: 'Local: No operation performed',
    -140: 'Local: No offset to automatically reset to',
    -139: 'Local: Partition log truncation detected',
    -138: 'Local: an invalid record in the same batch caused the failure of this message too',
    -137: 'Local: Broker handle destroyed without termination',
    -1: 'Unknown broker error',
    0: 'Success',
    1: 'Broker: Offset out of range',
    2: 'Broker: Invalid message',
    3: 'Broker: Unknown topic or partition',
    4: 'Broker: Invalid message size',
    5: 'Broker: Leader not available',
    6: 'Broker: Not leader for partition',
    7: 'Broker: Request timed out',
    8: 'Broker: Broker not available',
    9: 'Broker: Replica not available',
    10: 'Broker: Message size too large',
    11: 'Broker: StaleControllerEpochCode',
    12: 'Broker: Offset metadata string too large',
    13: 'Broker: Broker disconnected before response received',
    14: 'Broker: Coordinator load in progress',
    15: 'Broker: Coordinator not available',
    16: 'Broker: Not coordinator',
    17: 'Broker: Invalid topic',
    18: 'Broker: Message batch larger than configured server segment size',
    19: 'Broker: Not enough in-sync replicas',
    20: 'Broker: Message(s) written to insufficient number of in-sync replicas',
    21: 'Broker: Invalid required acks value',
    22: 'Broker: Specified group generation id is not valid',
    23: 'Broker: Inconsistent group protocol',
    24: 'Broker: Invalid group.id',
    25: 'Broker: Unknown member',
    26: 'Broker: Invalid session timeout',
    27: 'Broker: Group rebalance in progress',
    28: 'Broker: Commit offset data size is not valid',
    29: 'Broker: Topic authorization failed',
    30: 'Broker: Group authorization failed',
    31: 'Broker: Cluster authorization failed',
    32: 'Broker: Invalid timestamp',
    33: 'Broker: Unsupported SASL mechanism',
    34: 'Broker: Request not valid in current SASL state',
    35: 'Broker: API version not supported',
    36: 'Broker: Topic already exists',
    37: 'Broker: Invalid number of partitions',
    38: 'Broker: Invalid replication factor',
    39: 'Broker: Invalid replica assignment',
    40: 'Broker: Configuration is invalid',
    41: 'Broker: Not controller for cluster',
    42: 'Broker: Invalid request',
    43: 'Broker: Message format on broker does not support request',
    44: 'Broker: Policy violation',
    45: 'Broker: Broker received an out of order sequence number',
    46: 'Broker: Broker received a duplicate sequence number',
    47: 'Broker: Producer attempted an operation with an old epoch',
    48: 'Broker: Producer attempted a transactional operation in an invalid state',
    49: 'Broker: Producer attempted to use a producer id which is not currently assigned to its transactional id',
    50: ("Broker: Transaction timeout is larger than the maximum value allowed by the broker's "
         'max.transaction.timeout.ms'),
    51: ('Broker: Producer attempted to update a transaction while another concurrent operation on the same '
         'transaction was ongoing'),
    52: ('Broker: Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current'
         ' coordinator for a given producer'),
    53: 'Broker: Transactional Id authorization failed',
    54: 'Broker: Security features are disabled',
    55: 'Broker: Operation not attempted',
    56: 'Broker: Disk error when trying to access log file on disk',
    57: 'Broker: The user-specified log directory is not found in the broker config',
    58: 'Broker: SASL Authentication failed',
    59: 'Broker: Unknown Producer Id',
    60: 'Broker: Partition reassignment is in progress',
    61: 'Broker: Delegation Token feature is not enabled',
    62: 'Broker: Delegation Token is not found on server',
    63: 'Broker: Specified Principal is not valid Owner/Renewer',
    64: 'Broker: Delegation Token requests are not allowed on this connection',
    65: 'Broker: Delegation Token authorization failed',
    66: 'Broker: Delegation Token is expired',
    67: 'Broker: Supplied principalType is not supported',
    68: 'Broker: The group is not empty',
    69: 'Broker: The group id does not exist',
    70: 'Broker: The fetch session ID was not found',
    71: 'Broker: The fetch session epoch is invalid',
    72: 'Broker: No matching listener',
    73: 'Broker: Topic deletion is disabled',
    74: 'Broker: Leader epoch is older than broker epoch',
    75: 'Broker: Leader epoch is newer than broker epoch',
    76: 'Broker: Unsupported compression type',
    77: 'Broker: Broker epoch has changed',
    78: 'Broker: Leader high watermark is not caught up',
    79: 'Broker: Group member needs a valid member ID',
    80: 'Broker: Preferred leader was not available',
    81: 'Broker: Consumer group has reached maximum size',
    82: 'Broker: Static consumer fenced by other consumer with same group.instance.id',
    83: 'Broker: Eligible partition leaders are not available',
    84: 'Broker: Leader election not needed for topic partition',
    85: 'Broker: No partition reassignment is in progress',
    86: 'Broker: Deleting offsets of a topic while the consumer group is subscribed to it',
    87: 'Broker: Broker failed to validate record',
    88: 'Broker: There are unstable offsets that need to be cleared',
    89: 'Broker: Throttling quota has been exceeded',
    90: 'Broker: There is a newer producer with the same transactionalId which fences the current one',
    91: 'Broker: Request illegally referred to resource that does not exist',
    92: 'Broker: Request illegally referred to the same resource twice',
    93: 'Broker: Requested credential would not meet criteria for acceptability',
    94: ('Broker: Indicates that the either the sender or recipient of a voter-only request is not one of the '
         'expected voters'),
    95: 'Broker: Invalid update version',
    96: 'Broker: Unable to update finalized features due to server error',
    97: 'Broker: Request principal deserialization failed during forwarding',
    100: 'Broker: Unknown topic id',
    103: "Broker: The log's topic ID did not match the topic ID in the request",
    110: 'Broker: The member epoch is fenced by the group coordinator',
    111: 'Broker: The instance ID is still used by another member in the consumer group',
    112: 'Broker: The assignor or its version range is not supported by the consumer group',
    113: 'Broker: The member epoch is stale',
    114: 'Broker: The request was sent to an endpoint of the wrong type',
    115: 'Broker: This endpoint type is not supported yet',
    116: 'Broker: This controller ID is not known',
    117: 'Broker: Client sent a push telemetry request with an invalid or outdated subscription ID',
    118: 'Broker: Client sent a push telemetry request larger than the maximum size the broker will accept',
    119: 'Broker: The controller has considered the broker registration to be invalid',
    120: 'Broker: The server encountered an error with the transaction',
    121: 'Broker: The record state is invalid',
    122: 'Broker: The share session was not found',
    123: 'Broker: The share session epoch is invalid',
    124: 'Broker: The share-group state epoch did not match',
    125: "Broker: The voter key doesn't match the receiving replica's key",
    126: 'Broker: The voter is already part of the set of voters',
    127: 'Broker: The voter is not part of the set of voters',
    128: 'Broker: The regular expression is not valid',
    129: 'Broker: Client metadata is stale, client should rebootstrap to obtain new metadata',
    130: 'Broker: The supplied topology is invalid',
    131: 'Broker: The supplied topology epoch is invalid',
    132: 'Broker: The supplied topology epoch is outdated',
    133: 'Broker: The limit of share sessions has been reached',
}

# librdkafka's rd_kafka_err2name: the class attributes above.
_NAMES: dict[int, str] = {code: name for name, code in vars(KafkaError).items()
                          if type(code) is int and not name.startswith("__")}


class KafkaException(Exception):
    """confluent_kafka.KafkaException: ``args[0]`` is the KafkaError."""


# The classes above stand in for confluent-kafka's where it is not installed. Where it is, its own are used (it
# builds them from Python: KafkaError(code, reason)), so that the application's ``except KafkaException`` and
# ``isinstance(err, KafkaError)`` of confluent_kafka's names hold; the type checker sees the above, of the same
# shape.
_OwnKafkaError, _OwnKafkaException = KafkaError, KafkaException
if not TYPE_CHECKING:
    with contextlib.suppress(ImportError):
        from confluent_kafka import KafkaError, KafkaException


def invalid_arg(message: str) -> KafkaException:
    """KafkaException(_INVALID_ARG) saying ``message``: how confluent-kafka refuses an argument or a setting."""
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


# The code confluent-kafka reports for each of kafka-sidecar's errors that is not the broker's (the first class
# that fits); the broker's keep their Kafka code, which is librdkafka's too.
_LOCAL_CODES: tuple[tuple[type[errors.KafkaError], int], ...] = (
    (errors.BufferExhaustedError, KafkaError._QUEUE_FULL),
    (errors.KafkaTimeoutError, KafkaError._MSG_TIMED_OUT),
    (errors.SidecarUnavailableError, KafkaError._TRANSPORT),
    (errors.NetworkError, KafkaError._TRANSPORT),
    (errors.ProducerClosedError, KafkaError._PURGE_QUEUE),
    (errors.RecordTooLargeError, KafkaError.MSG_SIZE_TOO_LARGE),
    (errors.SslAuthenticationError, KafkaError._SSL),
    (errors.AuthenticationError, KafkaError._AUTHENTICATION),
    (errors.ConfigError, KafkaError._INVALID_ARG),
    (errors.UnsupportedError, KafkaError._UNSUPPORTED_FEATURE),
    (errors.InvalidRecordError, KafkaError._BAD_MSG),
)


def as_kafka_error(exc: errors.KafkaError) -> KafkaError:
    """The KafkaError confluent-kafka reports for an error of kafka-sidecar's. Not retriable(), not fatal(): as
    confluent-kafka's of a delivery report or produce(), which it builds with the flags unset."""
    if exc.code is not None:
        return KafkaError(exc.code)
    code = next((code for cls, code in _LOCAL_CODES if isinstance(exc, cls)), KafkaError._FAIL)
    description = DESCRIPTIONS[code]
    return KafkaError(code, f"{description}: {exc.message}" if exc.message else description)


def unexpected_error(exc: Exception) -> KafkaError:
    """The KafkaError of a record that an error nobody expected (a bug) kept from its delivery."""
    return KafkaError(KafkaError._FAIL, f"kafka-sidecar could not hand the record off: {exc!r}")

