"""Loopback TCP servers for faults a real broker cannot produce on demand.

``FaultProxy`` sits between a Kafka client and one broker and can cut connections, drop
responses, delay or blackhole traffic; ``SilentListener`` accepts connections and never
answers. Each runs one background thread with a selector over non-blocking sockets. Only
that thread touches sockets: the public controls change settings under a lock, or hand
work to the thread and wait for it.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Self

from service.protocol.api import peek_correlation_id
from service.protocol.framing import SIZE, FrameReader
from service.protocol.primitives import ProtocolError
from tests.support.broker_codec import peek_request_header

_PRODUCE = 0  # the api key of Produce requests
_RECV_SIZE = 256 * 1024
_CALL_TIMEOUT = 5.0


class _SelectorServer:
    """A listening socket on loopback served by one background thread with a selector.

    Subclasses handle their connections in that thread; they run with ``_lock`` held, so
    settings guarded by it never change in the middle of a batch of events.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._selector: selectors.BaseSelector  # made by start(), closed by the loop
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self._connections_accepted = 0

    @property
    def address(self) -> str:
        """``host:port`` of the listening socket."""
        return f"{self.host}:{self.port}"

    @property
    def connections_accepted(self) -> int:
        """Connections accepted since start."""
        with self._lock:
            return self._connections_accepted

    def start(self) -> None:
        """Listen on a free port and start the background thread."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._stopping = False
        self._failure = None
        self._selector = selectors.DefaultSelector()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.host, 0))
        listener.listen(128)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wakeups)
        self._thread = threading.Thread(
            target=self._serve, name=f"{type(self).__name__}-{self.port}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Close every connection and the listener, and join the thread.

        Raises RuntimeError if the thread died of an exception while running.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with self._lock:
            self._stopping = True
        self._wake()
        thread.join(_CALL_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} did not stop")
        if self._failure is not None:
            raise RuntimeError(f"{thread.name} failed") from self._failure

    def _call_in_loop(self, function: Callable[[], None]) -> None:
        """Run ``function`` in the loop thread (with ``_lock`` held) and wait for it."""
        if self._thread is None:
            function()  # not running: no thread to race with
            return
        done = threading.Event()
        self._commands.put((function, done))
        self._wake()
        if not done.wait(_CALL_TIMEOUT):
            raise RuntimeError(f"{type(self).__name__} loop did not respond") from self._failure

    def _wake(self) -> None:
        """Interrupt the loop's select(), if there is a loop."""
        if self._wake_w is None:
            return  # never started
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # the buffer is full of wake-ups already
        except OSError:
            pass  # the loop has exited and closed the socket

    def _drain_wakeups(self, mask: int) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self, mask: int) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return  # the client gave up before we got to it
        sock.setblocking(False)
        self._connections_accepted += 1
        self._on_accept(sock)

    def _serve(self) -> None:
        try:
            while True:
                with self._lock:
                    timeout = self._select_timeout()
                events = self._selector.select(timeout)
                with self._lock:
                    for key, mask in events:
                        key.data(mask)
                    self._run_commands()
                    if self._stopping:
                        return
                    self._after_events()
        except BaseException as exc:
            self._failure = exc  # stop() reports it
        finally:
            with self._lock:
                self._close_all()
                self._run_commands()  # release any caller still waiting
            for sock in (self._listener, self._wake_r, self._wake_w):
                if sock is not None:
                    sock.close()
            self._selector.close()

    def _run_commands(self) -> None:
        while True:
            try:
                function, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                function()
            finally:
                done.set()

    def _watch(self, sock: socket.socket, events: int, data: Callable[[int], None]) -> None:
        """Make the selector watch ``sock`` for exactly ``events`` (none: unregister)."""
        try:
            key = self._selector.get_key(sock)
        except KeyError:
            if events:
                self._selector.register(sock, events, data)
            return
        if not events:
            self._selector.unregister(sock)
        elif key.events != events:
            self._selector.modify(sock, events, data)

    def _forget(self, sock: socket.socket) -> None:
        """Unregister (if registered) and close ``sock``."""
        with contextlib.suppress(KeyError):
            self._selector.unregister(sock)
        sock.close()

    # Hooks for subclasses, all called in the loop thread with _lock held.

    def _on_accept(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def _select_timeout(self) -> float | None:
        return None

    def _after_events(self) -> None:
        pass

    def _close_all(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SilentListener(_SelectorServer):
    """Accepts TCP connections and never answers: reads and discards whatever arrives."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self._connections: set[socket.socket] = set()

    def _on_accept(self, sock: socket.socket) -> None:
        self._connections.add(sock)
        self._selector.register(sock, selectors.EVENT_READ, partial(self._discard, sock))

    def _discard(self, sock: socket.socket, mask: int) -> None:
        try:
            if sock.recv(_RECV_SIZE):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._connections.discard(sock)
        self._forget(sock)

    def _close_all(self) -> None:
        for sock in self._connections:
            self._forget(sock)
        self._connections.clear()


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's socket and ours to the broker."""

    client: socket.socket
    upstream: socket.socket
    connected: bool = False  # the upstream connect() has completed
    closing: bool = False  # forward nothing more; close once the output buffers are empty
    # Each direction's bytes split into frames.
    from_client: FrameReader = field(default_factory=FrameReader)
    from_upstream: FrameReader = field(default_factory=FrameReader)
    # Whole frames, size prefix included, waiting for their release time: (arrival time, frame).
    requests: deque[tuple[float, bytes]] = field(default_factory=deque)
    responses: deque[tuple[float, bytes]] = field(default_factory=deque)
    # Released bytes not yet accepted by the socket.
    to_upstream: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    # Forwarded requests awaiting their response, in order: (correlation id, api key).
    in_flight: deque[tuple[int, int]] = field(default_factory=deque)


class FaultProxy(_SelectorServer):
    """A Kafka-aware TCP proxy in front of one broker, with faults switched on at will.

    It splits both directions into Kafka frames and matches responses to requests by
    correlation id, so faults can target one api key (Produce = 0 by default). All
    controls are thread-safe and take effect while connections are open.
    """

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.target = (target_host, target_port)
        self._links: set[_Link] = set()
        self._delay = 0.0
        self._blackhole = False
        self._cut_every: int | None = None
        self._cut_api_key: int | None = 0
        self._cut_count = 0
        self._drops_left = 0
        self._drop_api_key = 0
        self._requests_forwarded: Counter[int] = Counter()
        self._responses_dropped = 0
        self._most_produce_outstanding = 0

    @property
    def requests_forwarded(self) -> dict[int, int]:
        """Requests handed to the broker since start, by api key."""
        with self._lock:
            return dict(self._requests_forwarded)

    @property
    def most_produce_requests_outstanding(self) -> int:
        """The most Produce requests one connection had at once that had reached the proxy and whose
        responses had not been passed back yet (a client pipelining its requests has more than one)."""
        with self._lock:
            return self._most_produce_outstanding

    @property
    def produce_requests_outstanding(self) -> int:
        """The Produce requests that have reached the proxy and whose responses have not been passed back yet, now
        (every connection's)."""
        with self._lock:
            return sum(map(_produce_outstanding, self._links))

    @property
    def responses_dropped(self) -> int:
        """Responses swallowed by ``drop_responses`` since start."""
        with self._lock:
            return self._responses_dropped

    def cut(self) -> None:
        """Close every current connection, both sides; new ones are accepted as usual."""
        self._call_in_loop(self._close_all)

    def cut_every(self, n: int | None, api_key: int | None = 0) -> None:
        """Close a connection right after forwarding every ``n``-th request of ``api_key``.

        The broker gets that request; its response never reaches the client. Counting
        starts now, across connections; ``api_key=None`` counts every request and
        ``n=None`` turns the fault off.
        """
        if n is not None and n < 1:
            raise ValueError(f"n must be positive, not {n}")
        with self._lock:
            self._cut_every = n
            self._cut_api_key = api_key
            self._cut_count = 0

    def drop_responses(self, count: int, api_key: int = 0) -> None:
        """Swallow the next ``count`` responses to ``api_key`` requests, closing each connection.

        The broker has applied those requests; the client never learns the outcome.
        """
        with self._lock:
            self._drops_left = count
            self._drop_api_key = api_key

    def delay(self, ms: float) -> None:
        """Hold every frame, both directions, ``ms`` milliseconds after it arrived."""
        with self._lock:
            self._delay = ms / 1000.0
        self._wake()  # frames already held may be due sooner now

    def blackhole(self, on: bool = True) -> None:
        """Keep accepting and reading, but forward nothing in either direction."""
        with self._lock:
            self._blackhole = on
        self._wake()

    def heal(self) -> None:
        """Clear every fault (counters are kept)."""
        with self._lock:
            self._delay = 0.0
            self._blackhole = False
            self._cut_every = None
            self._drops_left = 0
        self._wake()

    # Loop thread from here on, with _lock held.

    def _on_accept(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(client=sock, upstream=upstream)
        self._links.add(link)
        # Non-blocking connect: completion (or failure) shows up as writability.
        if upstream.connect_ex(self.target) not in (0, errno.EINPROGRESS):
            self._close_link(link)
            return
        self._update_interest(link)

    def _on_client_event(self, link: _Link, mask: int) -> None:
        if link not in self._links:
            return  # closed earlier in this batch of events
        try:
            if mask & selectors.EVENT_READ:
                self._receive(link.client, link.from_client, link.requests)
            if mask & selectors.EVENT_WRITE:
                _send_some(link.client, link.to_client)
        except (OSError, ProtocolError):
            self._close_link(link)
            return
        self._update_interest(link)

    def _on_upstream_event(self, link: _Link, mask: int) -> None:
        if link not in self._links:
            return
        try:
            if not link.connected:
                error = link.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise ConnectionError(error, "connect to the target failed")
                link.connected = True
            if mask & selectors.EVENT_READ:
                self._receive(link.upstream, link.from_upstream, link.responses)
            if mask & selectors.EVENT_WRITE:
                _send_some(link.upstream, link.to_upstream)
        except (OSError, ProtocolError):
            self._close_link(link)
            return
        self._update_interest(link)

    def _receive(
        self, sock: socket.socket, reader: FrameReader, frames: deque[tuple[float, bytes]]
    ) -> None:
        """Read what ``sock`` has and queue the whole frames it completes."""
        try:
            data = sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        if not data:
            raise ConnectionError("peer closed the connection")
        now = time.monotonic()
        # Forwarded as they came: with their size prefix.
        frames.extend((now, SIZE.pack(len(frame)) + frame) for frame in reader.feed(data))

    def _after_events(self) -> None:
        """Release the frames that are due, write what can be written, finish closings."""
        now = time.monotonic()
        for link in list(self._links):
            self._most_produce_outstanding = max(self._most_produce_outstanding, _produce_outstanding(link))
            try:
                while not link.closing and link.requests and self._due(link.requests, now):
                    self._forward_request(link, link.requests.popleft()[1])
                while not link.closing and link.responses and self._due(link.responses, now):
                    self._forward_response(link, link.responses.popleft()[1])
                # Write at once rather than after another round through select().
                if link.to_client:
                    _send_some(link.client, link.to_client)
                if link.to_upstream and link.connected:
                    _send_some(link.upstream, link.to_upstream)
            except (OSError, ProtocolError):
                self._close_link(link)
                continue
            if link.closing and not link.to_client and not link.to_upstream:
                self._close_link(link)
            else:
                self._update_interest(link)

    def _due(self, frames: deque[tuple[float, bytes]], now: float) -> bool:
        return frames[0][0] + self._delay <= now

    def _forward_request(self, link: _Link, frame: bytes) -> None:
        if self._blackhole:
            return
        api_key, _, correlation_id = peek_request_header(frame, SIZE.size)
        link.to_upstream += frame
        link.in_flight.append((correlation_id, api_key))
        self._requests_forwarded[api_key] += 1
        if self._cut_every is not None and self._cut_api_key in (None, api_key):
            self._cut_count += 1
            if self._cut_count >= self._cut_every:
                self._cut_count = 0
                link.closing = True

    def _forward_response(self, link: _Link, frame: bytes) -> None:
        correlation_id = peek_correlation_id(frame, SIZE.size)
        api_key = _match_request(link.in_flight, correlation_id)
        if self._blackhole:
            return
        if self._drops_left and api_key == self._drop_api_key:
            self._drops_left -= 1
            self._responses_dropped += 1
            link.closing = True
            return
        link.to_client += frame

    def _update_interest(self, link: _Link) -> None:
        client_events = 0 if link.closing else selectors.EVENT_READ
        if link.to_client:
            client_events |= selectors.EVENT_WRITE
        upstream_events = 0
        if not link.connected or link.to_upstream:
            upstream_events |= selectors.EVENT_WRITE
        if link.connected and not link.closing:
            upstream_events |= selectors.EVENT_READ
        self._watch(link.client, client_events, partial(self._on_client_event, link))
        self._watch(link.upstream, upstream_events, partial(self._on_upstream_event, link))

    def _select_timeout(self) -> float | None:
        """Seconds until the next held frame is due, or None when none is held."""
        arrivals = [
            frames[0][0]
            for link in self._links
            if not link.closing
            for frames in (link.requests, link.responses)
            if frames
        ]
        if not arrivals:
            return None
        return max(min(arrivals) + self._delay - time.monotonic(), 0.0)

    def _close_link(self, link: _Link) -> None:
        self._links.discard(link)
        self._forget(link.client)
        self._forget(link.upstream)

    def _close_all(self) -> None:
        for link in list(self._links):
            self._close_link(link)


def _api_key(frame: bytes) -> int | None:
    """The api key of a request frame (None if it is too short to have one)."""
    try:
        return peek_request_header(frame, SIZE.size)[0]
    except ProtocolError:
        return None


def _produce_outstanding(link: _Link) -> int:
    """Produce requests of ``link`` that reached the proxy and whose responses were not passed back yet."""
    return (sum(1 for _, frame in link.requests if _api_key(frame) == _PRODUCE)
            + sum(1 for _, api_key in link.in_flight if api_key == _PRODUCE))


def _match_request(in_flight: deque[tuple[int, int]], correlation_id: int) -> int | None:
    """Pop the request answered by ``correlation_id``; return its api key (None: unknown).

    Requests ahead of it got no response (Produce with acks=0) and are popped too.
    """
    for index, (request_id, api_key) in enumerate(in_flight):
        if request_id == correlation_id:
            for _ in range(index + 1):
                in_flight.popleft()
            return api_key
    return None


def _send_some(sock: socket.socket, buffer: bytearray) -> None:
    """Send as much of ``buffer`` as the socket takes now, removing it from the buffer."""
    try:
        sent = sock.send(buffer)
    except BlockingIOError:
        return
    del buffer[:sent]
