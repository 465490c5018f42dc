"""Replies to clients that read slowly: they wait in order, up to a bound, then the session ends, kept."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import zmq

from client_stub.contract import ipc
from service.buffer_pool import FREE
from tests.support.front import (
    Client,
    Env,
    deliveries,
    notice,
    resume_of,
)

# -- replies a client does not read ----------------------------------------------------------------


def _refused_requests(client: Client, count: int) -> None:
    """``count`` BLOCKS requests the daemon refuses: each gets two replies, an ERROR and a GRANT_FAILED."""
    refused = client.env.front.refusals.messages_refused + count
    for n in range(count):
        client.send(ipc.Blocks.TYPE, 1000 + n, 0, False, 1000)
    while client.env.front.refusals.messages_refused < refused:
        client.env.pump()  # a turn handles a bounded number of one client's messages


def _read_all(env: Env, client: Client) -> list[list[Any]]:
    """What the daemon sends the client while the client reads, the front retrying what waits."""
    messages = []
    while True:
        while client.sock.poll(20):
            messages.append(ipc.unpack(client.sock.recv()))
        if not env.sidecar_metrics()["reply-buffer-bytes"]:
            return messages
        env.front.serve_due()


def test_replies_zeromq_will_not_queue_wait_for_the_client_in_order(env: Env) -> None:
    client = env.client(receive_hwm=1)
    client.hello()
    _refused_requests(client, 300)  # 600 replies: more than ZeroMQ queues for one client
    assert env.sidecar_metrics()["reply-buffer-bytes"] > 0
    assert env.front.next_timer_ms() <= 10  # the loop comes back for them
    messages = _read_all(env, client)
    assert [m[1] for m in messages if m[0] == ipc.GrantFailed.TYPE] == list(range(1000, 1300))
    assert sum(m[0] == ipc.Error.TYPE for m in messages) == 300
    assert env.sidecar_metrics()["replies-dropped-total"] == 0 and len(env.front.sessions) == 1


def test_an_error_quotes_at_most_a_few_hundred_characters_of_what_it_refuses(env: Env) -> None:
    client = env.client()
    client.hello()
    client.send(ipc.Blocks.TYPE, 1, "x" * 10_000, False, 1000)
    env.pump()
    text = client.error()
    assert "count must be an integer" in text and len(text) <= 400


def test_a_client_that_does_not_read_is_ended_past_its_reply_buffer_and_takes_its_session_back(
        caplog: pytest.LogCaptureFixture) -> None:
    with Env(reply_buffer_bytes=65536) as env:
        client, other = env.client(receive_hwm=1, own_process=False), env.client()
        client_id = client.hello()
        other.hello()
        assert client.blocks(2, contiguous=True) == [0, 1]
        assert client.segment is not None and client.fd is not None
        client.segment.blocks(0)[:100] = b"a" * 100
        client.publish(notice(batch_id=1, first=0))
        pid = env.session(client_id).pid
        with caplog.at_level(logging.WARNING, logger="service.front"):
            for _ in range(20):
                if not env.front.sessions.get(client.sock.getsockopt(zmq.ROUTING_ID)) and client.memory_ended():
                    break
                _refused_requests(client, 200)
        # Its session ended, and the log says which process did not read; the other client is served.
        assert client.memory_ended()
        assert [s.client_id for s in env.front.sessions] == [other.client_id]
        assert f"client {client_id} (pid {pid}, uid {os.getuid()}" in caplog.text
        assert "does not read its replies" in caplog.text
        stats = env.sidecar_metrics()
        assert (stats["sessions-ended-unread-total"], stats["sessions-kept"], stats["reply-buffer-bytes"]) == (1, 1, 0)
        # Its block granted and unused is the pool's again; its claimed batch is sent, its report kept.
        assert env.state(client_id, 1) == FREE and env.pool.held_by(client_id) == 1
        [batch] = env.queued()
        batch.done(41, -1, None)
        env.front.serve_due()
        while client.sock.poll(20):
            client.sock.recv()  # what ZeroMQ had queued for it before its session ended
        # It wrote a second batch (in its block 1) after the daemon claimed what it had published, as its session
        # ended: the daemon never got it.
        client.segment.blocks(1)[:100] = b"b" * 100
        sealed = [notice(batch_id=1, first=0), notice(batch_id=2, first=1)]
        assert client.hello(hand_over=client.fd, **resume_of(env.front.daemon_id, sealed, client_id=client_id)) \
            == client_id
        assert client.welcome is not None and client.welcome.resumed
        # Batch 1 is not sent again (its report is kept); batch 2 is taken now, from the same segment.
        assert [(b.origin, bytes(b.records)) for b in env.queued() if not b.is_done] == [((client_id, 2), b"b" * 100)]
        env.front.serve_due()
        assert deliveries(client) == [[1, 0, 1, 41, -1, None]]
        assert env.sidecar_metrics()["sessions-kept"] == 0 and env.pool.held_by(client_id) == 1


def test_an_answer_to_a_socket_without_a_session_that_zeromq_will_not_take_is_dropped_and_counted(env: Env) -> None:
    stranger = env.client(receive_hwm=1)
    for _ in range(400):
        stranger.send(ipc.Heartbeat.TYPE)  # each refused: "send HELLO first"
    while env.front.refusals.messages_refused < 400:
        env.pump()
    assert env.sidecar_metrics()["replies-dropped-total"] > 0
    assert env.sidecar_metrics()["messages-refused-total"] == 400
