"""The clients and blocks of a small BufferPool, and what the tests of the pool and its parts do with them (the
fixtures are in tests.support.buffer_pool_fixtures)."""

from __future__ import annotations

import os

from client_stub.contract.shared_memory import Layout, Segment
from service.buffer_pool import BufferPool

BLOCK = 4096
BLOCKS = 8
A, B, C = 1, 2, 3  # client ids
STRANGER = 99  # a client that never attached


def attach(pool: BufferPool, *clients: int) -> None:
    """Give each client a segment, closing its file descriptor as the daemon does once it is handed over."""
    for client in clients:
        os.close(pool.attach(client))


def map_segment(fd: int, layout: Layout) -> Segment:
    """What a client does with the file descriptor it is handed: map it, and close it."""
    try:
        return Segment(fd, layout)
    finally:
        os.close(fd)


def states(pool: BufferPool, client: int) -> list[int]:
    """The state of each block of a client's segment, as the daemon keeps it."""
    return list(pool._memory[client].state)


def take_all(pool: BufferPool, client: int = A) -> None:
    """The client takes the whole pool, in one run."""
    blocks = pool.request(client, 0, BLOCKS, True, 0)
    assert blocks == list(range(BLOCKS)), blocks


def mapped(inode: int) -> bool:
    """Whether this process maps the memory file of ``inode`` (as the kernel lists it in /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return any(len(f := line.split()) >= 6 and f[4] == str(inode) and f[5].startswith("/memfd:") for line in maps)
