"""Selector: non-blocking connections, size-prefixed framing, partial reads and writes, polling
broker sockets together with ZeroMQ sockets.

The peer is a plain socket accepted from a listener on loopback, driven by the test itself.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.network.selector import Selector
from service.network.transport import WANT_READ, PlaintextTransport
from service.poller import POLLIN
from tests.support.waiting import HANG_S

NODE = 1


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def poll_until(selector: Selector, condition: Callable[[], bool], timeout: float = HANG_S,
               poll_ms: int = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the selector did not get there in time"
        selector.poll(poll_ms)


def poll_collect(selector: Selector, count: int, timeout: float = HANG_S) -> list[bytes]:
    """Poll until ``count`` frames have completed; returns them in order."""
    frames: list[bytes] = []

    def enough() -> bool:
        frames.extend(f for node, f in selector.completed_receives if node == NODE)
        selector.completed_receives = []
        return len(frames) >= count

    poll_until(selector, enough, timeout)
    return frames


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


@pytest.fixture
def selector() -> Iterator[Selector]:
    selector = Selector()
    yield selector
    selector.close_all()


def connect(selector: Selector, listener: socket.socket, node_id: int = NODE) -> socket.socket:
    """Connect ``node_id`` to ``listener``; returns the peer's (blocking) socket."""
    selector.connect(node_id, *listener.getsockname())
    peer, _ = listener.accept()
    poll_until(selector, lambda: selector.is_connected(node_id))
    return peer


@pytest.fixture
def peer(selector: Selector, listener: socket.socket) -> Iterator[socket.socket]:
    with connect(selector, listener) as sock:
        yield sock


def channel_socket(selector: Selector, node_id: int = NODE) -> socket.socket:
    return selector._channels[node_id].transport.sock


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed early"
        data += chunk
    return bytes(data)


# -- connections ---------------------------------------------------------------------------------


def test_connect_is_non_blocking_with_nodelay_and_keepalive(selector: Selector, listener: socket.socket) -> None:
    selector.connect(NODE, *listener.getsockname())
    sock = channel_socket(selector)
    assert not sock.getblocking()
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
    assert not selector.is_connected(NODE)  # until a poll sees the connect complete

    peer, _ = listener.accept()
    with peer:
        poll_until(selector, lambda: NODE in selector.connected)
        assert selector.is_connected(NODE)
        assert selector.channels() == [NODE]


def test_buffer_sizes_are_applied(listener: socket.socket) -> None:
    selector = Selector(send_buffer_bytes=8192, receive_buffer_bytes=16384)
    try:
        selector.connect(NODE, *listener.getsockname())
        sock = channel_socket(selector)
        # Linux doubles the value asked for (bookkeeping overhead).
        assert 8192 <= sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * 8192
        assert 16384 <= sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 2 * 16384
    finally:
        selector.close_all()


def test_a_second_connection_to_the_same_node_is_refused(selector: Selector, listener: socket.socket) -> None:
    selector.connect(NODE, *listener.getsockname())
    with pytest.raises(ValueError, match="already a connection to node 1"):
        selector.connect(NODE, *listener.getsockname())


def test_refused_connect_is_reported(selector: Selector) -> None:
    with socket.socket() as unused:  # bound, not listening: connecting is refused
        unused.bind(("127.0.0.1", 0))
        try:
            selector.connect(NODE, *unused.getsockname())
        except OSError as exc:  # refused at once: allowed, the caller handles it
            assert "ECONNREFUSED" in str(exc)
            return
        poll_until(selector, lambda: NODE in selector.disconnected)
    assert "connect failed: ECONNREFUSED" in selector.disconnected[NODE]
    assert not selector.has_channel(NODE)


