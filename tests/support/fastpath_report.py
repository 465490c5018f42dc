"""A pytest plugin (``-p tests.support.fastpath_report``) that says which twins of the per-record work a run used.

At the end of the run, from the process that ran the tests: ``client_stub.fastpath.IMPLEMENTATION``
and the C extensions that were imported at all. tests/integration/test_pure_python_client.py reads it.
"""

from __future__ import annotations

import sys

import pytest

EXTENSIONS = ("client_stub._fastpath", "service._fastpath")


def summary() -> str:
    """The line this plugin writes."""
    chooser = sys.modules.get("client_stub.fastpath")
    implementation = chooser.IMPLEMENTATION if chooser is not None else "not imported"
    loaded = [name for name in EXTENSIONS if sys.modules.get(name) is not None]
    return f"kafka-sidecar fastpath: {implementation}; C extensions imported: {', '.join(loaded) or 'none'}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(summary())
