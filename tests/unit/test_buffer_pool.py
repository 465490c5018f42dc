"""BufferPool: grants, the FIFO of waiting requests, expiry, contiguous runs, seal checks, the
zero-copy view, freeing and reclaiming, the limits per client, the books kept under abuse, and the
block table in shared memory and its permissions."""

from __future__ import annotations

import logging
import os
import random
import stat
import subprocess
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from client_stub.contract import PROTOCOL_VERSION
from client_stub.contract.shared_memory import FREE, HEADER, MAGIC, OWNED, SEALED, TABLE_ENTRY, TABLE_OFFSET, Segment
from service.buffer_pool import BlockError, BufferPool, client_block_limit

BLOCK = 4096
BLOCKS = 8
A, B, C = 1, 2, 3  # client ids


@pytest.fixture
def pool() -> Iterator[BufferPool]:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    try:
        yield pool
    finally:
        if pool.buf is not None:
            pool.close()


@pytest.fixture
def segment(pool: BufferPool) -> Iterator[Segment]:
    """The pool as a client sees it."""
    segment = Segment(pool.name)
    try:
        yield segment
    finally:
        segment.close()


def entry(segment: Segment, block: int) -> tuple[int, int, int, int]:
    """(state, owner, sealed length, sealed record count) of a block, read from shared memory."""
    return TABLE_ENTRY.unpack_from(segment.buf, segment.layout.entry_offset(block))


def states(segment: Segment) -> list[tuple[int, int]]:
    return [entry(segment, b)[:2] for b in range(segment.layout.block_count)]


def take_all(pool: BufferPool, client: int = A) -> None:
    assert pool.request(client, 0, BLOCKS, True, 0) == list(range(BLOCKS))


# -- the segment ----------------------------------------------------------------------------------


def test_segment_header_and_layout(pool: BufferPool, segment: Segment) -> None:
    assert (pool.block_size, pool.block_count, pool.free_blocks) == (BLOCK, BLOCKS, BLOCKS)
    assert HEADER.unpack_from(segment.buf, 0) == (MAGIC, PROTOCOL_VERSION, BLOCK, BLOCKS, TABLE_OFFSET,
                                                  pool.layout.data_offset, os.getpid())
    assert segment.layout == pool.layout
    assert pool.layout.data_offset % 4096 == 0
    assert pool.layout.data_offset >= TABLE_OFFSET + BLOCKS * TABLE_ENTRY.size
    assert len(segment.buf) >= pool.layout.size == pool.layout.data_offset + BLOCKS * BLOCK
    assert len(segment.blocks(2, 3)) == 3 * BLOCK
    assert states(segment) == [(FREE, 0)] * BLOCKS


def test_pool_must_hold_one_block() -> None:
    with pytest.raises(ValueError, match="at least one batch.size"):
        BufferPool(BLOCK - 1, BLOCK)


def test_pool_names_are_distinct() -> None:
    first, second = BufferPool(BLOCK, BLOCK), BufferPool(BLOCK, BLOCK)
    try:
        assert first.name != second.name
        assert first.name.startswith(f"kafka-sidecar-{os.getpid()}-")
    finally:
        first.close()
        second.close()


def test_segment_refuses_shared_memory_of_something_else() -> None:
    other = shared_memory.SharedMemory(create=True, size=8192)
    try:
        with pytest.raises(ValueError, match="not a kafka-sidecar BufferPool"):
            Segment(other.name)
    finally:
        other.close()
        other.unlink()


def test_segment_refuses_another_layout_version(pool: BufferPool) -> None:
    HEADER.pack_into(pool.buf, 0, MAGIC, PROTOCOL_VERSION + 1, BLOCK, BLOCKS, TABLE_OFFSET, pool.layout.data_offset, 1)
    with pytest.raises(ValueError, match=f"protocol version {PROTOCOL_VERSION + 1}"):
        Segment(pool.name)


# -- grants ---------------------------------------------------------------------------------------


def test_request_grants_free_blocks_at_once(pool: BufferPool, segment: Segment) -> None:
    blocks = pool.request(A, 1, 3, False, 0)
    assert blocks is not None and len(set(blocks)) == 3
    assert pool.free_blocks == BLOCKS - 3
    assert not pool.exhausted
    for block in range(BLOCKS):
        assert entry(segment, block) == ((OWNED, A, 0, 0) if block in blocks else (FREE, 0, 0, 0))
    more = pool.request(B, 2, 2, False, 0)
    assert more is not None and not set(more) & set(blocks)


