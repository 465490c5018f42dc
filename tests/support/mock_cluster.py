"""librdkafka's mock cluster, served by a child process.

The mock brokers live inside a librdkafka client, so they run in a child process: the test
process stays free of long-lived librdkafka threads, and tests that fork stay safe.

Run as ``python -m tests.support.mock_cluster N``, the module is that child: it prints
``{"brokers": {id: [host, port]}}`` as one JSON line, then answers one JSON request per
stdin line with one JSON line, until stdin closes.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from confluent_kafka import KafkaException, Producer

from tests.support.waiting import HANG_S

_REPO_ROOT = Path(__file__).resolve().parents[2]


class MockCluster:
    """A librdkafka mock cluster of ``num_brokers`` brokers on 127.0.0.1.

    Unknown topics are created, with 4 partitions and leaders picked at random among the
    brokers, by any Metadata request that names them (``ensure_topic`` does that).
    librdkafka's AdminClient cannot create topics here: its CreateTopics waits for a
    controller the mock never advertises.
    """

    def __init__(self, num_brokers: int = 3, *, start_timeout: float = HANG_S) -> None:
        self.num_brokers = num_brokers
        self.start_timeout = start_timeout
        self.brokers: dict[int, tuple[str, int]] = {}
        self._process: subprocess.Popen[str] | None = None
        self._log_file: IO[str] | None = None
        self._lock = threading.Lock()  # one request/reply exchange with the child at a time

    @property
    def bootstrap(self) -> str:
        """Comma-separated ``host:port`` of every broker, for ``bootstrap.servers``."""
        return ",".join(f"{host}:{port}" for host, port in self.brokers.values())

    def start(self) -> None:
        """Start the child process and wait for its broker list."""
        if self._process is not None:
            raise RuntimeError("mock cluster already started")
        # librdkafka logs to stderr; a temporary file (deleted on close) keeps it for errors.
        self._log_file = tempfile.TemporaryFile("w+", prefix="mock-cluster-")  # noqa: SIM115 (closed by stop())
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.mock_cluster", str(self.num_brokers)],
            cwd=_REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        try:
            reply = self._read_reply(self.start_timeout)
            self.brokers = {int(b): (host, port) for b, (host, port) in reply["brokers"].items()}
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Close the child's stdin so that it exits; terminate, then kill, if it does not."""
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None and process.stdout is not None
            with contextlib.suppress(BrokenPipeError):  # the child is gone already
                process.stdin.close()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.terminate()
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            process.stdout.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def ensure_topic(self, name: str, *, timeout: float = HANG_S) -> dict[int, int]:
        """Create ``name`` if needed; return its partition -> leader broker id."""
        reply = self._request({"op": "ensure_topic", "topic": name, "timeout": timeout}, timeout)
        return {int(partition): leader for partition, leader in reply["leaders"].items()}

    def topic_led_by_several(self, prefix: str, *, leaders: int = 2, tries: int = 10) -> tuple[str, dict[int, int]]:
        """A new topic whose partitions have at least ``leaders`` distinct leaders: its name and leaders.

        The mock picks each partition's leader at random, so a 4-partition topic has all its
        leaders on one of 3 brokers about one time in 27; the next name is tried then.
        """
        for attempt in range(tries):
            name = f"{prefix}-{attempt}"
            found = self.ensure_topic(name)
            if len(set(found.values())) >= leaders:
                return name, found
        raise RuntimeError(f"no topic with {leaders} distinct leaders in {tries} tries")

    def _request(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            if self._process is None:
                raise RuntimeError("mock cluster not started")
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            # The child gives itself `timeout`; allow some more for the round trip.
            return self._read_reply(timeout + 5.0)

    def _read_reply(self, timeout: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        # select() on the pipe is reliable here because the child writes whole lines and
        # never more than one before the next request, so nothing waits in Python's buffer.
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            state = "exited" if self._process.poll() is not None else f"silent for {timeout}s"
            raise RuntimeError(f"mock cluster child {state}; its log:\n{self._log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"mock cluster: {reply['error']}")
        return reply

    def _log_tail(self, lines: int = 40) -> str:
        if self._log_file is None:
            return ""
        self._log_file.seek(0)
        return "\n".join(self._log_file.read().splitlines()[-lines:])

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


def _serve(num_brokers: int) -> None:
    """The child: hold the mock cluster and answer requests until stdin closes."""
    holder = Producer({"test.mock.num.brokers": num_brokers, "bootstrap.servers": ""})
    cluster = holder.list_topics(timeout=HANG_S)
    _reply({"brokers": {b.id: [b.host, b.port] for b in cluster.brokers.values()}})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "ensure_topic":
            _reply(_leaders(holder, request["topic"], request["timeout"]))
        else:
            _reply({"error": f"unknown request {request!r}"})


def _leaders(holder: Producer, topic: str, timeout: float) -> dict[str, Any]:
    """Ask for ``topic``'s metadata (creating it) until every partition has a leader."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster = holder.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            problem = str(exc)
        else:
            metadata = cluster.topics.get(topic)
            if metadata is None:
                problem = "not in metadata"
            elif metadata.error is not None:
                problem = str(metadata.error)
            else:
                leaders = {p: m.leader for p, m in metadata.partitions.items()}
                if leaders and all(leader >= 0 for leader in leaders.values()):
                    return {"leaders": leaders}
                problem = f"partition leaders {leaders}"
        if time.monotonic() >= deadline:
            return {"error": f"topic {topic} not ready after {timeout}s: {problem}"}
        time.sleep(0.05)


def _reply(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
