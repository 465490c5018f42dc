"""The front's dispatcher: HELLO and its checks, what a message of a client may be, a bug met in a handler, and
how many messages one turn of the loop handles."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from client_stub.contract.shared_memory import ERR, OK, Layout, Segment
from service.front import SidecarFront
from service.front.checks import max_message_size
from service.front.sidecar_front import MAX_MESSAGES_PER_CLIENT_PER_ITERATION, MAX_MESSAGES_PER_ITERATION
from service.producer.batch import ProducerBatch
from tests.support.front import (
    BLOCK,
    BLOCKS,
    MAX_REQUEST_SIZE,
    TIMEOUT_MS,
    Env,
    deliveries,
    ended,
    notice,
)
from tests.support.waiting import HANG_S

# -- handshake ------------------------------------------------------------------------------------


def test_hello_gets_a_welcome_then_its_segment_over_the_memory_socket(env: Env) -> None:
    client = env.client()
    claimed_pid = os.getpid() + 100_000  # what the HELLO says; the kernel says otherwise
    client.send(ipc.Hello.TYPE, PROTOCOL_VERSION, claimed_pid, "worker-1", {"linger_ms": 5, "hello_id": 7})
    env.pump()
    (kind, version, client_id, token, block_size, block_count, settings, daemon_id, resumed,
     hello_id) = client.recv()
    assert (kind, version, block_size, block_count, resumed, hello_id) == (ipc.Welcome.TYPE, PROTOCOL_VERSION,
                                                                           BLOCK, BLOCKS, False, 7)
    assert settings == {"max_request_size": MAX_REQUEST_SIZE, "linger_ms": 5, "max_block_ms": 60000,
                        "delivery_timeout_ms": 120000, "buffer_memory": BLOCKS * BLOCK,
                        "heartbeat_interval_ms": TIMEOUT_MS // 10,
                        # What the daemon's producer does, for clients to check their settings against.
                        "acks": -1, "compression_type": "none", "enable_idempotence": True, "retries": 2**31 - 1,
                        "batch_size": BLOCK, "request_timeout_ms": 30000, "max_in_flight_requests_per_connection": 5,
                        "retry_backoff_ms": 100, "allow_auto_create_topics": True}
    assert daemon_id == env.front.daemon_id
    # An inproc endpoint has no file beside which to put the memory socket: it is an abstract one.
    assert env.front.endpoint.memory.path == shared_memory.memory_socket_path(env.endpoint, daemon_id)
    assert env.front.endpoint.memory.path.startswith("\0")
    assert isinstance(token, bytes) and len(token) == 16
    session = env.session(client_id)
    assert (session.pid, session.name, session.connection) == (claimed_pid, "worker-1", None)
    conn, answer, fds = env.handshake(token)
    try:
        assert answer == OK and len(fds) == 1
        # The segment is an anonymous memory file of the pool's size, which the client can map.
        assert os.readlink(f"/proc/self/fd/{fds[0]}").startswith("/memfd:")
        assert os.fstat(fds[0]).st_size == Layout(BLOCK, BLOCKS).size  # its blocks, then its control area
        segment = Segment(fds[0], Layout(BLOCK, BLOCKS))
        segment.blocks(BLOCKS - 1)[-4:] = b"last"
        segment.close()
    finally:
        for fd in fds:
            os.close(fd)
    # The connection stays, and the kernel's word on the process replaces the HELLO's.
    assert session.connection is not None and session.pid == os.getpid()
    assert not ended(conn)
    # A second client gets another id.
    assert env.client().hello() != client_id


@pytest.mark.parametrize("hello", [
    [ipc.Hello.TYPE, 99, 1234, "old", {}],
    [ipc.Hello.TYPE, 1, 1234, "of the shared segment", {"process": ["pid:[1]", 5]}],
    [ipc.Hello.TYPE, PROTOCOL_VERSION + 1, 1234, "newer, with another field", {}, "extra"],  # other fields
    [ipc.Hello.TYPE, 0],
    [ipc.Hello.TYPE, "1", 1234, "text version", {}],
], ids=["99", "1-previous", "next-more-fields", "0-fewer-fields", "text"])
def test_hello_of_another_version_is_refused_naming_both(env: Env, hello: list[Any]) -> None:
    client = env.client()
    client.send(*hello)
    env.pump()
    text = client.error()
    assert "protocol version mismatch" in text
    assert f"the client speaks {hello[1]!r}" in text
    assert f"this daemon speaks {PROTOCOL_VERSION}" in text
    assert not env.front.sessions
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert "send HELLO first" in client.error()


@pytest.mark.parametrize("hello", [
    [ipc.Hello.TYPE, PROTOCOL_VERSION, 1234, "x"],
    [ipc.Hello.TYPE, PROTOCOL_VERSION, 0, "x", {}],
    [ipc.Hello.TYPE, PROTOCOL_VERSION, "1234", "x", {}],
], ids=["missing-options", "pid-0", "pid-text"])
def test_malformed_hello_is_refused(env: Env, hello: list[Any]) -> None:
    client = env.client()
    client.send(*hello)
    env.pump()
    client.error()
    assert not env.front.sessions


@pytest.mark.parametrize("message", [
    [ipc.Blocks.TYPE, 1, 1, False, 100], [ipc.Wakeup.TYPE], [ipc.Release.TYPE, [0]], [ipc.Metadata.TYPE, "t"],
    [ipc.Heartbeat.TYPE], [ipc.Goodbye.TYPE], [ipc.LastSeal.TYPE],
], ids=lambda message: str(message[0]))
def test_messages_before_hello_are_refused(env: Env, message: list[Any]) -> None:
    client = env.client()
    client.send(*message)
    env.pump()
    assert "unknown client: send HELLO first" in client.error()
    assert env.pool.free_blocks == BLOCKS
    assert env.core.accumulator.queued_batches() == 0
    env.front.serve_due()
    assert client.quiet()  # no DELIVERY for a client without a session


def test_garbage_is_refused_and_counted(env: Env) -> None:
    client = env.client()
    client.sock.send(b"\xc1not msgpack")
    env.pump()
    assert "not a msgpack message" in client.error()
    client.sock.send_multipart([ipc.pack(ipc.Heartbeat.TYPE), b"second frame"])
    env.pump()
    assert "exactly one frame, got 2" in client.error()
    client.hello()
    client.send(999)
    client.send(True)  # msgpack's true is not HELLO (1)
    env.pump()
    assert "unknown message type 999" in client.error()
    assert "starts with its type" in client.error()
    assert env.front.refusals.messages_refused == 4
    assert len(env.front.sessions) == 1


def test_hello_again_ends_the_first_session(env: Env) -> None:
    client = env.client()
    first_id = client.hello()
    first_token = client.welcome.memory_token
    first_memory = client.memory
    assert first_memory is not None
    client.blocks(3)
    second_id = client.hello()
    assert second_id != first_id
    assert [s.client_id for s in env.front.sessions] == [second_id]
    # The first session's blocks went back to the pool, and its segment is gone with nothing left in it.
    assert env.pool.held_by(first_id) == 0 and first_id not in env.pool.held()
    assert env.pool.free_blocks == BLOCKS
    # Its memory connection was closed, its token is spent; the new session has a segment of its own.
    assert ended(first_memory)
    _, answer, fds = env.handshake(first_token)
    assert answer.startswith(ERR) and fds == []
    assert client.blocks(2) == [0, 1] and env.pool.held_by(second_id) == 2


def test_next_timer_follows_sessions_and_waiters() -> None:
    with Env(linger_ms=100) as env:  # the daemon looks at the open batches of the clients it watches every 100 ms
        # Nothing to poll processes for: the memory connections' end wakes the loop.
        assert env.front.next_timer_ms() == TIMEOUT_MS
        client = env.client()
        client.hello()
        env.clock.advance(400)
        assert env.front.next_timer_ms() == TIMEOUT_MS - 400  # the session's silence timeout
        client.send(ipc.Heartbeat.TYPE)
        env.pump()
        assert env.front.next_timer_ms() == TIMEOUT_MS
        client.blocks(BLOCKS)
        assert env.front.next_timer_ms() == 100  # its BLOCKS made it watched: the next look at its open batches
        client.send(ipc.Blocks.TYPE, 9, 1, False, 30)
        env.pump()
        assert env.front.next_timer_ms() == 0  # its BLOCKS asks for a look at its open batches in this turn
        env.look()
        assert env.front.next_timer_ms() == 30  # the waiter's deadline comes before the SEAL_NOW repeat
        env.clock.advance(40)
        assert env.front.next_timer_ms() == 0


# -- robustness -----------------------------------------------------------------------------------


def test_exception_in_a_handler_does_not_escape(env: Env, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    def broken(front: SidecarFront, session: Any, message: list[Any]) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setitem(SidecarFront._HANDLERS, ipc.Heartbeat, broken)
    client = env.client()
    client.hello()
    client.send(ipc.Heartbeat.TYPE)
    client.send(ipc.Blocks.TYPE, 1, 1, False, 100)
    with caplog.at_level(logging.ERROR, logger="service.front"):
        env.pump()
    assert "error handling a client message" in caplog.text
    # The next message was still handled.
    assert client.recv()[:2] == [ipc.Grant.TYPE, 1]


def test_exception_from_the_core_does_not_escape(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def append(batch: ProducerBatch) -> None:
        raise RuntimeError("the accumulator is broken")

    monkeypatch.setattr(env.front.seals, "append", append)
    client = env.client()
    client.hello()
    client.blocks(1)
    client.publish(notice())
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert len(env.front.sessions) == 1
    # The batch that could not be queued failed: its records are reported, and its block is free again.
    env.front.serve_due()
    [report] = deliveries(client)
    assert report[:4] == [1, 0, 1, -1]
    failure = ipc.error_from_wire(report[5])
    assert failure is not None and "could not queue the batch: the accumulator is broken" in str(failure)
    assert env.pool.free_blocks == BLOCKS


def test_closed_core_fails_sealed_batches_at_once(env: Env) -> None:
    client = env.client()
    client.hello()
    client.blocks(1, contiguous=True)
    env.core.close(0)
    client.publish(notice(batch_id=3))
    env.front.serve_due()
    [[batch_id, _, _, _, _, error]] = deliveries(client)
    assert batch_id == 3 and "closed" in str(ipc.error_from_wire(error))
    assert env.pool.free_blocks == BLOCKS


# -- bounds ---------------------------------------------------------------------------------------


def test_one_turn_handles_a_bounded_number_of_messages(env: Env) -> None:
    # Many clients' messages: each turn takes at most MAX_MESSAGES_PER_ITERATION, the rest the next turn.
    clients = [env.client() for _ in range(20)]
    for client in clients:
        for _ in range(60):
            client.sock.send(b"garbage")  # inproc: all of them are waiting before the front looks
    env.pump()
    assert env.front.refusals.messages_refused == MAX_MESSAGES_PER_ITERATION
    env.pump()
    assert env.front.refusals.messages_refused == 1200


def test_a_flooding_client_gets_a_bounded_share_of_a_turn(env: Env) -> None:
    # A client that floods the front does not keep the loop from the brokers and the other clients: its
    # messages and theirs are read in turn, and the turn ends after MAX_MESSAGES_PER_CLIENT_PER_ITERATION of its.
    flood, quiet = env.client(), env.client()
    quiet.hello()
    for _ in range(500):
        flood.sock.send(b"garbage")
    quiet.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert env.front.refusals.messages_refused == MAX_MESSAGES_PER_CLIENT_PER_ITERATION
    assert "t" in env.core.metadata.topics()  # the quiet client's message was handled in the same turn
    env.pump()
    assert env.front.refusals.messages_refused == 2 * MAX_MESSAGES_PER_CLIENT_PER_ITERATION


def test_a_client_sends_a_bounded_number_of_messages_ahead_of_the_front(env: Env) -> None:
    # What the daemon holds of a flooding client's messages is bounded: past them, the client's sends wait.
    flood = env.context.socket(zmq.DEALER)
    try:
        flood.setsockopt(zmq.SNDHWM, 1)
        flood.connect(env.endpoint)
        sent = 0
        with pytest.raises(zmq.Again):
            while True:
                flood.send(b"garbage", zmq.NOBLOCK)
                sent += 1
        assert 100 <= sent <= 110  # inproc: the front's receive high-water mark, and the client's one
        env.pump()
        assert flood.poll(HANG_S * 1000, zmq.POLLOUT)  # read: it may send again
    finally:
        flood.close(linger=0)


def test_the_largest_message_is_what_a_client_may_hand_back(env: Env) -> None:
    largest = max_message_size(env.pool.max_blocks_per_process)
    assert env.pool.max_blocks_per_process == BLOCKS and env.front.endpoint.socket.getsockopt(zmq.MAXMSGSIZE) == largest
    # A HELLO handing back a batch in every block a client may hold, each of the longest topic name, fits.
    notices = [ipc.SealNotice._make(notice(batch_id=2**62 + n, first=n, topic="t" * 249, base_ts=2**62, max_ts=2**62,
                                           ago=2**39)) for n in range(BLOCKS)]
    resume = ipc.Resume("f" * 16, 2**62, BLOCK, BLOCKS, notices)
    hello = ipc.Hello(PROTOCOL_VERSION, 2**31, "c" * 200, ipc.HelloOptions(resume=resume))
    assert len(ipc.encode(hello)) < largest
