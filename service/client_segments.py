"""ClientSegments: each client's segment of shared memory, mapped by the daemon, and the pages they keep.

Each client's blocks are in a segment of its own (see :mod:`client_stub.contract.shared_memory`), as large
as the pool, which no other client can map. The daemon creates it as the client's session begins, or takes
it back from the client after a restart; once the session ends, it goes when the last batch sealed in it is
sent, unless the daemon keeps it for its client to take back. Only the pages written are memory: those of
the blocks free longest are given back, so that all segments together keep no more blocks resident than
twice the pool's.
"""

from __future__ import annotations

import logging
import mmap
import os
from array import array
from collections import deque
from collections.abc import ItemsView, ValuesView
from dataclasses import dataclass, field

from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout, Segment, check_segment, create_segment

from .client_error import ClientError

log = logging.getLogger(__name__)

# A block's state in its client's segment.
FREE = 0
OWNED = 1
SEALED = 2
FREE_BYTE = bytes([FREE])
OWNED_BYTE = bytes([OWNED])
SEALED_BYTE = bytes([SEALED])


@dataclass(eq=False, slots=True)
class ClientMemory:
    """One client's segment, mapped, and the state of each of its blocks.

    The pool changes ``state`` and ``stack`` as it grants, seals and frees blocks; the rest is the segment's
    life cycle and its pages, :class:`ClientSegments`'.
    """

    segment: Segment
    # The segment's control area: the client's open batches, and the daemon's claims of them.
    control: ControlArea
    # The process whose share of the pool the client's blocks count against (see BufferPool).
    process: int
    # FREE, OWNED or SEALED, by block.
    state: bytearray
    # Blocks whose pages may be resident: granted since their pages were last given back.
    touched: bytearray
    # When the daemon first saw an open batch on each block (ms; fastpath.UNSEEN since its last claim), up to the
    # last block the client has owned: a client's word on when it opened a batch is taken, but never later than
    # that.
    first_seen: array[int] = field(default_factory=lambda: array("q"))
    # Blocks freed, most recently freed last: reusing those keeps the pages the client touched few and
    # warm. Entries of blocks since taken by a contiguous run may linger; ``state`` is the truth.
    stack: list[int] = field(default_factory=list)
    # False once the client's session ended: its memory goes when its last sealed batch is sent, unless kept.
    attached: bool = True
    # The session ended but the client may take it back (see ClientSegments.detach): the mapping stays meanwhile.
    kept: bool = False
    # The segment's file (st_dev, st_ino): a client that takes its session back proves it with this file.
    file_id: tuple[int, int] = (0, 0)

    @property
    def held(self) -> int:
        """Blocks granted to the client, or holding its batches the daemon claimed, and not back in the pool."""
        return len(self.state) - self.state.count(FREE)

    @property
    def unused(self) -> bool:
        """Its session ended, it is not kept, and it holds no block: nothing needs the segment any more."""
        return not self.attached and not self.kept and not self.held


