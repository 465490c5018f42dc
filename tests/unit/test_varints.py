"""Varints of Kafka's v2 record format: unsigned LEB128 and zig-zag signed varints."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub.contract.records import read_uvarint, read_varint, unzigzag, uvarint, varint, varint_size, zigzag

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

# Zig-zag varints worked out by hand: n -> 2n (n >= 0) or -2n - 1 (n < 0), then 7 bits per byte,
# low group first, high bit set on every byte but the last. Values around +-8192 straddle the
# module's lookup table of small varints.
SIGNED_VECTORS = [
    (0, b"\x00"),
    (1, b"\x02"),
    (-1, b"\x01"),
    (2, b"\x04"),
    (-2, b"\x03"),
    (63, b"\x7e"),
    (-64, b"\x7f"),
    (64, b"\x80\x01"),
    (-65, b"\x81\x01"),
    (150, b"\xac\x02"),
    (8191, b"\xfe\x7f"),
    (-8192, b"\xff\x7f"),
    (8192, b"\x80\x80\x01"),
    (-8193, b"\x81\x80\x01"),
    (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
    (-(2**31), b"\xff\xff\xff\xff\x0f"),
    (INT64_MAX, b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
    (INT64_MIN, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
]

UNSIGNED_VECTORS = [
    (0, b"\x00"),
    (1, b"\x01"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (300, b"\xac\x02"),
    (16383, b"\xff\x7f"),
    (16384, b"\x80\x80\x01"),
    (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    (UINT64_MAX, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
]


@pytest.mark.parametrize(("value", "encoded"), SIGNED_VECTORS)
def test_varint_bytes(value: int, encoded: bytes) -> None:
    assert varint(value) == encoded
    assert varint_size(value) == len(encoded)
    assert read_varint(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize(("value", "encoded"), UNSIGNED_VECTORS)
def test_uvarint_bytes(value: int, encoded: bytes) -> None:
    assert uvarint(value) == encoded
    assert read_uvarint(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize(("value", "mapped"), [
    (0, 0), (-1, 1), (1, 2), (-2, 3), (2, 4), (INT64_MAX, UINT64_MAX - 1), (INT64_MIN, UINT64_MAX),
])
def test_zigzag_mapping(value: int, mapped: int) -> None:
    assert zigzag(value) == mapped
    assert unzigzag(mapped) == value


def test_read_at_an_offset_returns_the_next_position() -> None:
    data = b"junk" + varint(-65) + uvarint(300) + b"tail"
    value, pos = read_varint(data, 4)
    assert (value, pos) == (-65, 6)
    assert read_uvarint(data, pos) == (300, 8)
    assert read_varint(memoryview(bytearray(data)), 4) == (-65, 6)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 2**70, -(2**70)])
def test_varint_out_of_range_raises(value: int) -> None:
    with pytest.raises(ValueError):
        varint(value)


@pytest.mark.parametrize("value", [-1, UINT64_MAX + 1, -(2**63)])
def test_uvarint_out_of_range_raises(value: int) -> None:
    with pytest.raises(ValueError):
        uvarint(value)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff", b"\xac", b"\xff" * 9])
def test_truncated_varint_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        read_uvarint(data, 0)
    with pytest.raises(ValueError):
        read_varint(data, 0)


def test_read_past_the_end_raises() -> None:
    with pytest.raises(ValueError):
        read_varint(b"\x02", 1)


@pytest.mark.parametrize("data", [
    b"\xff" * 10 + b"\x01",          # 11 bytes
    b"\x80" * 10 + b"\x00",          # 11 bytes, even though the value would be 0
    b"\xff" * 9 + b"\x02",           # 10 bytes whose value needs 65 bits
    b"\x80" * 9 + b"\x7f",           # 10 bytes, 2**63 * 127
])
def test_overlong_varint_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        read_uvarint(data, 0)
    with pytest.raises(ValueError):
        read_varint(data, 0)


@settings(max_examples=300)
@given(st.integers(INT64_MIN, INT64_MAX), st.binary(max_size=3))
def test_varint_round_trip(value: int, trailer: bytes) -> None:
    encoded = varint(value)
    assert len(encoded) == varint_size(value)
    assert 1 <= len(encoded) <= 10
    assert all(b & 0x80 for b in encoded[:-1]) and not encoded[-1] & 0x80
    assert read_varint(b"\x00" + encoded + trailer, 1) == (value, 1 + len(encoded))


@settings(max_examples=300)
@given(st.integers(0, UINT64_MAX))
def test_uvarint_round_trip(value: int) -> None:
    encoded = uvarint(value)
    assert len(encoded) == max(1, -(-value.bit_length() // 7))
    assert read_uvarint(encoded, 0) == (value, len(encoded))


@settings(max_examples=300)
@given(st.one_of(st.integers(-20000, 20000), st.integers(INT64_MIN, INT64_MAX)))
def test_varint_size_matches_encoding(value: int) -> None:
    assert varint_size(value) == len(varint(value))


@settings(max_examples=300)
@given(st.integers(INT64_MIN, INT64_MAX))
def test_varint_is_uvarint_of_zigzag(value: int) -> None:
    # Independent statement of the zig-zag map: non-negatives to evens, negatives to odds.
    mapped = 2 * value if value >= 0 else -2 * value - 1
    assert zigzag(value) == mapped
    assert varint(value) == uvarint(mapped)
