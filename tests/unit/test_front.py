"""SidecarFront driven in-process: real ZeroMQ DEALER clients over inproc://, the memory socket's handshake
done by hand over a real Unix socket (the daemon's side driven in between), real memfd segments, a
ProducerCore that never reaches a broker (nothing runs its loop), a small BufferPool, and a clock the tests
move."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import select
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from client_stub import errors
from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from client_stub.contract.shared_memory import ERR, OK, Layout, Segment, create_segment
from service import front as front_module
from service.buffer_pool import FREE, OWNED, SEALED, BufferPool
from service.config import ProducerConfig
from service.daemon import SidecarDaemon
from service.front import (
    MAX_MESSAGES_PER_CLIENT_PER_ITERATION,
    MAX_MESSAGES_PER_ITERATION,
    ClientSession,
    SidecarFront,
    max_message_size,
)
from service.producer.batch import ProducerBatch, TopicPartition
from service.producer.core import ProducerCore
from service.protocol import messages as m

BLOCK = 4096
BLOCKS = 8
TIMEOUT_MS = 2000  # sidecar.client.timeout.ms
MAX_REQUEST_SIZE = 6000
T0 = 1_000_000
HANDSHAKE_TIMEOUT_MS = 10_000  # how long a connection to the memory socket may take to send its token
ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Client:
    """An application process as the daemon sees it: a DEALER socket, and once it said HELLO, its connection
    to the memory socket and its segment (mapped here, as the client maps it)."""

    def __init__(self, env: Env, receive_hwm: int | None = None, own_process: bool = True) -> None:
        self.env = env
        # Whether the daemon sees it as a process of its own (else as the test's, as every other such client).
        self.own_process = own_process
        self.sock = env.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if receive_hwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, receive_hwm)
        self.sock.connect(env.endpoint)
        self.client_id = 0
        self.next_request = 1
        self.welcome: ipc.Welcome | None = None
        self.memory: socket.socket | None = None
        self.fd: int | None = None
        self.segment: Segment | None = None
        # What earlier sessions had: kept open until close(), for tests to look at.
        self._retired: list[Any] = []

    def send(self, *message: Any) -> None:
        self.sock.send(ipc.pack(*message))

    def recv(self, timeout_ms: int = 1000) -> list[Any]:
        assert self.sock.poll(timeout_ms), "no message from the daemon"
        return ipc.unpack(self.sock.recv())

    def quiet(self) -> bool:
        """Nothing arrived (inproc delivers at once, so a short wait is enough)."""
        return self.sock.poll(20) == 0

    def hello(self, pid: int | None = None, *, handshake: bool = True, hand_over: int | None = None,
              **options: Any) -> int:
        """HELLO, then (unless not ``handshake``) the memory handshake: a new segment, or if the daemon
        takes the session back, the segment ``hand_over`` handed to it."""
        self.send(ipc.Hello.TYPE, PROTOCOL_VERSION, pid or os.getpid(), "test-client", options)
        self.env.pump()
        message = self.recv()
        assert message[0] == ipc.Welcome.TYPE, message
        self.welcome = ipc.from_fields(message)
        self.client_id = self.welcome.client_id
        if handshake:
            self.handshake(hand_over if self.welcome.resumed else None)
        return self.client_id

    def handshake(self, hand_over: int | None = None) -> None:
        """The memory handshake of the last WELCOME, which must succeed."""
        assert self.welcome is not None
        conn, answer, fds = self.env.handshake(self.welcome.memory_token, hand_over, self.own_process)
        assert answer == OK, answer
        self._retired += [self.segment, self.fd, self.memory]
        self.memory = conn
        if hand_over is None:
            assert len(fds) == 1, "a new segment comes with the answer"
            self.fd = fds[0]
        else:
            assert fds == [], "a segment taken back is not handed back"
            self.fd = os.dup(hand_over)
        self.segment = Segment(self.fd, Layout(self.welcome.block_size, self.welcome.block_count))

    def hang_up(self) -> None:
        """The client's process is gone: its end of the memory connection closes, the daemon reads it."""
        connection = self.env.session(self.client_id).connection
        assert self.memory is not None and connection is not None
        self.memory.close()
        self.memory = None
        self.env.front.handle_ready([connection])

    def memory_ended(self) -> bool:
        """Whether the daemon closed the memory connection (which says the session is over)."""
        assert self.memory is not None
        return _ended(self.memory)

    def blocks(self, count: int, contiguous: bool = False, timeout_ms: int = 1000) -> list[int]:
        request_id = self.next_request
        self.next_request += 1
        self.send(ipc.Blocks.TYPE, request_id, count, contiguous, timeout_ms)
        self.env.pump()
        grant = self.recv()
        assert grant[:2] == [ipc.Grant.TYPE, request_id], grant
        return grant[2]

    def seal(self, *notices: list[Any]) -> None:
        self.send(ipc.Seal.TYPE, list(notices))
        self.env.pump()

    def error(self) -> str:
        """The text of the next message, which must be an ERROR."""
        return self.error_with_code()[1]

    def error_with_code(self) -> tuple[str, str]:
        message = self.recv()
        assert message[0] == ipc.Error.TYPE, message
        return message[1], message[2]

    def close(self) -> None:
        self.sock.close(linger=0)
        for item in [self.segment, self.fd, self.memory, *self._retired]:
            _close(item)


def _close(item: Any) -> None:
    if isinstance(item, Segment):
        try:
            item.close()
        except BufferError:
            pass  # a view of it is still referenced: unmapped when it goes
    elif isinstance(item, int):
        os.close(item)
    elif item is not None:
        item.close()


