"""The producer's I/O thread: its session with the daemon, as the Java producer's Sender thread.

One per producer and process. It sends what the producer queued (seal notices,
block requests, releases), seals batches that have lingered, receives the
daemon's messages (grants, topics, delivery reports) and completes the records'
futures, sends heartbeats, and keeps the session: the handshake (its segment
comes over the daemon's memory socket, whose connection then says whether the
daemon is alive), and a new one when the daemon is gone: the next daemon is handed
the segment and the batches sealed but not reported, which it sends again. What a
session held is failed only when the daemon itself ended it (it took the process
for dead) or cannot take it back.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import zmq

from .accumulator import RecordAccumulator
from .block_grants import BlockGrants
from .contract import PROTOCOL_VERSION, ipc, shared_memory
from .contract.shared_memory import Layout, Segment
from .errors import KafkaError, KafkaTimeoutError, SidecarUnavailableError
from .fastpath import Appender
from .futures import RecordFuture, completer, fail
from .metadata import ProducerMetadata

# The producer's logger: what the I/O thread logs is the producer's to the application.
log = logging.getLogger("client_stub.producer")

# A batch not reported this long after the daemon's delivery.timeout.ms is given up on.
_REPORT_GRACE_MS = 30_000
# pyzmq's flags are enum.Flag members, whose & runs Python code: plain ints for the per-message calls.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_HEARTBEAT = ipc.encode(ipc.Heartbeat())
# How long the memory handshake may take, and how long a HELLO may go unanswered before it is said again
# (one said while the daemon was going down may have gone with its connection).
_HANDSHAKE_TIMEOUT_S = 10.0
_HELLO_RETRY_S = 5.0
# Once the daemon is gone, how long to wait for more of what it sent before.
_DRAIN_WAIT_MS = 20


class Outbox:
    """Messages for the daemon, queued by any thread and sent by the I/O thread, which they wake."""

    def __init__(self) -> None:
        self._messages: deque[bytes] = deque()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._wake_pending = False
        self._io_ident: int | None = None

    def open(self) -> None:
        """Make the wake-up pipe (when the I/O thread starts)."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def post(self, message: ipc.Message) -> None:
        """Queue a message (lock held or not: deque appends are atomic) and wake the I/O thread."""
        self._messages.append(ipc.encode(message))
        self.wake()

    def wake(self) -> None:
        """Wake the I/O thread, unless a wake-up is pending already or this is the I/O thread."""
        # The I/O thread sends what was queued before it polls again; a wake-up pending is enough.
        if self._wake_pending or threading.get_ident() == self._io_ident:
            return
        self._wake_pending = True
        wake_w = self._wake_w
        if wake_w is None:
            return  # not started, or the I/O thread has ended
        try:
            wake_w.send(b"\x00")
        except BlockingIOError:
            pass  # already woken: the pipe is full
        except OSError:
            pass  # closed meanwhile: the I/O thread has ended

    def bind(self) -> int:
        """Called on the I/O thread when it starts, whose own wake() calls are unneeded; returns the file
        descriptor to poll for wake-ups."""
        assert self._wake_r is not None, "open() first"
        self._io_ident = threading.get_ident()
        return self._wake_r.fileno()

    def send_all(self, sock: zmq.Socket[bytes]) -> None:
        """Send what is queued (I/O thread)."""
        messages = self._messages
        while messages:
            sock.send(messages.popleft())

    def empty(self) -> bool:
        """Whether nothing waits to be sent."""
        return not self._messages

    def clear(self) -> None:
        """Drop what waits: it was for a session that is gone."""
        self._messages.clear()

    def close(self) -> None:
        """Close the wake-up pipe (when the I/O thread ends: nothing is sent any more)."""
        wake_r, wake_w = self._wake_r, self._wake_w
        self._wake_r = self._wake_w = None
        for sock in (wake_r, wake_w):
            if sock is not None:
                sock.close()

    def woken(self) -> None:
        """Take the wake-up (I/O thread)."""
        # Drained before the flag is cleared, and both before the outbox and the batches are read: a wake-up
        # written after the drain stays in the pipe; one skipped because the flag was still set asked for
        # what they are about to show. (Cleared first, a wake-up written between the two was drained with the flag
        # left set, and every later wake() skipped.) One read: a wake-up is one byte, and whatever is left
        # wakes the next poll at once. A small read comes from Python's object allocator; a page-sized one
        # would be a malloc() in this thread's own arena, whose pages stay resident in every client process.
        assert self._wake_r is not None, "open() first"
        try:
            self._wake_r.recv(64)
        except BlockingIOError:
            pass
        self._wake_pending = False


