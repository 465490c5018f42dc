"""The reader's half of RecordBatch v2: record sets decoded (CRC checked, decompressed), and whole batches built.

The sidecar only writes batches (service.protocol.record_batch.encode_batch_header around its clients'
records, service.protocol.compression.compress); the tests read what it sent, as a broker would, and
build batches of their own for the fake broker and the proxies, here.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field

import cramjam
import crc32c
import lz4.frame

from client_stub.contract.records import BATCH_HEADER_SIZE, Buffer, Record, decode_records
from service.protocol.compression import CompressionType, compress
from service.protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    HEADER_BODY,
    HEADER_PREFIX,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG,
    encode_batch_header,
)

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08


def build_batch(records: Buffer, *, record_count: int, last_offset_delta: int,
                base_timestamp: int, max_timestamp: int, producer_id: int = NO_PRODUCER_ID,
                producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                compression: CompressionType = CompressionType.NONE, compression_level: int | None = None,
                transactional: bool = False, base_offset: int = 0,
                partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> list[Buffer]:
    """A complete batch as ``[header, payload]``, ready to send without joining.

    ``records`` holds ``record_count`` encoded records with offset deltas
    0..``last_offset_delta`` and timestamps relative to ``base_timestamp``.
    Uncompressed, the payload is ``records`` itself (not copied).
    """
    payload = records if compression is CompressionType.NONE else compress(compression, records,
                                                                              compression_level)
    header = encode_batch_header(
        payload, compression=compression, record_count=record_count, last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp, max_timestamp=max_timestamp, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, transactional=transactional,
        base_offset=base_offset, partition_leader_epoch=partition_leader_epoch)
    return [header, payload]


def decompress(codec: CompressionType, data: Buffer) -> bytes:
    """A batch's record bytes, decompressed (snappy: raw, as the sidecar writes it)."""
    if codec is CompressionType.GZIP:
        return gzip.decompress(data)
    if codec is CompressionType.SNAPPY:
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec is CompressionType.LZ4:
        return lz4.frame.decompress(data)
    if codec is CompressionType.ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"cannot decompress {codec!r}")


@dataclass(slots=True)
class RecordBatch:
    """A decoded batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: list[Record] = field(default_factory=list)
    crc_valid: bool = True

    @property
    def compression(self) -> CompressionType:
        return CompressionType(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> int:
        """0 for CreateTime, 1 for LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)


def decode_batch(data: Buffer, pos: int = 0) -> tuple[RecordBatch, int]:
    """Decode the batch at ``pos``, checking its CRC; returns it and the position after it."""
    view = memoryview(data)
    if len(view) - pos < BATCH_HEADER_SIZE:
        raise ValueError("record batch shorter than its header")
    base_offset, batch_length, leader_epoch, magic, crc = HEADER_PREFIX.unpack_from(view, pos)
    if magic != MAGIC:
        raise ValueError(f"record batch magic {magic}, only magic {MAGIC} is supported")
    end = pos + LOG_OVERHEAD + batch_length
    if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD or end > len(view):
        raise ValueError(f"record batch length {batch_length} out of bounds")
    fields = HEADER_BODY.unpack_from(view, pos + ATTRIBUTES_OFFSET)
    batch = RecordBatch(base_offset, batch_length, leader_epoch, magic, crc, *fields)
    batch.crc_valid = crc32c.crc32c(view[pos + ATTRIBUTES_OFFSET:end]) == crc
    payload = view[pos + BATCH_HEADER_SIZE:end]
    if batch.compression is not CompressionType.NONE:
        payload = memoryview(decompress(batch.compression, payload))
    batch.records = decode_records(payload, batch.record_count)
    return batch, end


def decode_batches(data: Buffer) -> list[RecordBatch]:
    """Decode every batch in a record set."""
    batches = []
    pos = 0
    while pos < len(data):
        batch, pos = decode_batch(data, pos)
        batches.append(batch)
    return batches
