"""The memory handshake: where each session's client proves its process and gets its segment, or hands back the
segment of a session it takes back.

A client connects to the memory socket and sends the token of its WELCOME; the kernel names
its process (SO_PEERCRED), which the per-process quotas then hold to its share. A new session
gets a new segment; one that takes a session back hands over that session's segment, whose
blocks of batches sealed and not reported are the client's again (and are sealed anew). The
connection stays open for the session's life: its end is the end of the client's process.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

from client_stub.contract import ipc
from client_stub.contract.shared_memory import UNKNOWN_TOKEN, hung_up

from .. import memory_socket
from ..buffer_pool import BufferPool
from ..client_error import ClientError
from ..memory_socket import MemorySocket
from ..poller import POLLIN, Poller
from .checks import is_int, notice_fields
from .quotas import ProcessQuotas
from .refusals import Refusals
from .sessions import ClientSession, SessionState, SessionTable

log = logging.getLogger(__name__)

# A connection to the memory socket that has not sent its token within this long is closed (and a session whose
# client has not made its memory handshake within this long after its WELCOME ends).
HANDSHAKE_TIMEOUT_MS = 10_000
# After the memory socket could not accept a connection (out of file descriptors), it waits this long.
_ACCEPT_PAUSE_MS = 1000


class MemoryHandshakes:
    """The memory socket's connections: those awaiting their token, and those of sessions (until they end)."""

    def __init__(self, memory: MemorySocket, poller: Poller, sessions: SessionTable, pool: BufferPool,
                 quotas: ProcessQuotas, refusals: Refusals, daemon_id: str, clock: Callable[[], int], *,
                 attached: Callable[[ClientSession], None], refused: Callable[[ClientSession], None],
                 gone: Callable[[ClientSession], None]) -> None:
        """``attached``: a session's client has its segment (its resumed notices are the caller's to seal);
        ``refused``: a session's handshake was refused (the caller ends it); ``gone``: the process of a session,
        live or kept, is gone."""
        self.memory = memory
        self.poller = poller
        self.sessions = sessions
        self.pool = pool
        self.quotas = quotas
        self.refusals = refusals
        self.daemon_id = daemon_id
        self.clock = clock
        self._attached = attached
        self._refused = refused
        self._gone = gone
        # Connections awaiting their token, each until when.
        self._pending: dict[socket.socket, int] = {}
        self._accept_paused_until: int | None = None
        poller.register(memory.listener, POLLIN, self._accept, later=True)

    # -- at HELLO --------------------------------------------------------------------------------

    def resumable(self, raw: Any) -> ipc.Resume | None:
        """The session a HELLO offers back, if this daemon can take it; None (logged) if not."""
        if not isinstance(raw, list) or len(raw) != len(ipc.Resume._fields):
            reason = f"a resumed session has the fields {', '.join(ipc.Resume._fields)}"
        else:
            resume = ipc.Resume._make(raw)
            if resume.daemon_id == self.daemon_id and not (is_int(resume.client_id)
                                                           and self.sessions.kept_session(resume.client_id)):
                # This daemon ended the session itself, and sent what it had of it, or has forgotten it.
                reason = "its session was this daemon's, which ended it and kept nothing of it"
            elif (resume.block_size, resume.block_count) != (self.pool.block_size, self.pool.block_count):
                reason = (f"its segment has {resume.block_count} blocks of {resume.block_size} bytes, this "
                          f"daemon's pool {self.pool.block_count} of {self.pool.block_size}")
            elif not isinstance(resume.sealed, list):
                reason = "sealed is a list of seal notices"
            else:
                return resume
        log.warning("a client's session cannot be resumed: %s; what it held is failed as unknown", reason)
        return None

    def claimed_client_id(self, resume: ipc.Resume | None) -> int | None:
        """The client id of the kept session a resume claims, if it claims one of this daemon's."""
        return resume.client_id if resume is not None and resume.daemon_id == self.daemon_id else None

    # -- the memory socket -----------------------------------------------------------------------

    def _accept(self, events: int) -> None:
        accepted, failed = self.memory.accept_all()
        deadline = self.clock() + HANDSHAKE_TIMEOUT_MS
        for conn in accepted:
            self._pending[conn] = deadline
            self.poller.register(conn, POLLIN, partial(self._read_token, conn), later=True)
        if failed:
            # Out of file descriptors, say: the listener would stay readable, and the loop spin.
            log.error("the memory socket cannot accept connections: %s; pausing %d ms", failed, _ACCEPT_PAUSE_MS)
            self.poller.unregister(self.memory.listener)
            self._accept_paused_until = self.clock() + _ACCEPT_PAUSE_MS

    def _read_token(self, conn: socket.socket, events: int) -> None:
        """A client's token, and the segment it hands over if it takes a session back."""
        try:
            received = memory_socket.read_token(conn)
        except ClientError as exc:
            self.refusals.count(f"memory socket: {exc}")
            self._close(conn)
            return
        if received is None:
            return
        token, fds = received
        segment = None
        try:
            session = self.sessions.take_token(token)
            if session is None:
                memory_socket.refuse(conn, UNKNOWN_TOKEN)
                self._close(conn)
                return
            # The kernel's word for the process, whatever the client said in its HELLO.
            session.pid, session.uid, _ = memory_socket.peer_credentials(conn)
            try:
                if session.pid == 0:
                    # The kernel names a process of a pid namespace the daemon cannot see 0: all such clients
                    # would be one process to the per-process limits.
                    raise ClientError("the daemon cannot see this process (pid 0 in its pid namespace): run the "
                                      "daemon in the host's pid namespace (Kubernetes: hostPID: true; docker: "
                                      "--pid host)")
                self.quotas.check_sessions(session)
                segment = self._hand_over_segment(session, fds)
            except (ClientError, OSError) as exc:
                memory_socket.refuse(conn, str(exc))
                self._close(conn)
                self._refused(session)
                return
            del self._pending[conn]
            claimed = self.sessions.attach(session, conn)
            if claimed is not None and claimed.connection is not None:
                self.close(claimed.connection)
                claimed.connection = None
            self.poller.register(conn, POLLIN, partial(self._hung_up, session), later=True)
            memory_socket.answer(conn, segment)
        finally:
            for fd in [*fds, *([] if segment is None else [segment])]:
                os.close(fd)
        log.info("%s connected%s", session.describe(), ", resuming its session" if session.resume is not None else "")
        self._attached(session)

    def _hung_up(self, session: ClientSession, events: int) -> None:
        assert session.connection is not None
        if hung_up(session.connection):
            self._gone(session)

    def expire(self, now: int) -> None:
        """Close the connections that sent no token in time; accept again after a pause."""
        for conn, until in list(self._pending.items()):
            if until <= now:
                self._close(conn)
        if self._accept_paused_until is not None and self._accept_paused_until <= now:
            self._accept_paused_until = None
            self.poller.register(self.memory.listener, POLLIN, self._accept, later=True)

    def due_in_ms(self, now: int) -> list[int]:
        """When the connections and the pause need the loop next."""
        due = [until - now for until in self._pending.values()]
        if self._accept_paused_until is not None:
            due.append(self._accept_paused_until - now)
        return due

    def close(self, conn: socket.socket) -> None:
        """Close a session's connection (the client reads its end)."""
        self.poller.unregister(conn)
        conn.close()

    def stop(self) -> None:
        """Accept no connection and read none any more (the daemon is about to close)."""
        self._accept_paused_until = None
        self.poller.unregister(self.memory.listener)
        for conn in [*self._pending, *(s.connection for s in self.sessions.attached() if s.connection is not None)]:
            self.poller.unregister(conn)

    def close_all(self) -> None:
        """Close every connection: each client reads the end of its session."""
        self.stop()
        for conn in list(self._pending):
            self._close(conn)
        for session in self.sessions.attached():
            if session.connection is not None:
                self.close(session.connection)
                session.connection = None

    def _close(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        self.close(conn)

    # -- the segment -----------------------------------------------------------------------------

    def _hand_over_segment(self, session: ClientSession, fds: list[int]) -> int | None:
        """The new segment's file descriptor, or None once the segment of a resumed session is taken back."""
        if session.resume is None:
            if fds:
                raise ClientError("a segment was handed over, but the session does not resume one")
            return self.pool.attach(session.client_id, session.pid)
        if len(fds) != 1:
            raise ClientError("a resumed session hands over its segment")
        kept = None
        if session.state is SessionState.CLAIMING:
            kept = self.sessions.kept_session(session.client_id)
            if kept is None:
                raise ClientError("this daemon keeps that session no more: another took it back, or its process is "
                                  "gone")
            if kept.pid != session.pid:
                raise ClientError(f"that session was process {kept.pid}'s")
            # A session this daemon ended: of the batches the client says it sealed, those it got (in flight, or
            # reported to the session and kept) are not sealed again.
            known = {*kept.unreported, *(report.batch_id for report in kept.reports)}
            session.resume = session.resume._replace(sealed=[
                notice for notice in session.resume.sealed if not self._known(notice, known)])
        owned = self._owned_blocks(session, session.resume.sealed)
        if kept is None:
            self.pool.adopt(session.client_id, fds[0], owned, session.pid)
        else:
            # Holding the segment proves the claim: then the reports kept, and those to come, are its.
            self.pool.reattach(session.client_id, fds[0], owned)
            session.reports, session.unreported = kept.reports, kept.unreported
        return None

    @staticmethod
    def _known(notice: Any, batch_ids: set[int]) -> bool:
        """Whether a notice names one of ``batch_ids`` (one that does not name a batch plainly is sealed, and
        refused, as any other)."""
        batch_id = notice_fields(notice).get("batch_id")
        return is_int(batch_id) and batch_id in batch_ids

    def _owned_blocks(self, session: ClientSession, sealed: list[Any]) -> list[int]:
        """The blocks of a resumed session's sealed batches, which are the client's again, up to what its process
        may hold. Each notice is checked when it is sealed (a bad one, or one past the limit, fails its batch
        only): here its blocks count if it names them plainly, once."""
        owned: dict[int, None] = {}
        room = self.pool.max_blocks_per_process - self.pool.held_by_process(session.pid)
        for notice in sealed:
            fields = notice_fields(notice)
            first, count = fields.get("first_block"), fields.get("block_count")
            if not (is_int(first) and is_int(count) and first >= 0 and 0 < count <= self.pool.block_count - first):
                continue
            blocks = dict.fromkeys(b for b in range(first, first + count) if b not in owned)
            if len(owned) + len(blocks) > room:
                break
            owned.update(blocks)
        return list(owned)
