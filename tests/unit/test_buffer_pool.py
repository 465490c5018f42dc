"""BufferPool: grants, the FIFO of waiting requests, expiry, contiguous runs, seal checks, the
zero-copy view, freeing and detaching, blocks taken back after a restart, the limits per process, and
the books kept under abuse."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator

import pytest

from client_stub.contract.batch_slots import ControlArea, pack_published
from client_stub.contract.shared_memory import Segment, create_segment
from service.buffer_pool import FREE, OWNED, SEALED, BlockError, BufferPool, client_block_limit
from tests.support.buffer_pool import BLOCK, BLOCKS, STRANGER, A, B, C, attach, states, take_all

pytest_plugins = ("tests.support.buffer_pool_fixtures",)


def test_pool_must_hold_one_block() -> None:
    with pytest.raises(ValueError, match="at least one batch.size"):
        BufferPool(BLOCK - 1, BLOCK)


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


def test_blocks_are_handed_back_unasked_within_limits_and_never_past_a_waiter() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=5)
    attach(pool, A, B, C)
    assert pool.request(A, 1, 2, False, 0) == [0, 1]
    pool.free(A, [0])
    # Its freed block first (still in the cache), then others, within its process's limit.
    assert pool.hand_back(A, 2) == [0, 2]
    assert pool.hand_back(A, 3) == [3, 4]
    assert pool.held() == {A: 5, B: 0, C: 0} and pool.hand_back(A, 1) == []
    assert pool.hand_back(B, 0) == [] and pool.hand_back(STRANGER, 1) == []
    # A request waiting for its own process's blocks holds back nobody else; one waiting for the pool does:
    # what comes back is for it.
    assert pool.request(A, 2, 1, False, 5000) is None
    assert not pool.exhausted and pool.hand_back(B, 1) == [0]
    assert pool.request(B, 3, 4, True, 5000) is None
    pool.free(A, [1])
    assert pool.exhausted and pool.hand_back(B, 1) == [] and pool.hand_back(C, 1) == []
    assert pool.free_blocks == 3


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


def test_a_run_of_blocks_is_freed_whole_and_one_with_a_free_block_block_by_block(
        pool: BufferPool, caplog: pytest.LogCaptureFixture) -> None:
    take_all(pool)
    pool.seal(A, 2, 3, 100).release()
    assert pool.free(A, range(2, 5)) == 3  # a batch's run, all sealed
    with caplog.at_level(logging.ERROR, logger="service.buffer_pool"):
        assert pool.free(A, range(4, 7)) == 2  # 4 is free already: the others are freed
    assert f"block 4 of client {A} is freed but was free already" in caplog.text
    assert states(pool, A)[1:8] == [OWNED, FREE, FREE, FREE, FREE, FREE, OWNED]
    assert pool.free_blocks == 5 and pool.held_by(A) == BLOCKS - 5
    assert sorted(pool.request(A, 1, BLOCKS, False, 0) or []) == [2, 3, 4, 5, 6]


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


# -- where the open batches are -------------------------------------------------------------------


def test_owned_blocks_are_those_granted_and_not_sealed(pool: BufferPool) -> None:
    assert pool.owned_blocks(A) == [] and pool.owned_blocks(STRANGER) == []
    assert pool.request(A, 1, 5, True, 0) == [0, 1, 2, 3, 4]
    assert pool.request(B, 2, 1, True, 0) == [0]
    pool.seal(A, 1, 2, 100).release()
    pool.give_back(A, [4])
    assert pool.owned_blocks(A) == [0, 3] and pool.owned_blocks(B) == [0]
    pool.detach(A)
    assert pool.owned_blocks(A) == []


def test_the_control_area_is_the_clients_segments(pool: BufferPool, segments: dict[int, Segment]) -> None:
    control = pool.control(A)
    assert control is not None and control.block_count == BLOCKS
    # What the client writes in its segment's control area is what the daemon reads there, and no other client's.
    client_side = ControlArea(segments[A].control, BLOCKS)
    try:
        client_side.open(2, batch_id=7, topic_index=0, partition=0, block_count=1, base_timestamp=1, opened_ns=1)
        client_side.publish(2, 3, 300, 1)
        assert control.snapshot(2).batch_id == 7 and control.published(2) == pack_published(3, 300)
        other = pool.control(B)
        assert other is not None and other.published(2) == 0
    finally:
        client_side.release()
    assert pool.control(STRANGER) is None


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
    assert pool._memory.get(A) is None and pool.held() == {B: 2, C: 0}
    assert [(w.request_id, blocks) for w, blocks in pool.serve_waiters()] == [(5, [2])]


def test_a_client_whose_session_ended_gets_no_more_blocks(pool: BufferPool) -> None:
    (block,) = pool.request(A, 1, 1, True, 0)
    pool.seal(A, block, 1, 10)
    pool.detach(A)  # its sealed batch is still to be sent: its segment stays
    with pytest.raises(BlockError, match="no segment"):
        pool.request(A, 2, 2, False, 0)
    pool.free(A, [block])
    assert A not in pool.held() and pool.free_blocks == BLOCKS


# -- blocks taken back ----------------------------------------------------------------------------


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


# -- limits per process ---------------------------------------------------------------------------


def test_the_clients_of_one_process_share_its_limit() -> None:
    pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=4)
    try:
        for client, process in ((A, 100), (B, 100), (C, 200)):
            os.close(pool.attach(client, process))
        assert len(pool.request(A, 1, 3, False, 0) or []) == 3
        assert len(pool.request(B, 1, 3, False, 0) or []) == 1  # its process's share is taken
        # B waits for its process's blocks, without holding back another process: A, of its process, holds
        # them, and is asked to seal with B.
        assert pool.request(B, 2, 1, False, 1000) is None and pool.clients_at_limit() == {A, B}
        assert len(pool.request(C, 1, 4, False, 0) or []) == 4
        assert (pool.held_by_process(100), pool.held_by_process(200)) == (4, 4)
        pool.give_back(A, [pool._memory[A].state.find(bytes([OWNED]))])
        assert [(w.client_id, len(blocks)) for w, blocks in pool.serve_waiters()] == [(B, 1)]
        # A process's share goes with its last segment.
        for client in (A, B):
            pool.detach(client)
        assert pool.held_by_process(100) == 0 and 100 not in pool._process_held
    finally:
        pool.close()


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


# -- the books ------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("seed", range(12))
def test_random_use_and_abuse_keeps_the_books(seed: int) -> None:
    """Grants, seals (of claims too, some undone), deliveries, detaches and expiries mixed with abuse (blocks
    named twice, blocks of others, sealed or free blocks given back or sealed, clients without a segment): the
    pool's books stay exact, a client's segment goes once it is detached and its last batch is sent."""
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
                if rng.random() < 0.5:  # a batch the daemon claimed, and its client's notice
                    view = pool.seal_claimed(anyone, (run.start, 1, 1, -1, -1, step, 0, 0, len(run), 0))
                    assert (view is not None) is legit
                    if view is not None:
                        view.release()
                else:
                    try:
                        pool.seal(anyone, run.start, len(run), 1).release()
                    except BlockError:
                        assert not legit
                    else:
                        assert legit
                if legit and rng.random() < 0.2:  # refused once sealed: its client's unsealed again
                    pool.unseal(anyone, run.start, len(run))
                elif legit:
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
            # Each client is a process of its own here; a process that holds nothing is not kept.
            assert pool._process_held == {-owner: count for owner, count in held.items() if count}
            # The queue limit's count of the blocks sealed and not finished follows every change.
            assert pool._queue._sealed == pool.block_states()[1] == sum(state == SEALED for state in model.values())
            for owner in kept:
                assert states(pool, owner) == [model.get((owner, b), FREE) for b in range(BLOCKS)]
            assert {w.client_id for w in pool.waiters} <= set(live)
    finally:
        pool.close()
