"""Selector: non-blocking broker connections with Kafka's size-prefixed framing.

One :class:`KafkaChannel` per node id. Sends are lists of buffers written with
``socket.sendmsg`` (a batch's header and records reach the socket without being
joined), resumed after partial writes; receives are reassembled from however the
bytes arrive, one response over many reads or many responses in one read.

The selector registers its connections with a :class:`~service.poller.Poller`: in the
daemon, the one its loop waits on, where the front registers the clients' sockets too.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from client_stub.contract.records import Buffer
from client_stub.errors import AuthenticationError

from ..metrics import NUM_SAMPLES, SAMPLE_WINDOW_MS, Sensor, avg_max, count_meter, meter
from ..poller import POLLERR, POLLIN, POLLOUT, Poller
from ..protocol.framing import FrameReader, InvalidFrameSize
from .transport import PlaintextTransport, Transport, TransportFactory

log = logging.getLogger(__name__)

# sendmsg takes at most IOV_MAX buffers at once.
_MAX_IOV = 512
_RECV_CHUNK = 256 * 1024
_WOULD_BLOCK = (BlockingIOError, InterruptedError)
_POLLIN = POLLIN
_POLLOUT = POLLOUT
_READABLE = POLLIN | POLLERR

class SelectorMetrics:
    """The connections' metrics, as Java's Selector keeps them: connections opened and closed, and every
    request written and response read with their sizes, overall (producer-metrics) and per node
    (producer-node-metrics)."""

    def __init__(self, window_ms: int = SAMPLE_WINDOW_MS, num_samples: int = NUM_SAMPLES,
                 clock: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000) -> None:
        self.window_ms = window_ms
        self.num_samples = num_samples
        self.clock = clock
        self.connections_created = Sensor(window_ms, num_samples)
        self.connections_closed = Sensor(window_ms, num_samples)
        self.requests = Sensor(window_ms, num_samples)
        self.responses = Sensor(window_ms, num_samples)
        self.node_requests: dict[int, Sensor] = {}
        self.node_responses: dict[int, Sensor] = {}

    def record_request(self, node_id: int, size: int) -> None:
        self._record(self.requests, self.node_requests, node_id, size)

    def record_response(self, node_id: int, size: int) -> None:
        self._record(self.responses, self.node_responses, node_id, size)

    def _record(self, overall: Sensor, by_node: dict[int, Sensor], node_id: int, size: int) -> None:
        now = self.clock()
        overall.record(size, now)
        sensor = by_node.get(node_id)
        if sensor is None:
            sensor = by_node[node_id] = Sensor(self.window_ms, self.num_samples)
        sensor.record(size, now)

    def producer_metrics(self, now: int) -> dict[str, float]:
        """The connections' part of producer-metrics."""
        return {**count_meter(self.connections_created, "connection-creation", now),
                **count_meter(self.connections_closed, "connection-close", now),
                **self._io_metrics(self.requests, self.responses, now)}

    def node_metrics(self, now: int) -> dict[int, dict[str, float]]:
        """The connections' part of producer-node-metrics, by node id."""
        empty = Sensor(self.window_ms, self.num_samples)
        return {node_id: self._io_metrics(self.node_requests.get(node_id, empty),
                                          self.node_responses.get(node_id, empty), now)
                for node_id in self.node_requests.keys() | self.node_responses.keys()}

    @staticmethod
    def _io_metrics(requests: Sensor, responses: Sensor, now: int) -> dict[str, float]:
        return {**count_meter(requests, "request", now), **avg_max(requests, "request-size", now),
                **meter(requests, "outgoing-byte", now), **count_meter(responses, "response", now),
                **meter(responses, "incoming-byte", now)}


@dataclass(slots=True)
class _Send:
    tag: Any
    buffers: list[memoryview]
    remaining: int
    size: int
    # Whether its completion ends the poll's wait: the caller acts on it, or (once it has had
    # to wait for the socket) more requests may be waiting for the connection.
    wakes: bool
    first: int = 0  # buffers[first:] are still to be written, buffers[first] maybe in part


@dataclass(slots=True)
class KafkaChannel:
    """One connection to one node."""

    node_id: int
    transport: Transport
    connected: bool = False
    # Until connected: the poll events awaited, the TCP connect's first, then the handshake's.
    connect_interest: int = _POLLOUT
    send: _Send | None = None
    frames: FrameReader = field(default_factory=FrameReader)

    @property
    def fileno(self) -> int:
        return self.transport.sock.fileno()

    def has_send(self) -> bool:
        return self.send is not None


