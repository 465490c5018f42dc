"""The daemon's per-record work in pure Python: the twin of the C extension ``service._fastpath``.

rebase_records(), with which the daemon coalesces small batches of one partition into one,
copy_records(), with which it reads every other batch before its first send, claim_ready(), with which
it claims the batches of a client's segment that are due, and seal_claimed(), with which it seals each, as
``service/_fastpath.c`` does them (its comments are the specification), with the same errors. The
reference for the C code, and the daemon of machines where the extension could not be built;
``service.fastpath`` chooses between the two when first imported.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from client_stub.contract import batch_slots
from client_stub.contract.records import varint

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

__all__ = ["claim_ready", "copy_records", "rebase_records", "seal_claimed"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


class _Malformed(Exception):
    """What is at a position is not what a well-formed record has there."""


def _get_varint(data: bytes, end: int, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` (below ``end``) and the position after it.

    At most 10 bytes; the bits of a tenth byte past the 64th are dropped, as Java's ByteUtils drops them.
    """
    result = 0
    for shift in range(0, 64, 7):
        if pos >= end:
            break
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            result &= _MASK64
            return (result >> 1) ^ -(result & 1), pos
    raise _Malformed


def _skip_field(data: bytes, end: int, pos: int, minimum: int) -> int:
    """The position after the length-prefixed field at ``pos``, whose length must be ``minimum`` at least."""
    length, pos = _get_varint(data, end, pos)
    if length < minimum or length > end - pos:
        raise _Malformed
    return pos + max(length, 0)


def _parse_record(data: bytes, end: int, pos: int) -> tuple[int, int, int, int]:
    """The record at ``pos``, every length in it checked as a broker would: (attributes, timestamp delta,
    where its key length starts, where it ends). Everything from its key on is kept as it is."""
    length, pos = _get_varint(data, end, pos)
    if length < 1 or length > end - pos:
        raise _Malformed
    body_end = pos + length
    attributes = data[pos]
    timestamp_delta, p = _get_varint(data, body_end, pos + 1)
    _, p = _get_varint(data, body_end, p)  # the offset delta, replaced
    rest = p
    p = _skip_field(data, body_end, p, -1)  # key
    p = _skip_field(data, body_end, p, -1)  # value
    headers, p = _get_varint(data, body_end, p)
    if headers < 0:
        raise _Malformed
    for _ in range(headers):  # each takes two bytes at least: bounded by the record's length
        p = _skip_field(data, body_end, p, 0)
        p = _skip_field(data, body_end, p, -1)
    if p != body_end:
        raise _Malformed
    return attributes, timestamp_delta, rest, body_end


