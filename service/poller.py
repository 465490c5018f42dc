"""Poller: the daemon's one wait, on the brokers' sockets and the clients' alike.

Each part registers what it waits on (a ZeroMQ socket, or anything with a file
descriptor) with the handler that serves it; :meth:`Poller.poll` waits once for all of
them and calls the handlers of what is ready, as librdkafka's broker thread serves its
queue and its sockets with one poll. Underneath is a ``zmq.Poller``, which waits on
plain sockets and ZeroMQ sockets together.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import zmq

log = logging.getLogger(__name__)

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
        # wakeup() from another thread ends a poll at once: a byte in this pipe, as Java's Selector.wakeup().
        self._wakeup_read, self._wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.register(self._wakeup_read, POLLIN, self._drain_wakeups)
        weakref.finalize(self, _close_fds, self._wakeup_read, self._wakeup_write)

    def register(self, sock: Any, events: int, handler: Handler) -> None:
        """Wait for ``events`` of ``sock`` (a ZeroMQ socket, a file descriptor or anything with fileno()), served by
        ``handler``; registered again, only the events and the handler change."""
        key = _poll_key(sock)
        if self._events.get(key) != events:
            self._poller.register(sock, events)
            self._events[key] = events
        self._handlers[key] = handler

    def unregister(self, sock: Any) -> None:
        """Wait for ``sock`` no more (nothing if it was not registered)."""
        key = _poll_key(sock)
        if self._handlers.pop(key, None) is not None:
            del self._events[key]
            self._poller.unregister(sock)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for anything registered, then call the handler of each that is ready."""
        for key, events in self._poller.poll(max(int(timeout_ms), 0)):
            handler = self._handlers.get(key)
            if handler is not None:  # unregistered by the handler of another, ready in the same poll
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


def isolated(handler: Handler) -> Handler:
    """``handler``, whose exceptions are logged with their traceback and go no further: for what serves one
    client, where a bug met must not stop the loop for all of them."""

    def serve(events: int) -> None:
        try:
            handler(events)
        except Exception:
            log.exception("error serving a client's socket")

    return serve


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _poll_key(sock: Any) -> Any:
    """What ``zmq.Poller.poll`` reports ``sock`` as: ZeroMQ sockets as themselves, others by fd."""
    if isinstance(sock, (zmq.Socket, int)):
        return sock
    return sock.fileno()