class ReadyWordTransport(PlaintextTransport):
    """A toy handshake, as a TLS client's waits for the server: data flows once the peer has said b"ready"."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.heard = b""
        self.calls = 0

    def handshake(self) -> int:
        self.calls += 1
        try:
            self.heard += self.sock.recv(5 - len(self.heard))
        except BlockingIOError:
            pass
        return 0 if self.heard == b"ready" else WANT_READ


def test_a_handshake_waiting_for_the_peer_does_not_spin(listener: socket.socket) -> None:
    transports: list[ReadyWordTransport] = []

    def factory(sock: socket.socket, host: str) -> ReadyWordTransport:
        transports.append(ReadyWordTransport(sock))
        return transports[-1]

    selector = Selector(transport_factory=factory)
    try:
        selector.connect(NODE, *listener.getsockname())
        peer, _ = listener.accept()
        with peer:
            (transport,) = transports
            poll_until(selector, lambda: transport.calls == 1)  # the TCP connect completed
            # The socket is writable all along: polled for that, every poll would retry the handshake at once.
            for _ in range(20):
                selector.poll(10)
            assert transport.calls == 1
            assert not selector.is_connected(NODE)

            peer.sendall(b"rea")
            poll_until(selector, lambda: transport.calls == 2)
            assert not selector.is_connected(NODE)
            peer.sendall(b"dy")
            poll_until(selector, lambda: selector.is_connected(NODE))
            assert selector.connected == [NODE] and transport.calls == 3

            # Then the connection carries frames as any other.
            selector.send(NODE, [frame(b"request")])
            poll_until(selector, lambda: selector.completed_sends != [])
            assert receive_exactly(peer, 11) == frame(b"request")
    finally:
        selector.close_all()


def test_peer_close_is_reported(selector: Selector, peer: socket.socket) -> None:
    peer.close()
    poll_until(selector, lambda: NODE in selector.disconnected)
    assert selector.disconnected[NODE] == "connection closed by peer"
    assert selector.channels() == []


def test_close_needs_no_report_and_is_idempotent(selector: Selector, peer: socket.socket) -> None:
    selector.close(NODE)
    selector.close(NODE)
    selector.poll(0)
    assert selector.disconnected == {}
    assert peer.recv(1) == b""  # the peer sees the close


# -- receiving -----------------------------------------------------------------------------------


def test_response_fed_one_byte_at_a_time(selector: Selector, peer: socket.socket) -> None:
    payload = bytes(range(256)) * 2
    data = frame(payload)
    for i, byte in enumerate(data):
        peer.sendall(bytes([byte]))
        # Wait for the byte to arrive and be read, so that every read sees one byte.
        _wait_for_arrival(channel_socket(selector), 1)
        poll_until(selector, lambda: not _pending(channel_socket(selector)), poll_ms=0)
        if i < len(data) - 1:
            assert selector.completed_receives == [], f"a frame completed after {i + 1} bytes"
    assert selector.completed_receives == [(NODE, payload)]
    selector.poll(0)
    assert selector.completed_receives == []  # reported once


def _pending(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _wait_for_arrival(sock: socket.socket, size: int) -> None:
    deadline = time.monotonic() + HANG_S
    while _pending(sock) < size:
        assert time.monotonic() < deadline, "the bytes did not arrive"
        time.sleep(0.001)


def test_many_responses_in_one_write(selector: Selector, peer: socket.socket) -> None:
    payloads = [f"response-{i}".encode() * (i % 5) for i in range(200)]  # some empty
    peer.sendall(b"".join(frame(p) for p in payloads))
    assert poll_collect(selector, len(payloads)) == payloads


def test_responses_split_at_every_boundary(selector: Selector, peer: socket.socket) -> None:
    # Cuts inside the size prefix, at its end, inside the body, across two frames.
    data = frame(b"first response") + frame(b"second") + frame(b"")
    for cut in (1, 3, 4, 5, 17, 18, 19, 22, 27):
        peer.sendall(data[:cut])
        _wait_for_arrival(channel_socket(selector), cut)
        poll_until(selector, lambda: not _pending(channel_socket(selector)), poll_ms=0)
        got = [f for _, f in selector.completed_receives]
        selector.completed_receives = []
        peer.sendall(data[cut:])
        got += poll_collect(selector, 3 - len(got))
        assert got == [b"first response", b"second", b""], f"cut at {cut}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=40), data=st.data())
def test_frames_survive_any_cut_into_reads(listener: socket.socket, payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(frame(p) for p in payloads)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=12), label="cuts"))
    selector = Selector()
    try:
        with connect(selector, listener) as peer:
            sock = channel_socket(selector)
            got: list[bytes] = []
            for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
                # One read per piece: wait for it to arrive, and for the selector to take it.
                peer.sendall(stream[start:end])
                _wait_for_arrival(sock, end - start)
                poll_until(selector, lambda: not _pending(sock), poll_ms=0)
                got += [f for _, f in selector.completed_receives]
            assert got == payloads
            assert selector.channels() == [NODE]
    finally:
        selector.close_all()


def test_large_response_over_many_reads(selector: Selector, peer: socket.socket) -> None:
    payload = bytes(range(251)) * 20_000  # ~5 MB: many reads, past the read chunk size
    writer = threading.Thread(target=peer.sendall, args=(frame(payload),))
    writer.start()
    try:
        assert poll_collect(selector, 1) == [payload]
    finally:
        writer.join()


def test_response_followed_by_close_is_delivered(selector: Selector, peer: socket.socket) -> None:
    # Exactly one read chunk (256 KiB) then the end of the stream: both come in one read loop.
    payload = b"r" * (256 * 1024 - 4)
    sock = channel_socket(selector)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024 * 1024)
    writer = threading.Thread(target=lambda: (peer.sendall(frame(payload)), peer.shutdown(socket.SHUT_WR)))
    writer.start()
    writer.join()
    _wait_for_arrival(sock, len(payload) + 4)
    poll_until(selector, lambda: NODE in selector.disconnected)
    assert selector.completed_receives == [(NODE, payload)]


@pytest.mark.parametrize("size", [1001, 2**31 - 1, -1])
def test_receive_above_the_maximum_closes_the_connection(size: int, listener: socket.socket) -> None:
    selector = Selector(max_receive_size=1000)
    try:
        with connect(selector, listener) as peer:
            peer.sendall(frame(b"x" * 1000) + struct.pack(">i", size))
            poll_until(selector, lambda: NODE in selector.disconnected)
            reason = selector.disconnected[NODE]
            assert f"invalid receive of {size} bytes from node 1" in reason
            assert "receive.message.max.bytes is 1000" in reason
            assert not selector.has_channel(NODE)
            assert peer.recv(1) == b""
    finally:
        selector.close_all()


# -- sending -------------------------------------------------------------------------------------


def test_send_writes_every_buffer_kind(selector: Selector, peer: socket.socket) -> None:
    buffers = [struct.pack(">i", 10), b"abc", bytearray(b"de"), b"", memoryview(b"fghij")]
    selector.send(NODE, buffers, tag="request-1")
    assert selector.has_pending_send(NODE)
    poll_until(selector, lambda: selector.completed_sends != [])
    assert selector.completed_sends == [(NODE, "request-1")]
    assert not selector.has_pending_send(NODE)
    assert receive_exactly(peer, 14) == struct.pack(">i", 10) + b"abcdefghij"


def test_one_send_at_a_time(selector: Selector, peer: socket.socket, listener: socket.socket) -> None:
    selector.send(NODE, [b"\0\0\0\0"])
    with pytest.raises(ValueError, match="still has a send in progress"):
        selector.send(NODE, [b"\0\0\0\0"])
    with pytest.raises(ValueError, match="node 2 is not connected"):
        selector.send(2, [b"\0\0\0\0"])
    selector.connect(2, *listener.getsockname())
    with pytest.raises(ValueError, match="node 2 is not connected"):
        selector.send(2, [b"\0\0\0\0"])  # connect not complete yet


@pytest.mark.parametrize("wakes", [True, False])
def test_a_completed_send_ends_the_wait_only_if_it_wakes(selector: Selector, peer: socket.socket,
                                                         wakes: bool) -> None:
    """A request whose response will come (wakes=False) lets the poll sleep on until it does."""
    request = frame(b"request")
    polled = threading.Event()

    def answer() -> None:
        receive_exactly(peer, len(request))
        if wakes:
            polled.wait()  # the poll the completed send ends has returned: it cannot see the response
        else:
            time.sleep(0.5)  # long after the send completed: the poll sleeps on until the response
        peer.sendall(frame(b"response"))

    broker = threading.Thread(target=answer)
    broker.start()
    try:
        selector.send(NODE, [request], tag="request", wakes=wakes)
        started = time.monotonic()
        selector.poll(10_000)
        polled.set()
    finally:
        broker.join()
    assert time.monotonic() - started < 10, "the poll slept its whole timeout"
    assert selector.completed_sends == [(NODE, "request")]
    assert selector.completed_receives == ([] if wakes else [(NODE, b"response")])


def test_partial_writes_complete_intact(listener: socket.socket) -> None:
    selector = Selector(send_buffer_bytes=32768)
    try:
        with connect(selector, listener) as peer:
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            peer.setblocking(False)
            # A 2 MB request in pieces of every kind, more pieces than sendmsg takes at once.
            pieces: list[bytes | bytearray | memoryview] = []
            for i in range(1500):
                chunk = bytes([i % 251]) * (i % 2000 + 1)
                pieces.append(chunk if i % 3 == 0 else bytearray(chunk) if i % 3 == 1 else memoryview(chunk))
            body = b"".join(bytes(p) for p in pieces)
            expected = struct.pack(">i", len(body)) + body
            selector.send(NODE, [struct.pack(">i", len(body)), *pieces], tag="big")

            received = bytearray()
            polls_with_send_pending = 0
            deadline = time.monotonic() + HANG_S
            while len(received) < len(expected):
                assert time.monotonic() < deadline
                selector.poll(1)
                if selector.has_pending_send(NODE):
                    polls_with_send_pending += 1
                    assert selector.completed_sends == []
                try:
                    received += peer.recv(16384)  # the peer reads slowly
                except BlockingIOError:
                    pass
            poll_until(selector, lambda: selector.completed_sends != [] or not selector.has_pending_send(NODE))
            assert bytes(received) == expected
            assert polls_with_send_pending > 10  # it really was written over many polls
            assert not selector.has_pending_send(NODE)
    finally:
        selector.close_all()


def test_send_failure_closes_the_connection(listener: socket.socket) -> None:
    selector = Selector(send_buffer_bytes=4096)
    try:
        peer = connect(selector, listener)
        selector.send(NODE, [b"x" * 4_000_000])
        selector.poll(0)
        assert selector.has_pending_send(NODE)
        # A reset, not a FIN: the unread request makes close() send RST.
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        poll_until(selector, lambda: NODE in selector.disconnected)
        assert not selector.has_channel(NODE)
        assert selector.completed_sends == []
    finally:
        selector.close_all()


# -- one poller for the brokers' sockets and the daemon's others ------------------------------------


def test_zmq_and_broker_sockets_are_served_by_one_poll(selector: Selector, peer: socket.socket,
                                                       zmq_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    # The daemon's front registers its ZeroMQ socket with the poller the selector polls: one wait serves both, each
    # by its own handler (the selector's readiness never goes through the front, nor the front's through it).
    inside, outside = zmq_pair
    seen: list[bytes] = []
    selector.poller.register(inside, POLLIN, lambda events: seen.append(inside.recv(zmq.NOBLOCK)))
    outside.send(b"seal")
    peer.sendall(frame(b"produce response"))
    receives: list[bytes] = []

    def both() -> bool:
        receives.extend(f for _, f in selector.completed_receives)
        return bool(seen) and bool(receives)

    poll_until(selector, both)
    assert seen == [b"seal"] and receives == [b"produce response"]
    # Unregistered, it no longer wakes the poll.
    selector.poller.unregister(inside)
    outside.send(b"again")
    selector.poll(50)
    assert seen == [b"seal"]


def test_wakeup_from_another_thread_ends_a_long_poll(selector: Selector) -> None:
    waker = threading.Timer(0.2, selector.wakeup)
    waker.start()
    started = time.monotonic()
    selector.poll(60_000)
    waker.join()
    assert time.monotonic() - started < 30, "poll() waited out its timeout"
    assert not selector.disconnected