def test_request_of_more_blocks_than_free_grants_the_rest(pool: BufferPool) -> None:
    first = pool.request(A, 1, 6, False, 0)
    rest = pool.request(B, 2, 5, False, 0)
    assert first is not None and rest is not None
    assert len(rest) == 2 and set(first) | set(rest) == set(range(BLOCKS))
    assert pool.free_blocks == 0


@pytest.mark.parametrize("count", [0, -1, BLOCKS + 1])
def test_request_of_an_impossible_count_is_refused(pool: BufferPool, count: int) -> None:
    with pytest.raises(BlockError, match=f"cannot grant {count} blocks"):
        pool.request(A, 1, count, False, 0)
    assert not pool.waiters


def test_contiguous_request_gets_a_run(pool: BufferPool) -> None:
    assert pool.request(A, 1, 1, True, 0) == [0]
    assert pool.request(A, 2, 3, True, 0) == [1, 2, 3]
    assert pool.request(B, 3, BLOCKS - 4, True, 0) == [4, 5, 6, 7]


def test_contiguous_run_found_after_fragmentation(pool: BufferPool, segment: Segment) -> None:
    take_all(pool)
    pool.free([1, 3, 4, 6])
    assert pool.request(B, 1, 2, True, 0) == [3, 4]
    # Two blocks are free (1 and 6) but not side by side: the run must wait.
    assert pool.request(B, 2, 2, True, 0) is None
    assert pool.exhausted and pool.free_blocks == 2
    pool.free([7])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(2, [6, 7])]
    assert [entry(segment, b)[:2] for b in (1, 6, 7)] == [(FREE, 0), (OWNED, B), (OWNED, B)]
    # A run of the whole pool needs every block.
    pool.free(range(BLOCKS))
    assert pool.request(C, 3, BLOCKS, True, 0) == list(range(BLOCKS))


# -- waiters --------------------------------------------------------------------------------------


def test_waiters_are_served_in_fifo_order(pool: BufferPool) -> None:
    take_all(pool)
    assert pool.request(B, 10, 3, True, 5000) is None   # a large record: a run of 3
    assert pool.request(C, 20, 1, False, 5000) is None  # behind it, a single block
    assert [(w.client_id, w.request_id, w.count, w.contiguous, w.deadline_ms) for w in pool.waiters] == [
        (B, 10, 3, True, 5000), (C, 20, 1, False, 5000)]
    assert pool.exhausted

    pool.free([0])
    # One block is free, enough for C, but C is behind B: nobody is served.
    assert pool.serve_waiters() == []
    # Nor does a new request jump the queue while others wait.
    assert pool.request(A, 30, 1, False, 5000) is None
    assert [w.request_id for w in pool.waiters] == [10, 20, 30]

    pool.free([1, 2, 7])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(10, [0, 1, 2]), (20, [7])]
    assert [w.request_id for w in pool.waiters] == [30]
    pool.free([5])
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(30, [5])]
    assert not pool.exhausted


def test_a_large_request_at_the_head_holds_back_single_ones(pool: BufferPool) -> None:
    take_all(pool)
    assert pool.request(B, 1, 4, True, 5000) is None
    assert pool.request(C, 2, 1, False, 5000) is None
    for block in (0, 2, 5):  # three free blocks, no run of four
        pool.free([block])
        assert pool.serve_waiters() == []
    pool.free([1, 3])
    served = pool.serve_waiters()
    assert [(w.request_id, blocks) for w, blocks in served] == [(1, [0, 1, 2, 3]), (2, [5])]


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
    pool.free([5])
    assert pool.serve_waiters() == []
    pool.expire_waiters(100)
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(2, [5])]


def test_forget_waiters_of_one_client(pool: BufferPool) -> None:
    take_all(pool)
    pool.request(B, 1, 1, False, 100)
    pool.request(C, 2, 1, False, 100)
    pool.request(B, 3, 2, True, 100)
    pool.forget_waiters(B)
    assert [w.request_id for w in pool.waiters] == [2]


# -- seal -----------------------------------------------------------------------------------------


