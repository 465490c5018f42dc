"""The messages between application processes and the daemon over ZeroMQ.

Each ZeroMQ message is one msgpack array whose first element is the message
type. Clients talk through a DEALER socket to the daemon's ROUTER. The handshake
carries :data:`PROTOCOL_VERSION`; either side refuses a version it does not
speak, with a message that says which versions are involved.

Client -> daemon::

    [HELLO, version, pid, client_name, options]          options: linger_ms, partitioner, process,
                                                          retriable_topic_errors (True: the client
                                                          waits on through them, see TOPIC)
    [BLOCKS, request_id, count, contiguous, timeout_ms]   count blocks (a run of count if contiguous)
    [SEAL, [[batch_id, first_block, block_count, topic, partition, record_count, length,
             base_timestamp, max_timestamp, created_ms_ago], ...]]
    [RELEASE, [block, ...]]                               unused granted blocks given back
    [METADATA, topic]                                     subscribe to a topic's metadata
    [HEARTBEAT]
    [GOODBYE]

Daemon -> client::

    [WELCOME, version, client_id, segment, block_size, block_count, settings, daemon_id]
    [GRANT, request_id, [block, ...]]                     for contiguous requests: the run, in order
    [GRANT_FAILED, request_id, message]                   the request waited longer than its timeout,
                                                          or was refused (after an ERROR)
    [DELIVERY, [[batch_id, first_record, record_count, base_offset, log_append_time_ms, error], ...]]
    [TOPIC, topic, partition_count, available_partitions, error]   error: the topic's last error in
                                                          metadata; a retriable one (the topic is
                                                          unknown) only to clients that said
                                                          retriable_topic_errors, which wait on
    [SEAL_NOW]                                            the pool is exhausted: seal what you hold
    [ERROR, code, message]                                the last message was refused; code is one
                                                          of the ERROR_* strings below

``error`` is None or an :func:`error_to_wire` list.

A refused request the client waits on is also answered after its ERROR, so that the
client fails it at once rather than at its timeout: a BLOCKS with a usable request_id
by GRANT_FAILED; a METADATA for a valid topic name (refused when the client already
follows as many topics as it may) by [TOPIC, topic, None, [], error]; each refused
seal notice with a usable batch_id by a DELIVERY entry failing the whole batch.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import msgpack

from .. import errors

PROTOCOL_VERSION = 1
DEFAULT_ENDPOINT = "ipc:///run/kafka-sidecar/sidecar.sock"
ENDPOINT_ENV = "KAFKA_SIDECAR_ENDPOINT"

HELLO = 1
BLOCKS = 2
SEAL = 3
RELEASE = 4
METADATA = 5
HEARTBEAT = 6
GOODBYE = 7

WELCOME = 101
GRANT = 102
GRANT_FAILED = 103
DELIVERY = 104
TOPIC = 105
SEAL_NOW = 106
ERROR = 107

# ERROR codes: a handshake of another version; a message from a client the daemon does not
# know (it restarted, or ended the session), which should say HELLO again; anything else.
ERROR_VERSION = "version_mismatch"
ERROR_UNKNOWN_CLIENT = "unknown_client"
ERROR_REFUSED = "refused"

# A seal notice's fields, in order.
SEAL_FIELDS = ("batch_id", "first_block", "block_count", "topic", "partition", "record_count", "length",
               "base_timestamp", "max_timestamp", "created_ms_ago")

# Kafka's topic name rule (Topic.java): legal characters, at most 249 of them.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def default_endpoint() -> str:
    """``$KAFKA_SIDECAR_ENDPOINT``, else the default ipc socket."""
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def pack(*message: Any) -> bytes:
    # msgpack's Packer starts with a 256 KiB buffer: a malloc() per message, which in the client's
    # I/O thread takes pages of a malloc arena of its own. A small buffer is Python's (it grows as needed).
    return msgpack.packb(message, use_bin_type=True, buf_size=256)


def unpack(data: bytes) -> list[Any]:
    """Decode one message; ValueError if it is not a non-empty msgpack array starting with a type."""
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"not a msgpack message: {exc}") from None
    # bool is an int in Python, but msgpack's true is no message type (it would read as HELLO).
    if not isinstance(message, list) or not message or not isinstance(message[0], int) \
            or isinstance(message[0], bool):
        raise ValueError("a message is an array that starts with its type")
    return message


def check_topic(topic: Any) -> str:
    """The topic name, or ValueError saying why Kafka would refuse it."""
    if not isinstance(topic, str) or not _valid_topic(topic):
        raise ValueError(f"invalid topic name {topic!r}: Kafka topic names are 1 to 249 characters "
                         "of ASCII letters, digits, '.', '_' and '-'")
    return topic


@functools.lru_cache(maxsize=4096)
def _valid_topic(topic: str) -> bool:
    # Every seal notice names its topic: the few topics in use are checked once.
    return bool(_TOPIC_NAME.fullmatch(topic)) and topic not in (".", "..")


def process_identity(pid: int) -> list[str] | None:
    """[pid namespace, start time] of a live process, None if it is gone or /proc cannot tell.

    The daemon compares what a client sent in its HELLO with what it reads now: a
    client process that died (or whose pid was reused) is noticed at once, without
    waiting for its heartbeats to stop. Only meaningful within one pid namespace.
    """
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (field 2) may hold spaces; the state is field 3, the start time field 22.
            fields = stat.read().rsplit(b")", 1)[1].split()
        # A zombie has died: only its parent has not reaped it yet (and may not for a while).
        if fields[0] in (b"Z", b"X"):
            return None
        return [namespace, fields[19].decode()]
    except (OSError, IndexError):
        return None


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
