"""The messages between application processes and the daemon over ZeroMQ.

Clients talk through a DEALER socket to the daemon's ROUTER. Each ZeroMQ message is
one msgpack array: the message's type, then its fields in the order of its class
below. Every message is a typed record (a NamedTuple) with :func:`encode` and
:func:`decode`; :func:`decode` refuses an unknown type or a wrong number of fields,
and the receiver checks the values. The handshake carries the contract's
:data:`~client_stub.contract.PROTOCOL_VERSION`; either side refuses another version,
with a message that says which versions are involved.

The type numbers are each class's ``TYPE``. Client -> daemon: :class:`Hello` (with :class:`HelloOptions`, which may
carry a :class:`Resume` of :class:`SealNotice` rows), :class:`Blocks`, :class:`Release`, :class:`Metadata`,
:class:`Heartbeat`, :class:`Goodbye`, :class:`Stats`, :class:`LastSeal`, :class:`Wakeup`. Daemon -> client:
:class:`Welcome` (with :class:`WelcomeSettings`), :class:`Grant`, :class:`GrantFailed`, :class:`Delivery` (of
:class:`DeliveryReport` rows), :class:`Topic`, :class:`SealNow`, :class:`Error`, :class:`StatsReport`,
:class:`Shutdown`.

Records go by shared memory, not by message: a client publishes its open batches in its segment's control
area, and the daemon claims them when they are due (:mod:`.batch_slots`). A client says :class:`Wakeup`
only when the daemon would not look in time otherwise.

A daemon that shuts down tells each client that said it understands (``HelloOptions.shutdown_notice``)
with :class:`Shutdown`; the client answers with :class:`LastSeal` once it writes no more, and the daemon
claims what it published, then delivers or fails every batch it claimed before it exits. Messages and
options a peer of an earlier release does not know are only sent to peers that said they know them.

A refused request the client waits on is also answered after its :class:`Error`, so
that the client fails it at once rather than at its timeout: a :class:`Blocks` with a
usable request_id by :class:`GrantFailed`; a :class:`Metadata` for a valid topic name
(refused when the client already follows as many topics as it may) by a
:class:`Topic` without partitions and with the error; each refused batch with a
usable batch_id by a :class:`DeliveryReport` failing the whole batch.

Errors travel as :func:`error_to_wire` lists.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

import msgpack

from .. import errors
from . import PROTOCOL_VERSION

DEFAULT_ENDPOINT = "ipc:///run/kafka-sidecar/sidecar.sock"
ENDPOINT_ENV = "KAFKA_SIDECAR_ENDPOINT"

# Error.code: a handshake of another version; a message from a client the daemon does not
# know (it restarted, or ended the session), which should say Hello again; anything else.
ERROR_VERSION = "version_mismatch"
ERROR_UNKNOWN_CLIENT = "unknown_client"
ERROR_REFUSED = "refused"
# A HELLO to a daemon that is shutting down: say it again to the next one.
ERROR_SHUTTING_DOWN = "shutting_down"

# Kafka's topic name rule (Topic.java): legal characters, at most 249 of them.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")

# An error as error_to_wire() writes it: [class name, code, Kafka name, message, retriable].
WireError: TypeAlias = list[Any]


class ProtocolError(ValueError):
    """A message that breaks this contract: not msgpack, an unknown type, a wrong number of fields, a field
    of the wrong kind (the receiver's checks raise it too)."""


class VersionMismatchError(ProtocolError):
    """A handshake of another protocol version."""

    def __init__(self, kind: str, version: Any) -> None:
        super().__init__(f"{kind} of protocol version {version!r}, this side speaks {PROTOCOL_VERSION}")
        self.version = version


# -- client -> daemon ---------------------------------------------------------------------------

# A message class is a subclass of the NamedTuple of its fields, which holds its TYPE: in a NamedTuple's own
# body, type checkers read every assignment as a field.


class HelloOptions(NamedTuple):
    """What a client says of itself in its :class:`Hello` (a map by name on the wire)."""

    linger_ms: int | None = None
    partitioner: str | None = None
    # What the client held in the session of a daemon that is gone (a Resume as a list): the new one
    # takes it back with the client's segment rather than losing it.
    resume: list[Any] | None = None
    # This HELLO's number, which its WELCOME repeats: a client said HELLO again (the first may have gone
    # with a dying daemon's connection) and answers the WELCOME of its last only.
    hello_id: int = 0
    # The client waits on through a topic's retriable metadata error (see Topic); older clients fail at once.
    retriable_topic_errors: bool = False
    # The client answers a Shutdown with its LastSeal (older clients just see the daemon go).
    shutdown_notice: bool = False


class Resume(NamedTuple):
    """A lost session, handed to the next daemon, or to the same one if it ended the session while the
    client lived (it read its replies too slowly, or was silent too long): the batches the client sealed
    that were not reported (``sealed``, SealNotice rows in the order sealed), in its segment of
    ``block_size`` x ``block_count``; ``client_id`` was the session's."""

    daemon_id: str
    client_id: int
    block_size: int
    block_count: int
    sealed: list[Any]


class Hello(NamedTuple("Hello", [("version", int), ("pid", int), ("client_name", str), ("options", HelloOptions)])):
    """The handshake, first of a session (again after an ERROR_UNKNOWN_CLIENT, or when the daemon is gone)."""

    __slots__ = ()
    TYPE: Final = 1


class Blocks(NamedTuple("Blocks", [("request_id", int), ("count", int), ("contiguous", bool), ("timeout_ms", int)])):
    """Ask for ``count`` blocks (a run of ``count`` if ``contiguous``), waiting up to ``timeout_ms``."""

    __slots__ = ()
    TYPE: Final = 2


class SealNotice(NamedTuple):
    """One batch in the client's blocks: a batch it hands back to the next daemon (see :class:`Resume`), or one
    the daemon claimed, as it read it from the batch's slot."""

    batch_id: int
    first_block: int
    block_count: int
    topic: str
    partition: int
    record_count: int
    length: int
    base_timestamp: int
    max_timestamp: int
    created_ms_ago: int


class Release(NamedTuple("Release", [("blocks", list[int])])):
    """Granted blocks given back unused."""

    __slots__ = ()
    TYPE: Final = 4


class Metadata(NamedTuple("Metadata", [("topic", str)])):
    """Follow a topic: its partitions now, and each change later, come as :class:`Topic`."""

    __slots__ = ()
    TYPE: Final = 5


class Heartbeat(NamedTuple("Heartbeat", [])):
    """The client is alive (it says so when it has nothing else to say)."""

    __slots__ = ()
    TYPE: Final = 6

class Goodbye(NamedTuple("Goodbye", [])):
    """The end of the session: the client's unsealed blocks return to the pool."""

    __slots__ = ()
    TYPE: Final = 7

class Stats(NamedTuple("Stats", [])):
    """Ask for the daemon's metrics (no session needed): answered by a :class:`StatsReport`."""

    __slots__ = ()
    TYPE: Final = 8

class LastSeal(NamedTuple("LastSeal", [])):
    """The answer to :class:`Shutdown`: the client writes no more records in this session; the daemon claims what
    it published."""

    __slots__ = ()
    TYPE: Final = 9


class Wakeup(NamedTuple("Wakeup", [])):
    """Look at this client's open batches now: it opened one that the daemon would not look at before its
    linger.ms is up, or it published batches full that should go now (flush, close)."""

    __slots__ = ()
    TYPE: Final = 10


# -- daemon -> client ---------------------------------------------------------------------------


class WelcomeSettings(NamedTuple):
    """The daemon's settings a client works with (a map by name on the wire), by their Kafka names with ``_`` for
    ``.``. Those with a default were added later: a daemon of an earlier release leaves them out (None)."""

    max_request_size: int
    linger_ms: int
    max_block_ms: int
    delivery_timeout_ms: int
    buffer_memory: int
    heartbeat_interval_ms: int
    # What the daemon's producer does with the records, which a client checks its own settings against.
    acks: int | None = None
    compression_type: str | None = None
    enable_idempotence: bool | None = None
    retries: int | None = None
    batch_size: int | None = None
    request_timeout_ms: int | None = None
    max_in_flight_requests_per_connection: int | None = None
    retry_backoff_ms: int | None = None
    allow_auto_create_topics: bool | None = None


class Welcome(NamedTuple("Welcome", [("version", int), ("client_id", int), ("memory_token", bytes),
                                     ("block_size", int), ("block_count", int), ("settings", WelcomeSettings),
                                     ("daemon_id", str), ("resumed", bool), ("hello_id", int)])):
    """The session is open: the client gets its segment over the memory socket with ``memory_token`` (see
    :mod:`.shared_memory`), then may ask for blocks. ``resumed``: the daemon takes back the session the
    client's Hello offered, when the client hands over its segment. ``hello_id``: the Hello's."""

    __slots__ = ()
    TYPE: Final = 101


class Grant(NamedTuple("Grant", [("request_id", int), ("blocks", list[int])])):
    """Blocks for a :class:`Blocks` request; for a contiguous one, the run in order."""

    __slots__ = ()
    TYPE: Final = 102


class GrantFailed(NamedTuple("GrantFailed", [("request_id", int), ("reason", str)])):
    """The request waited longer than its timeout, or was refused (after an :class:`Error`)."""

    __slots__ = ()
    TYPE: Final = 103


class DeliveryReport(NamedTuple):
    """The outcome of ``record_count`` records of a batch from ``first_record`` (:data:`WHOLE_BATCH`: all
    from there)."""

    batch_id: int
    first_record: int
    record_count: int
    base_offset: int
    log_append_time_ms: int
    error: WireError | None

    @classmethod
    def failed(cls, batch_id: int, error: errors.KafkaError) -> DeliveryReport:
        """Every record of a batch failed with ``error``."""
        return cls(batch_id, 0, WHOLE_BATCH, -1, -1, error_to_wire(error))


# DeliveryReport.record_count of a report on every record of a batch from first_record on: the daemon
# refuses a batch without knowing how many records it holds.
WHOLE_BATCH = 2**31 - 1


class Delivery(NamedTuple("Delivery", [("reports", list[Any]), ("spare", list[int])])):
    """Delivery reports, as :class:`DeliveryReport` rows, and spare blocks granted with them (unasked: as many as the
    client's segment says it would take, at most one a batch reported)."""

    __slots__ = ()
    TYPE: Final = 104


class Topic(NamedTuple("Topic", [("topic", str), ("partition_count", int | None),
                                 ("available_partitions", list[int]), ("error", WireError | None),
                                 ("index", int)])):
    """A followed topic's state: its partition count (None: not known yet), the partitions with a leader,
    and its last metadata error (a retriable one only to clients that said ``retriable_topic_errors``,
    which wait on); ``index``: the session's number for the topic, which the client's batch slots name it by
    (-1 for a topic refused)."""

    __slots__ = ()
    TYPE: Final = 105


class SealNow(NamedTuple("SealNow", [])):
    """The pool is exhausted: the daemon has claimed the batches you published; give back your spare blocks."""

    __slots__ = ()
    TYPE: Final = 106

class Error(NamedTuple("Error", [("code", str), ("message", str)])):
    """The last message was refused; ``code`` is one of the ``ERROR_*`` strings."""

    __slots__ = ()
    TYPE: Final = 107


class StatsReport(NamedTuple("StatsReport", [("metrics", dict[str, Any])])):
    """The daemon's metrics, by the names of :func:`service.daemon_metrics.daemon_metrics`: ``producer``,
    ``nodes``, ``topics`` (Kafka's producer metrics), ``sidecar``, ``processes`` (its own); and its
    BufferPool's by client (``clients``: [client id, pid, blocks held] of each session; ``held``:
    [client id, blocks held] of each segment)."""

    __slots__ = ()
    TYPE: Final = 108


class Shutdown(NamedTuple("Shutdown", [("reason", str)])):
    """The daemon is shutting down (``reason``): publish what you hold as full and say :class:`LastSeal`; what
    the daemon claims is delivered or failed before it exits, and new records wait for the next daemon."""

    __slots__ = ()
    TYPE: Final = 109


Message: TypeAlias = (Hello | Blocks | Release | Metadata | Heartbeat | Goodbye | Stats | LastSeal | Wakeup | Welcome
                      | Grant | GrantFailed | Delivery | Topic | SealNow | Error | StatsReport | Shutdown)

# By type number on the wire (each class's TYPE: clients' messages from 1, the daemon's from 101).
_CLASSES: dict[int, type[Message]] = {cls.TYPE: cls for cls in (Hello, Blocks, Release, Metadata, Heartbeat,
                                                             Goodbye, Stats, LastSeal, Wakeup, Welcome, Grant,
                                                             GrantFailed, Delivery, Topic, SealNow, Error,
                                                             StatsReport, Shutdown)}


def encode(message: Message) -> bytes:
    """The wire form of a typed message."""
    kind = message.TYPE
    if isinstance(message, Hello):
        return pack(kind, *message[:3], message.options._asdict())
    if isinstance(message, Welcome):
        return pack(kind, *message[:5], message.settings._asdict(), *message[6:])
    return pack(kind, *message)


def decode(data: bytes) -> Message:
    """The typed message ``data`` holds; ProtocolError if it is not one (see :func:`from_fields`)."""
    return from_fields(unpack(data))


def from_fields(fields: list[Any]) -> Message:
    """The typed message of an :func:`unpack` result; ProtocolError for an unknown type or a wrong number of
    fields, VersionMismatchError for a handshake of another version (whose other fields may differ)."""
    number, *values = fields
    cls = _CLASSES.get(number)
    if cls is None:
        raise ProtocolError(f"unknown message type {number!r}")
    if cls in (Hello, Welcome) and values[:1] != [PROTOCOL_VERSION]:
        raise VersionMismatchError(cls.__name__.upper(), values[0] if values else None)
    if len(values) != len(cls._fields):
        raise ProtocolError(f"{cls.__name__.upper()} has {len(cls._fields)} fields, got {len(values)}")
    if cls is Hello:
        values[3] = _named(HelloOptions, values[3], "HELLO options")
    elif cls is Welcome:
        values[5] = _named(WelcomeSettings, values[5], "WELCOME settings")
    return cls._make(values)


# The messages' fields that are maps by name on the wire.
_Named = TypeVar("_Named", HelloOptions, WelcomeSettings)


def _named(cls: type[_Named], value: Any, what: str) -> _Named:
    """A NamedTuple from a map by name. Names this side does not know are left out (a newer peer's); those
    with a default may be missing (an older peer's), the others must be there."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} are a map")
    missing = [name for name in cls._fields if name not in value and name not in cls._field_defaults]
    if missing:
        raise ProtocolError(f"{what} lack {', '.join(missing)}")
    return cls(**{name: value[name] for name in cls._fields if name in value})


def pack(*fields: Any) -> bytes:
    """One msgpack array of ``fields`` (the wire's layer below :func:`encode`)."""
    # msgpack's Packer starts with a 256 KiB buffer: a malloc() per message, which in the client's
    # I/O thread takes pages of a malloc arena of its own. A small buffer is Python's (it grows as needed).
    packed: bytes = msgpack.packb(fields, use_bin_type=True, buf_size=256)  # msgpack has no types: say what it is
    return packed


def unpack(data: bytes) -> list[Any]:
    """One msgpack array that starts with a message type; ProtocolError if ``data`` is not one."""
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"not a msgpack message: {exc}") from None
    # bool is an int in Python, but msgpack's true is no message type (it would read as Hello).
    if not isinstance(message, list) or not message or not isinstance(message[0], int) \
            or isinstance(message[0], bool):
        raise ProtocolError("a message is an array that starts with its type")
    return message


def default_endpoint() -> str:
    """``$KAFKA_SIDECAR_ENDPOINT``, else the default ipc socket."""
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def check_topic(topic: Any) -> str:
    """The topic name, or ValueError saying why Kafka would refuse it."""
    if not isinstance(topic, str) or not _valid_topic(topic):
        raise ValueError(f"invalid topic name {topic!r}: Kafka topic names are 1 to 249 characters "
                         "of ASCII letters, digits, '.', '_' and '-'")
    return topic


@functools.lru_cache(maxsize=4096)
def _valid_topic(topic: str) -> bool:
    # Every batch handed back names its topic: the few topics in use are checked once.
    return bool(_TOPIC_NAME.fullmatch(topic)) and topic not in (".", "..")


def error_to_wire(error: errors.KafkaError | None) -> list[Any] | None:
    """An exception as [class name, code, Kafka name, message, retriable]."""
    if error is None:
        return None
    return [type(error).__name__, error.code, error.name, error.message, error.retriable]


def error_from_wire(wire: list[Any] | None) -> errors.KafkaError | None:
    """The exception :func:`error_to_wire` described (a KafkaError if the class is unknown)."""
    if wire is None:
        return None
    class_name, code, name, message, retriable = wire
    cls = getattr(errors, str(class_name), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.KafkaError)):
        cls = errors.KafkaError
    return cls(str(message), code=code, name=name, retriable=bool(retriable))