class IoThread:
    """The I/O thread of one producer in one process, and the session it holds with the daemon.

    ``welcome``, ``segment`` and ``session_error`` are the session's state, which
    send() reads under the producer's lock. The segment, its file descriptor and the
    connection to the memory socket outlive a daemon that dies: they go to the next.
    """

    def __init__(self, endpoint: str, cond: threading.Condition, outbox: Outbox, accumulator: RecordAccumulator,
                 grants: BlockGrants, metadata: ProducerMetadata, appender: Appender[RecordFuture], *,
                 hello: Callable[[], ipc.Hello], linger_ms: Callable[[], int],
                 fast_path_allowed: Callable[[], bool]) -> None:
        self.endpoint = endpoint
        self._cond = cond  # the producer's, on its lock
        self._outbox = outbox
        self._accumulator = accumulator
        self._grants = grants
        self._metadata = metadata
        self._appender = appender
        self._hello = hello
        self._linger_ms = linger_ms
        self._fast_path_allowed = fast_path_allowed
        self.welcome: ipc.Welcome | None = None
        # The settings of the last daemon that welcomed this client: those it works with between two daemons.
        self.settings: ipc.WelcomeSettings | None = None
        self.segment: Segment | None = None
        self.session_error: KafkaError | None = None
        self._segment_fd: int | None = None
        self._memory: socket.socket | None = None
        # The welcome of the session a daemon that is gone held, offered to the next one.
        self._lost_welcome: ipc.Welcome | None = None
        # The lost session's memory connection, open until the session is taken back or forgotten: a daemon
        # that ended the session itself keeps what it had of it while this connection is open.
        self._lost_memory: socket.socket | None = None
        self._poller: zmq.Poller | None = None
        self._hello_sent = 0.0  # time.monotonic() when the HELLO awaiting its WELCOME was sent
        self._hello_id = 0  # the last HELLO's
        self._lost: list[RecordFuture] = []
        self._lost_error: KafkaError | None = None
        # Why the last daemon shut down (its SHUTDOWN), until another welcomes this client; and whether it is
        # still delivering this client's last batches (no HELLO meanwhile: it would take another socket).
        self.shutdown_reason: str | None = None
        self._daemon_draining = False
        # Why the daemon last refused this client a session, until one is had.
        self.last_refusal: str | None = None
        # This producer's records reported delivered, and failed (whatever failed them).
        self.records_delivered = 0
        self.records_failed = 0
        self._stopping = False
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect and start the thread (ValueError for an endpoint ZeroMQ refuses)."""
        self._context, self._sock = self._connect()
        self._outbox.open()
        self._thread = threading.Thread(target=self._run, name="kafka-sidecar-io", daemon=True)
        self._thread.start()

    def _connect(self) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
        """A context of this process and its socket to the daemon (which the I/O thread then uses alone).

        Made by the caller, not on the I/O thread: what ZeroMQ allocates for the socket (its pipes,
        ~50 KB) then comes from the process's main malloc arena, which has room, rather than from a new
        arena of the I/O thread's, pages that stay resident in every client process.
        """
        context = zmq.Context()
        # One socket is all it holds: the default of 1023 would size the context's socket tables
        # (~12 KB) for a thousand.
        context.set(zmq.MAX_SOCKETS, 8)
        try:
            return context, self._socket(context)
        except zmq.ZMQError as exc:
            context.term()
            raise ValueError(f"cannot connect to the kafka-sidecar endpoint {self.endpoint!r}: {exc}") from None

    def _socket(self, context: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
        return sock

    def stop(self) -> None:
        """Send what is queued and a GOODBYE, then end (lock held; join() waits for it)."""
        self._stopping = True
        notices = self._accumulator.take_notices()
        if notices is not None:
            self._outbox.post(notices)
        self._outbox.post(ipc.Goodbye())

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after stop(), or once it failed)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def count_done(self, *, delivered: int = 0, failed: int = 0) -> None:
        """Count records out of those outstanding, as delivered or failed (lock held)."""
        self._appender.count_done(delivered + failed)
        self.records_delivered += delivered
        self.records_failed += failed

    def is_current(self) -> bool:
        """Whether the calling thread is this I/O thread (where delivery callbacks run)."""
        return threading.current_thread() is self._thread

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._context is not None and self._sock is not None
        sock = self._sock
        poller = self._poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        # zmq.Poller reports a plain socket by its file descriptor, not as the object registered.
        wake_fd = self._outbox.bind()
        poller.register(wake_fd, zmq.POLLIN)
        self._say_hello(sock)
        next_heartbeat = time.monotonic() + 1.0
        try:
            while True:
                wake_at = min(self._seal_lingered(), next_heartbeat)
                if self.welcome is not None or self._stopping:
                    # Between sessions, what is queued waits for the next (to which it is then addressed).
                    self._outbox.send_all(sock)
                if self._stopping and self._outbox.empty():
                    break
                # In whole milliseconds, rounded up: rounding down would spin until the deadline.
                events = dict(poller.poll(max(math.ceil((wake_at - time.monotonic()) * 1000), 0)))
                if wake_fd in events:
                    self._outbox.woken()
                if sock in events:
                    self._receive_all(sock)
                if self._memory is not None and self._memory.fileno() in events and shared_memory.hung_up(self._memory):
                    self._drain(sock)
                    self._lose_session(sock)
                if self._lost:
                    self._fail_lost()
                if time.monotonic() >= next_heartbeat:
                    if self.welcome is not None or self._daemon_draining:
                        # While a daemon delivers this client's last batches too: silent, it would lose them.
                        sock.send(_HEARTBEAT)
                    elif self.session_error is None and time.monotonic() - self._hello_sent > _HELLO_RETRY_S:
                        sock = self._reconnect(poller, sock)
                        self._say_hello(sock)
                    self._expire_unreported()
                    interval = self.settings.heartbeat_interval_ms if self.settings else 1000
                    next_heartbeat = time.monotonic() + interval / 1000
        except BaseException as exc:
            # A callback raised SystemExit, say, or a bug: nothing will report this process's records any
            # more. Each send() and flush() says so from now on, and the records waiting fail with it.
            self._thread_failed(exc)
            raise
        finally:
            self._sock.close()
            self._context.term()
            self._outbox.close()
            self._release_session()

    def _seal_lingered(self) -> float:
        with self._cond:
            wake_at = self._accumulator.seal_lingered(time.monotonic())
            notices = self._accumulator.take_notices()
            if notices is not None:
                self._outbox.post(notices)
        return wake_at

    def _thread_failed(self, exc: BaseException) -> None:
        error = KafkaError(f"the producer's I/O thread stopped ({type(exc).__name__}: {exc}): "
                           "this producer can send no more; make a new one")
        with self._cond:
            self.session_error = error
            self._appender.disable()
            # A lost session's records too: nothing will fail them now.
            futures = [*self._lost, *self._accumulator.abandon()]
            self._lost = []
            self.count_done(failed=self._appender.outstanding)
            self._cond.notify_all()
        fail(futures, error)

    def _expire_unreported(self) -> None:
        """Fail batches the daemon has not reported on long after its delivery.timeout.ms: it is gone."""
        delivery_timeout_ms = self.settings.delivery_timeout_ms if self.settings else 120_000
        limit = (delivery_timeout_ms + _REPORT_GRACE_MS) / 1000
        with self._cond:
            overdue = self._accumulator.overdue(time.monotonic(), limit)
        if overdue:
            error = KafkaTimeoutError(f"no delivery report from the kafka-sidecar daemon at {self.endpoint} "
                                      f"{limit:.0f} s after sealing: is it running?")
            fail([f for b in overdue for f in b.futures], error)
            with self._cond:
                self.count_done(failed=sum(b.record_count - b.reported for b in overdue))
                self._cond.notify_all()

    # -- messages from the daemon ----------------------------------------------------------------

    def _receive_all(self, sock: zmq.Socket[bytes]) -> None:
        # Asking for the events is cheaper than raising zmq.Again at the end of every batch.
        while cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:  # an int option (pyzmq types every option int | bytes)
            data = sock.recv(_NOBLOCK)
            try:
                self._handle(sock, ipc.decode(data))
            except ipc.VersionMismatchError as exc:
                with self._cond:
                    self.session_error = SidecarUnavailableError(
                        f"kafka-sidecar at {self.endpoint} speaks protocol version {exc.version!r}, this client "
                        f"{PROTOCOL_VERSION}: upgrade kafka-sidecar on one side")
                    self._cond.notify_all()
            except Exception:
                log.exception("cannot handle a message from the daemon")

    def _handle(self, sock: zmq.Socket[bytes], message: ipc.Message) -> None:
        if isinstance(message, ipc.Delivery):
            self._deliver(message.reports)
            return
        if isinstance(message, ipc.Welcome):
            self._welcomed(sock, message)
            return
        if isinstance(message, ipc.Error) and message.code == ipc.ERROR_UNKNOWN_CLIENT:
            # The daemon restarted, or ended the session (it took this process for dead): start again.
            if not self._hello_sent:
                log.warning("the kafka-sidecar daemon does not know this client any more: connecting again")
                self._lose_session(sock)
            return
        with self._cond:
            if isinstance(message, ipc.Grant):
                self._grants.granted(message)
            elif isinstance(message, ipc.GrantFailed):
                self._grants.refused(message)
            elif isinstance(message, ipc.Topic):
                self._metadata.update(message)
            elif isinstance(message, ipc.SealNow):
                self._accumulator.seal_all()
                self._grants.give_back_spare()
            elif isinstance(message, ipc.Shutdown):
                self._daemon_shutting_down(sock, message.reason)
            elif isinstance(message, ipc.Error):
                self._refused(message)
            self._cond.notify_all()

    def _deliver(self, rows: list[Any]) -> None:
        # Only the bookkeeping holds the lock: send() must not wait while futures complete.
        with self._cond:
            reported = self._accumulator.reported(rows, time.monotonic())
        try:
            for batch, report, _ in reported:
                completer.complete(batch.futures, report.first_record, report.record_count, batch.topic,
                                   batch.partition, report.base_offset, report.log_append_time_ms,
                                   ipc.error_from_wire(report.error))
        finally:
            # Counted out after the callbacks ran: flush() returns once they have, as in the Java client.
            with self._cond:
                self.count_done(delivered=sum(newly for _, report, newly in reported if report.error is None),
                                failed=sum(newly for _, report, newly in reported if report.error is not None))
                self._cond.notify_all()

    # -- the session -----------------------------------------------------------------------------

    def _reconnect(self, poller: zmq.Poller, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """A new socket to the daemon, for a HELLO said again: what the old one queued (the last HELLO,
        lost with a dying daemon or waiting for one that is down) is dropped, not delivered one day in a
        heap."""
        poller.unregister(sock)
        sock.close(0)
        assert self._context is not None
        self._sock = self._socket(self._context)
        poller.register(self._sock, zmq.POLLIN)
        return self._sock

    def _say_hello(self, sock: zmq.Socket[bytes]) -> None:
        """HELLO, offering the session of a daemon that is gone if there is one; only its WELCOME counts."""
        hello = self._hello()
        with self._cond:
            resume = self._resume()
        self._hello_id += 1
        hello = hello._replace(options=hello.options._replace(resume=None if resume is None else list(resume),
                                                              hello_id=self._hello_id))
        self._hello_sent = time.monotonic()
        sock.send(ipc.encode(hello))

    def _resume(self) -> ipc.Resume | None:
        """What the lost session held, for the next daemon (lock held)."""
        lost = self._lost_welcome
        if lost is None or self._segment_fd is None:
            return None
        now = time.monotonic()
        return ipc.Resume(lost.daemon_id, lost.client_id, lost.block_size, lost.block_count,
                          [list(notice) for notice in self._accumulator.resume_notices(now)])

    def _drain(self, sock: zmq.Socket[bytes]) -> None:
        """Take what the daemon sent before it went (its last reports, which need not be sent again), as
        ZeroMQ's I/O thread hands it over."""
        while sock.poll(_DRAIN_WAIT_MS):
            self._receive_all(sock)

    def _daemon_shutting_down(self, sock: zmq.Socket[bytes], reason: str) -> None:
        """The daemon is shutting down (lock held): hand it what this producer holds, as the session's last; it
        delivers or fails all of it before it goes. New records wait for the next daemon."""
        if self.welcome is None:
            return
        log.info("the kafka-sidecar daemon at %s is shutting down (%s): handing it the last batches; new records "
                 "wait for the next daemon", self.endpoint, reason)
        self._appender.disable()
        self._accumulator.seal_all()
        notices = self._accumulator.take_notices()
        self._outbox.send_all(sock)  # what was queued for the session goes first, its seal notices among them
        sock.send(ipc.encode(ipc.LastSeal([] if notices is None else notices.notices)))
        self._grants.forget()
        self._lost_welcome, self.welcome = self.welcome, None
        self.shutdown_reason = reason
        self._daemon_draining = True

    def _lose_session(self, sock: zmq.Socket[bytes]) -> None:
        """The daemon is gone, or does not know this client any more: keep what the session held (its
        segment, its sealed batches) for the next, which HELLO offers."""
        self._daemon_draining = False
        with self._cond:
            if self.welcome is not None:
                log.warning("lost the session with the kafka-sidecar daemon at %s: connecting again", self.endpoint)
                self._appender.disable()
                # Open batches are sealed now, so that the next daemon gets them with the others.
                self._accumulator.seal_all()
                self._accumulator.take_notices()
                self._grants.forget()
                self._outbox.clear()
                self._lost_welcome, self.welcome = self.welcome, None
            self._hold_memory()
        self._say_hello(sock)

    def _welcomed(self, sock: zmq.Socket[bytes], welcome: ipc.Welcome) -> None:
        """The memory handshake: a new segment, or the lost session's taken back."""
        if self.welcome is not None or welcome.hello_id != self._hello_id:
            return  # the answer to an earlier HELLO, said again since: its session ends with the next
        resume_fd = self._segment_fd if welcome.resumed else None
        # Beside this process's endpoint: where the daemon's socket is mounted here, not where the daemon is.
        path = shared_memory.memory_socket_path(self.endpoint, welcome.daemon_id)
        try:
            conn, fd = shared_memory.connect(path, welcome.memory_token, _HANDSHAKE_TIMEOUT_S, resume_fd)
        except shared_memory.HandshakeError as exc:
            if resume_fd is not None:
                log.error("the kafka-sidecar daemon did not take the lost session back: %s", exc)
                with self._cond:
                    self._forget_session()
                self._say_hello(sock)
            elif str(exc).endswith(shared_memory.UNKNOWN_TOKEN):
                # An older welcome, whose token the daemon forgot when a HELLO said again replaced it.
                log.debug("memory handshake refused: %s", exc)
            else:
                # Refused for a reason (this process has as many sessions as it may, or the daemon cannot see
                # it): said again in a while, and what send() says if no session comes of it.
                log.warning("kafka-sidecar at %s: %s", self.endpoint, exc)
                self.last_refusal = str(exc)
            return
        except PermissionError as exc:
            with self._cond:
                # Say why, rather than letting send() time out waiting for a session that cannot work.
                self.session_error = SidecarUnavailableError(
                    f"cannot get shared memory from the kafka-sidecar daemon at {self.endpoint} "
                    f"({path}): {exc}; is this user in the daemon's group?")
                self._cond.notify_all()
            return
        except OSError as exc:
            # The daemon went between its welcome and the handshake: the HELLO is said again in a while.
            log.warning("cannot reach the memory socket of the kafka-sidecar daemon at %s: %s", self.endpoint, exc)
            return
        with self._cond:
            if fd is not None:
                self._forget_session()
                self._segment_fd = fd
                self.segment = Segment(fd, Layout(welcome.block_size, welcome.block_count))
            elif self._lost_welcome is not None:
                sealed = self._accumulator.sealed.values()
                records = sum(b.record_count - b.reported for b in sealed)
                if self._lost_welcome.daemon_id == welcome.daemon_id:
                    # It ended the session (this process was silent, or read too slowly) and kept what it had.
                    log.warning("the kafka-sidecar daemon gave back the session it ended, with %d unreported "
                                "batch(es) (%d record(s))", len(sealed), records)
                else:
                    log.warning("the kafka-sidecar daemon took back %d unreported batch(es) of the lost session "
                                "(%d record(s), sent again)", len(sealed), records)
            self._lost_welcome = None
            self.shutdown_reason = None
            self.last_refusal = None
            self._close_lost_memory()
            self._memory = conn
            assert self._poller is not None
            self._poller.register(conn.fileno(), zmq.POLLIN)
            self.welcome = welcome
            self.settings = welcome.settings
            self._hello_sent = 0.0
            self._grants.pool_blocks = welcome.block_count
            self._accumulator.linger_s = self._linger_ms() / 1000  # the producer's, else the daemon's
            if self._fast_path_allowed():
                self._appender.enable()
            for topic in self._metadata.topics:
                self._outbox.post(ipc.Metadata(topic))  # a new session: follow the topics again
            self._cond.notify_all()
        log.debug("connected to kafka-sidecar at %s as client %s", self.endpoint, welcome.client_id)

    def _refused(self, error: ipc.Error) -> None:
        if error.code == ipc.ERROR_SHUTTING_DOWN:
            # The HELLO is said again in a while, to the daemon that takes this one's place.
            log.info("kafka-sidecar at %s: %s", self.endpoint, error.message)
        elif error.code == ipc.ERROR_VERSION:
            # The handshake itself: no session can be had with this daemon.
            log.error("the kafka-sidecar daemon refused the handshake: %s", error.message)
            self.session_error = SidecarUnavailableError(f"kafka-sidecar at {self.endpoint}: {error.message}")
        else:
            log.error("the kafka-sidecar daemon refused a message: %s", error.message)

    def _forget_session(self) -> None:
        """The session is gone and nobody took it back (lock held): what it held is gone, and its records'
        fate unknown."""
        self._appender.disable()
        # Their records stay outstanding until this thread has failed them: a flush() that returned
        # before would say that everything was delivered.
        lost = self._accumulator.abandon()
        self._grants.forget()
        self.welcome = None
        self._lost_welcome = None
        self._close_lost_memory()
        self._close_segment()
        if lost:
            log.error("%d record(s) handed to the lost session are failed as unknown", len(lost))
            # Completed after the lock is released, as deliveries are.
            self._lost += lost
            self._lost_error = SidecarUnavailableError(
                "the kafka-sidecar daemon lost this client's session (it took the client for dead, or could not "
                "take the session back after a restart): the delivery of this record is unknown")

    def _fail_lost(self) -> None:
        """Fail the records of a lost session, then count them out as _deliver does."""
        with self._cond:
            lost, self._lost = self._lost, []
            error = self._lost_error
            pending = sum(1 for future in lost if not future.done())
        assert error is not None, "_forget_session() sets it with the records it loses"
        fail(lost, error)
        with self._cond:
            self.count_done(failed=pending)
            self._cond.notify_all()

    def _hold_memory(self) -> None:
        """Keep the lost session's memory connection open, out of the poll (see ``_lost_memory``)."""
        if self._memory is not None:
            if self._poller is not None:
                self._poller.unregister(self._memory.fileno())
            self._lost_memory, self._memory = self._memory, None

    def _close_memory(self) -> None:
        if self._memory is not None:
            if self._poller is not None:
                self._poller.unregister(self._memory.fileno())
            self._memory.close()
            self._memory = None
        self._close_lost_memory()

    def _close_lost_memory(self) -> None:
        if self._lost_memory is not None:
            self._lost_memory.close()
            self._lost_memory = None

    def _close_segment(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment = None
        self._close_segment_fd()

    def _close_segment_fd(self) -> None:
        if self._segment_fd is not None:
            os.close(self._segment_fd)
            self._segment_fd = None

    def _release_session(self) -> None:
        with self._cond:
            self._accumulator.release_open()
            self._close_memory()
            self._close_segment()

    def close_inherited(self) -> None:
        """In a forked child: close this process's copies of the parent's connection and segment, so that
        the daemon sees the parent's end when it comes (the mapping stays: the parent's views are in it)."""
        self._close_memory()
        self._close_segment_fd()
