"""A client's shared memory: its segment's layout, and the memory socket that hands it over.

Each client session has a segment of its own: an anonymous memory file (memfd)
the daemon creates and hands to that client alone, as a file descriptor over a
Unix socket (SCM_RIGHTS). It has no name in /dev/shm or anywhere else, so no other
process can map it: a client reads and writes its own records only. The segment
is sealed against shrinking and growing, so that a client cannot make the daemon's
mapping fault. Its blocks are numbered from 0; the daemon's BufferPool counts the
blocks granted across all clients against buffer.memory. After the blocks, its control
area: what the client publishes of its open batches and the daemon's claims of them
(:mod:`.batch_slots`).

The memory socket (SOCK_SEQPACKET) beside the ZeroMQ endpoint:

- the client connects and sends the token of its WELCOME, alone (a new segment) or with
  the segment of a session whose daemon is gone attached (to resume it);
- the daemon answers ``OK`` with the new segment attached, ``OK`` alone (resumed), or
  ``ERR`` and the reason;
- the connection then stays open for the session's life, and nothing more is sent
  on it: each side learns that the other's process is gone when it reads the end of
  the stream (the kernel's word, whoever the other runs as); see :func:`hung_up`.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
from dataclasses import dataclass

from .batch_slots import control_size

TOKEN_SIZE = 16
OK = b"OK"
ERR = b"ERR "
# The daemon's refusal of a token it does not know (it forgot it when a HELLO said again replaced its session).
UNKNOWN_TOKEN = "unknown token: say HELLO first"
# Seals every segment carries: its size is fixed for as long as it exists.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
# The longest answer of either side.
_MAX_PACKET = 4096


class HandshakeError(ConnectionError):
    """The daemon refused the handshake, or answered something else than was asked."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Blocks of ``block_size`` bytes, ``block_count`` of them, from the start of the segment; then the control
    area."""

    block_size: int
    block_count: int

    @property
    def control_offset(self) -> int:
        # On a cache line of its own (batch.size may be any number of bytes; the control area's words are aligned).
        return -(-self.block_count * self.block_size // 64) * 64

    @property
    def size(self) -> int:
        return self.control_offset + control_size(self.block_count)

    def block_offset(self, block: int) -> int:
        return block * self.block_size


def create_segment(layout: Layout, name: str) -> int:
    """A new sealed memory file of ``layout.size`` bytes (its pages are allocated as they are written)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, layout.size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_segment(fd: int, layout: Layout) -> None:
    """ValueError unless ``fd`` is a memory file of ordinary pages and ``layout.size`` bytes, sealed as
    :func:`create_segment` seals it: it can neither be resized, nor sealed further (against writes, which
    would make the pages impossible to free), by anyone."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise ValueError("the segment is not a sealable memory file (memfd)") from None
    if seals != SEALS | fcntl.F_SEAL_SEAL:
        raise ValueError(f"the segment's seals are {seals:#x}, not {SEALS | fcntl.F_SEAL_SEAL:#x}: sealed against "
                         "shrinking and growing, and against further seals, only")
    stat = os.fstat(fd)
    if stat.st_blksize != mmap.PAGESIZE:
        raise ValueError(f"the segment has pages of {stat.st_blksize} bytes, not {mmap.PAGESIZE} (huge pages?)")
    if stat.st_size != layout.size:
        raise ValueError(f"the segment has {stat.st_size} bytes, the pool's layout {layout.size}")


class Segment:
    """A mapping of a client's segment (the file descriptor stays the caller's)."""

    def __init__(self, fd: int, layout: Layout) -> None:
        self._mmap = mmap.mmap(fd, layout.size)
        self.buf = memoryview(self._mmap)
        self.layout = layout
        self.control = self.buf[layout.control_offset:]

    def blocks(self, first: int, count: int = 1) -> memoryview:
        """The bytes of ``count`` consecutive blocks from ``first``."""
        start = self.layout.block_offset(first)
        return self.buf[start:start + count * self.layout.block_size]

    def madvise(self, option: int, start: int, length: int) -> None:
        """madvise(2) on a range of the mapping (the daemon frees the pages of blocks free long)."""
        self._mmap.madvise(option, start, length)

    def close(self) -> None:
        """Unmap (every view of the blocks must be released first)."""
        self.control.release()
        self.buf.release()
        self._mmap.close()


def memory_socket_path(endpoint: str, daemon_id: str) -> str:
    """Where the daemon of ``endpoint`` listens for its clients' memory handshakes.

    Beside the ipc socket, with its mode and group; for a tcp endpoint, an abstract socket
    (no file: anyone on the host may connect, as anyone may reach the tcp endpoint).
    """
    if endpoint.startswith("ipc://"):
        return endpoint[len("ipc://"):] + ".memory"
    return f"\0kafka-sidecar-{daemon_id}.memory"


def hung_up(conn: socket.socket) -> bool:
    """Whether a session's connection is over: the other side closed it (its process is gone), or sent
    something (after the handshake neither side sends anything: one that does breaks the protocol)."""
    try:
        conn.recv(1)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        pass
    return True


def connect(path: str, token: bytes, timeout: float, resume_fd: int | None = None) -> tuple[socket.socket, int | None]:
    """The client's half of the handshake: the connection (kept for the session's life) and the new
    segment's file descriptor (None when the segment ``resume_fd`` was taken back).

    OSError if the daemon cannot be reached (PermissionError: this user may not), HandshakeError if it
    refuses (with its reason).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        if resume_fd is None:
            sock.sendall(token)
        else:
            socket.send_fds(sock, [token], [resume_fd])
        answer, fds, _, _ = socket.recv_fds(sock, _MAX_PACKET, 1, socket.MSG_CMSG_CLOEXEC)
        if answer != OK:
            for fd in fds:
                os.close(fd)
            reason = answer[len(ERR):].decode(errors="replace") if answer.startswith(ERR) else "no answer"
            raise HandshakeError(f"the daemon refused the shared memory handshake: {reason}")
        if bool(fds) == (resume_fd is not None):
            for fd in fds:
                os.close(fd)
            raise HandshakeError("the daemon's answer to the shared memory handshake is not the one asked for")
        sock.setblocking(False)
        return sock, (fds[0] if fds else None)
    except BaseException:
        sock.close()
        raise
