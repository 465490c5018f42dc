"""Poller: the daemon's one wait, on the brokers' sockets and the clients' alike.

Each part registers what it waits on (a ZeroMQ socket, or anything with a file
descriptor) with the handler that serves it, as librdkafka's broker thread serves its
queue and its sockets with one poll. :meth:`Poller.poll` waits once for all of them and
calls at once the handlers of the network's sockets, whose I/O the network client handles
right after the wait; the handlers registered ``later`` (the clients') are called by the
loop's :meth:`Poller.serve_ready`, after the producer's turn, so that their work neither
delays nor is timed as the brokers' responses. Underneath is a ``zmq.Poller``, which waits
on plain sockets and ZeroMQ sockets together.

A handler is told its socket is ready; it reads without blocking, and so tolerates finding
nothing (a socket closed by another handler of the same poll may have its descriptor's number
taken by a new one by then).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import zmq

# pyzmq's flags are enum.Flag members, whose | and & run Python code: plain ints.
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)
POLLERR = int(zmq.POLLERR)

# Called with the events that are ready (POLLIN, POLLOUT, POLLERR as an int).
Handler = Callable[[int], None]


class Poller:
    """What the loop waits on, each with its handler; :meth:`wakeup` ends a wait from any thread."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        # By what zmq.Poller reports a socket as (see _poll_key): its handler, and the events it waits for.
        self._handlers: dict[Any, Handler] = {}
        self._events: dict[Any, int] = {}
        # Of those, the sockets whose handlers serve_ready() calls, and those of them the last polls found ready.
        self._later: set[Any] = set()
        self._ready: dict[Any, int] = {}
        # wakeup() from another thread ends a poll at once: a byte in this pipe, as Java's Selector.wakeup().
        self._wakeup_read, self._wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.register(self._wakeup_read, POLLIN, self._drain_wakeups)
        weakref.finalize(self, _close_fds, self._wakeup_read, self._wakeup_write)

    def register(self, sock: Any, events: int, handler: Handler, *, later: bool = False) -> None:
        """Wait for ``events`` of ``sock`` (a ZeroMQ socket, a file descriptor or anything with fileno()), served by
        ``handler``: at once in :meth:`poll`, or if ``later`` in :meth:`serve_ready`. Registered again, only the
        events and the handler change."""
        key = _poll_key(sock)
        if self._events.get(key) != events:
            self._poller.register(sock, events)
            self._events[key] = events
        self._handlers[key] = handler
        if later:
            self._later.add(key)
        else:
            self._later.discard(key)

    def unregister(self, sock: Any) -> None:
        """Wait for ``sock`` no more (nothing if it was not registered)."""
        key = _poll_key(sock)
        if self._handlers.pop(key, None) is not None:
            del self._events[key]
            self._later.discard(key)
            self._ready.pop(key, None)
            self._poller.unregister(sock)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for anything registered (not at all while a ``later`` one is ready and not
        served), then call the handler of each that is ready, but for those served later."""
        for key, events in self._poller.poll(0 if self._ready else max(int(timeout_ms), 0)):
            if key in self._later:
                self._ready[key] = self._ready.get(key, 0) | events
                continue
            handler = self._handlers.get(key)
            if handler is not None:  # unregistered by the handler of another, ready in the same poll
                handler(events)

    def serve_ready(self) -> None:
        """Call the handlers registered ``later`` whose sockets the last polls found ready, in the order the poll
        reports them (that of their registration)."""
        ready, self._ready = self._ready, {}
        for key, events in ready.items():
            handler = self._handlers.get(key)
            if handler is not None:  # unregistered by a handler before it
                handler(events)

    def wakeup(self) -> None:
        """End the current or next poll() at once; safe from any thread."""
        try:
            os.write(self._wakeup_write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def _drain_wakeups(self, events: int) -> None:
        try:
            while os.read(self._wakeup_read, 4096):
                pass
        except BlockingIOError:
            pass


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _poll_key(sock: Any) -> Any:
    """What ``zmq.Poller.poll`` reports ``sock`` as: ZeroMQ sockets as themselves, others by fd."""
    if isinstance(sock, (zmq.Socket, int)):
        return sock
    return sock.fileno()
