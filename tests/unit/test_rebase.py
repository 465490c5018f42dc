"""rebase_records: the records of a batch, re-encoded for the coalesced batch that holds them; and
copy_records: the records of a batch that goes as it is, copied and checked.

The daemon's (ProducerBatch.coalesce and ProducerBatch.read_records): every test runs against both
twins (``fastpath``), the C extension ``service._fastpath`` and its pure-Python twin
``service._fastpath_py``. Both functions refuse the same records, with the same error.
"""

from __future__ import annotations

import mmap
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub.contract.records import Record, decode_records
from client_stub.fastpath import encode_record
from service import _fastpath_py
from tests.support.fastpath import DAEMON, c_extension
from tests.unit.test_records import (
    EMPTY_VALUE,
    KEYED,
    LONG_VALUE,
    NULL_KEY,
    NULL_VALUE,
    WITH_HEADERS,
    deltas,
    headers_lists,
    payloads,
)


@pytest.fixture(params=DAEMON)
def fastpath(request: pytest.FixtureRequest) -> ModuleType:
    """One twin of the daemon's fast path: the C extension or its pure-Python twin."""
    return request.param


# Deltas that stay within int64 once shifted.
small_timestamp_deltas = st.integers(-(2**40), 2**40)
rebased_records = st.tuples(deltas, small_timestamp_deltas, payloads, payloads, headers_lists)


@pytest.mark.parametrize("twin", DAEMON)
@settings(max_examples=200)
@given(st.lists(rebased_records, min_size=1, max_size=8), st.integers(0, 2**31 - 9), small_timestamp_deltas)
def test_rebase_is_the_encoder_with_new_deltas(twin: ModuleType, recs, first: int, shift: int) -> None:
    """Byte for byte what the encoder writes at offset deltas ``first``, ``first + 1``... and timestamp
    deltas ``shift`` higher, whatever offset deltas the records had."""
    data = b"".join(encode_record(*rec) for rec in recs)
    expected = b"".join(encode_record(first + i, ts + shift, k, v, h) for i, (_, ts, k, v, h) in enumerate(recs))
    assert twin.rebase_records(data, len(recs), first, shift) == expected
    assert twin.rebase_records(memoryview(bytearray(data)), len(recs), first, shift) == expected


@pytest.mark.parametrize("twin", DAEMON)
@settings(max_examples=100)
@given(st.lists(rebased_records, max_size=8))
def test_copy_is_the_records_as_they_are(twin: ModuleType, recs) -> None:
    data = b"".join(encode_record(*rec) for rec in recs)
    for records in (data, memoryview(bytearray(data)), bytearray(data)):
        copy = twin.copy_records(records, len(recs))
        assert type(copy) is bytes and copy == data


def refused(fastpath: ModuleType, data: bytes, count: int) -> str:
    """Both reads refuse ``data`` as ``count`` records, with the same error (naming the record and the byte
    where the records stop): its message."""
    with pytest.raises(ValueError, match="well-formed") as rebased:
        fastpath.rebase_records(data, count, 0, 0)
    with pytest.raises(ValueError, match="well-formed") as copied:
        fastpath.copy_records(memoryview(bytearray(data)), count)
    assert str(copied.value) == str(rebased.value)
    return str(copied.value)


def test_rebase_keeps_keys_values_headers_and_nulls(fastpath: ModuleType) -> None:
    # Offset deltas from 64 take two bytes (zig-zag 128): every record's length changes.
    data = KEYED + WITH_HEADERS + NULL_KEY + NULL_VALUE + EMPTY_VALUE + LONG_VALUE
    rebased = fastpath.rebase_records(data, 6, 64, 100)
    assert decode_records(rebased, 6) == [
        Record(64, 105, b"k", b"value", [], 0),
        Record(65, 99, None, b"v", [("h1", b"x"), ("h2", None)], 0),
        Record(66, 100, None, b"v", [], 0),
        Record(67, 100, b"k", None, [], 0),
        Record(68, 100, None, b"", [], 0),
        Record(69, 100, None, b"x" * 100, [], 0),
    ]


def test_rebase_of_nothing_is_nothing(fastpath: ModuleType) -> None:
    assert fastpath.rebase_records(b"", 0, 5, 5) == b""


@pytest.mark.parametrize("encoded", [KEYED, NULL_KEY, NULL_VALUE, EMPTY_VALUE, WITH_HEADERS, LONG_VALUE])
def test_rebase_refuses_a_truncated_record(fastpath: ModuleType, encoded: bytes) -> None:
    for cut in range(len(encoded)):
        assert refused(fastpath, KEYED + encoded[:cut], 2) == \
            f"not 2 well-formed records (record 1, byte {len(KEYED)} of {len(KEYED) + cut})"


