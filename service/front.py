"""SidecarFront: the daemon's side of the clients, where application processes hand batches over.

A ROUTER socket, polled in the daemon's one loop with the broker sockets, and the
memory socket beside it, where each client gets its segment of shared memory and
whose connection tells when the client's process is gone. Each client is a
session: its segment, the blocks granted to it, the batches it sealed that are
not finished, the delivery reports waiting to go back, the topics it follows. A
client whose daemon died hands its session to the next daemon: its segment, and
the batches it sealed that were not reported, which are sent again.
Everything a client sends is checked before it touches the pool or the
accumulator; a malformed or hostile message is logged (rate-limited) and
answered with an error, and never affects another client. A well-formed but
greedy process is held to its share, whatever number of sessions it opens (the
kernel names the process of each, at its memory handshake): the BufferPool's
blocks, and the sidecar.process.max.* settings (sessions, topics, topics the
cluster does not have).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.contract.records import BATCH_HEADER_SIZE
from client_stub.contract.shared_memory import TOKEN_SIZE, UNKNOWN_TOKEN, hung_up, memory_socket_path
from client_stub.errors import InvalidRequestError, KafkaError, error_code

from . import memory_socket
from .buffer_pool import BlockError, BufferPool
from .client_error import ClientError
from .memory_socket import MemorySocket, bind_socket_file
from .metrics import daemon_figures
from .producer.batch import ProducerBatch, TopicPartition
from .producer.core import ProducerCore

log = logging.getLogger(__name__)

# A client asks for at most this long for blocks (its max_block_ms is capped by it).
MAX_BLOCK_WAIT_MS = 3_600_000
# Errors caused by clients are logged at most this often (a flood must not flood the log).
_LOG_INTERVAL_S = 5.0
# A connection to the memory socket that has not sent its token within this long is closed, and a session
# whose client has not made its memory handshake within this long after its WELCOME ends.
_HANDSHAKE_TIMEOUT_MS = 10_000
# After the memory socket could not accept a connection (out of file descriptors), it waits this long.
_ACCEPT_PAUSE_MS = 1000
# How long the last messages to clients may take on shutdown.
_CLOSE_LINGER_MS = 1000
# The most client messages one loop iteration handles: the brokers' sockets, timers and reports are
# served between two such turns, however fast any client sends.
MAX_MESSAGES_PER_ITERATION = 1000
# And the most of one client's: ZeroMQ reads its clients in turn, a message of each, so once one client has had
# this many every other that has sent something has had as many, and the loop turns (a flooding client
# costs the others a turn of this many of its messages at most).
MAX_MESSAGES_PER_CLIENT_PER_ITERATION = 64
# The largest message a client has reason to send is a SEAL or a resumed HELLO naming every block it may
# hold, a notice (its topic name of at most 249 characters, nine integers) for each; ZeroMQ drops the
# connection of a peer that sends a larger one before it is read into memory.
_MESSAGE_OVERHEAD = 4096
_NOTICE_SIZE = 400
# How often to repeat SEAL_NOW while the pool stays exhausted.
_SEAL_NOW_INTERVAL_MS = 50
# ZeroMQ queues at most this many messages for one client; past them, its replies wait in its session, up
# to sidecar.client.reply.buffer.bytes, and past that its session ends. So the memory a client that does not
# read holds is bounded: this many messages of a few KB at most (a DELIVERY of 256 reports is about 10 KB),
# and the session's buffer.
_SEND_HWM = 256
# ZeroMQ reads at most this many messages of one client ahead of the loop (then it stops reading that client's
# connection, whose sends wait): what a flooding client holds of the daemon's memory is this many messages of
# at most max_message_size bytes, and a client's messages are handled within this many of its own.
_RECEIVE_HWM = 100
# Reports in one DELIVERY, and the characters of an error's text (which quotes what was refused): what a
# client can make grow in a reply; every other reply is a few dozen bytes, or a TOPIC's few KB.
_REPORTS_PER_DELIVERY = 256
_MAX_ERROR_TEXT = 400
# While replies wait, the loop tries them again this often (ZeroMQ has no event for a client that reads).
_RETRY_WAITING_MS = 10
# Before its memory handshake a session is no process's, so none of the per-process limits holds it: these
# many such sessions at most, each holding at most this many bytes of replies it does not read.
_MAX_SESSIONS_AWAITING_HANDSHAKE = 1000
_REPLY_BYTES_BEFORE_HANDSHAKE = 65536
# pyzmq's flags are enum.Flag members, whose | runs Python code: once per message here, so plain ints.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)


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
    # A session of a daemon that is gone, to be taken back when the client hands over its segment.
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
    topics: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Batches it sealed that are not wholly reported: batch id -> records not reported yet.
    unreported: dict[int, int] = field(default_factory=dict)
    # Replies ZeroMQ would not queue (the client reads slower than the daemon answers), in order, encoded.
    waiting: deque[tuple[ipc.Message, bytes]] = field(default_factory=deque)
    waiting_bytes: int = 0

    def describe(self) -> str:
        """The client as a log line names it: the kernel's pid and uid (once known), and its own name."""
        return f"client {self.client_id} (pid {self.pid}, uid {self.uid}, {self.name!r})"


@dataclass(eq=False, slots=True)
class ProcessTopics:
    """The topics the sessions of one process follow (each is in the daemon's metadata requests for as long as
    one does), and those among them the cluster did not have when they were first asked for."""

    following: Counter[str] = field(default_factory=Counter)
    unknown: set[str] = field(default_factory=set)


class EndpointInUseError(RuntimeError):
    """Another daemon already serves the endpoint."""