def _ended(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` closed it (within a short wait)."""
    if not select.select([conn], [], [], 0.05)[0]:
        return False
    try:
        return conn.recv(4096, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


class Env:
    def __init__(self, max_blocks_per_process: int | None = None, reply_buffer_bytes: int = 8 << 20,
                 **settings: Any) -> None:
        """``settings``: more of the daemon's, by their names with _ for ."""
        self.clock = FakeClock()
        config = {"bootstrap.servers": "127.0.0.1:9", "max.request.size": MAX_REQUEST_SIZE,
                  **{name.replace("_", "."): value for name, value in settings.items()}}
        self.core = ProducerCore(ProducerConfig(config), clock=self.clock)
        self.pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=max_blocks_per_process)
        self.context = zmq.Context()
        self.endpoint = f"inproc://front-{uuid.uuid4().hex}"
        self.front = SidecarFront(self.core, self.pool, self.endpoint, client_timeout_ms=TIMEOUT_MS,
                                  reply_buffer_bytes=reply_buffer_bytes, context=self.context)
        self.clients: list[Client] = []
        self.sockets: list[socket.socket] = []

    def client(self, receive_hwm: int | None = None, own_process: bool = True) -> Client:
        """A client; one with a ``receive_hwm`` of 1 makes the daemon's replies wait as soon as it does not read.
        Each is a process of its own to the daemon, unless not ``own_process``: then the test's, as every other
        such client."""
        client = Client(self, receive_hwm, own_process)
        self.clients.append(client)
        return client

    def pump(self) -> None:
        """Let the front handle what the clients sent."""
        assert self.front.socket.poll(1000), "nothing reached the daemon"
        self.front.handle_readable()

    def connect_memory(self, own_process: bool = False) -> socket.socket:
        """A connection to the memory socket, accepted by the front; with ``own_process``, connected by a child
        process that hands it over and exits (the kernel names the process that connected)."""
        if own_process:
            parent_end, child_end = socket.socketpair()
            child = os.fork()
            if child == 0:
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                        conn.connect(self.front.memory.path)
                        socket.send_fds(child_end, [b"c"], [conn.fileno()])
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
            with parent_end, child_end:
                _, [fd], _, _ = socket.recv_fds(parent_end, 1, 1)
            conn = socket.socket(fileno=fd)
        else:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(self.front.memory.path)
        self.sockets.append(conn)
        self.front.handle_ready([self.front.memory.listener])
        return conn

    def handshake(self, token: bytes, fd: int | None = None,
                  own_process: bool = False) -> tuple[socket.socket, bytes, list[int]]:
        """A client's half of the memory handshake as shared_memory.connect does it, with the front's half
        driven in between: the connection, the answer and the file descriptors that came with it."""
        conn = self.connect_memory(own_process)
        if fd is None:
            conn.send(token)
        else:
            socket.send_fds(conn, [token], [fd])
        self.front.handle_ready(list(self.front._handshakes))
        conn.settimeout(1)
        answer, fds, _, _ = socket.recv_fds(conn, 4096, 1, socket.MSG_CMSG_CLOEXEC)
        return conn, answer, fds

    def session(self, client_id: int) -> ClientSession:
        [session] = [s for s in self.front.sessions.values() if s.client_id == client_id]
        return session

    def state(self, client_id: int, block: int) -> int | None:
        """A block's state in the client's segment (FREE, OWNED, SEALED); None if the pool has no segment of it."""
        memory = self.pool._memory.get(client_id)
        return None if memory is None else memory.state[block]

    def queued(self, topic: str = "t", partition: int = 0) -> list[ProducerBatch]:
        return self.core.accumulator.queued_for(TopicPartition(topic, partition))

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for conn in self.sockets:
            conn.close()
        self.core.close(0)  # fails what is still queued: the batches let go of their shared memory
        self.front.close()
        self.pool.close()
        self.context.term()


@pytest.fixture
def env() -> Iterator[Env]:
    env = Env()
    try:
        yield env
    finally:
        env.close()


def notice(batch_id: int = 1, first: int = 0, count: int = 1, topic: str = "t", partition: int = 0,
           records: int = 1, length: int = 100, base_ts: int = 1_700_000_000_000,
           max_ts: int = 1_700_000_000_000, ago: int = 0) -> list[Any]:
    return [batch_id, first, count, topic, partition, records, length, base_ts, max_ts, ago]


def deliveries(client: Client) -> list[list[Any]]:
    message = client.recv()
    assert message[0] == ipc.Delivery.TYPE, message
    return message[1]


# -- handshake ------------------------------------------------------------------------------------


def test_hello_gets_a_welcome_then_its_segment_over_the_memory_socket(env: Env) -> None:
    client = env.client()
    claimed_pid = os.getpid() + 100_000  # what the HELLO says; the kernel says otherwise
    client.send(ipc.Hello.TYPE, PROTOCOL_VERSION, claimed_pid, "worker-1", {"linger_ms": 5, "hello_id": 7})
    env.pump()
    (kind, version, client_id, token, block_size, block_count, settings, daemon_id, resumed,
     hello_id) = client.recv()
    assert (kind, version, block_size, block_count, resumed, hello_id) == (ipc.Welcome.TYPE, PROTOCOL_VERSION,
                                                                           BLOCK, BLOCKS, False, 7)
    assert settings == {"max_request_size": MAX_REQUEST_SIZE, "linger_ms": 5, "max_block_ms": 60000,
                        "delivery_timeout_ms": 120000, "buffer_memory": BLOCKS * BLOCK,
                        "heartbeat_interval_ms": TIMEOUT_MS // 10,
                        # What the daemon's producer does, for clients to check their settings against.
                        "acks": -1, "compression_type": "none", "enable_idempotence": True, "retries": 2**31 - 1,
                        "batch_size": BLOCK, "request_timeout_ms": 30000, "max_in_flight_requests_per_connection": 5,
                        "retry_backoff_ms": 100, "allow_auto_create_topics": True}
    assert daemon_id == env.front.daemon_id
    # An inproc endpoint has no file beside which to put the memory socket: it is an abstract one.
    assert env.front.memory.path == shared_memory.memory_socket_path(env.endpoint, daemon_id)
    assert env.front.memory.path.startswith("\0")
    assert isinstance(token, bytes) and len(token) == 16
    session = env.session(client_id)
    assert (session.pid, session.name, session.connection) == (claimed_pid, "worker-1", None)
    conn, answer, fds = env.handshake(token)
    try:
        assert answer == OK and len(fds) == 1
        # The segment is an anonymous memory file of the pool's size, which the client can map.
        assert os.readlink(f"/proc/self/fd/{fds[0]}").startswith("/memfd:")
        assert os.fstat(fds[0]).st_size == BLOCKS * BLOCK
        segment = Segment(fds[0], Layout(BLOCK, BLOCKS))
        segment.blocks(BLOCKS - 1)[-4:] = b"last"
        segment.close()
    finally:
        for fd in fds:
            os.close(fd)
    # The connection stays, and the kernel's word on the process replaces the HELLO's.
    assert session.connection is not None and session.pid == os.getpid()
    assert not _ended(conn)
    # A second client gets another id.
    assert env.client().hello() != client_id


def test_the_segment_cannot_be_resized_by_the_client(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.fd is not None
    # The daemon maps it too: shrunk, the daemon's reads of it would fault.
    with pytest.raises(PermissionError):
        os.ftruncate(client.fd, BLOCK)
    with pytest.raises(PermissionError):
        os.ftruncate(client.fd, 2 * BLOCKS * BLOCK)
    with pytest.raises(PermissionError):
        fcntl.fcntl(client.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # nor can it be made read-only for the daemon
    assert os.fstat(client.fd).st_size == BLOCKS * BLOCK


@pytest.mark.parametrize("hello", [
    [ipc.Hello.TYPE, 99, 1234, "old", {}],
    [ipc.Hello.TYPE, 1, 1234, "of the shared segment", {"process": ["pid:[1]", 5]}],
    [ipc.Hello.TYPE, PROTOCOL_VERSION + 1, 1234, "newer, with another field", {}, "extra"],  # other fields
    [ipc.Hello.TYPE, 0],
    [ipc.Hello.TYPE, "1", 1234, "text version", {}],
], ids=["99", "1-previous", "next-more-fields", "0-fewer-fields", "text"])
def test_hello_of_another_version_is_refused_naming_both(env: Env, hello: list[Any]) -> None:
    client = env.client()
    client.send(*hello)
    env.pump()
    text = client.error()
    assert "protocol version mismatch" in text
    assert f"the client speaks {hello[1]!r}" in text
    assert f"this daemon speaks {PROTOCOL_VERSION}" in text
    assert env.front.sessions == {}
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert "send HELLO first" in client.error()


@pytest.mark.parametrize("hello", [
    [ipc.Hello.TYPE, PROTOCOL_VERSION, 1234, "x"],
    [ipc.Hello.TYPE, PROTOCOL_VERSION, 0, "x", {}],
    [ipc.Hello.TYPE, PROTOCOL_VERSION, "1234", "x", {}],
], ids=["missing-options", "pid-0", "pid-text"])
def test_malformed_hello_is_refused(env: Env, hello: list[Any]) -> None:
    client = env.client()
    client.send(*hello)
    env.pump()
    client.error()
    assert env.front.sessions == {}


@pytest.mark.parametrize("message", [
    [ipc.Blocks.TYPE, 1, 1, False, 100], [ipc.Seal.TYPE, [notice()]], [ipc.Release.TYPE, [0]], [ipc.Metadata.TYPE, "t"],
    [ipc.Heartbeat.TYPE], [ipc.Goodbye.TYPE],
], ids=lambda message: str(message[0]))
def test_messages_before_hello_are_refused(env: Env, message: list[Any]) -> None:
    client = env.client()
    client.send(*message)
    env.pump()
    assert "unknown client: send HELLO first" in client.error()
    assert env.pool.free_blocks == BLOCKS
    assert env.core.accumulator.queued_batches() == 0
    env.front.after_iteration()
    assert client.quiet()  # no DELIVERY for a client without a session


def test_garbage_is_refused_and_counted(env: Env) -> None:
    client = env.client()
    client.sock.send(b"\xc1not msgpack")
    env.pump()
    assert "not a msgpack message" in client.error()
    client.sock.send_multipart([ipc.pack(ipc.Heartbeat.TYPE), b"second frame"])
    env.pump()
    assert "exactly one frame, got 2" in client.error()
    client.hello()
    client.send(999)
    client.send(True)  # msgpack's true is not HELLO (1)
    env.pump()
    assert "unknown message type 999" in client.error()
    assert "starts with its type" in client.error()
    assert env.front.messages_refused == 4
    assert len(env.front.sessions) == 1


def test_hello_again_ends_the_first_session(env: Env) -> None:
    client = env.client()
    first_id = client.hello()
    first_token = client.welcome.memory_token
    first_memory = client.memory
    assert first_memory is not None
    client.blocks(3)
    second_id = client.hello()
    assert second_id != first_id
    assert [s.client_id for s in env.front.sessions.values()] == [second_id]
    # The first session's blocks went back to the pool, and its segment is gone with nothing left in it.
    assert env.pool.held_by(first_id) == 0 and first_id not in env.pool.held()
    assert env.pool.free_blocks == BLOCKS
    # Its memory connection was closed, its token is spent; the new session has a segment of its own.
    assert _ended(first_memory)
    _, answer, fds = env.handshake(first_token)
    assert answer.startswith(ERR) and fds == []
    assert client.blocks(2) == [0, 1] and env.pool.held_by(second_id) == 2


# -- the memory socket ----------------------------------------------------------------------------


def test_blocks_are_refused_until_the_memory_handshake(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    client.send(ipc.Blocks.TYPE, 1, 2, False, 1000)
    env.pump()
    assert f"client {client_id} has no segment" in client.error()
    assert client.recv()[:2] == [ipc.GrantFailed.TYPE, 1]
    client.seal(notice(batch_id=4))
    assert "after its memory handshake" in client.error()
    assert env.pool.free_blocks == BLOCKS and env.pool.held() == {}
    client.handshake()
    assert client.blocks(2) == [0, 1]
    assert env.pool.held_by(client_id) == 2


def test_memory_handshake_with_an_unknown_token_is_refused(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False)
    conn, answer, fds = env.handshake(bytes(16))
    assert answer == ERR + b"unknown token: say HELLO first" and fds == []
    assert _ended(conn)
    # The session waiting for its own token is untouched.
    assert env.session(client.client_id).connection is None
    client.handshake()
    assert env.session(client.client_id).connection is not None


def test_a_token_is_good_for_one_handshake(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.welcome is not None and client.fd is not None
    conn, answer, fds = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"unknown token" in answer and fds == []
    assert _ended(conn)
    # The session keeps its segment and its connection.
    assert env.session(client.client_id).connection is not None and not client.memory_ended()
    assert len(env.pool.held()) == 1


@pytest.mark.parametrize("data", [b"short", bytes(17), b""], ids=["short", "long", "empty"])
def test_memory_handshake_that_is_no_token_is_closed_without_answer(env: Env, data: bytes) -> None:
    client = env.client()
    client.hello(handshake=False)
    conn = env.connect_memory()
    conn.send(data)
    env.front.handle_ready(list(env.front._handshakes))
    assert _ended(conn)
    assert not env.front._handshakes and env.front.messages_refused == 1
    assert env.session(client.client_id).connection is None and env.pool.held() == {}


def test_memory_connection_that_sends_no_token_is_closed_after_a_while(env: Env) -> None:
    conn = env.connect_memory()
    env.clock.advance(HANDSHAKE_TIMEOUT_MS - 1)
    env.front.after_iteration()
    assert not _ended(conn)
    env.clock.advance(1)
    env.front.after_iteration()
    assert _ended(conn) and not env.front._handshakes


def test_a_session_without_its_memory_handshake_ends_after_a_while(env: Env) -> None:
    # Sessions are bounded per process, and only a memory handshake says which process a session is.
    client = env.client()
    client.hello(handshake=False)
    for _ in range(HANDSHAKE_TIMEOUT_MS // 1000 - 1):
        env.clock.advance(1000)
        client.send(ipc.Heartbeat.TYPE)  # not silent, but no handshake either
        env.pump()
        env.front.after_iteration()
    assert len(env.front.sessions) == 1 and env.front.next_timer_ms() == 1000
    env.clock.advance(1000)
    env.front.after_iteration()
    assert env.front.sessions == {}
    assert client.welcome is not None
    conn, answer, _ = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"unknown token" in answer


def test_a_segment_handed_over_without_a_resume_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    fd = create_segment(Layout(BLOCK, BLOCKS), "test")
    try:
        conn, answer, fds = env.handshake(client.welcome.memory_token, fd)
    finally:
        os.close(fd)
    assert answer.startswith(ERR) and b"does not resume" in answer and fds == []
    assert _ended(conn)
    assert env.front.sessions == {} and client_id not in env.pool.held()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code()[0] == ipc.ERROR_UNKNOWN_CLIENT


def test_each_client_has_a_segment_of_its_own(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id, b_id = a.hello(), b.hello()
    assert a.fd is not None and b.fd is not None and a.segment is not None and b.segment is not None
    assert os.fstat(a.fd).st_ino != os.fstat(b.fd).st_ino  # two files, not two names of one
    # Blocks are numbered per client, and counted across clients against the pool.
    assert a.blocks(5) == [0, 1, 2, 3, 4]
    assert b.blocks(5) == [0, 1, 2]
    assert env.pool.free_blocks == 0
    a.segment.blocks(0)[:5] = b"AAAAA"
    b.segment.blocks(0)[:5] = b"BBBBB"
    assert bytes(a.segment.blocks(0)[:5]) == b"AAAAA"  # b's block 0 is not a's
    a.seal(notice(batch_id=1, length=5))
    b.seal(notice(batch_id=1, length=5))
    assert [(bytes(batch.records), batch.origin) for batch in env.queued()] == [(b"AAAAA", (a_id, 1)),
                                                                                  (b"BBBBB", (b_id, 1))]


def test_stats_report_what_the_pool_holds(env: Env) -> None:
    probe = env.client()
    probe.send(ipc.Stats.TYPE)
    env.pump()
    kind, report = probe.recv()
    assert kind == ipc.StatsReport.TYPE
    assert (report["clients"], report["held"], report["processes"]) == ([], [], [])
    assert {name: report["sidecar"][name] for name in ("blocks-total", "blocks-free", "sessions", "sessions-kept",
                                                      "blocks-granted", "blocks-sealed")} == {
        "blocks-total": BLOCKS, "blocks-free": BLOCKS, "sessions": 0, "sessions-kept": 0, "blocks-granted": 0,
        "blocks-sealed": 0}
    assert report["producer"]["buffer-total-bytes"] == report["producer"]["buffer-available-bytes"]
    a, b, c = env.client(), env.client(), env.client()
    a_id, b_id = a.hello(), b.hello()
    c_id = c.hello(pid=4242, handshake=False)  # no segment yet: it holds nothing, its pid is the HELLO's
    a.blocks(3)
    b.blocks(2, contiguous=True)
    b.seal(notice(batch_id=1, first=0))
    b.send(ipc.Goodbye.TYPE)  # its sealed batch is still to be sent, from its segment
    env.pump()
    probe.send(ipc.Stats.TYPE)
    env.pump()
    kind, report = probe.recv()
    assert kind == ipc.StatsReport.TYPE
    assert report["clients"] == [[a_id, env.session(a_id).pid, 3], [c_id, 4242, 0]]
    assert report["held"] == [[a_id, 3], [b_id, 1]]
    sidecar = report["sidecar"]
    assert (sidecar["blocks-free"], sidecar["blocks-granted"], sidecar["blocks-sealed"]) == (BLOCKS - 4, 3, 1)
    assert (sidecar["sessions"], sidecar["clients-connected"], sidecar["records-sealed-total"]) == (2, 1, 1)
    assert report["producer"]["buffer-available-bytes"] == (BLOCKS - 4) * env.pool.block_size
    # One process with a segment: a's (b said goodbye, c has made no memory handshake).
    assert [(p["pid"], p["sessions"], p["blocks-held"]) for p in report["processes"]] == [
        (env.session(a_id).pid, 1, 3)]
    # Asking is no session.
    assert len(env.front.sessions) == 2


# -- blocks ---------------------------------------------------------------------------------------


def test_blocks_are_granted(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    blocks = client.blocks(3)
    assert len(set(blocks)) == 3
    assert all(env.state(client_id, b) == OWNED for b in blocks)
    run = client.blocks(2, contiguous=True)
    assert run == [run[0], run[0] + 1] and not set(run) & set(blocks)
    assert env.pool.free_blocks == BLOCKS - 5 and env.pool.held_by(client_id) == 5


@pytest.mark.parametrize(("message", "answered"), [
    ([ipc.Blocks.TYPE, 1, 0, False, 100], True), ([ipc.Blocks.TYPE, 1, BLOCKS + 1, False, 100], True),
    ([ipc.Blocks.TYPE, 1, "2", False, 100], True), ([ipc.Blocks.TYPE, -1, 1, False, 100], False),
    ([ipc.Blocks.TYPE, 1, 1, False, -5], True), ([ipc.Blocks.TYPE, 1, 1, False], False),
    ([ipc.Blocks.TYPE, 1, True, False, 100], True),
], ids=["zero", "too-many", "text", "negative-id", "negative-timeout", "missing-field", "bool-count"])
def test_bad_block_requests_are_refused(env: Env, message: list[Any], answered: bool) -> None:
    client = env.client()
    client.hello()
    client.send(*message)
    env.pump()
    text = client.error()
    if answered:
        # The request itself fails too, so that the client does not wait for it until its timeout.
        assert client.recv() == [ipc.GrantFailed.TYPE, 1, f"the daemon refused the request: {text}"]
    assert client.quiet()
    assert env.pool.free_blocks == BLOCKS and not env.pool.waiters


def test_one_waiting_request_of_each_kind_per_client(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 1, False, 1000)
    b.send(ipc.Blocks.TYPE, 2, 1, False, 1000)
    b.send(ipc.Blocks.TYPE, 3, 2, True, 1000)
    b.send(ipc.Blocks.TYPE, 4, 2, True, 1000)
    env.pump()
    assert "request 1 for spare blocks is still waiting" in b.error()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 2]
    assert "request 3 for a run of blocks is still waiting" in b.error()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 4]
    assert [w.request_id for w in env.pool.waiters] == [1, 3]
    a.send(ipc.Release.TYPE, held)
    env.pump()
    env.front.after_iteration()
    assert b.recv()[:2] == [ipc.Grant.TYPE, 1]
    assert b.recv()[:2] == [ipc.Grant.TYPE, 3]


def test_a_client_at_its_limit_is_asked_to_seal_and_the_others_are_served() -> None:
    env = Env(max_blocks_per_process=4)
    try:
        a, b = env.client(), env.client()
        a_id = a.hello()
        b.hello()
        held = a.blocks(BLOCKS)
        assert len(held) == 4 and all(env.state(a_id, x) == OWNED for x in held)
        a.send(ipc.Blocks.TYPE, 9, 1, False, 1000)
        env.pump()
        env.front.after_iteration()
        # A waits for its own blocks: only A is asked to seal, and B is served at once.
        assert a.recv() == [ipc.SealNow.TYPE]
        assert b.quiet()
        assert len(b.blocks(BLOCKS)) == 4
        a.send(ipc.Release.TYPE, held[:1])
        env.pump()
        env.front.after_iteration()
        assert a.recv() == [ipc.Grant.TYPE, 9, held[:1]]
        assert env.pool.held_by(a_id) == 4
    finally:
        env.close()


def test_a_run_larger_than_a_client_may_hold_fails_at_once() -> None:
    env = Env(max_blocks_per_process=4)
    try:
        client = env.client()
        client.hello()
        client.send(ipc.Blocks.TYPE, 3, 5, True, 60_000)
        env.pump()
        assert "a process may hold 4 of the pool's 8" in client.error()
        assert client.recv()[:2] == [ipc.GrantFailed.TYPE, 3]
        assert not env.pool.waiters
    finally:
        env.close()


def test_release_gives_blocks_back(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id = a.hello()
    b_id = b.hello()
    mine = a.blocks(3)
    theirs = b.blocks(1)
    a.send(ipc.Release.TYPE, mine[:2])
    env.pump()
    assert a.quiet()
    assert [env.state(a_id, x) for x in mine] == [FREE, FREE, OWNED]
    # A block it does not hold (b holds a block of that number, in its own segment): refused, nothing freed.
    assert theirs[0] in mine[:2]
    a.send(ipc.Release.TYPE, [mine[2], theirs[0]])
    env.pump()
    assert "not granted to this client" in a.error()
    assert env.state(a_id, mine[2]) == OWNED and env.state(b_id, theirs[0]) == OWNED
    release = ipc.Release.TYPE
    for bad in ([release, "0"], [release, [0.5]], [release, [BLOCKS]], [release, [True]]):
        a.send(*bad)
        env.pump()
        a.error()
    assert env.pool.free_blocks == BLOCKS - 2
    assert (env.pool.held_by(a_id), env.pool.held_by(b_id)) == (1, 1)


def test_release_of_a_block_named_twice_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    [block] = client.blocks(1)
    client.send(ipc.Release.TYPE, [block, block])
    env.pump()
    assert "named more than once" in client.error()
    assert env.state(client_id, block) == OWNED
    assert env.pool.free_blocks == BLOCKS - 1


def test_abuse_of_its_own_blocks_cannot_make_the_daemon_grant_a_block_twice(env: Env) -> None:
    """The sequence that crashed the daemon: a block released three times, then requests that the
    pool, believing it had more free blocks than it had, served with one block twice."""
    hostile, good = env.client(), env.client()
    hostile_id = hostile.hello()
    good_id = good.hello()
    [block] = hostile.blocks(1)
    hostile.send(ipc.Release.TYPE, [block, block, block])
    env.pump()
    assert "named more than once" in hostile.error()
    mine = good.blocks(BLOCKS)
    assert len(mine) == BLOCKS - 1  # the block the hostile client still holds is not free
    hostile.send(ipc.Blocks.TYPE, 20, 2, True, 1)
    hostile.send(ipc.Blocks.TYPE, 21, 1, False, 60_000)
    env.pump()
    env.clock.advance(10)
    env.front.after_iteration()
    assert hostile.recv()[:2] == [ipc.GrantFailed.TYPE, 20]
    assert hostile.recv() == good.recv() == [ipc.SealNow.TYPE]  # the spare request waits for the pool
    good.send(ipc.Release.TYPE, mine[:1])
    env.pump()
    env.front.after_iteration()
    kind, request_id, [granted] = hostile.recv()
    assert (kind, request_id) == (ipc.Grant.TYPE, 21) and granted != block
    assert env.state(hostile_id, block) == env.state(hostile_id, granted) == OWNED
    assert env.state(good_id, mine[0]) == FREE and all(env.state(good_id, b) == OWNED for b in mine[1:])
    assert (env.pool.held_by(hostile_id), env.pool.held_by(good_id)) == (2, BLOCKS - 2)
    assert env.pool.free_blocks == 0 and not env.pool.waiters


# -- seal -----------------------------------------------------------------------------------------


def test_valid_seal_queues_a_batch_over_the_shared_memory(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    run = client.blocks(2, contiguous=True)
    segment = client.segment
    assert segment is not None
    written = bytes(range(251)) * 20  # 5020 bytes, across the block boundary
    segment.blocks(run[0], 2)[:len(written)] = written
    env.clock.advance(7)
    client.seal(notice(batch_id=41, first=run[0], count=2, topic="orders", partition=3, records=4,
                       length=len(written), base_ts=1_700_000_000_000, max_ts=1_700_000_000_009, ago=25))
    assert client.quiet()  # a seal is not answered; its DELIVERY comes when the batch is finished
    [batch] = env.queued("orders", 3)
    assert batch.tp == TopicPartition("orders", 3)
    assert (batch.record_count, batch.base_timestamp, batch.max_timestamp) == (4, 1_700_000_000_000,
                                                                               1_700_000_000_009)
    assert batch.created_ms == T0 + 7 - 25
    assert batch.origin == (client_id, 41)
    assert isinstance(batch.records, memoryview) and bytes(batch.records) == written
    # Zero-copy: the batch's records are the client's segment, not a copy of it.
    segment.blocks(run[0])[0:3] = b"NEW"
    assert bytes(batch.records[0:3]) == b"NEW"
    assert [env.state(client_id, b) for b in run] == [SEALED, SEALED]
    assert "orders" in env.core.metadata.topics()


def test_seal_of_blocks_granted_to_another_client_is_refused(env: Env) -> None:
    owner, thief = env.client(), env.client()
    owner_id = owner.hello()
    thief_id = thief.hello()
    blocks = owner.blocks(2, contiguous=True)
    thief.seal(notice(batch_id=7, first=blocks[0], count=2, length=200))
    assert "seal refused" in thief.error()
    assert env.core.accumulator.queued_batches() == 0
    # The owner's blocks are untouched, and the owner hears nothing; the thief was granted nothing.
    assert [env.state(owner_id, b) for b in blocks] == [OWNED, OWNED]
    assert env.pool.held_by(thief_id) == 0
    env.front.after_iteration()
    [[batch_id, first, count, base_offset, log_append_time, error]] = deliveries(thief)
    assert (batch_id, first, base_offset, log_append_time) == (7, 0, -1, -1)
    assert count >= 1  # every record of the batch
    failure = ipc.error_from_wire(error)
    assert isinstance(failure, errors.InvalidRequestError) and "not granted" in str(failure)
    assert owner.quiet()
    # The owner can still seal them.
    owner.seal(notice(batch_id=1, first=blocks[0], count=2, length=200))
    assert len(env.queued()) == 1


GOOD = notice(batch_id=5, first=0, count=2, length=5000, records=3)


def _with(**changes: Any) -> list[Any]:
    fields = dict(zip(ipc.SealNotice._fields, GOOD, strict=True))
    fields.update(changes)
    return [fields[name] for name in ipc.SealNotice._fields]


@pytest.mark.parametrize(("bad", "reason"), [
    (GOOD[:9], "a seal notice has the fields"),
    ([*GOOD, 0], "a seal notice has the fields"),
    (_with(first_block=-1), "first_block"),
    (_with(first_block=BLOCKS), "first_block"),
    (_with(block_count=0), "block_count"),
    (_with(block_count=3), "block 2 is not granted"),
    (_with(block_count=BLOCKS + 1), "block_count"),
    (_with(topic="bad topic"), "invalid topic name"),
    (_with(topic=""), "invalid topic name"),
    (_with(topic=".."), "invalid topic name"),
    (_with(topic=5), "invalid topic name"),
    (_with(topic="x" * 250), "invalid topic name"),
    (_with(partition=-1), "partition"),
    (_with(partition="0"), "partition"),
    (_with(partition=True), "partition"),
    (_with(partition=2**31), "partition"),
    (_with(record_count=0), "record_count"),
    (_with(record_count=1.0), "record_count"),
    (_with(record_count=5001), "record_count"),
    (_with(length=0), "length"),
    (_with(length=-5), "length"),
    (_with(length=None), "length"),
    (_with(length=2 * BLOCK + 1), "length"),
    (_with(length=MAX_REQUEST_SIZE + 1), "larger than max.request.size"),
    (_with(base_timestamp=-2), "base_timestamp"),
    (_with(max_timestamp="now"), "max_timestamp"),
    (_with(created_ms_ago=-1), "created_ms_ago"),
    (_with(created_ms_ago=2**41), "created_ms_ago"),
], ids=lambda value: str(value)[:40] if isinstance(value, str) else None)
def test_seal_with_bad_fields_is_refused(env: Env, bad: list[Any], reason: str) -> None:
    client = env.client()
    client_id = client.hello()
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.seal(bad)
    text = client.error()
    assert text.startswith("seal refused") and reason in text
    assert env.core.accumulator.queued_batches() == 0
    assert all(env.state(client_id, b) != SEALED for b in range(BLOCKS))
    env.front.after_iteration()
    [report] = deliveries(client)
    assert report[0] == 5 and report[3] == -1
    assert isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    # The client counts the batch as failed and will never use or release these blocks again:
    # those it holds went back to the pool.
    named = range(max(bad[1], 0), min(bad[1] + bad[2], BLOCKS))
    assert not any(env.state(client_id, b) == OWNED for b in named)
    assert env.pool.held_by(client_id) == 2 - len(set(named) & {0, 1})


@pytest.mark.parametrize("bad", [{"batch_id": 5}, 5, None, [], ["5", *GOOD[1:]], [True, *GOOD[1:]]],
                         ids=["map", "int", "nil", "empty", "text-id", "bool-id"])
def test_seal_notice_without_a_batch_id_is_refused_without_report(env: Env, bad: Any) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(2, contiguous=True)
    client.seal(bad)
    assert client.error().startswith("seal refused")
    env.front.after_iteration()
    assert client.quiet()
    assert env.core.accumulator.queued_batches() == 0
    # Nothing says which batch failed, so the client may still use its blocks.
    assert [env.state(client_id, 0), env.state(client_id, 1)] == [OWNED, OWNED]


@pytest.mark.parametrize("message", [[ipc.Seal.TYPE, {"1": notice()}], [ipc.Seal.TYPE, [notice()], "extra"],
                                     [ipc.Seal.TYPE]],
                         ids=["not-a-list", "extra-field", "no-notices"])
def test_malformed_seal_message_is_refused(env: Env, message: list[Any]) -> None:
    client = env.client()
    client.hello()
    client.blocks(1)
    client.send(*message)
    env.pump()
    client.error()
    assert env.core.accumulator.queued_batches() == 0


def test_one_bad_notice_does_not_spoil_the_others(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.blocks(3, contiguous=True) == [0, 1, 2]
    client.seal(notice(batch_id=1, first=0), notice(batch_id=2, first=1, topic="no/slash"),
                notice(batch_id=3, first=2, partition=1))
    assert "invalid topic name" in client.error()
    assert [b.origin[1] for b in env.queued("t", 0)] == [1]
    assert [b.origin[1] for b in env.queued("t", 1)] == [3]
    env.front.after_iteration()
    assert [report[0] for report in deliveries(client)] == [2]


def test_the_same_blocks_cannot_be_sealed_twice(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(1, contiguous=True)
    client.seal(notice(batch_id=1))
    client.seal(notice(batch_id=2))
    assert "not granted" in client.error()
    assert len(env.queued()) == 1
    assert env.state(client_id, 0) == SEALED  # the first batch still holds it


# -- delivery -------------------------------------------------------------------------------------


def test_finished_batch_is_reported_after_the_iteration_and_its_blocks_come_back(env: Env) -> None:
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    run = client.blocks(2, contiguous=True)
    client.seal(notice(batch_id=9, first=run[0], count=2, records=4, length=5000))
    [batch] = env.queued()
    batch.in_flight = True  # a request still holds the bytes
    assert batch.done(42, -1, None)
    assert client.quiet()  # reports go out after the loop iteration, batched
    env.front.after_iteration()
    assert deliveries(client) == [[9, 0, 4, 42, -1, None]]
    assert other.quiet()
    # The blocks stay sealed while a request may still write them to a socket.
    assert env.state(client_id, run[0]) == SEALED
    batch.in_flight = False
    batch.maybe_release()
    assert [env.state(client_id, b) for b in run] == [FREE, FREE]
    assert env.pool.free_blocks == BLOCKS


def test_reports_are_batched_per_client_and_carry_errors(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    a.blocks(2, contiguous=True)
    b_blocks = b.blocks(1)
    a.seal(notice(batch_id=1, first=0), notice(batch_id=2, first=1, partition=1, records=2))
    b.seal(notice(batch_id=1, first=b_blocks[0], partition=2))
    env.queued("t", 0)[0].done(100, 1_700_000_000_123, None)
    env.queued("t", 1)[0].done(-1, -1, errors.for_code(10, "batch too large"))
    env.front.after_iteration()
    reports = deliveries(a)
    assert reports[0] == [1, 0, 1, 100, 1_700_000_000_123, None]
    batch_id, first, count, base_offset, _, error = reports[1]
    assert (batch_id, first, count, base_offset) == (2, 0, 2, -1)
    failure = ipc.error_from_wire(error)
    assert isinstance(failure, errors.RecordTooLargeError) and failure.code == 10
    assert b.quiet()
    env.front.after_iteration()
    assert a.quiet()  # each report goes once
    assert env.pool.free_blocks == BLOCKS - 1  # b's batch is still queued


# -- sessions that end ----------------------------------------------------------------------------


def _seal_two_keep_two(env: Env, client: Client) -> tuple[list[int], list[int]]:
    run = client.blocks(4, contiguous=True)
    client.seal(notice(batch_id=1, first=run[0], count=2, length=5000))
    return run[:2], run[2:]


def _check_ended(env: Env, client_id: int, sealed: list[int], unsealed: list[int], kept: bool = False) -> None:
    """The session is gone; its unsealed blocks are back in the pool at once, its sealed batch still goes
    (from its segment), and the segment is dropped with the last batch (unless ``kept`` for a client that may
    take the session back)."""
    assert client_id not in {s.client_id for s in env.front.sessions.values()}
    assert all(env.state(client_id, b) == FREE for b in unsealed)
    assert all(env.state(client_id, b) == SEALED for b in sealed)
    assert env.pool.held_by(client_id) == len(sealed)
    assert env.pool.free_blocks == BLOCKS - len(sealed)
    [batch] = env.queued()
    assert batch.origin[0] == client_id  # still sent for the client that went
    batch.done(7, -1, None)
    assert env.pool.free_blocks == BLOCKS
    if kept:
        assert env.pool.held()[client_id] == 0 and env.front.sidecar_figures()["sessions-kept"] == 1
    else:
        assert client_id not in env.pool.held()


def test_goodbye_reclaims_unsealed_blocks_and_keeps_sealed_batches(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    sealed, unsealed = _seal_two_keep_two(env, client)
    client.send(ipc.Goodbye.TYPE)
    env.pump()
    assert client.memory_ended()
    _check_ended(env, client_id, sealed, unsealed)
    env.front.after_iteration()
    assert client.quiet()  # nobody to report to
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert "send HELLO first" in client.error()


def test_client_that_hangs_up_its_memory_connection_is_ended(env: Env) -> None:
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    sealed, unsealed = _seal_two_keep_two(env, client)
    client.hang_up()
    assert len(env.front.sessions) == 1
    _check_ended(env, client_id, sealed, unsealed)
    env.front.after_iteration()
    assert client.quiet() and other.quiet()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code() == (ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first")


def test_a_client_that_sends_on_its_memory_connection_is_ended(env: Env) -> None:
    # After its token a client sends nothing there: one that does is not a client (and must not keep the
    # daemon's loop reading).
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    sealed, unsealed = _seal_two_keep_two(env, client)
    assert client.memory is not None
    client.memory.send(b"noise")
    env.front.handle_ready([env.session(client_id).connection])
    assert [s.client_id for s in env.front.sessions.values()] == [other.client_id]
    assert client.memory_ended()
    _check_ended(env, client_id, sealed, unsealed)


def test_a_resume_holding_more_than_a_client_may_takes_back_what_it_may(env: Env) -> None:
    with restarted_daemon(env, max_blocks_per_process=2) as (old, restarted, client):
        sealed = [notice(batch_id=n, first=n) for n in range(4)]
        client_id = client.hello(hand_over=old.fd, **_resume(env.front.daemon_id, sealed))
        assert restarted.pool.held_by(client_id) == 2
        assert [b.origin[1] for b in restarted.queued()] == [0, 1]
        assert "seal refused" in client.error() and "seal refused" in client.error()
        restarted.front.after_iteration()
        assert sorted(report[0] for report in deliveries(client)) == [2, 3]


_MEMORY_CLIENT = """
import os, sys
from client_stub.contract import shared_memory
conn, fd = shared_memory.connect(bytes.fromhex(sys.argv[1]).decode(), bytes.fromhex(sys.argv[2]), 10.0)
print("ready", os.fstat(fd).st_size, flush=True)
sys.stdin.read()
"""


def test_session_ends_when_the_process_holding_its_memory_connection_dies(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    assert client.welcome is not None
    listener = env.front.memory.listener
    # Another process does the memory handshake, as the client library does it.
    child = subprocess.Popen([sys.executable, "-c", _MEMORY_CLIENT, env.front.memory.path.encode().hex(),
                              client.welcome.memory_token.hex()], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([listener], [], [], 10)[0], "the child did not connect"
        env.front.handle_ready([listener])
        assert select.select(list(env.front._handshakes), [], [], 10)[0], "the child sent no token"
        env.front.handle_ready(list(env.front._handshakes))
        assert child.stdout is not None and child.stdout.readline().split() == ["ready", str(BLOCKS * BLOCK)]
        session = env.session(client_id)
        assert session.pid == child.pid  # the kernel's word, not the HELLO's
        client.blocks(2)
        client.seal(notice(batch_id=1, first=0, count=1))
        connection = session.connection
        assert connection is not None
        assert not select.select([connection], [], [], 0.05)[0]  # alive: nothing to read
    finally:
        child.kill()
        child.communicate()
    assert select.select([connection], [], [], 5)[0]
    env.front.handle_ready([connection])
    assert env.front.sessions == {}
    _check_ended(env, client_id, [0], [1])


def test_silent_client_is_ended_after_the_timeout(env: Env) -> None:
    client, chatty = env.client(), env.client()
    client_id = client.hello()
    chatty_id = chatty.hello()
    sealed, unsealed = _seal_two_keep_two(env, client)
    env.clock.advance(TIMEOUT_MS)
    chatty.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.after_iteration()
    assert len(env.front.sessions) == 2  # exactly the timeout is not past it
    assert not client.memory_ended()
    env.clock.advance(1)
    env.front.after_iteration()
    assert [s.client_id for s in env.front.sessions.values()] == [chatty_id]
    # The daemon shut down its side of the memory connection: the client, if it wakes, learns its session is over.
    assert client.memory_ended() and not chatty.memory_ended()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code() == (ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first")
    _check_ended(env, client_id, sealed, unsealed, kept=True)
    # Stopped rather than dead, perhaps: what it had is kept until its process is gone.
    env.front.after_iteration()
    env.clock.advance(10 * TIMEOUT_MS)
    chatty.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.after_iteration()
    assert env.front.sidecar_figures()["sessions-kept"] == 1
    kept = env.front._ended[client_id].connection
    assert client.memory is not None and kept is not None
    client.memory.close()  # the process is gone
    client.memory = None
    env.front.handle_ready([kept])
    assert env.front.sidecar_figures()["sessions-kept"] == 0 and client_id not in env.pool.held()
    assert client.quiet()


def test_silent_clients_blocks_return_to_the_pool_at_once(env: Env) -> None:
    # Its blocks are in its own segment, which nobody else can map: nothing to wait for before others
    # are granted as many (in their own segments).
    silent, other = env.client(), env.client()
    silent_id = silent.hello()
    other_id = other.hello()
    silent.blocks(BLOCKS)
    other.send(ipc.Blocks.TYPE, 1, 3, False, 10 * TIMEOUT_MS)
    env.pump()
    env.front.after_iteration()
    assert other.recv() == silent.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(TIMEOUT_MS + 1)
    other.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.after_iteration()
    assert other.recv() == [ipc.SealNow.TYPE]  # in the iteration that ended the silent session
    assert env.pool.free_blocks == BLOCKS and env.pool.held() == {silent_id: 0, other_id: 0}  # its segment kept
    env.front.after_iteration()
    assert other.recv() == [ipc.Grant.TYPE, 1, [0, 1, 2]]
    assert env.pool.held() == {silent_id: 0, other_id: 3}


def test_silent_clients_waiting_request_goes_with_its_session(env: Env) -> None:
    a, silent = env.client(), env.client()
    a_id = a.hello()
    silent.hello()
    held = a.blocks(BLOCKS)
    silent.send(ipc.Blocks.TYPE, 1, 1, False, 10 * TIMEOUT_MS)
    env.pump()
    env.front.after_iteration()
    assert a.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(TIMEOUT_MS + 1)
    a.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.after_iteration()
    assert a.recv() == [ipc.SealNow.TYPE]  # in the iteration that ended the silent session
    # Nobody would take what the request is granted: it is dropped, and nobody is asked to seal for it.
    assert not env.pool.waiters and not env.pool.exhausted
    env.clock.advance(50)
    env.front.after_iteration()
    assert a.quiet()
    a.send(ipc.Release.TYPE, held[:1])
    env.pump()
    env.front.after_iteration()
    assert env.state(a_id, held[0]) == FREE and env.pool.free_blocks == 1


def test_heartbeats_keep_a_session(env: Env) -> None:
    client = env.client()
    client.hello()
    for _ in range(5):
        env.clock.advance(TIMEOUT_MS * 2 // 3)
        client.send(ipc.Heartbeat.TYPE)
        env.pump()
        env.front.after_iteration()
    assert len(env.front.sessions) == 1
    assert client.quiet() and not client.memory_ended()


# -- a session taken back after a restart ---------------------------------------------------------


@contextmanager
def restarted_daemon(env: Env, **options: Any) -> Iterator[tuple[Client, Env, Client]]:
    """A client of ``env``'s daemon (gone, as far as the test goes), a new daemon, and a client of the new one
    that offers it the old session."""
    old = env.client()
    old.hello()
    restarted = Env(**options)
    try:
        client = Client(restarted)
        restarted.clients.append(client)
        yield old, restarted, client
    finally:
        restarted.close()


def _resume(daemon_id: str, sealed: list[list[Any]], block_size: int = BLOCK,
            block_count: int = BLOCKS, client_id: int = 1) -> dict[str, Any]:
    return {"resume": [daemon_id, client_id, block_size, block_count, sealed]}


def test_a_new_daemon_takes_back_the_segment_and_the_sealed_batches(env: Env) -> None:
    # The session of a daemon that died (env's): blocks 0..3, batches sealed in blocks 2 then 0..1, not reported;
    # block 3 granted and unused (a client seals its open batches before it offers its session).
    with restarted_daemon(env) as (old, restarted, client):
        assert old.blocks(4, contiguous=True) == [0, 1, 2, 3]
        assert old.fd is not None and old.segment is not None
        first, second = b"first batch" * 10, bytes(range(256)) * 19  # the second across a block boundary
        old.segment.blocks(2)[:len(first)] = first
        old.segment.blocks(0, 2)[:len(second)] = second
        sealed = [notice(batch_id=7, first=2, count=1, records=2, length=len(first)),
                  notice(batch_id=8, first=0, count=2, records=5, length=len(second))]
        client_id = client.hello(hand_over=old.fd, **_resume(env.front.daemon_id, sealed))
        assert client.welcome is not None and client.welcome.resumed
        assert client.welcome.daemon_id == restarted.front.daemon_id != env.front.daemon_id
        # What its batches hold is counted against the new pool; the unused block is free again.
        assert restarted.pool.held_by(client_id) == 3 and restarted.pool.free_blocks == BLOCKS - 3
        assert [restarted.state(client_id, b) for b in range(4)] == [SEALED, SEALED, SEALED, FREE]
        # Its sealed batches are queued again, in the order sealed, their bytes read from the segment.
        batches = restarted.queued()
        assert [(b.origin, b.record_count, bytes(b.records)) for b in batches] == [
            ((client_id, 7), 2, first), ((client_id, 8), 5, second)]
        # The segment itself, not a copy of it.
        old.segment.blocks(2)[:5] = b"AFTER"
        assert bytes(batches[0].records[:5]) == b"AFTER"
        # New blocks come from the same segment.
        assert client.blocks(1) == [3]
        client.seal(notice(batch_id=9, first=3))
        assert client.quiet()
        assert [b.origin[1] for b in restarted.queued()] == [7, 8, 9]
        # Reported to it as any batch.
        batches[1].done(500, -1, None)
        restarted.front.after_iteration()
        assert deliveries(client) == [[8, 0, 5, 500, -1, None]]
        assert restarted.pool.held_by(client_id) == 2


def test_a_resumed_notice_that_is_not_valid_is_refused_as_a_seal_is(env: Env) -> None:
    with restarted_daemon(env) as (old, restarted, client):
        sealed = [notice(batch_id=1, first=0, topic="no such/topic"), notice(batch_id=2, first=1)]
        client_id = client.hello(hand_over=old.fd, **_resume(env.front.daemon_id, sealed))
        assert "invalid topic name" in client.error()
        assert [b.origin for b in restarted.queued()] == [(client_id, 2)]
        restarted.front.after_iteration()
        [report] = deliveries(client)
        assert report[0] == 1 and isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
        assert restarted.state(client_id, 0) == FREE and restarted.pool.held_by(client_id) == 1


def test_resumed_notices_naming_blocks_outside_the_pool_or_twice_fail_only_their_batches(env: Env) -> None:
    with restarted_daemon(env) as (old, restarted, client):
        sealed = [notice(batch_id=1, first=0), notice(batch_id=2, first=BLOCKS), notice(batch_id=3, first=0),
                  notice(batch_id=4, first=1)]
        client_id = client.hello(hand_over=old.fd, **_resume(env.front.daemon_id, sealed))
        assert client.welcome is not None and client.welcome.resumed
        assert "seal refused" in client.error() and "seal refused" in client.error()
        assert [b.origin for b in restarted.queued()] == [(client_id, 1), (client_id, 4)]
        restarted.front.after_iteration()
        assert sorted(report[0] for report in deliveries(client)) == [2, 3]
        assert restarted.pool.held_by(client_id) == 2


def test_a_resume_of_the_daemons_own_session_is_refused(env: Env) -> None:
    # This daemon ended that session itself (and sends, or sent, what it had of it): a new one is given.
    client = env.client()
    client_id = client.hello(**_resume(env.front.daemon_id, [notice(batch_id=1)]))
    assert client.welcome is not None and not client.welcome.resumed
    assert env.pool.held_by(client_id) == 0 and env.core.accumulator.queued_batches() == 0
    assert client.blocks(1) == [0]


def test_a_resume_of_another_layout_is_refused(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False, **_resume("gone", [], block_size=2 * BLOCK, block_count=BLOCKS // 2))
    assert client.welcome is not None and not client.welcome.resumed
    client.handshake()
    assert env.pool.held() == {client.client_id: 0}


def test_a_resumed_session_must_hand_over_its_segment(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False, **_resume("gone", []))
    assert client.welcome is not None and client.welcome.resumed
    conn, answer, fds = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"hands over its segment" in answer and fds == []
    assert _ended(conn) and env.front.sessions == {} and env.pool.free_blocks == BLOCKS


def _not_a_memfd(tmp_path: Path) -> int:
    return os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)


def _pipe(tmp_path: Path) -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def _too_small(tmp_path: Path) -> int:
    return create_segment(Layout(BLOCK, BLOCKS - 1), "too-small")


def _sealed(seals: int) -> Any:
    def make(tmp_path: Path) -> int:
        fd = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, BLOCKS * BLOCK)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd
    return make


F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in Python 3.11's fcntl


@pytest.mark.parametrize(("make", "reason"), [
    (_not_a_memfd, b"not a sealable memory file"),
    (_pipe, b"not a sealable memory file"),
    (_too_small, b"bytes, the pool's layout"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL), b"seals are"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW), b"seals are"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL), b"seals are"),
    (lambda tmp_path: os.memfd_create("unsealed"), b"seals are"),
], ids=["file", "pipe", "too-small", "may-grow", "may-be-sealed-later", "sealed-against-writes", "unsealed"])
def test_a_segment_handed_over_that_is_not_a_fit_is_refused(env: Env, tmp_path: Path, make: Any,
                                                             reason: bytes) -> None:
    client = env.client()
    client_id = client.hello(handshake=False, **_resume("gone", [notice(batch_id=1, first=2)]))
    assert client.welcome is not None and client.welcome.resumed
    fd = make(tmp_path)
    try:
        conn, answer, fds = env.handshake(client.welcome.memory_token, fd)
    finally:
        os.close(fd)
    assert answer.startswith(ERR) and reason in answer and fds == []
    assert _ended(conn)
    # Nothing of it was taken: no session, no blocks counted, no batch queued.
    assert env.front.sessions == {} and client_id not in env.pool.held() and env.pool.free_blocks == BLOCKS
    assert env.core.accumulator.queued_batches() == 0


# -- pool pressure --------------------------------------------------------------------------------


# -- replies a client does not read ----------------------------------------------------------------


def _refused_requests(client: Client, count: int) -> None:
    """``count`` BLOCKS requests the daemon refuses: each gets two replies, an ERROR and a GRANT_FAILED."""
    refused = client.env.front.messages_refused + count
    for n in range(count):
        client.send(ipc.Blocks.TYPE, 1000 + n, 0, False, 1000)
    while client.env.front.messages_refused < refused:
        client.env.pump()  # a turn handles a bounded number of one client's messages


def _read_all(env: Env, client: Client) -> list[list[Any]]:
    """What the daemon sends the client while the client reads, the front retrying what waits."""
    messages = []
    while True:
        while client.sock.poll(20):
            messages.append(ipc.unpack(client.sock.recv()))
        if not env.front.sidecar_figures()["reply-buffer-bytes"]:
            return messages
        env.front.after_iteration()


def test_replies_zeromq_will_not_queue_wait_for_the_client_in_order(env: Env) -> None:
    client = env.client(receive_hwm=1)
    client.hello()
    _refused_requests(client, 300)  # 600 replies: more than ZeroMQ queues for one client
    assert env.front.sidecar_figures()["reply-buffer-bytes"] > 0
    assert env.front.next_timer_ms() <= 10  # the loop comes back for them
    messages = _read_all(env, client)
    assert [m[1] for m in messages if m[0] == ipc.GrantFailed.TYPE] == list(range(1000, 1300))
    assert sum(m[0] == ipc.Error.TYPE for m in messages) == 300
    assert env.front.sidecar_figures()["replies-dropped-total"] == 0 and len(env.front.sessions) == 1


def test_an_error_quotes_at_most_a_few_hundred_characters_of_what_it_refuses(env: Env) -> None:
    client = env.client()
    client.hello()
    client.send(ipc.Blocks.TYPE, 1, "x" * 10_000, False, 1000)
    env.pump()
    text = client.error()
    assert "count must be an integer" in text and len(text) <= 400


def test_a_client_that_does_not_read_is_ended_past_its_reply_buffer_and_takes_its_session_back(
        caplog: pytest.LogCaptureFixture) -> None:
    env = Env(reply_buffer_bytes=65536)
    try:
        client, other = env.client(receive_hwm=1, own_process=False), env.client()
        client_id = client.hello()
        other.hello()
        assert client.blocks(2, contiguous=True) == [0, 1]
        assert client.segment is not None and client.fd is not None
        client.segment.blocks(0)[:100] = b"a" * 100
        client.seal(notice(batch_id=1, first=0))
        pid = env.session(client_id).pid
        with caplog.at_level(logging.WARNING, logger="service.front"):
            for _ in range(20):
                if not env.front.sessions.get(client.sock.getsockopt(zmq.ROUTING_ID)) and client.memory_ended():
                    break
                _refused_requests(client, 200)
        # Its session ended, and the log says which process did not read; the other client is served.
        assert client.memory_ended()
        assert [s.client_id for s in env.front.sessions.values()] == [other.client_id]
        assert f"client {client_id} (pid {pid}, uid {os.getuid()}" in caplog.text
        assert "does not read its replies" in caplog.text
        stats = env.front.sidecar_figures()
        assert (stats["sessions-ended-unread-total"], stats["sessions-kept"], stats["reply-buffer-bytes"]) == (1, 1, 0)
        # Its block granted and unsealed is the pool's again; its sealed batch is sent, its report kept.
        assert env.state(client_id, 1) == FREE and env.pool.held_by(client_id) == 1
        [batch] = env.queued()
        batch.done(41, -1, None)
        env.front.after_iteration()
        while client.sock.poll(20):
            client.sock.recv()  # what ZeroMQ had queued for it before its session ended
        # It sealed a second batch (in its block 1) when its session ended: the daemon never got it.
        client.segment.blocks(1)[:100] = b"b" * 100
        sealed = [notice(batch_id=1, first=0), notice(batch_id=2, first=1)]
        assert client.hello(hand_over=client.fd, **_resume(env.front.daemon_id, sealed, client_id=client_id)) \
            == client_id
        assert client.welcome is not None and client.welcome.resumed
        # Batch 1 is not sent again (its report is kept); batch 2 is sealed now, from the same segment.
        assert [(b.origin, bytes(b.records)) for b in env.queued() if not b.is_done] == [((client_id, 2), b"b" * 100)]
        env.front.after_iteration()
        assert deliveries(client) == [[1, 0, 1, 41, -1, None]]
        assert env.front.sidecar_figures()["sessions-kept"] == 0 and env.pool.held_by(client_id) == 1
    finally:
        env.close()


def test_a_kept_session_is_taken_back_only_with_its_segment(env: Env) -> None:
    client, thief = env.client(own_process=False), env.client(own_process=False)
    client_id = client.hello()
    thief.hello()
    client.blocks(1)
    client.seal(notice(batch_id=1, first=0))
    env.clock.advance(TIMEOUT_MS + 1)
    thief.send(ipc.Heartbeat.TYPE)
    env.pump()
    env.front.after_iteration()  # the silent client's session ends, kept
    assert client.memory_ended()
    env.queued()[0].done(5, -1, None)
    resume = _resume(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    other = create_segment(Layout(BLOCK, BLOCKS), "another segment")
    try:
        thief.send(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "thief", resume)
        env.pump()
        welcome = ipc.from_fields(thief.recv())
        assert isinstance(welcome, ipc.Welcome) and welcome.resumed and welcome.client_id == client_id
        conn, answer, _ = env.handshake(welcome.memory_token, other)
        assert answer.startswith(ERR) and b"not the one of the session" in answer and _ended(conn)
    finally:
        os.close(other)
    env.front.after_iteration()
    assert thief.quiet()  # nothing of the session reached the thief
    assert client.hello(hand_over=client.fd, **resume) == client_id
    env.front.after_iteration()
    assert deliveries(client) == [[1, 0, 1, 5, -1, None]]


def _kept(env: Env, client: Client) -> int:
    """A session of ``client`` with a batch sealed and reported, ended for silence and kept; its id."""
    client_id = client.hello()
    client.blocks(1)
    client.seal(notice(batch_id=1, first=0))
    env.clock.advance(TIMEOUT_MS + 1)
    env.front.after_iteration()
    assert client.memory_ended() and env.front.sidecar_figures()["sessions-kept"] == 1
    env.queued()[0].done(5, -1, None)
    return client_id


def test_a_pending_claim_does_not_keep_the_owner_from_its_session(env: Env) -> None:
    client, thief = env.client(own_process=False), env.client(own_process=False)
    client_id = _kept(env, client)
    resume = _resume(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    assert thief.hello(handshake=False, **resume) == client_id  # claimed, not proven
    assert client.hello(hand_over=client.fd, **resume) == client_id  # the owner proves it first
    env.front.after_iteration()
    assert deliveries(client) == [[1, 0, 1, 5, -1, None]]
    assert thief.welcome is not None
    conn, answer, _ = env.handshake(thief.welcome.memory_token, client.fd, own_process=False)
    assert answer.startswith(ERR) and b"keeps that session no more" in answer
    # The thief's end touched nothing of the owner's.
    assert [s.client_id for s in env.front.sessions.values()] == [client_id]
    assert env.pool.held_by(client_id) == 0 and client.blocks(1) == [0]


def test_a_session_is_taken_back_by_its_own_process_only(env: Env) -> None:
    client, other = env.client(own_process=False), env.client()
    client_id = _kept(env, client)
    resume = _resume(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
    other.hello(handshake=False, **resume)
    assert other.welcome is not None
    conn, answer, _ = env.handshake(other.welcome.memory_token, client.fd, own_process=True)
    assert answer.startswith(ERR) and b"was process" in answer
    assert env.front.sidecar_figures()["sessions-kept"] == 1


def test_a_session_is_taken_back_at_the_limit_of_sessions_of_its_process() -> None:
    env = Env(sidecar_process_max_sessions=1)
    try:
        client = env.client(own_process=False)
        client_id = _kept(env, client)
        resume = _resume(env.front.daemon_id, [notice(batch_id=1, first=0)], client_id=client_id)
        assert client.hello(hand_over=client.fd, **resume) == client_id  # the kept one is the one taken back
    finally:
        env.close()


def test_sessions_waiting_for_their_memory_handshake_are_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front_module, "_MAX_SESSIONS_AWAITING_HANDSHAKE", 2)
    first, second, third = env.client(), env.client(), env.client()
    first.hello(handshake=False)
    second.hello(handshake=False)
    third.send(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "third", {})
    env.pump()
    assert "2 sessions wait for their memory handshake" in third.error()
    first.handshake()
    third.hello(handshake=False)  # room again


def test_a_client_whose_socket_is_gone_is_ended_and_keeps_its_reports(env: Env) -> None:
    client = env.client(own_process=False)
    client_id = client.hello()
    client.blocks(1)
    client.seal(notice(batch_id=1, first=0))
    client.sock.close(linger=0)  # its memory connection stays: the process lives
    env.front.socket.poll(50)  # the ROUTER learns that the socket is gone
    env.queued()[0].done(3, -1, None)
    env.front.after_iteration()
    assert client.memory_ended() and env.front.sessions == {}
    figures = env.front.sidecar_figures()
    assert figures["sessions-kept"] == 1 and figures["replies-dropped-total"] == 0
    client.sock = env.context.socket(zmq.DEALER)
    client.sock.connect(env.endpoint)
    client.hello(hand_over=client.fd, **_resume(env.front.daemon_id, [notice(batch_id=1)], client_id=client_id))
    env.front.after_iteration()
    assert deliveries(client) == [[1, 0, 1, 3, -1, None]]


def test_an_answer_to_a_socket_without_a_session_that_zeromq_will_not_take_is_dropped_and_counted(env: Env) -> None:
    stranger = env.client(receive_hwm=1)
    for _ in range(400):
        stranger.send(ipc.Heartbeat.TYPE)  # each refused: "send HELLO first"
    while env.front.messages_refused < 400:
        env.pump()
    assert env.front.sidecar_figures()["replies-dropped-total"] > 0
    assert env.front.sidecar_figures()["messages-refused-total"] == 400


def test_exhausted_pool_asks_everyone_to_seal(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 77, 1, False, 1000)
    env.pump()
    assert b.quiet()  # waiting
    assert env.front.next_timer_ms() <= 50
    env.front.after_iteration()
    assert a.recv() == [ipc.SealNow.TYPE] and b.recv() == [ipc.SealNow.TYPE]
    assert env.pool.exhausted
    env.front.after_iteration()
    assert a.quiet() and b.quiet()  # not more often than every 50 ms
    env.clock.advance(50)
    env.front.after_iteration()
    assert a.recv() == [ipc.SealNow.TYPE] and b.recv() == [ipc.SealNow.TYPE]
    # a gives a block back: the waiting request is served, the pressure is off.
    a.send(ipc.Release.TYPE, [held[3]])
    env.pump()
    env.front.after_iteration()
    assert b.recv() == [ipc.Grant.TYPE, 77, [0]]  # its own block 0, in its segment
    assert not env.pool.exhausted
    env.clock.advance(50)
    env.front.after_iteration()
    assert a.quiet() and b.quiet()


def test_waiting_request_fails_at_its_timeout(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 5, 2, True, 300)
    env.pump()
    env.clock.advance(299)
    env.front.after_iteration()
    assert b.recv() == [ipc.SealNow.TYPE]
    env.clock.advance(1)
    env.front.after_iteration()
    kind, request_id, reason = b.recv()
    assert (kind, request_id) == (ipc.GrantFailed.TYPE, 5) and "no 2 free block(s)" in reason
    assert not env.pool.waiters and not env.pool.exhausted


def test_expired_request_at_the_head_does_not_hold_back_the_next(env: Env) -> None:
    a, b, c = env.client(), env.client(), env.client()
    a.hello()
    b.hello()
    c.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 4, True, 100)  # a run of four: cannot be served by one block
    env.pump()
    c.send(ipc.Blocks.TYPE, 2, 1, False, 1000)
    env.pump()
    a.send(ipc.Release.TYPE, [held[0]])
    env.pump()
    env.clock.advance(100)
    env.front.after_iteration()
    assert b.recv()[:2] == [ipc.GrantFailed.TYPE, 1]
    assert c.recv() == [ipc.Grant.TYPE, 2, [0]]


def test_blocks_granted_to_a_client_that_left_go_back(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id = a.hello()
    b.hello()
    held = a.blocks(BLOCKS)
    b.send(ipc.Blocks.TYPE, 1, 1, False, 1000)
    env.pump()
    b.send(ipc.Goodbye.TYPE)
    env.pump()
    assert not env.pool.waiters  # its request left with it
    a.send(ipc.Release.TYPE, held[:1])
    env.pump()
    env.front.after_iteration()
    assert env.pool.free_blocks == 1 and env.pool.held() == {a_id: BLOCKS - 1}


def test_next_timer_follows_sessions_and_waiters(env: Env) -> None:
    # Nothing to poll processes for: the memory connections' end wakes the loop.
    assert env.front.next_timer_ms() == TIMEOUT_MS
    client = env.client()
    client.hello()
    env.clock.advance(400)
    assert env.front.next_timer_ms() == TIMEOUT_MS - 400  # the session's silence timeout
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert env.front.next_timer_ms() == TIMEOUT_MS
    client.blocks(BLOCKS)
    client.send(ipc.Blocks.TYPE, 9, 1, False, 30)
    env.pump()
    assert env.front.next_timer_ms() == 30  # the waiter's deadline comes before the SEAL_NOW repeat
    env.clock.advance(40)
    assert env.front.next_timer_ms() == 0


# -- metadata -------------------------------------------------------------------------------------


def metadata_response(topics: dict[str, list[int]], topic_errors: dict[str, int] | None = None
                      ) -> m.MetadataResponse:
    """``topics``: name -> the leader of each partition (-1: none)."""
    R = m.MetadataResponse
    out = [R.MetadataResponseTopic(name=name, partitions=[
        R.MetadataResponseTopic.MetadataResponsePartition(partition_index=p, leader_id=leader, leader_epoch=0,
                                                          replica_nodes=[1], isr_nodes=[1])
        for p, leader in enumerate(leaders)]) for name, leaders in topics.items()]
    out += [R.MetadataResponseTopic(name=name, error_code=code) for name, code in (topic_errors or {}).items()]
    return R(brokers=[R.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=9, rack=None)],
             cluster_id="c", controller_id=1, topics=out)


def test_topic_pushed_when_metadata_knows_it(env: Env) -> None:
    client, other = env.client(), env.client()
    client.hello()
    other.hello()
    env.front.after_iteration()
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert client.quiet()  # not known yet
    assert "t" in env.core.metadata.topics() and env.core.metadata.update_requested
    env.core.metadata.update(metadata_response({"t": [1, 1, -1]}), env.clock())
    env.front.after_iteration()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1], None]
    assert other.quiet()  # it did not ask
    # The same again: nothing new to say.
    env.core.metadata.update(metadata_response({"t": [1, 1, -1]}), env.clock())
    env.front.after_iteration()
    assert client.quiet()
    # A leader appears.
    env.core.metadata.update(metadata_response({"t": [1, 1, 1]}), env.clock())
    env.front.after_iteration()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None]
    # Asking for a known topic is answered at once.
    other.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert other.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None]


def test_topic_errors_pushed_final_and_retriable(env: Env) -> None:
    client = env.client()
    client.hello(retriable_topic_errors=True)
    older = env.client()
    older.hello()  # a client from before retriable errors were pushed: it would fail on one at once
    for each in (client, older):
        each.send(ipc.Metadata.TYPE, "secret")
        each.send(ipc.Metadata.TYPE, "coming")
    env.pump()
    env.core.metadata.update(metadata_response({}, {"secret": 29, "coming": 3}), env.clock())
    env.front.after_iteration()
    for each in (client, older):
        kind, topic, count, available, error = each.recv()
        assert (kind, topic, count, available) == (ipc.Topic.TYPE, "secret", None, [])
        failure = ipc.error_from_wire(error)
        assert isinstance(failure, errors.AuthorizationError) and failure.name == "TOPIC_AUTHORIZATION_FAILED"
    # UNKNOWN_TOPIC_OR_PARTITION is retriable: the client keeps waiting, and can name it if it times out.
    kind, topic, count, available, error = client.recv()
    assert (kind, topic, count, available) == (ipc.Topic.TYPE, "coming", None, [])
    failure = ipc.error_from_wire(error)
    assert failure.retriable and failure.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert client.quiet()
    assert older.quiet()


def test_metadata_of_a_bad_topic_is_refused(env: Env) -> None:
    client = env.client()
    client.hello()
    client.send(ipc.Metadata.TYPE, "a b")
    env.pump()
    assert "invalid topic name" in client.error()
    assert "a b" not in env.core.metadata.topics()


def test_seal_of_a_partition_the_topic_does_not_have_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    env.core.metadata.update(metadata_response({"t": [1, 1, 1]}), env.clock())
    env.front.after_iteration()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None]
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.seal(notice(batch_id=1, first=0, partition=3), notice(batch_id=2, first=1, partition=2))
    assert "partition 3 of topic t does not exist: it has 3" in client.error()
    assert env.queued("t", 3) == [] and [b.origin[1] for b in env.queued("t", 2)] == [2]
    env.front.after_iteration()
    [report] = deliveries(client)
    assert report[0] == 1 and isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    assert env.state(client_id, 0) == FREE


@contextmanager
def topic_limits(limit: int, unknown_limit: int | None = None) -> Iterator[Env]:
    """A daemon whose processes may follow ``limit`` topics, ``unknown_limit`` the cluster does not have."""
    env = Env(sidecar_process_max_topics=limit, sidecar_process_max_unknown_topics=unknown_limit or limit)
    try:
        yield env
    finally:
        env.close()


def test_a_process_produces_to_a_limited_number_of_topics() -> None:
    with topic_limits(5) as env:
        client = env.client(own_process=False)
        client.hello()
        for n in range(5):
            client.send(ipc.Metadata.TYPE, f"topic-{n}")
        env.pump()
        assert client.quiet()
        client.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert "a process may produce to at most 5 topics (sidecar.process.max.topics)" in client.error()
        # The client's send() waits for the topic: it learns at once that it will not come.
        kind, topic, count, available, error = client.recv()
        assert (kind, topic, count, available) == (ipc.Topic.TYPE, "one-too-many", None, [])
        failure = ipc.error_from_wire(error)
        assert isinstance(failure, errors.InvalidRequestError) and "at most" in str(failure)
        assert "one-too-many" not in env.core.metadata.topics()
        # Nor can a seal notice name another topic (it would enter the daemon's metadata too).
        client.blocks(2, contiguous=True)
        client.seal(notice(batch_id=1, first=0, topic="one-too-many"), notice(batch_id=2, first=1, topic="topic-3"))
        assert "at most" in client.error()
        assert env.queued("one-too-many") == [] and len(env.queued("topic-3")) == 1
        # Asking again for a topic it has is no new topic; another session of the same process shares its
        # topics (following one of them is none new); another process counts its own.
        client.send(ipc.Metadata.TYPE, "topic-3")
        env.pump()
        assert client.quiet()
        same, other = env.client(own_process=False), env.client()
        same.hello()
        other.hello()
        same.send(ipc.Metadata.TYPE, "topic-4")
        same.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert "at most 5 topics" in same.error()
        other.send(ipc.Metadata.TYPE, "one-too-many")
        env.pump()
        assert other.quiet() and "one-too-many" in env.core.metadata.topics()
        # A session that ends gives back the topics only it followed.
        client.send(ipc.Goodbye.TYPE)
        env.pump()
        same.send(ipc.Metadata.TYPE, "a-new-one")
        env.pump()
        assert same.recv()[0] != ipc.Error.TYPE  # topic-0..3 went with the client; topic-4 stays the same's


def test_a_process_waits_for_a_limited_number_of_topics_the_cluster_does_not_have() -> None:
    with topic_limits(100, unknown_limit=3) as env:
        client = env.client()
        client.hello()
        for name in ("a", "b", "c"):
            client.send(ipc.Metadata.TYPE, name)
        env.pump()
        assert client.quiet()
        client.send(ipc.Metadata.TYPE, "d")
        env.pump()
        assert "wait for at most 3 topics the cluster does not have" in client.error()
        assert client.recv()[:3] == [ipc.Topic.TYPE, "d", None]  # its send() fails at once
        # Once the cluster has one of them, another may be asked for.
        env.core.metadata.update(metadata_response({"a": [0]}), env.clock())
        env.front.after_iteration()
        assert client.recv()[:3] == [ipc.Topic.TYPE, "a", 1]
        client.send(ipc.Metadata.TYPE, "d")
        env.pump()
        assert client.quiet() and "d" in env.core.metadata.topics()


def test_topics_are_followed_after_the_memory_handshake(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False)
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert "after its memory handshake" in client.error()
    assert "t" not in env.core.metadata.topics()


def test_a_process_has_a_limited_number_of_sessions() -> None:
    env = Env(sidecar_process_max_sessions=2)
    try:
        first, second, third = (env.client(own_process=False) for _ in range(3))
        elsewhere = env.client()
        first.hello()
        second.hello()
        third.hello(handshake=False)
        assert third.welcome is not None
        conn, answer, _ = env.handshake(third.welcome.memory_token, own_process=False)
        assert answer.startswith(ERR) and b"has 2 sessions, as many as sidecar.process.max.sessions" in answer
        assert _ended(conn) and len(env.front.sessions) == 2
        elsewhere.hello()  # another process
        # A session that ends makes room.
        first.send(ipc.Goodbye.TYPE)
        env.pump()
        third.hello()
        assert len(env.front.sessions) == 3
    finally:
        env.close()


def test_the_sessions_of_a_process_share_its_blocks() -> None:
    env = Env(max_blocks_per_process=4)
    try:
        a, b, elsewhere = env.client(own_process=False), env.client(own_process=False), env.client()
        a.hello()
        b.hello()
        elsewhere.hello()
        assert len(a.blocks(3)) == 3
        assert len(b.blocks(3)) == 1  # what is left of the process's share
        assert len(elsewhere.blocks(3)) == 3  # another process has its own
        assert env.pool.held_by_process(os.getpid()) == 4
    finally:
        env.close()


# -- robustness -----------------------------------------------------------------------------------


def test_exception_in_a_handler_does_not_escape(env: Env, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    def broken(front: SidecarFront, session: Any, message: list[Any]) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setitem(SidecarFront._HANDLERS, ipc.Heartbeat, broken)
    client = env.client()
    client.hello()
    client.send(ipc.Heartbeat.TYPE)
    client.send(ipc.Blocks.TYPE, 1, 1, False, 100)
    with caplog.at_level(logging.ERROR, logger="service.front"):
        env.pump()
    assert "error handling a client message" in caplog.text
    # The next message was still handled.
    assert client.recv()[:2] == [ipc.Grant.TYPE, 1]


def test_exception_from_the_core_does_not_escape(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    def append(batch: ProducerBatch) -> None:
        raise RuntimeError("the accumulator is broken")

    monkeypatch.setattr(env.core, "append", append)
    client = env.client()
    client.hello()
    client.blocks(1)
    client.seal(notice())
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert len(env.front.sessions) == 1
    # The batch that could not be queued failed: its records are reported, and its block is free again.
    env.front.after_iteration()
    [report] = deliveries(client)
    assert report[:4] == [1, 0, 1, -1]
    failure = ipc.error_from_wire(report[5])
    assert failure is not None and "could not queue the batch: the accumulator is broken" in str(failure)
    assert env.pool.free_blocks == BLOCKS


def test_a_broken_loop_exits_at_once_without_failing_what_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    # What one client or one batch causes is caught inside the loop; a loop that breaks itself (an error no
    # client can cause, injected here) exits, and the clients hand what they held to the next daemon.
    daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "buffer.memory": BLOCKS * BLOCK,
                                           "batch.size": BLOCK}), f"ipc://{tmp_path}/sidecar.sock")
    drained: list[int] = []
    turns = iter(range(3))
    threshold = gc.get_threshold()  # run() tunes the collector for the daemon's process: put it back after

    def broken(timeout_ms: int) -> None:
        if next(turns, None) is None:
            raise MemoryError("the loop is broken")

    try:
        with monkeypatch.context() as patch, caplog.at_level(logging.CRITICAL, logger="service.daemon"):
            patch.setattr(daemon.core, "run_once", broken)
            patch.setattr(daemon.core, "close", drained.append)
            with pytest.raises(MemoryError, match="the loop is broken"):
                daemon.run()
        assert drained == []  # no drain: nothing is sent, failed or reported on the way out
        [record] = caplog.records
        assert "the event loop failed: exiting without a drain" in record.getMessage()
        assert record.exc_info is not None and record.exc_info[0] is MemoryError
    finally:
        daemon.shutdown()
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_daemon_loop_survives_an_error_after_an_iteration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "buffer.memory": BLOCKS * BLOCK,
                                           "batch.size": BLOCK}), endpoint)
    context = zmq.Context()
    client = context.socket(zmq.DEALER)
    memory = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        def broken() -> None:
            raise IndexError("pop from empty list")

        with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, logger="service.daemon"):
            patch.setattr(daemon.front, "after_iteration", broken)
            daemon.run_once()
            daemon.run_once()
        assert daemon.iteration_errors == 2
        assert caplog.text.count("error in a loop iteration") == 1  # not at every iteration
        # It still serves.
        client.setsockopt(zmq.LINGER, 0)
        client.connect(endpoint)
        client.send(ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "after", {}))
        for _ in range(20):
            daemon.run_once()
            if client.poll(0):
                break
        welcome = ipc.decode(client.recv(zmq.NOBLOCK))
        assert isinstance(welcome, ipc.Welcome)
        # The loop serves the memory socket too, beside the ipc socket: the segment comes over it...
        memory.connect(f"{tmp_path}/sidecar.sock.memory")
        memory.send(welcome.memory_token)
        memory.setblocking(False)
        for _ in range(20):
            daemon.run_once()
            try:
                answer, fds, _, _ = socket.recv_fds(memory, 64, 1, socket.MSG_CMSG_CLOEXEC)
                break
            except BlockingIOError:
                pass
        for fd in fds:
            os.close(fd)
        assert answer == OK and len(fds) == 1
        assert len(daemon.front.sessions) == 1
        # ... and the end of its connection ends the session.
        memory.close()
        for _ in range(20):
            daemon.run_once()
            if not daemon.front.sessions:
                break
        assert daemon.front.sessions == {}
    finally:
        memory.close()
        client.close()
        context.term()
        daemon.shutdown()


def test_closed_core_fails_sealed_batches_at_once(env: Env) -> None:
    client = env.client()
    client.hello()
    client.blocks(1, contiguous=True)
    env.core.close(0)
    client.seal(notice(batch_id=3))
    env.front.after_iteration()
    [[batch_id, _, _, _, _, error]] = deliveries(client)
    assert batch_id == 3 and "closed" in str(ipc.error_from_wire(error))
    assert env.pool.free_blocks == BLOCKS


# -- the endpoint ---------------------------------------------------------------------------------


def test_second_daemon_on_an_ipc_endpoint_is_refused(env: Env, tmp_path: Path) -> None:
    from service.front import EndpointInUseError

    path = tmp_path / "run" / "sidecar.sock"
    endpoint = f"ipc://{path}"
    memory = path.with_name("sidecar.sock.memory")
    first = SidecarFront(env.core, env.pool, endpoint, context=env.context)
    try:
        assert path.exists()  # the directory was made
        assert stat.S_ISSOCK(memory.stat().st_mode) and first.memory.path == str(memory)
        with pytest.raises(EndpointInUseError, match="another kafka-sidecar daemon"):
            SidecarFront(env.core, env.pool, endpoint, context=env.context)
        # The refused one left the first's memory socket alone: its clients still get their segments.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.connect(str(memory))
        probe.close()
    finally:
        first.close()
    assert not path.exists() and not memory.exists()


def test_an_endpoint_locked_by_a_live_daemon_is_refused_before_its_socket_exists(env: Env, tmp_path: Path) -> None:
    # The lock, not a probe of the socket: a daemon that has taken the endpoint but not bound yet (or two
    # starting at once) cannot both be told the endpoint is free.
    from service.front import EndpointInUseError

    path = tmp_path / "sidecar.sock"
    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, sys; f = open({str(path) + '.lock'!r}, 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(EndpointInUseError):
            SidecarFront(env.core, env.pool, f"ipc://{path}", context=env.context)
    finally:
        holder.kill()
        holder.communicate()
    SidecarFront(env.core, env.pool, f"ipc://{path}", context=env.context).close()  # the holder is gone


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
@pytest.mark.parametrize(("mode", "directory_mode"), [(0o660, 0o750), (0o600, 0o700), (0o666, 0o755)])
def test_socket_and_its_directory_have_the_configured_mode_and_group_whatever_the_umask(
        env: Env, tmp_path: Path, umask: int, mode: int, directory_mode: int) -> None:
    path = tmp_path / "run" / "sidecar.sock"
    group = 65534 if os.geteuid() == 0 else os.getegid()
    previous = os.umask(umask)
    try:
        front = SidecarFront(env.core, env.pool, f"ipc://{path}", context=env.context, socket_mode=mode,
                             socket_group=group)
    finally:
        os.umask(previous)
    try:
        assert (stat.S_IMODE(path.stat().st_mode), path.stat().st_gid) == (mode, group)
        assert (stat.S_IMODE(path.parent.stat().st_mode), path.parent.stat().st_gid) == (directory_mode, group)
        # Whoever may use the ipc socket may get a segment over the memory socket, and nobody else.
        memory = path.with_name("sidecar.sock.memory")
        assert (stat.S_IMODE(memory.stat().st_mode), memory.stat().st_gid) == (mode, group)
    finally:
        front.close()


def test_stale_ipc_socket_files_are_replaced(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "sidecar.sock"
    for name, kind in ((path, socket.SOCK_STREAM), (path.with_name("sidecar.sock.memory"), socket.SOCK_SEQPACKET)):
        stale = socket.socket(socket.AF_UNIX, kind)
        stale.bind(str(name))
        stale.close()  # the file stays, nobody listens: a daemon that died
    front = SidecarFront(env.core, env.pool, f"ipc://{path}", context=env.context)
    client = env.context.socket(zmq.DEALER)
    memory = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.setsockopt(zmq.LINGER, 0)
        client.connect(f"ipc://{path}")
        client.send(ipc.pack(ipc.Heartbeat.TYPE))
        assert front.socket.poll(2000)
        front.handle_readable()
        assert client.poll(2000)
        assert ipc.unpack(client.recv())[0] == ipc.Error.TYPE
        memory.connect(str(path.with_name("sidecar.sock.memory")))
        memory.send(bytes(16))
        front.handle_ready([front.memory.listener])
        front.handle_ready(list(front._handshakes))
        memory.settimeout(1)
        assert memory.recv(4096).startswith(ERR)  # the new daemon answers there
    finally:
        memory.close()
        client.close()
        front.close()


def test_tcp_endpoint_in_use_is_an_error(env: Env) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    probe.listen()
    port = probe.getsockname()[1]
    try:
        with pytest.raises(zmq.ZMQError):
            SidecarFront(env.core, env.pool, f"tcp://127.0.0.1:{port}", context=env.context)
    finally:
        probe.close()


# -- bounds ---------------------------------------------------------------------------------------


def test_one_turn_handles_a_bounded_number_of_messages(env: Env) -> None:
    # Many clients' messages: each turn takes at most MAX_MESSAGES_PER_ITERATION, the rest the next turn.
    clients = [env.client() for _ in range(20)]
    for client in clients:
        for _ in range(60):
            client.sock.send(b"garbage")  # inproc: all of them are waiting before the front looks
    env.pump()
    assert env.front.messages_refused == MAX_MESSAGES_PER_ITERATION
    env.pump()
    assert env.front.messages_refused == 1200


def test_a_flooding_client_gets_a_bounded_share_of_a_turn(env: Env) -> None:
    # A client that floods the front does not keep the loop from the brokers and the other clients: its
    # messages and theirs are read in turn, and the turn ends after MAX_MESSAGES_PER_CLIENT_PER_ITERATION of its.
    flood, quiet = env.client(), env.client()
    quiet.hello()
    for _ in range(500):
        flood.sock.send(b"garbage")
    quiet.send(ipc.Metadata.TYPE, "t")
    env.pump()
    assert env.front.messages_refused == MAX_MESSAGES_PER_CLIENT_PER_ITERATION
    assert "t" in env.core.metadata.topics()  # the quiet client's message was handled in the same turn
    env.pump()
    assert env.front.messages_refused == 2 * MAX_MESSAGES_PER_CLIENT_PER_ITERATION


def test_a_client_sends_a_bounded_number_of_messages_ahead_of_the_front(env: Env) -> None:
    # What the daemon holds of a flooding client's messages is bounded: past them, the client's sends wait.
    flood = env.context.socket(zmq.DEALER)
    try:
        flood.setsockopt(zmq.SNDHWM, 1)
        flood.connect(env.endpoint)
        sent = 0
        with pytest.raises(zmq.Again):
            while True:
                flood.send(b"garbage", zmq.NOBLOCK)
                sent += 1
        assert 100 <= sent <= 110  # inproc: the front's receive high-water mark, and the client's one
        env.pump()
        assert flood.poll(1000, zmq.POLLOUT)  # read: it may send again
    finally:
        flood.close(linger=0)


def test_the_largest_message_is_what_a_client_may_hold_in_seal_notices(env: Env) -> None:
    assert env.front.max_message_size == max_message_size(BLOCKS)
    assert env.front.socket.getsockopt(zmq.MAXMSGSIZE) == env.front.max_message_size
    # A SEAL with a notice for every block a client may hold, each of the longest topic name, fits.
    notices = [notice(batch_id=2**62 + n, first=n, topic="t" * 249, base_ts=2**62, max_ts=2**62, ago=2**39)
               for n in range(BLOCKS)]
    assert len(ipc.pack(ipc.Seal.TYPE, notices)) < env.front.max_message_size