@pytest.mark.parametrize(("data", "count"), [
    pytest.param(KEYED + b"\x00", 1, id="a trailing byte"),
    pytest.param(KEYED + NULL_KEY, 1, id="a record more than counted"),
    pytest.param(KEYED + NULL_KEY, 3, id="a record less than counted"),
    pytest.param(KEYED, 0, id="records where none are counted"),
    pytest.param(KEYED, -1, id="a negative count"),
])
def test_rebase_refuses_records_that_are_not_the_count(fastpath: ModuleType, data: bytes, count: int) -> None:
    refused(fastpath, data, count)


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
def test_rebase_refuses_bad_lengths_inside_a_record(fastpath: ModuleType, data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_records(data, 1)  # the decoder agrees that these are not records
    assert refused(fastpath, data, 1) == f"not 1 well-formed records (record 0, byte 0 of {len(data)})"
    # Nor after a good one.
    assert refused(fastpath, KEYED + data, 2) == \
        f"not 2 well-formed records (record 1, byte {len(KEYED)} of {len(KEYED + data)})"


@pytest.mark.parametrize("data", [
    pytest.param(bytes([0x0e, 0x00, 0x00, 0x00, 0x03, 0x02, *b"v", 0x00]), id="key length -2"),
    pytest.param(bytes([0x0c, 0x00, 0x00, 0x00, 0x01, 0x03, 0x00]), id="value length -2"),
    pytest.param(bytes([0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x03]), id="header value length -2"),
])
def test_rebase_refuses_lengths_below_null(fastpath: ModuleType, data: bytes) -> None:
    """Stricter than Java's reader (any negative length is null there): no client writes these, and
    such a batch is only left to go alone."""
    assert len(decode_records(data, 1)) == 1
    refused(fastpath, data, 1)


def test_rebase_refuses_deltas_that_would_overflow(fastpath: ModuleType) -> None:
    record = encode_record(0, 2**62, None, b"v")
    with pytest.raises(ValueError, match="record 0: its timestamp or offset delta is out of range"):
        fastpath.rebase_records(record, 1, 0, 2**62)
    with pytest.raises(ValueError, match="out of range"):
        fastpath.rebase_records(record + record, 2, 2**63 - 1, 0)


def _rewrite_until(shared: mmap.mmap, states: list[bytes], deadline: float) -> None:
    # Bounded in time: it stops by itself even if the process that started it died.
    while time.monotonic() < deadline:
        for state in states:
            shared[:len(state)] = state


def test_reads_of_records_their_client_rewrites_meanwhile_are_one_state_or_refused(fastpath: ModuleType) -> None:
    # A client may rewrite a sealed block while the daemon coalesces or copies it: one record with a long
    # value, then two with short ones, over the same bytes. Each call reads one copy: what it returns is
    # well-formed records (their bytes may mix the two states: the client's own records, garbled by
    # the client), or it refuses with ValueError; rebase_records never writes past what it sized, which
    # crashed the daemon for every client of the host.
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
                    result = fastpath.rebase_records(view, count, 7, 3)
                except ValueError:
                    outcomes["refused"] += 1
                else:
                    assert [r.offset_delta for r in decode_records(result, count)] == list(range(7, 7 + count))
                    outcomes["rebased"] += 1
                try:
                    copy = fastpath.copy_records(view, count)
                except ValueError:
                    outcomes["copy refused"] += 1
                else:
                    assert len(decode_records(copy, count)) == count
                    outcomes["copied"] += 1
                finally:
                    view.release()
        assert outcomes["rebased"] and outcomes["refused"] and outcomes["copied"] and outcomes["copy refused"]
    finally:
        writer.kill()
        writer.join()
        shared.close()


# -- the twins ----------------------------------------------------------------------------------

C_FASTPATH = c_extension("service._fastpath")


def _outcome(function: Callable[..., bytes], *args: object) -> object:
    try:
        return function(*args)
    except (ValueError, OverflowError, TypeError) as exc:
        return type(exc), str(exc)


@pytest.mark.skipif(C_FASTPATH is None, reason="service._fastpath is not built")
@settings(max_examples=500)
@given(st.lists(rebased_records, max_size=4), st.binary(max_size=12), st.integers(0, 6), st.integers(-3, 3),
       st.sampled_from([0, 63, 2**63 - 2]), st.sampled_from([0, -5, 2**62, -(2**63)]))
def test_the_twins_rebase_alike_or_refuse_alike(recs, noise: bytes, cut: int, count_change: int, first: int,
                                                 shift: int) -> None:
    """Well-formed records, cut short or followed by noise, counted right or wrong: the same bytes or the same
    error from both, rebased or copied."""
    data = b"".join(encode_record(*rec) for rec in recs)
    data = data[:len(data) - cut] + noise
    count = len(recs) + count_change
    args = (data, count, first, shift)
    assert _outcome(_fastpath_py.rebase_records, *args) == _outcome(C_FASTPATH.rebase_records, *args)
    assert _outcome(_fastpath_py.copy_records, data, count) == _outcome(C_FASTPATH.copy_records, data, count)
