"""A real kafka-sidecar daemon process for the tests, on a private ipc or tcp endpoint."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from client_stub.errors import SidecarUnavailableError
from service.stats import request_stats
from service.tools.embedded import free_port
from tests.support import users
from tests.support.waiting import HANG_S


class SidecarProcess:
    """``python -m service.cli run`` with the given settings; stopped with SIGTERM."""

    def __init__(self, bootstrap: str, *, transport: str = "ipc", endpoint: str | None = None,
                 settings: dict[str, object] | None = None, start_timeout: float = HANG_S,
                 user: users.User | None = None, umask: int = 0o007) -> None:
        self.bootstrap = bootstrap
        self.settings = {k: str(v) for k, v in (settings or {}).items()}
        self.start_timeout = start_timeout
        # The daemon runs as ``user`` (in its primary group only), with ``umask`` as systemd's unit sets it.
        self.user = user
        self.umask = umask
        # Another user's daemon needs a directory its clients can reach.
        self._dir = tempfile.mkdtemp(prefix="kafka-sidecar-", dir=None if user is None else users.open_temp_dir())
        if user is not None:
            os.chown(self._dir, user.uid, user.gid)
            os.chmod(self._dir, 0o750)
        if endpoint is not None:
            self.endpoint = endpoint
        elif transport == "ipc":
            self.endpoint = f"ipc://{self._dir}/sidecar.sock"
        else:
            self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = Path(self._dir) / "daemon.log"
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Self:
        """Start the daemon (again, after kill(), on the same endpoint) and wait for its WELCOME."""
        if self.is_running():
            # A second daemon would orphan the first (`with SidecarProcess(...).start()` starts twice).
            raise RuntimeError(f"the daemon at {self.endpoint} is already running")
        interpreter = sys.executable if self.user is None else users.shared_interpreter()
        assert interpreter is not None, users.why_not()
        command = [interpreter, "-m", "service.cli", "run", "--bootstrap-servers", self.bootstrap,
                   "--endpoint", self.endpoint]
        for key, value in self.settings.items():
            command += ["-X", f"{key}={value}"]
        self._log = self.log_path.open("ab")
        as_user = ({"cwd": users.ROOT, "umask": self.umask} if self.user is None
                   else self.user.popen_options(self.umask))
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, **as_user)
        try:
            self.stats(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stats(self, timeout: float = HANG_S) -> dict[str, Any]:
        """The daemon's metrics (see service.daemon_metrics.daemon_metrics), asked as `kafka-sidecar stats` asks,
        waiting up to ``timeout`` for it to answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return request_stats(self.endpoint, timeout=0.1)
            except SidecarUnavailableError:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"the daemon exited with {self.process.returncode}:\n"
                                       f"{self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer from the daemon in {timeout}s:\n{self.log_tail()}") from None

    def held(self) -> dict[int, int]:
        """The blocks each client id holds (granted or sealed), as the daemon counts them."""
        return {client_id: count for client_id, count in self.stats()["held"]}  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL: the daemon gets no chance to finish anything."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = HANG_S) -> int | None:
        """SIGTERM, wait (kill after ``timeout``); returns the exit code."""
        process, self.process = self.process, None
        code = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def client_id_of(self, pid: int) -> int:
        """The client id the daemon last gave to process ``pid`` (from its log of connections)."""
        ids = re.findall(rf"client (\d+) \(pid {pid}, [^\n]*\) connected", self.log_path.read_text(errors="replace"))
        if not ids:
            raise LookupError(f"process {pid} has not connected to the daemon:\n{self.log_tail()}")
        return int(ids[-1])

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
