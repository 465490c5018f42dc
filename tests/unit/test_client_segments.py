"""The clients' segments behind the BufferPool: each client's own sealed memfd, mapped from its session's
start until its last batch is sent, kept for its client to take back, taken back after a restart with the
blocks it held, unmapped at close, and the pages of the blocks free longest given back."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from client_stub.contract.batch_slots import control_size
from client_stub.contract.shared_memory import SEALS, Layout, Segment, create_segment
from service.buffer_pool import FREE, OWNED, SEALED, BlockError, BufferPool
from service.client_error import ClientError
from tests.support.buffer_pool import BLOCK, BLOCKS, A, B, C, attach, map_segment, mapped, states

pytest_plugins = ("tests.support.buffer_pool_fixtures",)

SIZE = Layout(BLOCK, BLOCKS).size  # a segment's bytes


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
    assert pool.layout.block_offset(3) == 3 * BLOCK
    # After the blocks, on a cache line of its own, the control area: a header, and a slot per block.
    assert pool.layout.control_offset == BLOCKS * BLOCK
    assert pool.layout.size == BLOCKS * BLOCK + control_size(BLOCKS) == BLOCKS * BLOCK + 64 + BLOCKS * 64
    segment = segments[A]
    assert len(segment.buf) == pool.layout.size and len(segment.control) == control_size(BLOCKS)
    assert len(segment.blocks(2, 3)) == 3 * BLOCK
    assert states(pool, A) == [FREE] * BLOCKS
    assert pool.held() == {A: 0, B: 0, C: 0}


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


# -- detach ---------------------------------------------------------------------------------------


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


# -- kept, and taken back -------------------------------------------------------------------------


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
        with pytest.raises(ClientError, match="not the one of the session"):
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


def _read_only_memfd(tmp_path: Path, size: int) -> int:
    """A segment as the pool makes it, opened again for reading only."""
    fd = sealed_memfd(size)
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)


_NOT_A_MEMFD = r"not a sealable memory file \(memfd\)|seals are"
_MISSEALED = "seals are 0x[0-9a-f]+, not 0x7: sealed against shrinking and growing, and against further seals, only"
F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in Python 3.11's fcntl


@pytest.mark.parametrize(("make", "error", "match"), [
    (_regular_file, ClientError, _NOT_A_MEMFD),
    (_pipe, ClientError, r"not a sealable memory file \(memfd\)"),
    (_dev_shm_file, ClientError, _MISSEALED),
    (_memfd_without_sealing, ClientError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, 0), ClientError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, fcntl.F_SEAL_SHRINK), ClientError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, fcntl.F_SEAL_GROW), ClientError, _MISSEALED),
    (lambda _, size: sealed_memfd(size - BLOCK), ClientError, f"has {SIZE - BLOCK} bytes"),
    (lambda _, size: sealed_memfd(size + 1), ClientError, f"has {SIZE + 1} bytes, the pool's layout"),
    (lambda _, size: sealed_memfd(0), ClientError, f"has 0 bytes, the pool's layout {SIZE}"),
    # The blocks, without the control area.
    (lambda _, size: sealed_memfd(BLOCKS * BLOCK), ClientError, f"has {BLOCKS * BLOCK} bytes, the pool's layout"),
    # Not sealed against further seals: its holder could seal it against writes later.
    (lambda _, size: sealed_memfd(size, SEALS), ClientError, _MISSEALED),
    # Sealed against writes: the daemon could neither write into it nor give its pages back.
    (lambda _, size: sealed_memfd(size, SEALS | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL), ClientError, _MISSEALED),
    (lambda _, size: sealed_memfd(size, SEALS | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL), ClientError, _MISSEALED),
    # Its file opened read-only: the daemon could not write into it, nor give its pages back.
    (_read_only_memfd, ClientError, "cannot be mapped read-write"),
], ids=["regular file", "pipe", "file in /dev/shm", "memfd that cannot be sealed", "unsealed memfd",
        "memfd sealed against shrinking only", "memfd sealed against growing only", "smaller memfd",
        "larger memfd", "empty memfd", "memfd without a control area", "memfd that may be sealed later",
        "memfd sealed against writes", "memfd sealed against future writes", "memfd opened read-only"])
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
    with caplog.at_level(logging.DEBUG, logger="service.client_segments"):
        pool.close()
    assert f"segment of client {A} still in use" in caplog.text
    assert pool.held() == {}
    # The mapping stays valid for whoever still holds a view, and goes with the view.
    assert bytes(view) == b"0123456789"
    view.release()
    gc.collect()
    assert not mapped(inode)


# -- what is resident -----------------------------------------------------------------------------


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


def test_pages_given_back_are_the_blocks_own_whatever_the_block_size() -> None:
    # Blocks of a page and a half: a block's first or last page may be its neighbour's too, and the last block's
    # the control area's. Only the pages wholly a free block's are given back: its neighbours, in use, and the
    # control area keep what they hold.
    size = 3 * os.sysconf("SC_PAGE_SIZE") // 2
    pool = BufferPool(5 * size, size)
    others = (B, C, 4, 5)
    mapped = {client: map_segment(pool.attach(client), pool.layout) for client in (A, *others)}
    try:
        assert pool.request(A, 1, 5, True, 0) == [0, 1, 2, 3, 4]
        mapped[A].blocks(0, 5)[:] = b"a" * 5 * size
        mapped[A].control[:64] = b"h" * 64  # its header
        pool.free(A, [0, 4])  # 1..3 still hold its open batches
        # Others churn through the pool, past twice its blocks resident: A's 0 and 4, free longest, go back.
        for client in others:
            blocks = pool.request(client, 1, 2, False, 0)
            assert blocks is not None
            for block in blocks:
                mapped[client].blocks(block)[:] = b"o" * size
            pool.free(client, blocks)
        assert bytes(mapped[A].blocks(0)) != b"a" * size and bytes(mapped[A].blocks(4)) != b"a" * size
        assert bytes(mapped[A].blocks(1, 3)) == b"a" * 3 * size
        assert bytes(mapped[A].control[:64]) == b"h" * 64
    finally:
        for segment in mapped.values():
            segment.close()
        pool.close()