class Selector:
    """Connections by node id; :meth:`poll` does the I/O and reports what completed."""

    def __init__(self, *, max_receive_size: int = 100_000_000, send_buffer_bytes: int = -1,
                 receive_buffer_bytes: int = -1,
                 transport_factory: TransportFactory = PlaintextTransport,
                 metrics: SelectorMetrics | None = None, poller: Poller | None = None) -> None:
        """``poller``: the loop's, which the selector's connections are registered with (a new one if None)."""
        self.max_receive_size = max_receive_size
        self.metrics = metrics or SelectorMetrics()
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self.transport_factory = transport_factory
        self._channels: dict[int, KafkaChannel] = {}
        self._by_fd: dict[int, KafkaChannel] = {}
        self.poller = poller or Poller()
        self._interest: dict[int, int] = {}
        # Results of the last poll().
        self.connected: list[int] = []
        self.completed_sends: list[tuple[int, Any]] = []
        self.completed_receives: list[tuple[int, bytes]] = []
        self.disconnected: dict[int, str] = {}
        # Of those, the connections whose TLS handshake failed, and why.
        self.authentication_failures: dict[int, AuthenticationError] = {}
        self._completion_wakes = False

    # -- connections ---------------------------------------------------------------------------

    def connect(self, node_id: int, host: str, port: int) -> None:
        """Start a non-blocking connect. Raises OSError if it fails at once."""
        if node_id in self._channels:
            raise ValueError(f"there is already a connection to node {node_id}")
        family, type_, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self.send_buffer_bytes > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            if self.receive_buffer_bytes > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)
            err = sock.connect_ex(address)
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise OSError(err, f"connect to {host}:{port} failed: {errno.errorcode.get(err, err)}")
        except BaseException:
            sock.close()
            raise
        channel = KafkaChannel(node_id, self.transport_factory(sock, host), frames=FrameReader(self.max_receive_size))
        self._channels[node_id] = channel
        self._by_fd[sock.fileno()] = channel

    def is_connected(self, node_id: int) -> bool:
        channel = self._channels.get(node_id)
        return channel is not None and channel.connected

    def has_pending_send(self, node_id: int) -> bool:
        channel = self._channels.get(node_id)
        return channel is not None and channel.has_send()

    def channels(self) -> list[int]:
        return list(self._channels)

    def connection_count(self) -> int:
        """Connections established and open (Java's connection-count)."""
        return sum(channel.connected for channel in self._channels.values())

    def has_channel(self, node_id: int) -> bool:
        return node_id in self._channels

    def close(self, node_id: int) -> None:
        """Close the connection to ``node_id`` (no report in ``disconnected``)."""
        channel = self._channels.pop(node_id, None)
        if channel is None:
            return
        if channel.connected:
            self.metrics.connections_closed.record(1, self.metrics.clock())
        fd = channel.fileno
        self._by_fd.pop(fd, None)
        if fd in self._interest:
            self.poller.unregister(fd)
            del self._interest[fd]
        channel.transport.sock.close()

    def wakeup(self) -> None:
        """End the current or next poll() at once; safe from any thread."""
        self.poller.wakeup()

    def close_all(self, linger_ms: int = 0) -> None:
        """Close every connection.

        With ``linger_ms``, half-close them first and wait up to that long for each
        broker to close its side: it has then read every request written, even those
        no response acknowledges (acks=0), which an abrupt close could cut off.
        """
        if linger_ms > 0:
            self._half_close_and_wait(linger_ms)
        for node_id in list(self._channels):
            self.close(node_id)

    def _half_close_and_wait(self, linger_ms: int) -> None:
        waiting: dict[int, KafkaChannel] = {}
        poller = select.poll()
        for channel in self._channels.values():
            if not channel.connected or channel.send is not None:
                continue
            try:
                channel.transport.sock.shutdown(socket.SHUT_WR)
            except OSError:
                continue
            waiting[channel.fileno] = channel
            poller.register(channel.fileno, select.POLLIN)
        deadline = time.monotonic() + linger_ms / 1000
        while waiting and (remaining := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(remaining * 1000):
                try:
                    eof = not waiting[fd].transport.recv(_RECV_CHUNK)
                except _WOULD_BLOCK:
                    continue
                except OSError:
                    eof = True
                if eof:
                    poller.unregister(fd)
                    del waiting[fd]

    def _fail(self, channel: KafkaChannel, reason: str) -> None:
        log.debug("connection to node %s closed: %s", channel.node_id, reason)
        self.disconnected[channel.node_id] = reason
        self.close(channel.node_id)

    # -- sending -------------------------------------------------------------------------------

    def send(self, node_id: int, buffers: list[Buffer], tag: Any = None, *, wakes: bool = True) -> None:
        """Queue ``buffers`` (one size-prefixed request) on the connection to ``node_id``.

        One send at a time per connection: the previous must have completed. ``wakes=False``
        says the caller need not act on its completion (a request whose response will come):
        if it completes at once, the poll still waits.
        """
        channel = self._channels.get(node_id)
        if channel is None or not channel.connected:
            raise ValueError(f"node {node_id} is not connected")
        if channel.send is not None:
            raise ValueError(f"node {node_id} still has a send in progress")
        views = [memoryview(b).cast("B") for b in buffers if len(b)]
        size = sum(v.nbytes for v in views)
        channel.send = _Send(tag, views, size, size, wakes)

    def _write(self, channel: KafkaChannel) -> None:
        send = channel.send
        assert send is not None
        buffers = send.buffers
        while send.remaining:
            try:
                written = channel.transport.send(buffers[send.first:send.first + _MAX_IOV])
            except _WOULD_BLOCK:
                send.wakes = True
                return
            except OSError as exc:
                self._fail(channel, f"send failed: {exc}")
                return
            send.remaining -= written
            while written:
                head = buffers[send.first]
                if written >= head.nbytes:
                    written -= head.nbytes
                    send.first += 1
                else:
                    buffers[send.first] = head[written:]
                    written = 0
        try:
            flushed = channel.transport.flush()
        except OSError as exc:
            self._fail(channel, f"send failed: {exc}")
            return
        if not flushed:
            # The transport holds the end of it (TLS records the socket would not take): not sent yet.
            send.wakes = True
            return
        channel.send = None
        self.metrics.record_request(channel.node_id, send.size)
        self.completed_sends.append((channel.node_id, send.tag))
        self._completion_wakes |= send.wakes

    # -- receiving -----------------------------------------------------------------------------

    def _read(self, channel: KafkaChannel) -> None:
        while True:
            try:
                chunk = channel.transport.recv(_RECV_CHUNK)
            except _WOULD_BLOCK:
                return
            except OSError as exc:
                failure = f"receive failed: {exc}"
                break
            if not chunk:
                failure = "connection closed by peer"
                break
            # Responses read before the connection ends are delivered, as after Java's graceful close.
            if not self._extract_frames(channel, chunk) or len(chunk) < _RECV_CHUNK:
                return
        self._fail(channel, failure)

    def _extract_frames(self, channel: KafkaChannel, data: bytes) -> bool:
        """Report the frames that ``data`` completes; False if an invalid size closed the connection."""
        try:
            frames = channel.frames.feed(data)
        except InvalidFrameSize as exc:
            self._fail(channel, f"invalid receive of {exc.size} bytes from node {channel.node_id} "
                                f"(receive.message.max.bytes is {self.max_receive_size})")
            return False
        node_id = channel.node_id
        for frame in frames:
            self.metrics.record_response(node_id, len(frame))
        self.completed_receives.extend([(node_id, frame) for frame in frames])
        return True

    # -- the poll ------------------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> None:
        """Do the I/O that is possible within ``timeout_ms`` and record what completed (the poller serves whatever
        else is registered with it meanwhile)."""
        self.connected = []
        self.completed_sends = []
        self.completed_receives = []
        self.disconnected = {}
        self.authentication_failures = {}
        self._completion_wakes = False
        # Write what can be written now: most sends complete without waiting for POLLOUT.
        for channel in list(self._channels.values()):
            if channel.connected and channel.send is not None:
                self._write(channel)
        self._update_interest()
        if self._completion_wakes or self.disconnected:
            timeout_ms = 0
        self.poller.poll(timeout_ms)

    def _serve(self, channel: KafkaChannel, events: int) -> None:
        """The I/O of a connection the poll found ready."""
        if self._channels.get(channel.node_id) is not channel:
            return  # closed meanwhile
        if not channel.connected:
            self._finish_connect(channel)
            return
        if events & _READABLE:
            self._read(channel)
        if channel.node_id in self._channels and events & _POLLOUT and channel.send is not None:
            self._write(channel)

    def _finish_connect(self, channel: KafkaChannel) -> None:
        sock = channel.transport.sock
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._fail(channel, f"connect failed: {errno.errorcode.get(err, err)}")
            return
        try:
            interest = channel.transport.handshake()
        except AuthenticationError as exc:
            self.authentication_failures[channel.node_id] = exc
            self._fail(channel, str(exc))
            return
        except OSError as exc:
            self._fail(channel, f"handshake failed: {exc}")
            return
        if interest:
            channel.connect_interest = interest
            return
        channel.connected = True
        self.metrics.connections_created.record(1, self.metrics.clock())
        self.connected.append(channel.node_id)

    def _update_interest(self) -> None:
        for fd, channel in self._by_fd.items():
            if not channel.connected:
                flags = channel.connect_interest
            else:
                flags = _POLLIN | (_POLLOUT if channel.send is not None else 0)
            if self._interest.get(fd) != flags:
                self.poller.register(fd, flags, partial(self._serve, channel))
                self._interest[fd] = flags
