"""RecordBatch v2 (magic 2): the batch header around a run of records.

Layout (61 bytes of header, then the records, compressed or not)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32
    recordCount int32 | records...

The CRC-32C covers everything from the attributes to the end of the batch.
:func:`build_batch` never copies uncompressed records: it returns the header
and the caller's buffer, the CRC computed across both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c

from client_stub.contract.records import BATCH_HEADER_SIZE, Buffer, Record, decode_records

from .compression import CompressionType, compress, decompress

MAGIC = 2
# From baseOffset to the CRC, and from the attributes to the record count.
_PREFIX = struct.Struct(">qiibI")
_BODY = struct.Struct(">hiqqqhii")
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
# Bytes of a batch not counted in batchLength: baseOffset and batchLength itself.
LOG_OVERHEAD = 12

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1


def _nbytes(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def encode_batch_header(payload: Buffer, *, compression: CompressionType, record_count: int,
                        last_offset_delta: int, base_timestamp: int, max_timestamp: int,
                        producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                        base_sequence: int = NO_SEQUENCE, transactional: bool = False, base_offset: int = 0,
                        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytearray:
    """The 61-byte header of a batch whose payload (compressed as said, or not) is ``payload``.

    The CRC is computed over the header's tail and then ``payload`` in place.
    """
    attributes = int(compression) | (TRANSACTIONAL_FLAG if transactional else 0)
    header = bytearray(BATCH_HEADER_SIZE)
    _BODY.pack_into(header, ATTRIBUTES_OFFSET, attributes, last_offset_delta, base_timestamp,
                    max_timestamp, producer_id, producer_epoch, base_sequence, record_count)
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + _nbytes(payload)
    _PREFIX.pack_into(header, 0, base_offset, batch_length, partition_leader_epoch, MAGIC, crc)
    return header


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


@dataclass(slots=True)
class RecordBatch:
    """A decoded batch (for tests and tools; the send path never decodes)."""

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
    base_offset, batch_length, leader_epoch, magic, crc = _PREFIX.unpack_from(view, pos)
    if magic != MAGIC:
        raise ValueError(f"record batch magic {magic}, only magic {MAGIC} is supported")
    end = pos + LOG_OVERHEAD + batch_length
    if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD or end > len(view):
        raise ValueError(f"record batch length {batch_length} out of bounds")
    fields = _BODY.unpack_from(view, pos + ATTRIBUTES_OFFSET)
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
