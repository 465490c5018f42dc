"""The front driven in-process: real ZeroMQ DEALER clients over inproc://, the memory socket's handshake done by hand
over a real Unix socket (the front's side served by the loop's poller in between), real memfd segments, a
ProducerCore that never reaches a broker (nothing runs its loop), a small BufferPool, and a clock the tests move."""

from __future__ import annotations

import os
import select
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import OK, Layout, Segment
from service.buffer_pool import FREE, SEALED, BufferPool
from service.config import ProducerConfig
from service.daemon_metrics import sidecar_metrics, stats_report
from service.front import FrontSettings, SidecarFront
from service.front.sessions import ClientSession
from service.poller import Poller
from service.producer.batch import ProducerBatch, TopicPartition
from service.producer.core import ProducerCore
from service.protocol import messages as m
from tests.support.producer_batches import queued
from tests.support.waiting import HANG_S

BLOCK = 4096
BLOCKS = 8
_WORD = (1 << 64) - 1
TIMEOUT_MS = 2000  # sidecar.client.timeout.ms
MAX_REQUEST_SIZE = 6000
T0 = 1_000_000


class FakeClock:
    """The front's clock, which only the test moves."""

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
        # Messages received while following a topic for publish(), for recv() to give next.
        self._pending: list[list[Any]] = []

    def send(self, *message: Any) -> None:
        self.sock.send(ipc.pack(*message))

    def recv(self) -> list[Any]:
        """The next message from the daemon (inproc: there at once, unless the front sent nothing)."""
        if self._pending:
            return self._pending.pop(0)
        assert self.sock.poll(HANG_S * 1000), "no message from the daemon"
        return ipc.unpack(self.sock.recv())

    def quiet(self) -> bool:
        """Nothing arrived (inproc delivers at once, so a short wait is enough)."""
        return not self._pending and self.sock.poll(20) == 0

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
        session = self.env.session(self.client_id)
        assert self.memory is not None and session.connection is not None
        self.memory.close()
        self.memory = None
        self.env.serve_until(lambda: session.connection is None)

    def memory_ended(self) -> bool:
        """Whether the daemon closed the memory connection (which says the session is over)."""
        assert self.memory is not None
        return ended(self.memory)

    def blocks(self, count: int, contiguous: bool = False, timeout_ms: int = 1000) -> list[int]:
        request_id = self.next_request
        self.next_request += 1
        self.send(ipc.Blocks.TYPE, request_id, count, contiguous, timeout_ms)
        self.env.pump()
        self.env.look()
        grant = self.recv()
        assert grant[:2] == [ipc.Grant.TYPE, request_id], grant
        return grant[2]

    def publish(self, *notices: list[Any], wakeup: bool = True, full: bool = True) -> None:
        """Publish batches in the slots of their first blocks, full (as a producer does when it closes them) or
        open (as it does while it appends, ``full=False``), then (``wakeup``) say WAKEUP: the daemon claims the
        full ones at once. Each notice's fields (see :func:`notice`) are written as they are, within the 64 bits of
        a word (the topic: by the session's number for it, following it first; a name the daemon refuses to
        follow, by a number it never gave; ``ago``: the batch opened that long before the front's clock)."""
        with self.control() as control:
            for batch_id, first, count, topic, partition, records, length, base_ts, max_ts, ago in notices:
                control.open(first, batch_id=batch_id & _WORD, topic_index=self.topic_index(topic),
                             partition=partition & 0xFFFFFFFF, block_count=count & _WORD,
                             base_timestamp=base_ts & _WORD, opened_ns=((self.env.clock() - ago) * 1_000_000) & _WORD)
                control.publish(first, records, length, max_ts & _WORD, full=full)
        if wakeup:
            self.send(ipc.Wakeup.TYPE)
            self.env.pump()
            self.env.look()

    @contextmanager
    def control(self) -> Iterator[ControlArea]:
        """The control area of the client's segment, as the client sees it (its header and slots)."""
        assert self.segment is not None
        control = ControlArea(self.segment.control, self.segment.layout.block_count)
        try:
            yield control
        finally:
            control.release()

    def topic_index(self, topic: str) -> int:
        """The session's number for ``topic``, which it follows first if it does not yet (what the daemon answers
        comes from recv() in its turn); 2**32 - 1 if the daemon refuses to follow it."""
        session = self.env.session(self.client_id)
        if topic not in session.topic_names:
            self.send(ipc.Metadata.TYPE, topic)
            self.env.pump()
            while self.sock.poll(20) != 0:
                self._pending.append(ipc.unpack(self.sock.recv()))
        return session.topic_names.index(topic) if topic in session.topic_names else 0xFFFFFFFF

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


