"""Fixtures of the unit tests: a front of its own (tests/support/front.py), a pair of ZeroMQ sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from tests.support.front import Env


@pytest.fixture
def env() -> Iterator[Env]:
    with Env() as env:
        yield env


@pytest.fixture
def zmq_pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """Two connected ZeroMQ PAIR sockets (inproc)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a = context.socket(zmq.PAIR)
    b = context.socket(zmq.PAIR)
    a.bind("inproc://zmq-pair")
    b.connect("inproc://zmq-pair")
    try:
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)
        context.term()
