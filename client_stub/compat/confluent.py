"""confluent-kafka's ``Producer`` on kafka-sidecar: code written for confluent-kafka runs with one import changed.

    from client_stub.compat.confluent import Producer   # was: from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": "ignored", "linger.ms": 5})
    p.produce("events", b"value", key=b"key", on_delivery=lambda err, msg: print(err, msg.offset()))
    p.flush()

As confluent-kafka's, ``produce()`` does not wait: a record whose topic the producer does not know yet, or that
is produced while no daemon answers, waits in this process (librdkafka's unassigned queue) until it can be handed
off, and a full BufferPool (or ``queue.buffering.max.messages`` records waiting) raises BufferError at once.
Delivery callbacks run on the application's thread, inside ``poll()`` and ``flush()``. A topic the cluster does not
have fails its records with UNKNOWN_TOPIC_OR_PART after ``topic.metadata.propagation.max.ms``; records not
delivered within the daemon's delivery.timeout.ms fail with _MSG_TIMED_OUT.

Settings: docs/migration/confluent-kafka.md says which are honoured, which the daemon owns (checked against the
daemon's: a difference is a :class:`~client_stub.compat.DaemonSettingWarning`), and which mean nothing here. An
unknown one raises KafkaException(_INVALID_ARG), as confluent-kafka does. The daemon's endpoint is
``sidecar.endpoint``, else ``$KAFKA_SIDECAR_ENDPOINT``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import operator
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .. import errors
from ..contract import ipc
from ..futures import RecordMetadata
from ..producer import Producer as _SidecarProducer
from ..producer import _headers as _record_headers
from ._settings import SettingsCheck, close_producer, whole_ms

__all__ = ["TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE", "ClusterMetadata",
           "KafkaError", "KafkaException", "Message", "PartitionMetadata", "Producer", "TopicMetadata"]

log = logging.getLogger(__name__)

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]
DeliveryCallback = Callable[["KafkaError | None", "Message"], None]


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
        return _DESCRIPTIONS.get(self._code, f"Err-{self._code}?")

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
_DESCRIPTIONS: dict[int, str] = {
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


class Message:
    """confluent_kafka.Message, as a delivery report gives it: the record produced and where it went.

    ``partition()`` is None while the record had none (none was given, and it failed before one was chosen),
    ``offset()`` None unless the broker gave one; ``timestamp()`` is (TIMESTAMP_CREATE_TIME or
    TIMESTAMP_LOG_APPEND_TIME, milliseconds); ``latency()`` the seconds from produce() to the report.
    """

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_error", "_timestamp",
                 "_latency", "_leader_epoch")

    def __init__(self, topic: str | None = None, partition: int | None = None, offset: int | None = None,
                 key: bytes | None = None, value: bytes | None = None,
                 headers: list[tuple[str, bytes | None]] | None = None, error: KafkaError | None = None,
                 timestamp: tuple[int, int] | None = None, latency: float | None = None,
                 leader_epoch: int | None = None) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._error = error
        self._timestamp = timestamp
        self._latency = latency
        self._leader_epoch = leader_epoch

    def topic(self) -> str | None:
        """The topic."""
        return self._topic

    def partition(self) -> int | None:
        """The partition, None if none was chosen."""
        return None if self._partition is None or self._partition < 0 else self._partition

    def offset(self) -> int | None:
        """The record's offset in its partition, None if the broker gave none."""
        return None if self._offset is None or self._offset < 0 else self._offset

    def key(self) -> bytes | None:
        """The key, as bytes."""
        return self._key

    def value(self) -> bytes | None:
        """The value, as bytes."""
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The headers as (name, value) pairs, None if there were none."""
        return self._headers

    def error(self) -> KafkaError | None:
        """Why the delivery failed, None if it did not."""
        return self._error

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch); (TIMESTAMP_NOT_AVAILABLE, 0) if unknown."""
        return self._timestamp or (TIMESTAMP_NOT_AVAILABLE, 0)

    def latency(self) -> float | None:
        """Seconds from produce() to the delivery report."""
        return self._latency

    def leader_epoch(self) -> int | None:
        """The partition leader's epoch (not known here: None)."""
        return self._leader_epoch

    def set_headers(self, headers: list[tuple[str, bytes | None]] | None) -> None:
        """Replace the headers."""
        self._headers = headers

    def set_key(self, key: bytes | None) -> None:
        """Replace the key."""
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        """Replace the value."""
        self._value = value

    def __len__(self) -> int:
        return 0 if self._value is None else len(self._value)


