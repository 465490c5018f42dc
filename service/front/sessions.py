"""Client sessions: one per application process (or forked child) connected to the daemon, each in one state.

A session begins with a HELLO, AWAITING_HANDSHAKE until its client proves its process over
the memory socket and gets its segment; then it is ATTACHED. A HELLO that offers back a
session this daemon ended and KEPT for its client (it was silent, or read its replies too
slowly) is CLAIMING it until its memory handshake hands over that session's segment, which
proves the claim. A session ends for good, or is KEPT: its batches are still reported to it,
and its segment kept, until its client takes it back or its process is gone.
"""

from __future__ import annotations

import enum
import socket
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from client_stub.contract import ipc


class SessionState(enum.Enum):
    """Where a session is in its life (see the module's docstring)."""

    AWAITING_HANDSHAKE = "awaiting its memory handshake"
    # Awaiting its memory handshake too, which must hand over the segment of the kept session it claims.
    CLAIMING = "claiming a kept session"
    ATTACHED = "attached"
    KEPT = "kept"
    ENDED = "ended"


@dataclass(eq=False, slots=True)
class ClientSession:
    """One application process (or forked child) connected to the daemon."""

    identity: bytes
    client_id: int
    pid: int
    name: str
    last_seen_ms: int
    # Its segment comes over the memory socket with this token (once), by this time or the session ends.
    token: bytes = b""
    handshake_deadline_ms: int = 0
    state: SessionState = SessionState.AWAITING_HANDSHAKE
    # A session of a daemon that is gone (or kept by this one), to be taken back at the memory handshake.
    resume: ipc.Resume | None = None
    # Its connection to the memory socket, once it has its segment: the end of it is the end of the process.
    connection: socket.socket | None = None
    # Whether the client waits on through a topic's retriable metadata error (older clients fail at once).
    retriable_topic_errors: bool = False
    # Whether it answers SHUTDOWN with its LASTSEAL (older clients do not), and whether it has.
    shutdown_notice: bool = False
    last_sealed: bool = False
    uid: int = -1
    reports: list[ipc.DeliveryReport] = field(default_factory=list)
    # When its last DELIVERY went (the front's clock).
    reported_ms: int = -(2**62)
    # The topics it follows, each with what it was last told of it (see TopicUpdates).
    topics: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # The topics by the session's number for each, which its batch slots name them by (see TopicUpdates).
    topic_names: list[str] = field(default_factory=list)
    # Batches it sealed that are not wholly reported: batch id -> records not reported yet.
    unreported: dict[int, int] = field(default_factory=dict)
    # Replies ZeroMQ would not queue (the client reads slower than the daemon answers), in order, encoded.
    waiting: deque[tuple[ipc.Message, bytes]] = field(default_factory=deque)
    waiting_bytes: int = 0

    def describe(self) -> str:
        """The client as a log line names it: the kernel's pid and uid (once known), and its own name."""
        return f"client {self.client_id} (pid {self.pid}, uid {self.uid}, {self.name!r})"

    @property
    def attached(self) -> bool:
        """Whether its client has its segment, in a live session."""
        return self.state is SessionState.ATTACHED


class SessionTable:
    """Every session of the daemon, live (by its client's ZeroMQ identity) or kept, and by client id the one
    that client id's batches are reported to."""

    def __init__(self) -> None:
        self._live: dict[bytes, ClientSession] = {}
        # The session each client id belongs to: a live one, or a kept one (a claim is no owner till proven).
        self._owners: dict[int, ClientSession] = {}
        # Sessions awaiting their memory handshake, by the token it must bring.
        self._tokens: dict[bytes, ClientSession] = {}
        self._next_client_id = 1

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[ClientSession]:
        """The live sessions (a copy: the caller may end them)."""
        return iter(list(self._live.values()))

    def get(self, identity: bytes) -> ClientSession | None:
        """The live session of a ZeroMQ identity."""
        return self._live.get(identity)

    def is_live(self, session: ClientSession) -> bool:
        """Whether ``session`` is still its identity's live session (a handler may hold one that ended)."""
        return self._live.get(session.identity) is session

    def owner(self, client_id: int) -> ClientSession | None:
        """The session, live or kept, a client id's reports go to."""
        return self._owners.get(client_id)

    def kept(self) -> list[ClientSession]:
        """The kept sessions."""
        return [s for s in self._owners.values() if s.state is SessionState.KEPT]

    def kept_session(self, client_id: int) -> ClientSession | None:
        """The kept session of a client id, if this daemon keeps one."""
        owner = self._owners.get(client_id)
        return owner if owner is not None and owner.state is SessionState.KEPT else None

    def attached(self) -> list[ClientSession]:
        """The sessions whose clients have their segments, kept ones included: each holds a memory connection."""
        return [s for s in self._owners.values() if s.connection is not None]

    def has_process(self, pid: int) -> bool:
        """Whether a session with a segment, kept ones included, is of process ``pid``."""
        return any(s.pid == pid for s in self.attached())

    def awaiting_handshake(self) -> int:
        """How many sessions wait for their memory handshake."""
        return len(self._tokens)

    def open(self, session: ClientSession, claimed: int | None = None) -> None:
        """Add a new live session (replacing none: the caller ends its identity's first): CLAIMING the kept
        session of client id ``claimed``, or AWAITING_HANDSHAKE with a client id of its own."""
        if claimed is None:
            session.client_id = self._next_client_id
            self._next_client_id += 1
            session.state = SessionState.AWAITING_HANDSHAKE
            self._owners[session.client_id] = session
        else:
            session.client_id = claimed
            session.state = SessionState.CLAIMING
        self._live[session.identity] = session
        self._tokens[session.token] = session

    def take_token(self, token: bytes) -> ClientSession | None:
        """The session a memory handshake's token is for (good once)."""
        return self._tokens.pop(token, None)

    def attach(self, session: ClientSession, connection: socket.socket) -> ClientSession | None:
        """The session's client proved its process and has its segment; returns the kept session it took
        back, if it claimed one (which it replaces)."""
        claimed = None
        if session.state is SessionState.CLAIMING:
            claimed = self._owners[session.client_id]
            claimed.state = SessionState.ENDED
            self._owners[session.client_id] = session
        session.state = SessionState.ATTACHED
        session.connection = connection
        return claimed

    def end(self, session: ClientSession, *, keep: bool = False) -> bool:
        """Take a live session out: KEPT for its client if ``keep`` and it is ATTACHED, else ENDED. Returns
        whether it owned its client id (a claim that was not proven owns nothing, and leaves the kept session it
        claimed as it is)."""
        del self._live[session.identity]
        self._tokens.pop(session.token, None)
        claiming = session.state is SessionState.CLAIMING
        if keep and session.state is SessionState.ATTACHED:
            session.state = SessionState.KEPT
            return True
        session.state = SessionState.ENDED
        if not claiming and self._owners.get(session.client_id) is session:
            del self._owners[session.client_id]
        return not claiming

    def forget(self, session: ClientSession) -> None:
        """A kept session goes: its process is gone."""
        session.state = SessionState.ENDED
        if self._owners.get(session.client_id) is session:
            del self._owners[session.client_id]
