"""The queue's limit (sidecar.buffer.queue.ms) behind the BufferPool: while batches flow, the blocks
sealed and not finished are limited to what finishes in the queue time, following the rate at which they
finish, never below the floor; when nothing finishes, or without a queue time, the whole pool buffers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.buffer_pool import BufferPool
from tests.support.buffer_pool import BLOCK, BLOCKS, A, B, attach, take_all

pytest_plugins = ("tests.support.buffer_pool_fixtures",)


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