class PartitionMetadata:
    """confluent_kafka.admin.PartitionMetadata: a partition's id (its leader and replicas are the daemon's to
    know: -1 and empty here)."""

    def __init__(self, id: int, leader: int = -1, replicas: list[int] | None = None, isrs: list[int] | None = None,
                 error: KafkaError | None = None) -> None:
        self.id = id
        self.leader = leader
        self.replicas = replicas or []
        self.isrs = isrs or []
        self.error = error


class TopicMetadata:
    """confluent_kafka.admin.TopicMetadata: a topic's partitions by id, or the cluster's error on it."""

    def __init__(self, topic: str, partitions: dict[int, PartitionMetadata], error: KafkaError | None = None) -> None:
        self.topic = topic
        self.partitions = partitions
        self.error = error


class ClusterMetadata:
    """confluent_kafka.admin.ClusterMetadata: here, the topics asked about (the brokers are the daemon's)."""

    def __init__(self, topics: dict[str, TopicMetadata]) -> None:
        self.cluster_id: str | None = None
        self.controller_id = -1
        self.brokers: dict[int, Any] = {}
        self.topics = topics
        self.orig_broker_id = -1
        self.orig_broker_name: str | None = None


# -- settings -----------------------------------------------------------------------------------------------

# Every property librdkafka knows (its CONFIGURATION.md: global, topic and consumer ones), and those
# confluent-kafka adds: a producer accepts each. The ones below that are not honoured, the daemon's or refused
# mean nothing here (docs/migration/confluent-kafka.md lists them).
_PROPERTY_NAMES = """
acks allow.auto.create.topics api.version.fallback.ms api.version.request api.version.request.timeout.ms
auto.commit.enable auto.commit.interval.ms auto.offset.reset background_event_cb batch.num.messages batch.size
bootstrap.servers broker.address.family broker.address.ttl broker.version.fallback builtin.features check.crcs
client.dns.lookup client.id client.rack closesocket_cb compression.codec compression.level compression.type
connect_cb connections.max.idle.ms consume.callback.max.messages consume_cb coordinator.query.interval.ms debug
default_topic_conf delivery.report.only.error delivery.timeout.ms dr_cb dr_msg_cb enable.auto.commit
enable.auto.offset.store enable.gapless.guarantee enable.idempotence enable.metrics.push enable.partition.eof
enable.random.seed enable.sasl.oauthbearer.unsecure.jwt enable.ssl.certificate.verification enabled_events error_cb
fetch.error.backoff.ms fetch.max.bytes fetch.message.max.bytes fetch.min.bytes fetch.queue.backoff.ms
fetch.wait.max.ms group.id group.instance.id group.protocol group.protocol.type group.remote.assignor
heartbeat.interval.ms https.ca.location https.ca.pem interceptors internal.termination.signal isolation.level
linger.ms log.connection.close log.queue log.thread.name log_cb log_level logger max.in.flight
max.in.flight.requests.per.connection max.partition.fetch.bytes max.poll.interval.ms max.poll.records
message.copy.max.bytes message.max.bytes message.send.max.retries message.timeout.ms metadata.broker.list
metadata.max.age.ms metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy msg_order_cmp oauth_cb
oauthbearer_token_refresh_cb offset.store.method offset.store.path offset.store.sync.interval.ms offset_commit_cb
on_delivery opaque open_cb partition.assignment.strategy partitioner partitioner_cb plugin.library.paths
produce.offset.report queue.buffering.backpressure.threshold queue.buffering.max.kbytes queue.buffering.max.messages
queue.buffering.max.ms queued.max.messages.kbytes queued.min.messages queuing.strategy rebalance_cb
receive.message.max.bytes reconnect.backoff.jitter.ms reconnect.backoff.max.ms reconnect.backoff.ms
request.required.acks request.timeout.ms resolve_cb retries retry.backoff.max.ms retry.backoff.ms
sasl.kerberos.keytab sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin sasl.kerberos.principal
sasl.kerberos.service.name sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm
sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub sasl.oauthbearer.assertion.file
sasl.oauthbearer.assertion.jwt.template.file sasl.oauthbearer.assertion.private.key.file
sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.private.key.pem
sasl.oauthbearer.client.credentials.client.id sasl.oauthbearer.client.credentials.client.secret
sasl.oauthbearer.client.id sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions
sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type sasl.oauthbearer.method
sasl.oauthbearer.scope sasl.oauthbearer.sub.claim.name sasl.oauthbearer.token.endpoint.url sasl.password
sasl.username security.protocol session.timeout.ms share.acknowledgement.mode socket.blocking.max.ms
socket.connection.setup.timeout.ms socket.keepalive.enable socket.max.fails socket.nagle.disable
socket.receive.buffer.bytes socket.send.buffer.bytes socket.timeout.ms socket_cb ssl.ca.certificate.stores
ssl.ca.location ssl.ca.pem ssl.certificate.location ssl.certificate.pem ssl.certificate.verify_cb ssl.cipher.suites
ssl.crl.location ssl.curves.list ssl.endpoint.identification.algorithm ssl.engine.id ssl.engine.location
ssl.key.location ssl.key.password ssl.key.pem ssl.keystore.location ssl.keystore.password ssl.providers
ssl.sigalgs.list ssl_ca ssl_certificate ssl_engine_callback_data ssl_key statistics.interval.ms stats_cb
sticky.partitioning.linger.ms throttle_cb topic.blacklist topic.metadata.propagation.max.ms
topic.metadata.refresh.fast.cnt topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms
topic.metadata.refresh.sparse transaction.timeout.ms transactional.id
"""
_KNOWN = frozenset(_PROPERTY_NAMES.split())

