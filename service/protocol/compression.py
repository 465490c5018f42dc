"""Record batch compression codecs, framed as Kafka frames them.

- gzip: a gzip member (standard library).
- snappy: raw snappy blocks, as librdkafka writes them.
- lz4: the LZ4 frame format with independent 64 KiB blocks and no checksums,
  which is what Kafka's KafkaLZ4BlockOutputStream writes and what its reader,
  which decodes each block on its own, requires.
- zstd: a zstd frame.
"""

from __future__ import annotations

import enum
import gzip

import cramjam
import lz4.frame

from client_stub.contract.records import Buffer


class CompressionType(enum.IntEnum):
    """The codec in bits 0-2 of a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> CompressionType:
        """Parse a ``compression.type`` setting ("none", "gzip", "snappy", "lz4", "zstd")."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown compression.type {name!r}; expected one of "
                             f"{', '.join(c.name.lower() for c in cls)}") from None

    @property
    def setting(self) -> str:
        return self.name.lower()


# Kafka's defaults (KIP-390): gzip 6 (Deflater.DEFAULT), lz4 9 (which means LZ4's fast compressor), zstd 3.
DEFAULT_LEVELS = {CompressionType.GZIP: 6, CompressionType.LZ4: 9, CompressionType.ZSTD: 3}
LEVEL_RANGES = {CompressionType.GZIP: (1, 9), CompressionType.LZ4: (1, 17),
                CompressionType.ZSTD: (-131072, 22)}


def compress(codec: CompressionType, data: Buffer, level: int | None = None) -> bytes:
    """Compress a batch's record bytes with ``codec``."""
    if level is None:
        level = DEFAULT_LEVELS.get(codec)
    if codec is CompressionType.GZIP:
        return gzip.compress(data, compresslevel=level, mtime=0)
    if codec is CompressionType.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is CompressionType.LZ4:
        # Kafka's Lz4BlockOutputStream takes LZ4's fast compressor at the default level and LZ4 HC at
        # any other; lz4.frame's level 0 is the fast compressor.
        if level == DEFAULT_LEVELS[CompressionType.LZ4]:
            level = 0
        return lz4.frame.compress(data, compression_level=level, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                  block_linked=False, content_checksum=False, store_size=False)
    if codec is CompressionType.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"cannot compress with {codec!r}")
