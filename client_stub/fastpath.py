"""The client's per-record work, in C or in pure Python: chosen once, when this module is first imported.

Two twins with the same names, behaviour and errors: the C extension ``client_stub._fastpath``
(``client_stub/_fastpath.c``) and ``client_stub/_fastpath_py.py``. The extension is used unless it
cannot be imported (built without a C compiler at hand, or for another interpreter) or the environment
variable ``KAFKA_SIDECAR_PURE_PYTHON`` is true ("1", "true" or "yes"). ``IMPLEMENTATION`` says which
is in use: "c" or "python". The daemon's own per-record work (``service.fastpath``) is chosen the same way.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["IMPLEMENTATION", "PURE_PYTHON_VARIABLE", "Appender", "Completer", "OpenBatch", "encode_record",
           "encode_record_into", "load", "murmur2", "pure_python_requested", "record_size"]

PURE_PYTHON_VARIABLE = "KAFKA_SIDECAR_PURE_PYTHON"


def pure_python_requested() -> bool:
    """Whether KAFKA_SIDECAR_PURE_PYTHON asks for the pure-Python twins."""
    return os.environ.get(PURE_PYTHON_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def load(extension: str, twin: str) -> tuple[ModuleType, str]:
    """The C ``extension`` and "c", or, if pure Python is requested or the extension cannot be imported, its
    pure-Python ``twin`` and "python"."""
    if not pure_python_requested():
        try:
            return importlib.import_module(extension), "c"
        except ImportError:
            pass
    return importlib.import_module(twin), "python"


if TYPE_CHECKING:
    # Whichever twin load() returns has the names and types of the extension's stub, client_stub/_fastpath.pyi.
    from . import _fastpath as _module

    IMPLEMENTATION: str
else:
    _module, IMPLEMENTATION = load("client_stub._fastpath", "client_stub._fastpath_py")

Appender = _module.Appender
Completer = _module.Completer
OpenBatch = _module.OpenBatch
encode_record = _module.encode_record
encode_record_into = _module.encode_record_into
murmur2 = _module.murmur2
record_size = _module.record_size
