"""BufferPool: grants, the FIFO of waiting requests, expiry, contiguous runs, seal checks, the
zero-copy view, freeing and detaching, the limits per client, the books kept under abuse, and each
client's segment of its own: a sealed memfd, taken back after a restart with the blocks it held."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client_stub.contract.shared_memory import SEALS, Layout, Segment, create_segment
from service.buffer_pool import FREE, OWNED, SEALED, BlockError, BufferPool, client_block_limit

BLOCK = 4096
BLOCKS = 8
A, B, C = 1, 2, 3  # client ids
STRANGER = 99  # a client that never attached


def attach(pool: BufferPool, *clients: int) -> None:
    """Give each client a segment, closing its file descriptor as the daemon does once it is handed over."""
    for client in clients:
        os.close(pool.attach(client))


def map_segment(fd: int, layout: Layout) -> Segment:
    """What a client does with the file descriptor it is handed: map it, and close it."""
    try:
        return Segment(fd, layout)
    finally:
        os.close(fd)


@pytest.fixture
def bare_pool() -> Iterator[BufferPool]:
    """A pool no client has attached to."""
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def segments(bare_pool: BufferPool) -> Iterator[dict[int, Segment]]:
    """Clients A, B and C attached, each one's segment as that client maps it."""
    mapped: dict[int, Segment] = {}
    try:
        for client in (A, B, C):
            mapped[client] = map_segment(bare_pool.attach(client), bare_pool.layout)
        yield mapped
    finally:
        for segment in mapped.values():
            segment.close()


@pytest.fixture
def pool(bare_pool: BufferPool, segments: dict[int, Segment]) -> BufferPool:
    """The pool, with clients A, B and C attached."""
    return bare_pool


def states(pool: BufferPool, client: int) -> list[int]:
    """The state of each block of a client's segment, as the daemon keeps it."""
    return list(pool._memory[client].state)


def take_all(pool: BufferPool, client: int = A) -> None:
    assert pool.request(client, 0, BLOCKS, True, 0) == list(range(BLOCKS))


