"""Per-process quotas: sessions and topics of one process, whatever the number of its sessions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from client_stub import errors
from client_stub.contract import ipc
from client_stub.contract.shared_memory import ERR
from tests.support.front import (
    Env,
    ended,
    metadata_response,
    notice,
)


@contextmanager
def topic_limits(limit: int, unknown_limit: int | None = None) -> Iterator[Env]:
    """A daemon whose processes may follow ``limit`` topics, ``unknown_limit`` the cluster does not have."""
    with Env(sidecar_process_max_topics=limit, sidecar_process_max_unknown_topics=unknown_limit or limit) as env:
        yield env


def test_a_process_produces_to_a_limited_number_of_topics() -> None:
    with topic_limits(5) as env:
        client = env.client(own_process=False)
        client.hello()
        for n in range(5):
            client.send(ipc.Metadata.TYPE, f"topic-{n}")
        env.pump()
        assert client.quiet()
        client.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert "a process may produce to at most 5 topics (sidecar.process.max.topics)" in client.error()
        # The client's send() waits for the topic: it learns at once that it will not come, and that the session
        # has no number for it.
        kind, topic, count, available, error, index = client.recv()
        assert (kind, topic, count, available, index) == (ipc.Topic.TYPE, "one-too-many", None, [], -1)
        failure = ipc.error_from_wire(error)
        assert isinstance(failure, errors.InvalidRequestError) and "at most" in str(failure)
        assert "one-too-many" not in env.core.metadata.topics()
        # Nor can a batch name another topic: a slot names a topic by the session's number for it, and the
        # number of none is no topic (the publish follows the topic first, refused again).
        client.blocks(2, contiguous=True)
        client.publish(notice(batch_id=1, first=0, topic="one-too-many"), notice(batch_id=2, first=1, topic="topic-3"))
        assert "at most" in client.error() and client.recv()[-1] == -1
        assert "batch refused: no topic is number 4294967295 of this session: it follows 5" in client.error()
        assert env.queued("one-too-many") == [] and len(env.queued("topic-3")) == 1
        assert "one-too-many" not in env.core.metadata.topics()
        # Asking again for a topic it has is no new topic; another session of the same process shares its
        # topics (following one of them is none new); another process counts its own.
        client.send(ipc.Metadata.TYPE, "topic-3")
        env.pump()
        assert client.quiet()
        same, other = env.client(own_process=False), env.client()
        same.hello()
        other.hello()
        same.send(ipc.Metadata.TYPE, "topic-4")
        same.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert "at most 5 topics" in same.error()
        other.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert other.quiet() and "one-too-many" in env.core.metadata.topics()
        # A session that ends gives back the topics only it followed.
        client.send(ipc.Goodbye.TYPE)
        env.pump()
        same.send(ipc.Metadata.TYPE, "a-new-one")
        env.pump()
        assert same.recv()[0] != ipc.Error.TYPE  # topic-0..3 went with the client; topic-4 stays the same's


def test_a_process_waits_for_a_limited_number_of_topics_the_cluster_does_not_have() -> None:
    with topic_limits(100, unknown_limit=3) as env:
        client = env.client()
        client.hello()
        for name in ("a", "b", "c"):
            client.send(ipc.Metadata.TYPE, name)
        env.pump()
        assert client.quiet()
        client.send(ipc.Metadata.TYPE, "d")
        env.pump()
        assert "wait for at most 3 topics the cluster does not have" in client.error()
        assert client.recv()[:3] == [ipc.Topic.TYPE, "d", None]  # its send() fails at once
        # Once the cluster has one of them, another may be asked for.
        env.core.metadata.update(metadata_response({"a": [0]}), env.clock())
        env.front.serve_due()
        assert client.recv()[:3] == [ipc.Topic.TYPE, "a", 1]
        client.send(ipc.Metadata.TYPE, "d")
        env.pump()
        assert client.quiet() and "d" in env.core.metadata.topics()


def test_a_process_has_a_limited_number_of_sessions() -> None:
    with Env(sidecar_process_max_sessions=2) as env:
        first, second, third = (env.client(own_process=False) for _ in range(3))
        elsewhere = env.client()
        first.hello()
        second.hello()
        third.hello(handshake=False)
        assert third.welcome is not None
        conn, answer, _ = env.handshake(third.welcome.memory_token, own_process=False)
        assert answer.startswith(ERR) and b"has 2 sessions, as many as sidecar.process.max.sessions" in answer
        assert ended(conn) and len(env.front.sessions) == 2
        elsewhere.hello()  # another process
        # A session that ends makes room.
        first.send(ipc.Goodbye.TYPE)
        env.pump()
        third.hello()
        assert len(env.front.sessions) == 3


def test_the_sessions_of_a_process_share_its_blocks() -> None:
    with Env(max_blocks_per_process=4) as env:
        a, b, elsewhere = env.client(own_process=False), env.client(own_process=False), env.client()
        a.hello()
        b.hello()
        elsewhere.hello()
        assert len(a.blocks(3)) == 3
        assert len(b.blocks(3)) == 1  # what is left of the process's share
        assert len(elsewhere.blocks(3)) == 3  # another process has its own
        assert env.pool.held_by_process(os.getpid()) == 4
