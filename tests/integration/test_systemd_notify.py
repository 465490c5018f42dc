"""The daemon under systemd's Type=notify: READY=1 once it serves, WATCHDOG=1 from its loop, STOPPING=1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support import users

pytestmark = pytest.mark.broker


def messages(notify: socket.socket, seconds: float) -> list[str]:
    """What the daemon sent to the notification socket within ``seconds``, a datagram each."""
    received = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        notify.settimeout(left)
        try:
            received.append(notify.recv(4096).decode())
        except TimeoutError:
            break
    return received


def test_ready_once_serving_then_a_watchdog_from_the_loop_and_stopping_at_the_end(broker, tmp_path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    endpoint = tmp_path / "sidecar.sock"
    # systemd's environment for a unit with WatchdogSec=0.2: the daemon pings at half of it.
    environment = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"}
    daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--bootstrap-servers", broker.bootstrap,
                               "--endpoint", f"ipc://{endpoint}"], env=environment, cwd=users.ROOT,
                              stderr=subprocess.DEVNULL)
    try:
        notify.settimeout(30)
        ready = ""
        while "READY=1" not in ready.splitlines():
            ready = notify.recv(4096).decode()  # watchdog pings may come first
        # Ready once the endpoint is bound and the first metadata is in.
        assert endpoint.exists()
        assert any(line.startswith("STATUS=0 clients") for line in ready.splitlines()), ready
        assert sum("WATCHDOG=1" in m for m in messages(notify, 2.0)) >= 2
        # A loop held still sends no watchdog: systemd would restart it.
        daemon.send_signal(signal.SIGSTOP)
        messages(notify, 0.3)  # what was on its way
        assert messages(notify, 1.0) == []
        daemon.send_signal(signal.SIGCONT)
        assert any("WATCHDOG=1" in m for m in messages(notify, 2.0))
        daemon.send_signal(signal.SIGTERM)
        assert any("STOPPING=1" in m for m in messages(notify, 10.0))
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        notify.close()

