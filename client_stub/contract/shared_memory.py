"""The shared-memory segment of the BufferPool: its layout, and attaching to it.

The daemon creates the segment; clients map it and write records into the
blocks granted to them. Layout::

    0       header (64 bytes): magic, the contract's PROTOCOL_VERSION, block size, block count,
            offset of the block table, offset of the first block, daemon pid
    4096    block table: per block 16 bytes: state u8, 3 bytes padding,
            owner (client id) u32, sealed length u32, sealed record count u32
    data    block_count blocks of block_size bytes, from a page boundary

Only the daemon writes the header and the table (a client is not trusted with
other clients' blocks); the table records which block is free, owned by which
client, or sealed, so that a restarted daemon can find batches that were sealed
but not acknowledged (the daemon writes it; reading it back after a restart is
not built yet: a restart fails what the daemon held).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from . import PROTOCOL_VERSION

MAGIC = b"KSIDECAR"
HEADER = struct.Struct("<8sIIIIII")
TABLE_OFFSET = 4096
TABLE_ENTRY = struct.Struct("<BxxxIII")
PAGE = 4096

FREE = 0
OWNED = 1
SEALED = 2


@dataclass(frozen=True, slots=True)
class Layout:
    block_size: int
    block_count: int

    @property
    def data_offset(self) -> int:
        table_end = TABLE_OFFSET + self.block_count * TABLE_ENTRY.size
        return (table_end + PAGE - 1) // PAGE * PAGE

    @property
    def size(self) -> int:
        return self.data_offset + self.block_count * self.block_size

    def block_offset(self, block: int) -> int:
        return self.data_offset + block * self.block_size

    def entry_offset(self, block: int) -> int:
        return TABLE_OFFSET + block * TABLE_ENTRY.size


class Segment:
    """A mapping of the daemon's segment (POSIX shared memory, /dev/shm on Linux).

    Clients map it with ``shm_open`` and ``mmap`` rather than through
    ``multiprocessing.shared_memory.SharedMemory``: before Python 3.13 the latter
    registers every attach with a resource tracker, which starts a tracker process
    per client and unlinks the daemon's segment when the client exits.
    """

    def __init__(self, name: str) -> None:
        import _posixshmem

        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name = name
        self.buf = memoryview(self._mmap)
        magic, version, block_size, block_count, _, _, _ = HEADER.unpack_from(self.buf, 0)
        if magic != MAGIC:
            self.close()
            raise ValueError(f"shared memory {name!r} is not a kafka-sidecar BufferPool")
        if version != PROTOCOL_VERSION:
            self.close()
            raise ValueError(f"BufferPool of protocol version {version}, this client reads {PROTOCOL_VERSION}")
        self.layout = Layout(block_size, block_count)

    def blocks(self, first: int, count: int = 1) -> memoryview:
        """The bytes of ``count`` consecutive blocks from ``first``."""
        start = self.layout.block_offset(first)
        return self.buf[start:start + count * self.layout.block_size]

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()
