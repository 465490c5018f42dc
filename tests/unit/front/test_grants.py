"""Block grants: requests served now or waiting in the pool's FIFO, their timeouts, releases, and SEAL_NOW while
the pool is exhausted (what the clients published is claimed then: see test_open_batches)."""

from __future__ import annotations

from typing import Any

import pytest

from client_stub.contract import ipc
from service.buffer_pool import FREE, OWNED
from tests.support.front import (
    BLOCKS,
    Env,
)

# -- blocks ---------------------------------------------------------------------------------------


def test_blocks_are_granted(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    blocks = client.blocks(3)
    assert len(set(blocks)) == 3
    assert all(env.state(client_id, b) == OWNED for b in blocks)
    run = client.blocks(2, contiguous=True)
    assert run == [run[0], run[0] + 1] and not set(run) & set(blocks)
    assert env.pool.free_blocks == BLOCKS - 5 and env.pool.held_by(client_id) == 5


@pytest.mark.parametrize(("message", "answered"), [
    ([ipc.Blocks.TYPE, 1, 0, False, 100], True), ([ipc.Blocks.TYPE, 1, BLOCKS + 1, False, 100], True),
    ([ipc.Blocks.TYPE, 1, "2", False, 100], True), ([ipc.Blocks.TYPE, -1, 1, False, 100], False),
    ([ipc.Blocks.TYPE, 1, 1, False, -5], True), ([ipc.Blocks.TYPE, 1, 1, False], False),
    ([ipc.Blocks.TYPE, 1, True, False, 100], True),
], ids=["zero", "too-many", "text", "negative-id", "negative-timeout", "missing-field", "bool-count"])
def test_bad_block_requests_are_refused(env: Env, message: list[Any], answered: bool) -> None:
    client = env.client()
    client.hello()
    client.send(*message)
    env.pump()
    text = client.error()
    if answered:
        # The request itself fails too, so that the client does not wait for it until its timeout.
        assert client.recv() == [ipc.GrantFailed.TYPE, 1, f"the daemon refused the request: {text}"]
    assert client.quiet()
    assert env.pool.free_blocks == BLOCKS and not env.pool.waiters


def test_one_waiting_request_of_each_kind_per_client(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 1, False, 1000)
    b.send(ipc.Blocks.TYPE, 2, 1, False, 1000)
    b.send(ipc.Blocks.TYPE, 3, 2, True, 1000)
    b.send(ipc.Blocks.TYPE, 4, 2, True, 1000)
    env.pump()
    assert "request 1 for spare blocks is still waiting" in b.error()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 2]
    assert "request 3 for a run of blocks is still waiting" in b.error()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 4]
    assert [w.request_id for w in env.pool.waiters] == [1, 3]
    a.send(ipc.Release.TYPE, held)
    env.pump()
    env.front.serve_due()
    assert b.recv()[:2] == [ipc.Grant.TYPE, 1]
    assert b.recv()[:2] == [ipc.Grant.TYPE, 3]


def test_a_client_at_its_limit_is_asked_for_its_spare_blocks_and_the_others_are_served() -> None:
    with Env(max_blocks_per_process=4) as env:
        a, b = env.client(), env.client()
        a_id = a.hello()
        b.hello()
        held = a.blocks(BLOCKS)
        assert len(held) == 4 and all(env.state(a_id, x) == OWNED for x in held)
        a.send(ipc.Blocks.TYPE, 9, 1, False, 1000)
        env.pump()
        env.front.serve_due()
        # A waits for its own blocks: only A hears SEAL_NOW (its batches claimed), and B is served at once.
        assert a.recv() == [ipc.SealNow.TYPE]
        assert b.quiet()
        assert len(b.blocks(BLOCKS)) == 4
        a.send(ipc.Release.TYPE, held[:1])
        env.pump()
        env.front.serve_due()
        assert a.recv() == [ipc.Grant.TYPE, 9, held[:1]]
        assert env.pool.held_by(a_id) == 4


def test_a_run_larger_than_a_client_may_hold_fails_at_once() -> None:
    with Env(max_blocks_per_process=4) as env:
        client = env.client()
        client.hello()
        client.send(ipc.Blocks.TYPE, 3, 5, True, 60_000)
        env.pump()
        assert "a process may hold 4 of the pool's 8" in client.error()
        assert client.recv()[:2] == [ipc.GrantFailed.TYPE, 3]
        assert not env.pool.waiters