def test_seal_returns_a_zero_copy_view_of_the_shared_memory(pool: BufferPool, segment: Segment) -> None:
    run = pool.request(A, 1, 2, True, 0)
    assert run is not None
    first = run[0]
    client_view = segment.blocks(first, 2)
    payload = bytes(range(256)) * 20  # 5120 bytes: across the block boundary
    client_view[:len(payload)] = payload
    view = pool.seal(A, first, 2, len(payload), 7)
    try:
        assert isinstance(view, memoryview) and view.nbytes == len(payload)
        assert bytes(view) == payload
        # The same memory, not a copy: what the client writes now shows in the view.
        client_view[0:4] = b"ABCD"
        client_view[BLOCK:BLOCK + 2] = b"YZ"
        assert bytes(view[0:4]) == b"ABCD" and bytes(view[BLOCK:BLOCK + 2]) == b"YZ"
        # The table: the first block carries the batch's length and record count.
        assert entry(segment, first) == (SEALED, A, len(payload), 7)
        assert entry(segment, first + 1) == (SEALED, A, 0, 0)
    finally:
        view.release()
        client_view.release()


def test_seal_of_another_clients_block_is_refused(pool: BufferPool, segment: Segment) -> None:
    blocks = pool.request(A, 1, 2, True, 0)
    assert blocks is not None
    with pytest.raises(BlockError, match="not granted to this client"):
        pool.seal(B, blocks[0], 1, 10, 1)
    # Half of a run that is the client's and half that is not.
    mine = pool.request(B, 2, 1, False, 0)
    assert mine == [2]
    with pytest.raises(BlockError, match="block 1 is not granted"):
        pool.seal(B, 1, 2, 10, 1)
    assert [entry(segment, b)[:2] for b in (0, 1, 2)] == [(OWNED, A), (OWNED, A), (OWNED, B)]


def test_seal_of_a_free_block_is_refused(pool: BufferPool) -> None:
    with pytest.raises(BlockError, match="not granted"):
        pool.seal(A, 0, 1, 10, 1)


def test_seal_twice_is_refused(pool: BufferPool, segment: Segment) -> None:
    pool.request(A, 1, 1, True, 0)
    view = pool.seal(A, 0, 1, 100, 1)
    view.release()
    with pytest.raises(BlockError, match="block 0 is not granted"):
        pool.seal(A, 0, 1, 100, 1)
    assert entry(segment, 0) == (SEALED, A, 100, 1)


@pytest.mark.parametrize(("first", "count"), [(-1, 1), (BLOCKS, 1), (BLOCKS - 1, 2), (0, 0), (0, -1),
                                              (0, BLOCKS + 1), (2**40, 1)])
def test_seal_outside_the_pool_is_refused(pool: BufferPool, first: int, count: int) -> None:
    take_all(pool)
    with pytest.raises(BlockError, match="outside the pool"):
        pool.seal(A, first, count, 1, 1)


@pytest.mark.parametrize("length", [0, -1, 2 * BLOCK + 1])
def test_seal_of_a_length_that_does_not_fit_is_refused(pool: BufferPool, segment: Segment, length: int) -> None:
    pool.request(A, 1, 2, True, 0)
    with pytest.raises(BlockError, match=f"length {length} does not fit 2 block"):
        pool.seal(A, 0, 2, length, 1)
    assert [entry(segment, b)[:2] for b in (0, 1)] == [(OWNED, A), (OWNED, A)]  # still the client's


def test_seal_of_exactly_full_blocks(pool: BufferPool) -> None:
    pool.request(A, 1, 3, True, 0)
    view = pool.seal(A, 0, 3, 3 * BLOCK, 1)
    assert view.nbytes == 3 * BLOCK
    view.release()


# -- giving back ----------------------------------------------------------------------------------


def test_give_back_frees_unused_granted_blocks(pool: BufferPool, segment: Segment) -> None:
    blocks = pool.request(A, 1, 3, False, 0)
    assert blocks is not None
    pool.give_back(A, blocks[:2])
    assert pool.free_blocks == BLOCKS - 1
    assert [entry(segment, b)[:2] for b in blocks] == [(FREE, 0), (FREE, 0), (OWNED, A)]


