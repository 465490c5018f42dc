"""The twins of the per-record work, for tests that run against both in one process.

``CLIENT`` (``client_stub._fastpath`` and ``client_stub._fastpath_py``) and ``DAEMON``
(``service._fastpath`` and ``service._fastpath_py``) are pytest params of the modules themselves,
with the ids "c" and "python"; the C one is skipped where the extension is not built.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest


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
