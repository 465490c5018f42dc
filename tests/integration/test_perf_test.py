"""``kafka-sidecar perf-test`` against the real Tansu broker, through a daemon it starts or one already running.

What it produced is read back with the confluent-kafka verifier: the count, the value size and
the keys are the ones asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.tools.perf_test import Workload, run
from service.tools.readback import read_topic

# Kafka's kafka-producer-perf-test summary line.
SUMMARY = re.compile(
    r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, [\d.]+ ms max latency, "
    r"\d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.$")


def perf_test(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", "perf-test", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_perf_test_starts_a_daemon_sends_every_record_and_prints_kafkas_summary(broker, topic_factory, tmp_path):
    topic = topic_factory()
    out = tmp_path / "result.json"
    done = perf_test("--topic", topic, "--num-records", "3001", "--record-size", "100", "--processes", "2",
                     "--key-size", "16", "--key-count", "50", "--bootstrap-servers", broker.bootstrap,
                     "-X", "linger.ms=5", "-X", "compression.type=lz4", "--json", str(out))
    assert done.returncode == 0, done.stderr
    summary = SUMMARY.match(done.stdout.strip().splitlines()[-1])
    assert summary is not None, done.stdout
    assert int(summary.group(1)) == 3001

    result = json.loads(out.read_text())["result"]
    assert (result["records"], result["errors"], result["sent"]) == (3001, 0, 3001)
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_max_ms"]

    records = read_topic(broker.bootstrap, topic, expected=3001)
    assert len(records) == 3001
    assert {len(r.value) for r in records} == {100}
    keys = {r.key for r in records}
    # Each process draws 50 random keys of its own and cycles through them: 100 distinct, all 16 bytes.
    assert len(keys) == 100 and {len(k) for k in keys} == {16}


def test_perf_test_through_a_running_daemon_keeps_to_the_throughput(broker, topic_factory, sidecar, tmp_path):
    topic = topic_factory()
    daemon = sidecar(broker.bootstrap, settings={"linger.ms": 5})
    out = tmp_path / "result.json"
    done = perf_test("--topic", topic, "--num-records", "1500", "--record-size", "10", "--throughput", "1000",
                     "--endpoint", daemon.endpoint, "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())["result"]
    assert result["records"] == 1500
    # The throttle only ever slows a worker down: 1500 records at 1000/s cannot take less than ~1.5 s.
    assert result["records_per_s"] <= 1000 * 1.05
    assert len(read_topic(broker.bootstrap, topic, expected=1500)) == 1500


def test_perf_test_without_callbacks_sends_every_record_and_measures_no_latency(broker, topic_factory, tmp_path):
    topic = topic_factory()
    out = tmp_path / "result.json"
    done = perf_test("--topic", topic, "--num-records", "2000", "--record-size", "50", "--processes", "2",
                     "--throughput", "2000", "--no-callbacks", "--bootstrap-servers", broker.bootstrap,
                     "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("latency not measured (no delivery callbacks).")
    result = json.loads(out.read_text())["result"]
    assert (result["records"], result["errors"], result["latency_p99_ms"]) == (2000, 0, None)
    assert result["cpu_s"] > 0
    assert len(read_topic(broker.bootstrap, topic, expected=2000)) == 2000


def test_run_prints_a_progress_line_while_it_sends(broker, topic_factory, sidecar):
    topic = topic_factory()
    daemon = sidecar(broker.bootstrap)
    lines: list[str] = []
    result = run(Workload(topic, 2000, 50, processes=2, throughput=1000), options={"endpoint": daemon.endpoint},
                 progress_every_s=0.25, out=lines.append)
    assert result.records == 2000
    assert lines, "no progress line in a 2 s run with a line every 0.25 s"
    assert all(re.match(r"^\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                        r"[\d.]+ ms max latency\.$", line) for line in lines), lines


@pytest.mark.parametrize("args, problem", [
    (["--num-records", "0", "--record-size", "10"], "num_records must be at least 1"),
    (["--num-records", "10", "--record-size", "-1"], "record_size must be at least 0"),
    (["--num-records", "10", "--record-size", "10", "--processes", "0"], "processes must be at least 1"),
    (["--num-records", "10", "--record-size", "10", "--throughput", "0"], "throughput must be positive"),
])
def test_perf_test_refuses_a_workload_it_cannot_run(args: list[str], problem: str, tmp_path: Path):
    done = perf_test("--topic", "t", *args, "--endpoint", f"ipc://{tmp_path}/nobody.sock", timeout=60)
    assert done.returncode == 2
    assert problem in done.stderr


def test_perf_test_settings_need_a_daemon_of_its_own(tmp_path: Path):
    done = perf_test("--topic", "t", "--num-records", "10", "--record-size", "10", "-X", "linger.ms=5",
                     "--endpoint", f"ipc://{tmp_path}/nobody.sock", timeout=60)
    assert done.returncode == 2
    assert "-X settings go to the daemon" in done.stderr


def test_sigterm_stops_perf_test_and_the_daemon_it_started(broker, topic_factory):
    topic = topic_factory()
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "perf-test", "--topic", topic, "--num-records",
                                "100000000", "--record-size", "100", "--throughput", "1000", "--bootstrap-servers",
                                broker.bootstrap], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemons: list[int] = []
    try:
        # Sending: the daemon it started is up and the workers have begun (a progress line comes every 5 s).
        assert process.stdout is not None
        assert " records sent, " in process.stdout.readline()
        daemons = _children_running("service.cli", "run", parent=process.pid)
        assert len(daemons) == 1, daemons
        process.send_signal(signal.SIGTERM)
        assert process.wait(90) == 143
        outlived = [pid for pid in daemons if Path(f"/proc/{pid}").exists()]
        assert not outlived, "the daemon perf-test started outlived it"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _children_running(*words: str, parent: int) -> list[int]:
    """The pids of ``parent``'s children whose command line has ``words``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and all(word.encode() in command for word in words):
            found.append(int(stat.parent.name))
    return found