def ended(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` closed it (within a short wait)."""
    if not select.select([conn], [], [], 0.05)[0]:
        return False
    try:
        return conn.recv(4096, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


class Env:
    """A front of its own on an inproc:// endpoint, with its pool, its poller and a core that never runs."""

    def __init__(self, max_blocks_per_process: int | None = None, reply_buffer_bytes: int = 8 << 20,
                 **settings: Any) -> None:
        """``settings``: more of the daemon's, by their names with _ for ."""
        self.clock = FakeClock()
        config = ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "max.request.size": MAX_REQUEST_SIZE,
                                 "sidecar.client.timeout.ms": TIMEOUT_MS,
                                 "sidecar.client.reply.buffer.bytes": reply_buffer_bytes,
                                 **{name.replace("_", "."): value for name, value in settings.items()}})
        self.poller = Poller()
        self.core = ProducerCore(config, clock=self.clock, poller=self.poller)
        self.pool = BufferPool(BLOCKS * BLOCK, BLOCK, max_blocks_per_process=max_blocks_per_process)
        self.context = zmq.Context()
        self.endpoint = f"inproc://front-{uuid.uuid4().hex}"
        self.front = SidecarFront(self.endpoint, self.pool, FrontSettings.from_config(config, BLOCK, BLOCKS),
                                  self.poller, append=self.core.append, topics=self.core.metadata,
                                  stats=lambda: stats_report(self.core, self.pool, self.front), clock=self.clock,
                                  context=self.context)
        self.clients: list[Client] = []
        self.sockets: list[socket.socket] = []

    def front_at(self, endpoint: str, **options: Any) -> SidecarFront:
        """Another front, at ``endpoint``, with this one's pool, poller, core and settings (``options``: the socket's
        mode and group)."""
        return SidecarFront(endpoint, self.pool, self.front.settings, self.poller, append=self.core.append,
                            topics=self.core.metadata, stats=dict, clock=self.clock, context=self.context, **options)

    def client(self, receive_hwm: int | None = None, own_process: bool = True) -> Client:
        """A client; one with a ``receive_hwm`` of 1 makes the daemon's replies wait as soon as it does not read.
        Each is a process of its own to the daemon, unless not ``own_process``: then the test's, as every other
        such client."""
        client = Client(self, receive_hwm, own_process)
        self.clients.append(client)
        return client

    def pump(self) -> None:
        """Let the front handle what the clients sent."""
        assert self.front.endpoint.socket.poll(HANG_S * 1000), "nothing reached the daemon"
        self.front.handle_readable()

    def look(self) -> None:
        """The turn's look at the open batches of the clients that said WAKEUP (or BLOCKS), as serve_due() begins."""
        self.front.open_batches.scan(self.clock())

    def serve(self, timeout_ms: int = 0) -> None:
        """One poll of the loop's poller, as the daemon's loop turns it: each client socket ready is served by its
        part."""
        self.poller.poll(timeout_ms)
        self.poller.serve_ready()

    def serve_until(self, condition: Callable[[], bool]) -> None:
        """Poll the loop's poller until ``condition()`` (what the poll waits for may be another process's, which a
        busy machine runs late); fails only on a hang."""
        deadline = time.monotonic() + HANG_S
        while not condition():
            assert time.monotonic() < deadline, "what the front waited for did not come"
            self.serve(50)

    def connect_memory(self, own_process: bool = False) -> socket.socket:
        """A connection to the memory socket, accepted by the front; with ``own_process``, connected by a child
        process that hands it over and exits (the kernel names the process that connected)."""
        path = self.front.endpoint.memory.path
        if own_process:
            parent_end, child_end = socket.socketpair()
            child = os.fork()
            if child == 0:
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                        conn.connect(path)
                        socket.send_fds(child_end, [b"c"], [conn.fileno()])
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
            with parent_end, child_end:
                _, [fd], _, _ = socket.recv_fds(parent_end, 1, 1)
            conn = socket.socket(fileno=fd)
        else:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(path)
        self.sockets.append(conn)
        self.serve()  # the listener is readable: the connection is accepted
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
        self.serve()  # the connection is readable: its token is read, and answered
        conn.settimeout(HANG_S)
        answer, fds, _, _ = socket.recv_fds(conn, 4096, 1, socket.MSG_CMSG_CLOEXEC)
        return conn, answer, fds

    def session(self, client_id: int) -> ClientSession:
        [session] = [s for s in self.front.sessions if s.client_id == client_id]
        return session

    def kept(self, client_id: int) -> ClientSession:
        session = self.front.sessions.kept_session(client_id)
        assert session is not None, f"client {client_id}'s session is not kept"
        return session

    def sidecar_metrics(self) -> dict[str, float]:
        """The sidecar's own metrics, as `kafka-sidecar stats` reads them."""
        return sidecar_metrics(self.core, self.pool, self.front)

    def state(self, client_id: int, block: int) -> int | None:
        """A block's state in the client's segment (FREE, OWNED, SEALED); None if the pool has no segment of it."""
        memory = self.pool._memory.get(client_id)
        return None if memory is None else memory.state[block]

    def queued(self, topic: str = "t", partition: int = 0) -> list[ProducerBatch]:
        return queued(self.core.accumulator, TopicPartition(topic, partition))

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for conn in self.sockets:
            conn.close()
        self.core.close(0)  # fails what is still queued: the batches let go of their shared memory
        self.front.close()
        self.pool.close()
        self.context.term()


def notice(batch_id: int = 1, first: int = 0, count: int = 1, topic: str = "t", partition: int = 0,
           records: int = 1, length: int = 100, base_ts: int = 1_700_000_000_000,
           max_ts: int = 1_700_000_000_000, ago: int = 0) -> list[Any]:
    """A batch's fields, as a client publishes them (see Client.publish), or hands them back as a notice."""
    return [batch_id, first, count, topic, partition, records, length, base_ts, max_ts, ago]


def deliveries(client: Client) -> list[list[Any]]:
    """The reports of the client's next message, which must be a DELIVERY."""
    message = client.recv()
    assert message[0] == ipc.Delivery.TYPE, message
    return message[1]


def seal_two_keep_two(env: Env, client: Client) -> tuple[list[int], list[int]]:
    run = client.blocks(4, contiguous=True)
    client.publish(notice(batch_id=1, first=run[0], count=2, length=5000))
    return run[:2], run[2:]


def check_ended(env: Env, client_id: int, sealed: list[int], unsealed: list[int], kept: bool = False) -> None:
    """The session is gone; its unsealed blocks are back in the pool at once, its sealed batch still goes
    (from its segment), and the segment is dropped with the last batch (unless ``kept`` for a client that may
    take the session back)."""
    assert client_id not in {s.client_id for s in env.front.sessions}
    assert all(env.state(client_id, b) == FREE for b in unsealed)
    assert all(env.state(client_id, b) == SEALED for b in sealed)
    assert env.pool.held_by(client_id) == len(sealed)
    assert env.pool.free_blocks == BLOCKS - len(sealed)
    [batch] = env.queued()
    assert batch.origin[0] == client_id  # still sent for the client that went
    batch.done(7, -1, None)
    assert env.pool.free_blocks == BLOCKS
    if kept:
        assert env.pool.held()[client_id] == 0 and env.sidecar_metrics()["sessions-kept"] == 1
    else:
        assert client_id not in env.pool.held()


def resume_of(daemon_id: str, sealed: list[list[Any]], block_size: int = BLOCK,
               block_count: int = BLOCKS, client_id: int = 1) -> dict[str, Any]:
    return {"resume": [daemon_id, client_id, block_size, block_count, sealed]}

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
