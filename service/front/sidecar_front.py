"""SidecarFront: the daemon's side of its clients, the parts of the front composed, and the dispatcher on top.

Each client message is read (:mod:`.checks`), then handed to the part it is for: a HELLO
opens a session (:mod:`.sessions`), BLOCKS and RELEASE go to the grants, WAKEUP and LASTSEAL
to the open batches (:mod:`.open_batches`, which claims them from the clients' segments and
hands them to the seals), METADATA to the topic updates; every answer goes out through the
replies.
What a client got wrong is a :class:`~service.client_error.ClientError`: refused, answered,
logged rate-limited, and it never affects another client. Any other exception is a bug:
logged with its traceback, and the loop goes on. After each poll, :meth:`SidecarFront.serve_due`
serves what is due: the open batches that are ready, grants and their expiry, the replies and
reports, sessions past their deadlines, and what changed of the topics the clients follow.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.contract.shared_memory import TOKEN_SIZE

from ..buffer_pool import BufferPool
from ..client_error import ClientError
from ..poller import POLLIN, Poller
from .checks import check_int, clip, is_int, max_message_size, read_message
from .endpoint import Endpoint
from .grants import Grants
from .memory_handshake import HANDSHAKE_TIMEOUT_MS, MemoryHandshakes
from .open_batches import OpenBatches
from .ports import AppendBatch, TopicView
from .quotas import ProcessQuotas
from .refusals import Refusals
from .replies import SEND_HWM, Replies
from .reports import DeliveryReports
from .seals import Seals
from .sessions import ClientSession, SessionState, SessionTable
from .settings import FrontSettings
from .topic_updates import TopicUpdates

log = logging.getLogger(__name__)

# The most client messages one poll's turn handles: the brokers' sockets, timers and reports are served between
# two such turns, however fast any client sends.
MAX_MESSAGES_PER_ITERATION = 1000
# And the most of one client's: ZeroMQ reads its clients in turn, a message of each, so once one client has had
# this many every other that has sent something has had as many, and the loop turns (a flooding client costs the
# others a turn of this many of its messages at most).
MAX_MESSAGES_PER_CLIENT_PER_ITERATION = 64
# Before its memory handshake a session is no process's, so none of the per-process limits holds it: these many
# such sessions at most.
MAX_SESSIONS_AWAITING_HANDSHAKE = 1000
# While replies wait, the loop tries them again this often (ZeroMQ has no event for a client that reads).
_RETRY_WAITING_MS = 10
_NOBLOCK = int(zmq.NOBLOCK)


class SidecarFront:
    """Sessions, block grants, wake-ups and delivery reports over one ROUTER socket; segments and the clients'
    liveness over the memory socket; the clients' batches claimed from their segments."""

    def __init__(self, endpoint: str, pool: BufferPool, settings: FrontSettings, poller: Poller, *,
                 append: AppendBatch, topics: TopicView, stats: Callable[[], dict[str, Any]],
                 clock: Callable[[], int], context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 socket_mode: int = 0o660, socket_group: int | None = None) -> None:
        """``append`` hands a sealed batch to the producer, ``topics`` is the daemon's metadata, ``stats`` what a
        STATS message is answered with."""
        self.pool = pool
        self.settings = settings
        self.poller = poller
        self.clock = clock
        self._stats = stats
        self.daemon_id = secrets.token_hex(8)
        self.endpoint = Endpoint(endpoint, self.daemon_id, max_message_size=max_message_size(
            pool.max_blocks_per_process), send_hwm=SEND_HWM, mode=socket_mode, group=socket_group, context=context)
        self.sessions = SessionTable()
        self.refusals = Refusals()
        self.replies = Replies(self.endpoint.socket, self.sessions, settings.reply_buffer_bytes,
                               lambda session: self.end_session(session, keep=True))
        self.quotas = ProcessQuotas(self.sessions, topics, settings)
        self.reports = DeliveryReports(self.sessions, self.replies, pool)
        self.topic_updates = TopicUpdates(topics, self.sessions, self.quotas, self.replies)
        self.seals = Seals(pool, self.sessions, topics, self.quotas, self.reports, append, settings,
                           lambda session, exc: self._refuse(session.identity, exc))
        self.open_batches = OpenBatches(pool, self.sessions, self.seals, settings.welcome.linger_ms)
        self.grants = Grants(pool, self.sessions, self.replies, self.open_batches.claim_all, self.reports)
        # The ROUTER first: in a turn where a client's last message and the end of its memory connection are both
        # ready (it said GOODBYE, then exited), its message is read first, and its session ends as it asked.
        poller.register(self.endpoint.socket, POLLIN, lambda events: self.handle_readable(), later=True)
        self.handshakes = MemoryHandshakes(self.endpoint.memory, poller, self.sessions, pool, self.quotas,
                                           self.refusals, self.daemon_id, clock, attached=self._attached,
                                           refused=self.end_session, gone=self._gone)
        # Why the daemon is shutting down, once it is: it takes no new session and grants no block.
        self.shutting_down: str | None = None

    def use_settings(self, settings: FrontSettings) -> None:
        """Work with ``settings`` from now on (the configuration was reloaded)."""
        self.settings = self.quotas.settings = self.seals.settings = settings
        self.replies.reply_buffer_bytes = settings.reply_buffer_bytes
        self.open_batches.use_linger(settings.welcome.linger_ms)

    # -- client messages -------------------------------------------------------------------------

    def handle_readable(self) -> None:
        """Handle the messages waiting on the socket, up to MAX_MESSAGES_PER_ITERATION, and up to
        MAX_MESSAGES_PER_CLIENT_PER_ITERATION of one client (ZeroMQ's poll says the socket is readable again
        while some are left)."""
        sock = self.endpoint.socket
        handled: dict[bytes, int] = {}
        for _ in range(MAX_MESSAGES_PER_ITERATION):
            try:
                # Frames, not bytes: a frame says whether more follow without a getsockopt(RCVMORE),
                # which pyzmq turns into an enum lookup per call.
                frame = sock.recv(_NOBLOCK, copy=False)
                frames = [frame.bytes]
                while frame.more:
                    frame = sock.recv(_NOBLOCK, copy=False)
                    frames.append(frame.bytes)
            except zmq.Again:
                return
            try:
                self._dispatch(frames)
            except Exception:
                # A bug met by one client's message must not take the daemon down for all.
                log.exception("error handling a client message")
            count = handled.get(frames[0], 0) + 1
            if count >= MAX_MESSAGES_PER_CLIENT_PER_ITERATION:
                return
            handled[frames[0]] = count

    def _dispatch(self, frames: list[bytes]) -> None:
        identity = frames[0]
        session = self.sessions.get(identity)
        try:
            if len(frames) != 2:
                raise ClientError(f"a message has exactly one frame, got {len(frames) - 1}")
            message = read_message(frames[1], known_client=session is not None)
            if isinstance(message, ipc.Hello):
                self._hello(identity, session, message)
            elif isinstance(message, ipc.Stats):
                self.replies.send(identity, ipc.StatsReport(self._stats()))
            else:
                assert session is not None, "read_message() refuses other messages of unknown clients"
                session.last_seen_ms = self.clock()
                handler = self._HANDLERS.get(type(message))
                if handler is None:
                    raise ClientError(f"{type(message).__name__.upper()} is a message of the daemon's, not a client's")
                handler(self, session, message)
        except ClientError as exc:
            self._refuse(identity, exc)

    def _refuse(self, identity: bytes, exc: ClientError) -> None:
        """Answer a client with why its message was refused (then with what it waits for, if anything), and count
        it."""
        self.refusals.count(str(exc))
        to = self.sessions.get(identity) or identity
        self.replies.send(to, ipc.Error(exc.code, clip(str(exc))))
        if exc.answer is not None:
            self.replies.send(to, exc.answer)

    def _hello(self, identity: bytes, session: ClientSession | None, message: ipc.Hello) -> None:
        if self.shutting_down is not None:
            self.replies.send(identity, ipc.Error(ipc.ERROR_SHUTTING_DOWN,
                                                  f"the daemon is shutting down ({self.shutting_down})"))
            return
        check_int(message.pid, "pid", 1, 2**32)
        if session is not None:
            self.end_session(session)
        if self.sessions.awaiting_handshake() >= MAX_SESSIONS_AWAITING_HANDSHAKE:
            raise ClientError(f"{MAX_SESSIONS_AWAITING_HANDSHAKE} sessions wait for their memory handshake: say "
                              "HELLO again in a while")
        now = self.clock()
        options = message.options
        session = ClientSession(identity, 0, message.pid, str(message.client_name)[:200], now,
                                secrets.token_bytes(TOKEN_SIZE), now + HANDSHAKE_TIMEOUT_MS,
                                retriable_topic_errors=options.retriable_topic_errors is True,
                                shutdown_notice=options.shutdown_notice is True)
        if options.resume is not None:
            session.resume = self.handshakes.resumable(options.resume)
        # A claim of a session this daemon keeps is the client's own once its memory handshake proves it.
        self.sessions.open(session, claimed=self.handshakes.claimed_client_id(session.resume))
        self.replies.send(session, ipc.Welcome(PROTOCOL_VERSION, session.client_id, session.token,
                                               self.pool.block_size, self.pool.block_count, self.settings.welcome,
                                               self.daemon_id, session.resume is not None,
                                               options.hello_id if is_int(options.hello_id) else 0))

    def _blocks(self, session: ClientSession, message: ipc.Blocks) -> None:
        # A client asks for blocks when it has filled those it had: claim them first.
        self.open_batches.wakeup(session, self.clock())
        if self.sessions.is_live(session):
            self.grants.request(session, message, self.clock())

    def _release(self, session: ClientSession, message: ipc.Release) -> None:
        self.grants.release(session, message)

    def _wakeup(self, session: ClientSession, message: ipc.Wakeup) -> None:
        self.open_batches.wakeup(session, self.clock())

    def _last_seal(self, session: ClientSession, message: ipc.LastSeal) -> None:
        self.open_batches.claim_all(session, self.clock())
        session.last_sealed = True

    def _metadata(self, session: ClientSession, message: ipc.Metadata) -> None:
        self.topic_updates.follow(session, message, self.clock())

    def _heartbeat(self, session: ClientSession, message: ipc.Heartbeat) -> None:
        pass  # last_seen_ms is updated for every message

    def _goodbye(self, session: ClientSession, message: ipc.Goodbye) -> None:
        log.info("%s said goodbye", session.describe())
        self.end_session(session)

    _HANDLERS: dict[type[Any], Callable[[SidecarFront, ClientSession, Any], None]] = {
        ipc.Blocks: _blocks, ipc.Release: _release, ipc.Metadata: _metadata, ipc.Heartbeat: _heartbeat,
        ipc.Goodbye: _goodbye, ipc.LastSeal: _last_seal, ipc.Wakeup: _wakeup,
    }

    # -- the sessions' life cycle ----------------------------------------------------------------

    def _attached(self, session: ClientSession) -> None:
        """The session's client has its segment: what it hands back of a lost session is sealed anew."""
        self.open_batches.attached(session)
        if session.resume is not None:
            self.seals.seal(session, session.resume.sealed, self.clock())
            session.resume = None

    def _gone(self, session: ClientSession) -> None:
        """The process of a session, live or kept, is gone."""
        if session.state is SessionState.KEPT:
            log.info("%s, whose session was kept for it, is gone", session.describe())
            self.sessions.forget(session)
            self._close_connection(session)
            self.pool.forget(session.client_id)
            self._forget_process(session.pid)
        else:
            log.warning("%s is gone: ending its session", session.describe())
            self.end_session(session)

    def end_session(self, session: ClientSession, *, keep: bool = False) -> None:
        """Forget a client: what it published is claimed and sent, its other blocks return to the pool.

        Only the pool's count gets the blocks back: they are in the client's own segment, which no other
        client can be given, so a client that is still alive (stopped, starved) and writes into them when
        it wakes up harms nobody else. With ``keep`` (the client may live: it was silent, or did not read),
        the session is kept: the reports of its batches are kept for it, and its segment, which it hands over
        to take the session back when it reads the end of its memory connection; the daemon shuts down its own
        side only, and keeps all this until the client closes the other, when its process is gone.
        """
        if not self.sessions.is_live(session):
            return  # ended already
        if session.attached:
            # A record is safe once send() returned: whatever the client published goes, whatever became of it.
            self.open_batches.claim_all(session, self.clock())
            if not self.sessions.is_live(session):
                return  # ended by a reply it did not take, as its batches were claimed
        self.open_batches.forget(session)
        if not self.sessions.end(session, keep=keep):
            return  # it did not prove its claim: the session it claimed stays kept, or is another's now
        self.quotas.release_topics(session)
        reports = self.replies.take_waiting_reports(session)
        if session.state is SessionState.KEPT:
            assert session.connection is not None
            # The client reads the end of the stream; the daemon, the end of its process (see _gone).
            session.connection.shutdown(socket.SHUT_WR)
            session.reports[:0] = reports
        else:
            self._close_connection(session)
            self._forget_process(session.pid)
        reclaimed = self.pool.detach(session.client_id, keep=session.state is SessionState.KEPT)
        if reclaimed:
            log.info("reclaimed %d unsealed block(s) of client %s", reclaimed, session.client_id)

    def _forget_process(self, pid: int) -> None:
        """Forget what is counted of a process once it has no session left (its pid may be another's next)."""
        if not self.sessions.has_process(pid):
            self.reports.forget_process(pid)
            self.grants.forget_process(pid)

    def _close_connection(self, session: ClientSession) -> None:
        """Close the session's memory connection, if it has one: its client reads the end of its session."""
        if session.connection is not None:
            self.handshakes.close(session.connection)
            session.connection = None

    # -- after each poll -------------------------------------------------------------------------

    def serve_due(self) -> None:
        """Serve what is due after each poll: the open batches that are ready, grants and their expiry, the clients'
        waiting replies and reports, sessions past their deadlines, connections to the memory socket past theirs,
        and what changed of the topics the clients follow."""
        now = self.clock()
        self.open_batches.scan(now)
        self.grants.serve(now)
        for session in self.sessions:
            if session.waiting:
                self.replies.send_waiting(session)
            self.reports.send(session, now)
            self._end_if_overdue(session, now)
        self.handshakes.expire(now)
        self.topic_updates.tell_changes()

    def _end_if_overdue(self, session: ClientSession, now: int) -> None:
        """End a session whose memory handshake is overdue, or keep one whose client has been silent too long."""
        if not self.sessions.is_live(session):
            return  # ended in this turn (its client did not read its replies)
        if not session.attached and session.handshake_deadline_ms <= now:
            # Unbounded otherwise: nothing limits the sessions of a socket that never proves a process.
            log.warning("%s made no memory handshake in %d ms: ending its session", session.describe(),
                        HANDSHAKE_TIMEOUT_MS)
            self.end_session(session)
        elif now - session.last_seen_ms > self.settings.client_timeout_ms:
            # Stopped (SIGSTOP, a debugger) or starved, perhaps, rather than dead: what it sealed is kept.
            log.warning("%s silent for %d ms: ending its session", session.describe(), now - session.last_seen_ms)
            self.end_session(session, keep=True)

    def next_timer_ms(self) -> int:
        """How long the loop may sleep before :meth:`serve_due` has work (waiters, deadlines, waiting replies)."""
        now = self.clock()
        timeout_ms = self.settings.client_timeout_ms
        due = [timeout_ms, *self.grants.due_in_ms(now), *self.handshakes.due_in_ms(now),
               *self.open_batches.due_in_ms(now), *self.reports.due_in_ms(now)]
        for session in self.sessions:
            due.append(session.last_seen_ms + timeout_ms - now)
            if not session.attached:
                due.append(session.handshake_deadline_ms - now)
            if session.waiting:
                due.append(_RETRY_WAITING_MS)
        return max(min(due), 0)

    # -- shutdown --------------------------------------------------------------------------------

    def begin_shutdown(self, reason: str) -> None:
        """Take no new session, grant no more blocks (the requests waiting fail), and tell each client to seal
        what it holds: what it sealed is still taken, sent and reported until :meth:`close`."""
        self.shutting_down = reason
        self.reports.hurry = True
        # SHUTDOWN before the refusals: a client that knows it looks for blocks of the next daemon instead of
        # failing the send() that waited for them.
        for session in self.sessions:
            if not session.attached:
                self.end_session(session)  # it holds nothing yet
            elif session.shutdown_notice:
                self.replies.send(session, ipc.Shutdown(reason))
        self.grants.refuse_all(f"the daemon is shutting down ({reason})")

    def sealed_all(self) -> bool:
        """Whether every client that was told of the shutdown has handed over its last batches (or is gone)."""
        return all(session.last_sealed for session in self.sessions if session.shutdown_notice)

    def replies_pending(self) -> bool:
        """Whether reports or replies wait for a client (ZeroMQ would not take them yet)."""
        return any(session.reports or session.waiting for session in self.sessions)

    def stop_serving(self) -> None:
        """Read nothing more of the clients: what they seal from now on stays theirs, for the next daemon (the
        producer is closing, and would fail it). Replies still go out."""
        self.poller.unregister(self.endpoint.socket)
        self.handshakes.stop()
        self.open_batches.stop()

    def close(self) -> None:
        # The ZeroMQ socket first, lingering: the last reports reach the clients before the memory socket's
        # connections end, which tells each client that the daemon is gone.
        self.poller.unregister(self.endpoint.socket)
        self.endpoint.close_socket()
        self.handshakes.close_all()
        self.endpoint.close()