class SidecarFront:
    """Sessions, block grants, seal notices and delivery reports over one ROUTER socket; segments and the
    clients' liveness over the memory socket."""

    def __init__(self, core: ProducerCore, pool: BufferPool, endpoint: str, *, client_timeout_ms: int = 30000,
                 reply_buffer_bytes: int = 8 << 20, context: zmq.Context | None = None, socket_mode: int = 0o660,
                 socket_group: int | None = None) -> None:
        self.core = core
        self.pool = pool
        self.endpoint = endpoint
        self.client_timeout_ms = client_timeout_ms
        self.reply_buffer_bytes = reply_buffer_bytes
        self.clock: Callable[[], int] = core.clock
        self.daemon_id = secrets.token_hex(8)
        self._context = context or zmq.Context()
        self._own_context = context is None
        self._lock_file: int | None = None
        # The socket's directory, if the daemon made it: it goes when the daemon does.
        self._made_directory: str | None = None
        self.max_message_size = max_message_size(pool.max_blocks_per_process)
        group = os.getegid() if socket_group is None else socket_group
        self.socket = self._bind(endpoint, socket_mode, group)
        try:
            self.memory = MemorySocket(memory_socket_path(endpoint, self.daemon_id), socket_mode, group)
        except BaseException:
            self.socket.close(linger=0)
            self._unlock()
            raise
        core.selector.register_external(self.socket)
        core.selector.register_external(self.memory.listener)
        self.sessions: dict[bytes, ClientSession] = {}
        self._by_id: dict[int, ClientSession] = {}
        # Sessions this daemon ended while their clients may live (see _end_session): their reports are kept
        # for them until they take the session back, or their processes are gone.
        self._ended: dict[int, ClientSession] = {}
        self._by_token: dict[bytes, ClientSession] = {}
        # Connections to the memory socket: those awaiting their token (until when), those of sessions.
        self._handshakes: dict[socket.socket, int] = {}
        self._by_connection: dict[socket.socket, ClientSession] = {}
        self._process_topics: dict[int, ProcessTopics] = {}
        self._accept_paused_until: int | None = None
        self._next_client_id = 1
        # The metadata the clients were last told of: its version, and why the brokers refuse the daemon if they do.
        self._metadata_version: tuple[int, KafkaError | None] = (-1, None)
        self._seal_now_sent_ms = 0
        self._last_complaint = 0.0
        self.messages_refused = 0
        # Records of the batches clients sealed (handed off).
        self.records_sealed = 0
        # Records reported delivered and failed, by process, for as long as it has a session (ended sessions'
        # included: a process's figures are counters, which only grow).
        self._process_records: dict[int, list[int]] = {}
        # Answers to a socket without a session that ZeroMQ would not take (its reader is slow or gone).
        self.replies_dropped = 0
        # Sessions ended because their clients did not read their replies, or their sockets went.
        self.sessions_ended_unread = 0
        # Why the daemon is shutting down, once it is: it takes no new session and grants no block.
        self.shutting_down: str | None = None

    # -- socket ----------------------------------------------------------------------------------

    def _bind(self, endpoint: str, mode: int, group: int) -> zmq.Socket:
        path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
        if path is not None:
            directory = os.path.dirname(path) or "."
            if _make_directory(directory, mode, group):
                self._made_directory = directory
            self._lock_file = _lock_endpoint(path)
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, _RECEIVE_HWM)
        sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
        # A reply that cannot be queued raises (EAGAIN at the high-water mark, EHOSTUNREACH for a client whose
        # socket is gone) instead of vanishing: it then waits in its session, or the session ends.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_size)
        try:
            if path is None:
                sock.bind(endpoint)
            else:
                # ZeroMQ's bind replaces a stale socket file (the lock says no daemon serves it).
                bind_socket_file(lambda: sock.bind(endpoint), path, mode, group)
        except BaseException:
            sock.close()
            self._unlock()
            raise
        return sock

    def _unlock(self) -> None:
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None

    def begin_shutdown(self, reason: str) -> None:
        """Take no new session, grant no more blocks (the requests waiting fail), and tell each client to seal
        what it holds: what it sealed is still taken, sent and reported until :meth:`close`."""
        self.shutting_down = reason
        # SHUTDOWN before the refusals: a client that knows it looks for blocks of the next daemon instead of
        # failing the send() that waited for them.
        for session in list(self.sessions.values()):
            if session.connection is None:
                self._end_session(session)  # it holds nothing yet
            elif session.shutdown_notice:
                self._send(session, ipc.Shutdown(reason))
        for waiter in self.pool.expire_waiters(2**63 - 1):
            session = self._by_id.get(waiter.client_id)
            if session is not None:
                self._send(session, ipc.GrantFailed(waiter.request_id, f"the daemon is shutting down ({reason})"))

    def sealed_all(self) -> bool:
        """Whether every client that was told of the shutdown has handed over its last batches (or is gone)."""
        return all(session.last_sealed for session in self.sessions.values() if session.shutdown_notice)

    def replies_pending(self) -> bool:
        """Whether reports or replies wait for a client (ZeroMQ would not take them yet)."""
        return any(session.reports or session.waiting for session in self.sessions.values())

    def close(self) -> None:
        # The ZeroMQ socket first, lingering: the last reports reach the clients before the memory socket's
        # connections end, which tells each client that the daemon is gone.
        self.core.selector.unregister_external(self.socket)
        self.socket.close(linger=_CLOSE_LINGER_MS)
        if self._own_context:
            self._context.term()
        for conn in [*self._handshakes, *self._by_connection]:
            self._close_connection(conn)
        self.core.selector.unregister_external(self.memory.listener)
        self.memory.close()
        if self.endpoint.startswith("ipc://"):
            path = Path(self.endpoint[len("ipc://"):])
            path.unlink(missing_ok=True)
            # The lock's file goes while it is held: a daemon that opened it before fails to lock it, one that
            # comes after makes a new one.
            Path(f"{path}.lock").unlink(missing_ok=True)
        self._unlock()
        if self._made_directory is not None:
            try:
                os.rmdir(self._made_directory)
            except OSError:
                pass  # something else is in it now: not the daemon's to remove

    def _send(self, to: ClientSession | bytes, message: ipc.Message) -> None:
        """Send a message to a client. A session gets every message, in order, or its session ends (see
        :meth:`_hold`); an answer to a socket without a session is dropped, and counted, if ZeroMQ will not
        take it."""
        payload = ipc.encode(message)
        if isinstance(to, bytes):
            if self._route(to, payload) is not True:
                self.replies_dropped += 1
            return
        if self.sessions.get(to.identity) is not to:
            # Its session ended while a handler or the loop still held it: reports are kept if it is.
            if isinstance(message, ipc.Delivery) and self._ended.get(to.client_id) is to:
                to.reports.extend(message.reports)
            return
        if to.waiting:
            self._hold(to, message, payload)
            return
        sent = self._route(to.identity, payload)
        if sent is False:
            self._hold(to, message, payload)
        elif sent is None:
            to.waiting.append((message, payload))  # for _end_session to keep, if it is a report
            self._end_unread(to, "its socket is gone")

    def _route(self, identity: bytes, payload: bytes) -> bool | None:
        """Hand a message to ZeroMQ: True, or False if the client's queue is full, None if its socket is gone."""
        try:
            # send_multipart() without its per-frame type checks and flag arithmetic.
            self.socket.send(identity, _NOBLOCK | _SNDMORE)
            self.socket.send(payload, _NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            return None
        return True

    def _hold(self, session: ClientSession, message: ipc.Message, payload: bytes) -> None:
        """Keep a reply ZeroMQ would not queue until the client reads; past sidecar.client.reply.buffer.bytes,
        end its session."""
        session.waiting.append((message, payload))
        session.waiting_bytes += len(payload)
        if session.connection is None and session.waiting_bytes > _REPLY_BYTES_BEFORE_HANDSHAKE:
            self._end_unread(session, f"{session.waiting_bytes} bytes of replies wait for it before its memory "
                                      "handshake")
        elif session.waiting_bytes > self.reply_buffer_bytes:
            self._end_unread(session, f"{session.waiting_bytes} bytes of replies wait for it, past "
                                      f"sidecar.client.reply.buffer.bytes ({self.reply_buffer_bytes})")

    def _send_waiting(self, session: ClientSession) -> None:
        """Hand ZeroMQ what waits for a client, in order, while it takes it."""
        waiting = session.waiting
        while waiting:
            message, payload = waiting[0]
            sent = self._route(session.identity, payload)
            if sent is None:
                self._end_unread(session, "its socket is gone")
                return
            if not sent:
                return
            waiting.popleft()
            session.waiting_bytes -= len(payload)

    def _end_unread(self, session: ClientSession, reason: str) -> None:
        self.sessions_ended_unread += 1
        log.warning("%s does not read its replies: %s; ending its session (its sealed batches are still sent, "
                    "their reports kept for it until it connects again)", session.describe(), reason)
        self._end_session(session, keep=True)

    def _complain(self, identity: bytes, message: str, code: str = ipc.ERROR_REFUSED) -> None:
        self._count_refusal(message)
        self._send(self.sessions.get(identity, identity), ipc.Error(code, _brief(message)))

    def _count_refusal(self, message: str) -> None:
        self.messages_refused += 1
        now = time.monotonic()
        if now - self._last_complaint >= _LOG_INTERVAL_S:
            self._last_complaint = now
            log.warning("refused a client message (%d so far): %s", self.messages_refused, message)

    # -- incoming --------------------------------------------------------------------------------

    def handle_ready(self, ready: list[Any]) -> None:
        """Handle what the loop's poll found ready of the front's sockets (others are ignored)."""
        for sock in ready:
            if sock is self.socket:
                self.handle_readable()
            elif sock is self.memory.listener:
                accepted, failed = self.memory.accept_all()
                for conn in accepted:
                    self._handshakes[conn] = self.clock() + _HANDSHAKE_TIMEOUT_MS
                    self.core.selector.register_external(conn)
                if failed:
                    # Out of file descriptors, say: the listener would stay readable, and the loop spin.
                    log.error("the memory socket cannot accept connections: %s; pausing %d ms", failed,
                              _ACCEPT_PAUSE_MS)
                    self.core.selector.unregister_external(self.memory.listener)
                    self._accept_paused_until = self.clock() + _ACCEPT_PAUSE_MS
            elif sock in self._handshakes:
                self._memory_handshake(sock)
            elif sock in self._by_connection and hung_up(sock):
                session = self._by_connection[sock]
                if self._ended.get(session.client_id) is session:
                    log.info("%s, whose session was kept for it, is gone", session.describe())
                    self._forget_kept(session)
                else:
                    log.warning("%s is gone: ending its session", session.describe())
                    self._end_session(session)

    def handle_readable(self) -> None:
        """Handle the messages waiting on the socket, up to MAX_MESSAGES_PER_ITERATION, and up to
        MAX_MESSAGES_PER_CLIENT_PER_ITERATION of one client (ZeroMQ's poll says the socket is readable again
        while some are left)."""
        handled: dict[bytes, int] = {}
        for _ in range(MAX_MESSAGES_PER_ITERATION):
            try:
                # Frames, not bytes: a frame says whether more follow without a getsockopt(RCVMORE),
                # which pyzmq turns into an enum lookup per call.
                frame = self.socket.recv(_NOBLOCK, copy=False)
                frames = [frame.bytes]
                while frame.more:
                    frame = self.socket.recv(_NOBLOCK, copy=False)
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
        if len(frames) != 2:
            self._complain(identity, f"a message has exactly one frame, got {len(frames) - 1}")
            return
        try:
            fields = ipc.unpack(frames[1])
            if session is None and fields[0] not in (ipc.Hello.TYPE, ipc.Stats.TYPE):
                self._complain(identity, "unknown client: send HELLO first", ipc.ERROR_UNKNOWN_CLIENT)
                return
            message = ipc.from_fields(fields)
            if isinstance(message, ipc.Hello):
                if self.shutting_down is not None:
                    self._send(identity, ipc.Error(ipc.ERROR_SHUTTING_DOWN, f"the daemon is shutting down "
                                                                            f"({self.shutting_down})"))
                    return
                self._hello(identity, session, message)
                return
            if isinstance(message, ipc.Stats):
                self._send(identity, ipc.StatsReport(self.stats()))
                return
            assert session is not None
            session.last_seen_ms = self.clock()
            handler = self._HANDLERS.get(type(message))
            if handler is None:
                raise ValueError(f"{type(message).__name__.upper()} is a message of the daemon's, not a client's")
            handler(self, session, message)
        except ipc.VersionMismatchError as exc:
            self._complain(identity, f"protocol version mismatch: the client speaks {exc.version!r}, this daemon "
                                     f"speaks {PROTOCOL_VERSION}; upgrade kafka-sidecar on one side",
                           ipc.ERROR_VERSION)
        except (ValueError, TypeError, BlockError) as exc:
            self._complain(identity, str(exc))

    def _hello(self, identity: bytes, session: ClientSession | None, message: ipc.Hello) -> None:
        _check_int(message.pid, "pid", 1, 2**32)
        if session is not None:
            self._end_session(session)
        if len(self._by_token) >= _MAX_SESSIONS_AWAITING_HANDSHAKE:
            raise ValueError(f"{_MAX_SESSIONS_AWAITING_HANDSHAKE} sessions wait for their memory handshake: "
                             "say HELLO again in a while")
        now = self.clock()
        session = ClientSession(identity, self._next_client_id, message.pid, str(message.client_name)[:200], now,
                                secrets.token_bytes(TOKEN_SIZE), now + _HANDSHAKE_TIMEOUT_MS,
                                retriable_topic_errors=message.options.retriable_topic_errors is True,
                                shutdown_notice=message.options.shutdown_notice is True)
        if message.options.resume is not None:
            session.resume = self._resumable(message.options.resume)
        if self._claims(session):
            # Its own session, if its memory handshake proves it first (see _attach); till then it is no client.
            session.client_id = session.resume.client_id  # type: ignore[union-attr]
        else:
            self._next_client_id += 1
            self._by_id[session.client_id] = session
        self.sessions[identity] = session
        self._by_token[session.token] = session
        config = self.core.config
        settings = ipc.WelcomeSettings(
            max_request_size=config["max.request.size"], linger_ms=config["linger.ms"],
            max_block_ms=config["max.block.ms"], delivery_timeout_ms=config["delivery.timeout.ms"],
            buffer_memory=self.pool.block_count * self.pool.block_size,
            heartbeat_interval_ms=max(self.client_timeout_ms // 10, 100), batch_size=self.pool.block_size,
            # The others added later, each the Kafka setting of its name (a client checks its own against them).
            **{name: config[name.replace("_", ".")] for name in ipc.WelcomeSettings._field_defaults
               if name != "batch_size"})
        hello_id = message.options.hello_id if _is_int(message.options.hello_id) else 0
        self._send(session, ipc.Welcome(PROTOCOL_VERSION, session.client_id, session.token, self.pool.block_size,
                                        self.pool.block_count, settings, self.daemon_id, session.resume is not None,
                                        hello_id))

    def _resumable(self, raw: Any) -> ipc.Resume | None:
        """The session a HELLO hands over, if this daemon can take it back; None (logged) if not."""
        if not isinstance(raw, list) or len(raw) != len(ipc.Resume._fields):
            reason = f"a resumed session has the fields {', '.join(ipc.Resume._fields)}"
        else:
            resume = ipc.Resume._make(raw)
            if resume.daemon_id == self.daemon_id and resume.client_id not in self._ended:
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

    def _claims(self, session: ClientSession) -> bool:
        """Whether the session claims one this daemon ended and keeps, and has not proven it yet."""
        return session.connection is None and session.resume is not None and session.resume.daemon_id == self.daemon_id

    def _memory_handshake(self, conn: socket.socket) -> None:
        """A client's token, and its segment if it resumes: its segment goes back, or is taken back."""
        try:
            received = memory_socket.read_token(conn)
        except ValueError as exc:
            self._count_refusal(f"memory socket: {exc}")
            self._close_connection(conn)
            return
        if received is None:
            return
        token, fds = received
        segment = None
        try:
            session = self._by_token.pop(token, None)
            if session is None:
                memory_socket.refuse(conn, UNKNOWN_TOKEN)
                self._close_connection(conn)
                return
            # The kernel's word for the process, whatever the client said in its HELLO.
            session.pid, session.uid, _ = memory_socket.peer_credentials(conn)
            try:
                if session.pid == 0:
                    # The kernel names a process of a pid namespace the daemon cannot see 0: all such clients
                    # would be one process to the per-process limits.
                    raise ValueError("the daemon cannot see this process (pid 0 in its pid namespace): run the "
                                     "daemon in the host's pid namespace (Kubernetes: hostPID: true; docker: "
                                     "--pid host)")
                self._check_sessions(session)
                segment = self._attach(session, fds)
            except (ValueError, ClientError, OSError) as exc:
                memory_socket.refuse(conn, str(exc))
                self._close_connection(conn)
                self._end_session(session)
                return
            del self._handshakes[conn]
            self._by_connection[conn] = session
            session.connection = conn
            memory_socket.answer(conn, segment)
        finally:
            for fd in [*fds, *([] if segment is None else [segment])]:
                os.close(fd)
        log.info("%s connected%s", session.describe(), ", resuming its session" if session.resume is not None else "")
        if session.resume is not None:
            self._seal_notices(session, session.resume.sealed)
            session.resume = None

    def _check_sessions(self, session: ClientSession) -> None:
        """ValueError if the session's process has as many sessions as it may (those kept for it included, but
        the one it takes back)."""
        limit = self.core.config["sidecar.process.max.sessions"]
        claimed = self._ended.get(session.client_id) if self._claims(session) else None
        if sum(s.pid == session.pid and s is not claimed for s in self._by_connection.values()) >= limit:
            raise ValueError(f"process {session.pid} has {limit} sessions, as many as sidecar.process.max.sessions "
                             "allows")

    def _attach(self, session: ClientSession, fds: list[int]) -> int | None:
        """The new segment's file descriptor, or None once the segment of a resumed session is taken back."""
        if session.resume is None:
            if fds:
                raise ValueError("a segment was handed over, but the session does not resume one")
            return self.pool.attach(session.client_id, session.pid)
        if len(fds) != 1:
            raise ValueError("a resumed session hands over its segment")
        ended = None
        if session.resume.daemon_id == self.daemon_id:
            ended = self._ended.get(session.client_id)
            if ended is None:
                raise ValueError("this daemon keeps that session no more: another took it back, or its process is "
                                 "gone")
            if ended.pid != session.pid:
                raise ValueError(f"that session was process {ended.pid}'s")
            # A session this daemon ended: of the batches the client says it sealed, those it got (in flight,
            # or reported to the session and kept) are not sealed again.
            known = {*ended.unreported, *(report.batch_id for report in ended.reports)}
            session.resume = session.resume._replace(sealed=[
                notice for notice in session.resume.sealed if _notice_fields(notice).get("batch_id") not in known])
        # The blocks of its sealed batches are the client's again, up to what a client may hold. Each notice
        # is checked when it is sealed (a bad one, or one past the limit, fails its batch only): here its
        # blocks count if it names them plainly, once.
        owned: dict[int, None] = {}
        for notice in session.resume.sealed:
            fields = _notice_fields(notice)
            first, count = fields.get("first_block"), fields.get("block_count")
            if not (_is_int(first) and _is_int(count) and first >= 0 and 0 < count <= self.pool.block_count - first):
                continue
            blocks = dict.fromkeys(b for b in range(first, first + count) if b not in owned)
            if len(owned) + len(blocks) > self.pool.max_blocks_per_process - self.pool.held_by_process(session.pid):
                break
            owned.update(blocks)
        if ended is None:
            self.pool.adopt(session.client_id, fds[0], list(owned), session.pid)
        else:
            # Holding the segment proves the claim: then the reports kept, and those to come, are its.
            self.pool.reattach(session.client_id, fds[0], list(owned))
            del self._ended[session.client_id]
            self._by_id[session.client_id] = session
            if ended.connection is not None:
                self._close_connection(ended.connection)
            session.reports, session.unreported = ended.reports, ended.unreported
        return None

    def _blocks(self, session: ClientSession, message: ipc.Blocks) -> None:
        request_id = message.request_id
        _check_int(request_id, "request_id")
        if self.shutting_down is not None:
            self._send(session, ipc.GrantFailed(request_id, f"the daemon is shutting down ({self.shutting_down})"))
            return
        try:
            _check_int(message.count, "count", 1, self.pool.block_count)
            _check_int(message.timeout_ms, "timeout_ms", 0, 2**62)
            deadline = self.clock() + min(message.timeout_ms, MAX_BLOCK_WAIT_MS)
            blocks = self.pool.request(session.client_id, request_id, message.count, bool(message.contiguous),
                                       deadline)
        except (ValueError, BlockError) as exc:
            # The client waits for an answer to this request: it fails now rather than at its timeout.
            self._complain(session.identity, str(exc))
            self._send(session, ipc.GrantFailed(request_id, _brief(f"the daemon refused the request: {exc}")))
            return
        if blocks is not None:
            self._send(session, ipc.Grant(request_id, blocks))

    def _seal(self, session: ClientSession, message: ipc.Seal | ipc.LastSeal) -> None:
        if not isinstance(message.notices, list):
            raise ValueError(f"{type(message).__name__.upper()} carries a list of notices")
        self._seal_notices(session, message.notices)

    def _last_seal(self, session: ClientSession, message: ipc.LastSeal) -> None:
        self._seal(session, message)
        session.last_sealed = True

    def _seal_notices(self, session: ClientSession, notices: list[Any]) -> None:
        now = self.clock()
        for notice in notices:
            if self.sessions.get(session.identity) is not session:
                return  # ended by a reply it did not take: the notices left are offered again when it comes back
            try:
                batch = self._batch_from_notice(session, notice, now)
            except (ValueError, TypeError, BlockError) as exc:
                self._refuse_notice(session, notice, exc)
                continue
            try:
                self.core.append(batch)
            except Exception as exc:
                # A bug, not the client's fault: fail this batch, free its blocks, go on with the rest.
                log.exception("could not queue a sealed batch")
                batch.abort(KafkaError(f"the daemon could not queue the batch: {exc}"))

    def _refuse_notice(self, session: ClientSession, notice: Any, exc: Exception) -> None:
        """An ERROR, a failed DELIVERY entry for the batch, and the sender's unsealed blocks of it freed."""
        self._complain(session.identity, f"seal refused: {exc}")
        fields = _notice_fields(notice)
        batch_id, first, count = (fields.get(name) for name in ("batch_id", "first_block", "block_count"))
        if not _is_int(batch_id):
            return
        error = InvalidRequestError(_brief(f"the daemon refused the batch: {exc}"))
        session.reports.append(ipc.DeliveryReport.failed(batch_id, error))
        if _is_int(first) and _is_int(count):
            # The client counts a failed batch as finished: it neither writes to nor releases its blocks again.
            self.pool.free_unsealed(session.client_id, first, count)

    def _batch_from_notice(self, session: ClientSession, raw: Any, now: int) -> ProducerBatch:
        if not isinstance(raw, list) or len(raw) != len(ipc.SealNotice._fields):
            raise ValueError(f"a seal notice has the fields {', '.join(ipc.SealNotice._fields)}")
        (batch_id, first, count, topic, partition, records, length, base_ts, max_ts, ago) = ipc.SealNotice._make(raw)
        _check_int(batch_id, "batch_id")
        _check_int(first, "first_block", 0, self.pool.block_count - 1)
        _check_int(count, "block_count", 1, self.pool.block_count)
        _check_int(partition, "partition", 0, 2**31 - 1)
        _check_int(length, "length", 1, count * self.pool.block_size)
        _check_int(records, "record_count", 1, length)
        _check_int(base_ts, "base_timestamp", -1, 2**63 - 1)
        _check_int(max_ts, "max_timestamp", -1, 2**63 - 1)
        _check_int(ago, "created_ms_ago", 0, 2**40)
        ipc.check_topic(topic)
        self._follow(session, topic)
        partitions = self.core.metadata.cluster.partition_count(topic)
        if partitions is not None and partition >= partitions:
            raise ValueError(f"partition {partition} of topic {topic} does not exist: it has {partitions}")
        if length + BATCH_HEADER_SIZE > self.core.config["max.request.size"]:
            raise ValueError(f"a batch of {length} bytes (and its header) is larger than max.request.size")
        view = self.pool.seal(session.client_id, first, count, length)
        session.unreported[batch_id] = records
        self.records_sealed += records
        client_id, blocks = session.client_id, range(first, first + count)
        return ProducerBatch(TopicPartition(topic, partition), view, records, base_timestamp=base_ts,
                             max_timestamp=max_ts, created_ms=now - ago, on_complete=self._batch_done,
                             release=lambda: self.pool.free(client_id, blocks), origin=(client_id, batch_id))

    def _release(self, session: ClientSession, message: ipc.Release) -> None:
        blocks = message.blocks
        if not isinstance(blocks, list) or not all(_is_int(b) for b in blocks):
            raise ValueError("RELEASE carries a list of block numbers")
        self.pool.give_back(session.client_id, blocks)

    def _metadata(self, session: ClientSession, message: ipc.Metadata) -> None:
        topic = ipc.check_topic(message.topic)
        try:
            self._follow(session, topic)
        except ValueError as exc:
            # The client's send() waits for this topic's metadata: it fails now rather than at its timeout.
            self._complain(session.identity, str(exc))
            self._send(session, ipc.Topic(topic, None, [], ipc.error_to_wire(InvalidRequestError(_brief(str(exc))))))
            return
        session.topics[topic] = ()  # the state it was last told: none, so it hears the current one now
        self.core.metadata.add_topic(topic, self.clock())
        if self.core.metadata.cluster.partition_count(topic) is None:
            self.core.metadata.request_update()
        self._push_topic(session, topic)

    def _follow(self, session: ClientSession, topic: str) -> None:
        """Count a topic among those the client's process produces to; ValueError past its limits."""
        if topic in session.topics:
            return
        if session.connection is None or self.sessions.get(session.identity) is not session:
            raise ValueError(f"topic {topic} refused: a client follows topics within a session, after its memory "
                             "handshake")
        config = self.core.config
        process = self._process_topics.get(session.pid)
        if process is None:
            process = self._process_topics[session.pid] = ProcessTopics()
        if topic not in process.following:
            if len(process.following) >= config["sidecar.process.max.topics"]:
                raise ValueError(f"topic {topic} refused: a process may produce to at most "
                                 f"{config['sidecar.process.max.topics']} topics (sidecar.process.max.topics)")
            cluster = self.core.metadata.cluster
            if cluster.partition_count(topic) is None:
                # Each is in every metadata request, and may be created on the cluster: a few at a time.
                process.unknown = {name for name in process.unknown if cluster.partition_count(name) is None}
                if len(process.unknown) >= config["sidecar.process.max.unknown.topics"]:
                    raise ValueError(f"topic {topic} refused: a process may wait for at most "
                                     f"{config['sidecar.process.max.unknown.topics']} topics the cluster does not "
                                     "have (sidecar.process.max.unknown.topics)")
                process.unknown.add(topic)
        process.following[topic] += 1
        session.topics[topic] = ()

    def _heartbeat(self, session: ClientSession, message: ipc.Heartbeat) -> None:
        pass  # last_seen_ms is updated for every message

    def _goodbye(self, session: ClientSession, message: ipc.Goodbye) -> None:
        log.info("%s said goodbye", session.describe())
        self._end_session(session)

    _HANDLERS: dict[type[Any], Callable[[SidecarFront, ClientSession, Any], None]] = {
        ipc.Blocks: _blocks, ipc.Seal: _seal, ipc.Release: _release, ipc.Metadata: _metadata,
        ipc.Heartbeat: _heartbeat, ipc.Goodbye: _goodbye, ipc.LastSeal: _last_seal,
    }

    def _end_session(self, session: ClientSession, *, keep: bool = False) -> None:
        """Forget a client: its unsealed blocks return to the pool; its sealed batches still go.

        Only the pool's count gets the blocks back: they are in the client's own segment, which no other
        client can be given, so a client that is still alive (stopped, starved) and writes into them when
        it wakes up harms nobody else. With ``keep`` (the client may live: it was silent, or did not read),
        the reports of its batches are kept for it, and its segment, which it hands over to take the
        session back when it reads the end of its memory connection: the daemon shuts down its own side
        only, and keeps all this until the client closes the other, when its process is gone.
        """
        if self.sessions.get(session.identity) is not session:
            return  # ended already
        del self.sessions[session.identity]
        self._by_token.pop(session.token, None)
        if self._claims(session):
            return  # it did not prove its claim: the session it claimed stays kept, or is another's now
        if self._by_id.get(session.client_id) is session:
            del self._by_id[session.client_id]
        self._unfollow(session)
        keep = keep and session.connection is not None
        if keep:
            # The client reads the end of the stream; the daemon, the end of its process (see _forget_kept).
            session.connection.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]
            # What waits for it: its reports are kept (the rest, grants and errors, mean nothing past its end).
            session.reports[:0] = [report for message, _ in session.waiting if isinstance(message, ipc.Delivery)
                                   for report in message.reports]
            self._ended[session.client_id] = session
        elif session.connection is not None:
            self._close_connection(session.connection)
            session.connection = None
        session.waiting.clear()
        session.waiting_bytes = 0
        if not keep:
            self._forget_process_records(session.pid)
        reclaimed = self.pool.detach(session.client_id, keep=keep)
        if reclaimed:
            log.info("reclaimed %d unsealed block(s) of client %s", reclaimed, session.client_id)

    def _unfollow(self, session: ClientSession) -> None:
        """The session's topics count no more for its process."""
        process = self._process_topics.get(session.pid)
        if process is None or not session.topics:
            return
        process.following.subtract(session.topics.keys())
        cluster = self.core.metadata.cluster
        for topic in session.topics:
            if process.following[topic] <= 0:
                del process.following[topic]
                process.unknown.discard(topic)
                if cluster.partition_count(topic) is None and \
                        not any(topic in other.following for other in self._process_topics.values()):
                    # Nobody waits for it: it takes no place among those to fetch and to create.
                    self.core.metadata.remove_topic(topic)
        session.topics = {}
        if not process.following:
            del self._process_topics[session.pid]

    def _forget_kept(self, session: ClientSession) -> None:
        """A kept session's process is gone: its segment goes once its batches are sent."""
        del self._ended[session.client_id]
        if session.connection is not None:
            self._close_connection(session.connection)
            session.connection = None
        self.pool.forget(session.client_id)
        self._forget_process_records(session.pid)

    def _close_connection(self, conn: socket.socket) -> None:
        self._handshakes.pop(conn, None)
        self._by_connection.pop(conn, None)
        self.core.selector.unregister_external(conn)
        conn.close()

    def stats(self) -> dict[str, Any]:
        """The figures a :class:`~client_stub.contract.ipc.Stats` request gets: every figure of the daemon (see
        :func:`~service.metrics.daemon_figures`), and the pool's by client (``clients``: [client id, pid, blocks
        held] of each session; ``held``: [client id, blocks held] of each segment)."""
        held = self.pool.held()
        return {**daemon_figures(self.core, self.pool, self),
                "clients": [[s.client_id, s.pid, held.get(s.client_id, 0)] for s in self.sessions.values()],
                "held": [[client_id, count] for client_id, count in held.items()]}

    def sidecar_figures(self) -> dict[str, float]:
        """The sidecar's own figures: its clients, the BufferPool's blocks by state, what it refused."""
        granted, sealed = self.pool.block_states()
        block_size = self.pool.block_size
        in_flight: dict[Any, int] = {}
        for batch in self.core.sender.in_flight_batches():
            for part in batch.parts or [batch]:
                # The halves of a split batch share their blocks: each origin's counted once.
                in_flight[part.origin] = max(in_flight.get(part.origin, 0), -(-part.records_size // block_size))
        figures = {"clients-connected": sum(s.connection is not None for s in self.sessions.values()),
                   "sessions": len(self.sessions), "sessions-kept": len(self._ended),
                   "blocks-total": self.pool.block_count, "blocks-free": self.pool.free_blocks,
                   "blocks-granted": granted, "blocks-sealed": sealed, "blocks-in-flight": sum(in_flight.values()),
                   "block-size-bytes": block_size, "records-sealed-total": self.records_sealed,
                   "topics-awaiting-creation": len(self.core.metadata.awaiting_creation()),
                   "reply-buffer-bytes": sum(s.waiting_bytes for s in self.sessions.values()),
                   "messages-refused-total": self.messages_refused, "replies-dropped-total": self.replies_dropped,
                   "sessions-ended-unread-total": self.sessions_ended_unread,
                   "batches-corrupt-total": self.core.metrics.batches_corrupt}
        return {name: float(value) for name, value in figures.items()}

    def process_figures(self) -> list[dict[str, Any]]:
        """One entry per client process (as the kernel names it) with a session, kept ones included: its
        sessions, the blocks they hold, and their records reported delivered and failed."""
        processes: dict[int, dict[str, Any]] = {}
        for session in [*self._by_connection.values(), *self._ended.values()]:
            delivered, failed = self._process_records.get(session.pid, (0, 0))
            entry = processes.setdefault(session.pid, {"pid": session.pid, "uid": session.uid, "name": session.name,
                                                       "sessions": 0, "blocks-held": 0,
                                                       "records-delivered-total": delivered,
                                                       "record-error-total": failed})
            entry["sessions"] += 1
            entry["blocks-held"] += self.pool.held_by(session.client_id)
        return [processes[pid] for pid in sorted(processes)]

    def _forget_process_records(self, pid: int) -> None:
        """Forget the records of a process with no session left (its pid may be another's next)."""
        if not any(s.pid == pid for s in [*self._by_connection.values(), *self._ended.values()]):
            self._process_records.pop(pid, None)

    # -- outgoing --------------------------------------------------------------------------------

    def _batch_done(self, batch: ProducerBatch) -> None:
        client_id, batch_id = batch.origin
        # A kept session first: a session claiming it is not its client until it proves so.
        session = self._ended.get(client_id) or self._by_id.get(client_id)
        if session is None:
            return  # the client is gone; its records were still delivered (or failed) for it
        self._process_records.setdefault(session.pid, [0, 0])[batch.error is not None] += batch.record_count
        left = session.unreported.pop(batch_id, 0) - batch.record_count
        if left > 0:
            session.unreported[batch_id] = left  # a part of a batch that was split
        session.reports.append(ipc.DeliveryReport(batch_id, batch.origin_index, batch.record_count, batch.base_offset,
                                                  batch.log_append_time_ms, ipc.error_to_wire(batch.error)))

    def after_iteration(self) -> None:
        """Work due after each loop iteration: grants, expiries, reports, metadata, pressure."""
        now = self.clock()
        # Expiries first: an expired request at the head of the FIFO must not hold back those behind it.
        for waiter in self.pool.expire_waiters(now):
            session = self._by_id.get(waiter.client_id)
            if session is not None:
                self._send(session, ipc.GrantFailed(waiter.request_id,
                                                    f"no {waiter.count} free block(s) of the BufferPool in time"))
        for waiter, blocks in self.pool.serve_waiters():
            session = self._by_id.get(waiter.client_id)
            if session is not None:  # else its session ended in this loop, and its blocks went back with it
                self._send(session, ipc.Grant(waiter.request_id, blocks))
        # Sealed batches are always ready to send here: the pressure is for the clients, to seal what they hold.
        if self.pool.waiters and now - self._seal_now_sent_ms >= _SEAL_NOW_INTERVAL_MS:
            self._seal_now_sent_ms = now
            # Everyone holds what the pool lacks; a client at its limit waits only for its own blocks. When the
            # queue is what is full, the blocks that come back are the sealed ones, as they are sent.
            exhausted = self.pool.exhausted and not self.pool.queue_full
            at_limit = self.pool.clients_at_limit()
            for session in list(self.sessions.values()):
                if exhausted or session.client_id in at_limit:
                    self._send(session, ipc.SealNow())
        for session in list(self.sessions.values()):
            if session.waiting:
                self._send_waiting(session)
            reports = session.reports
            if reports:
                session.reports = []
                for start in range(0, len(reports), _REPORTS_PER_DELIVERY):
                    self._send(session, ipc.Delivery(reports[start:start + _REPORTS_PER_DELIVERY]))
            if session.connection is None and session.handshake_deadline_ms <= now:
                # Unbounded otherwise: nothing limits the sessions of a socket that never proves a process.
                log.warning("%s made no memory handshake in %d ms: ending its session", session.describe(),
                            _HANDSHAKE_TIMEOUT_MS)
                self._end_session(session)
            elif now - session.last_seen_ms > self.client_timeout_ms:
                # Stopped (SIGSTOP, a debugger) or starved, perhaps, rather than dead: what it sealed is kept.
                log.warning("%s silent for %d ms: ending its session", session.describe(), now - session.last_seen_ms)
                self._end_session(session, keep=True)
        for conn, until in list(self._handshakes.items()):
            if until <= now:
                self._close_connection(conn)
        if self._accept_paused_until is not None and self._accept_paused_until <= now:
            self._accept_paused_until = None
            self.core.selector.register_external(self.memory.listener)
        metadata = self.core.metadata
        if (metadata.update_version, metadata.authentication_error) != self._metadata_version:
            self._metadata_version = (metadata.update_version, metadata.authentication_error)
            for session in list(self.sessions.values()):
                for topic in list(session.topics):
                    self._push_topic(session, topic)

    def next_timer_ms(self) -> int:
        """How long the loop may sleep before :meth:`after_iteration` has work (waiters, timeouts)."""
        now = self.clock()
        due = [w.deadline_ms - now for w in self.pool.waiters]
        if self.pool.waiters:
            due.append(_SEAL_NOW_INTERVAL_MS)
        due += [until - now for until in self._handshakes.values()]
        due += [s.handshake_deadline_ms - now for s in self.sessions.values() if s.connection is None]
        if self._accept_paused_until is not None:
            due.append(self._accept_paused_until - now)
        due.append(min((s.last_seen_ms + self.client_timeout_ms - now for s in self.sessions.values()),
                       default=self.client_timeout_ms))
        if any(s.waiting for s in self.sessions.values()):
            due.append(_RETRY_WAITING_MS)
        return max(min(due), 0)

    def _push_topic(self, session: ClientSession, topic: str) -> None:
        cluster = self.core.metadata.cluster
        count = cluster.partition_count(topic)
        error = None
        code = cluster.topic_errors.get(topic)
        if code is not None and (session.retriable_topic_errors or not error_code(code).retriable):
            # A retriable error (UNKNOWN_TOPIC_OR_PARTITION) keeps the client waiting, and names the cause
            # if the wait times out; a final one fails its send() at once.
            row = error_code(code)
            error = ipc.error_to_wire(row.exception(f"topic {topic}: {row.name}", code=code, name=row.name))
        elif count is None and self.core.metadata.authentication_error is not None:
            # No metadata can come: the brokers refuse the daemon (AuthenticationError, final: send() fails now).
            error = ipc.error_to_wire(self.core.metadata.authentication_error)
        state = (count, tuple(cluster.available_partitions(topic)), error)
        if state == session.topics.get(topic) or (count is None and error is None):
            return
        session.topics[topic] = state
        self._send(session, ipc.Topic(topic, count, list(state[1]), error))


def max_message_size(max_blocks_per_process: int) -> int:
    """The largest message the front reads: a SEAL or a resumed HELLO for every block a client may hold."""
    return _MESSAGE_OVERHEAD + max_blocks_per_process * _NOTICE_SIZE


def _notice_fields(notice: Any) -> dict[str, Any]:
    """What can be read of a seal notice by field name, before it is checked (it may have too few fields,
    or fields of other types)."""
    return dict(zip(ipc.SealNotice._fields, notice, strict=False)) if isinstance(notice, list) else {}


def _brief(text: str) -> str:
    """An error's text as a client gets it: it quotes what was refused, which may be as large as a message."""
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT - 3] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(value: Any, name: str, low: int = 0, high: int = 2**63 - 1) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _make_directory(directory: str, mode: int, group: int) -> bool:
    """The socket's directory: made if missing, searchable by the classes of user that ``mode`` lets use the
    socket (whatever the umask); one that exists is the administrator's (RuntimeDirectory=, /tmp) and kept.
    Returns whether it was made."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.mkdir(directory, 0o700)
    os.chown(directory, -1, group)
    os.chmod(directory, 0o700 | (0o050 if mode & 0o060 else 0) | (0o005 if mode & 0o006 else 0))
    return True


def _lock_endpoint(path: str) -> int:
    """Hold ``path``.lock for the daemon's life; EndpointInUseError if another daemon holds it.

    A lock, not a probe of the socket: two daemons started at once cannot both find the endpoint free
    (and the lock goes with its process, however that ends).
    """
    lock_path = path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise EndpointInUseError(f"another kafka-sidecar daemon is serving {path}") from None
    except BaseException:
        os.close(fd)
        raise
    os.fchmod(fd, 0o600)
    return fd
