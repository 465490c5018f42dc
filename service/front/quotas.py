"""Per-process quotas: what one process may hold of the daemon, whatever the number of its sessions.

A process is what the kernel names at its memory handshake, not what a client says: its
sessions (sidecar.process.max.sessions, those kept for it included), the topics it produces
to (sidecar.process.max.topics: each is in the daemon's metadata requests while followed),
and of those, the topics the cluster does not have that it waits for
(sidecar.process.max.unknown.topics: each may be created on the cluster). Its share of the
BufferPool's blocks is the pool's to keep.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..client_error import ClientError
from .ports import TopicView
from .sessions import ClientSession, SessionState, SessionTable
from .settings import FrontSettings


@dataclass(eq=False, slots=True)
class ProcessTopics:
    """The topics the sessions of one process follow, and those among them the cluster did not have when they
    were first asked for."""

    following: Counter[str] = field(default_factory=Counter)
    unknown: set[str] = field(default_factory=set)


class ProcessQuotas:
    """The sessions and topics of each process, held to the sidecar.process.max.* settings."""

    def __init__(self, sessions: SessionTable, topics: TopicView, settings: FrontSettings) -> None:
        self.sessions = sessions
        self.topics = topics
        self.settings = settings
        self._processes: dict[int, ProcessTopics] = {}

    def check_sessions(self, session: ClientSession) -> None:
        """ClientError if the session's process has as many sessions as it may (those kept for it included, but
        the one it takes back)."""
        limit = self.settings.max_sessions_per_process
        claimed = self.sessions.kept_session(session.client_id) if session.state is SessionState.CLAIMING else None
        if sum(s.pid == session.pid and s is not claimed for s in self.sessions.attached()) >= limit:
            raise ClientError(f"process {session.pid} has {limit} sessions, as many as sidecar.process.max.sessions "
                              "allows")

    def admit_topic(self, session: ClientSession, topic: str) -> None:
        """Count a topic among those the session's process produces to; ClientError past its limits."""
        if topic in session.topics:
            return
        if not session.attached or not self.sessions.is_live(session):
            raise ClientError(f"topic {topic} refused: a client follows topics within a session, after its memory "
                              "handshake")
        process = self._processes.get(session.pid)
        if process is None:
            process = self._processes[session.pid] = ProcessTopics()
        if topic not in process.following:
            limit = self.settings.max_topics_per_process
            if len(process.following) >= limit:
                raise ClientError(f"topic {topic} refused: a process may produce to at most {limit} topics "
                                  "(sidecar.process.max.topics)")
            if self.topics.partition_count(topic) is None:
                # Each is in every metadata request, and may be created on the cluster: a few at a time.
                process.unknown = {name for name in process.unknown if self.topics.partition_count(name) is None}
                limit = self.settings.max_unknown_topics_per_process
                if len(process.unknown) >= limit:
                    raise ClientError(f"topic {topic} refused: a process may wait for at most {limit} topics the "
                                      "cluster does not have (sidecar.process.max.unknown.topics)")
                process.unknown.add(topic)
        process.following[topic] += 1
        session.topics[topic] = ()

    def release_topics(self, session: ClientSession) -> None:
        """The session's topics count no more for its process (its session ended)."""
        process = self._processes.get(session.pid)
        if process is None or not session.topics:
            return
        process.following.subtract(session.topics.keys())
        for topic in session.topics:
            if process.following[topic] <= 0:
                del process.following[topic]
                process.unknown.discard(topic)
                if self.topics.partition_count(topic) is None and \
                        not any(topic in other.following for other in self._processes.values()):
                    # Nobody waits for it: it takes no place among those to fetch and to create.
                    self.topics.remove_topic(topic)
        session.topics = {}
        if not process.following:
            del self._processes[session.pid]
