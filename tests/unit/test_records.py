"""One v2 record at a time: the bytes applications write into shared memory."""

from __future__ import annotations

import mmap
import multiprocessing
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub.contract.records import (
    Record,
    decode_record,
    decode_records,
    encode_record,
    encode_record_into,
    rebase_records,
    record_boundaries,
    record_size,
)

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


@pytest.mark.parametrize(("offset_delta", "timestamp_delta", "key", "value", "headers", "expected"), VECTORS)
def test_record_bytes(offset_delta, timestamp_delta, key, value, headers, expected) -> None:
    assert encode_record(offset_delta, timestamp_delta, key, value, headers) == expected
    assert record_size(offset_delta, timestamp_delta, key, value, headers) == len(expected)


@pytest.mark.parametrize(("offset_delta", "timestamp_delta", "key", "value", "headers", "expected"), VECTORS)
def test_record_decodes(offset_delta, timestamp_delta, key, value, headers, expected) -> None:
    record, end = decode_record(expected, 0)
    assert end == len(expected)
    assert record == Record(offset_delta, timestamp_delta, key, value,
                            [(k.decode(), v) for k, v in headers], 0)


def test_key_and_value_may_be_any_buffer() -> None:
    expected = encode_record(3, 7, b"key", b"value", [(b"h", b"hv")])
    assert encode_record(3, 7, bytearray(b"key"), memoryview(b"value"), [(b"h", memoryview(b"hv"))]) == expected


# -- properties ---------------------------------------------------------------------------------

payloads = st.one_of(st.none(), st.just(b""), st.binary(max_size=300))
header_keys = st.text(max_size=10).map(lambda s: s.encode("utf-8"))
headers_lists = st.lists(st.tuples(header_keys, payloads), max_size=4)
deltas = st.one_of(st.integers(0, 10), st.integers(0, 2**31 - 1))
timestamp_deltas = st.one_of(st.integers(-100, 100), st.integers(-(2**63), 2**63 - 1))
records = st.tuples(deltas, timestamp_deltas, payloads, payloads, headers_lists)


def _expected(offset_delta, timestamp_delta, key, value, headers) -> Record:
    return Record(offset_delta, timestamp_delta, key, value, [(k.decode("utf-8"), v) for k, v in headers], 0)


@settings(max_examples=200)
@given(records)
def test_record_round_trip(rec) -> None:
    encoded = encode_record(*rec)
    assert len(encoded) == record_size(*rec)
    decoded, end = decode_record(b"\xee" + encoded + b"\xee", 1)
    assert end == 1 + len(encoded)
    assert decoded == _expected(*rec)


@settings(max_examples=100)
@given(records, st.integers(0, 40), st.sampled_from(["bytearray", "memoryview"]))
def test_encode_into_at_an_offset(rec, pos: int, kind: str) -> None:
    size = record_size(*rec)
    backing = bytearray(b"\xaa" * (pos + size + 8))
    target = backing if kind == "bytearray" else memoryview(backing)
    end = encode_record_into(target, pos, *rec)
    assert end == pos + size
    assert bytes(backing[pos:end]) == encode_record(*rec)
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


# -- rebase_records: a batch's records moved into a coalesced batch ------------------------------

# Deltas that stay within int64 once shifted.
small_timestamp_deltas = st.integers(-(2**40), 2**40)
rebased_records = st.tuples(deltas, small_timestamp_deltas, payloads, payloads, headers_lists)


@settings(max_examples=200)
@given(st.lists(rebased_records, min_size=1, max_size=8), st.integers(0, 2**31 - 9), small_timestamp_deltas)
def test_rebase_is_the_encoder_with_new_deltas(recs, first: int, shift: int) -> None:
    """Byte for byte what the encoder writes at offset deltas ``first``, ``first + 1``... and timestamp
    deltas ``shift`` higher, whatever offset deltas the records had."""
    data = b"".join(encode_record(*rec) for rec in recs)
    expected = b"".join(encode_record(first + i, ts + shift, k, v, h) for i, (_, ts, k, v, h) in enumerate(recs))
    assert rebase_records(data, len(recs), first, shift) == expected
    assert rebase_records(memoryview(bytearray(data)), len(recs), first, shift) == expected


def test_rebase_keeps_keys_values_headers_and_nulls() -> None:
    # Offset deltas from 64 take two bytes (zig-zag 128): every record's length changes.
    rebased = rebase_records(KEYED + WITH_HEADERS + NULL_KEY + NULL_VALUE + EMPTY_VALUE + LONG_VALUE, 6, 64, 100)
    assert decode_records(rebased, 6) == [
        Record(64, 105, b"k", b"value", [], 0),
        Record(65, 99, None, b"v", [("h1", b"x"), ("h2", None)], 0),
        Record(66, 100, None, b"v", [], 0),
        Record(67, 100, b"k", None, [], 0),
        Record(68, 100, None, b"", [], 0),
        Record(69, 100, None, b"x" * 100, [], 0),
    ]


def test_rebase_of_nothing_is_nothing() -> None:
    assert rebase_records(b"", 0, 5, 5) == b""


