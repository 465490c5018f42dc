"""The open batches: the daemon watches the clients that woke it, claims each batch a client published when it is
due (linger.ms after it opened, full, the pool exhausted, the session over) and with one due those due soon, and a
client's slots concern its own records only (but for when the others' due soon are claimed, at most once a
linger.ms)."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from client_stub.contract import batch_slots, ipc
from service.buffer_pool import FREE, OWNED, SEALED
from service.config import ProducerConfig
from service.front import FrontSettings
from service.front.open_batches import WATCH_MS, Look
from tests.support.front import BLOCK, BLOCKS, MAX_REQUEST_SIZE, T0, TIMEOUT_MS, Client, Env, deliveries, notice

LINGER_MS = 20  # the clients' linger.ms; the daemon's (its scan interval) is 5, unless a test says otherwise
_DAY_MS = 86_400_000


def lingering(client: Client, linger_ms: int = LINGER_MS) -> None:
    """Write the client's linger.ms in its header, as a producer does when its session opens."""
    with client.control() as control:
        control.set_header(batch_slots.LINGER_NS, linger_ms * 1_000_000)


def header(client: Client) -> tuple[int, int]:
    """Until when (ns) the daemon watches the client, and how often it looks (ns), as its header says."""
    with client.control() as control:
        return control.header(batch_slots.WATCHED_UNTIL_NS), control.header(batch_slots.SCAN_INTERVAL_NS)


def claim_word(client: Client, block: int) -> int:
    with client.control() as control:
        return control.claim_word(block)


def origins(env: Env, topic: str = "t", partition: int = 0) -> list[tuple[int, int]]:
    return [batch.origin for batch in env.queued(topic, partition)]


def advance(env: Env, ms: int) -> None:
    """Move the front's clock, and serve what is due then."""
    env.clock.advance(ms)
    env.front.serve_due()


# -- linger ---------------------------------------------------------------------------------------


