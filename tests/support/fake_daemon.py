"""A fake kafka-sidecar daemon, for the faults of a daemon that a real one does not make (a WELCOME whose fields
are not of their kind, a segment that cannot be mapped) and for what a test wants said to a client when it wants it.

It speaks the IPC protocol over a real ZeroMQ ROUTER socket and serves a real memory socket beside it, as the
daemon does (client_stub.contract); nothing of the client is replaced.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from client_stub.contract.shared_memory import Layout

# How long the fake waits for a client's token once it connected to the memory socket (it sends it at once):
# only bounds a failure.
_TOKEN_TIMEOUT_S = 30.0


class FakeDaemon:
    """A daemon at ``endpoint`` that serves its clients from a thread of its own until :meth:`close`.

    It welcomes every HELLO (taking the session it offers back if ``take_back``, else with a new one), hands a new
    segment over the memory socket (or takes the offered one back), grants every block request, says that every
    topic followed has one partition, and reports every batch sealed delivered. What a test may change:
    ``faulty_welcomes`` (fields that replace those of the next WELCOMEs, one dict each), ``faulty_segments`` (the
    sizes of the next segments), ``refusals`` (ERRORs that answer the next HELLOs instead of a WELCOME),
    ``handshake_refusals`` (the reasons the next memory handshakes are refused for), ``answers_hellos``,
    ``grants_blocks`` and ``reports_batches`` (False: it says nothing to a HELLO, to a block request, to a seal);
    what it may do: :meth:`say` a message to the client, :meth:`hang_up` its memory connections (as a daemon that
    dies). What it saw: ``hellos``, ``block_requests``, ``sealed`` (the seal notices), ``heartbeats``,
    ``segments_handed``, ``hung_up_by_client`` (memory connections the client closed).
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
        self.sealed: list[ipc.SealNotice] = []
        self.heartbeats = 0
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
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="fake-daemon", daemon=True)
        self._thread.start()

    # -- what a test does --------------------------------------------------------------------------

    def say(self, message: ipc.Message) -> None:
        """Send ``message`` to the client of the last HELLO."""
        self._do(lambda: self._send(message))

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
            for ready, _ in self._poller.poll():
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

    def _receive(self, identity: bytes, message: ipc.Message) -> None:
        if isinstance(message, ipc.Hello):
            self._client = identity
            self._hello(message)
        elif isinstance(message, ipc.Heartbeat):
            self.heartbeats += 1
        elif isinstance(message, ipc.Metadata):
            self._send(ipc.Topic(message.topic, 1, [0], None))
        elif isinstance(message, ipc.Blocks):
            self.block_requests.append(message)
            if self.grants_blocks:
                self._grant(message)
        elif isinstance(message, ipc.Release):
            self._free += message.blocks
        elif isinstance(message, (ipc.Seal, ipc.LastSeal)):
            notices = [ipc.SealNotice(*notice) for notice in message.notices]
            self.sealed += notices
            if self.reports_batches:
                self._deliver(notices)

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
        for fd in fds:
            os.close(fd)  # the segment of a session taken back: the client's to keep writing in
        if not token:
            raise ConnectionResetError("the client went before it said its token")
        resumed = self._tokens.pop(token, None)
        if resumed is None or self.handshake_refusals:
            reason = shared_memory.UNKNOWN_TOKEN if resumed is None else self.handshake_refusals.popleft()
            conn.sendall(shared_memory.ERR + reason.encode())
            conn.close()
            return
        if resumed:
            conn.sendall(shared_memory.OK)
        else:
            self.segments_handed += 1
            segment = os.memfd_create(f"fake-segment-{self.segments_handed}")
            os.ftruncate(segment, self.faulty_segments.popleft() if self.faulty_segments else self.layout.size)
            socket.send_fds(conn, [shared_memory.OK], [segment])
            os.close(segment)
            self._free = list(range(self.layout.block_count))  # a new segment, all of its blocks free
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

    def _deliver(self, notices: list[ipc.SealNotice]) -> None:
        reports = []
        for notice in notices:
            offset = self._offsets.get((notice.topic, notice.partition), 0)
            self._offsets[(notice.topic, notice.partition)] = offset + notice.record_count
            self._free += range(notice.first_block, notice.first_block + notice.block_count)
            reports.append(list(ipc.DeliveryReport(notice.batch_id, 0, ipc.WHOLE_BATCH, offset, -1, None)))
        if reports:
            self._send(ipc.Delivery(reports))

    def _close_memory(self) -> None:
        for fd, conn in list(self._memory.items()):
            self._poller.unregister(fd)
            conn.close()
        self._memory.clear()