@pytest.mark.parametrize("encoded", [KEYED, NULL_KEY, NULL_VALUE, EMPTY_VALUE, WITH_HEADERS, LONG_VALUE])
def test_rebase_refuses_a_truncated_record(encoded: bytes) -> None:
    for cut in range(len(encoded)):
        with pytest.raises(ValueError, match="well-formed"):
            rebase_records(KEYED + encoded[:cut], 2, 0, 0)


@pytest.mark.parametrize(("data", "count"), [
    pytest.param(KEYED + b"\x00", 1, id="a trailing byte"),
    pytest.param(KEYED + NULL_KEY, 1, id="a record more than counted"),
    pytest.param(KEYED + NULL_KEY, 3, id="a record less than counted"),
    pytest.param(KEYED, 0, id="records where none are counted"),
    pytest.param(KEYED, -1, id="a negative count"),
])
def test_rebase_refuses_records_that_are_not_the_count(data: bytes, count: int) -> None:
    with pytest.raises(ValueError, match="well-formed"):
        rebase_records(data, count, 0, 0)


@pytest.mark.parametrize("data", [
    pytest.param(b"\x16" + KEYED[1:], id="record length shorter than its fields"),
    pytest.param(b"\x1a" + KEYED[1:] + b"\x00", id="record length longer than its fields"),
    pytest.param(b"\x00", id="record length 0"),
    pytest.param(b"\x01" + KEYED, id="record length -1"),
    pytest.param(b"\xff" * 11, id="a varint of more than 64 bits"),
    pytest.param(KEYED[:4] + b"\x14" + KEYED[5:], id="key length past the record"),
    pytest.param(KEYED[:6] + b"\x14" + KEYED[7:], id="value length past the record"),
    pytest.param(bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01]), id="header count -1"),
    pytest.param(bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02]), id="a header missing"),
    pytest.param(bytes([0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x01, 0x00]), id="null header key"),
])
def test_rebase_refuses_bad_lengths_inside_a_record(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_records(data, 1)  # the decoder agrees that these are not records
    with pytest.raises(ValueError, match="well-formed"):
        rebase_records(data, 1, 0, 0)
    with pytest.raises(ValueError, match="well-formed"):
        rebase_records(KEYED + data, 2, 0, 0)  # nor after a good one


@pytest.mark.parametrize("data", [
    pytest.param(bytes([0x0e, 0x00, 0x00, 0x00, 0x03, 0x02, *b"v", 0x00]), id="key length -2"),
    pytest.param(bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x03, 0x00]), id="value length -2"),
    pytest.param(bytes([0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x03]), id="header value length -2"),
])
def test_rebase_refuses_lengths_below_null(data: bytes) -> None:
    """Stricter than Java's reader (any negative length is null there): no client writes these, and
    such a batch is only left to go alone."""
    assert len(decode_records(data, 1)) == 1
    with pytest.raises(ValueError, match="well-formed"):
        rebase_records(data, 1, 0, 0)


def test_rebase_refuses_deltas_that_would_overflow() -> None:
    record = encode_record(0, 2**62, None, b"v")
    with pytest.raises(ValueError, match="record 0: its timestamp or offset delta is out of range"):
        rebase_records(record, 1, 0, 2**62)
    with pytest.raises(ValueError, match="out of range"):
        rebase_records(record + record, 2, 2**63 - 1, 0)


def _rewrite_until(shared: mmap.mmap, states: list[bytes], deadline: float) -> None:
    # Bounded in time: it stops by itself even if the process that started it died.
    while time.monotonic() < deadline:
        for state in states:
            shared[:len(state)] = state


def test_rebase_of_records_their_client_rewrites_meanwhile_is_one_state_or_refused() -> None:
    # A client may rewrite a sealed block while the daemon coalesces it: one record with a long value,
    # then two with short ones, over the same bytes. Each call reads one copy: what it returns is
    # well-formed records (their bytes may mix the two states: the client's own records, garbled by
    # the client), or it refuses with ValueError; it never writes past what it sized, which crashed
    # the daemon for every client of the host.
    long_one = encode_record(0, 0, None, b"x" * 200)
    short_two = encode_record(0, 0, None, b"y" * 90) + encode_record(1, 0, None, b"z" * 100)
    length = max(len(long_one), len(short_two))
    states = [long_one.ljust(length, b"\0"), short_two.ljust(length, b"\0")]
    shared = mmap.mmap(-1, length)
    deadline = time.monotonic() + 2
    writer = multiprocessing.get_context("fork").Process(target=_rewrite_until, args=(shared, states, deadline + 5),
                                                         daemon=True)
    writer.start()
    try:
        outcomes: Counter[str] = Counter()
        while time.monotonic() < deadline:
            for view, count in ((memoryview(shared)[:len(long_one)], 1), (memoryview(shared)[:len(short_two)], 2)):
                try:
                    result = rebase_records(view, count, 7, 3)
                except ValueError:
                    outcomes["refused"] += 1
                else:
                    assert [r.offset_delta for r in decode_records(result, count)] == list(range(7, 7 + count))
                    outcomes["rebased"] += 1
                finally:
                    view.release()
        assert outcomes["rebased"] and outcomes["refused"]
    finally:
        writer.kill()
        writer.join()
        shared.close()