def mapped(inode: int) -> bool:
    """Whether this process maps the memory file of ``inode`` (as the kernel lists it in /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return any(len(f := line.split()) >= 6 and f[4] == str(inode) and f[5].startswith("/memfd:") for line in maps)


def sealed_memfd(size: int, seals: int = SEALS | fcntl.F_SEAL_SEAL) -> int:
    fd = os.memfd_create("test-segment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


# -- the segments ---------------------------------------------------------------------------------


def test_segment_layout(pool: BufferPool, segments: dict[int, Segment]) -> None:
    assert (pool.block_size, pool.block_count, pool.free_blocks) == (BLOCK, BLOCKS, BLOCKS)
    assert pool.layout == Layout(BLOCK, BLOCKS)
    assert pool.layout.size == BLOCKS * BLOCK and pool.layout.block_offset(3) == 3 * BLOCK
    segment = segments[A]
    assert len(segment.buf) == pool.layout.size
    assert len(segment.blocks(2, 3)) == 3 * BLOCK
    assert states(pool, A) == [FREE] * BLOCKS
    assert pool.held() == {A: 0, B: 0, C: 0}


def test_pool_must_hold_one_block() -> None:
    with pytest.raises(ValueError, match="at least one batch.size"):
        BufferPool(BLOCK - 1, BLOCK)


def test_a_segment_is_a_memfd_with_no_name_in_dev_shm(bare_pool: BufferPool) -> None:
    before = set(os.listdir("/dev/shm"))
    fds = [bare_pool.attach(A), bare_pool.attach(B)]
    try:
        assert set(os.listdir("/dev/shm")) == before
        for fd in fds:
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
            assert os.fstat(fd).st_size == bare_pool.layout.size
            assert os.get_inheritable(fd) is False
    finally:
        for fd in fds:
            os.close(fd)


def test_a_segment_is_sealed_against_shrinking_and_growing(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        for size in (0, BLOCK, bare_pool.layout.size - 1, bare_pool.layout.size + 1, 2 * bare_pool.layout.size):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        with pytest.raises(OSError):
            os.posix_fallocate(fd, 0, bare_pool.layout.size + BLOCK)
        # Nor can a client add a seal (one against writes would keep a restarted daemon from mapping it).
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        assert os.fstat(fd).st_size == bare_pool.layout.size
    finally:
        os.close(fd)


def test_a_segments_pages_are_allocated_only_when_written() -> None:
    pool = BufferPool(256 * 16384, 16384)
    try:
        fd = pool.attach(A)
        segment = map_segment(os.dup(fd), pool.layout)
        try:
            assert os.fstat(fd).st_blocks == 0
            block = segment.blocks(0)
            block[:] = b"x" * pool.block_size
            block.release()
            allocated = os.fstat(fd).st_blocks * 512
            assert pool.block_size <= allocated < pool.layout.size
        finally:
            segment.close()
            os.close(fd)
    finally:
        pool.close()


def test_each_client_has_a_segment_of_its_own(pool: BufferPool, segments: dict[int, Segment]) -> None:
    fds = [pool.attach(4), pool.attach(5)]
    try:
        assert os.fstat(fds[0]).st_ino != os.fstat(fds[1]).st_ino
    finally:
        for fd in fds:
            os.close(fd)
    # The same block number of two clients is not the same memory.
    assert pool.request(A, 1, 1, True, 0) == [0]
    assert pool.request(B, 2, 1, True, 0) == [0]
    mine, theirs = segments[A].blocks(0), segments[B].blocks(0)
    try:
        mine[:] = b"A" * BLOCK
        theirs[:] = b"B" * BLOCK
        assert bytes(mine) == b"A" * BLOCK and bytes(theirs) == b"B" * BLOCK
        view_a, view_b = pool.seal(A, 0, 1, BLOCK), pool.seal(B, 0, 1, BLOCK)
        assert bytes(view_a) == b"A" * BLOCK and bytes(view_b) == b"B" * BLOCK
        view_a.release()
        view_b.release()
        assert bytes(segments[C].blocks(0)) == bytes(BLOCK)
    finally:
        mine.release()
        theirs.release()


def test_a_client_attaches_once(pool: BufferPool) -> None:
    with pytest.raises(ValueError, match=f"client {A} has a segment already"):
        pool.attach(A)
    assert pool.held() == {A: 0, B: 0, C: 0}


def test_a_request_of_a_client_without_a_segment_is_refused(pool: BufferPool) -> None:
    with pytest.raises(BlockError, match=f"client {STRANGER} has no segment"):
        pool.request(STRANGER, 1, 1, False, 0)
    with pytest.raises(BlockError, match=f"client {STRANGER} has no segment"):
        pool.request(STRANGER, 2, 1, True, 0)
    assert not pool.waiters and pool.free_blocks == BLOCKS
    # Nor may a client ask once its session ended.
    pool.detach(A)
    with pytest.raises(BlockError, match=f"client {A} has no segment"):
        pool.request(A, 3, 1, False, 0)
    assert pool.free_blocks == BLOCKS and STRANGER not in pool.held() and A not in pool.held()


# -- grants ---------------------------------------------------------------------------------------


def test_request_grants_free_blocks_at_once(pool: BufferPool) -> None:
    blocks = pool.request(A, 1, 3, False, 0)
    assert blocks is not None and len(set(blocks)) == 3
    assert pool.free_blocks == BLOCKS - 3 and pool.held_by(A) == 3
    assert not pool.exhausted
    assert states(pool, A) == [OWNED if b in blocks else FREE for b in range(BLOCKS)]
    # Each client's blocks are numbered from 0 in its own segment.
    assert pool.request(B, 2, 2, False, 0) == [0, 1]
    assert states(pool, B) == [OWNED, OWNED] + [FREE] * (BLOCKS - 2)
    assert states(pool, A) == [OWNED if b in blocks else FREE for b in range(BLOCKS)]
    assert pool.held() == {A: 3, B: 2, C: 0}


def test_request_of_more_blocks_than_free_grants_the_rest(pool: BufferPool) -> None:
    first = pool.request(A, 1, 6, False, 0)
    rest = pool.request(B, 2, 5, False, 0)
    assert first is not None and len(set(first)) == 6
    assert rest == [0, 1]
    assert pool.free_blocks == 0


@pytest.mark.parametrize("count", [0, -1, BLOCKS + 1])
def test_request_of_an_impossible_count_is_refused(pool: BufferPool, count: int) -> None:
    with pytest.raises(BlockError, match=f"cannot grant {count} blocks"):
        pool.request(A, 1, count, False, 0)
    assert not pool.waiters


def test_contiguous_request_gets_a_run(pool: BufferPool) -> None:
    assert pool.request(A, 1, 1, True, 0) == [0]
    assert pool.request(A, 2, 3, True, 0) == [1, 2, 3]
    # A run in B's own segment: A's blocks are not in its way, only the pool's count is.
    assert pool.request(B, 3, BLOCKS - 4, True, 0) == [0, 1, 2, 3]
    assert pool.free_blocks == 0
    assert pool.request(C, 4, 1, True, 1000) is None


def test_contiguous_run_found_after_fragmentation(pool: BufferPool) -> None:
    take_all(pool)
    pool.free(A, [1, 3, 4, 6])
    assert pool.request(A, 1, 2, True, 0) == [3, 4]
    # Two blocks are free (1 and 6) but not side by side in A's segment: the run waits for A's own blocks,
    # and holds nobody else back (B's segment has room).
    assert pool.request(A, 2, 2, True, 0) is None
    assert not pool.exhausted and pool.clients_at_limit() == {A} and pool.free_blocks == 2
    assert pool.request(B, 1, 1, False, 0) == [0]
    pool.free(A, [7])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(2, [6, 7])]
    assert states(pool, A) == [OWNED, FREE] + [OWNED] * 6
    pool.free(B, [0])
    # A run of the whole pool needs every block.
    pool.free(A, [0, 2, 3, 4, 5, 6])
    assert pool.request(A, 3, BLOCKS, True, 1000) is None  # block 7 is still A's
    pool.free(A, [7])
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(3, list(range(BLOCKS)))]


# -- waiters --------------------------------------------------------------------------------------


def test_waiters_are_served_in_fifo_order(pool: BufferPool) -> None:
    take_all(pool)
    assert pool.request(B, 10, 3, True, 5000) is None   # a large record: a run of 3
    assert pool.request(C, 20, 1, False, 5000) is None  # behind it, a single block
    assert [(w.client_id, w.request_id, w.count, w.contiguous, w.deadline_ms) for w in pool.waiters] == [
        (B, 10, 3, True, 5000), (C, 20, 1, False, 5000)]
    assert pool.exhausted

    pool.free(A, [0])
    # One block is free, enough for C, but C is behind B: nobody is served.
    assert pool.serve_waiters() == []
    # Nor does a new request jump the queue while others wait.
    assert pool.request(A, 30, 1, False, 5000) is None
    assert [w.request_id for w in pool.waiters] == [10, 20, 30]

    pool.free(A, [1, 2, 7])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(10, [0, 1, 2]), (20, [0])]
    assert [w.request_id for w in pool.waiters] == [30]
    pool.free(A, [5])
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(30, [5])]
    assert not pool.exhausted and pool.held() == {A: 4, B: 3, C: 1}


def test_a_large_request_at_the_head_holds_back_single_ones(pool: BufferPool) -> None:
    take_all(pool)
    assert pool.request(B, 1, 4, True, 5000) is None
    assert pool.request(C, 2, 1, False, 5000) is None
    for block in (0, 2, 5):  # three free blocks, not enough for the run of four
        pool.free(A, [block])
        assert pool.serve_waiters() == []
    pool.free(A, [1, 3])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(1, [0, 1, 2, 3]), (2, [0])]


def test_waiters_expire_at_their_deadline(pool: BufferPool) -> None:
    take_all(pool)
    assert pool.request(B, 1, 1, False, 100) is None
    assert pool.request(C, 2, 1, False, 200) is None
    assert pool.expire_waiters(99) == []
    assert [w.request_id for w in pool.expire_waiters(150)] == [1]
    assert [w.request_id for w in pool.waiters] == [2]
    assert [w.request_id for w in pool.expire_waiters(200)] == [2]  # the deadline itself is too late
    assert not pool.waiters and not pool.exhausted


def test_an_expired_head_no_longer_holds_back_the_others(pool: BufferPool) -> None:
    take_all(pool)
    pool.request(B, 1, 4, True, 100)
    pool.request(C, 2, 1, False, 1000)
    pool.free(A, [5])
    assert pool.serve_waiters() == []
    pool.expire_waiters(100)
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(2, [0])]


def test_forget_waiters_of_one_client(pool: BufferPool) -> None:
    take_all(pool)
    pool.request(B, 1, 1, False, 100)
    pool.request(C, 2, 1, False, 100)
    pool.request(B, 3, 2, True, 100)
    pool.forget_waiters(B)
    assert [w.request_id for w in pool.waiters] == [2]


# -- the budget across clients --------------------------------------------------------------------


def test_the_budget_is_global(pool: BufferPool) -> None:
    assert pool.request(A, 1, 6, False, 0) == [0, 1, 2, 3, 4, 5]
    # B's segment has all its blocks free, but the pool has only two left.
    assert pool.request(B, 2, 5, False, 0) == [0, 1]
    assert pool.request(B, 3, 2, True, 1000) is None
    assert pool.request(C, 4, 1, False, 1000) is None
    assert pool.free_blocks == 0 and pool.held() == {A: 6, B: 2, C: 0}
    pool.give_back(A, [0, 1, 2])
    assert [(w.client_id, blocks) for w, blocks in pool.serve_waiters()] == [(B, [2, 3]), (C, [0])]
    assert pool.free_blocks == 0 and pool.held() == {A: 3, B: 4, C: 1}


# -- seal -----------------------------------------------------------------------------------------


def test_seal_returns_a_zero_copy_view_of_the_shared_memory(pool: BufferPool, segments: dict[int, Segment]) -> None:
    run = pool.request(A, 1, 2, True, 0)
    assert run is not None
    first = run[0]
    client_view = segments[A].blocks(first, 2)
    payload = bytes(range(256)) * 20  # 5120 bytes: across the block boundary
    client_view[:len(payload)] = payload
    view = pool.seal(A, first, 2, len(payload))
    try:
        assert isinstance(view, memoryview) and view.nbytes == len(payload)
        assert bytes(view) == payload
        # The same memory, not a copy: what the client writes now shows in the view.
        client_view[0:4] = b"ABCD"
        client_view[BLOCK:BLOCK + 2] = b"YZ"
        assert bytes(view[0:4]) == b"ABCD" and bytes(view[BLOCK:BLOCK + 2]) == b"YZ"
        assert states(pool, A)[first:first + 2] == [SEALED, SEALED]
        assert pool.held_by(A) == 2
    finally:
        view.release()
        client_view.release()


def test_seal_of_another_clients_block_is_refused(pool: BufferPool) -> None:
    assert pool.request(A, 1, 2, True, 0) == [0, 1]
    # B's block 0 is not A's block 0.
    with pytest.raises(BlockError, match="block 0 is not granted to this client"):
        pool.seal(B, 0, 1, 10)
    # Half of a run that is the client's and half that is not.
    assert pool.request(B, 2, 1, False, 0) == [0]
    with pytest.raises(BlockError, match="block 1 is not granted"):
        pool.seal(B, 0, 2, 10)
    with pytest.raises(BlockError, match=f"client {STRANGER} has no segment"):
        pool.seal(STRANGER, 0, 1, 10)
    assert states(pool, A)[:2] == [OWNED, OWNED]
    assert states(pool, B)[:2] == [OWNED, FREE]


def test_seal_of_a_free_block_is_refused(pool: BufferPool) -> None:
    with pytest.raises(BlockError, match="not granted"):
        pool.seal(A, 0, 1, 10)
    assert states(pool, A) == [FREE] * BLOCKS


def test_seal_twice_is_refused(pool: BufferPool) -> None:
    pool.request(A, 1, 1, True, 0)
    view = pool.seal(A, 0, 1, 100)
    view.release()
    with pytest.raises(BlockError, match="block 0 is not granted"):
        pool.seal(A, 0, 1, 100)
    assert states(pool, A)[0] == SEALED and pool.held_by(A) == 1


@pytest.mark.parametrize(("first", "count"), [(-1, 1), (BLOCKS, 1), (BLOCKS - 1, 2), (0, 0), (0, -1),
                                              (0, BLOCKS + 1), (2**40, 1)])
def test_seal_outside_the_pool_is_refused(pool: BufferPool, first: int, count: int) -> None:
    take_all(pool)
    with pytest.raises(BlockError, match="outside the pool"):
        pool.seal(A, first, count, 1)
    assert states(pool, A) == [OWNED] * BLOCKS


@pytest.mark.parametrize("length", [0, -1, 2 * BLOCK + 1])
def test_seal_of_a_length_that_does_not_fit_is_refused(pool: BufferPool, length: int) -> None:
    pool.request(A, 1, 2, True, 0)
    with pytest.raises(BlockError, match=f"length {length} does not fit 2 block"):
        pool.seal(A, 0, 2, length)
    assert states(pool, A)[:2] == [OWNED, OWNED]  # still the client's


def test_seal_of_exactly_full_blocks(pool: BufferPool) -> None:
    pool.request(A, 1, 3, True, 0)
    view = pool.seal(A, 0, 3, 3 * BLOCK)
    assert view.nbytes == 3 * BLOCK
    view.release()


# -- giving back ----------------------------------------------------------------------------------


def test_give_back_frees_unused_granted_blocks(pool: BufferPool) -> None:
    blocks = pool.request(A, 1, 3, False, 0)
    assert blocks is not None
    pool.give_back(A, blocks[:2])
    assert pool.free_blocks == BLOCKS - 1 and pool.held_by(A) == 1
    assert [states(pool, A)[b] for b in blocks] == [FREE, FREE, OWNED]


def test_give_back_checks_every_block_before_freeing_any(pool: BufferPool) -> None:
    assert pool.request(A, 1, 2, True, 0) == [0, 1]
    assert pool.request(B, 2, 3, True, 0) == [0, 1, 2]
    # A's block 2 is free in A's segment, whatever B holds under that number.
    with pytest.raises(BlockError, match="block 2 is not granted"):
        pool.give_back(A, [0, 2])
    assert states(pool, A)[:3] == [OWNED, OWNED, FREE]
    with pytest.raises(BlockError, match="outside the pool"):
        pool.give_back(A, [1, BLOCKS])
    with pytest.raises(BlockError, match=f"client {STRANGER} has no segment"):
        pool.give_back(STRANGER, [0])
    assert pool.free_blocks == BLOCKS - 5 and pool.held() == {A: 2, B: 3, C: 0}


def test_give_back_of_a_sealed_block_is_refused(pool: BufferPool) -> None:
    pool.request(A, 1, 1, True, 0)
    pool.seal(A, 0, 1, 10).release()
    with pytest.raises(BlockError):
        pool.give_back(A, [0])
    assert states(pool, A)[0] == SEALED and pool.free_blocks == BLOCKS - 1


def test_give_back_of_a_block_named_twice_is_refused(pool: BufferPool) -> None:
    blocks = pool.request(A, 1, 2, False, 0)
    assert blocks is not None
    with pytest.raises(BlockError, match="named more than once"):
        pool.give_back(A, [blocks[0], blocks[1], blocks[0]])
    assert pool.free_blocks == BLOCKS - 2
    assert [states(pool, A)[b] for b in blocks] == [OWNED, OWNED]


def test_free_returns_sealed_blocks_to_the_pool(pool: BufferPool) -> None:
    take_all(pool)
    pool.seal(A, 2, 2, 5000).release()
    assert pool.free(A, range(2, 4)) == 2
    assert pool.free_blocks == 2 and pool.held_by(A) == 6
    assert states(pool, A)[2:4] == [FREE, FREE]
    # The count is granted again, to anyone.
    assert pool.request(B, 1, 2, False, 0) == [0, 1]
    pool.give_back(B, [0, 1])
    # The blocks themselves are granted again to their client.
    assert sorted(pool.request(A, 2, 2, False, 0) or []) == [2, 3]
    assert states(pool, A) == [OWNED] * BLOCKS


def test_free_unsealed_frees_only_the_clients_unsealed_blocks(pool: BufferPool) -> None:
    assert pool.request(A, 1, 3, True, 0) == [0, 1, 2]
    assert pool.request(B, 2, 1, True, 0) == [0]
    assert pool.request(A, 3, 2, True, 0) == [3, 4]
    pool.seal(A, 3, 1, 10).release()
    assert pool.free_unsealed(A, 1, 3) == 2  # 1 and 2; 3 is sealed
    assert states(pool, A)[:6] == [OWNED, FREE, FREE, SEALED, OWNED, FREE]
    assert states(pool, B)[0] == OWNED and pool.held_by(B) == 1
    assert pool.free_unsealed(A, -3, 2**40) == 2  # clamped to the pool: 0 and 4
    assert pool.free_unsealed(A, 0, -1) == 0
    assert pool.free_unsealed(STRANGER, 0, BLOCKS) == 0
    assert pool.held() == {A: 1, B: 1, C: 0} and pool.free_blocks == BLOCKS - 2


def test_free_counts_only_blocks_that_were_not_free(pool: BufferPool, caplog: pytest.LogCaptureFixture) -> None:
    take_all(pool)
    with caplog.at_level(logging.ERROR, logger="service.buffer_pool"):
        assert pool.free(A, [3, 3, 5]) == 2
        assert pool.free(A, [3]) == 0
        assert pool.free(STRANGER, [0]) == 0
    assert f"block 3 of client {A} is freed but was free already" in caplog.text
    assert f"blocks of client {STRANGER} are freed but it has no segment" in caplog.text
    assert pool.free_blocks == 2 and pool.held_by(A) == 6
    # Each free block is granted once, however often it was named.
    assert sorted(pool.request(A, 1, BLOCKS, False, 0) or []) == [3, 5]
    assert pool.free_blocks == 0
    assert pool.request(C, 2, 1, False, 100) is None
    assert states(pool, A) == [OWNED] * BLOCKS


def test_a_block_taken_by_a_run_is_not_granted_again(pool: BufferPool) -> None:
    take_all(pool)
    pool.free(A, [5])
    pool.free(A, [3])
    assert pool.request(A, 1, 1, True, 0) == [3]  # a run takes the first free block, most recently freed
    assert pool.request(A, 2, BLOCKS, False, 0) == [5]
    assert pool.free_blocks == 0 and pool.held_by(A) == BLOCKS
    # Freed again after a run took it: granted once.
    pool.free(A, [3])
    assert pool.request(A, 3, 1, True, 0) == [3]
    pool.free(A, [3])
    assert pool.request(A, 4, BLOCKS, False, 0) == [3]
    assert pool.free_blocks == 0 and pool.held_by(A) == BLOCKS


# -- detach ---------------------------------------------------------------------------------------


def test_detach_frees_unsealed_blocks_and_keeps_sealed_ones(pool: BufferPool) -> None:
    assert pool.request(A, 1, 3, True, 0) == [0, 1, 2]
    assert pool.request(B, 2, 2, True, 0) == [0, 1]
    pool.seal(A, 1, 1, 100).release()
    assert pool.request(A, 3, 3, True, 0) == [3, 4, 5]
    assert pool.request(A, 4, 2, False, 1000) is None  # waiting
    assert pool.request(B, 5, 1, False, 1000) is None  # waiting
    assert pool.detach(A) == 5
    assert states(pool, A) == [FREE, SEALED] + [FREE] * (BLOCKS - 2)
    assert states(pool, B)[:3] == [OWNED, OWNED, FREE]
    assert [(w.client_id, w.request_id) for w in pool.waiters] == [(B, 5)]
    assert pool.held() == {A: 1, B: 2, C: 0} and pool.free_blocks == BLOCKS - 3
    assert pool.detach(A) == 0
    # A session that ended cannot use what is left of its segment.
    for act in (lambda: pool.seal(A, 1, 1, 100), lambda: pool.give_back(A, [1]), lambda: pool.check_owned(A, 1, 1)):
        with pytest.raises(BlockError, match=f"client {A} has no segment"):
            act()
    # The sealed block goes back when its batch is finished, and the segment with it.
    assert pool.free(A, [1]) == 1
    assert pool.free_blocks == BLOCKS - 2
    assert A not in pool._memory and pool.held() == {B: 2, C: 0}
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(5, [2])]


def test_detach_keeps_the_segment_mapped_while_a_sealed_batch_is_held(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    inode = os.fstat(fd).st_ino
    client = map_segment(fd, bare_pool.layout)
    assert bare_pool.request(A, 1, 4, True, 0) == [0, 1, 2, 3]
    client.buf[BLOCK:BLOCK + 5] = b"hello"
    client.close()  # the client is gone
    view = bare_pool.seal(A, 1, 1, 5)
    try:
        assert bare_pool.detach(A) == 3
        assert bare_pool.free_blocks == BLOCKS - 1
        assert mapped(inode) and bytes(view) == b"hello"
        view.release()
        assert bare_pool.free(A, [1]) == 1
        assert bare_pool.free_blocks == BLOCKS and bare_pool.held() == {}
        assert not mapped(inode)
    finally:
        view.release()


def test_detach_drops_a_segment_with_no_sealed_batch(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    inode = os.fstat(fd).st_ino
    os.close(fd)
    assert bare_pool.request(A, 1, 3, False, 0) is not None
    assert mapped(inode)
    assert bare_pool.detach(A) == 3
    assert not mapped(inode) and bare_pool.held() == {} and bare_pool.free_blocks == BLOCKS
    assert bare_pool.detach(A) == 0


def test_a_batch_view_outlives_its_dropped_segment(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    inode = os.fstat(fd).st_ino
    client = map_segment(fd, bare_pool.layout)
    assert bare_pool.request(A, 1, 1, True, 0) == [0]
    client.buf[:3] = b"abc"
    client.close()
    view = bare_pool.seal(A, 0, 1, 3)
    bare_pool.detach(A)
    bare_pool.free(A, [0])  # the daemon gave up on the batch while its view is still referenced
    assert bare_pool.held() == {} and bare_pool.free_blocks == BLOCKS
    assert bytes(view) == b"abc"
    view.release()
    gc.collect()
    assert not mapped(inode)


def test_a_kept_segment_stays_mapped_until_forgotten(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    inode = os.fstat(fd).st_ino
    os.close(fd)
    assert bare_pool.request(A, 1, 2, True, 0) == [0, 1]
    bare_pool.seal(A, 0, 1, 10).release()
    assert bare_pool.detach(A, keep=True) == 1
    assert bare_pool.free(A, [0]) == 1
    # Nothing is held, and the segment is still mapped: its client may take it back.
    assert mapped(inode) and bare_pool.held() == {A: 0} and bare_pool.free_blocks == BLOCKS
    with pytest.raises(BlockError, match="has no segment"):
        bare_pool.request(A, 2, 1, False, 0)
    bare_pool.forget(A)
    assert not mapped(inode) and bare_pool.held() == {}


def test_a_kept_segment_forgotten_while_a_batch_is_held_goes_with_the_batch(bare_pool: BufferPool) -> None:
    attach(bare_pool, A)
    assert bare_pool.request(A, 1, 1, True, 0) == [0]
    bare_pool.seal(A, 0, 1, 10).release()
    bare_pool.detach(A, keep=True)
    bare_pool.forget(A)
    assert bare_pool.held() == {A: 1}
    bare_pool.free(A, [0])
    assert bare_pool.held() == {}


def test_a_kept_segments_free_blocks_keep_their_pages() -> None:
    # What a client wrote into its blocks when its session ended, it offers back with the segment: the pages
    # the pool gives back to stay within twice buffer.memory are others'.
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    fd = pool.attach(A)
    client = Segment(fd, pool.layout)
    try:
        assert pool.request(A, 1, 1, True, 0) == [0]
        client.buf[:5] = b"HELLO"  # sealed by the client as its session ended; the daemon never got the seal
        pool.detach(A, keep=True)
        for other in range(B, B + 6):  # others churn through the pool, past the resident limit
            os.close(pool.attach(other))
            blocks = pool.request(other, 1, BLOCKS, False, 0) or []
            pool.give_back(other, blocks)
        assert bytes(client.buf[:5]) == b"HELLO"
        pool.reattach(A, fd, [0])
        view = pool.seal(A, 0, 1, 5)
        assert bytes(view) == b"HELLO"
        view.release()
    finally:
        client.close()
        os.close(fd)
        pool.close()


def test_reattach_gives_the_kept_segment_back_with_the_blocks_named(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    client = Segment(fd, bare_pool.layout)
    try:
        assert bare_pool.request(A, 1, 3, True, 0) == [0, 1, 2]
        bare_pool.seal(A, 0, 1, 10).release()  # in flight when the session ends
        client.buf[BLOCK:BLOCK + 5] = b"later"  # block 1: sealed by the client, the daemon never got it
        bare_pool.detach(A, keep=True)
        assert bare_pool.free_blocks == BLOCKS - 1
        bare_pool.reattach(A, fd, [1])
        assert states(bare_pool, A)[:3] == [SEALED, OWNED, FREE]
        assert bare_pool.held() == {A: 2} and bare_pool.free_blocks == BLOCKS - 2
        view = bare_pool.seal(A, 1, 1, 5)
        assert bytes(view) == b"later"
        view.release()
        # A live session again: granted, and dropped only when detached without keeping.
        assert bare_pool.request(A, 2, 1, False, 0) == [2]
    finally:
        client.close()
        os.close(fd)


def test_reattach_needs_the_same_segment_and_free_blocks(bare_pool: BufferPool) -> None:
    fd = bare_pool.attach(A)
    other = create_segment(bare_pool.layout, "another")
    try:
        assert bare_pool.request(A, 1, 2, True, 0) == [0, 1]
        bare_pool.seal(A, 0, 1, 10).release()
        with pytest.raises(ValueError, match="no segment of client 1 is kept"):
            bare_pool.reattach(A, fd, [])  # its session has not ended
        bare_pool.detach(A, keep=True)
        with pytest.raises(ValueError, match="not the one of the session"):
            bare_pool.reattach(A, other, [])
        for blocks in ([0], [1, 1], [BLOCKS]):
            with pytest.raises(BlockError, match="distinct and free"):
                bare_pool.reattach(A, fd, blocks)
        assert bare_pool.held() == {A: 1} and bare_pool.free_blocks == BLOCKS - 1
        bare_pool.reattach(A, fd, [1])
        assert bare_pool.held() == {A: 2}
    finally:
        os.close(fd)
        os.close(other)


def test_the_clients_of_one_process_share_its_limit() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=4)
    try:
        for client, process in ((A, 100), (B, 100), (C, 200)):
            os.close(pool.attach(client, process))
        assert len(pool.request(A, 1, 3, False, 0) or []) == 3
        assert len(pool.request(B, 1, 3, False, 0) or []) == 1  # its process's share is taken
        # B waits for its process's blocks, without holding back another process.
        assert pool.request(B, 2, 1, False, 1000) is None and pool.clients_at_limit() == {B}
        assert len(pool.request(C, 1, 4, False, 0) or []) == 4
        assert (pool.held_by_process(100), pool.held_by_process(200)) == (4, 4)
        pool.give_back(A, [pool._memory[A].state.find(bytes([OWNED]))])
        assert [(w.client_id, len(blocks)) for w, blocks in pool.serve_waiters()] == [(B, 1)]
        # A process's share goes with its last segment.
        for client in (A, B):
            pool.detach(client)
        assert pool.held_by_process(100) == 0 and 100 not in pool._processes
    finally:
        pool.close()


# -- adopt ----------------------------------------------------------------------------------------


def test_adopt_takes_back_a_segment_with_its_records(bare_pool: BufferPool) -> None:
    previous = BufferPool(BLOCKS * BLOCK, BLOCK)  # the daemon of the client's session, about to go
    fd = previous.attach(A)
    client = Segment(fd, previous.layout)  # the client keeps its file descriptor to resume
    try:
        assert previous.request(A, 1, 3, True, 0) == [0, 1, 2]
        record = bytes(range(256)) * 24  # 6144 bytes in blocks 1 and 2
        client.buf[BLOCK:BLOCK + len(record)] = record
        previous.close()

        bare_pool.adopt(A, fd, [1, 2])
        os.close(fd)  # the caller's to close; the pool maps the segment
        fd = -1
        assert bare_pool.held() == {A: 2} and bare_pool.free_blocks == BLOCKS - 2
        assert states(bare_pool, A)[:3] == [FREE, OWNED, OWNED]
        view = bare_pool.seal(A, 1, 2, len(record))
        assert bytes(view) == record
        client.buf[BLOCK:BLOCK + 4] = b"same"  # the same memory, not a copy
        assert bytes(view[:4]) == b"same"
        view.release()
        # Blocks not named are free; new grants are in the same segment, around the blocks held.
        assert sorted(bare_pool.request(A, 2, 3, False, 0) or []) == [0, 3, 4]
        assert bare_pool.held_by(A) == 5
    finally:
        client.close()
        if fd >= 0:
            os.close(fd)


def test_adopt_counts_blocks_past_the_pool_size(bare_pool: BufferPool) -> None:
    for client, owned in ((A, range(6)), (B, range(5))):
        fd = create_segment(bare_pool.layout, "resumed")
        try:
            bare_pool.adopt(client, fd, list(owned))
        finally:
            os.close(fd)
    attach(bare_pool, C)
    assert bare_pool.free_blocks == -3 and bare_pool.held() == {A: 6, B: 5, C: 0}
    # Nothing is granted until enough is back.
    assert bare_pool.request(C, 1, 1, False, 1000) is None
    assert bare_pool.exhausted
    pool_view = bare_pool.seal(A, 0, 3, 3 * BLOCK)
    pool_view.release()
    bare_pool.free(A, [0, 1, 2])
    assert bare_pool.free_blocks == 0 and bare_pool.serve_waiters() == []
    bare_pool.give_back(B, [4])
    assert [(w.client_id, blocks) for w, blocks in bare_pool.serve_waiters()] == [(C, [0])]
    assert bare_pool.free_blocks == 0 and bare_pool.held() == {A: 3, B: 4, C: 1}


def test_adopt_past_the_limit_holds_back_only_its_client() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=5)
    try:
        fd = create_segment(pool.layout, "resumed")
        try:
            pool.adopt(A, fd, [0, 1, 2, 3, 4, 5])
        finally:
            os.close(fd)
        attach(pool, B)
        assert pool.held_by(A) == 6
        assert pool.request(A, 1, 1, False, 1000) is None
        assert pool.clients_at_limit() == {A} and not pool.exhausted
        assert pool.request(B, 2, 5, False, 0) == [0, 1]
        pool.give_back(A, [0])
        assert pool.serve_waiters() == []  # A holds 5 of its 5: the block freed is for the others
        assert pool.request(B, 3, 1, False, 0) == [2]
        pool.give_back(A, [1])
        assert [(w.client_id, blocks) for w, blocks in pool.serve_waiters()] == [(A, [1])]
        assert pool.held() == {A: 5, B: 3} and pool.free_blocks == 0
    finally:
        pool.close()


def _regular_file(tmp_path: Path, size: int) -> int:
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return fd


def _dev_shm_file(tmp_path: Path, size: int) -> int:
    """A segment of the previous design: a POSIX shared memory file in /dev/shm."""
    path = f"/dev/shm/kafka-sidecar-test-{os.getpid()}-{tmp_path.name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _pipe(tmp_path: Path, size: int) -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def _memfd_without_sealing(tmp_path: Path, size: int) -> int:
    fd = os.memfd_create("unsealable", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


_NOT_A_MEMFD = r"not a sealable memory file \(memfd\)|seals are"
_MISSEALED = "seals are 0x[0-9a-f]+, not 0x7: sealed against shrinking and growing, and against further seals, only"
F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in Python 3.11's fcntl


@pytest.mark.parametrize(("make", "error", "match"), [
    (_regular_file, ValueError, _NOT_A_MEMFD),
    (_pipe, ValueError, r"not a sealable memory file \(memfd\)"),
    (_dev_shm_file, ValueError, _MISSEALED),
    (_memfd_without_sealing, ValueError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, 0), ValueError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, fcntl.F_SEAL_SHRINK), ValueError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, fcntl.F_SEAL_GROW), ValueError, _MISSEALED),
    (lambda _, size: sealed_memfd(size - BLOCK), ValueError, f"has {BLOCKS * BLOCK - BLOCK} bytes"),
    (lambda _, size: sealed_memfd(size + 1), ValueError, f"has {BLOCKS * BLOCK + 1} bytes, the pool's layout"),
    (lambda _, size: sealed_memfd(0), ValueError, f"has 0 bytes, the pool's layout {BLOCKS * BLOCK}"),
    # Not sealed against further seals: its holder could seal it against writes later.
    (lambda _, size: sealed_memfd(size, SEALS), ValueError, _MISSEALED),
    # Sealed against writes: the daemon could neither write into it nor give its pages back.
    (lambda _, size: sealed_memfd(size, SEALS | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL), ValueError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, SEALS | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL), ValueError, _MISSEALED),
], ids=["regular file", "pipe", "file in /dev/shm", "memfd that cannot be sealed", "unsealed memfd",
        "memfd sealed against shrinking only", "memfd sealed against growing only", "smaller memfd",
        "larger memfd", "empty memfd", "memfd that may be sealed later", "memfd sealed against writes",
        "memfd sealed against future writes"])
def test_adopt_refuses_a_segment_that_is_not_one_of_the_pool(
        bare_pool: BufferPool, tmp_path: Path, make: Callable[[Path, int], int], error: type[Exception],
        match: str | None) -> None:
    attach(bare_pool, B)
    fd = make(tmp_path, bare_pool.layout.size)
    try:
        with pytest.raises(error, match=match):
            bare_pool.adopt(A, fd, [0])
        os.fstat(fd)  # the caller keeps its file descriptor
        assert bare_pool.held() == {B: 0} and bare_pool.free_blocks == BLOCKS
        with pytest.raises(BlockError, match=f"client {A} has no segment"):
            bare_pool.request(A, 1, 1, False, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("owned", [[1, 1], [0, 2, 0], [-1], [BLOCKS], [0, 2**40]])
def test_adopt_refuses_blocks_that_are_not_distinct_and_in_the_segment(bare_pool: BufferPool, owned: list[int]) -> None:
    fd = create_segment(bare_pool.layout, "resumed")
    try:
        with pytest.raises(BlockError, match=f"must be distinct and in 0..{BLOCKS - 1}"):
            bare_pool.adopt(A, fd, owned)
        assert bare_pool.held() == {} and bare_pool.free_blocks == BLOCKS
        # The segment itself is fine: with its blocks named right, it is taken.
        bare_pool.adopt(A, fd, sorted(set(b for b in owned if 0 <= b < BLOCKS)))
    finally:
        os.close(fd)
    assert bare_pool.held() == {A: len({b for b in owned if 0 <= b < BLOCKS})}


def test_adopt_of_a_client_with_a_segment_is_refused(pool: BufferPool) -> None:
    assert pool.request(A, 1, 2, False, 0) == [0, 1]
    fd = create_segment(pool.layout, "resumed")
    try:
        with pytest.raises(ValueError, match=f"client {A} has a segment already"):
            pool.adopt(A, fd, [5])
    finally:
        os.close(fd)
    assert pool.held() == {A: 2, B: 0, C: 0} and states(pool, A)[:6] == [OWNED, OWNED, FREE, FREE, FREE, FREE]


@pytest.mark.parametrize("seed", range(12))
def test_random_use_and_abuse_keeps_the_books(seed: int) -> None:
    """Grants, seals, deliveries, detaches and expiries mixed with abuse (blocks named twice, blocks
    of others, sealed or free blocks given back or sealed, clients without a segment): the pool's
    books stay exact, a client's segment goes once it is detached and its last batch is sent."""
    rng = random.Random(seed)
    limit = 5
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=limit)
    live = [A, B, C]  # the clients whose session goes on
    gone: list[int] = []  # the clients detached
    next_client = C + 1
    model: dict[tuple[int, int], int] = {}  # (client, block) -> state, of the blocks not free
    sealed: list[tuple[int, range]] = []
    now = 0
    try:
        attach(pool, *live)
        for step in range(400):
            client = rng.choice(live)
            anyone = rng.choice([*live, *gone, STRANGER])
            op = rng.randrange(7)
            grants: list[tuple[int, list[int]]] = []
            if op == 0:
                asking = client if rng.random() < 0.9 else rng.choice([*gone, STRANGER])
                count, contiguous = rng.randrange(1, BLOCKS + 1), rng.random() < 0.4
                must_refuse = asking not in live or (contiguous and count > limit) or any(
                    w.client_id == asking and w.contiguous == contiguous for w in pool.waiters)
                try:
                    blocks = pool.request(asking, step, count, contiguous, now + rng.randrange(50))
                except BlockError:
                    assert must_refuse
                else:
                    assert not must_refuse
                    if blocks is not None:
                        grants.append((asking, blocks))
            elif op == 1:
                grants += [(w.client_id, blocks) for w, blocks in pool.serve_waiters()]
            elif op == 2:
                named = [rng.randrange(BLOCKS) for _ in range(rng.randrange(1, 4))]
                legit = len(set(named)) == len(named) and all(model.get((anyone, b)) == OWNED for b in named)
                try:
                    pool.give_back(anyone, named)
                except BlockError:
                    assert not legit
                else:
                    assert legit
                    for block in named:
                        del model[anyone, block]
            elif op == 3:
                run = range(rng.randrange(BLOCKS), rng.randrange(BLOCKS) + 1)
                legit = len(run) > 0 and all(model.get((anyone, b)) == OWNED for b in run)
                try:
                    pool.seal(anyone, run.start, len(run), 1).release()
                except BlockError:
                    assert not legit
                else:
                    assert legit
                    model.update(((anyone, b), SEALED) for b in run)
                    sealed.append((anyone, run))
            elif op == 4 and sealed:  # a batch is delivered
                owner, run = sealed.pop(rng.randrange(len(sealed)))
                assert pool.free(owner, run) == len(run)
                for block in run:
                    del model[owner, block]
            elif op == 5:  # a session ends, another begins
                mine = [key for key, state in model.items() if key[0] == client and state == OWNED]
                assert pool.detach(client) == len(mine)
                for key in mine:
                    del model[key]
                live.remove(client)
                gone.append(client)
                live.append(next_client)
                attach(pool, next_client)
                next_client += 1
            else:
                now += 20
                pool.expire_waiters(now)
            for owner, blocks in grants:
                assert owner in live
                assert len(set(blocks)) == len(blocks), f"a block granted twice: {blocks}"
                for block in blocks:
                    assert (owner, block) not in model, f"block {block} of {owner} granted while {model[owner, block]}"
                    model[owner, block] = OWNED
            assert pool.free_blocks == BLOCKS - len(model)
            kept = set(live) | {owner for owner, _ in model}
            held = {owner: sum(o == owner for o, _ in model) for owner in kept}
            assert pool.held() == held and all(count <= limit for count in held.values())
            for owner in kept:
                assert states(pool, owner) == [model.get((owner, b), FREE) for b in range(BLOCKS)]
            assert {w.client_id for w in pool.waiters} <= set(live)
    finally:
        pool.close()


