"""TopicUpdates: each client is told of the topics it follows, and again whenever what it was told changes.

A client asks for a topic's metadata (METADATA) once; the daemon follows the topic from
then on and sends a TOPIC with its partitions, those with a leader, and the error that
keeps the client from sending to it, whenever the metadata changes any of them. Each
TOPIC carries the session's number for the topic, by which the client's batch slots
name it.
"""

from __future__ import annotations

from typing import Any

from client_stub.contract import ipc
from client_stub.errors import InvalidRequestError, error_code

from ..client_error import ClientError
from .checks import check_topic, clip
from .ports import TopicView
from .quotas import ProcessQuotas
from .replies import Replies
from .sessions import ClientSession, SessionTable


class TopicUpdates:
    """What each session was last told of each topic it follows, against the daemon's metadata."""

    def __init__(self, topics: TopicView, sessions: SessionTable, quotas: ProcessQuotas, replies: Replies) -> None:
        self.topics = topics
        self.sessions = sessions
        self.quotas = quotas
        self.replies = replies
        # The metadata the clients were last told of: its version, and why the brokers refuse the daemon if they do.
        self._told: tuple[int, Any] = (-1, None)

    def follow(self, session: ClientSession, message: ipc.Metadata, now: int) -> None:
        """A client asks for a topic's metadata: it is told at once what the daemon has, then of every change."""
        topic = check_topic(message.topic)
        try:
            self.quotas.admit_topic(session, topic)
        except ClientError as exc:
            # The client's send() waits for this topic's metadata: it fails now rather than at its timeout.
            exc.answer = ipc.Topic(topic, None, [], ipc.error_to_wire(InvalidRequestError(clip(str(exc)))), -1)
            raise
        session.topics[topic] = ()  # the state it was last told: none, so it hears the current one now
        if topic not in session.topic_names:
            session.topic_names.append(topic)
        self.topics.add_topic(topic, now)
        if self.topics.partition_count(topic) is None:
            self.topics.request_update()
        self.tell(session, topic)

    def tell_changes(self) -> None:
        """Once the metadata changed: tell every session what changed of the topics it follows."""
        version = (self.topics.update_version, self.topics.authentication_error)
        if version == self._told:
            return
        self._told = version
        for session in self.sessions:
            for topic in list(session.topics):
                self.tell(session, topic)

    def tell(self, session: ClientSession, topic: str) -> None:
        """Send the session a TOPIC if what the metadata says of ``topic`` is not what it was last told."""
        count = self.topics.partition_count(topic)
        error = None
        code = self.topics.topic_error(topic)
        if code is not None and (session.retriable_topic_errors or not error_code(code).retriable):
            # A retriable error (UNKNOWN_TOPIC_OR_PARTITION) keeps the client waiting, and names the cause
            # if the wait times out; a final one fails its send() at once.
            row = error_code(code)
            error = ipc.error_to_wire(row.exception(f"topic {topic}: {row.name}", code=code, name=row.name))
        elif count is None and self.topics.authentication_error is not None:
            # No metadata can come: the brokers refuse the daemon (AuthenticationError, final: send() fails now).
            error = ipc.error_to_wire(self.topics.authentication_error)
        state = (count, tuple(self.topics.available_partitions(topic)), error)
        if state == session.topics.get(topic) or (count is None and error is None):
            return
        session.topics[topic] = state
        self.replies.send(session, ipc.Topic(topic, count, list(state[1]), error, session.topic_names.index(topic)))
