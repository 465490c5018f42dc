"""BufferPool: buffer.memory bytes of shared memory in blocks of batch.size, granted to clients.

As the Java producer's BufferPool, but across processes: the daemon counts every
block granted against buffer.memory; clients get blocks a few at a time and write
records into them. Each client's blocks are in a segment of its own
(:mod:`service.client_segments`), which no other client can map: the pool is one
count of blocks, the memory is per client. A request that cannot be served waits in
a FIFO until blocks come back or its timeout (the client's max_block_ms) passes;
while anyone waits the pool is exhausted, and the daemon asks clients to seal what
they hold. Records larger than a block get a run of consecutive blocks.

No process may take the pool from the others: the clients of one process (its
sessions, as the kernel names the process) hold at most ``max_blocks_per_process``
blocks together, granted or sealed (the daemon's default, from
:func:`client_block_limit`, is half the pool), and each has at most one request for
spare blocks and one for a run waiting at a time. A request that would take its
process past the limit waits for the process's own blocks to come back, without
holding back the requests of others.

While batches flow, the blocks sealed and not finished are limited to what the
daemon finishes in ``queue_ms`` (:meth:`BufferPool.limit_queue`, see
:mod:`service.queue_limit`): past that no block is granted until some come back.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout

from . import fastpath
from .client_error import ClientError
from .client_segments import FREE, FREE_BYTE, OWNED, OWNED_BYTE, SEALED, SEALED_BYTE, ClientMemory, ClientSegments
from .queue_limit import QueueLimit

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Waiter:
    """A block request that could not be served yet."""

    client_id: int
    request_id: int
    count: int
    contiguous: bool
    deadline_ms: int
    since_ns: int = field(default_factory=time.monotonic_ns)


class BlockError(ClientError):
    """A client named blocks that are not its to use, or asked for more than it may have."""


def client_block_limit(total_bytes: int, block_size: int, max_request_size: int) -> int:
    """The blocks one process may hold: half the pool, but at least a run for the largest batch allowed.

    Half leaves the other processes together as much as the greediest one can take. A host
    with one busy producing process may want a larger buffer.memory than a Java producer's.
    """
    block_count = total_bytes // block_size
    largest_batch = -(-max_request_size // block_size)
    return max(min(block_count, max(block_count // 2, largest_batch)), 1)


class BufferPool:
    """The count of blocks granted, by client and by process, and the FIFO of waiting requests; the clients'
    segments (:class:`ClientSegments`) and the queue's limit (:class:`QueueLimit`) are parts of it."""

    def __init__(self, total_bytes: int, block_size: int, *, max_blocks_per_process: int | None = None) -> None:
        block_count = total_bytes // block_size
        if block_count < 1:
            raise ValueError(f"buffer.memory ({total_bytes}) must hold at least one batch.size ({block_size}) block")
        if max_blocks_per_process is not None and max_blocks_per_process < 1:
            raise ValueError(f"a process must be allowed at least one block, not {max_blocks_per_process}")
        # Each client's segment is as large as the pool: any client may be granted any share of it.
        # Only the pages written are memory; the rest is address space.
        self.layout = Layout(block_size, block_count)
        self.max_blocks_per_process = min(max_blocks_per_process or block_count, block_count)
        self._memory = ClientSegments(self.layout)
        # The blocks the clients of each process hold together, of the processes that hold any: by process id;
        # a client attached without one is a process of its own (keyed by its negated id).
        self._process_held: dict[int, int] = {}
        # Blocks not granted; below zero when segments taken back after a restart hold more than the pool.
        self._free_count = block_count
        self.waiters: deque[Waiter] = deque()
        # How long requests have waited in the FIFO, those waiting now aside (Java's bufferpool-wait-time-ns-total).
        self.wait_time_ns_total = 0
        self._queue = QueueLimit(block_count)

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
        return any(not self._waits_for_own(w) for w in self.waiters)

    # -- the queue's limit -----------------------------------------------------------------------

    @property
    def queue_limit(self) -> int:
        """The blocks that may be sealed and not finished."""
        return self._queue.blocks

    @property
    def queue_full(self) -> bool:
        """As many blocks are sealed and not finished as the queue's limit allows: none is granted until some
        finish (which sending them brings, so there is no reason to ask clients to seal what they hold)."""
        return self._queue.full

    def limit_queue(self, queue_ms: int, floor_blocks: int) -> None:
        """Limit the blocks sealed and not finished to what finishes in ``queue_ms`` (0: no limit), and at
        least ``floor_blocks``."""
        self._queue.limit(queue_ms, floor_blocks)

    def follow_queue(self, now_ms: int) -> None:
        """Once every QUEUE_INTERVAL_MS: set the queue's limit from the rate at which sealed blocks finish."""
        self._queue.follow(now_ms, lambda: self.block_states()[1])

    # -- the books -------------------------------------------------------------------------------

    def held_by(self, client_id: int) -> int:
        """Blocks granted to or sealed by a client and not back in the pool."""
        memory = self._memory.get(client_id)
        return 0 if memory is None else memory.held

    def held(self) -> dict[int, int]:
        """The blocks each client with a segment holds."""
        return {client_id: memory.held for client_id, memory in self._memory.items()}

    def held_by_process(self, process: int) -> int:
        """Blocks the clients of a process hold together."""
        return self._process_held.get(process, 0)

    def block_states(self) -> tuple[int, int]:
        """Blocks granted to clients and not sealed, and blocks sealed in batches not finished."""
        memories = self._memory.values()
        return sum(m.state.count(OWNED) for m in memories), sum(m.state.count(SEALED) for m in memories)

    def clients_at_limit(self) -> set[int]:
        """Clients whose blocks a request waits for: every client of a process that holds as many as it may
        and has a request waiting (any of them may hold the blocks it waits for), and a client whose own
        blocks are in the way of the run it asked for."""
        processes: set[int] = set()
        in_the_way: set[int] = set()
        for waiter in self.waiters:
            if self._waits_for_process(waiter):
                processes.add(self._memory[waiter.client_id].process)
            elif self._waits_for_own(waiter):
                in_the_way.add(waiter.client_id)
        return in_the_way | {client_id for client_id, memory in self._memory.items() if memory.process in processes}

    # -- segments --------------------------------------------------------------------------------

    def attach(self, client_id: int, process: int | None = None) -> int:
        """A new segment for a client of ``process``; returns its file descriptor, for the caller to hand
        over and close."""
        return self._memory.attach(client_id, _process_key(client_id, process))

    def adopt(self, client_id: int, fd: int, owned: list[int], process: int | None = None) -> None:
        """Take a client's segment of a session whose daemon is gone, with the blocks it was granted.

        Counted against the pool even past its size (a restart with a smaller pool, or clients that
        held more than it has): nothing they hold is lost, and new grants wait until it is back.
        BlockError if the blocks are not in it, ClientError if the segment is not one of this pool's layout or
        cannot be mapped read-write; the caller keeps ``fd``.
        """
        if len(set(owned)) != len(owned) or not all(0 <= b < self.block_count for b in owned):
            raise BlockError(f"the blocks of a resumed session must be distinct and in 0..{self.block_count - 1}")
        memory = self._memory.adopt(client_id, fd, _process_key(client_id, process), owned)
        self._take(memory, owned)

    def reattach(self, client_id: int, fd: int, owned: list[int]) -> None:
        """Give a client back the segment of its session that this pool kept (see :meth:`detach`), with the
        blocks of batches it sealed that the daemon never got. ``fd`` must be that segment (see
        :meth:`ClientSegments.kept`): ClientError if it is not, BlockError if a block is not free; the caller
        keeps ``fd``."""
        memory = self._memory.kept(client_id, fd)
        if len(set(owned)) != len(owned) or not all(0 <= b < self.block_count and memory.state[b] == FREE
                                                    for b in owned):
            raise BlockError("the blocks of a session taken back must be distinct and free in its segment")
        self._memory.reattach(memory)
        self._take(memory, owned)

    def _take(self, memory: ClientMemory, owned: list[int]) -> None:
        """Count blocks a client holds again against the pool."""
        for block in owned:
            memory.state[block] = OWNED
        self._count_held(memory.process, len(owned))
        self._free_count -= len(owned)
        self._memory.touch(memory, owned)

    def _count_held(self, process: int, change: int) -> None:
        """Count blocks a process's clients took (``change`` > 0) or gave back; a process that holds none is
        not kept."""
        held = self._process_held.get(process, 0) + change
        if held:
            self._process_held[process] = held
        else:
            self._process_held.pop(process, None)

    def detach(self, client_id: int, *, keep: bool = False) -> int:
        """The client's session ended: its unsealed blocks return to the pool (no other client can map them),
        its requests are forgotten, and its segment goes once its sealed batches are sent, or, if ``keep``,
        once :meth:`forget` says the client will not take it back. Returns the blocks freed."""
        self.forget_waiters(client_id)
        blocks = self.owned_blocks(client_id)
        if self._memory.detach(client_id, keep=keep) is None:
            return 0
        self.free(client_id, blocks)  # which drops the segment if nothing is left to send
        return len(blocks)

    def forget(self, client_id: int) -> None:
        """A kept segment will not be taken back: it goes once its sealed batches are sent."""
        self._memory.forget(client_id)

    # -- allocation ------------------------------------------------------------------------------

    def request(self, client_id: int, request_id: int, count: int, contiguous: bool,
                deadline_ms: int) -> list[int] | None:
        """Blocks now, or None: the request waits in the FIFO (served by :meth:`serve_waiters`).

        A request for spare blocks may get fewer than ``count``: what is free, within the
        client's limit. BlockError if the request can never be served, or if the client
        already has a request of the same kind waiting.
        """
        memory = self._memory.get(client_id)
        if memory is None or not memory.attached:
            raise BlockError(f"client {client_id} has no segment")
        if count < 1 or count > self.block_count:
            raise BlockError(f"cannot grant {count} blocks: the pool has {self.block_count}")
        if contiguous and count > self.max_blocks_per_process:
            raise BlockError(f"cannot grant a run of {count} blocks: a process may hold "
                             f"{self.max_blocks_per_process} of the pool's {self.block_count}")
        for other in self.waiters:
            if other.client_id == client_id and other.contiguous == contiguous:
                raise BlockError(f"request {other.request_id} for {'a run of' if contiguous else 'spare'} blocks "
                                 "is still waiting: a client may have one such request waiting at a time")
        waiter = Waiter(client_id, request_id, count, contiguous, deadline_ms)
        # Behind those who wait for the pool, in FIFO order; not behind those who wait for their own blocks.
        if not self._waits_for_own(waiter) and not self.exhausted:
            blocks = self._grant(waiter)
            if blocks is not None:
                return blocks
        self.waiters.append(waiter)
        return None

    def hand_back(self, client_id: int, count: int) -> list[int]:
        """Up to ``count`` spare blocks for a client now, unasked (with its delivery reports), within its process's
        limit; none while anyone waits for the pool: what comes back is theirs first (one that waits for its own
        process's blocks holds back nobody else)."""
        memory = self._memory.get(client_id)
        if count < 1 or memory is None or not memory.attached or self.exhausted:
            return []
        return self._grant(Waiter(client_id, 0, count, False, 0)) or []

    def serve_waiters(self) -> list[tuple[Waiter, list[int]]]:
        """Serve waiting requests in order while blocks allow (skipping those of clients at their limit)."""
        served = []
        for waiter in list(self.waiters):
            if self._waits_for_own(waiter):
                continue  # it waits for its own blocks, not for the pool: no reason to hold back the others
            blocks = self._grant(waiter)
            if blocks is None:
                break
            self.waiters.remove(waiter)
            served.append((waiter, blocks))
        self._waited(w for w, _ in served)
        return served

    def expire_waiters(self, now: int) -> list[Waiter]:
        """Drop the requests whose deadline passed (their clients have given up)."""
        expired = [w for w in self.waiters if w.deadline_ms <= now]
        if expired:
            self.waiters = deque(w for w in self.waiters if w.deadline_ms > now)
            self._waited(expired)
        return expired

    def forget_waiters(self, client_id: int) -> None:
        """Drop the waiting requests of a client (its session ended)."""
        self._waited(w for w in self.waiters if w.client_id == client_id)
        self.waiters = deque(w for w in self.waiters if w.client_id != client_id)

    def _waited(self, waiters: Iterable[Waiter]) -> None:
        now = time.monotonic_ns()
        self.wait_time_ns_total += sum(now - w.since_ns for w in waiters)

    def _waits_for_own(self, waiter: Waiter) -> bool:
        """Whether the request waits for blocks of its process's to come back, not for the pool's: the process
        holds as many as it may, or its client's blocks break every run of its segment that the request could
        use."""
        if self._waits_for_process(waiter):
            return True
        return (waiter.contiguous and self._free_count >= waiter.count
                and self._memory[waiter.client_id].state.find(bytes(waiter.count)) < 0)

    def _waits_for_process(self, waiter: Waiter) -> bool:
        """Whether the request's process holds as many blocks as it may: those of any of its clients must come
        back first."""
        needed = waiter.count if waiter.contiguous else 1
        return self.held_by_process(self._memory[waiter.client_id].process) + needed > self.max_blocks_per_process

    def _grant(self, waiter: Waiter) -> list[int] | None:
        """Blocks for a request within its client's limit, or None if the pool has too few free."""
        if self._queue.full:
            return None
        memory = self._memory[waiter.client_id]
        state = memory.state
        if waiter.contiguous:
            if self._free_count < waiter.count:
                return None
            first = state.find(bytes(waiter.count))
            if first < 0:
                return None  # its own blocks are in the way: they come back as its batches are sent
            blocks = list(range(first, first + waiter.count))
            state[first:first + waiter.count] = bytes([OWNED]) * waiter.count
        else:
            count = min(waiter.count, self.max_blocks_per_process - self.held_by_process(memory.process),
                        self._free_count)
            if count < 1:
                return None
            blocks = []
            stack = memory.stack
            while len(blocks) < count and stack:
                block = stack.pop()
                # Each block is taken as it is found, so a block listed twice is granted once.
                if state[block] == FREE:
                    state[block] = OWNED
                    blocks.append(block)
            while len(blocks) < count:
                block = state.find(FREE_BYTE)  # never used yet, or lost from the stack
                state[block] = OWNED
                blocks.append(block)
        self._count_held(memory.process, len(blocks))
        self._free_count -= len(blocks)
        self._memory.touch(memory, blocks)
        return blocks

    # -- ownership -------------------------------------------------------------------------------

    def check_owned(self, client_id: int, first: int, count: int) -> None:
        """BlockError unless blocks first..first+count-1 are granted to ``client_id`` and unsealed."""
        if not (first >= 0 and count >= 1 and first + count <= self.block_count):
            raise BlockError(f"blocks {first}..{first + count - 1} are outside the pool")
        memory = self._memory.get(client_id)
        if memory is None or not memory.attached:
            raise BlockError(f"client {client_id} has no segment")
        state = memory.state
        for block in range(first, first + count):
            if state[block] != OWNED:
                raise BlockError(f"block {block} is not granted to this client")

    def owned_blocks(self, client_id: int) -> list[int]:
        """The blocks granted to a client and not sealed (where its open batches are)."""
        memory = self._memory.get(client_id)
        if memory is None:
            return []
        state, blocks, block = memory.state, [], memory.state.find(OWNED_BYTE)
        while block >= 0:
            blocks.append(block)
            block = state.find(OWNED_BYTE, block + 1)
        return blocks

    def claim_ready(self, client_id: int, now_ms: int, claim_all: bool,
                    early_ms: int) -> tuple[list[tuple[int, ...]], int | None, bool, bool, bool]:
        """Claim the batches a client published on its blocks that are ready, as
        :func:`service.fastpath.claim_ready` says (its blocks granted and not sealed are where they are)."""
        memory = self._memory.get(client_id)
        last = -1 if memory is None else memory.state.rfind(OWNED_BYTE)
        if last < 0:
            return [], None, False, False, False
        first_seen = memory.first_seen
        if len(first_seen) <= last:
            # Sized to the client's last block, not the pool: the pool grants the lowest blocks first.
            first_seen.extend(array("q", [fastpath.UNSEEN]) * (last + 1 - len(first_seen)))
        return fastpath.claim_ready(memory.control, memory.state, OWNED, first_seen, now_ms, claim_all, early_ms)

    def seal_claimed(self, client_id: int, claimed: tuple[int, ...]) -> memoryview | None:
        """Seal a batch :meth:`claim_ready` claimed and return the view of its records; None, and nothing changed,
        if what its client wrote of it is out of range or its blocks are not all the client's unsealed (as
        :func:`service.fastpath.seal_claimed` checks; :func:`service.front.checks.check_notice` and :meth:`seal`
        say why)."""
        memory = self._memory.get(client_id)
        if memory is None or not memory.attached or not fastpath.seal_claimed(memory.state, OWNED, SEALED,
                                                                                self.block_size, claimed):
            return None
        first, length, count = claimed[0], claimed[2], claimed[8]
        self._queue.sealed(count)
        return self._records(memory, first, length)

    def control(self, client_id: int) -> ControlArea | None:
        """The control area of a client's segment, if it has one."""
        memory = self._memory.get(client_id)
        return None if memory is None else memory.control

    def seal(self, client_id: int, first: int, count: int, length: int) -> memoryview:
        """Mark a client's blocks sealed and return the view of the batch's ``length`` bytes."""
        self.check_owned(client_id, first, count)
        if not 1 <= length <= count * self.block_size:
            raise BlockError(f"length {length} does not fit {count} block(s) of {self.block_size} bytes")
        memory = self._memory[client_id]
        memory.state[first:first + count] = bytes([SEALED]) * count
        self._queue.sealed(count)
        return self._records(memory, first, length)

    def unseal(self, client_id: int, first: int, count: int) -> None:
        """Undo :meth:`seal_claimed` for a batch refused before it was queued: its blocks are the client's
        unsealed again, not finished (the queue limit follows what the daemon sends)."""
        self._memory[client_id].state[first:first + count] = bytes([OWNED]) * count
        self._queue.unsealed(count)

    def _records(self, memory: ClientMemory, first: int, length: int) -> memoryview:
        """The view of the ``length`` bytes a client's blocks hold from ``first`` on."""
        start = self.layout.block_offset(first)
        return memory.segment.buf[start:start + length]

    def give_back(self, client_id: int, blocks: list[int]) -> None:
        """A client returns blocks it was granted and did not use (all of them are checked first)."""
        if len(set(blocks)) != len(blocks):
            raise BlockError("a block is named more than once")
        for block in blocks:
            self.check_owned(client_id, block, 1)
        self.free(client_id, blocks)

    def free(self, client_id: int, blocks: list[int] | range) -> int:
        """Return a client's blocks to the pool; returns how many were not free already (only those count)."""
        memory = self._memory.get(client_id)
        if memory is None:
            log.error("blocks of client %s are freed but it has no segment: ignored", client_id)
            return 0
        state = memory.state
        if (isinstance(blocks, range) and blocks.step == 1 and 0 <= blocks.start <= blocks.stop <= len(state)
                and state.find(FREE_BYTE, blocks.start, blocks.stop) < 0):
            # A batch's run of blocks, none free (every batch sent): one slice, not a step a block.
            freed: list[int] | range = blocks
            sealed = state.count(SEALED_BYTE, blocks.start, blocks.stop)
            state[blocks.start:blocks.stop] = FREE_BYTE * len(blocks)
            memory.stack.extend(blocks)
        else:
            freed, sealed = self._free_each(client_id, memory, blocks)
        if sealed:
            self._queue.finished(sealed)
        self._count_held(memory.process, -len(freed))
        self._free_count += len(freed)
        if len(memory.stack) > 2 * self.block_count:
            memory.stack = [b for b in memory.stack if state[b] == FREE]
        self._memory.cool(client_id, freed)
        if memory.unused:
            self._memory.drop(client_id)
        return len(freed)

    @staticmethod
    def _free_each(client_id: int, memory: ClientMemory, blocks: list[int] | range) -> tuple[list[int], int]:
        """Free a client's blocks one by one, those free already left as they are; the blocks freed, and how many
        of them were sealed."""
        state = memory.state
        freed = []
        sealed = 0
        for block in blocks:
            if state[block] == FREE:
                # Whatever a client sends is checked before it gets here: this is a bug of the daemon.
                log.error("block %d of client %s is freed but was free already: ignored", block, client_id)
                continue
            if state[block] == SEALED:
                sealed += 1
            state[block] = FREE
            memory.stack.append(block)
            freed.append(block)
        return freed, sealed

    def free_unsealed(self, client_id: int, first: int, count: int) -> int:
        """Free those of blocks first..first+count-1 that ``client_id`` holds unsealed; leave the others."""
        memory = self._memory.get(client_id)
        if memory is None:
            return 0
        blocks = [b for b in range(max(first, 0), min(first + count, self.block_count)) if memory.state[b] == OWNED]
        self.free(client_id, blocks)
        return len(blocks)

    def close(self) -> None:
        """Unmap every segment (views of them still in use are unmapped when they go)."""
        self._memory.close()


def _process_key(client_id: int, process: int | None) -> int:
    """Whose share of the pool a client's blocks count against: its process's, or, attached without a process,
    its own (keyed by its negated id)."""
    return -client_id if process is None else process
