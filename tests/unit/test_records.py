"""One v2 record at a time: the bytes applications write into shared memory.

The encoder is the client's fast path: its tests run against both twins (``fastpath``), the C
extension and its pure-Python twin; client_stub.contract.records re-exports the one in use.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub import _fastpath_py
from client_stub.contract.records import Record, decode_record, decode_records, record_boundaries
from client_stub.fastpath import encode_record
from tests.support.fastpath import CLIENT, c_extension

# Each vector below is written out field by field from the record layout:
#   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
#   keyLength varint, key | valueLength varint, value | header count varint |
#   per header: keyLength varint, key, valueLength varint, value
# Varints are zig-zag: 0 -> 00, 1 -> 02, 2 -> 04, 5 -> 0a, -1 -> 01.
KEYED = bytes([
    0x18,                       # length 12
    0x00,                       # attributes
    0x0a,                       # timestamp delta 5
    0x02,                       # offset delta 1
    0x02, *b"k",                # key length 1, key
    0x0a, *b"value",            # value length 5, value
    0x00,                       # no headers
])
NULL_KEY = bytes([0x0e, 0x00, 0x00, 0x00, 0x01, 0x02, *b"v", 0x00])          # length 7, key -1
NULL_VALUE = bytes([0x0e, 0x00, 0x00, 0x00, 0x02, *b"k", 0x01, 0x00])        # length 7, value -1
EMPTY_VALUE = bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00])              # length 6, value b""
WITH_HEADERS = bytes([
    0x20,                       # length 16
    0x00,
    0x01,                       # timestamp delta -1
    0x04,                       # offset delta 2
    0x01,                       # null key
    0x02, *b"v",
    0x04,                       # 2 headers
    0x04, *b"h1", 0x02, *b"x",  # "h1": b"x"
    0x04, *b"h2", 0x01,         # "h2": null
])
# A 100-byte value: its length (zig-zag 200 = c8 01) and the record's (107 -> 214 = d6 01) take 2 bytes.
LONG_VALUE = bytes([0xd6, 0x01, 0x00, 0x00, 0x00, 0x01, 0xc8, 0x01]) + b"x" * 100 + b"\x00"

VECTORS = [
    pytest.param(1, 5, b"k", b"value", [], KEYED, id="keyed"),
    pytest.param(0, 0, None, b"v", [], NULL_KEY, id="null-key"),
    pytest.param(0, 0, b"k", None, [], NULL_VALUE, id="null-value"),
    pytest.param(0, 0, None, b"", [], EMPTY_VALUE, id="empty-value"),
    pytest.param(2, -1, None, b"v", [(b"h1", b"x"), (b"h2", None)], WITH_HEADERS, id="headers"),
    pytest.param(0, 0, None, b"x" * 100, [], LONG_VALUE, id="two-byte-length"),
]


@pytest.mark.parametrize("fastpath", CLIENT)
@pytest.mark.parametrize(("offset_delta", "timestamp_delta", "key", "value", "headers", "expected"), VECTORS)
def test_record_bytes(fastpath: ModuleType, offset_delta, timestamp_delta, key, value, headers, expected) -> None:
    assert fastpath.encode_record(offset_delta, timestamp_delta, key, value, headers) == expected
    assert fastpath.record_size(offset_delta, timestamp_delta, key, value, headers) == len(expected)


@pytest.mark.parametrize(("offset_delta", "timestamp_delta", "key", "value", "headers", "expected"), VECTORS)
def test_record_decodes(offset_delta, timestamp_delta, key, value, headers, expected) -> None:
    record, end = decode_record(expected, 0)
    assert end == len(expected)
    assert record == Record(offset_delta, timestamp_delta, key, value,
                            [(k.decode(), v) for k, v in headers], 0)


@pytest.mark.parametrize("fastpath", CLIENT)
def test_key_and_value_may_be_any_buffer(fastpath: ModuleType) -> None:
    expected = fastpath.encode_record(3, 7, b"key", b"value", [(b"h", b"hv")])
    assert fastpath.encode_record(3, 7, bytearray(b"key"), memoryview(b"value"),
                                  [(b"h", memoryview(b"hv"))]) == expected


@pytest.mark.parametrize("fastpath", CLIENT)
@pytest.mark.parametrize(("args", "error", "match"), [
    pytest.param((2**63, 0, None, None), OverflowError, None, id="offset delta past int64"),
    pytest.param((0, -(2**63) - 1, None, None), OverflowError, None, id="timestamp delta below int64"),
    pytest.param((0.0, 0, None, None), TypeError, None, id="a float delta"),
    pytest.param((0, 0, "key", None), TypeError, "key must be bytes-like or None, got str", id="a str key"),
    pytest.param((0, 0, None, memoryview(b"value")[::2]), TypeError, "value must be bytes-like or None",
                 id="a value in pieces"),
    pytest.param((0, 0, None, None, [(b"k",)]), TypeError, r"a header is a \(key, value\) tuple", id="a lone key"),
    pytest.param((0, 0, None, None, [[b"k", b"v"]]), TypeError, "a header is a", id="a header as a list"),
    pytest.param((0, 0, None, None, [(None, b"v")]), TypeError, "a header key cannot be None", id="a null header key"),
    pytest.param((0, 0, None, None, [(b"k", 1)]), TypeError, "a header value must be bytes-like or None, got int",
                 id="an int header value"),
])
def test_what_the_encoder_refuses(fastpath: ModuleType, args: tuple, error: type[Exception], match: str | None) -> None:
    with pytest.raises(error, match=match):
        fastpath.encode_record(*args)
    with pytest.raises(error, match=match):
        fastpath.record_size(*args)
    with pytest.raises(error, match=match):
        fastpath.encode_record_into(bytearray(100), 0, *args)


@pytest.mark.parametrize("fastpath", CLIENT)
@pytest.mark.parametrize("buf", [b"\0" * 100, memoryview(bytearray(200))[::2], "text"], ids=["bytes", "strided", "str"])
def test_encode_record_into_writes_into_writable_contiguous_buffers_only(fastpath: ModuleType, buf: object) -> None:
    with pytest.raises(TypeError, match="argument 1 must be"):
        fastpath.encode_record_into(buf, 0, 0, 0, b"k", b"v")


# -- properties ---------------------------------------------------------------------------------

payloads = st.one_of(st.none(), st.just(b""), st.binary(max_size=300))
header_keys = st.text(max_size=10).map(lambda s: s.encode("utf-8"))
headers_lists = st.lists(st.tuples(header_keys, payloads), max_size=4)
deltas = st.one_of(st.integers(0, 10), st.integers(0, 2**31 - 1))
timestamp_deltas = st.one_of(st.integers(-100, 100), st.integers(-(2**63), 2**63 - 1))
records = st.tuples(deltas, timestamp_deltas, payloads, payloads, headers_lists)


def _expected(offset_delta, timestamp_delta, key, value, headers) -> Record:
    return Record(offset_delta, timestamp_delta, key, value, [(k.decode("utf-8"), v) for k, v in headers], 0)


@pytest.mark.parametrize("fastpath", CLIENT)
@settings(max_examples=200)
@given(records)
def test_record_round_trip(fastpath: ModuleType, rec) -> None:
    encoded = fastpath.encode_record(*rec)
    assert len(encoded) == fastpath.record_size(*rec)
    decoded, end = decode_record(b"\xee" + encoded + b"\xee", 1)
    assert end == 1 + len(encoded)
    assert decoded == _expected(*rec)


@pytest.mark.parametrize("fastpath", CLIENT)
@settings(max_examples=100)
@given(records, st.integers(0, 40), st.sampled_from(["bytearray", "memoryview"]))
def test_encode_into_at_an_offset(fastpath: ModuleType, rec, pos: int, kind: str) -> None:
    size = fastpath.record_size(*rec)
    backing = bytearray(b"\xaa" * (pos + size + 8))
    target = backing if kind == "bytearray" else memoryview(backing)
    end = fastpath.encode_record_into(target, pos, *rec)
    assert end == pos + size
    assert bytes(backing[pos:end]) == fastpath.encode_record(*rec)
    # Nothing outside the record's bytes was touched.
    assert backing[:pos] == b"\xaa" * pos
    assert backing[end:] == b"\xaa" * 8


@settings(max_examples=100)
@given(st.lists(records, max_size=8))
def test_concatenated_records(recs) -> None:
    encoded = [encode_record(*rec) for rec in recs]
    data = b"".join(encoded)
    bounds = [0]
    for e in encoded:
        bounds.append(bounds[-1] + len(e))
    assert record_boundaries(data) == bounds
    assert record_boundaries(memoryview(data)) == bounds
    assert decode_records(data) == [_expected(*rec) for rec in recs]
    assert decode_records(memoryview(data), len(recs)) == [_expected(*rec) for rec in recs]


# -- malformed input ----------------------------------------------------------------------------

@pytest.mark.parametrize("encoded", [KEYED, NULL_KEY, NULL_VALUE, EMPTY_VALUE, WITH_HEADERS, LONG_VALUE])
def test_truncated_record_raises(encoded: bytes) -> None:
    for cut in range(len(encoded)):
        with pytest.raises(ValueError):
            decode_record(encoded[:cut], 0)
        if cut:
            with pytest.raises(ValueError):
                decode_records(encoded[:cut])
            with pytest.raises(ValueError):
                record_boundaries(encoded[:cut])


def test_truncated_second_record_raises() -> None:
    data = KEYED + WITH_HEADERS[:-3]
    with pytest.raises(ValueError):
        decode_records(data)
    with pytest.raises(ValueError):
        record_boundaries(data)


def test_length_shorter_than_the_fields_raises() -> None:
    # The length says 11 but the fields take 12 bytes: the header count lies past the end.
    with pytest.raises(ValueError):
        decode_record(b"\x16" + KEYED[1:], 0)


def test_length_longer_than_the_fields_raises() -> None:
    # The length covers one byte more than the fields use.
    with pytest.raises(ValueError, match="trailing"):
        decode_record(b"\x1a" + KEYED[1:] + b"\x00", 0)


@pytest.mark.parametrize("data", [b"\x00", b"\x01", b"\x00" + KEYED])
def test_empty_or_negative_length_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_record(data, 0)
    with pytest.raises(ValueError):
        record_boundaries(data)


def test_negative_header_count_raises() -> None:
    with pytest.raises(ValueError, match="header count"):
        decode_record(bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01]), 0)


def test_null_header_key_raises() -> None:
    with pytest.raises(ValueError, match="null header key"):
        decode_record(bytes([0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x01, 0x00]), 0)


def test_record_count_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        decode_records(KEYED + NULL_KEY, 3)
    with pytest.raises(ValueError):
        decode_records(KEYED + NULL_KEY, 1)
    assert len(decode_records(KEYED + NULL_KEY, 2)) == 2


# -- the twins ----------------------------------------------------------------------------------

C_FASTPATH = c_extension("client_stub._fastpath")


@pytest.mark.skipif(C_FASTPATH is None, reason="client_stub._fastpath is not built")
@settings(max_examples=300)
@given(records)
def test_the_twins_encode_alike(rec) -> None:
    assert _fastpath_py.encode_record(*rec) == C_FASTPATH.encode_record(*rec)  # type: ignore[union-attr]
