"""The daemon's loop: a bug met serving one client is logged and the loop goes on; a broken loop exits at once."""

from __future__ import annotations

import gc
import logging
import os
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.contract.shared_memory import OK
from service.config import ProducerConfig
from service.daemon import SidecarDaemon
from tests.support.front import (
    BLOCK,
    BLOCKS,
)
from tests.support.waiting import HANG_S


def test_a_broken_loop_exits_at_once_without_failing_what_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    # What one client or one batch causes is caught inside the loop; a loop that breaks itself (an error no
    # client can cause, injected here) exits, and the clients hand what they held to the next daemon.
    daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "buffer.memory": BLOCKS * BLOCK,
                                           "batch.size": BLOCK}), f"ipc://{tmp_path}/sidecar.sock")
    drained: list[int] = []
    turns = iter(range(3))
    threshold = gc.get_threshold()  # run() tunes the collector for the daemon's process: put it back after

    def broken(timeout_ms: int) -> None:
        if next(turns, None) is None:
            raise MemoryError("the loop is broken")

    try:
        with monkeypatch.context() as patch, caplog.at_level(logging.CRITICAL, logger="service.daemon"):
            patch.setattr(daemon.core, "run_once", broken)
            patch.setattr(daemon.core, "close", drained.append)
            with pytest.raises(MemoryError, match="the loop is broken"):
                daemon.run()
        assert drained == []  # no drain: nothing is sent, failed or reported on the way out
        [record] = caplog.records
        assert "the event loop failed: exiting without a drain" in record.getMessage()
        assert record.exc_info is not None and record.exc_info[0] is MemoryError
    finally:
        daemon.shutdown()
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_daemon_loop_survives_an_error_after_an_iteration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "buffer.memory": BLOCKS * BLOCK,
                                           "batch.size": BLOCK}), endpoint)
    context = zmq.Context()
    client = context.socket(zmq.DEALER)
    memory = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        def broken() -> None:
            raise IndexError("pop from empty list")

        with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, logger="service.daemon"):
            patch.setattr(daemon.front, "serve_due", broken)
            daemon.run_once()
            daemon.run_once()
        assert daemon.iteration_errors == 2
        assert caplog.text.count("error in a loop iteration") == 1  # not at every iteration
        # It still serves.
        client.setsockopt(zmq.LINGER, 0)
        client.connect(endpoint)
        client.send(ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "after", {}))
        turn_until(daemon, lambda: bool(client.poll(0)))
        welcome = ipc.decode(client.recv(zmq.NOBLOCK))
        assert isinstance(welcome, ipc.Welcome)
        # The loop serves the memory socket too, beside the ipc socket: the segment comes over it...
        memory.connect(f"{tmp_path}/sidecar.sock.memory")
        memory.send(welcome.memory_token)
        memory.setblocking(False)
        turn_until(daemon, lambda: bool(select.select([memory], [], [], 0)[0]))
        answer, fds, _, _ = socket.recv_fds(memory, 64, 1, socket.MSG_CMSG_CLOEXEC)
        for fd in fds:
            os.close(fd)
        assert answer == OK and len(fds) == 1
        assert len(daemon.front.sessions) == 1
        # ... and the end of its connection ends the session.
        memory.close()
        turn_until(daemon, lambda: not daemon.front.sessions)
    finally:
        memory.close()
        client.close()
        context.term()
        daemon.shutdown()


def turn_until(daemon: SidecarDaemon, condition: Callable[[], bool]) -> None:
    """Turn the daemon's loop until ``condition()``; fails only on a hang."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, "the daemon's loop did not get there"
        daemon.run_once()


def test_nothing_a_client_sends_is_read_while_the_producer_closes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The producer's close turns the poll until what it holds is final. A message read then would have its batches
    # claimed and failed (the producer is closed); unread, they stay the client's, which hands them to the next
    # daemon.
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": "127.0.0.1:9", "buffer.memory": BLOCKS * BLOCK,
                                           "batch.size": BLOCK}), endpoint)
    context = zmq.Context()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(endpoint)
    close = daemon.core.close
    unread: list[bool] = []

    def closing(timeout_ms: int | None = None) -> None:
        client.send(ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "late", {}))
        router = daemon.front.endpoint.socket
        assert router.poll(HANG_S * 1000), "the message did not reach the daemon"
        daemon.poller.poll(0)  # as the producer's flush turns it
        daemon.poller.serve_ready()
        unread.append(bool(router.poll(0)) and not client.poll(0))
        close(timeout_ms)

    try:
        monkeypatch.setattr(daemon.core, "close", closing)
        daemon.stop()
        daemon.shutdown()
        assert unread == [True]
    finally:
        client.close()
        context.term()
