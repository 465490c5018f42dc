"""The daemon's memory socket: where each client gets its segment, and whose connection says it is alive.

The protocol is :mod:`client_stub.contract.shared_memory`'s. The listener and every
connection are non-blocking and polled in the daemon's one loop; the front decides
what each handshake gets.
"""

from __future__ import annotations

import os
import socket
import struct

from client_stub.contract.shared_memory import ERR, OK, TOKEN_SIZE

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
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                # Made with the tightest umask, then given the configured mode and group, as the ipc socket.
                umask = os.umask(0o177)
                try:
                    self.listener.bind(path)
                finally:
                    os.umask(umask)
                os.chown(path, -1, group)
                os.chmod(path, mode)
            self.listener.listen(128)
            self.listener.setblocking(False)
        except BaseException:
            self.listener.close()
            raise

    def accept_all(self) -> list[socket.socket]:
        """The connections waiting, non-blocking."""
        accepted = []
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError:
                return accepted  # out of file descriptors, say: the client retries or times out
            conn.setblocking(False)
            accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        if not self.path.startswith("\0"):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def read_token(conn: socket.socket) -> tuple[bytes, list[int]] | None:
    """A client's handshake: its token and the file descriptors attached (the caller closes them); None if
    nothing is there yet. ValueError if the client sent something else or hung up."""
    try:
        data, fds, flags, _ = socket.recv_fds(conn, TOKEN_SIZE + 1, 1, socket.MSG_CMSG_CLOEXEC)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        raise ValueError(f"the connection failed: {exc}") from None
    if len(data) != TOKEN_SIZE or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("a handshake is one token of 16 bytes, with at most one segment")
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


def hung_up(conn: socket.socket) -> bool:
    """Whether the other end closed the connection (its process is gone); anything else it sent is dropped."""
    while True:
        try:
            data = conn.recv(64)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel saw it."""
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
