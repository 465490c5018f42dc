"""Endpoint: where the daemon serves its clients, bound, locked and cleaned up.

The ROUTER socket at the endpoint (``ipc://PATH`` or ``tcp://HOST:PORT``) and, beside it,
the memory socket. An ipc endpoint's file is held by a lock for the daemon's life, its
directory made if missing (and removed with the daemon), and both socket files get the
configured mode and group whatever the umask.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import zmq

from client_stub.contract.shared_memory import memory_socket_path

from ..memory_socket import MemorySocket, bind_socket_file

# ZeroMQ reads at most this many messages of one client ahead of the loop (then it stops reading that client's
# connection, whose sends wait): what a flooding client holds of the daemon's memory is this many messages of
# at most max_message_size bytes, and a client's messages are handled within this many of its own.
RECEIVE_HWM = 100
# How long the last messages to clients may take on shutdown.
_CLOSE_LINGER_MS = 1000


class EndpointInUseError(RuntimeError):
    """Another daemon already serves the endpoint."""


class Endpoint:
    """The ROUTER socket and the memory socket of one daemon, with what their files need."""

    def __init__(self, address: str, daemon_id: str, *, max_message_size: int, send_hwm: int, mode: int = 0o660,
                 group: int | None = None, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self.address = address
        self._context = context or zmq.Context()
        self._own_context = context is None
        self._lock_file: int | None = None
        # The socket's directory, if the daemon made it: it goes when the daemon does.
        self._made_directory: str | None = None
        group = os.getegid() if group is None else group
        self.socket = self._bind(mode, group, max_message_size, send_hwm)
        try:
            self.memory = MemorySocket(memory_socket_path(address, daemon_id), mode, group)
        except BaseException:
            self.socket.close(linger=0)
            self._unlock()
            raise

    @property
    def path(self) -> str | None:
        """The socket file of an ipc endpoint."""
        return self.address[len("ipc://"):] if self.address.startswith("ipc://") else None

    def _bind(self, mode: int, group: int, max_message_size: int, send_hwm: int) -> zmq.Socket[bytes]:
        path = self.path
        if path is not None:
            directory = os.path.dirname(path) or "."
            if _make_directory(directory, mode, group):
                self._made_directory = directory
            self._lock_file = _lock_endpoint(path)
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.SNDHWM, send_hwm)
        # A reply that cannot be queued raises (EAGAIN at the high-water mark, EHOSTUNREACH for a client whose
        # socket is gone) instead of vanishing: it then waits in its session, or the session ends.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_size)
        try:
            if path is None:
                sock.bind(self.address)
            else:
                # ZeroMQ's bind replaces a stale socket file (the lock says no daemon serves it).
                bind_socket_file(lambda: sock.bind(self.address), path, mode, group)
        except BaseException:
            sock.close()
            self._unlock()
            raise
        return sock

    def close_socket(self) -> None:
        """Close the ROUTER socket, lingering: the last replies reach the clients first."""
        self.socket.close(linger=_CLOSE_LINGER_MS)
        if self._own_context:
            self._context.term()

    def close(self) -> None:
        """Close the memory socket and remove the endpoint's files, its lock and the directory the daemon made."""
        self.memory.close()
        path = self.path
        if path is not None:
            Path(path).unlink(missing_ok=True)
            # The lock's file goes while it is held: a daemon that opened it before fails to lock it, one that
            # comes after makes a new one.
            Path(f"{path}.lock").unlink(missing_ok=True)
        self._unlock()
        if self._made_directory is not None:
            try:
                os.rmdir(self._made_directory)
            except OSError:
                pass  # something else is in it now: not the daemon's to remove

    def _unlock(self) -> None:
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None


def _make_directory(directory: str, mode: int, group: int) -> bool:
    """The socket's directory: made if missing, searchable by the classes of user that ``mode`` lets use the
    socket (whatever the umask); one that exists is the administrator's (RuntimeDirectory=, /tmp) and kept.
    Returns whether it was made."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.mkdir(directory, 0o700)
    os.chown(directory, -1, group)
    os.chmod(directory, 0o700 | (0o050 if mode & 0o060 else 0) | (0o005 if mode & 0o006 else 0))
    return True


def _lock_endpoint(path: str) -> int:
    """Hold ``path``.lock for the daemon's life; EndpointInUseError if another daemon holds it.

    A lock, not a probe of the socket: two daemons started at once cannot both find the endpoint free
    (and the lock goes with its process, however that ends).
    """
    lock_path = path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise EndpointInUseError(f"another kafka-sidecar daemon is serving {path}") from None
    except BaseException:
        os.close(fd)
        raise
    os.fchmod(fd, 0o600)
    return fd