class ClientSegments:
    """The segment of each client, by client id, from its mapping to its unmapping, and the pages of all of
    them."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._memory: dict[int, ClientMemory] = {}
        # Blocks of every segment that may hold resident pages, and the free ones among them, the longest
        # free first: past twice the pool, those give their pages back (see _trim).
        self._resident = 0
        self._resident_limit = 2 * layout.block_count
        self._cold: deque[tuple[int, int]] = deque()

    def get(self, client_id: int) -> ClientMemory | None:
        return self._memory.get(client_id)

    def __getitem__(self, client_id: int) -> ClientMemory:
        return self._memory[client_id]

    def items(self) -> ItemsView[int, ClientMemory]:
        return self._memory.items()

    def values(self) -> ValuesView[ClientMemory]:
        return self._memory.values()

    # -- life cycle ------------------------------------------------------------------------------

    def attach(self, client_id: int, process: int) -> int:
        """A new segment for a client of ``process``; returns its file descriptor, for the caller to hand
        over and close."""
        if client_id in self._memory:
            raise ValueError(f"client {client_id} has a segment already")
        fd = create_segment(self.layout, f"kafka-sidecar-client-{client_id}")
        try:
            self._memory[client_id] = self._map(fd, process)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def adopt(self, client_id: int, fd: int, process: int, owned: list[int]) -> ClientMemory:
        """Map a client's segment of a session whose daemon is gone, in which it holds the blocks ``owned``.

        ClientError if the segment is not one of this layout or the client may not write into it; the caller
        keeps ``fd``.
        """
        if client_id in self._memory:
            raise ValueError(f"client {client_id} has a segment already")
        try:
            check_segment(fd, self.layout)
        except ValueError as exc:
            raise ClientError(str(exc)) from exc
        try:
            memory = self._memory[client_id] = self._map(fd, process)
        except PermissionError as exc:  # the file was opened read-only
            raise ClientError(f"the segment cannot be mapped read-write: {exc}") from exc
        # Whatever the client wrote into its other blocks is of no use now: their pages go back at once.
        held = set(owned)
        for block in range(self.layout.block_count):
            if block not in held:
                self._give_back_pages(memory, block)
        return memory

    def kept(self, client_id: int, fd: int) -> ClientMemory:
        """The segment kept for a client (see :meth:`detach`), if ``fd`` is it: holding it is what proves the
        client's claim (a file's inode is not reused while the pool maps it). ValueError if none is kept,
        ClientError if ``fd`` is another file."""
        memory = self._memory.get(client_id)
        if memory is None or not memory.kept:
            raise ValueError(f"no segment of client {client_id} is kept")
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) != memory.file_id:
            raise ClientError("the segment handed over is not the one of the session")
        return memory

    def reattach(self, memory: ClientMemory) -> None:
        """A kept segment is its client's again (see :meth:`kept`)."""
        memory.attached, memory.kept = True, False

    def _map(self, fd: int, process: int) -> ClientMemory:
        stat = os.fstat(fd)
        segment = Segment(fd, self.layout)
        control = ControlArea(segment.control, self.layout.block_count)
        block_count = self.layout.block_count
        return ClientMemory(segment, control, process, bytearray(block_count), bytearray(block_count),
                            file_id=(stat.st_dev, stat.st_ino))

    def detach(self, client_id: int, *, keep: bool) -> ClientMemory | None:
        """The client's session ended: its segment goes once it holds nothing (:attr:`ClientMemory.unused`) and,
        if ``keep``, :meth:`forget` said its client will not take it back. None if the client has no segment."""
        memory = self._memory.get(client_id)
        if memory is not None:
            memory.attached, memory.kept = False, keep
        return memory

    def forget(self, client_id: int) -> None:
        """A kept segment will not be taken back: it goes once nothing of it is held."""
        memory = self._memory.get(client_id)
        if memory is not None and memory.kept:
            memory.kept = False
            if memory.unused:
                self.drop(client_id)

    def drop(self, client_id: int) -> None:
        """Unmap a client's segment (views of it still in use are unmapped when they go)."""
        memory = self._memory.pop(client_id)
        self._resident -= sum(memory.touched)
        memory.control.release()
        try:
            memory.segment.close()
        except BufferError:
            # A view of a batch the daemon gave up on is still referenced: the mapping goes with it.
            log.debug("segment of client %s still in use: unmapped when its last view goes", client_id)

    def close(self) -> None:
        """Unmap every segment."""
        for client_id in list(self._memory):
            self.drop(client_id)

    # -- pages -----------------------------------------------------------------------------------

    def touch(self, memory: ClientMemory, blocks: list[int]) -> None:
        """Blocks granted (or held again): their pages may be resident."""
        touched = memory.touched
        for block in blocks:
            if not touched[block]:
                touched[block] = 1
                self._resident += 1
        if self._resident > self._resident_limit:
            self._trim()

    def cool(self, client_id: int, blocks: list[int] | range) -> None:
        """A client's blocks are free: the longest free give their pages back first."""
        self._cold.extend((client_id, block) for block in blocks)
        if len(self._cold) > 4 * self.layout.block_count:
            self._cold = deque((c, b) for c, b in self._cold
                               if c in self._memory and self._memory[c].state[b] == FREE and self._memory[c].touched[b])

    def _trim(self) -> None:
        """Give back the pages of the blocks free longest until the blocks that may be resident, in all
        segments together, are no more than twice the pool's.

        Twice, not once: each busy client keeps the pages of the blocks it uses warm (it reuses those it
        freed last), and the clients' busiest moments do not come at once. Within the pool's size, their
        pages would be given back and written again at every turn (MADV_REMOVE, then page faults in the
        client and the daemon), which cost a saturated host a tenth of its throughput.
        """
        cold = self._cold
        while self._resident > self._resident_limit and cold:
            client_id, block = cold.popleft()
            memory = self._memory.get(client_id)
            # A kept segment's free blocks may hold batches its client sealed when the session ended, which it
            # offers back with the segment: their pages stay (they go when their client is).
            if memory is not None and not memory.kept and memory.touched[block] and memory.state[block] == FREE:
                self._give_back_pages(memory, block)

    def _give_back_pages(self, memory: ClientMemory, block: int) -> None:
        """Free a block's pages (the client's mapping then reads zeros there, until written again)."""
        # The pages wholly the block's only: madvise(2) frees every page its range touches, and a block whose size
        # is not a multiple of the page shares its first and last pages with its neighbours, the last block its last
        # page with the control area.
        start = self.layout.block_offset(block)
        first_page = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end_page = (start + self.layout.block_size) // mmap.PAGESIZE * mmap.PAGESIZE
        if first_page < end_page:
            try:
                memory.segment.madvise(mmap.MADV_REMOVE, first_page, end_page - first_page)
            except OSError as exc:
                # Not expected of a segment that passed check_segment; the block stays resident, counted as not.
                log.warning("cannot give back the pages of a block: %s", exc)
        if memory.touched[block]:
            memory.touched[block] = 0
            self._resident -= 1
