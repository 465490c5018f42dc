"""The producer's I/O thread, as the Java producer's Sender thread.

One per producer and process. It sends what the producer queued (block requests,
releases, wake-ups), receives the daemon's messages (grants, topics, delivery
reports) and completes the records' futures, and sends heartbeats. It wakes for
those alone: the daemon lingers, and claims the batches the producer published in
its segment when they are due. It holds the sockets (to the daemon, and the memory
connections), the segment and its file descriptor, and carries out what the
session (:mod:`.session`, which decides) asks for: the HELLO, the memory
handshake, a session lost and held for the next daemon, one forgotten, the
GOODBYE. What the session logs, it logs once the producer's lock is released.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import ParamSpec, assert_never, cast

import zmq

from .accumulator import RecordAccumulator
from .block_grants import BlockGrants
from .contract import batch_slots, ipc, shared_memory
from .contract.batch_slots import ControlArea
from .contract.records import BATCH_HEADER_SIZE
from .contract.shared_memory import Layout, Segment
from .errors import KafkaError, KafkaTimeoutError, SidecarUnavailableError
from .fastpath import Appender
from .futures import RecordFuture, completer, fail
from .metadata import ProducerMetadata
from .outbox import Outbox
from .session import (
    Detach,
    Forget,
    HandOver,
    HoldMemory,
    MakeHandshake,
    Note,
    Outcome,
    SayGoodbye,
    SayHello,
    SendHeartbeat,
    Session,
    SessionProtocolError,
    Unreported,
)

# The producer's logger: what the I/O thread logs is the producer's to the application.
log = logging.getLogger("client_stub.producer")

# A batch not reported this long after the daemon's delivery.timeout.ms is given up on.
_REPORT_GRACE_MS = 30_000
# pyzmq's flags are enum.Flag members, whose & runs Python code: plain ints for the per-message calls.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_HEARTBEAT = ipc.encode(ipc.Heartbeat())
# How long the memory handshake may take.
_HANDSHAKE_TIMEOUT_S = 10.0
# Once the daemon is gone, how long to wait for more of what it sent before.
_DRAIN_WAIT_MS = 20

_Event = ParamSpec("_Event")


class IoThread:
    """The I/O thread of one producer in one process: it polls, receives and sends for its session.

    The segment, its file descriptor and the connection to the memory socket outlive a daemon that dies: they
    go to the next. ``segment`` is read by send() under the producer's lock.
    """

    def __init__(self, endpoint: str, cond: threading.Condition, session: Session, outbox: Outbox,
                 accumulator: RecordAccumulator, grants: BlockGrants, metadata: ProducerMetadata,
                 appender: Appender[RecordFuture], *, hello: Callable[[], ipc.Hello], linger_ms: Callable[[], int],
                 max_block_ms: Callable[[], int], fast_path_allowed: Callable[[], bool]) -> None:
        self.endpoint = endpoint
        self._cond = cond  # the producer's, on its lock
        self._session = session
        self._outbox = outbox
        self._accumulator = accumulator
        self._grants = grants
        self._metadata = metadata
        self._appender = appender
        self._hello = hello
        self._linger_ms = linger_ms
        self._max_block_ms = max_block_ms
        self._fast_path_allowed = fast_path_allowed
        self.segment: Segment | None = None
        self._segment_fd: int | None = None
        self._memory: socket.socket | None = None
        # The lost session's memory connection, open until the session is taken back or forgotten: a daemon
        # that ended the session itself keeps what it had of it while this connection is open.
        self._lost_memory: socket.socket | None = None
        self._poller: zmq.Poller | None = None
        # The records of a session forgotten, failed once the lock is released.
        self._lost: list[RecordFuture] = []
        self._lost_error: KafkaError | None = None
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
        """Have the thread send what is queued and a GOODBYE, then end (lock held; join() waits for it)."""
        self._stopping = True
        self._outbox.wake()

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
        poller = self._poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        # zmq.Poller reports a plain socket by its file descriptor, not as the object registered.
        wake_fd = self._outbox.bind()
        poller.register(wake_fd, zmq.POLLIN)
        session = self._session
        self._tell_session(session.start, time.monotonic())
        next_heartbeat = time.monotonic() + 1.0
        try:
            while True:
                if self._stopping:
                    self._tell_session(session.stop)
                    break
                if session.sends_queued:
                    self._outbox.send_all(self._sock)
                # In whole milliseconds, rounded up: rounding down would spin until the deadline.
                events = dict(poller.poll(max(math.ceil((next_heartbeat - time.monotonic()) * 1000), 0)))
                if wake_fd in events:
                    self._outbox.woken()
                if self._sock in events:
                    self._receive_all()
                if self._memory is not None and self._memory.fileno() in events and shared_memory.hung_up(self._memory):
                    self._drain()
                    self._tell_session(session.memory_hung_up, time.monotonic())
                if self._lost:
                    self._fail_lost()
                if time.monotonic() >= next_heartbeat:
                    self._tell_session(session.tick, time.monotonic())
                    self._expire_unreported()
                    settings = session.settings
                    interval = settings.heartbeat_interval_ms if settings else 1000
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

    def _thread_failed(self, exc: BaseException) -> None:
        error = KafkaError(f"the producer's I/O thread stopped ({type(exc).__name__}: {exc}): "
                           "this producer can send no more; make a new one")
        with self._cond:
            self._session.fail(error)
            self._appender.disable()
            # A lost session's records too: nothing will fail them now.
            futures = [*self._lost, *self._accumulator.abandon()]
            self._lost = []
            self.count_done(failed=self._appender.outstanding)
            self._cond.notify_all()
        fail(futures, error)

    def _expire_unreported(self) -> None:
        """Fail batches the daemon has not reported on long after its delivery.timeout.ms: it is gone."""
        settings = self._session.settings
        delivery_timeout_ms = settings.delivery_timeout_ms if settings else 120_000
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

    def _receive_all(self) -> None:
        """Handle every message waiting: called when a poll found the socket readable, so the first is there
        without asking (a wake that brings one message asks for the socket's events once, not twice)."""
        sock = self._sock
        assert sock is not None
        try:
            data = sock.recv(_NOBLOCK)
        except zmq.Again:
            return
        while True:
            try:
                self._handle(ipc.decode(data))
            except ipc.VersionMismatchError as exc:
                self._tell_session(self._session.mismatched, exc.version)
            except SessionProtocolError:
                log.exception("a bug of this client: its session with the daemon was told what it cannot take")
            except Exception:
                log.exception("cannot handle a message from the daemon")
            sock = self._sock  # the current one, each time: a message's handling may say HELLO on a new socket
            assert sock is not None
            # Asking for the events is cheaper than raising zmq.Again at the end of every batch.
            if not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:  # an int option (pyzmq types every option
                return                                             # int | bytes)
            data = sock.recv(_NOBLOCK)

    def _handle(self, message: ipc.Message) -> None:
        """One message of the daemon: each handler takes the producer's lock as it needs it."""
        match message:
            case ipc.Delivery():
                self._deliver(message)
            case ipc.Grant():
                self._granted(message)
            case ipc.GrantFailed():
                self._grant_failed(message)
            case ipc.Topic():
                self._topic(message)
            case ipc.SealNow():
                self._seal_now()
            case ipc.Welcome():
                self._welcomed(message)
            case ipc.Error():
                self._refused(message)
            case ipc.Shutdown():
                self._shutting_down(message)
            case (ipc.StatsReport() | ipc.Hello() | ipc.Blocks() | ipc.Release() | ipc.Metadata()
                  | ipc.Heartbeat() | ipc.Goodbye() | ipc.Stats() | ipc.LastSeal() | ipc.Wakeup()):
                pass  # not a client's concern: what the daemon says to the stats command, what clients say
            case _:
                assert_never(message)

    def _drain(self) -> None:
        """Take what the daemon sent before it went (its last reports, which need not be sent again), as
        ZeroMQ's I/O thread hands it over."""
        assert self._sock is not None
        while self._sock.poll(_DRAIN_WAIT_MS):
            self._receive_all()

    def _deliver(self, delivery: ipc.Delivery) -> None:
        # Only the bookkeeping holds the lock: send() must not wait while futures complete.
        with self._cond:
            reported, delivered, failed = self._appender.reported(delivery.reports)
            if delivery.spare:
                # After the reports: an open batch here on one of these blocks was reported, and is closed.
                self._accumulator.granted(delivery.spare)
                self._grants.handed_back(delivery.spare)
        try:
            for batch, first, count, base_offset, log_append_time_ms, error in reported:
                completer.complete(batch.futures, first, count, batch.topic, batch.partition, base_offset,
                                   log_append_time_ms, None if error is None else ipc.error_from_wire(error))
        finally:
            # Counted out after the callbacks ran: flush() returns once they have, as in the Java client.
            with self._cond:
                self.count_done(delivered=delivered, failed=failed)
                if not self._appender.outstanding:
                    # Under the lock, which send() holds (or finds free, in the fast path) to add one.
                    self._accumulator.reports_settled()
                self._cond.notify_all()

    def _granted(self, grant: ipc.Grant) -> None:
        with self._cond:
            self._accumulator.granted(grant.blocks)
            self._grants.granted(grant)
            self._cond.notify_all()

    def _grant_failed(self, failed: ipc.GrantFailed) -> None:
        with self._cond:
            self._grants.refused(failed)
            self._cond.notify_all()

    def _topic(self, topic: ipc.Topic) -> None:
        with self._cond:
            self._metadata.update(topic)
            self._cond.notify_all()

    def _seal_now(self) -> None:
        # The daemon has claimed what this producer published: what it needs of it is its spare blocks.
        with self._cond:
            self._grants.give_back_spare()
            self._cond.notify_all()

    def _refused(self, error: ipc.Error) -> None:
        self._tell_session(self._session.refused, error, time.monotonic())

    def _shutting_down(self, shutdown: ipc.Shutdown) -> None:
        self._tell_session(self._session.shutting_down, shutdown.reason)

    def _welcomed(self, welcome: ipc.Welcome) -> None:
        with self._cond:
            handshake = self._session.welcomed(welcome)
        if handshake is not None:
            self._make_handshake(handshake)

    # -- what the session asks for ---------------------------------------------------------------

    def _tell_session(self, event: Callable[_Event, Outcome], *args: _Event.args, **kwargs: _Event.kwargs) -> None:
        """Tell the session of an event (its method ``event``, called with ``args``) and carry out the outcome:
        under the producer's lock, then its log once the lock is released."""
        with self._cond:
            outcome = event(*args, **kwargs)
            self._carry_out(outcome)
        _write(outcome.notes)

    def _carry_out(self, outcome: Outcome) -> None:
        """Do what the session asked for, and wake whoever waits on the lock if what they wait for changed (lock
        held)."""
        for action in outcome.actions:
            match action:
                case SayHello():
                    self._say_hello(action)
                case SendHeartbeat():
                    self._send_heartbeat()
                case HandOver():
                    self._hand_over()
                case Detach():
                    self._detach()
                case HoldMemory():
                    self._hold_memory()
                case Forget():
                    self._forget()
                case SayGoodbye():
                    self._say_goodbye()
                case _:
                    assert_never(action)
        if outcome.wake:
            self._cond.notify_all()

    def _say_hello(self, hello: SayHello) -> None:
        """HELLO, offering the lost session's sealed batches if the session offers it; only its WELCOME
        counts."""
        if hello.reconnect:
            self._reconnect()
        assert self._sock is not None
        sealed = [] if hello.offer is None else self._accumulator.resume_notices(time.monotonic())
        self._sock.send(ipc.encode(hello.message(self._hello(), sealed)))

    def _reconnect(self) -> None:
        """A new socket to the daemon, for a HELLO said again: what the old one queued (the last HELLO,
        lost with a dying daemon or waiting for one that is down) is dropped, not delivered one day in a
        heap."""
        assert self._context is not None and self._sock is not None and self._poller is not None
        self._poller.unregister(self._sock)
        self._sock.close(0)
        self._sock = self._socket(self._context)
        self._poller.register(self._sock, zmq.POLLIN)

    def _send_heartbeat(self) -> None:
        assert self._sock is not None
        self._sock.send(_HEARTBEAT)

    def _stop_taking_records(self) -> None:
        """No more records for this session: the fast path stops, what is open is published full."""
        self._appender.disable()
        self._accumulator.seal_all()

    def _hand_over(self) -> None:
        assert self._sock is not None
        self._stop_taking_records()
        self._outbox.send_all(self._sock)  # what was queued for the session goes first
        self._sock.send(ipc.encode(ipc.LastSeal()))
        self._grants.forget()

    def _detach(self) -> None:
        # What was queued is dropped: the next HELLO offers every batch not reported.
        self._stop_taking_records()
        self._grants.forget()
        self._outbox.clear()

    def _hold_memory(self) -> None:
        if self._memory is not None:
            self._unpoll_memory()
            self._lost_memory, self._memory = self._memory, None

    def _forget(self) -> None:
        """What the lost session held is gone, and its records' fate unknown."""
        self._appender.disable()
        # Their records stay outstanding until this thread has failed them: a flush() that returned
        # before would say that everything was delivered.
        lost = self._accumulator.abandon()
        self._grants.forget()
        self._close_lost_memory()
        self._close_segment()
        if lost:
            # Failed, and said, after the lock is released, as deliveries are.
            self._lost += lost
            self._lost_error = SidecarUnavailableError(
                "the kafka-sidecar daemon lost this client's session (it took the client for dead, or could not "
                "take the session back after a restart): the delivery of this record is unknown")

    # -- the memory handshake --------------------------------------------------------------------

    def _make_handshake(self, handshake: MakeHandshake) -> None:
        """The memory handshake (without the lock: it may take a while): a new segment, mapped before the session
        is told, or the lost session's taken back. Whatever fails in it (the daemon may hand over what will not
        do) is the handshake's failure, which the session is told of."""
        welcome = handshake.welcome
        try:
            conn, fd, segment = self._connect_memory(handshake)
        except Exception as exc:
            self._tell_session(self._session.handshake_failed, exc, time.monotonic())
            return
        with self._cond:
            outcome = self._session.handshake_made(None if fd is not None else self._unreported())
            self._carry_out(outcome)  # the lost session, nobody took back, forgotten first
            if fd is not None:
                self._segment_fd, self.segment = fd, segment
            self._attach_memory(conn)
            self._open_session(welcome)
        _write(outcome.notes)
        log.debug("connected to kafka-sidecar at %s as client %s", self.endpoint, welcome.client_id)

    def _connect_memory(self, handshake: MakeHandshake) -> tuple[socket.socket, int | None, Segment | None]:
        """The session's memory connection, and its new segment's file descriptor and mapping (None, None: the
        lost session's was taken back). Nothing of it stays open if it fails."""
        welcome = handshake.welcome
        resume_fd = self._segment_fd if handshake.resume else None
        conn, fd = shared_memory.connect(handshake.path, welcome.memory_token, _HANDSHAKE_TIMEOUT_S, resume_fd)
        if fd is None:
            return conn, None, None
        try:
            return conn, fd, Segment(fd, Layout(welcome.block_size, welcome.block_count))
        except BaseException:
            conn.close()
            os.close(fd)
            raise

    def _unreported(self) -> Unreported:
        batches = self._accumulator.unreported.values()
        return Unreported(len(batches), sum(b.record_count - b.reported for b in batches))

    def _attach_memory(self, conn: socket.socket) -> None:
        """The session's memory connection, polled: it hangs up when the daemon is gone."""
        self._close_lost_memory()
        self._memory = conn
        assert self._poller is not None
        self._poller.register(conn.fileno(), zmq.POLLIN)

    def _open_session(self, welcome: ipc.Welcome) -> None:
        """The producer's parts take records for the session of ``welcome``."""
        assert self.segment is not None
        self._grants.pool_blocks = welcome.block_count
        linger_ms = self._linger_ms()  # the producer's, else the daemon's
        if self._accumulator.control is not None:
            self._accumulator.control.release()  # the lost session's, on the segment this one takes back
        control = self._accumulator.control = ControlArea(self.segment.control, welcome.block_count)
        control.set_header(batch_slots.LINGER_NS, linger_ms * 1_000_000)
        # Records in flight from the lost session may be waited on (a flush, their callbacks): their reports come
        # at once, until nothing is in flight.
        control.set_header(batch_slots.REPORTS_WANTED, 1 if self._appender.outstanding else 0)
        self._grants.attach(control, self._appender.spare_policy)
        self._metadata.new_session()
        settings = welcome.settings
        # The fast path opens batches of a block, for a record that fits in one within max.request.size.
        self._appender.attach(self.segment.buf, control.words, welcome.block_size,
                              max(min(welcome.block_size, settings.max_request_size - BATCH_HEADER_SIZE), 0),
                              linger_ms * 1_000_000, functools.partial(self._grants.take_spare, self._max_block_ms()))
        if self._fast_path_allowed():
            self._appender.enable()
        for topic in self._metadata.topics:
            self._outbox.post(ipc.Metadata(topic))  # a new session: follow the topics again

    # -- closing ---------------------------------------------------------------------------------

    def _fail_lost(self) -> None:
        """Fail the records of a lost session, then count them out as _deliver does."""
        with self._cond:
            lost, self._lost = self._lost, []
            error = self._lost_error
            pending = sum(1 for future in lost if not future.completed())
        assert error is not None, "_forget() sets it with the records it loses"
        log.error("%d record(s) handed to the lost session are failed as unknown", len(lost))
        fail(lost, error)
        with self._cond:
            self.count_done(failed=pending)
            self._cond.notify_all()

    def _unpoll_memory(self) -> None:
        if self._memory is not None and self._poller is not None:
            self._poller.unregister(self._memory.fileno())

    def _close_memory(self) -> None:
        if self._memory is not None:
            self._unpoll_memory()
            self._memory.close()
            self._memory = None
        self._close_lost_memory()

    def _close_lost_memory(self) -> None:
        if self._lost_memory is not None:
            self._lost_memory.close()
            self._lost_memory = None

    def _say_goodbye(self) -> None:
        """What is queued goes, and GOODBYE last (the daemon claims what the producer published)."""
        self._outbox.post(ipc.Goodbye())
        assert self._sock is not None
        self._outbox.send_all(self._sock)

    def _close_segment(self) -> None:
        self._appender.detach()
        if self._accumulator.control is not None:
            self._accumulator.control.release()
            self._accumulator.control = None
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
            self._grants.forget()
            self._accumulator.release_open()
            self._close_memory()
            self._close_segment()

    def close_inherited(self) -> None:
        """In a forked child: close this process's copies of the parent's connection and segment, so that
        the daemon sees the parent's end when it comes (the mapping stays: the parent's views are in it)."""
        self._close_memory()
        self._close_segment_fd()


def _write(notes: Sequence[Note]) -> None:
    """Log what the session said to (the producer's lock released)."""
    for note in notes:
        log.log(note.level, note.message, exc_info=note.exc)