# -- limits per client ----------------------------------------------------------------------------


@pytest.fixture
def capped() -> Iterator[BufferPool]:
    """A pool of which a client may hold at most 5 blocks, with clients A, B and C attached."""
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=5)
    try:
        attach(pool, A, B, C)
        yield pool
    finally:
        pool.close()


def test_a_client_holds_at_most_its_limit(capped: BufferPool) -> None:
    mine = capped.request(A, 1, BLOCKS, False, 0)
    assert mine == [0, 1, 2, 3, 4]  # spare blocks: as many as the limit allows
    assert capped.held_by(A) == 5 and capped.free_blocks == 3
    # More waits, for A's own blocks: the pool is not exhausted, and nobody else is held back.
    assert capped.request(A, 2, 2, True, 1000) is None
    assert capped.clients_at_limit() == {A} and not capped.exhausted
    assert capped.request(B, 3, 2, True, 1000) == [0, 1]
    assert capped.serve_waiters() == []
    # Sealed blocks are still A's until their batch is finished.
    capped.seal(A, 0, 2, 100).release()
    assert capped.held_by(A) == 5 and capped.serve_waiters() == []
    capped.free(A, range(0, 2))
    assert capped.held_by(A) == 3
    assert [(w.request_id, blocks) for w, blocks in capped.serve_waiters()] == [(2, [0, 1])]
    assert capped.held_by(A) == 5 and not capped.waiters