# librdkafka's names (aliases too) of the daemon's settings, by the daemon's (Kafka's) name: accepted, and
# checked against the daemon's.
_DAEMON_OWNED: dict[str, str] = {
    "acks": "acks", "request.required.acks": "acks",
    "compression.type": "compression.type", "compression.codec": "compression.type",
    "enable.idempotence": "enable.idempotence",
    "retries": "retries", "message.send.max.retries": "retries",
    "delivery.timeout.ms": "delivery.timeout.ms", "message.timeout.ms": "delivery.timeout.ms",
    "request.timeout.ms": "request.timeout.ms",
    "batch.size": "batch.size",
    "message.max.bytes": "max.request.size",
    "max.in.flight.requests.per.connection": "max.in.flight.requests.per.connection",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "retry.backoff.ms": "retry.backoff.ms",
    "allow.auto.create.topics": "allow.auto.create.topics",
}

# Those that mean here what they mean to confluent-kafka, and kafka-sidecar's own.
_HONOURED = frozenset({"sidecar.endpoint", "client.id", "linger.ms", "queue.buffering.max.ms", "partitioner",
                       "queue.buffering.max.messages", "topic.metadata.propagation.max.ms",
                       "delivery.report.only.error", "on_delivery"})

# Those that would change what the producer does in a way it cannot.
_REFUSED = frozenset({"transactional.id"})

_IGNORED = frozenset(_KNOWN - _HONOURED - set(_DAEMON_OWNED) - _REFUSED)

# The partitioners of librdkafka that the client has.
_PARTITIONERS = ("consistent_random", "murmur2_random", "random")


class _Settings(NamedTuple):
    """A Producer's configuration, read."""

    endpoint: str | None
    client_id: str | None
    linger_ms: int | None
    partitioner: str
    max_messages: int
    propagation_ms: int
    only_errors: bool
    on_delivery: DeliveryCallback | None
    message_timeout_ms: int | None
    check: SettingsCheck


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _read_settings(config: Mapping[str, Any]) -> _Settings:
    """The configuration as confluent-kafka takes it; KafkaException(_INVALID_ARG) as it would raise it."""
    config = dict(config)
    topic_config = config.pop("default.topic.config", None) or {}
    config = {**topic_config, **config}
    for name in config:
        if name not in _KNOWN and name not in _HONOURED:
            raise _invalid(f'No such configuration property: "{name}"')
    if config.get("transactional.id"):
        raise KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED,
                                        "transactions are not supported by kafka-sidecar (transactional.id)"))
    on_delivery = config.get("on_delivery")
    if on_delivery is not None and not callable(on_delivery):
        raise _invalid("on_delivery requires a callable object")

    def number(names: tuple[str, ...], low: int, high: int) -> int | None:
        """The number given for a property (``names[0]``, or an alias of it: the last given wins, as in
        librdkafka), whole (a fraction rounds up, see whole_ms), None if none was."""
        value = None
        for name, given in config.items():
            if name in names:
                try:
                    value = whole_ms(given)
                except (TypeError, ValueError, OverflowError):
                    value = None
                if value is None:
                    raise _invalid(f'Invalid value for configuration property "{names[0]}"')
                if not low <= value <= high:
                    raise _invalid(f'Configuration property "{names[0]}" value {value} is outside allowed range '
                                   f"{low}..{high}\n")
        return value

    partitioner = str(config.get("partitioner", "consistent_random"))
    if partitioner not in _PARTITIONERS:
        raise _invalid(f'Invalid value "{partitioner}" for configuration property "partitioner": kafka-sidecar '
                       f"has {', '.join(_PARTITIONERS)}")
    only_errors = str(config.get("delivery.report.only.error", False)).lower()
    if only_errors not in ("true", "false"):
        raise _invalid('Invalid value for configuration property "delivery.report.only.error"')
    try:
        check = SettingsCheck({kafka_name: (name, config[name]) for name, kafka_name in _DAEMON_OWNED.items()
                               if name in config})
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    endpoint = config.get("sidecar.endpoint")
    client_id = config.get("client.id")
    max_messages = number(("queue.buffering.max.messages",), 0, 2**31 - 1)
    propagation = number(("topic.metadata.propagation.max.ms",), 0, 3_600_000)
    return _Settings(endpoint=None if endpoint is None else str(endpoint),
                     client_id=None if client_id is None else str(client_id),
                     linger_ms=number(("queue.buffering.max.ms", "linger.ms"), 0, 900_000),
                     partitioner=partitioner,
                     max_messages=100_000 if max_messages is None else max_messages,
                     propagation_ms=30_000 if propagation is None else propagation,
                     only_errors=only_errors == "true", on_delivery=on_delivery,
                     message_timeout_ms=number(("message.timeout.ms", "delivery.timeout.ms"), 0, 2**31 - 1),
                     check=check)


