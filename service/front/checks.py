"""The checks of what clients send: each raises :class:`~service.client_error.ClientError` for what it refuses.

Everything a client sends is checked before it touches the pool or the accumulator: a
malformed or hostile message fails alone, and never affects another client.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from client_stub.contract import PROTOCOL_VERSION, ipc

from ..client_error import ClientError

# The characters of an error's text a client gets back (the text quotes what was refused, which may be as large
# as a message).
MAX_ERROR_TEXT = 400
# The largest message a client has reason to send is a resumed HELLO naming every block it may hold, a
# notice (its topic name of at most 249 characters, nine integers) for each; ZeroMQ drops the
# connection of a peer that sends a larger one before it is read into memory.
_MESSAGE_OVERHEAD = 4096
_NOTICE_SIZE = 400


def max_message_size(max_blocks_per_process: int) -> int:
    """The largest message the front reads: a HELLO that hands back a batch in every block a client may hold."""
    return _MESSAGE_OVERHEAD + max_blocks_per_process * _NOTICE_SIZE


def read_message(payload: bytes, *, known_client: bool) -> ipc.Message:
    """The message a client sent; ClientError if it breaks the contract (ERROR_VERSION for a HELLO of another
    version), or if an unknown client sends anything but HELLO or STATS (ERROR_UNKNOWN_CLIENT: the daemon
    restarted, or ended its session, and it should say HELLO again)."""
    try:
        fields = ipc.unpack(payload)
        if not known_client and fields[0] not in (ipc.Hello.TYPE, ipc.Stats.TYPE):
            raise ClientError("unknown client: send HELLO first", ipc.ERROR_UNKNOWN_CLIENT)
        return ipc.from_fields(fields)
    except ipc.VersionMismatchError as exc:
        raise ClientError(f"protocol version mismatch: the client speaks {exc.version!r}, this daemon speaks "
                          f"{PROTOCOL_VERSION}; upgrade kafka-sidecar on one side", ipc.ERROR_VERSION) from None
    except ipc.ProtocolError as exc:
        raise ClientError(str(exc)) from None


def clip(text: str) -> str:
    """An error's text as a client gets it: at most MAX_ERROR_TEXT characters."""
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT - 3] + "..."


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an integer (msgpack's true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, name: str, low: int = 0, high: int = 2**63 - 1) -> None:
    """ClientError unless ``value`` is an integer in [low, high]."""
    if not is_int(value) or not low <= value <= high:
        raise ClientError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_topic(topic: Any) -> str:
    """The topic name; ClientError if Kafka would refuse it."""
    try:
        return ipc.check_topic(topic)
    except ValueError as exc:
        raise ClientError(str(exc)) from None


def check_block_list(blocks: Any, what: str) -> list[int]:
    """A list of block numbers; ClientError if ``blocks`` is not one."""
    if not isinstance(blocks, list) or not all(is_int(b) for b in blocks):
        raise ClientError(f"{what} carries a list of block numbers")
    return blocks


def notice_fields(notice: Any) -> dict[str, Any]:
    """What can be read of a seal notice by field name, before it is checked (it may have too few fields,
    or fields of other types)."""
    return dict(zip(ipc.SealNotice._fields, notice, strict=False)) if isinstance(notice, list) else {}


def check_notice(raw: Any, block_count: int, block_size: int) -> ipc.SealNotice:
    """A seal notice whose fields are each in range for a pool of ``block_count`` blocks of ``block_size``
    bytes; ClientError if not (whether the blocks are the client's is the pool's to say). The fast path's
    seal_claimed() checks a batch claimed alike, in one call (tests/unit/test_claim_ready.py holds them
    to it)."""
    if not isinstance(raw, list) or len(raw) != len(ipc.SealNotice._fields):
        raise ClientError(f"a seal notice has the fields {', '.join(ipc.SealNotice._fields)}")
    notice = ipc.SealNotice._make(raw)
    check_int(notice.batch_id, "batch_id")
    check_int(notice.first_block, "first_block", 0, block_count - 1)
    check_int(notice.block_count, "block_count", 1, block_count)
    check_int(notice.partition, "partition", 0, 2**31 - 1)
    check_int(notice.length, "length", 1, notice.block_count * block_size)
    check_int(notice.record_count, "record_count", 1, notice.length)
    check_int(notice.base_timestamp, "base_timestamp", -1, 2**63 - 1)
    check_int(notice.max_timestamp, "max_timestamp", -1, 2**63 - 1)
    check_int(notice.created_ms_ago, "created_ms_ago", 0, 2**40)
    check_topic(notice.topic)
    return notice
