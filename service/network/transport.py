"""Transport: what a broker connection reads and writes through, as Java's TransportLayer.

The Selector owns the connections and polls their sockets; a transport moves a connected
socket's bytes, plain (:class:`PlaintextTransport`) or through TLS (:mod:`service.network.tls`),
and says what its own handshake waits for.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Protocol

from client_stub.contract.records import Buffer

from ..poller import POLLIN, POLLOUT

# What a transport's handshake waits for (see Transport.handshake): the poller's own flags, which the
# Selector polls the connection for as they are.
WANT_READ = POLLIN
WANT_WRITE = POLLOUT


class Transport(Protocol):
    """What a channel reads and writes through: plain TCP, or TLS (service.network.tls)."""

    sock: socket.socket

    def handshake(self) -> int:
        """Advance the transport's own handshake once the TCP connection is up.

        Returns 0 once data may flow; else what the handshake waits for, WANT_READ and/or
        WANT_WRITE (as Java's TransportLayer sets its interest ops), and the channel is polled
        for that alone until the next call: a handshake waiting for the peer does not spin.
        """

    def send(self, buffers: list[Buffer]) -> int:
        """Write as much of ``buffers`` as the socket takes; returns the bytes written."""

    def recv(self, size: int) -> bytes:
        """Read up to ``size`` bytes; b"" when the peer closed."""

    def flush(self) -> bool:
        """Write what the transport holds of sends it took already; whether all of it is written."""


# A transport for a connected socket and the host it was connected to (TLS checks the broker's name).
TransportFactory = Callable[[socket.socket, str], Transport]


class PlaintextTransport:
    """TCP without encryption."""

    def __init__(self, sock: socket.socket, host: str = "") -> None:
        self.sock = sock

    def handshake(self) -> int:
        return 0

    def send(self, buffers: list[Buffer]) -> int:
        return self.sock.sendmsg(buffers)

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def flush(self) -> bool:
        return True