# -- errors ---------------------------------------------------------------------------------------------------

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


def _error(exc: errors.KafkaError) -> KafkaError:
    """The KafkaError confluent-kafka reports for an error of kafka-sidecar's. Not retriable(), not fatal(): as
    confluent-kafka's of a delivery report or produce(), which it builds with the flags unset."""
    if exc.code is not None:
        return KafkaError(exc.code)
    code = next((code for cls, code in _LOCAL_CODES if isinstance(exc, cls)), KafkaError._FAIL)
    description = _DESCRIPTIONS[code]
    return KafkaError(code, f"{description}: {exc.message}" if exc.message else description)


def _unexpected(exc: Exception) -> KafkaError:
    """The KafkaError of a record that an error nobody expected (a bug) kept from its delivery."""
    return KafkaError(KafkaError._FAIL, f"kafka-sidecar could not hand the record off: {exc!r}")


# -- the producer -------------------------------------------------------------------------------------------

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
    """confluent_kafka.Producer on the kafka-sidecar daemon (see the module's docstring).

    ``Producer(config)`` or ``Producer(**config)``, as confluent-kafka's; ``len(producer)`` is the number of
    records not yet reported to the application (waiting here, at the daemon, or in a report not yet served).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._settings = _read_settings({**(config or {}), **kwargs})
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
            raise _invalid(str(exc)) from None
        try:
            # Any integer (a numpy one too), as librdkafka takes a C integer.
            partition, timestamp = operator.index(partition), operator.index(timestamp)
        except TypeError:
            raise _invalid(f"partition and timestamp are integers, got {partition!r} and {timestamp!r}") from None
        if partition < -1:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        if not 0 <= timestamp < 2**63:
            raise _invalid(f"timestamp must be milliseconds from 0 to 2**63-1, got {timestamp!r}")
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
                raise BufferError(_DESCRIPTIONS[KafkaError._QUEUE_FULL])
            if topic in self._waiting:
                self._wait_here(record)  # behind the topic's records that wait
                return
            self._in_flight += 1
        try:
            self._hand_off(record)
        except errors.BufferExhaustedError:
            self._not_handed_off()
            raise BufferError(_DESCRIPTIONS[KafkaError._QUEUE_FULL]) from None
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
            self._finish(record, _error(exc))  # the cluster's final error on the topic: reported as a delivery's
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
            return _error(exc)
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
        self._finish(record, None if error is None else _error(error))

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
                self._finish(record, _unexpected(exc), handed_off=False)

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
                self._fail_waiting(topic, _error(exc))  # the cluster's final error on the topic, or closed
                continue
            self._hand_off_queue(topic)

    def _hand_off_queue(self, topic: str) -> None:
        """Hand off the topic's waiting records in order, until none is left or one must wait again."""
        while True:
            with self._lock:
                queue = self._waiting[topic]
                if not queue:
                    self._cond.notify_all()  # for flush(), which seals what was handed off meanwhile
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
                self._finish(record, _error(exc))
            except Exception as exc:
                self._finish(record, _unexpected(exc))
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
            raise KafkaException(_error(exc)) from None
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
            return TopicMetadata(topic, {}, _error(exc.__cause__)) if isinstance(exc.__cause__, errors.KafkaError) \
                else None
        except errors.SidecarUnavailableError as exc:
            raise KafkaException(_error(exc)) from None
        except errors.KafkaError as exc:
            return TopicMetadata(topic, {}, _error(exc))
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