def test_a_client_at_its_limit_waits_behind_nobody(capped: BufferPool) -> None:
    assert capped.request(A, 1, 5, True, 0) == [0, 1, 2, 3, 4]
    assert capped.request(A, 2, 1, False, 1000) is None  # at its limit
    assert capped.request(B, 3, 3, False, 1000) == [0, 1, 2]
    assert capped.request(B, 4, 1, True, 1000) is None  # the pool is empty: B waits for the pool
    assert capped.exhausted and capped.clients_at_limit() == {A}
    capped.give_back(A, [2])
    # A is below its limit again and first in line.
    assert [(w.request_id, blocks) for w, blocks in capped.serve_waiters()] == [(2, [2])]
    assert capped.clients_at_limit() == set() and capped.exhausted


def test_a_run_larger_than_the_limit_is_refused(capped: BufferPool) -> None:
    with pytest.raises(BlockError, match="a run of 6 blocks: a process may hold 5 of the pool's 8"):
        capped.request(A, 1, 6, True, 1000)
    assert not capped.waiters and capped.free_blocks == BLOCKS


def test_one_waiting_request_of_each_kind_per_client(pool: BufferPool) -> None:
    take_all(pool, C)
    assert pool.request(A, 1, 1, False, 100) is None
    with pytest.raises(BlockError, match="request 1 for spare blocks is still waiting"):
        pool.request(A, 2, 1, False, 100)
    assert pool.request(A, 3, 2, True, 100) is None
    with pytest.raises(BlockError, match="request 3 for a run of blocks is still waiting"):
        pool.request(A, 4, 1, True, 100)
    assert pool.request(B, 5, 1, False, 100) is None  # others are not limited by A's requests
    assert [w.request_id for w in pool.waiters] == [1, 3, 5]
    # Once served, A may ask again.
    pool.free(C, range(BLOCKS))
    assert [w.request_id for w, _ in pool.serve_waiters()] == [1, 3, 5]
    assert pool.request(A, 6, 1, False, 100) is not None