def test_give_back_checks_every_block_before_freeing_any(pool: BufferPool, segment: Segment) -> None:
    mine = pool.request(A, 1, 1, False, 0)
    theirs = pool.request(B, 2, 1, False, 0)
    assert mine is not None and theirs is not None
    with pytest.raises(BlockError):
        pool.give_back(A, mine + theirs)
    assert entry(segment, mine[0])[:2] == (OWNED, A) and entry(segment, theirs[0])[:2] == (OWNED, B)
    with pytest.raises(BlockError, match="outside the pool"):
        pool.give_back(A, [BLOCKS])
    assert pool.free_blocks == BLOCKS - 2


def test_give_back_of_a_sealed_block_is_refused(pool: BufferPool, segment: Segment) -> None:
    pool.request(A, 1, 1, True, 0)
    pool.seal(A, 0, 1, 10, 1).release()
    with pytest.raises(BlockError):
        pool.give_back(A, [0])
    assert entry(segment, 0) == (SEALED, A, 10, 1)


def test_free_returns_sealed_blocks_to_the_pool(pool: BufferPool, segment: Segment) -> None:
    take_all(pool)
    pool.seal(A, 2, 2, 5000, 3).release()
    pool.free(range(2, 4))
    assert pool.free_blocks == 2
    assert entry(segment, 2) == entry(segment, 3) == (FREE, 0, 0, 0)
    # Freed blocks are granted again.
    assert sorted(pool.request(B, 1, 2, False, 0) or []) == [2, 3]
    assert entry(segment, 2) == (OWNED, B, 0, 0)


def test_free_unsealed_frees_only_the_clients_unsealed_blocks(pool: BufferPool, segment: Segment) -> None:
    assert pool.request(A, 1, 3, True, 0) == [0, 1, 2]
    assert pool.request(B, 2, 1, True, 0) == [3]
    assert pool.request(A, 3, 2, True, 0) == [4, 5]
    pool.seal(A, 4, 1, 10, 1).release()
    assert pool.free_unsealed(A, 1, 4) == 2  # 1 and 2; 3 is B's, 4 sealed
    assert states(segment)[:6] == [(OWNED, A), (FREE, 0), (FREE, 0), (OWNED, B), (SEALED, A), (OWNED, A)]
    assert pool.free_unsealed(A, -3, 2**40) == 2  # clamped to the pool: 0 and 5
    assert pool.free_unsealed(A, 0, -1) == 0


def test_reclaim_frees_unsealed_blocks_and_keeps_sealed_ones(pool: BufferPool, segment: Segment) -> None:
    assert pool.request(A, 1, 3, True, 0) == [0, 1, 2]
    assert pool.request(B, 2, 2, True, 0) == [3, 4]
    pool.seal(A, 1, 1, 100, 2).release()
    assert pool.request(A, 3, 3, True, 0) == [5, 6, 7]
    assert pool.request(A, 4, 2, False, 1000) is None  # waiting
    assert pool.request(B, 5, 1, False, 1000) is None  # waiting
    assert pool.reclaim(A) == 5
    assert states(segment) == [(FREE, 0), (SEALED, A), (FREE, 0), (OWNED, B), (OWNED, B),
                               (FREE, 0), (FREE, 0), (FREE, 0)]
    assert entry(segment, 1) == (SEALED, A, 100, 2)
    assert [(w.client_id, w.request_id) for w in pool.waiters] == [(B, 5)]
    assert pool.reclaim(A) == 0
    # The sealed block goes back when its batch is finished.
    pool.free([1])
    assert pool.free_blocks == 6


def test_give_back_of_a_block_named_twice_is_refused(pool: BufferPool, segment: Segment) -> None:
    blocks = pool.request(A, 1, 2, False, 0)
    assert blocks is not None
    with pytest.raises(BlockError, match="named more than once"):
        pool.give_back(A, [blocks[0], blocks[1], blocks[0]])
    assert pool.free_blocks == BLOCKS - 2
    assert [entry(segment, b)[:2] for b in blocks] == [(OWNED, A), (OWNED, A)]


