"""Kafka's v2 record format (KIP-98), one record at a time.

Applications encode their records themselves, straight into the shared-memory
block of their batch; the daemon only wraps a batch header around those bytes.
This module is that shared contract: varints, and the record layout::

    length: varint              (of everything after it)
    attributes: int8            (unused, 0)
    timestampDelta: varlong     (from the batch's base timestamp)
    offsetDelta: varint         (from the batch's base offset)
    keyLength: varint, key      (-1 for a null key)
    valueLength: varint, value  (-1 for a null value)
    headers: varint count, then per header
        headerKeyLength: varint, headerKey (UTF-8)
        headerValueLength: varint, headerValue (-1 for null)

Varints are zig-zag encoded, as protobuf's sint32/sint64.

The encoder runs once per record in every producing process: it is the client's fast path
(``client_stub.fastpath``: in C, ``client_stub/_fastpath.c``, or its pure-Python twin,
``client_stub/_fastpath_py.py``); the decoder, for the daemon's splits and the tests, is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

Buffer: TypeAlias = bytes | bytearray | memoryview
Header = tuple[bytes, "bytes | None"]

# The RecordBatch v2 header that the daemon writes around a batch's records: what a batch of
# records costs against max.request.size, known to the client before it sends one.
BATCH_HEADER_SIZE = 61

__all__ = ["BATCH_HEADER_SIZE", "Buffer", "Header", "Record", "decode_record", "decode_records", "encode_uvarint",
           "read_uvarint", "read_varint", "record_boundaries", "unzigzag", "uvarint", "varint", "varint_size",
           "zigzag"]


# Most deltas, lengths and counts of a record take one byte: those are made once.
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def encode_uvarint(value: int) -> bytes:
    """Unsigned varint bytes of ``value``, unchecked: 0 <= value < 2**64 is the caller's to ensure."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    """Zig-zag map a signed 64-bit integer to an unsigned one (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    """Inverse of :func:`zigzag`."""
    return (value >> 1) ^ -(value & 1)


def uvarint(value: int) -> bytes:
    """Unsigned varint bytes of ``value`` (0 <= value < 2**64)."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"unsigned varint out of range: {value}")
    return encode_uvarint(value)


def varint(value: int) -> bytes:
    """Zig-zag varint bytes of a signed 64-bit ``value``."""
    if value < -(1 << 63) or value >= 1 << 63:
        raise ValueError(f"varint out of range: {value}")
    return encode_uvarint(zigzag(value))


def varint_size(value: int) -> int:
    """Bytes taken by the zig-zag varint of ``value``."""
    return (max(zigzag(value).bit_length(), 1) + 6) // 7


def read_uvarint(data: Buffer, pos: int) -> tuple[int, int]:
    """Read an unsigned varint at ``pos``; returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        try:
            byte = data[pos]
        except IndexError:
            raise ValueError("truncated varint") from None
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if shift == 63 and byte > 1:
                raise ValueError("varint does not fit in 64 bits")
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def read_varint(data: Buffer, pos: int) -> tuple[int, int]:
    """Read a zig-zag varint at ``pos``; returns (value, next position)."""
    value, pos = read_uvarint(data, pos)
    return unzigzag(value), pos


@dataclass(slots=True)
class Record:
    """A decoded v2 record; deltas are relative to its batch."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


def _read_nullable(data: Buffer, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(data, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(data):
        raise ValueError("record field runs past the end of the record")
    return bytes(data[pos:end]), end


def decode_record(data: Buffer, pos: int) -> tuple[Record, int]:
    """Decode the record at ``pos``; returns it and the position after it."""
    length, pos = read_varint(data, pos)
    end = pos + length
    if length < 1 or end > len(data):
        raise ValueError(f"record length {length} out of bounds")
    view = memoryview(data)[:end]
    attributes = view[pos]
    timestamp_delta, p = read_varint(view, pos + 1)
    offset_delta, p = read_varint(view, p)
    key, p = _read_nullable(view, p)
    value, p = _read_nullable(view, p)
    count, p = read_varint(view, p)
    if count < 0:
        raise ValueError(f"record header count {count} is negative")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        hkey, p = _read_nullable(view, p)
        if hkey is None:
            raise ValueError("null header key")
        hvalue, p = _read_nullable(view, p)
        headers.append((hkey.decode("utf-8"), hvalue))
    if p != end:
        raise ValueError(f"record has {end - p} trailing bytes")
    return Record(offset_delta, timestamp_delta, key, value, headers, attributes), end


def decode_records(data: Buffer, count: int | None = None) -> list[Record]:
    """Decode consecutive records filling ``data`` (exactly ``count`` if given)."""
    records: list[Record] = []
    pos = 0
    while pos < len(data) and (count is None or len(records) < count):
        record, pos = decode_record(data, pos)
        records.append(record)
    if count is not None and len(records) != count:
        raise ValueError(f"expected {count} records, found {len(records)}")
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes after the last record")
    return records


def record_boundaries(data: Buffer) -> list[int]:
    """Start positions of the records in ``data``, plus its end; reads only length prefixes."""
    bounds = [0]
    pos = 0
    while pos < len(data):
        length, p = read_varint(data, pos)
        pos = p + length
        if length < 1 or pos > len(data):
            raise ValueError("record length out of bounds")
        bounds.append(pos)
    return bounds
