"""A pytest plugin (``-p tests.support.fastpath_report``) that says which twins of the per-record work a run used.

At the end of the run, from each process that ran tests (the one, or each pytest-xdist worker):
``client_stub.fastpath.IMPLEMENTATION`` and the C extensions that were imported at all.
tests/integration/test_pure_python_client.py reads it.
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


# Under pytest-xdist the tests run in the workers: each sends its line to the controller, which writes them.
_workers_lines: set[str] = set()


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fastpath_summary"] = summary()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    line = getattr(node, "workeroutput", {}).get("fastpath_summary")
    if line is not None:
        _workers_lines.add(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in sorted(_workers_lines) or [summary()]:
        terminalreporter.write_line(line)
