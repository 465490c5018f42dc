"""The README's quickstart: the multi-process demo and the Spark pipeline, each record read back and checked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from client_stub import Producer
from client_stub.partitioner import murmur2_partition
from service.tools.quickstart import check_demo, check_flights, demo_record, produce_demo
from service.tools.readback import read_topic

ROOT = Path(__file__).parents[2]


def quickstart(*args: str) -> subprocess.CompletedProcess[str]:
    """``kafka-sidecar --log-level WARNING quickstart ARGS``, as deploy/quickstart.sh runs it, output captured."""
    return subprocess.run([sys.executable, "-m", "service.cli", "--log-level", "WARNING", "quickstart", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def summary(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows: each row's label and its cells (columns are two spaces apart or more; the
    heading row is keyed by its first column's heading)."""
    rows = {}
    for line in stdout.splitlines():
        label, *cells = re.split(r" {2,}", line.strip())
        if cells:
            rows[label] = cells
    return rows


def test_the_quickstart_without_spark_reads_back_every_record_and_sums_up() -> None:
    done = quickstart("--skip-spark", "--processes", "3", "--records", "1000")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Nothing but its own output: no daemon log, and no bars either (stderr is not a terminal here).
    assert done.stderr == ""
    rows = summary(done.stdout)
    assert rows["records sent"] == rows["records delivered (reports)"] == rows["records read back"] == ["3,000"]
    assert rows["missing / duplicated / wrong"] == ["0 / 0 / 0"]
    assert rows["partitions"] == ["6"]
    assert re.fullmatch(r"[\d,]+ records/s, [\d.]+ MB/s", rows["throughput"][0])
    assert re.fullmatch(r"[\d.]+ ms / [\d.]+ ms", rows["delivery latency p50 / p99"][0])
    # One broker: the daemon holds one connection for the three processes, which would hold three.
    assert rows["broker connections of the daemon"] == ["1"]
    assert rows["with a producer in each process"] == ["3 x 1 = 3"]
    assert "ok: all 3,000 records read back as they were sent" in done.stdout
    assert "daemon's log" not in done.stdout


@pytest.mark.spark
def test_the_quickstart_runs_the_demo_and_the_pipeline_and_finds_every_flight() -> None:
    pytest.importorskip("pyspark")
    done = quickstart("--processes", "2", "--records", "2000")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Spark's log4j lines and warnings go to the job's log, shown only if it fails.
    assert done.stderr == ""
    rows = summary(done.stdout)
    assert rows["demo (2 processes)"] == ["Spark pipeline (local[2])"]
    assert rows["records sent"] == rows["records read back"] == ["4,000", "327,346"]
    assert rows["missing / duplicated / wrong"] == ["0 / 0 / 0", "0 / 0 / 0"]
    assert rows["partitions"] == ["6", "6"]
    assert rows["broker connections of the daemon"] == ["1", "1"]
    assert rows["with a producer in each process"] == ["2 x 1 = 2", "2 x 1 = 2"]
    assert "ok: all 331,346 records read back as they were sent" in done.stdout


def test_a_producing_process_reports_its_progress_and_every_delivery(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    progress: list[int] = []

    report = produce_demo(daemon.endpoint, topic, 1, 2500, progress.append)

    assert progress == [1000, 1000, 500]  # in chunks, not a message a record
    assert (report.worker, report.delivered, report.errors, len(report.latencies_ns)) == (1, 2500, {}, 2500)
    read_progress: list[int] = []
    read = read_topic(broker.bootstrap, topic, progress=read_progress.append)
    assert sum(read_progress) == len(read) == 2500
    # Worker 1 of a run with two processes: worker 0's records are missing, worker 1's are all there as sent.
    check = check_demo(read, 2, 2500, 3)
    assert (check.read, check.missing, check.duplicated, check.wrong) == (2500, 2500, 0, 0)
    assert report.delivered_bytes == check.payload_bytes


def test_the_demo_check_finds_missing_duplicated_and_wrong_records(broker, topic_factory, sidecar) -> None:
    partitions = 3
    topic = topic_factory(partitions)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        for worker in range(2):
            for n in range(20):
                key, value, headers = demo_record(worker, n)
                if (worker, n) == (0, 7):
                    continue  # missing
                if (worker, n) == (0, 3):
                    value = value.replace(b"....", b"oops", 1)
                if (worker, n) == (1, 5):
                    # Another partition than murmur2 of its key gives, and no headers.
                    producer.send(topic, value, key=key,
                                  partition=(murmur2_partition(key, partitions) + 1) % partitions)
                    continue
                producer.send(topic, value, key=key, headers=headers)
        key, value, headers = demo_record(1, 4)
        producer.send(topic, value, key=key, headers=headers)  # a second time: duplicated
        producer.send(topic, b"hello", key=b"user-1")  # not one of the demo's records
        assert producer.flush(30) == 0

    check = check_demo(read_topic(broker.bootstrap, topic), 2, 20, partitions)

    assert not check.ok
    assert (check.expected, check.read, check.missing, check.duplicated, check.wrong) == (40, 41, 1, 1, 3)
    examples = "\n".join(check.examples)
    assert "missing: record (0, 7)" in examples
    assert "duplicated: record (1, 4) (2 times)" in examples
    assert re.search(r"wrong: partition \d offset \d+: record \(0, 3\): value b'worker 0 record 3 oops", examples)
    assert re.search(r"wrong: partition \d offset \d+: record \(1, 5\): headers \[\], expected "
                     r"\[\('worker', b'1'\), \('source', b'quickstart'\)\]; partition \d, expected \d", examples)
    assert re.search(r"wrong: partition \d offset \d+: not a record that was sent: .*b'hello'", examples)


def test_the_flights_check_fails_when_a_flight_is_missing_or_wrong(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(6)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, json.dumps({"flight_id": "2013-01-01-UA1545-EWR-0515"}).encode(), key=b"N14228")
        assert producer.flush(30) == 0

    check = check_flights(read_topic(broker.bootstrap, topic))

    # One record, and it is not the flight it names (no timestamp, headers nor full value).
    assert not check.ok
    assert (check.expected, check.read, check.missing, check.duplicated, check.wrong) == (327346, 1, 327345, 0, 1)
    [wrong] = [line for line in check.examples if line.startswith("wrong")]
    assert re.match(r"wrong: partition \d offset 0: flight 2013-01-01-UA1545-EWR-0515: value", wrong)
