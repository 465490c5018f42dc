"""Waiting in the tests: on the event itself, bounded only against a hang.

A test that waits for something to happen waits until it happens; HANG_S is the bound that
tells a hang (it never happens) from a slow machine, far beyond what the slowest correct run
takes and below pytest's own timeout (pyproject.toml), so that the failure names what did not
happen. A test that checks that something does not happen waits a time of its own choosing:
a slow machine can only make such a check pass more easily.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Seconds: pytest's timeout (300 s a test) less room for the test's setup and teardown (less when a developer
# wants a failing wait to fail quickly).
HANG_S = float(os.environ.get("TESTS_HANG_S", "240"))


def wait_until(condition: Callable[[], object], timeout: float = HANG_S) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds have passed; returns whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
