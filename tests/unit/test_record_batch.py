"""RecordBatch v2: the 61-byte header, its CRC-32C, and the compression codecs."""

from __future__ import annotations

import gzip
import struct

import cramjam
import crc32c
import lz4.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub.contract.records import Record
from client_stub.fastpath import encode_record
from service.protocol.compression import CompressionType, compress
from service.protocol.record_batch import encode_batch_header
from tests.support.record_batches import build_batch, decode_batch, decode_batches, decompress

ALL_CODECS = list(CompressionType)


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli, reflected
        table.append(c)
    return table


_TABLE = _crc32c_table()


def reference_crc32c(data: bytes) -> int:
    """CRC-32C written out from its definition, independent of the crc32c package."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_reference_crc32c_check_values() -> None:
    # The standard check value of CRC-32C (RFC 3720, B.4) and the package agreeing with it.
    assert reference_crc32c(b"123456789") == 0xE3069283
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert reference_crc32c(bytes(32)) == 0x8A9136AA


def make_records(count: int, base_ts_delta: int = 0) -> tuple[bytearray, list[Record]]:
    buf = bytearray()
    expected = []
    for i in range(count):
        key = None if i % 3 == 0 else f"key-{i}".encode()
        value = None if i == 4 else (f"value-{i}-".encode() * (i + 1))
        headers = [(b"h", b"x" * i)] if i % 2 else []
        buf += encode_record(i, base_ts_delta + i * 7, key, value, headers)
        expected.append(Record(i, base_ts_delta + i * 7, key, value, [(k.decode(), v) for k, v in headers]))
    return buf, expected


BATCH_ARGS = dict(base_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_000 + 9 * 7,
                  producer_id=123456789012, producer_epoch=7, base_sequence=4242)


def _build(records, count: int, compression: CompressionType, **overrides):
    args = dict(BATCH_ARGS, record_count=count, last_offset_delta=count - 1, compression=compression)
    args.update(overrides)
    return build_batch(records, **args)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.setting)
def test_round_trip_every_codec(codec: CompressionType) -> None:
    records, expected = make_records(10)
    parts = _build(memoryview(records), 10, codec)
    data = b"".join(parts)
    batch, end = decode_batch(data)
    assert end == len(data)
    assert batch.crc_valid
    assert batch.magic == 2
    assert batch.base_offset == 0
    assert batch.partition_leader_epoch == -1
    assert batch.batch_length == len(data) - 12
    assert batch.compression is codec
    assert batch.attributes == int(codec)
    assert batch.timestamp_type == 0
    assert not batch.is_transactional
    assert batch.producer_id == 123456789012
    assert batch.producer_epoch == 7
    assert batch.base_sequence == 4242
    assert batch.base_timestamp == BATCH_ARGS["base_timestamp"]
    assert batch.max_timestamp == BATCH_ARGS["max_timestamp"]
    assert batch.record_count == 10
    assert batch.last_offset_delta == 9
    assert batch.records == expected
    if codec is not CompressionType.NONE:
        assert bytes(parts[1]) != bytes(records)
        assert decompress(codec, parts[1]) == records


def test_idempotence_defaults_and_transactional_flag() -> None:
    records, _ = make_records(2)
    data = b"".join(build_batch(records, record_count=2, last_offset_delta=1, base_timestamp=5,
                                max_timestamp=12, transactional=True, base_offset=77,
                                partition_leader_epoch=3))
    batch, _ = decode_batch(data)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert batch.is_transactional and batch.attributes == 0x10
    assert (batch.base_offset, batch.partition_leader_epoch) == (77, 3)
    assert batch.crc_valid


def test_uncompressed_payload_is_the_callers_buffer() -> None:
    shm = bytearray(4096)
    records, _ = make_records(5)
    shm[100:100 + len(records)] = records
    view = memoryview(shm)[100:100 + len(records)]
    header, payload = build_batch(view, record_count=5, last_offset_delta=4, base_timestamp=0,
                                  max_timestamp=28)
    assert payload is view
    assert len(header) == 61
    assert struct.unpack_from(">I", header, 17)[0] == reference_crc32c(bytes(header[21:]) + bytes(records))
    # The same memory, not a copy: a later write to the block shows through the payload.
    before = bytes(payload)
    shm[100 + len(records) - 1] ^= 0xFF
    assert bytes(payload) != before
    assert bytes(payload) == bytes(shm[100:100 + len(records)])


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.setting)
def test_header_of_an_already_compressed_payload(codec: CompressionType) -> None:
    records, _ = make_records(4)
    header, payload = _build(records, 4, codec, transactional=True)
    assert encode_batch_header(payload, compression=codec, record_count=4, last_offset_delta=3,
                               transactional=True, **BATCH_ARGS) == header


def test_header_layout() -> None:
    records, _ = make_records(3)
    header, payload = _build(records, 3, CompressionType.LZ4, transactional=True, base_offset=0)
    data = bytes(header) + bytes(payload)
    assert len(header) == 61
    assert struct.unpack_from(">q", data, 0)[0] == 0                       # baseOffset
    assert struct.unpack_from(">i", data, 8)[0] == len(data) - 12          # batchLength
    assert struct.unpack_from(">i", data, 12)[0] == -1                     # partitionLeaderEpoch
    assert data[16] == 2                                                   # magic
    (attributes,) = struct.unpack_from(">h", data, 21)
    assert attributes & 0x07 == 3                                          # lz4
    assert attributes & 0x08 == 0                                          # CreateTime
    assert attributes & 0x10 == 0x10                                       # transactional
    assert attributes & 0x20 == 0                                          # not a control batch
    assert struct.unpack_from(">i", data, 23)[0] == 2                      # lastOffsetDelta
    assert struct.unpack_from(">qq", data, 27) == (BATCH_ARGS["base_timestamp"], BATCH_ARGS["max_timestamp"])
    assert struct.unpack_from(">qhi", data, 43) == (123456789012, 7, 4242)  # producer id, epoch, sequence
    assert struct.unpack_from(">i", data, 57)[0] == 3                      # recordCount


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.setting)
def test_crc_is_crc32c_from_the_attributes_to_the_end(codec: CompressionType) -> None:
    records, _ = make_records(6)
    data = b"".join(_build(memoryview(records), 6, codec))
    (crc,) = struct.unpack_from(">I", data, 17)
    assert crc == reference_crc32c(data[21:])
    assert crc == crc32c.crc32c(data[21:])


@pytest.mark.parametrize(("where", "bit"), [
    (22, 0x08),   # attributes: the timestamp-type bit
    (26, 0x01),   # lastOffsetDelta
    (42, 0x01),   # maxTimestamp
    (52, 0x01),   # producerEpoch
    (56, 0x01),   # baseSequence
    (-1, 0x01),   # the last byte of the records: a header value's text
], ids=["attributes", "last-offset-delta", "max-timestamp", "epoch", "sequence", "records"])
def test_flipped_byte_fails_the_crc(where: int, bit: int) -> None:
    records, expected = make_records(4)
    data = bytearray(b"".join(_build(records, 4, CompressionType.NONE)))
    assert decode_batch(data)[0].crc_valid
    data[where] ^= bit
    batch, _ = decode_batch(data)
    assert not batch.crc_valid
    assert len(batch.records) == 4


def test_flipped_crc_fails_the_crc() -> None:
    records, _ = make_records(2)
    data = bytearray(b"".join(_build(records, 2, CompressionType.NONE)))
    data[20] ^= 0x80
    batch, _ = decode_batch(data)
    assert not batch.crc_valid


def test_bytes_before_the_attributes_are_not_covered_by_the_crc() -> None:
    records, _ = make_records(2)
    data = bytearray(b"".join(_build(records, 2, CompressionType.NONE)))
    data[0:8] = struct.pack(">q", 1000)      # base offset: assigned by the broker after the CRC
    data[12:16] = struct.pack(">i", 9)      # partition leader epoch: likewise
    batch, _ = decode_batch(data)
    assert batch.crc_valid and batch.base_offset == 1000 and batch.partition_leader_epoch == 9


def test_lz4_frame_layout() -> None:
    records = bytes(range(256)) * 600  # more than one 64 KiB block
    payload = compress(CompressionType.LZ4, records)
    assert payload[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    flg, bd = payload[4], payload[5]
    assert flg >> 6 == 0b01                    # version 1
    assert flg & 0x20                          # independent blocks
    assert not flg & 0x10                      # no block checksums
    assert not flg & 0x08                      # no content size
    assert not flg & 0x04                      # no content checksum
    assert flg == 0x60
    assert (bd >> 4) & 0x07 == 4               # 64 KiB maximum block size
    assert lz4.frame.decompress(payload) == records
    # Walk the blocks: each is an int32 LE size (high bit: stored uncompressed), the end mark is 0.
    pos, blocks = 7, 0                         # magic, FLG, BD, header checksum
    while True:
        (size,) = struct.unpack_from("<I", payload, pos)
        pos += 4
        if size == 0:
            break
        blocks += 1
        pos += size & 0x7FFFFFFF
    assert pos == len(payload)                 # no content checksum after the end mark
    assert blocks >= 2


def test_lz4_default_level_is_the_fast_compressor_and_other_levels_lz4_hc() -> None:
    # Kafka's Lz4BlockOutputStream: fastCompressor() at the default level 9, highCompressor(level) at others.
    records, _ = make_records(300)
    frame = {"block_size": lz4.frame.BLOCKSIZE_MAX64KB, "block_linked": False, "content_checksum": False,
             "store_size": False}
    fast = lz4.frame.compress(bytes(records), compression_level=0, **frame)
    assert compress(CompressionType.LZ4, records) == fast
    assert compress(CompressionType.LZ4, records, 9) == fast
    hc = compress(CompressionType.LZ4, records, 10)
    assert hc == lz4.frame.compress(bytes(records), compression_level=10, **frame)
    assert len(hc) < len(fast)
    assert lz4.frame.decompress(hc) == lz4.frame.decompress(fast) == bytes(records)


def test_snappy_is_raw_snappy() -> None:
    records, _ = make_records(20)
    payload = compress(CompressionType.SNAPPY, memoryview(records))
    assert cramjam.snappy.decompress_raw(payload).read() == bytes(records)


def test_gzip_and_zstd_frames() -> None:
    records, _ = make_records(8)
    gz = compress(CompressionType.GZIP, records)
    assert gz[:2] == b"\x1f\x8b"
    assert gzip.decompress(gz) == records
    zs = compress(CompressionType.ZSTD, records)
    assert zs[:4] == b"\x28\xb5\x2f\xfd"
    assert bytes(cramjam.zstd.decompress(zs)) == records


@pytest.mark.parametrize(("codec", "level"), [(CompressionType.GZIP, 1), (CompressionType.GZIP, 9),
                                              (CompressionType.LZ4, 1), (CompressionType.LZ4, 17),
                                              (CompressionType.ZSTD, -5), (CompressionType.ZSTD, 19)])
def test_compression_levels(codec: CompressionType, level: int) -> None:
    records, expected = make_records(6)
    batch, _ = decode_batch(b"".join(_build(records, 6, codec, compression_level=level)))
    assert batch.records == expected and batch.crc_valid


def test_compression_type_names() -> None:
    assert [c.setting for c in CompressionType] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert CompressionType.from_name(" LZ4 ") is CompressionType.LZ4
    with pytest.raises(ValueError, match="compression.type"):
        CompressionType.from_name("brotli")


def test_decode_batches_over_a_record_set() -> None:
    data = b""
    expected = []
    for i, codec in enumerate(ALL_CODECS):
        records, recs = make_records(i + 1)
        data += b"".join(_build(records, i + 1, codec, base_offset=100 * i))
        expected.append((100 * i, codec, recs))
    batches = decode_batches(data)
    assert [(b.base_offset, b.compression, b.records) for b in batches] == expected
    assert all(b.crc_valid for b in batches)


def test_malformed_batches_raise() -> None:
    records, _ = make_records(3)
    data = b"".join(_build(records, 3, CompressionType.NONE))
    for cut in (0, 12, 60, len(data) - 1):
        with pytest.raises(ValueError):
            decode_batch(data[:cut])
    wrong_magic = bytearray(data)
    wrong_magic[16] = 1
    with pytest.raises(ValueError, match="magic"):
        decode_batch(wrong_magic)
    wrong_count = bytearray(data)
    struct.pack_into(">i", wrong_count, 57, 4)
    with pytest.raises(ValueError):
        decode_batch(wrong_count)


# -- property -----------------------------------------------------------------------------------

payloads = st.one_of(st.none(), st.binary(max_size=200))
record_strategy = st.tuples(payloads, payloads,
                            st.lists(st.tuples(st.text(max_size=5), payloads), max_size=2),
                            st.integers(0, 10_000))


@settings(max_examples=60, deadline=None)
@given(st.lists(record_strategy, min_size=1, max_size=12), st.sampled_from(ALL_CODECS),
       st.integers(0, 2**62), st.integers(-1, 2**63 - 1), st.integers(-1, 2**15 - 1),
       st.integers(-1, 2**31 - 1), st.booleans())
def test_batch_round_trip(recs, codec, base_timestamp, producer_id, epoch, sequence, as_view) -> None:
    buf = bytearray()
    expected = []
    for i, (key, value, headers, ts) in enumerate(recs):
        raw = [(k.encode(), v) for k, v in headers]
        buf += encode_record(i, ts, key, value, raw)
        expected.append(Record(i, ts, key, value, headers))
    parts = build_batch(memoryview(buf) if as_view else bytes(buf), record_count=len(recs),
                        last_offset_delta=len(recs) - 1, base_timestamp=base_timestamp,
                        max_timestamp=base_timestamp + max(r[3] for r in recs), producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=sequence, compression=codec)
    data = b"".join(parts)
    assert struct.unpack_from(">I", data, 17)[0] == crc32c.crc32c(data[21:])
    batch, end = decode_batch(b"\x00" * 3 + data, 3)
    assert end == 3 + len(data)
    assert batch.crc_valid
    assert batch.records == expected
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (producer_id, epoch, sequence)
    assert batch.compression is codec
    assert batch.record_count == len(recs)
