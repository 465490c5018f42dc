"""Kafka protocol primitive types: readers and writers over bytes.

Writers append to a :class:`Writer`; readers take a buffer and a position and
return ``(value, next position)``. Flexible versions (KIP-482) use the compact
forms: unsigned-varint lengths stored as length + 1, with 0 for null.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from client_stub.contract import records
from client_stub.contract.records import Buffer, uvarint

# Sizes and lengths read and written by hand; the messages' own fields are packed by the code schema.py compiles.
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")

ZERO_UUID = bytes(16)


class ProtocolError(ValueError):
    """Bytes that do not decode as the expected Kafka message."""


class Writer:
    """Collects an encoded message as a list of buffers.

    Most fields go into the current bytearray; record data handed over by
    :meth:`external` is kept as the caller's buffers (shared memory, for the
    produce path) so that it reaches the socket without a copy.
    """

    __slots__ = ("buf", "parts")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.parts: list[Buffer] = []

    def external(self, pieces: Sequence[Buffer]) -> None:
        """Append ``pieces`` without copying them."""
        if self.buf:
            self.parts.append(self.buf)
            self.buf = bytearray()
        self.parts.extend(pieces)

    def finish(self) -> list[Buffer]:
        """The encoded message as buffers, in order."""
        if self.buf:
            self.parts.append(self.buf)
            self.buf = bytearray()
        return self.parts

    def getvalue(self) -> bytes:
        """The encoded message as one bytes object (copies)."""
        return b"".join(self.finish())


def write_string(buf: bytearray, value: str | None) -> None:
    if value is None:
        buf += b"\xff\xff"
        return
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ProtocolError(f"string of {len(data)} bytes is too long for an INT16 length")
    buf += INT16.pack(len(data))
    buf += data


def write_compact_string(buf: bytearray, value: str | None) -> None:
    if value is None:
        buf.append(0)
        return
    data = value.encode("utf-8")
    buf += uvarint(len(data) + 1)
    buf += data


def write_bytes(buf: bytearray, value: Buffer | None) -> None:
    if value is None:
        buf += b"\xff\xff\xff\xff"
        return
    buf += INT32.pack(len(value))
    buf += value


def write_compact_bytes(buf: bytearray, value: Buffer | None) -> None:
    if value is None:
        buf.append(0)
        return
    buf += uvarint(len(value) + 1)
    buf += value


def write_records(w: Writer, value: Buffer | Sequence[Buffer] | None, flexible: bool) -> None:
    """A RECORDS field: nullable bytes given as one buffer or as pieces sent without a copy."""
    if value is None:
        w.buf += b"\x00" if flexible else b"\xff\xff\xff\xff"
        return
    pieces = [value] if isinstance(value, (bytes, bytearray, memoryview)) else value
    size = sum(len(p) if not isinstance(p, memoryview) else p.nbytes for p in pieces)
    w.buf += uvarint(size + 1) if flexible else INT32.pack(size)
    w.external(pieces)


def write_array_length(buf: bytearray, value: Sequence | None, flexible: bool) -> None:
    if flexible:
        buf += uvarint(0 if value is None else len(value) + 1)
    else:
        buf += INT32.pack(-1 if value is None else len(value))


def write_tagged_fields(buf: bytearray, tagged: list[tuple[int, bytes]]) -> None:
    buf += uvarint(len(tagged))
    for tag, data in tagged:
        buf += uvarint(tag)
        buf += uvarint(len(data))
        buf += data


def read_uvarint(data: Buffer, pos: int) -> tuple[int, int]:
    """An unsigned varint; a truncated or oversized one is a :class:`ProtocolError`."""
    try:
        return records.read_uvarint(data, pos)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def _check(data: Buffer, end: int) -> None:
    if end > len(data):
        raise ProtocolError(f"message truncated: need {end} bytes, have {len(data)}")


def read_string(data: Buffer, pos: int) -> tuple[str | None, int]:
    _check(data, pos + 2)
    (length,) = INT16.unpack_from(data, pos)
    pos += 2
    if length < 0:
        return None, pos
    _check(data, pos + length)
    return bytes(data[pos:pos + length]).decode("utf-8"), pos + length


def read_compact_string(data: Buffer, pos: int) -> tuple[str | None, int]:
    length, pos = read_uvarint(data, pos)
    if length == 0:
        return None, pos
    end = pos + length - 1
    _check(data, end)
    return bytes(data[pos:end]).decode("utf-8"), end


def read_bytes(data: Buffer, pos: int) -> tuple[bytes | None, int]:
    _check(data, pos + 4)
    (length,) = INT32.unpack_from(data, pos)
    pos += 4
    if length < 0:
        return None, pos
    _check(data, pos + length)
    return bytes(data[pos:pos + length]), pos + length


def read_compact_bytes(data: Buffer, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_uvarint(data, pos)
    if length == 0:
        return None, pos
    end = pos + length - 1
    _check(data, end)
    return bytes(data[pos:end]), end


def read_array_length(data: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    """Element count of an array (-1 for null)."""
    if flexible:
        length, pos = read_uvarint(data, pos)
        return length - 1, pos
    _check(data, pos + 4)
    (length,) = INT32.unpack_from(data, pos)
    return length, pos + 4


def read_tagged_fields(data: Buffer, pos: int) -> tuple[dict[int, memoryview], int]:
    """The tagged-field section: tag -> raw field bytes."""
    count, pos = read_uvarint(data, pos)
    fields: dict[int, memoryview] = {}
    view = memoryview(data)
    for _ in range(count):
        tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        _check(data, pos + size)
        fields[tag] = view[pos:pos + size]
        pos += size
    return fields, pos


def skip_tagged_fields(data: Buffer, pos: int) -> int:
    """Skip a tagged-field section, returning the position after it."""
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
    _check(data, pos)
    return pos