@pytest.mark.parametrize(("memory", "batch", "max_request", "limit"), [
    (32 * 1024 * 1024, 16384, 1024 * 1024, 1024),  # the defaults: half the pool
    (4 * 16384, 16384, 1024 * 1024, 4),            # a tiny pool: all of it, for one large record
    (256 * 16384, 16384, 3 * 1024 * 1024, 192),    # at least the run of the largest batch
    (16384, 16384, 100, 1),
])
def test_client_block_limit(memory: int, batch: int, max_request: int, limit: int) -> None:
    assert client_block_limit(memory, batch, max_request) == limit


def test_limit_must_allow_a_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=0)


def test_states_follow_every_change(pool: BufferPool) -> None:
    assert pool.request(A, 1, 4, True, 0) == [0, 1, 2, 3]
    assert pool.request(B, 2, 2, True, 0) == [0, 1]
    pool.seal(A, 0, 2, 5000).release()
    pool.give_back(A, [3])
    assert states(pool, A) == [SEALED, SEALED, OWNED] + [FREE] * 5
    assert states(pool, B) == [OWNED, OWNED] + [FREE] * 6
    assert pool.held() == {A: 3, B: 2, C: 0}
    pool.free(A, [0, 1])
    assert states(pool, A) == [FREE, FREE, OWNED] + [FREE] * 5
    pool.detach(A)
    pool.detach(B)
    assert pool.held() == {C: 0}
    assert pool.free_blocks == BLOCKS