def test_free_counts_only_blocks_that_were_not_free(pool: BufferPool, segment: Segment,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    take_all(pool)
    with caplog.at_level(logging.ERROR, logger="service.buffer_pool"):
        assert pool.free([3, 3, 5]) == 2
        assert pool.free([3]) == 0
    assert "block 3 is freed but was free already" in caplog.text
    assert pool.free_blocks == 2
    # Each free block is granted once, however often it was named.
    assert sorted(pool.request(B, 1, BLOCKS, False, 0) or []) == [3, 5]
    assert pool.free_blocks == 0
    assert pool.request(C, 2, 1, False, 100) is None
    assert [entry(segment, b)[:2] for b in (3, 5)] == [(OWNED, B), (OWNED, B)]


@pytest.mark.parametrize("seed", range(12))
def test_random_use_and_abuse_keeps_the_books(seed: int) -> None:
    """Grants, seals, deliveries, reclaims and expiries mixed with abuse (blocks named twice, blocks
    of others, sealed or free blocks given back or sealed): the pool's books stay exact."""
    rng = random.Random(seed)
    limit = 5
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_client=limit)
    segment = Segment(pool.name)
    model: dict[int, tuple[int, int]] = {}  # block -> (state, owner) of the blocks not free
    sealed: list[range] = []
    now = 0
    try:
        for step in range(400):
            client = rng.choice((A, B, C))
            op = rng.randrange(6)
            grants: list[tuple[int, list[int]]] = []
            if op == 0:
                count, contiguous = rng.randrange(1, BLOCKS + 1), rng.random() < 0.4
                may_refuse = (contiguous and count > limit) or any(
                    w.client_id == client and w.contiguous == contiguous for w in pool.waiters)
                try:
                    blocks = pool.request(client, step, count, contiguous, now + rng.randrange(50))
                except BlockError:
                    assert may_refuse
                else:
                    assert not may_refuse
                    if blocks is not None:
                        grants.append((client, blocks))
            elif op == 1:
                grants += [(w.client_id, blocks) for w, blocks in pool.serve_waiters()]
            elif op == 2:
                named = [rng.randrange(BLOCKS) for _ in range(rng.randrange(1, 4))]
                legit = len(set(named)) == len(named) and all(model.get(b) == (OWNED, client) for b in named)
                try:
                    pool.give_back(client, named)
                except BlockError:
                    assert not legit
                else:
                    assert legit
                    for block in named:
                        del model[block]
            elif op == 3:
                run = range(rng.randrange(BLOCKS), rng.randrange(BLOCKS) + 1)
                legit = len(run) > 0 and all(model.get(b) == (OWNED, client) for b in run)
                try:
                    pool.seal(client, run.start, len(run), 1, 1).release()
                except BlockError:
                    assert not legit
                else:
                    assert legit
                    model.update((b, (SEALED, client)) for b in run)
                    sealed.append(run)
            elif op == 4 and sealed:  # a batch is delivered
                run = sealed.pop(rng.randrange(len(sealed)))
                assert pool.free(run) == len(run)
                for block in run:
                    del model[block]
            elif op == 5:
                mine = [b for b, held in model.items() if held == (OWNED, client)]
                assert pool.reclaim(client) == len(mine)
                for block in mine:
                    del model[block]
            else:
                now += 20
                pool.expire_waiters(now)
            for owner, blocks in grants:
                assert len(set(blocks)) == len(blocks), f"a block granted twice: {blocks}"
                for block in blocks:
                    assert block not in model, f"block {block} granted while {model[block]}"
                    model[block] = (OWNED, owner)
            assert pool.free_blocks == BLOCKS - len(model)
            assert states(segment) == [model.get(b, (FREE, 0)) for b in range(BLOCKS)]
            for owner in (A, B, C):
                assert pool.held_by(owner) == sum(held[1] == owner for held in model.values()) <= limit
    finally:
        segment.close()
        pool.close()


# -- limits per client ----------------------------------------------------------------------------


@pytest.fixture
def capped() -> Iterator[BufferPool]:
    """A pool of which a client may hold at most 5 blocks."""
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_client=5)
    try:
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
    assert capped.request(B, 3, 2, True, 1000) == [5, 6]
    assert capped.serve_waiters() == []
    # Sealed blocks are still A's until their batch is finished.
    capped.seal(A, 0, 2, 100, 1).release()
    assert capped.held_by(A) == 5 and capped.serve_waiters() == []
    capped.free(range(0, 2))
    assert capped.held_by(A) == 3
    assert [(w.request_id, blocks) for w, blocks in capped.serve_waiters()] == [(2, [0, 1])]
    assert capped.held_by(A) == 5 and not capped.waiters


