"""BufferPool: buffer.memory bytes of shared memory in blocks of batch.size, granted to clients.

As the Java producer's BufferPool, but across processes: the daemon owns the
segment and every block's state; clients get blocks a few at a time and write
records into them. A request that cannot be served waits in a FIFO until blocks
come back or its timeout (the client's max_block_ms) passes; while anyone waits
the pool is exhausted, and the daemon asks clients to seal what they hold.
Records larger than a block get a run of consecutive blocks.

No client may take the pool from the others: a client holds at most
``max_blocks_per_client`` blocks, granted or sealed (the daemon's default, from
:func:`client_block_limit`, is half the pool), and has at most one request for
spare blocks and one for a run waiting at a time. A request that would take its
client past the limit waits for the client's own blocks to come back, without
holding back the requests of others.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory

from client_stub.contract import PROTOCOL_VERSION
from client_stub.contract.shared_memory import FREE, HEADER, MAGIC, OWNED, SEALED, TABLE_ENTRY, TABLE_OFFSET, Layout

log = logging.getLogger(__name__)

# The most the segment's permissions allow (the umask may take more away): the daemon's user and group.
@dataclass(slots=True)
class Waiter:
    """A block request that could not be served yet."""

    client_id: int
    request_id: int
    count: int
    contiguous: bool
    deadline_ms: int


class BlockError(ValueError):
    """A client named blocks that are not its to use, or asked for more than it may have."""


def client_block_limit(total_bytes: int, block_size: int, max_request_size: int) -> int:
    """The blocks one client may hold: half the pool, but at least a run for the largest batch allowed.

    Half leaves the other clients together as much as the greediest one can take. A host
    with one busy producing process may want a larger buffer.memory than a Java producer's.
    """
    block_count = total_bytes // block_size
    largest_batch = -(-max_request_size // block_size)
    return max(min(block_count, max(block_count // 2, largest_batch)), 1)


class BufferPool:
    """The shared-memory segment, its block states, and the FIFO of waiting requests."""

    def __init__(self, total_bytes: int, block_size: int, *, name: str | None = None,
                 max_blocks_per_client: int | None = None, mode: int = 0o660, group: int | None = None) -> None:
        block_count = total_bytes // block_size
        if block_count < 1:
            raise ValueError(f"buffer.memory ({total_bytes}) must hold at least one batch.size ({block_size}) block")
        if max_blocks_per_client is not None and max_blocks_per_client < 1:
            raise ValueError(f"a client must be allowed at least one block, not {max_blocks_per_client}")
        self.layout = Layout(block_size, block_count)
        self.max_blocks_per_client = min(max_blocks_per_client or block_count, block_count)
        self.name = name or f"kafka-sidecar-{os.getpid()}-{secrets.token_hex(4)}"
        self._shm = shared_memory.SharedMemory(self.name, create=True, size=self.layout.size)
        # SharedMemory makes the segment 0600: only the daemon's user could map it. The clients may, as
        # they may connect to the ipc socket (sidecar.socket.group and .mode, whatever the umask).
        if group is not None:
            os.fchown(self._shm._fd, -1, group)
        os.fchmod(self._shm._fd, mode)
        self.buf = self._shm.buf
        HEADER.pack_into(self.buf, 0, MAGIC, PROTOCOL_VERSION, block_size, block_count, TABLE_OFFSET,
                         self.layout.data_offset, os.getpid())
        # The table in shared memory is for recovery and tools; these mirror it for speed.
        self._state = bytearray(block_count)
        self._owner = [0] * block_count
        # Per client id, the blocks it holds (granted or sealed): what max_blocks_per_client limits.
        self._held: dict[int, int] = {}
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
        """Someone is waiting for memory of the pool (not only for blocks of its own to come back)."""
        return any(not self._over_limit(w) for w in self.waiters)

    def held_by(self, client_id: int) -> int:
        """Blocks granted to or sealed by a client and not back in the pool."""
        return self._held.get(client_id, 0)

    def clients_at_limit(self) -> set[int]:
        """Clients with a request waiting because they hold as many blocks as they may."""
        return {w.client_id for w in self.waiters if self._over_limit(w)}

    # -- allocation ------------------------------------------------------------------------------

    def request(self, client_id: int, request_id: int, count: int, contiguous: bool,
                deadline_ms: int) -> list[int] | None:
        """Blocks now, or None: the request waits in the FIFO (served by :meth:`serve_waiters`).

        A request for spare blocks may get fewer than ``count``: what is free, within the
        client's limit. BlockError if the request can never be served, or if the client
        already has a request of the same kind waiting.
        """
        if count < 1 or count > self.block_count:
            raise BlockError(f"cannot grant {count} blocks: the pool has {self.block_count}")
        if contiguous and count > self.max_blocks_per_client:
            raise BlockError(f"cannot grant a run of {count} blocks: a client may hold "
                             f"{self.max_blocks_per_client} of the pool's {self.block_count}")
        for other in self.waiters:
            if other.client_id == client_id and other.contiguous == contiguous:
                raise BlockError(f"request {other.request_id} for {'a run of' if contiguous else 'spare'} blocks "
                                 "is still waiting: a client may have one such request waiting at a time")
        waiter = Waiter(client_id, request_id, count, contiguous, deadline_ms)
        # Behind those who wait for the pool, in FIFO order; not behind those who wait at their limit.
        if not self._over_limit(waiter) and not self.exhausted:
            blocks = self._grant(waiter)
            if blocks is not None:
                return blocks
        self.waiters.append(waiter)
        return None

    def serve_waiters(self) -> list[tuple[Waiter, list[int]]]:
        """Serve waiting requests in order while blocks allow (skipping those of clients at their limit)."""
        served = []
        for waiter in list(self.waiters):
            if self._over_limit(waiter):
                continue  # it waits for its own blocks, not for the pool: no reason to hold back the others
            blocks = self._grant(waiter)
            if blocks is None:
                break
            self.waiters.remove(waiter)
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

    def _over_limit(self, waiter: Waiter) -> bool:
        needed = waiter.count if waiter.contiguous else 1
        return self._held.get(waiter.client_id, 0) + needed > self.max_blocks_per_client

    def _grant(self, waiter: Waiter) -> list[int] | None:
        """Blocks for a request within its client's limit, or None if the pool has too few free."""
        count = waiter.count
        if not waiter.contiguous:
            count = min(count, self.max_blocks_per_client - self._held.get(waiter.client_id, 0))
        return self._allocate(waiter.client_id, count, waiter.contiguous)

    def _allocate(self, client_id: int, count: int, contiguous: bool) -> list[int] | None:
        if self._free_count < (count if contiguous else 1):
            return None
        if contiguous and count > 1:
            first = self._state.find(bytes(count))
            if first < 0:
                return None
            blocks = list(range(first, first + count))
            for block in blocks:
                self._set(block, OWNED, client_id)
        else:
            blocks = []
            stack = self._stack
            while len(blocks) < count and stack:
                block = stack.pop()
                # Each block is taken as it is found, so a block listed twice is granted once.
                if self._state[block] == FREE:
                    self._set(block, OWNED, client_id)
                    blocks.append(block)
            if not blocks:
                return None
        self._free_count -= len(blocks)
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
        """A client returns blocks it was granted and did not use (all of them are checked first)."""
        if len(set(blocks)) != len(blocks):
            raise BlockError("a block is named more than once")
        for block in blocks:
            self.check_owned(client_id, block, 1)
        self.free(blocks)

    def free(self, blocks: list[int] | range) -> int:
        """Return blocks to the pool; returns how many were not free already (only those count)."""
        freed = 0
        for block in blocks:
            if self._state[block] == FREE:
                # Whatever a client sends is checked before it gets here: this is a bug of the daemon.
                log.error("block %d is freed but was free already: ignored", block)
                continue
            self._set(block, FREE, 0)
            self._stack.append(block)
            freed += 1
        self._free_count += freed
        if len(self._stack) > 2 * self.block_count:
            self._stack = [b for b in self._stack if self._state[b] == FREE]
        return freed

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
        held = self._held
        if self._state[block] != FREE:
            previous = self._owner[block]
            if held[previous] == 1:
                del held[previous]
            else:
                held[previous] -= 1
        if state != FREE:
            held[owner] = held.get(owner, 0) + 1
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