# -- close ----------------------------------------------------------------------------------------


def test_close_unmaps_every_segment() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    inodes = []
    for client in (A, B):
        fd = pool.attach(client)
        inodes.append(os.fstat(fd).st_ino)
        os.close(fd)
    pool.request(A, 1, 2, False, 0)
    assert all(mapped(inode) for inode in inodes)
    pool.close()
    assert not any(mapped(inode) for inode in inodes)
    assert pool.held() == {}


def test_close_with_a_batch_view_still_alive(caplog: pytest.LogCaptureFixture) -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    fd = pool.attach(A)
    inode = os.fstat(fd).st_ino
    client = map_segment(fd, pool.layout)
    pool.request(A, 1, 1, True, 0)
    client.buf[:10] = b"0123456789"
    client.close()
    view = pool.seal(A, 0, 1, 10)
    with caplog.at_level(logging.DEBUG, logger="service.buffer_pool"):
        pool.close()
    assert f"segment of client {A} still in use" in caplog.text
    assert pool.held() == {}
    # The mapping stays valid for whoever still holds a view, and goes with the view.
    assert bytes(view) == b"0123456789"
    view.release()
    gc.collect()
    assert not mapped(inode)


# -- what is resident ------------------------------------------------------------------------------


def resident_pages(segment: Segment, block: int) -> int:
    """Pages of a client's block that are memory now (mincore(2) through the client's mapping)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    view = segment.blocks(block)
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    vector = (ctypes.c_ubyte * (BLOCK // page))()
    assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(BLOCK), vector) == 0, ctypes.get_errno()
    view.release()
    return sum(v & 1 for v in vector)


def test_clients_together_keep_no_more_blocks_resident_than_twice_the_pool(pool: BufferPool,
                                                                           segments: dict[int, Segment]) -> None:
    # A and B each write every block of theirs and free them: twice the pool is resident, warm for their
    # next batches.
    for client in (A, B):
        blocks = pool.request(client, 1, BLOCKS, False, 0)
        for block in blocks:
            segments[client].blocks(block)[:] = bytes([client]) * BLOCK
        pool.free(client, blocks)
    a_blocks = list(range(BLOCKS))
    assert [resident_pages(segments[A], b) for b in a_blocks] == [1] * BLOCKS
    # C takes three blocks: the pages of as many blocks free the longest (A's first three) go back, and
    # read zeros again.
    mine = pool.request(C, 1, 3, False, 0)
    for block in mine:
        segments[C].blocks(block)[:] = b"c" * BLOCK
    assert [resident_pages(segments[A], b) for b in a_blocks] == [0, 0, 0] + [1] * (BLOCKS - 3)
    assert bytes(segments[A].blocks(0)) == bytes(BLOCK)
    assert bytes(segments[A].blocks(BLOCKS - 1)) == bytes([A]) * BLOCK
    assert all(resident_pages(segments[B], b) == 1 for b in range(BLOCKS))
    # A's next grant reuses what it freed last: still resident, no page given back.
    pool.free(C, mine)
    assert pool.request(A, 2, 2, False, 0) == [BLOCKS - 1, BLOCKS - 2]
    assert resident_pages(segments[B], 0) == 1


def test_a_client_whose_session_ended_gets_no_more_blocks(pool: BufferPool) -> None:
    (block,) = pool.request(A, 1, 1, True, 0)
    pool.seal(A, block, 1, 10)
    pool.detach(A)  # its sealed batch is still to be sent: its segment stays
    with pytest.raises(BlockError, match="no segment"):
        pool.request(A, 2, 2, False, 0)
    pool.free(A, [block])
    assert A not in pool.held() and pool.free_blocks == BLOCKS


# -- the queue's limit (sidecar.buffer.queue.ms) ---------------------------------------------------

def seal_and_finish(pool: BufferPool, client: int, blocks: list[int]) -> None:
    """Seal each block as a batch of its own, and finish it (acknowledged: the daemon frees it)."""
    for block in blocks:
        pool.seal(client, block, 1, 100).release()
        pool.free(client, [block])


@pytest.fixture
def queued_pool() -> Iterator[BufferPool]:
    """A pool of 64 blocks, clients A and B attached, its queue limited to 100 ms of finishing (at least 4 blocks),
    first looked at (by follow_queue) at time 0."""
    pool = BufferPool(64 * BLOCK, BLOCK)
    try:
        attach(pool, A, B)
        pool.limit_queue(queue_ms=100, floor_blocks=4)
        pool.follow_queue(0)
        yield pool
    finally:
        pool.close()


def test_while_batches_flow_the_sealed_blocks_are_limited_to_the_queue_time(queued_pool: BufferPool) -> None:
    pool = queued_pool
    # 10 blocks finish in 100 ms: 0.1 a ms, so 100 ms of queue is 10 blocks.
    seal_and_finish(pool, A, pool.request(A, 0, 10, False, 0) or [])
    pool.follow_queue(100)
    assert pool.queue_limit == 10
    blocks = pool.request(A, 1, 12, False, 0) or []
    for block in blocks[:10]:
        pool.seal(A, block, 1, 100).release()
    assert pool.queue_full
    # Free blocks, but the queue is full: B's request waits, and is served as soon as one finishes.
    assert pool.request(B, 2, 1, False, 10_000) is None
    assert pool.exhausted and pool.free_blocks == 64 - 12
    assert pool.serve_waiters() == []
    pool.free(A, [blocks[0]])
    assert not pool.queue_full
    [(waiter, granted)] = pool.serve_waiters()
    assert waiter.client_id == B and len(granted) == 1


def test_the_queue_limit_follows_the_rate_and_keeps_its_floor(queued_pool: BufferPool) -> None:
    pool = queued_pool
    seal_and_finish(pool, A, pool.request(A, 0, 40, False, 0) or [])
    pool.follow_queue(100)
    assert pool.queue_limit == 40
    # Slower: one block in 100 ms. The smoothed rate comes down, and the limit with it, to the floor.
    for now in range(200, 2000, 100):
        seal_and_finish(pool, A, pool.request(A, now, 1, False, 0) or [])
        pool.follow_queue(now)
    assert pool.queue_limit == 4


def test_when_nothing_finishes_the_whole_pool_buffers(queued_pool: BufferPool) -> None:
    pool = queued_pool
    seal_and_finish(pool, A, pool.request(A, 0, 5, False, 0) or [])
    pool.follow_queue(100)
    assert pool.queue_limit == 5
    # A broker away: sealed blocks stay; after an interval with none finished, every block may be sealed.
    blocks = pool.request(A, 1, 5, False, 0) or []
    for block in blocks:
        pool.seal(A, block, 1, 100).release()
    assert pool.queue_full
    pool.follow_queue(200)
    assert pool.queue_limit == 64 and not pool.queue_full
    assert len(pool.request(A, 2, 59, False, 0) or []) == 59


def test_without_a_queue_time_the_whole_pool_may_be_sealed(pool: BufferPool) -> None:
    take_all(pool)
    for block in range(BLOCKS):
        pool.seal(A, block, 1, 100).release()
    pool.follow_queue(0)
    pool.follow_queue(1000)
    assert not pool.queue_full and pool.queue_limit == BLOCKS
