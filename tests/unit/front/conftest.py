"""The front's tests share one harness (tests/support/front.py): a front of its own for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.front import Env


@pytest.fixture
def env() -> Iterator[Env]:
    env = Env()
    try:
        yield env
    finally:
        env.close()
