"""The producer's Outbox: what waits to be sent to the daemon, and the I/O thread's wake-up pipe.

Any thread posts a message (a block request, a WAKEUP, a GOODBYE); the I/O
thread, woken through a socket pair that it polls beside its ZeroMQ socket, sends
what is queued before it polls again.
"""

from __future__ import annotations

import socket
import threading
from collections import deque

import zmq

from .contract import ipc


class Outbox:
    """Messages for the daemon, queued by any thread and sent by the I/O thread, which they wake."""

    def __init__(self) -> None:
        self._messages: deque[bytes] = deque()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._wake_pending = False
        self._io_ident: int | None = None

    def open(self) -> None:
        """Make the wake-up pipe (when the I/O thread starts)."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def post(self, message: ipc.Message) -> None:
        """Queue a message (lock held or not: deque appends are atomic) and wake the I/O thread."""
        self._messages.append(ipc.encode(message))
        self.wake()

    def wake(self) -> None:
        """Wake the I/O thread, unless a wake-up is pending already or this is the I/O thread."""
        # The I/O thread sends what was queued before it polls again; a wake-up pending is enough.
        if self._wake_pending or threading.get_ident() == self._io_ident:
            return
        self._wake_pending = True
        wake_w = self._wake_w
        if wake_w is None:
            return  # not started, or the I/O thread has ended
        try:
            wake_w.send(b"\x00")
        except BlockingIOError:
            pass  # already woken: the pipe is full
        except OSError:
            pass  # closed meanwhile: the I/O thread has ended

    def bind(self) -> int:
        """Called on the I/O thread when it starts, whose own wake() calls are unneeded; returns the file
        descriptor to poll for wake-ups."""
        assert self._wake_r is not None, "open() first"
        self._io_ident = threading.get_ident()
        return self._wake_r.fileno()

    def send_all(self, sock: zmq.Socket[bytes]) -> None:
        """Send what is queued (I/O thread)."""
        messages = self._messages
        while messages:
            sock.send(messages.popleft())

    def clear(self) -> None:
        """Drop what waits: it was for a session that is gone."""
        self._messages.clear()

    def close(self) -> None:
        """Close the wake-up pipe (when the I/O thread ends: nothing is sent any more)."""
        wake_r, wake_w = self._wake_r, self._wake_w
        self._wake_r = self._wake_w = None
        for sock in (wake_r, wake_w):
            if sock is not None:
                sock.close()

    def woken(self) -> None:
        """Take the wake-up (I/O thread)."""
        # Drained before the flag is cleared, and both before the outbox and the batches are read: a wake-up
        # written after the drain stays in the pipe; one skipped because the flag was still set asked for
        # what they are about to show. (Cleared first, a wake-up written between the two was drained with the flag
        # left set, and every later wake() skipped.) One read: a wake-up is one byte, and whatever is left
        # wakes the next poll at once. A small read comes from Python's object allocator; a page-sized one
        # would be a malloc() in this thread's own arena, whose pages stay resident in every client process.
        assert self._wake_r is not None, "open() first"
        try:
            self._wake_r.recv(64)
        except BlockingIOError:
            pass
        self._wake_pending = False
