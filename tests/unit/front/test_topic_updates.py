"""Topics: each client is told of the topics it follows, and again when the metadata changes."""

from __future__ import annotations

from client_stub import errors
from client_stub.contract import ipc
from tests.support.front import (
    Env,
    metadata_response,
)

# -- metadata -------------------------------------------------------------------------------------


def test_topic_pushed_when_metadata_knows_it(env: Env) -> None:
    client, other = env.client(), env.client()
    client.hello()
    other.hello()
    env.front.serve_due()
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert client.quiet()  # not known yet
    assert "t" in env.core.metadata.topics() and env.core.metadata.update_requested
    env.core.metadata.update(metadata_response({"t": [1, 1, -1]}), env.clock())
    env.front.serve_due()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1], None, 0]
    assert other.quiet()  # it did not ask
    # The same again: nothing new to say.
    env.core.metadata.update(metadata_response({"t": [1, 1, -1]}), env.clock())
    env.front.serve_due()
    assert client.quiet()
    # A leader appears.
    env.core.metadata.update(metadata_response({"t": [1, 1, 1]}), env.clock())
    env.front.serve_due()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None, 0]
    # Asking for a known topic is answered at once.
    other.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert other.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None, 0]


def test_topic_errors_pushed_final_and_retriable(env: Env) -> None:
    client = env.client()
    client.hello(retriable_topic_errors=True)
    older = env.client()
    older.hello()  # a client from before retriable errors were pushed: it would fail on one at once
    for each in (client, older):
        each.send(ipc.Metadata.TYPE, "secret")
        each.send(ipc.Metadata.TYPE, "coming")
    env.pump()
    env.core.metadata.update(metadata_response({}, {"secret": 29, "coming": 3}), env.clock())
    env.front.serve_due()
    for each in (client, older):
        kind, topic, count, available, error, index = each.recv()
        assert (kind, topic, count, available, index) == (ipc.Topic.TYPE, "secret", None, [], 0)
        failure = ipc.error_from_wire(error)
        assert isinstance(failure, errors.AuthorizationError) and failure.name == "TOPIC_AUTHORIZATION_FAILED"
    # UNKNOWN_TOPIC_OR_PARTITION is retriable: the client keeps waiting, and can name it if it times out.
    kind, topic, count, available, error, index = client.recv()
    assert (kind, topic, count, available, index) == (ipc.Topic.TYPE, "coming", None, [], 1)
    failure = ipc.error_from_wire(error)
    assert failure.retriable and failure.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert client.quiet()
    assert older.quiet()


def test_metadata_of_a_bad_topic_is_refused(env: Env) -> None:
    client = env.client()
    client.hello()
    client.send(ipc.Metadata.TYPE, "a b")
    env.pump()
    assert "invalid topic name" in client.error()
    assert "a b" not in env.core.metadata.topics()


def test_topics_are_followed_after_the_memory_handshake(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False)
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert "after its memory handshake" in client.error()
    assert "t" not in env.core.metadata.topics()


def test_a_topic_carries_the_sessions_number_for_it(env: Env) -> None:
    # A client's batch slots name a topic by its number: the topics of the session, in the order it followed them.
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    env.core.metadata.update(metadata_response({"a": [1], "b": [1, 1]}), env.clock())
    for topic in ("b", "a", "b"):
        client.send(ipc.Metadata.TYPE, topic)
    other.send(ipc.Metadata.TYPE, "a")
    env.pump()
    assert client.recv() == [ipc.Topic.TYPE, "b", 2, [0, 1], None, 0]
    assert client.recv() == [ipc.Topic.TYPE, "a", 1, [0], None, 1]
    assert client.recv() == [ipc.Topic.TYPE, "b", 2, [0, 1], None, 0]  # asked again: by the same number
    assert other.recv() == [ipc.Topic.TYPE, "a", 1, [0], None, 0]  # each session numbers its own
    # A change is told by the same number.
    env.core.metadata.update(metadata_response({"a": [1, 1], "b": [1, 1]}), env.clock())
    env.front.serve_due()
    assert client.recv() == [ipc.Topic.TYPE, "a", 2, [0, 1], None, 1]
    assert env.session(client_id).topic_names == ["b", "a"]
    # A new session numbers its topics anew.
    client.hello()
    client.send(ipc.Metadata.TYPE, "a")
    env.pump()
    assert client.recv() == [ipc.Topic.TYPE, "a", 2, [0, 1], None, 0]
