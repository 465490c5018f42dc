"""The daemon's memory socket: where each client gets its segment, and whose connection says it is alive.

The protocol is :mod:`client_stub.contract.shared_memory`'s. The listener and every
connection are non-blocking and polled in the daemon's one loop; the front decides
what each handshake gets.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from client_stub.contract.shared_memory import ERR, OK, TOKEN_SIZE

from .client_error import ClientError

# struct ucred: pid, uid, gid.
_UCRED = struct.Struct("3i")


class MemorySocket:
    """A listening SOCK_SEQPACKET Unix socket at ``path`` (a file with ``mode`` and ``group``, or abstract)."""

    def __init__(self, path: str, mode: int, group: int) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if path.startswith("\0"):
                self.listener.bind(path)
            else:
                # The endpoint's lock says no daemon serves it: a file left here is a dead daemon's.
                Path(path).unlink(missing_ok=True)
                bind_socket_file(lambda: self.listener.bind(path), path, mode, group)
            self.listener.listen(128)
            self.listener.setblocking(False)
        except BaseException:
            self.listener.close()
            raise

    def accept_all(self) -> tuple[list[socket.socket], OSError | None]:
        """The connections waiting, non-blocking; and the error that stopped accepting (out of file
        descriptors, say), if one did."""
        accepted = []
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return accepted, None
            except OSError as exc:
                return accepted, exc
            conn.setblocking(False)
            accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        if not self.path.startswith("\0"):
            Path(self.path).unlink(missing_ok=True)


def bind_socket_file(bind: Callable[[], None], path: str, mode: int, group: int) -> None:
    """``bind()`` a socket at ``path`` under the tightest umask, then give the file ``mode`` and ``group``:
    whatever the umask, nobody else may connect in between, and those the configuration says may after."""
    umask = os.umask(0o177)
    try:
        bind()
    finally:
        os.umask(umask)
    os.chown(path, -1, group)
    os.chmod(path, mode)


def read_token(conn: socket.socket) -> tuple[bytes, list[int]] | None:
    """A client's handshake: its token and the file descriptors attached (the caller closes them); None if
    nothing is there yet. ClientError if the client sent something else or hung up."""
    try:
        data, fds, flags, _ = socket.recv_fds(conn, TOKEN_SIZE + 1, 1, socket.MSG_CMSG_CLOEXEC)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        raise ClientError(f"the connection failed: {exc}") from None
    if len(data) != TOKEN_SIZE or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ClientError("a handshake is one token of 16 bytes, with at most one segment")
    return data, fds


def answer(conn: socket.socket, fd: int | None = None) -> None:
    """OK, with the new segment's file descriptor if there is one."""
    try:
        if fd is None:
            conn.send(OK)
        else:
            socket.send_fds(conn, [OK], [fd])
    except OSError:
        pass  # the client is gone: its connection's end is read next


def refuse(conn: socket.socket, reason: str) -> None:
    """ERR and the reason; the caller closes the connection."""
    try:
        conn.send(ERR + reason.encode()[:1000])
    except OSError:
        pass


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel saw it."""
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
