"""Fixtures of a small BufferPool, bare or with clients attached: a plugin, which a test module takes with
``pytest_plugins = ("tests.support.buffer_pool_fixtures",)``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client_stub.contract.shared_memory import Segment
from service.buffer_pool import BufferPool
from tests.support.buffer_pool import BLOCK, BLOCKS, A, B, C, map_segment


@pytest.fixture
def bare_pool() -> Iterator[BufferPool]:
    """A pool no client has attached to."""
    pool = BufferPool(BLOCKS * BLOCK, BLOCK)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def segments(bare_pool: BufferPool) -> Iterator[dict[int, Segment]]:
    """Clients A, B and C attached, each one's segment as that client maps it."""
    mapped: dict[int, Segment] = {}
    try:
        for client in (A, B, C):
            mapped[client] = map_segment(bare_pool.attach(client), bare_pool.layout)
        yield mapped
    finally:
        for segment in mapped.values():
            segment.close()


@pytest.fixture
def pool(bare_pool: BufferPool, segments: dict[int, Segment]) -> BufferPool:
    """The pool, with clients A, B and C attached."""
    return bare_pool