def test_an_open_batch_is_claimed_linger_ms_after_it_opened_not_before(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    lingering(client)
    client.blocks(1)
    # Two records in it, the first 5 ms ago; WAKEUP: the daemon looks, and lingers.
    client.publish(notice(batch_id=1, records=2, length=300, ago=5), full=False)
    assert env.queued() == [] and claim_word(client, 0) == 0
    assert env.front.next_timer_ms() == 5  # its next look (the daemon's linger.ms): not due by then
    advance(env, LINGER_MS - 5 - 1)
    assert env.queued() == [] and env.state(client_id, 0) == OWNED
    advance(env, 1)
    [batch] = env.queued()
    assert (batch.origin, batch.record_count, len(batch.records)) == ((client_id, 1), 2, 300)
    assert batch.created_ms == T0 - 5
    assert env.state(client_id, 0) == SEALED
    # The claim is in the slot: the client's next record is not in the batch, its first two are.
    claim = claim_word(client, 0)
    assert claim == batch_slots.CLAIMED | 2
    assert batch_slots.holds(claim, 1) and not batch_slots.holds(claim, 2)
    assert client.quiet()  # a claim is not answered: its DELIVERY comes when the batch is finished


def test_a_header_without_linger_has_its_batches_claimed_at_the_first_look(env: Env) -> None:
    # The daemon lingers as long as the client's header says (a producer writes there its linger.ms, else the
    # daemon's): a header that says nothing, no linger at all.
    client = env.client()
    client_id = client.hello()
    client.blocks(1)
    client.publish(notice(batch_id=1), full=False)
    assert origins(env) == [(client_id, 1)]


def test_a_linger_past_a_day_is_a_day(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    lingering(client, 2**40)
    client.blocks(1)
    client.publish(notice(batch_id=1), full=False)
    for ms in (_DAY_MS - 1, 1):
        env.clock.advance(ms)
        client.send(ipc.Heartbeat.TYPE)  # not silent meanwhile
        env.pump()
        env.front.serve_due()
        assert origins(env) == ([(client_id, 1)] if ms == 1 else [])


def test_a_batch_whose_opened_ns_lies_is_claimed_linger_ms_after_the_daemon_first_saw_it(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    lingering(client)
    client.blocks(2)
    # Opened, it says, in a year.
    client.publish(notice(batch_id=1, ago=-365 * _DAY_MS), full=False)
    advance(env, LINGER_MS - 1)
    assert env.queued() == []
    advance(env, 1)
    [batch] = env.queued()
    assert batch.origin == (client_id, 1) and batch.created_ms == T0 + LINGER_MS  # no later than when claimed
    # Opened, it says, long ago: claimed at once, its own loss only.
    client.publish(notice(batch_id=2, first=1, ago=T0), full=False)
    assert origins(env) == [(client_id, 1), (client_id, 2)]


def test_a_full_batch_is_claimed_at_once(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    lingering(client, 3_600_000)
    client.blocks(3)
    client.publish(notice(batch_id=1))  # full, and WAKEUP
    assert origins(env) == [(client_id, 1)]
    # Full and watched, without a WAKEUP: at the next look, and the look after comes the next millisecond (a
    # client that fills blocks fills more).
    client.publish(notice(batch_id=2, first=1), wakeup=False)
    env.front.serve_due()
    assert origins(env) == [(client_id, 1)]
    advance(env, 5)
    assert origins(env) == [(client_id, 1), (client_id, 2)]
    assert env.front.next_timer_ms() == 1


# -- the watch ------------------------------------------------------------------------------------


def test_the_header_of_a_watched_client_says_until_when_and_how_often_the_daemon_looks(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    lingering(client)
    assert header(client) == (0, 5_000_000)  # not watched: its first batch comes with a WAKEUP
    client.blocks(2)  # BLOCKS wakes the daemon too
    assert header(client) == ((T0 + WATCH_MS) * 1_000_000, 5_000_000)
    # While it has open batches the watch goes on, WATCH_MS past each look.
    advance(env, 5)
    client.publish(notice(batch_id=1), full=False, wakeup=False)  # in time for the daemon: no WAKEUP needed
    advance(env, 5)
    assert header(client) == ((T0 + 10 + WATCH_MS) * 1_000_000, 5_000_000)
    advance(env, LINGER_MS)
    assert origins(env) == [(client_id, 1)]
    # No open batch: WATCH_MS after the last look that found one the watch is over, and the first look after
    # writes so.
    advance(env, WATCH_MS - LINGER_MS - 1)
    assert header(client) == ((T0 + 10 + WATCH_MS) * 1_000_000, 5_000_000)
    advance(env, 5)
    assert header(client)[0] == 0
    # A batch published now is not looked at: its WAKEUP says it is there.
    client.publish(notice(batch_id=2, first=1), full=False, wakeup=False)
    advance(env, 10 * LINGER_MS)
    assert origins(env) == [(client_id, 1)]
    client.send(ipc.Wakeup.TYPE)
    env.pump()
    env.look()
    assert origins(env) == [(client_id, 1), (client_id, 2)]  # opened long ago: due at once


def test_the_next_timer_has_the_looks_only_while_clients_are_watched() -> None:
    with Env(linger_ms=100) as env:  # the daemon looks every 100 ms, or at the linger.ms of a client lingering less
        client = env.client()
        client_id = client.hello()
        lingering(client, 500)
        assert env.front.next_timer_ms() == TIMEOUT_MS  # nobody watched
        client.blocks(1)
        assert env.front.next_timer_ms() == 100 and header(client)[1] == 100_000_000
        # A batch lingering less than the daemon's scan interval: the loop wakes when it is due.
        lingering(client, LINGER_MS)
        client.publish(notice(batch_id=1), full=False)
        assert env.front.next_timer_ms() == LINGER_MS
        advance(env, LINGER_MS)
        assert origins(env) == [(client_id, 1)]
        # Its client lingers less than the daemon: it is looked at every linger.ms of its own, and its header
        # says so (its next batch needs no WAKEUP).
        assert env.front.next_timer_ms() == LINGER_MS and header(client)[1] == LINGER_MS * 1_000_000
        for _ in range(WATCH_MS // LINGER_MS):
            advance(env, LINGER_MS)
        assert env.front.next_timer_ms() == TIMEOUT_MS - (env.clock() - T0)  # the watch is over: the silence timeout


def test_each_client_is_looked_at_at_its_own_pace() -> None:
    with Env(linger_ms=100) as env:
        quick, slow = env.client(), env.client()
        quick_id, slow_id = quick.hello(), slow.hello()
        lingering(quick, 10)
        lingering(slow, 500)
        quick_blocks, slow_blocks = quick.blocks(2), slow.blocks(2)
        # Both publish a batch without a WAKEUP, as a client the daemon watches often enough does.
        quick.publish(notice(batch_id=1, first=quick_blocks[0]), full=False, wakeup=False)
        slow.publish(notice(batch_id=1, first=slow_blocks[0], partition=1), full=False, wakeup=False)
        advance(env, 10)
        assert origins(env) == [(quick_id, 1)] and origins(env, partition=1) == []
        advance(env, 90)
        assert origins(env, partition=1) == []  # looked at every 100 ms: due 500 ms after it opened
        for _ in range(5):
            advance(env, 100)
        assert origins(env, partition=1) == [(slow_id, 1)]


# -- drained together -----------------------------------------------------------------------------


def test_a_batch_due_brings_the_claim_of_every_batch_due_within_the_daemons_linger() -> None:
    with Env(linger_ms=10) as env:  # the daemon's linger.ms: how early a batch is claimed with one that is due
        first, soon, later, slow = (env.client() for _ in range(4))
        ids = [client.hello() for client in (first, soon, later, slow)]
        for client in (first, soon, later):
            lingering(client)
        lingering(slow, 500)
        blocks = [client.blocks(2) for client in (first, soon, later, slow)]
        first.publish(notice(batch_id=1, first=blocks[0][0]), full=False)
        slow.publish(notice(batch_id=1, first=blocks[3][0], partition=3), full=False)  # due in 500 ms
        advance(env, 8)
        soon.publish(notice(batch_id=1, first=blocks[1][0], partition=1), full=False)  # due 8 ms after the first
        advance(env, 3)
        later.publish(notice(batch_id=1, first=blocks[2][0], partition=2), full=False)  # 11 ms after: too late
        advance(env, LINGER_MS - 11 - 1)
        assert env.queued() == [] and env.queued(partition=1) == []
        advance(env, 1)
        # The first is due: with it the batch due 8 ms later, within the daemon's 10; not the one due 11 ms later,
        # nor the one of a client lingering 500 ms.
        assert origins(env) == [(ids[0], 1)] and origins(env, partition=1) == [(ids[1], 1)]
        assert origins(env, partition=2) == [] and origins(env, partition=3) == []
        assert claim_word(later, blocks[2][0]) == claim_word(slow, blocks[3][0]) == 0
        advance(env, 11)
        assert origins(env, partition=2) == [(ids[2], 1)] and origins(env, partition=3) == []


def test_a_full_batch_claims_only_itself(env: Env) -> None:
    # A client filling blocks is claimed as it fills them: were every other batch claimed with each, a busy
    # producer would have everyone's batches sent young.
    full, open_ = env.client(), env.client()
    full_id, open_id = full.hello(), open_.hello()
    for client in (full, open_):
        lingering(client)
    full_block, open_block = full.blocks(1)[0], open_.blocks(1)[0]
    open_.publish(notice(batch_id=1, first=open_block, partition=1), full=False)
    advance(env, LINGER_MS - 1)
    full.publish(notice(batch_id=1, first=full_block))
    assert origins(env) == [(full_id, 1)] and origins(env, partition=1) == []
    advance(env, 1)
    assert origins(env, partition=1) == [(open_id, 1)]


def test_a_client_lingering_less_than_the_daemon_has_only_its_own_batches_claimed_sooner() -> None:
    with Env(linger_ms=10) as env:
        hasty, patient = env.client(), env.client()
        hasty_id, patient_id = hasty.hello(), patient.hello()
        lingering(hasty, 0)  # linger_ms=0: each batch asks to go at once
        lingering(patient)
        hasty_block, patient_block = hasty.blocks(1)[0], patient.blocks(1)[0]
        patient.publish(notice(batch_id=1, first=patient_block, partition=1), full=False)
        advance(env, LINGER_MS - 5)
        hasty.publish(notice(batch_id=1, first=hasty_block), full=False)
        assert origins(env) == [(hasty_id, 1)] and origins(env, partition=1) == []
        advance(env, 5)
        assert origins(env, partition=1) == [(patient_id, 1)]


def test_batches_due_at_once_claim_the_others_early_at_most_once_a_linger_ms() -> None:
    # A client whose every batch is due at once (its slots say they opened long ago) cannot have everyone's batches
    # claimed young more often than a client lingering as the daemon does would.
    with Env(linger_ms=10) as env:
        hostile, other = env.client(), env.client()
        hostile_id, other_id = hostile.hello(), other.hello()
        lingering(hostile, 10)
        lingering(other, 10)
        hostile_blocks, other_blocks = hostile.blocks(2), other.blocks(2)
        other.publish(notice(batch_id=1, first=other_blocks[0], partition=1), full=False)
        advance(env, 1)
        hostile.publish(notice(batch_id=1, first=hostile_blocks[0], ago=1000), full=False)
        assert origins(env, partition=1) == [(other_id, 1)]  # due in 9 ms: claimed with the hostile one
        other.publish(notice(batch_id=2, first=other_blocks[1], partition=1), full=False, wakeup=False)
        advance(env, 2)
        hostile.publish(notice(batch_id=2, first=hostile_blocks[1], ago=1000), full=False)
        assert origins(env) == [(hostile_id, 1), (hostile_id, 2)]
        # Due in 8 ms, but the last claim of the others was 2 ms ago: it lingers.
        assert origins(env, partition=1) == [(other_id, 1)]
        advance(env, 7)
        assert origins(env, partition=1) == [(other_id, 1)]
        advance(env, 1)
        assert origins(env, partition=1) == [(other_id, 1), (other_id, 2)]


def test_a_daemon_lingering_past_a_day_claims_with_a_batch_due_every_other() -> None:
    with Env(linger_ms=2**31 - 1) as env:
        due, lingering_long = env.client(), env.client()
        due_id, long_id = due.hello(), lingering_long.hello()
        lingering(due, 2**31 - 1)
        lingering(lingering_long, 2**31 - 1)
        due_block, long_block = due.blocks(1)[0], lingering_long.blocks(1)[0]
        lingering_long.publish(notice(batch_id=1, first=long_block, partition=1), full=False)
        assert origins(env, partition=1) == []
        advance(env, 1)
        # Due now (a linger.ms is a day at most): with it every batch due within the daemon's, a day at most too.
        due.publish(notice(batch_id=1, first=due_block, ago=_DAY_MS), full=False)
        assert origins(env) == [(due_id, 1)] and origins(env, partition=1) == [(long_id, 1)]


def test_a_reload_of_linger_ms_changes_how_early_the_others_are_claimed() -> None:
    with Env(linger_ms=5) as env:
        config = ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "max.request.size": MAX_REQUEST_SIZE,
                                 "sidecar.client.timeout.ms": TIMEOUT_MS, "linger.ms": 20})
        env.front.use_settings(FrontSettings.from_config(config, BLOCK, BLOCKS))
        due, other = env.client(), env.client()
        due_id, other_id = due.hello(), other.hello()
        lingering(due)
        lingering(other, 40)
        due_block, other_block = due.blocks(1)[0], other.blocks(1)[0]
        other.publish(notice(batch_id=1, first=other_block, partition=1), full=False)  # due in 40 ms
        due.publish(notice(batch_id=1, first=due_block, ago=LINGER_MS), full=False)  # due now
        # Due in 40 ms: not within the reloaded linger.ms of 20.
        assert origins(env) == [(due_id, 1)] and origins(env, partition=1) == []
        advance(env, 20)
        due.publish(notice(batch_id=2, first=due.blocks(1)[0], ago=LINGER_MS), full=False)
        assert origins(env, partition=1) == [(other_id, 1)]  # due in 20 ms: within the reloaded linger.ms


def test_once_the_daemon_reads_nothing_more_of_its_clients_their_batches_stay_theirs(env: Env) -> None:
    # The producer is closing: what it was handed now would fail, where the clients keep it for the next daemon.
    client = env.client()
    client_id = client.hello()
    lingering(client)
    blocks = client.blocks(2)
    client.publish(notice(batch_id=1, first=blocks[0]), full=False)
    env.front.stop_serving()
    client.publish(notice(batch_id=2, first=blocks[1], partition=1), wakeup=False)  # full
    advance(env, LINGER_MS)
    env.front.open_batches.claim_all(env.session(client_id), env.clock())
    assert env.queued() == [] and env.queued(partition=1) == []
    assert claim_word(client, blocks[0]) == claim_word(client, blocks[1]) == 0


# -- claimed all at once --------------------------------------------------------------------------


def _goodbye(env: Env, client: Client) -> None:
    client.send(ipc.Goodbye.TYPE)
    env.pump()
    assert not env.front.sessions


def _last_seal(env: Env, client: Client) -> None:
    client.send(ipc.LastSeal.TYPE)
    env.pump()
    assert env.session(client.client_id).last_sealed


def _process_gone(env: Env, client: Client) -> None:
    client.hang_up()
    assert not env.front.sessions


def _silent(env: Env, client: Client) -> None:
    advance(env, TIMEOUT_MS + 1)
    assert env.sidecar_metrics()["sessions-kept"] == 1


def _hello_again(env: Env, client: Client) -> None:
    client.hello()
    assert len(env.front.sessions) == 1


@pytest.mark.parametrize("end", [_goodbye, _last_seal, _process_gone, _silent, _hello_again],
                         ids=["goodbye", "lastseal", "process-gone", "silent-kept", "hello-again"])
def test_what_a_client_published_is_claimed_when_its_session_ends(env: Env, end: Any) -> None:
    # A record is safe once send() returned: published, open, not lingered, unannounced, it is sent all the same.
    client = env.client()
    client_id = client.hello()
    lingering(client, 3_600_000)
    assert client.blocks(3, contiguous=True) == [0, 1, 2]
    segment = client.segment
    assert segment is not None
    segment.blocks(0, 2)[:5000] = b"r" * 5000
    client.publish(notice(batch_id=1, count=2, records=7, length=5000), full=False, wakeup=False)
    end(env, client)
    [batch] = env.queued()
    assert (batch.origin, batch.record_count, bytes(batch.records)) == ((client_id, 1), 7, b"r" * 5000)
    assert env.state(client_id, 0) == env.state(client_id, 1) == SEALED
    control = batch_slots.ControlArea(segment.control, BLOCKS)
    try:
        assert control.claim_word(0) == batch_slots.CLAIMED | 7  # the client, if it lives, sees the claim
    finally:
        control.release()


def test_batches_claimed_together_are_queued_in_the_order_they_opened(env: Env) -> None:
    # A partition's batches go in the order their records were sent, whatever blocks they are in.
    client = env.client()
    client_id = client.hello()
    lingering(client, 3_600_000)
    assert client.blocks(3) == [0, 1, 2]
    client.publish(notice(batch_id=1, first=2), notice(batch_id=2, first=1), wakeup=False)  # full: closed
    client.publish(notice(batch_id=3, first=0), full=False, wakeup=False)  # open
    client.send(ipc.Goodbye.TYPE)
    env.pump()
    assert origins(env) == [(client_id, 1), (client_id, 2), (client_id, 3)]
    # And so are those that are full when the daemon looks.
    other = env.client()
    other_id = other.hello()
    assert other.blocks(2) == [0, 1]
    other.publish(notice(batch_id=1, first=1), notice(batch_id=2, first=0))
    assert origins(env)[3:] == [(other_id, 1), (other_id, 2)]


# -- pool pressure --------------------------------------------------------------------------------


def test_the_exhausted_pool_claims_what_everyone_published_then_says_seal_now(env: Env) -> None:
    a, b, waiting = env.client(), env.client(), env.client()
    a_id, b_id = a.hello(), b.hello()
    waiting.hello()
    for client, count in ((a, 5), (b, 3)):
        lingering(client, 3_600_000)
        assert client.blocks(count, contiguous=True) == list(range(count))
        client.publish(notice(batch_id=1, records=2), full=False)
    assert env.queued() == [] and env.pool.free_blocks == 0
    waiting.send(ipc.Blocks.TYPE, 1, 1, False, 1000)
    env.pump()
    env.front.serve_due()
    assert origins(env) == [(a_id, 1), (b_id, 1)]
    # Then each is asked for its spare blocks.
    assert a.recv() == b.recv() == waiting.recv() == [ipc.SealNow.TYPE]
    # The claimed batches free their blocks as they are sent.
    env.queued()[0].done(1, -1, None)
    env.front.serve_due()
    assert waiting.recv() == [ipc.Grant.TYPE, 1, [0]]


def test_a_client_at_its_limit_has_its_own_batches_claimed() -> None:
    with Env(max_blocks_per_process=4) as env:
        full, other = env.client(), env.client()
        full_id, other_id = full.hello(), other.hello()
        for client in (full, other):
            lingering(client, 3_600_000)
            client.blocks(4, contiguous=True)
            client.publish(notice(batch_id=1), full=False)
        full.send(ipc.Blocks.TYPE, 9, 1, False, 1000)  # waits for its own blocks
        env.pump()
        env.front.serve_due()
        assert origins(env) == [(full_id, 1)] and full.recv() == [ipc.SealNow.TYPE]
        assert other.quiet() and env.state(other_id, 0) == OWNED


def test_a_client_waiting_at_its_processs_limit_has_the_batches_of_the_process_claimed() -> None:
    # The blocks it waits for may be any client's of its process: one lingering for an hour holds them all.
    with Env(max_blocks_per_process=4) as env:
        lingerer, waiter, elsewhere = env.client(own_process=False), env.client(own_process=False), env.client()
        lingerer_id, waiter_id, elsewhere_id = lingerer.hello(), waiter.hello(), elsewhere.hello()
        for client in (lingerer, elsewhere):
            lingering(client, 3_600_000)
            client.blocks(4, contiguous=True)
            client.publish(notice(batch_id=1), full=False)
        waiter.send(ipc.Blocks.TYPE, 9, 1, False, 1000)
        env.pump()
        env.front.serve_due()
        assert origins(env) == [(lingerer_id, 1)]
        assert lingerer.recv() == waiter.recv() == [ipc.SealNow.TYPE]
        assert elsewhere.quiet() and env.state(elsewhere_id, 0) == OWNED
        env.queued()[0].done(1, -1, None)
        env.front.serve_due()
        assert waiter.recv() == [ipc.Grant.TYPE, 9, [0]] and env.pool.held_by(waiter_id) == 1


def test_blocks_has_the_clients_full_batches_claimed_in_the_same_turn(env: Env) -> None:
    # A client asks for blocks when it filled those it had.
    client = env.client()
    client_id = client.hello()
    lingering(client, 3_600_000)
    assert client.blocks(2) == [0, 1]
    client.publish(notice(batch_id=1), wakeup=False)
    client.publish(notice(batch_id=2, first=1), full=False, wakeup=False)
    assert client.blocks(1) == [2]
    assert origins(env) == [(client_id, 1)]  # the open one lingers
    assert env.state(client_id, 1) == OWNED and claim_word(client, 1) == 0


def test_a_block_granted_again_keeps_its_claim_until_a_batch_opens_there(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    assert client.blocks(1) == [0]
    client.publish(notice(batch_id=1))
    [batch] = env.queued()
    batch.done(5, -1, None)
    assert env.state(client_id, 0) == FREE
    # The slot still says what was claimed: granted again (after the batch's report), the block is not read as a
    # batch again.
    client.send(ipc.Blocks.TYPE, 99, 1, False, 1000)
    env.pump()
    assert [report[0] for report in deliveries(client)] == [1]
    assert client.recv() == [ipc.Grant.TYPE, 99, [0]]
    client.send(ipc.Wakeup.TYPE)
    env.pump()
    advance(env, 5)
    assert origins(env) == [(client_id, 1)] and claim_word(client, 0) == batch_slots.CLAIMED | 1
    assert env.state(client_id, 0) == OWNED
    # A batch opened there is the client's new one.
    client.publish(notice(batch_id=2))
    assert origins(env) == [(client_id, 1), (client_id, 2)]


def test_a_session_ended_by_its_refusals_during_a_look_ends_the_look_for_it_only() -> None:
    with Env(reply_buffer_bytes=1 << 20) as env:
        reader, client = env.client(), env.client(receive_hwm=1)
        reader_id = reader.hello()
        client_id = client.hello()
        for each in (reader, client):
            lingering(each)
            each.topic_index("t")
            each.blocks(2, contiguous=True)
        # The client does not read: what the daemon answers it now waits, at the limit of what may.
        refused = env.front.refusals.messages_refused + 300
        for n in range(300):
            client.send(ipc.Blocks.TYPE, 1000 + n, 0, False, 1000)
        while env.front.refusals.messages_refused < refused:
            env.pump()
        session = env.session(client_id)
        assert session.waiting
        env.front.replies.reply_buffer_bytes = session.waiting_bytes
        # Its batch, refused when due, is one reply too many: its session ends as the daemon looks.
        client.publish(notice(batch_id=1, partition=2**31), full=False, wakeup=False)
        client.publish(notice(batch_id=2, first=1), full=False, wakeup=False)
        reader.publish(notice(batch_id=1), full=False, wakeup=False)
        advance(env, LINGER_MS)
        assert env.sidecar_metrics()["sessions-kept"] == 1
        assert sorted(origins(env)) == [(reader_id, 1), (client_id, 2)]
        advance(env, 5)  # the looks go on, for the others
        reader.publish(notice(batch_id=2, first=1))
        assert origins(env)[-1] == (reader_id, 2)


# -- isolation ------------------------------------------------------------------------------------


def test_a_clients_slots_never_affect_another_clients_batches(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    hostile, good = env.client(), env.client()
    hostile_id = hostile.hello()
    good_id = good.hello()
    hostile.topic_index("t")
    assert hostile.blocks(4) == [0, 1, 2, 3]
    assert good.blocks(2, contiguous=True) == [0, 1]
    assert good.segment is not None
    written = bytes(range(256)) * 20
    good.segment.blocks(0, 2)[:len(written)] = written
    good.publish(notice(batch_id=1, count=2, records=3, length=len(written)), full=False, wakeup=False)
    # Garbage in every word of the hostile client's control area, but claims of 0: the daemon reads each slot.
    rng = random.Random(39)
    with hostile.control() as control:
        words = control.words
        for at in range(len(words)):
            words[at] = rng.getrandbits(64)
        for block in range(BLOCKS):
            words[(batch_slots.HEADER_SIZE + block * batch_slots.SLOT_SIZE) // 8 + batch_slots.CLAIM] = 0
    # And one batch it may send, of the same blocks' numbers as the good client's: its own records.
    assert hostile.segment is not None
    hostile.segment.blocks(0)[:100] = b"h" * 100
    hostile.publish(notice(batch_id=9, first=0, length=100), full=False, wakeup=False)
    hostile.send(ipc.Wakeup.TYPE)
    hostile.send(ipc.Goodbye.TYPE)  # every slot with records claimed
    env.pump()
    good.send(ipc.Goodbye.TYPE)
    env.pump()
    env.front.serve_due()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # each refused on its own: no bug met
    [batch] = [b for b in env.queued() if b.origin[0] == good_id]
    assert (batch.origin, batch.record_count, bytes(batch.records)) == ((good_id, 1), 3, written)
    assert [(b.origin, bytes(b.records)) for b in env.queued() if b is not batch] == [((hostile_id, 9), b"h" * 100)]


def test_a_flood_of_wakeups_is_one_look_at_the_client_a_turn(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each look reads every slot of the blocks the client holds: a client that says WAKEUP as fast as it can costs
    # the daemon one look a turn, whatever the number of its messages.
    client = env.client()
    client_id = client.hello()
    lingering(client, 3_600_000)
    client.blocks(BLOCKS)
    looks: list[int] = []
    look = env.front.open_batches._scan

    def counted(session: Any, now: int, *, claim_all: bool, early_ms: int = 0) -> Look:
        looks.append(session.client_id)
        return look(session, now, claim_all=claim_all, early_ms=early_ms)

    client.publish(notice(batch_id=1), full=False, wakeup=False)
    monkeypatch.setattr(env.front.open_batches, "_scan", counted)
    for _ in range(50):
        client.send(ipc.Wakeup.TYPE)
    env.pump()
    env.look()
    assert looks == [client_id]
    assert origins(env) == []  # lingering for an hour: WAKEUP asks for a look, not for a claim