def test_release_gives_blocks_back(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id = a.hello()
    b_id = b.hello()
    mine = a.blocks(3)
    theirs = b.blocks(1)
    a.send(ipc.Release.TYPE, mine[:2])
    env.pump()
    assert a.quiet()
    assert [env.state(a_id, x) for x in mine] == [FREE, FREE, OWNED]
    # A block it does not hold (b holds a block of that number, in its own segment): refused, nothing freed.
    assert theirs[0] in mine[:2]
    a.send(ipc.Release.TYPE, [mine[2], theirs[0]])
    env.pump()
    assert "not granted to this client" in a.error()
    assert env.state(a_id, mine[2]) == OWNED and env.state(b_id, theirs[0]) == OWNED
    release = ipc.Release.TYPE
    for bad in ([release, "0"], [release, [0.5]], [release, [BLOCKS]], [release, [True]]):
        a.send(*bad)
        env.pump()
        a.error()
    assert env.pool.free_blocks == BLOCKS - 2
    assert (env.pool.held_by(a_id), env.pool.held_by(b_id)) == (1, 1)


def test_release_of_a_block_named_twice_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    [block] = client.blocks(1)
    client.send(ipc.Release.TYPE, [block, block])
    env.pump()
    assert "named more than once" in client.error()
    assert env.state(client_id, block) == OWNED
    assert env.pool.free_blocks == BLOCKS - 1


def test_abuse_of_its_own_blocks_cannot_make_the_daemon_grant_a_block_twice(env: Env) -> None:
    """The sequence that crashed the daemon: a block released three times, then requests that the
    pool, believing it had more free blocks than it had, served with one block twice."""
    hostile, good = env.client(), env.client()
    hostile_id = hostile.hello()
    good_id = good.hello()
    [block] = hostile.blocks(1)
    hostile.send(ipc.Release.TYPE, [block, block, block])
    env.pump()
    assert "named more than once" in hostile.error()
    mine = good.blocks(BLOCKS)
    assert len(mine) == BLOCKS - 1  # the block the hostile client still holds is not free
    hostile.send(ipc.Blocks.TYPE, 20, 2, True, 1)
    hostile.send(ipc.Blocks.TYPE, 21, 1, False, 60_000)
    env.pump()
    env.clock.advance(10)
    env.front.serve_due()
    assert hostile.recv()[:2] == [ipc.GrantFailed.TYPE, 20]
    assert hostile.recv() == good.recv() == [ipc.SealNow.TYPE]  # the spare request waits for the pool
    good.send(ipc.Release.TYPE, mine[:1])
    env.pump()
    env.front.serve_due()
    kind, request_id, [granted] = hostile.recv()
    assert (kind, request_id) == (ipc.Grant.TYPE, 21) and granted != block
    assert env.state(hostile_id, block) == env.state(hostile_id, granted) == OWNED
    assert env.state(good_id, mine[0]) == FREE and all(env.state(good_id, b) == OWNED for b in mine[1:])
    assert (env.pool.held_by(hostile_id), env.pool.held_by(good_id)) == (2, BLOCKS - 2)
    assert env.pool.free_blocks == 0 and not env.pool.waiters


# -- pool pressure --------------------------------------------------------------------------------


def test_exhausted_pool_asks_everyone_for_spare_blocks(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 77, 1, False, 1000)
    env.pump()
    assert b.quiet()  # waiting
    assert env.front.next_timer_ms() <= 50
    env.front.serve_due()
    assert a.recv() == [ipc.SealNow.TYPE] and b.recv() == [ipc.SealNow.TYPE]
    assert env.pool.exhausted
    env.front.serve_due()
    assert a.quiet() and b.quiet()  # not more often than every 50 ms
    env.clock.advance(50)
    env.front.serve_due()
    assert a.recv() == [ipc.SealNow.TYPE] and b.recv() == [ipc.SealNow.TYPE]
    # a gives a block back: the waiting request is served, the pressure is off.
    a.send(ipc.Release.TYPE, [held[3]])
    env.pump()
    env.front.serve_due()
    assert b.recv() == [ipc.Grant.TYPE, 77, [0]]  # its own block 0, in its segment
    assert not env.pool.exhausted
    env.clock.advance(50)
    env.front.serve_due()
    assert a.quiet() and b.quiet()


def test_waiting_request_fails_at_its_timeout(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 5, 2, True, 300)
    env.pump()
    env.clock.advance(299)
    env.front.serve_due()
    assert b.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(1)
    env.front.serve_due()
    kind, request_id, reason = b.recv()
    assert (kind, request_id) == (ipc.GrantFailed.TYPE, 5) and "no 2 free block(s)" in reason
    assert not env.pool.waiters and not env.pool.exhausted


def test_expired_request_at_the_head_does_not_hold_back_the_next(env: Env) -> None:
    a, b, c = env.client(), env.client(), env.client()
    a.hello()
    b.hello()
    c.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 4, True, 100)  # a run of four: cannot be served by one block
    env.pump()
    c.send(ipc.Blocks.TYPE, 2, 1, False, 1000)
    env.pump()
    a.send(ipc.Release.TYPE, [held[0]])
    env.pump()
    env.clock.advance(100)
    env.front.serve_due()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 1]
    assert c.recv() == [ipc.Grant.TYPE, 2, [0]]


def test_blocks_granted_to_a_client_that_left_go_back(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id = a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 1, False, 1000)
    env.pump()
    b.send(ipc.Goodbye.TYPE)
    env.pump()
    assert not env.pool.waiters  # its request left with it
    a.send(ipc.Release.TYPE, held[:1])
    env.pump()
    env.front.serve_due()
    assert env.pool.free_blocks == 1 and env.pool.held() == {a_id: BLOCKS - 1}