def test_a_client_at_its_limit_waits_behind_nobody(capped: BufferPool) -> None:
    assert capped.request(A, 1, 5, True, 0) == [0, 1, 2, 3, 4]
    assert capped.request(A, 2, 1, False, 1000) is None  # at its limit
    assert capped.request(B, 3, 3, False, 1000) == [5, 6, 7]
    assert capped.request(B, 4, 1, True, 1000) is None  # the pool is empty: B waits for the pool
    assert capped.exhausted and capped.clients_at_limit() == {A}
    capped.give_back(A, [2])
    # A is below its limit again and first in line.
    assert [(w.request_id, blocks) for w, blocks in capped.serve_waiters()] == [(2, [2])]
    assert capped.clients_at_limit() == set() and capped.exhausted


def test_a_run_larger_than_the_limit_is_refused(capped: BufferPool) -> None:
    with pytest.raises(BlockError, match="a run of 6 blocks: a client may hold 5 of the pool's 8"):
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
    pool.free(range(BLOCKS))
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
        BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_client=0)


def test_table_mirrors_every_state_change(pool: BufferPool, segment: Segment) -> None:
    blocks = pool.request(A, 1, 4, True, 0)
    assert blocks == [0, 1, 2, 3]
    pool.request(B, 2, 2, True, 0)
    pool.seal(A, 0, 2, 5000, 9).release()
    pool.give_back(A, [3])
    assert states(segment) == [(SEALED, A), (SEALED, A), (OWNED, A), (FREE, 0), (OWNED, B), (OWNED, B),
                               (FREE, 0), (FREE, 0)]
    assert entry(segment, 0) == (SEALED, A, 5000, 9)
    pool.free([0, 1])
    pool.reclaim(A)
    pool.reclaim(B)
    assert states(segment) == [(FREE, 0)] * BLOCKS
    assert pool.free_blocks == BLOCKS


# -- permissions ----------------------------------------------------------------------------------


def _pool_under_umask(umask: int, **options: int) -> BufferPool:
    previous = os.umask(umask)
    try:
        return BufferPool(BLOCK, BLOCK, **options)
    finally:
        os.umask(previous)


@pytest.mark.parametrize("umask", [0o007, 0o002, 0o022, 0o077, 0o000])
@pytest.mark.parametrize("mode", [0o660, 0o600, 0o666])
def test_segment_has_the_configured_mode_whatever_the_umask(umask: int, mode: int) -> None:
    pool = _pool_under_umask(umask, mode=mode)
    try:
        assert stat.S_IMODE(os.stat(f"/dev/shm/{pool.name}").st_mode) == mode
    finally:
        pool.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the segment to another group")
def test_segment_belongs_to_the_configured_group() -> None:
    pool = _pool_under_umask(0o022, group=65534)
    try:
        assert os.stat(f"/dev/shm/{pool.name}").st_gid == 65534
    finally:
        pool.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_of_the_daemons_group_can_map_the_segment() -> None:
    """The systemd unit's case: the daemon's user, UMask=0007, and an application of another user."""
    pool = _pool_under_umask(0o007)
    path = f"/dev/shm/{pool.name}"
    group = os.stat(path).st_gid

    def open_read_write(gid: int) -> subprocess.CompletedProcess[str]:
        # What shm_open(O_RDWR) does on Linux, as user nobody.
        return subprocess.run(["/bin/sh", "-c", f"exec 3<>{path}"], user=65534, group=gid, extra_groups=[],
                              capture_output=True, text=True, timeout=30)

    try:
        assert open_read_write(group).returncode == 0
        denied = open_read_write(65534)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
    finally:
        pool.close()


# -- close ----------------------------------------------------------------------------------------


def test_close_unlinks_the_segment() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    segment = Segment(pool.name)
    segment.close()
    pool.close()
    with pytest.raises(FileNotFoundError):
        Segment(pool.name)


def test_close_with_a_batch_view_still_alive_unlinks_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    pool.request(A, 1, 1, True, 0)
    view = pool.seal(A, 0, 1, 10, 1)
    with caplog.at_level(logging.WARNING, logger="service.buffer_pool"):
        pool.close()
    assert "still in use" in caplog.text
    with pytest.raises(FileNotFoundError):
        Segment(pool.name)
    # The mapping stays valid for whoever still holds a view.
    assert bytes(view) == bytes(10)
    view.release()