def _int64(value: object) -> int:
    """``value`` as the C argument parser takes a 64-bit integer: TypeError, or OverflowError outside int64."""
    value = operator.index(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise OverflowError("int too big to convert")
    return value


def _byte(value: object) -> int:
    """``value`` as the C argument parser takes an unsigned byte: TypeError, or OverflowError outside [0, 255]."""
    value = operator.index(value)
    if not 0 <= value <= 255:
        raise OverflowError("unsigned byte integer is out of range")
    return value


def _copy(records: Any, function: str) -> bytes:
    """One private copy of ``records``, taken as the C argument parser takes a bytes-like object."""
    try:
        view = memoryview(records)
    except TypeError:
        raise TypeError(f"{function}() argument 1 must be bytes-like object, not {type(records).__name__}") \
            from None
    with view:
        if not view.c_contiguous:
            raise TypeError(f"{function}() argument 1 must be contiguous buffer, not memoryview")
        return view.tobytes()


def _records(data: bytes, count: int) -> Iterator[tuple[int, int, int, int]]:
    """Each of the ``count`` records of ``data``, as _parse_record gives it; then ValueError (naming the record
    and the byte where they stop) unless they were exactly ``count`` and end where ``data`` does."""
    end = len(data)
    pos = n = 0
    while pos < end and n < count:
        try:
            record = _parse_record(data, end, pos)
        except _Malformed:
            break
        yield record
        pos = record[3]
        n += 1
    if n != count or pos != end:
        raise ValueError(f"not {count} well-formed records (record {n}, byte {pos} of {end})")


def rebase_records(records: ReadableBuffer, record_count: int, first_offset_delta: int, timestamp_shift: int,
                   /) -> bytes:
    """The records of one batch, re-encoded for another that holds them from ``first_offset_delta`` on,
    with a base timestamp ``timestamp_shift`` ms lower. ValueError unless ``records`` is exactly
    ``record_count`` well-formed records."""
    # The records lie in shared memory that their client can still write: one private copy is read, so
    # that what is checked is what is written.
    data = _copy(records, "rebase_records")
    count = _int64(record_count)
    first = _int64(first_offset_delta)
    shift = _int64(timestamp_shift)
    pieces: list[bytes] = []
    for n, (attributes, timestamp_delta, rest, body_end) in enumerate(_records(data, count)):
        timestamp_delta += shift
        offset_delta = first + n
        if not _INT64_MIN <= timestamp_delta <= _INT64_MAX or offset_delta > _INT64_MAX:
            raise ValueError(f"record {n}: its timestamp or offset delta is out of range")
        body = b"".join((bytes((attributes,)), varint(timestamp_delta), varint(offset_delta), data[rest:body_end]))
        pieces.append(varint(len(body)))
        pieces.append(body)
    return b"".join(pieces)


def copy_records(records: ReadableBuffer, record_count: int, /) -> bytes:
    """A copy of the records of one batch, read once. ValueError unless the copy is exactly ``record_count``
    well-formed records."""
    # The records lie in shared memory that their client can still write: what is checked is the copy
    # returned, which is what the daemon sends.
    data = _copy(records, "copy_records")
    for _ in _records(data, _int64(record_count)):
        pass
    return data


# The longest linger.ms a client's header may ask for, and the longest early_ms: a day (a lingering batch still
# expires at delivery.timeout.ms from its claim).
_MAX_LINGER_MS = 86_400_000
# first_seen's word of a block where no open batch was seen since its last claim.
_UNSEEN = _INT64_MIN


def claim_ready(control: batch_slots.ControlArea, state: ReadableBuffer, owned: int, first_seen: WriteableBuffer,
                now_ms: int, claim_all: bool, early_ms: int, /) -> tuple[list[tuple[int, ...]], int | None, bool, bool,
                                                                         bool]:
    """Claim the batches of a client's segment that are ready (``service/_fastpath.c`` says which, and what it
    returns)."""
    states = memoryview(state).cast("B")
    raw_seen = memoryview(first_seen).cast("B")
    early_ms = _int64(early_ms)
    if early_ms < 0:
        raise ValueError("early_ms must not be negative")
    early_ms = min(early_ms, _MAX_LINGER_MS)
    covered = raw_seen.nbytes // 8
    if raw_seen.nbytes % 8 or covered > len(states) or covered > control.block_count:
        raise ValueError("first_seen covers more blocks than state or the control area")
    seen = raw_seen.cast("q")
    linger_ms = min(control.header(batch_slots.LINGER_NS) // 1_000_000, _MAX_LINGER_MS)
    owned_blocks = [block for block, value in enumerate(states[:len(seen)]) if value == owned]
    still_open = found_full = found_due = False
    next_due: int | None = None
    ready: list[tuple[int, bool]] = []  # each block claimed, and whether it was due now (not full)
    for block, published in control.open_slots(owned_blocks):
        full = bool(published & batch_slots.FULL)
        if seen[block] == _UNSEEN:
            seen[block] = now_ms
        due = min(control.opened_ns(block) // 1_000_000, seen[block]) + linger_ms
        if claim_all or full or now_ms >= due - early_ms:
            seen[block] = _UNSEEN
            found_full |= full
            ready.append((block, not full and now_ms >= due))
        else:
            still_open = True
            next_due = due if next_due is None else min(next_due, due)
    claimed = []
    for block, due_now in ready:
        record_count, length = control.claim(block)
        if record_count:  # else a client's own slot, rewritten: nothing of it is sent
            found_due |= due_now
            slot = control.snapshot(block)
            claimed.append((block, record_count, length, slot.base_timestamp, slot.max_timestamp, slot.batch_id,
                            slot.topic_index, slot.partition, slot.block_count, slot.opened_ns))
    # A partition's batches go in the order the client opened them (its batch ids).
    claimed.sort(key=lambda batch: batch[5])
    return claimed, next_due, still_open, found_full, found_due


def seal_claimed(state: WriteableBuffer, owned: int, sealed: int, block_size: int, claimed: tuple[int, ...], /) -> bool:
    """Seal a batch claim_ready() claimed, if its fields are in range and its blocks all ``owned``
    (``service/_fastpath.c`` says what it checks)."""
    states = memoryview(state).cast("B")
    if states.readonly:
        raise TypeError(f"seal_claimed() argument 1 must be read-write bytes-like object, not {type(state).__name__}")
    owned, sealed, block_size = _byte(owned), _byte(sealed), _int64(block_size)
    if not isinstance(claimed, tuple):
        raise TypeError(f"seal_claimed() argument 5 must be tuple, not {type(claimed).__name__}")
    if len(claimed) != 10:
        raise TypeError(f"seal_claimed() takes a tuple of 10 items, not {len(claimed)}")
    fields = [_int64(item) for item in claimed]
    block, record_count, length, base_timestamp, max_timestamp, batch_id, _, partition, block_count, _ = fields
    if block_size < 1:
        raise ValueError("block_size must be positive")
    # The length of the records and their count are the claim's; the rest is the client's word.
    if not (0 <= block < len(states) and batch_id >= 0 and 0 <= partition <= 2**31 - 1 and base_timestamp >= -1
            and max_timestamp >= -1 and 1 <= block_count <= len(states) - block and 1 <= record_count <= length
            and length <= block_count * block_size
            and all(value == owned for value in states[block:block + block_count])):
        return False
    states[block:block + block_count] = bytes([sealed]) * block_count
    return True
