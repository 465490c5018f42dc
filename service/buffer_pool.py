"""BufferPool: buffer.memory bytes of shared memory in blocks of batch.size, granted to clients.

As the Java producer's BufferPool, but across processes: the daemon owns the
segment and every block's state; clients get blocks a few at a time and write
records into them. A request that cannot be served waits in a FIFO until blocks
come back or its timeout (the client's max_block_ms) passes; while anyone waits
the pool is exhausted, and the daemon asks clients to seal what they hold.
Records larger than a block get a run of consecutive blocks.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory

from client_stub.shm import FREE, HEADER, LAYOUT_VERSION, MAGIC, OWNED, SEALED, TABLE_ENTRY, TABLE_OFFSET, Layout

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Waiter:
    """A block request that could not be served yet."""

    client_id: int
    request_id: int
    count: int
    contiguous: bool
    deadline_ms: int


class BlockError(ValueError):
    """A client named blocks that are not its to use."""


class BufferPool:
    """The shared-memory segment, its block states, and the FIFO of waiting requests."""

    def __init__(self, total_bytes: int, block_size: int, *, name: str | None = None) -> None:
        block_count = total_bytes // block_size
        if block_count < 1:
            raise ValueError(f"buffer.memory ({total_bytes}) must hold at least one batch.size ({block_size}) block")
        self.layout = Layout(block_size, block_count)
        self.name = name or f"kafka-sidecar-{os.getpid()}-{secrets.token_hex(4)}"
        self._shm = shared_memory.SharedMemory(self.name, create=True, size=self.layout.size)
        self.buf = self._shm.buf
        HEADER.pack_into(self.buf, 0, MAGIC, LAYOUT_VERSION, block_size, block_count, TABLE_OFFSET,
                         self.layout.data_offset, os.getpid())
        # The table in shared memory is for recovery and tools; these mirror it for speed.
        self._state = bytearray(block_count)
        self._owner = [0] * block_count
        self._free_count = block_count
        # Free blocks, most recently freed last: reusing those keeps the pages in use few and
        # warm (a client's PSS counts every page it has touched). Entries of blocks since
        # taken by a contiguous run may linger; the state table is the truth.
        self._stack = list(range(block_count - 1, -1, -1))
        self.waiters: deque[Waiter] = deque()

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    @property
    def block_count(self) -> int:
        return self.layout.block_count

    @property
    def free_blocks(self) -> int:
        return self._free_count

    @property
    def exhausted(self) -> bool:
        """Someone is waiting for memory (the accumulator's ``exhausted``)."""
        return bool(self.waiters)

    # -- allocation ------------------------------------------------------------------------------

    def request(self, client_id: int, request_id: int, count: int, contiguous: bool,
                deadline_ms: int) -> list[int] | None:
        """Blocks now, or None: the request waits in the FIFO (served by :meth:`serve_waiters`)."""
        if count < 1 or count > self.block_count:
            raise BlockError(f"cannot grant {count} blocks: the pool has {self.block_count}")
        if not self.waiters:
            blocks = self._allocate(client_id, count, contiguous)
            if blocks is not None:
                return blocks
        self.waiters.append(Waiter(client_id, request_id, count, contiguous, deadline_ms))
        return None

    def serve_waiters(self) -> list[tuple[Waiter, list[int]]]:
        """Serve waiting requests in order while blocks allow."""
        served = []
        while self.waiters:
            waiter = self.waiters[0]
            blocks = self._allocate(waiter.client_id, waiter.count, waiter.contiguous)
            if blocks is None:
                break
            self.waiters.popleft()
            served.append((waiter, blocks))
        return served

    def expire_waiters(self, now: int) -> list[Waiter]:
        """Drop the requests whose deadline passed (their clients have given up)."""
        expired = [w for w in self.waiters if w.deadline_ms <= now]
        if expired:
            self.waiters = deque(w for w in self.waiters if w.deadline_ms > now)
        return expired

    def forget_waiters(self, client_id: int) -> None:
        self.waiters = deque(w for w in self.waiters if w.client_id != client_id)

    def _allocate(self, client_id: int, count: int, contiguous: bool) -> list[int] | None:
        if self._free_count < (count if contiguous else 1):
            return None
        if contiguous and count > 1:
            first = self._state.find(bytes(count))
            if first < 0:
                return None
            blocks = list(range(first, first + count))
        else:
            blocks = []
            while len(blocks) < count and self._free_count > len(blocks):
                block = self._stack.pop()
                if self._state[block] == FREE:
                    blocks.append(block)
        self._free_count -= len(blocks)
        for block in blocks:
            self._set(block, OWNED, client_id)
        return blocks

    # -- ownership -------------------------------------------------------------------------------

    def check_owned(self, client_id: int, first: int, count: int) -> None:
        """BlockError unless blocks first..first+count-1 are granted to ``client_id`` and unsealed."""
        if not (first >= 0 and count >= 1 and first + count <= self.block_count):
            raise BlockError(f"blocks {first}..{first + count - 1} are outside the pool")
        for block in range(first, first + count):
            if self._state[block] != OWNED or self._owner[block] != client_id:
                raise BlockError(f"block {block} is not granted to this client")

    def seal(self, client_id: int, first: int, count: int, length: int, record_count: int) -> memoryview:
        """Mark a client's blocks sealed and return the view of the batch's ``length`` bytes."""
        self.check_owned(client_id, first, count)
        if not 1 <= length <= count * self.block_size:
            raise BlockError(f"length {length} does not fit {count} block(s) of {self.block_size} bytes")
        for block in range(first, first + count):
            self._set(block, SEALED, client_id)
        TABLE_ENTRY.pack_into(self.buf, self.layout.entry_offset(first), SEALED, client_id, length, record_count)
        start = self.layout.block_offset(first)
        return self.buf[start:start + length]

    def give_back(self, client_id: int, blocks: list[int]) -> None:
        """A client returns blocks it was granted and did not use."""
        for block in blocks:
            self.check_owned(client_id, block, 1)
        self.free(blocks)

    def free(self, blocks: list[int] | range) -> None:
        for block in blocks:
            self._set(block, FREE, 0)
        self._stack.extend(blocks)
        self._free_count += len(blocks)
        if len(self._stack) > 2 * self.block_count:
            self._stack = [b for b in self._stack if self._state[b] == FREE]

    def free_unsealed(self, client_id: int, first: int, count: int) -> int:
        """Free those of blocks first..first+count-1 that ``client_id`` holds unsealed; leave the others."""
        blocks = [b for b in range(max(first, 0), min(first + count, self.block_count))
                  if self._state[b] == OWNED and self._owner[b] == client_id]
        self.free(blocks)
        return len(blocks)

    def reclaim(self, client_id: int) -> int:
        """Free every unsealed block of a client that is gone; sealed ones stay until sent."""
        blocks = [b for b in range(self.block_count) if self._state[b] == OWNED and self._owner[b] == client_id]
        self.free(blocks)
        self.forget_waiters(client_id)
        return len(blocks)

    def _set(self, block: int, state: int, owner: int) -> None:
        self._state[block] = state
        self._owner[block] = owner
        TABLE_ENTRY.pack_into(self.buf, self.layout.entry_offset(block), state, owner, 0, 0)

    def close(self) -> None:
        """Unmap and remove the segment (every view of it must be released first)."""
        self.buf = None  # type: ignore[assignment]
        try:
            self._shm.close()
        except BufferError:
            log.warning("shared memory still in use at close: leaving the mapping to the process exit")
        self._shm.unlink()
