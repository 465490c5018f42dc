"""The sessions' life cycle: a session ends (GOODBYE, its process gone, silent), is kept for its client, and is
claimed back only by the client that holds its segment."""

from __future__ import annotations

import logging
import os

import pytest
import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.contract.shared_memory import ERR, Layout, create_segment
from service.buffer_pool import FREE
from service.front import sidecar_front
from tests.support.front import (
    BLOCK,
    BLOCKS,
    TIMEOUT_MS,
    Client,
    Env,
    check_ended,
    deliveries,
    ended,
    notice,
    resume_of,
    seal_two_keep_two,
)
from tests.support.waiting import HANG_S

# -- sessions that end ----------------------------------------------------------------------------


def test_goodbye_reclaims_unsealed_blocks_and_keeps_sealed_batches(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    sealed, unsealed = seal_two_keep_two(env, client)
    client.send(ipc.Goodbye.TYPE)
    env.pump()
    assert client.memory_ended()
    check_ended(env, client_id, sealed, unsealed)
    env.front.serve_due()
    assert client.quiet()  # nobody to report to
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert "send HELLO first" in client.error()


def test_silent_client_is_ended_after_the_timeout(env: Env) -> None:
    client, chatty = env.client(), env.client()
    client_id = client.hello()
    chatty_id = chatty.hello()
    sealed, unsealed = seal_two_keep_two(env, client)
    env.clock.advance(TIMEOUT_MS)
    chatty.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.serve_due()
    assert len(env.front.sessions) == 2  # exactly the timeout is not past it
    assert not client.memory_ended()
    env.clock.advance(1)
    env.front.serve_due()
    assert [s.client_id for s in env.front.sessions] == [chatty_id]
    # The daemon shut down its side of the memory connection: the client, if it wakes, learns its session is over.
    assert client.memory_ended() and not chatty.memory_ended()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code() == (ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first")
    check_ended(env, client_id, sealed, unsealed, kept=True)
    # Stopped rather than dead, perhaps: what it had is kept until its process is gone.
    env.front.serve_due()
    env.clock.advance(10 * TIMEOUT_MS)
    chatty.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.serve_due()
    assert env.sidecar_metrics()["sessions-kept"] == 1
    kept = env.kept(client_id).connection
    assert client.memory is not None and kept is not None
    client.memory.close()  # the process is gone
    client.memory = None
    env.serve_until(lambda: not env.front.sessions.kept())
    assert env.sidecar_metrics()["sessions-kept"] == 0 and client_id not in env.pool.held()
    assert client.quiet()


def test_silent_clients_blocks_return_to_the_pool_at_once(env: Env) -> None:
    # Its blocks are in its own segment, which nobody else can map: nothing to wait for before others
    # are granted as many (in their own segments).
    silent, other = env.client(), env.client()
    silent_id = silent.hello()
    other_id = other.hello()
    silent.blocks(BLOCKS)
    other.send(ipc.Blocks.TYPE, 1, 3, False, 10 * TIMEOUT_MS)
    env.pump()
    env.front.serve_due()
    assert other.recv() == silent.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(TIMEOUT_MS + 1)
    other.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.serve_due()
    assert other.recv() == [ipc.SealNow.TYPE]  # in the iteration that ended the silent session
    assert env.pool.free_blocks == BLOCKS and env.pool.held() == {silent_id: 0, other_id: 0}  # its segment kept
    env.front.serve_due()
    assert other.recv() == [ipc.Grant.TYPE, 1, [0, 1, 2]]
    assert env.pool.held() == {silent_id: 0, other_id: 3}


def test_silent_clients_waiting_request_goes_with_its_session(env: Env) -> None:
    a, silent = env.client(), env.client()
    a_id = a.hello()
    silent.hello()
    held = a.blocks(BLOCKS)
    silent.send(ipc.Blocks.TYPE, 1, 1, False, 10 * TIMEOUT_MS)
    env.pump()
    env.front.serve_due()
    assert a.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(TIMEOUT_MS + 1)
    a.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.serve_due()
    assert a.recv() == [ipc.SealNow.TYPE]  # in the iteration that ended the silent session
    # Nobody would take what the request is granted: it is dropped, and nobody hears SEAL_NOW for it.
    assert not env.pool.waiters and not env.pool.exhausted
    env.clock.advance(50)
    env.front.serve_due()
    assert a.quiet()
    a.send(ipc.Release.TYPE, held[:1])
    env.pump()
    env.front.serve_due()
    assert env.state(a_id, held[0]) == FREE and env.pool.free_blocks == 1


def test_heartbeats_keep_a_session(env: Env) -> None:
    client = env.client()
    client.hello()
    for _ in range(5):
        env.clock.advance(TIMEOUT_MS * 2 // 3)
        client.send(ipc.Heartbeat.TYPE)
        env.pump()
        env.front.serve_due()
    assert len(env.front.sessions) == 1
    assert client.quiet() and not client.memory_ended()


def test_a_kept_session_is_taken_back_only_with_its_segment(env: Env) -> None:
    client, thief = env.client(own_process=False), env.client(own_process=False)
    client_id = client.hello()
    thief.hello()
    client.blocks(1)
    client.publish(notice(batch_id=1, first=0))
    env.clock.advance(TIMEOUT_MS + 1)
    thief.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.serve_due()  # the silent client's session ends, kept
    assert client.memory_ended()
    env.queued()[0].done(5, -1, None)
    resume = resume_of(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    other = create_segment(Layout(BLOCK, BLOCKS), "another segment")
    try:
        thief.send(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "thief", resume)
        env.pump()
        welcome = ipc.from_fields(thief.recv())
        assert isinstance(welcome, ipc.Welcome) and welcome.resumed and welcome.client_id == client_id
        conn, answer, _ = env.handshake(welcome.memory_token, other)
        assert answer.startswith(ERR) and b"not the one of the session" in answer and ended(conn)
    finally:
        os.close(other)
    env.front.serve_due()
    assert thief.quiet()  # nothing of the session reached the thief
    assert client.hello(hand_over=client.fd, **resume) == client_id
    env.front.serve_due()
    assert deliveries(client) == [[1, 0, 1, 5, -1, None]]


def _kept(env: Env, client: Client) -> int:
    """A session of ``client`` with a batch sealed and reported, ended for silence and kept; its id."""
    client_id = client.hello()
    client.blocks(1)
    client.publish(notice(batch_id=1, first=0))
    env.clock.advance(TIMEOUT_MS + 1)
    env.front.serve_due()
    assert client.memory_ended() and env.sidecar_metrics()["sessions-kept"] == 1
    env.queued()[0].done(5, -1, None)
    return client_id


def test_a_pending_claim_does_not_keep_the_owner_from_its_session(env: Env) -> None:
    client, thief = env.client(own_process=False), env.client(own_process=False)
    client_id = _kept(env, client)
    resume = resume_of(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    assert thief.hello(handshake=False, **resume) == client_id  # claimed, not proven
    assert client.hello(hand_over=client.fd, **resume) == client_id  # the owner proves it first
    env.front.serve_due()
    assert deliveries(client) == [[1, 0, 1, 5, -1, None]]
    assert thief.welcome is not None
    conn, answer, _ = env.handshake(thief.welcome.memory_token, client.fd, own_process=False)
    assert answer.startswith(ERR) and b"keeps that session no more" in answer
    # The thief's end touched nothing of the owner's.
    assert [s.client_id for s in env.front.sessions] == [client_id]
    assert env.pool.held_by(client_id) == 0 and client.blocks(1) == [0]


def test_a_session_is_taken_back_by_its_own_process_only(env: Env) -> None:
    client, other = env.client(own_process=False), env.client()
    client_id = _kept(env, client)
    resume = resume_of(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    other.hello(handshake=False, **resume)
    assert other.welcome is not None
    conn, answer, _ = env.handshake(other.welcome.memory_token, client.fd, own_process=True)
    assert answer.startswith(ERR) and b"was process" in answer
    assert env.sidecar_metrics()["sessions-kept"] == 1


def test_a_session_is_taken_back_at_the_limit_of_sessions_of_its_process() -> None:
    with Env(sidecar_process_max_sessions=1) as env:
        client = env.client(own_process=False)
        client_id = _kept(env, client)
        resume = resume_of(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
        assert client.hello(hand_over=client.fd, **resume) == client_id  # the kept one is the one taken back


def test_sessions_waiting_for_their_memory_handshake_are_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sidecar_front, "MAX_SESSIONS_AWAITING_HANDSHAKE", 2)
    first, second, third = env.client(), env.client(), env.client()
    first.hello(handshake=False)
    second.hello(handshake=False)
    third.send(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "third", {})
    env.pump()
    assert "2 sessions wait for their memory handshake" in third.error()
    first.handshake()
    third.hello(handshake=False)  # room again


def test_a_client_whose_socket_is_gone_is_ended_and_keeps_its_reports(env: Env) -> None:
    client = env.client(own_process=False)
    client_id = client.hello()
    client.blocks(1)
    client.publish(notice(batch_id=1, first=0))
    client.sock.close(linger=0)  # its memory connection stays: the process lives
    env.front.endpoint.socket.poll(50)  # the ROUTER learns that the socket is gone
    env.queued()[0].done(3, -1, None)
    env.front.serve_due()
    assert client.memory_ended() and not env.front.sessions
    figures = env.sidecar_metrics()
    assert figures["sessions-kept"] == 1 and figures["replies-dropped-total"] == 0
    client.sock = env.context.socket(zmq.DEALER)
    client.sock.connect(env.endpoint)
    client.hello(hand_over=client.fd, **resume_of(env.front.daemon_id, [notice(batch_id=1)], client_id=client_id))
    env.front.serve_due()
    assert deliveries(client) == [[1, 0, 1, 3, -1, None]]


def test_a_session_is_taken_back_whatever_its_notices_name_as_batch_ids(env: Env) -> None:
    # Which notices the kept session knows is asked of each notice's batch id: one that is no integer is taken,
    # and refused, as any other, and the claim is still answered.
    client = env.client(own_process=False)
    client_id = client.hello()
    env.clock.advance(TIMEOUT_MS + 1)
    env.front.serve_due()  # silent: its session ends, kept
    assert client.memory_ended()
    bad = notice(batch_id=1)
    bad[0] = [1]
    assert client.hello(hand_over=client.fd, **resume_of(env.front.daemon_id, [bad], client_id=client_id)) == client_id
    assert "batch refused: batch_id must be an integer" in client.error()
    assert env.session(client_id).attached and not env.front.sessions.kept()


def test_a_client_that_says_goodbye_and_exits_is_ended_by_its_goodbye(env: Env,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # Its GOODBYE and the end of its memory connection are ready in the same turn: the message is read first.
    client = env.client()
    client.hello()
    client.send(ipc.Goodbye.TYPE)
    assert client.memory is not None
    client.memory.close()  # the process exits
    client.memory = None
    assert env.front.endpoint.socket.poll(HANG_S * 1000)
    with caplog.at_level(logging.INFO, logger="service.front"):
        env.serve_until(lambda: not env.front.sessions)
    assert "said goodbye" in caplog.text and "is gone" not in caplog.text
    assert env.front.refusals.messages_refused == 0
