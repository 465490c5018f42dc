"""RecordBatch v2 (magic 2): the batch header around a run of records.

Layout (61 bytes of header, then the records, compressed or not)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32
    recordCount int32 | records...

The CRC-32C covers everything from the attributes to the end of the batch.
:func:`encode_batch_header` never copies the records: the header is written
beside the caller's buffer, the CRC computed across both. The sidecar writes
batches and never reads one back.
"""

from __future__ import annotations

import struct

import crc32c

from client_stub.contract.records import BATCH_HEADER_SIZE, Buffer

from .compression import CompressionType

MAGIC = 2
# From baseOffset to the CRC, and from the attributes to the record count.
HEADER_PREFIX = struct.Struct(">qiibI")
HEADER_BODY = struct.Struct(">hiqqqhii")
ATTRIBUTES_OFFSET = 21
# Bytes of a batch not counted in batchLength: baseOffset and batchLength itself.
LOG_OVERHEAD = 12

TRANSACTIONAL_FLAG = 0x10

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
    HEADER_BODY.pack_into(header, ATTRIBUTES_OFFSET, attributes, last_offset_delta, base_timestamp,
                    max_timestamp, producer_id, producer_epoch, base_sequence, record_count)
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + _nbytes(payload)
    HEADER_PREFIX.pack_into(header, 0, base_offset, batch_length, partition_leader_epoch, MAGIC, crc)
    return header
