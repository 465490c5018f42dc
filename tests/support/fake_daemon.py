"""A fake kafka-sidecar daemon, for the faults of a daemon that a real one does not make (a WELCOME whose fields
are not of their kind, a segment that cannot be mapped) and for what a test wants said to a client when it wants it.

It speaks the IPC protocol over a real ZeroMQ ROUTER socket and serves a real memory socket beside it, as the
daemon does (client_stub.contract), and claims the batches its client publishes in the segment's control area
as the daemon does (client_stub.contract.batch_slots); nothing of the client is replaced.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, batch_slots, ipc, shared_memory
from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout, Segment

# How long the fake waits for a client's token once it connected to the memory socket (it sends it at once):
# only bounds a failure.
_TOKEN_TIMEOUT_S = 30.0
# How long it looks at the client's open batches after a WAKEUP (or a block request), as the daemon watches a
# client (service.front.open_batches.WATCH_MS).
_WATCH_NS = 1_000_000_000


class FakeDaemon:
    """A daemon at ``endpoint`` that serves its clients from a thread of its own until :meth:`close`.

    It welcomes every HELLO (taking the session it offers back if ``take_back``, else with a new one), hands a new
    segment over the memory socket (or takes the offered one back), grants every block request, says that every
    topic followed has one partition (numbering the topics of each session in the order followed), claims the
    batches the client publishes in its segment (linger.ms after each opened, or once published full; all of
    them at LASTSEAL and GOODBYE) and reports each delivered. It looks at the open batches for a while after each
    WAKEUP and block request, and never says in the segment's header that it does: the client says WAKEUP for
    each batch it opens. What a test may change: ``faulty_welcomes`` (fields that replace those of the next
    WELCOMEs, one dict each), ``faulty_segments`` (the sizes of the next segments), ``refusals`` (ERRORs that
    answer the next HELLOs instead of a WELCOME), ``handshake_refusals`` (the reasons the next memory handshakes
    are refused for), ``answers_hellos``, ``grants_blocks`` and ``reports_batches`` (False: it says nothing to a
    HELLO, to a block request, of a batch it claimed); what it may do: :meth:`say` a message to the client,
    :meth:`hang_up` its memory connections (as a daemon that dies: it claims nothing more of that segment). What
    it saw: ``hellos``, ``block_requests``, ``claimed`` (the batches it claimed, as it read them from their
    slots), ``wakeups``, ``heartbeats``, ``goodbyes``, ``segments_handed``, ``hung_up_by_client`` (memory
    connections the client closed).
    """

    def __init__(self, *, heartbeat_interval_ms: int = 1000, daemon_id: str = "fake") -> None:
        # A short path of its own: a Unix socket's path is at most 107 bytes.
        self._directory = tempfile.mkdtemp(prefix="fake-sidecar-")
        self.endpoint = f"ipc://{self._directory}/sidecar.sock"
        self.daemon_id = daemon_id
        self.layout = Layout(16384, 64)
        self.settings = ipc.WelcomeSettings(max_request_size=1048576, linger_ms=5, max_block_ms=60000,
                                            delivery_timeout_ms=120000, buffer_memory=self.layout.size,
                                            heartbeat_interval_ms=heartbeat_interval_ms)
        self.take_back = False
        self.faulty_welcomes: deque[dict[str, Any]] = deque()
        self.faulty_segments: deque[int] = deque()
        self.refusals: deque[ipc.Error] = deque()
        self.handshake_refusals: deque[str] = deque()
        self.answers_hellos = True
        self.grants_blocks = True
        self.reports_batches = True
        self.hellos: list[ipc.Hello] = []
        self.block_requests: list[ipc.Blocks] = []
        self.claimed: list[ipc.SealNotice] = []
        self.wakeups = 0
        self.heartbeats = 0
        self.goodbyes = 0
        self.segments_handed = 0
        self.hung_up_by_client = 0
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind(self.endpoint)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(shared_memory.memory_socket_path(self.endpoint, daemon_id))
        self._listener.listen(16)
        self._wake_r, self._wake_w = socket.socketpair()
        self._commands: deque[Callable[[], None]] = deque()
        self._poller = zmq.Poller()
        self._memory: dict[int, socket.socket] = {}  # the memory connections, by file descriptor
        self._tokens: dict[bytes, bool] = {}  # the WELCOMEs' tokens not used yet: whether the session is taken back
        self._client: bytes | None = None  # the identity of the last HELLO's socket
        self._next_client_id = 1
        self._free: list[int] = list(range(self.layout.block_count))
        self._offsets: dict[tuple[str, int], int] = {}
        # The session's segment, mapped, and its control area; the session's topics, by their number.
        self._segment: Segment | None = None
        self._control: ControlArea | None = None
        self._topic_names: list[str] = []
        self._watched_until_ns = 0  # it looks at the open batches until then
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="fake-daemon", daemon=True)
        self._thread.start()

    # -- what a test does --------------------------------------------------------------------------

    def say(self, message: ipc.Message) -> None:
        """Send ``message`` to the client of the last HELLO."""
        self._do(lambda: self._send(message))

    def reports_wanted(self) -> int:
        """What the client's segment's header says of its reports: not 0 while its process waits on one."""
        control = self._control
        return 0 if control is None else control.header(batch_slots.REPORTS_WANTED)

    def hang_up(self) -> None:
        """Close the memory connections, as a daemon that dies."""
        self._do(self._close_memory)

    def close(self) -> None:
        self._closing = True
        self._wake_w.send(b"\0")
        self._thread.join()
        self._close_memory()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._router.close()
        self._context.term()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _do(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake_w.send(b"\0")

    # -- the daemon's thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._listener.fileno(), zmq.POLLIN)
        self._poller.register(self._wake_r.fileno(), zmq.POLLIN)
        while not self._closing:
            for ready, _ in self._poller.poll(self._poll_timeout_ms()):
                if ready is self._router:
                    while self._router.poll(0):
                        identity, data = self._router.recv_multipart()
                        self._receive(identity, ipc.decode(data))
                elif ready == self._listener.fileno():
                    self._handshake()
                elif ready == self._wake_r.fileno():
                    self._wake_r.recv(4096)
                    while self._commands:
                        self._commands.popleft()()
                elif ready in self._memory and shared_memory.hung_up(self._memory[ready]):
                    self.hung_up_by_client += 1
                    self._poller.unregister(ready)
                    self._memory.pop(ready).close()
            if self._watched_until_ns:
                self._claim_ready()

    def _receive(self, identity: bytes, message: ipc.Message) -> None:
        if isinstance(message, ipc.Hello):
            self._client = identity
            self._hello(message)
        elif isinstance(message, ipc.Heartbeat):
            self.heartbeats += 1
        elif isinstance(message, ipc.Metadata):
            if message.topic not in self._topic_names:
                self._topic_names.append(message.topic)
            self._send(ipc.Topic(message.topic, 1, [0], None, self._topic_names.index(message.topic)))
        elif isinstance(message, ipc.Blocks):
            self.block_requests.append(message)
            self._watch()  # a client asks for blocks when it has filled those it had
            if self.grants_blocks:
                self._grant(message)
        elif isinstance(message, ipc.Release):
            self._free += message.blocks
        elif isinstance(message, ipc.Wakeup):
            self.wakeups += 1
            self._watch()
        elif isinstance(message, (ipc.LastSeal, ipc.Goodbye)):
            self.goodbyes += isinstance(message, ipc.Goodbye)
            self._claim_ready(claim_all=True)

    def _send(self, message: ipc.Message) -> None:
        assert self._client is not None, "no client said HELLO"
        self._router.send_multipart([self._client, ipc.encode(message)])

    def _hello(self, hello: ipc.Hello) -> None:
        self.hellos.append(hello)
        if not self.answers_hellos:
            return
        if self.refusals:
            self._send(self.refusals.popleft())
            return
        offered = None if hello.options.resume is None else ipc.Resume(*hello.options.resume)
        resumed = self.take_back and offered is not None
        if offered is not None and resumed:
            client_id = offered.client_id
        else:
            client_id, self._next_client_id = self._next_client_id, self._next_client_id + 1
        token = os.urandom(shared_memory.TOKEN_SIZE)
        self._tokens[token] = resumed
        self._topic_names = []  # the client follows its topics again, and hears their numbers in this session
        welcome = ipc.Welcome(PROTOCOL_VERSION, client_id, token, self.layout.block_size, self.layout.block_count,
                              self.settings, self.daemon_id, resumed, hello.options.hello_id)
        if self.faulty_welcomes:
            welcome = welcome._replace(**self.faulty_welcomes.popleft())
        self._send(welcome)
        if offered is not None and resumed:
            self._deliver([ipc.SealNotice(*notice) for notice in offered.sealed])  # sent again, and delivered

    def _handshake(self) -> None:
        conn, _ = self._listener.accept()
        try:
            self._answer(conn)
        except OSError:
            conn.close()  # the client went (it could not send its token, say)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_TOKEN_TIMEOUT_S)
        token, fds, _, _ = socket.recv_fds(conn, 4096, 1)
        try:
            if not token:
                raise ConnectionResetError("the client went before it said its token")
            resumed = self._tokens.pop(token, None)
            if resumed is None or self.handshake_refusals:
                reason = shared_memory.UNKNOWN_TOKEN if resumed is None else self.handshake_refusals.popleft()
                conn.sendall(shared_memory.ERR + reason.encode())
                conn.close()
                return
            if resumed:
                if fds:
                    self._map(fds[0])  # the segment of the session taken back: the client's to keep writing in
                    self._claim_handed_back()
                conn.sendall(shared_memory.OK)
            else:
                self.segments_handed += 1
                segment = os.memfd_create(f"fake-segment-{self.segments_handed}")
                size = self.faulty_segments.popleft() if self.faulty_segments else self.layout.size
                os.ftruncate(segment, size)
                if size == self.layout.size:
                    self._map(segment)
                socket.send_fds(conn, [shared_memory.OK], [segment])
                os.close(segment)
                self._free = list(range(self.layout.block_count))  # a new segment, all of its blocks free
        finally:
            for fd in fds:
                os.close(fd)
        conn.setblocking(False)
        self._memory[conn.fileno()] = conn
        self._poller.register(conn.fileno(), zmq.POLLIN)

    def _grant(self, request: ipc.Blocks) -> None:
        self._free.sort()
        for start in range(len(self._free) - request.count + 1):
            run = self._free[start:start + request.count]
            if not request.contiguous or run[-1] - run[0] == request.count - 1:
                del self._free[start:start + request.count]
                self._send(ipc.Grant(request.request_id, run))
                return
        self._send(ipc.GrantFailed(request.request_id, "the fake daemon has no such blocks free"))

    # -- the client's batches ----------------------------------------------------------------------

    def _map(self, fd: int) -> None:
        """Map the session's segment, instead of the last one."""
        self._unmap()
        self._segment = Segment(fd, self.layout)
        self._control = ControlArea(self._segment.control, self.layout.block_count)

    def _unmap(self) -> None:
        self._watched_until_ns = 0
        if self._control is not None:
            self._control.release()
            self._control = None
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def _claim_handed_back(self) -> None:
        """Claim, and report nothing of, what the client of a session taken back published: its HELLO offered every
        batch not reported, delivered then (a slot left open would be claimed again once its blocks are granted)."""
        assert self._control is not None
        for block in range(self.layout.block_count):
            if not self._control.claim_word(block) and batch_slots.unpack_published(self._control.published(block))[0]:
                self._control.claim(block)

    def _watch(self) -> None:
        self._watched_until_ns = time.monotonic_ns() + _WATCH_NS
        self._claim_ready()

    def _poll_timeout_ms(self) -> int | None:
        """Until it looks at the open batches again: every linger.ms of the daemon's while it watches them."""
        return self.settings.linger_ms if self._watched_until_ns else None

    def _claim_ready(self, *, claim_all: bool = False) -> None:
        """Claim the batches the client published that are ready (every one with records, with ``claim_all``), and
        report them delivered."""
        control = self._control
        if control is None:
            return
        now_ns = time.monotonic_ns()
        if now_ns > self._watched_until_ns:
            self._watched_until_ns = 0
        linger_ns = control.header(batch_slots.LINGER_NS)
        free = set(self._free)
        notices = []
        for block in range(self.layout.block_count):
            if block in free or control.claim_word(block):
                continue  # not the client's, or a batch claimed already (or not opened on a block granted again)
            record_count, _, full = batch_slots.unpack_published(control.published(block))
            if not record_count or not (claim_all or full or now_ns >= control.opened_ns(block) + linger_ns):
                continue
            record_count, length = control.claim(block)
            slot = control.snapshot(block)
            topic = self._topic_names[slot.topic_index] if slot.topic_index < len(self._topic_names) else ""
            notices.append(ipc.SealNotice(slot.batch_id, block, slot.block_count, topic, slot.partition, record_count,
                                          length, slot.base_timestamp, slot.max_timestamp,
                                          (now_ns - slot.opened_ns) // 1_000_000))
        self.claimed += notices
        if self.reports_batches:
            self._deliver(notices)

    def _deliver(self, notices: list[ipc.SealNotice]) -> None:
        reports = []
        for notice in notices:
            offset = self._offsets.get((notice.topic, notice.partition), 0)
            self._offsets[(notice.topic, notice.partition)] = offset + notice.record_count
            self._free += range(notice.first_block, notice.first_block + notice.block_count)
            reports.append(list(ipc.DeliveryReport(notice.batch_id, 0, ipc.WHOLE_BATCH, offset, -1, None)))
        if reports:
            self._send(ipc.Delivery(reports, []))

    def _close_memory(self) -> None:
        for fd, conn in list(self._memory.items()):
            self._poller.unregister(fd)
            conn.close()
        self._memory.clear()
        self._unmap()
