"""The twins of the per-record work, for tests that run against both in one process.

``CLIENT`` (``client_stub._fastpath`` and ``client_stub._fastpath_py``) and ``DAEMON``
(``service._fastpath`` and ``service._fastpath_py``) are pytest params of the modules themselves,
with the ids "c" and "python"; the C one is skipped where the extension is not built.
:func:`mapped_segment` is a client's segment, as a daemon hands it over, for the client's batches to
publish in while a test claims them as the daemon does.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout, Segment, create_segment


def c_extension(name: str) -> ModuleType | None:
    """The C extension ``name``, or None where it is not built."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def twins(extension: str, twin: str) -> list[Any]:
    """pytest params of the C ``extension`` and its pure-Python ``twin``."""
    c_module = c_extension(extension)
    skip = pytest.mark.skipif(c_module is None, reason=f"{extension} is not built")
    return [pytest.param(c_module, id="c", marks=skip), pytest.param(importlib.import_module(twin), id="python")]


CLIENT = twins("client_stub._fastpath", "client_stub._fastpath_py")
DAEMON = twins("service._fastpath", "service._fastpath_py")


@dataclass(frozen=True)
class MappedSegment:
    """A segment mapped (``fd``: its memory file, to hand to another process) and the daemon's side of its control
    area (``daemon``: what claims the batches its client publishes)."""

    fd: int
    segment: Segment
    daemon: ControlArea


@contextlib.contextmanager
def mapped_segment(layout: Layout) -> Iterator[MappedSegment]:
    """A new segment of ``layout``, sealed as the daemon makes one; every batch on it is released before it ends."""
    fd = create_segment(layout, "test-segment")
    segment = Segment(fd, layout)
    daemon = ControlArea(segment.control, layout.block_count)
    try:
        yield MappedSegment(fd, segment, daemon)
    finally:
        daemon.release()
        segment.close()
        os.close(fd)
