"""``kafka-sidecar quickstart``: the whole path on one machine, with an embedded broker.

Starts the embedded Tansu broker and the sender daemon; several application
processes produce through the daemon with the client stub, then every record is
read back with librdkafka (an independent Kafka client) and compared with what
was sent. Then the example Spark pipeline (deploy/spark/flights_to_kafka.py)
runs in local mode through the same daemon, and every flight it published is
read back and checked against the dataset. Progress bars while it runs (on a
terminal), a summary table at the end. Everything listens on loopback and stops
at the end; the logs of the daemon and of the Spark job are printed only if
something failed. The exit code is non-zero if a record is missing, duplicated
or wrong, or a step failed.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from tqdm import tqdm

from client_stub import Producer
from client_stub.errors import KafkaError, SidecarUnavailableError
from client_stub.futures import RecordMetadata
from client_stub.partitioner import murmur2_partition

from ..stats import request_stats
from .embedded import EmbeddedBroker
from .readback import ConsumedRecord, ReadTimeout, broker_count, read_topic

# The example pipeline, in a clone of the repository.
SPARK_JOB = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "flights_to_kafka.py"
SPARK_MASTER = "local[2]"
SPARK_WORKERS = 2  # local[2]: two tasks at a time, each in a Python worker process of its own
SPARK_TIMEOUT = 600.0
FLIGHTS_TOPIC = "flights"
FLIGHTS_PARTITIONS = 6
DEMO_TOPIC = "quickstart"
# A producing process reports its deliveries to the parent's progress bar this many at a time.
PROGRESS_CHUNK = 1000
LOG_TAIL_LINES = 60
EXAMPLES = 3  # of each kind of problem a check finds, shown to the user


def local_spark_env() -> dict[str, str]:
    """The environment of a local-mode Spark driver on loopback only, whose workers run this interpreter.

    Spark binds to the address its host name resolves to, else to an interface's, and serves a web
    UI; its Python workers run PYSPARK_PYTHON, which must import this project.
    """
    confs = ["spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1", "spark.ui.enabled=false",
             "spark.ui.showConsoleProgress=false"]
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": " ".join(f"--conf {conf}" for conf in confs) + " pyspark-shell"}


# -- checking what was read back ---------------------------------------------------------------------


@dataclass
class Check:
    """What reading a topic back found, against what it should hold."""

    expected: int
    read: int = 0
    payload_bytes: int = 0  # keys, values and headers of the records read
    missing: int = 0
    duplicated: int = 0
    wrong: int = 0
    examples: list[str] = field(default_factory=list)  # a few of the problems, for the user to see

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.wrong)


def _payload_bytes(record: ConsumedRecord) -> int:
    return (len(record.key or b"") + len(record.value or b"")
            + sum(len(name) + len(value or b"") for name, value in record.headers))


def compare(records: Iterable[ConsumedRecord], expected: Mapping[Hashable, dict[str, Any]],
            identify: Callable[[ConsumedRecord], tuple[Hashable, dict[str, Any]]], what: str) -> Check:
    """Compare the records read with ``expected`` (each record's fields by its id).

    ``identify`` gives a record's id (None when it names no record) and its fields as read, in the
    form ``expected`` has them (the same keys). Each expected id must be read once, with those fields; ``what``
    names a record in the examples ("flight", "record").
    """
    check = Check(len(expected))
    seen: Counter[Hashable] = Counter()
    wrong: list[str] = []  # the first few
    for record in records:
        check.read += 1
        check.payload_bytes += _payload_bytes(record)
        record_id, actual = identify(record)
        wanted = expected.get(record_id) if record_id is not None else None
        if wanted is not None:
            seen[record_id] += 1
            if actual == wanted:
                continue
        check.wrong += 1
        if len(wrong) < EXAMPLES:
            where = f"partition {record.partition} offset {record.offset}"
            if wanted is None:
                wrong.append(f"{where}: not a {what} that was sent: {actual}")
            else:
                wrong.append(f"{where}: {what} {record_id}: " + "; ".join(
                    f"{name} {actual.get(name)!r}, expected {value!r}"
                    for name, value in wanted.items() if actual.get(name) != value))
    missing = [record_id for record_id in expected if record_id not in seen]
    duplicated = [record_id for record_id, count in seen.items() if count > 1]
    check.missing = len(missing)
    check.duplicated = sum(seen[record_id] - 1 for record_id in duplicated)
    check.examples = ([f"missing: {what} {record_id}" for record_id in missing[:EXAMPLES]]
                      + [f"duplicated: {what} {record_id} ({seen[record_id]} times)"
                         for record_id in duplicated[:EXAMPLES]]
                      + [f"wrong: {line}" for line in wrong])
    return check


def _progress_bar(total: int, desc: str) -> tqdm:
    """A bar of records on stderr; none when stderr is not a terminal (a log, a test's capture)."""
    return tqdm(total=total, desc=desc, unit=" records", unit_scale=True, disable=None, dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:,}/{total:,} [{elapsed}<{remaining}, {rate_fmt}]"
                           "{postfix}")


def _spinner(desc: str, doing: str) -> tqdm:
    """The time that passes while something happens that has no count to show (as _progress_bar, on stderr)."""
    return tqdm(desc=desc, bar_format=f"{{desc}}: {doing} [{{elapsed}}]", disable=None)


def _read_back(bootstrap: str, topic: str, expected: int, timeout: float) -> list[ConsumedRecord]:
    """Every record of ``topic``, with a bar; what was read by ``timeout`` if fewer than ``expected`` came."""
    with _progress_bar(expected, "reading back") as bar:
        try:
            return read_topic(bootstrap, topic, expected=expected, timeout=timeout, progress=bar.update)
        except ReadTimeout as exc:
            return exc.records  # fewer than expected: the check says which are missing


# -- the demo: application processes producing through the daemon --------------------------------------

_DEMO_VALUE = re.compile(rb"worker (\d+) record (\d+) ")
DEMO_VALUE_SIZE = 100


def demo_record(worker: int, n: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Record ``n`` of process ``worker``: key, value and headers (the check derives them again from the two)."""
    value = f"worker {worker} record {n} ".encode().ljust(DEMO_VALUE_SIZE, b".")
    return f"user-{n % 1000}".encode(), value, [("worker", str(worker).encode()), ("source", b"quickstart")]


class DemoRecords(Mapping[tuple[int, int], dict[str, Any]]):
    """What the demo's topic should hold: record (worker, n)'s fields, derived on demand.

    The partition is the one Java's default partitioner picks for the key (murmur2), not the one
    the delivery report named: derived from the key alone, it checks the client's partitioner as
    well as the daemon, and keeps keyed records where JVM producers would put them.
    """

    def __init__(self, processes: int, records: int, partitions: int) -> None:
        self.processes = processes
        self.records = records
        self.partitions = partitions

    def __getitem__(self, record_id: tuple[int, int]) -> dict[str, Any]:
        worker, n = record_id
        if not (0 <= worker < self.processes and 0 <= n < self.records):
            raise KeyError(record_id)
        key, value, headers = demo_record(worker, n)
        return {"key": key, "value": value, "headers": headers, "partition": murmur2_partition(key, self.partitions)}

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((worker, n) for worker in range(self.processes) for n in range(self.records))

    def __len__(self) -> int:
        return self.processes * self.records


def _identify_demo(record: ConsumedRecord) -> tuple[tuple[int, int] | None, dict[str, Any]]:
    actual = {"key": record.key, "value": record.value, "headers": record.headers, "partition": record.partition}
    match = _DEMO_VALUE.match(record.value or b"")
    return (int(match[1]), int(match[2])) if match else None, actual


def check_demo(read: Iterable[ConsumedRecord], processes: int, records: int, partitions: int) -> Check:
    """Check that the records ``read`` from the demo's topic are each record of each process, once, as sent."""
    return compare(read, DemoRecords(processes, records, partitions), _identify_demo, "record")


@dataclass
class WorkerReport:
    """What one producing process saw: its delivery reports, and when."""

    worker: int
    delivered: int
    delivered_bytes: int  # keys, values and headers
    errors: dict[str, int]
    first_send_ns: int  # when the first send() returned, in time.monotonic_ns(): one clock for every process
    last_report_ns: int
    latencies_ns: array  # send() to delivery report, of each delivered record


def produce_demo(endpoint: str, topic: str, worker: int, records: int,
                 progress: Callable[[int], None] = lambda count: None) -> WorkerReport:
    """Send ``records`` demo records of process ``worker`` through the daemon and wait for their reports.

    Every record's latency, from send() to its delivery report, is measured by its delivery
    callback (on the producer's I/O thread); ``progress`` gets the count of reports, PROGRESS_CHUNK
    at a time and the rest at the end.
    """
    sent_ns = array("q", bytes(8 * records))
    latencies = array("q")
    errors: Counter[str] = Counter()
    header_bytes = sum(len(name) + len(value) for name, value in demo_record(worker, 0)[2])
    delivered = delivered_bytes = reports = last_report_ns = 0

    def on_delivery(n: int, error: KafkaError | None, metadata: RecordMetadata | None) -> None:
        nonlocal delivered, delivered_bytes, reports, last_report_ns
        last_report_ns = time.monotonic_ns()
        if error is None and metadata is not None:
            latencies.append(last_report_ns - sent_ns[n])
            delivered += 1
            delivered_bytes += metadata.serialized_key_size + metadata.serialized_value_size + header_bytes
        else:
            errors[type(error).__name__] += 1
        reports += 1
        if reports % PROGRESS_CHUNK == 0:
            progress(PROGRESS_CHUNK)

    first_send_ns = 0
    # Closing the producer waits for every record's report (a record it gives up on is reported as
    # failed) and for the callbacks, which run on its I/O thread.
    with Producer(endpoint) as producer:
        for n in range(records):
            key, value, headers = demo_record(worker, n)
            sent_ns[n] = time.monotonic_ns()
            producer.send(topic, value, key=key, headers=headers, on_delivery=partial(on_delivery, n))
            # The first send() waits for the daemon's welcome and the topic's metadata: setting up, not sending.
            first_send_ns = first_send_ns or time.monotonic_ns()
    if reports % PROGRESS_CHUNK:
        progress(reports % PROGRESS_CHUNK)
    return WorkerReport(worker, delivered, delivered_bytes, dict(errors), first_send_ns, last_report_ns, latencies)


def _producing_process(endpoint: str, topic: str, worker: int, records: int,
                       messages: multiprocessing.Queue) -> None:
    """The body of an application process: its progress and its report (or what went wrong) to the parent."""
    try:
        report = produce_demo(endpoint, topic, worker, records, lambda count: messages.put(("progress", count)))
    except Exception as exc:
        messages.put(("failed", worker, f"{type(exc).__name__}: {exc}"))
    else:
        messages.put(("report", report))


@dataclass
class DemoRun:
    """The demo's results, from its processes' reports."""

    processes: int
    records: int
    reports: list[WorkerReport]
    failures: list[str]  # processes that ended without a report

    @property
    def delivered(self) -> int:
        return sum(r.delivered for r in self.reports)

    @property
    def errors(self) -> Counter[str]:
        return sum((Counter(r.errors) for r in self.reports), Counter())

    @property
    def seconds(self) -> float:
        """From the first send() of any process (once it returned) to the last delivery report of any."""
        if not self.reports:
            return 0.0
        return (max(r.last_report_ns for r in self.reports) - min(r.first_send_ns for r in self.reports)) / 1e9

    @property
    def delivered_bytes(self) -> int:
        return sum(r.delivered_bytes for r in self.reports)

    def latency_ms(self) -> tuple[float, float] | None:
        """The 50th and 99th percentiles of the records' delivery latency, in milliseconds."""
        latencies = [ns for r in self.reports for ns in r.latencies_ns]
        if len(latencies) < 2:
            return None
        percentiles = statistics.quantiles(latencies, n=100)
        return percentiles[49] / 1e6, percentiles[98] / 1e6


def _run_demo(endpoint: str, topic: str, processes: int, records: int) -> DemoRun:
    """Run the producing processes (spawned: new interpreters, as application processes are) to their end."""
    context = multiprocessing.get_context("spawn")
    messages: multiprocessing.Queue = context.Queue()
    workers = {w: context.Process(target=_producing_process, args=(endpoint, topic, w, records, messages))
               for w in range(processes)}
    for process in workers.values():
        process.start()
    run = DemoRun(processes, records, [], [])
    pending = set(workers)
    with _progress_bar(processes * records, "sending") as bar:
        while pending:
            try:
                kind, *payload = messages.get(timeout=1)
            except queue.Empty:
                # A process puts its last message before it exits: one gone, with nothing left to read, sent none.
                for worker in [w for w in pending if workers[w].exitcode is not None]:
                    run.failures.append(f"process {worker} exited with code {workers[worker].exitcode} "
                                        "without a report")
                    pending.discard(worker)
                continue
            if kind == "progress":
                bar.update(payload[0])
            elif kind == "report":
                run.reports.append(payload[0])
                pending.discard(payload[0].worker)
            else:
                worker, problem = payload
                run.failures.append(f"process {worker} failed: {problem}")
                pending.discard(worker)
    for process in workers.values():
        process.join()
    return run


# -- the Spark pipeline ---------------------------------------------------------------------------------------


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flights_to_kafka", SPARK_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_flights(dataset: Path) -> dict[str, dict[str, Any]]:
    """Each completed flight's record by its id, derived from the dataset with pandas (not with the job's code)."""
    import pandas as pd

    flights = pd.read_csv(dataset)
    flights = flights[flights.dep_time.notna() & flights.arr_delay.notna()]
    # Whole columns at once (a pandas call per row took seconds); columns with gaps are read as floats.
    scheduled_ms = pd.to_datetime(flights.time_hour).astype("int64") // 1_000_000 + flights.minute * 60_000
    derived = [flights.dep_delay.astype(int), flights.arr_delay.astype(int),
               (flights.dep_delay - flights.arr_delay).astype(int), flights.air_time.astype(int),
               (flights.distance * 60 / flights.air_time).astype(int), scheduled_ms]
    columns = [flights[name] for name in ("year", "month", "day", "carrier", "flight", "tailnum", "origin", "dest",
                                          "distance", "sched_dep_time")]
    expected = {}
    for (year, month, day, carrier, flight, tailnum, origin, dest, distance, sched_dep_time, dep_delay, arr_delay,
         delay_gained, air_time, speed_mph, timestamp_ms) in zip(*(c.tolist() for c in columns + derived),
                                                                 strict=True):
        flight_id = f"{year:04d}-{month:02d}-{day:02d}-{carrier}{flight}-{origin}-{sched_dep_time:04d}"
        value = {"flight_id": flight_id, "carrier": carrier, "flight": flight, "tailnum": tailnum, "origin": origin,
                 "dest": dest, "dep_delay": dep_delay, "arr_delay": arr_delay, "delay_gained": delay_gained,
                 "distance": distance, "air_time": air_time, "speed_mph": speed_mph}
        key = tailnum.encode()
        expected[flight_id] = {"key": key, "value": value, "timestamp_ms": timestamp_ms,
                               "partition": murmur2_partition(key, FLIGHTS_PARTITIONS),
                               "headers": [("origin", origin.encode()), ("carrier", carrier.encode())]}
    return expected


def _identify_flight(record: ConsumedRecord) -> tuple[str | None, dict[str, Any]]:
    try:
        value = json.loads((record.value or b"null").decode())
    except ValueError:  # UnicodeDecodeError included
        value = record.value
    flight_id = value.get("flight_id") if isinstance(value, dict) else None
    return flight_id, {"key": record.key, "value": value, "timestamp_ms": record.timestamp_ms,
                       "partition": record.partition, "headers": record.headers}


def check_flights(read: Iterable[ConsumedRecord], expected: dict[str, dict[str, Any]] | None = None) -> Check:
    """Check that the records ``read`` from the pipeline's topic are each completed flight, once, as it should be.

    ``expected`` is what ``_expected_flights`` derives from the dataset (derived here if not given).
    """
    if expected is None:
        expected = _expected_flights(_load_job().dataset_path())
    return compare(read, expected, _identify_flight, "flight")


@dataclass
class PipelineRun:
    """The Spark job's outcome, and when it wrote."""

    exit_code: int | None  # None: stopped at SPARK_TIMEOUT
    writing_seconds: float  # from the first record the daemon sent for the job to the last, as seen every 0.5 s


def _records_sent(endpoint: str, topic: str) -> int | None:
    """How many records of ``topic`` the daemon has sent to the brokers; None if it did not answer."""
    try:
        metrics = request_stats(endpoint, timeout=2.0)
    except SidecarUnavailableError:
        return None
    return int(metrics["topics"].get(topic, {}).get("record-send-total", 0))


def _run_pipeline(endpoint: str, total: int, log_path: Path) -> PipelineRun:
    """Run the Spark job to its end, its output to ``log_path``.

    While Spark starts, and again while it stops, the time that passes; in between, a bar of the
    records the daemon has sent for the job (the daemon's metrics: exact and at once, where the
    broker's end offsets would lag by a batch).
    """
    deadline = time.monotonic() + SPARK_TIMEOUT
    sent = 0
    first = last = 0.0
    with log_path.open("wb") as log:
        job = subprocess.Popen([sys.executable, str(SPARK_JOB), "--master", SPARK_MASTER, "--topic", FLIGHTS_TOPIC,
                                "--endpoint", endpoint], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env={**os.environ, **local_spark_env()})
    bar = _spinner("Spark job", "Spark starts, loads the dataset")
    try:
        while True:
            ended = job.poll() is not None
            count = _records_sent(endpoint, FLIGHTS_TOPIC) or sent
            if count > sent and sent < total:
                last = time.monotonic()
                if not first:
                    first = last
                    bar.close()
                    bar = _progress_bar(total, "Spark job")
                bar.update(min(count, total) - sent)
                if count >= total:
                    bar.close()
                    bar = _spinner("Spark job", "every flight sent, Spark stops")
            else:
                bar.refresh()  # the elapsed time moves on: the job is alive
            sent = max(sent, count)
            if ended:
                return PipelineRun(job.returncode, last - first)
            if time.monotonic() > deadline:
                job.kill()
                job.wait()
                return PipelineRun(None, last - first)
            time.sleep(0.5)
    finally:
        bar.close()


# -- the summary ---------------------------------------------------------------------------------------------


def _rate(count: float, seconds: float, unit: str, digits: int = 0) -> str:
    return f"{count / seconds:,.{digits}f} {unit}" if seconds > 0 else "-"


def _table(rows: list[list[str]]) -> str:
    """Plain text columns, the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join([row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:],
                                                                                               strict=True)])
                     for row in rows)


def _summary(outcome: Outcome, partitions: int) -> str:
    """What a user reads at the end: a column for the demo, one for the pipeline if it ran."""
    demo, brokers = outcome.demo, outcome.brokers
    processes, records = demo.processes, demo.records

    def problems(check: Check) -> str:
        return f"{check.missing} / {check.duplicated} / {check.wrong}"

    def held(count: int | None) -> str:
        return "?" if count is None else str(count)

    latency = demo.latency_ms()
    rows = [["", f"demo ({processes} processes)"],
            ["records sent", f"{processes * records:,}"],
            ["records delivered (reports)", f"{demo.delivered:,}"],
            ["records read back", f"{outcome.demo_check.read:,}"],
            ["missing / duplicated / wrong", problems(outcome.demo_check)],
            ["partitions", str(partitions)],
            ["throughput", f"{_rate(demo.delivered, demo.seconds, 'records/s')}, "
                           f"{_rate(demo.delivered_bytes / 1e6, demo.seconds, 'MB/s', 1)}"],
            ["delivery latency p50 / p99", "-" if latency is None else f"{latency[0]:.1f} ms / {latency[1]:.1f} ms"],
            ["broker connections of the daemon", held(outcome.connections[0])],
            ["  with a producer in each process", f"{processes} x {brokers} = {processes * brokers}"]]
    pipeline, flights = outcome.pipeline, outcome.flights_check
    if pipeline is not None and flights is not None:
        succeeded = pipeline.exit_code == 0
        column = [f"Spark pipeline ({SPARK_MASTER})", f"{flights.expected:,}" if succeeded else "job failed",
                  "all (job succeeded)" if succeeded else "-", f"{flights.read:,}", problems(flights),
                  str(FLIGHTS_PARTITIONS),
                  f"{_rate(flights.read, pipeline.writing_seconds, 'records/s')}, "
                  f"{_rate(flights.payload_bytes / 1e6, pipeline.writing_seconds, 'MB/s', 1)}",
                  "not measured", held(outcome.connections[1]),
                  f"{SPARK_WORKERS} x {brokers} = {SPARK_WORKERS * brokers}"]
        for row, cell in zip(rows, column, strict=True):
            row.append(cell)
    notes = ["throughput: records, and their keys, values and headers, a second from the first record handed off "
             "to the last delivery report" + ("; Spark's while the daemon sent them" if pipeline is not None else ""),
             "delivery latency: each record's, from send() to its delivery report, with the processes sending as "
             "fast as they can",
             f"broker connections: the daemon's, to the {brokers} broker(s) of this cluster, however many processes "
             "send; a producer in each process would hold its own"]
    return _table(rows) + "\n\n" + "\n".join(notes)


# -- the whole run ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """Everything the quickstart found; ``failed`` says what went wrong, empty if nothing did."""

    brokers: int
    demo: DemoRun
    demo_check: Check
    connections: list[int | None]  # the daemon's broker connections after the demo (and after the pipeline)
    pipeline: PipelineRun | None = None
    flights_check: Check | None = None
    failed: list[str] = field(default_factory=list)


def run(processes: int = 4, records: int = 25_000, partitions: int = 6, spark: bool = True) -> int:
    """The quickstart; 0 if every record arrived as sent, 1 if not or if a step failed, 2 for bad arguments."""
    if processes < 1 or records < 1:
        print("kafka-sidecar quickstart: --processes and --records take a number of at least 1", file=sys.stderr)
        return 2
    if spark and not SPARK_JOB.exists():
        print(f"the example Spark pipeline is not here ({SPARK_JOB}): run the quickstart from a clone of the "
              "repository, or with --skip-spark", file=sys.stderr)
        return 1
    # The daemon's log and the Spark job's output go here: shown, and kept, only if something fails.
    workdir = Path(tempfile.mkdtemp(prefix="kafka-sidecar-quickstart-"))
    daemon_log, job_log = workdir / "daemon.log", workdir / "spark-job.log"
    try:
        outcome = _run(workdir, daemon_log, job_log, processes, records, partitions, spark)
    except Exception:
        print(f"\nthe quickstart stopped on an error (below); the daemon's log (the end of {daemon_log}):\n"
              f"{_tail(daemon_log)}\n(logs kept in {workdir})", flush=True)
        raise
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    print("\n" + _summary(outcome, partitions))
    if not outcome.failed:
        shutil.rmtree(workdir, ignore_errors=True)
        total = outcome.demo_check.read + (outcome.flights_check.read if outcome.flights_check is not None else 0)
        print(f"\nok: all {total:,} records read back as they were sent")
        return 0
    if outcome.pipeline is not None and outcome.pipeline.exit_code != 0:
        print(f"\nthe Spark job's output (the end of {job_log}):\n{_tail(job_log)}")
    print(f"\nthe daemon's log (the end of {daemon_log}):\n{_tail(daemon_log)}")
    print("\nFAILED: " + "; ".join(outcome.failed) + f" (logs kept in {workdir})")
    return 1


def _run(workdir: Path, daemon_log: Path, job_log: Path, processes: int, records: int, partitions: int,
         spark: bool) -> Outcome:
    """Broker, daemon, the demo and (if ``spark``) the pipeline; everything stopped at the end."""
    endpoint = f"ipc://{workdir}/sidecar.sock"
    with EmbeddedBroker() as broker:
        broker.create_topic(DEMO_TOPIC, partitions)
        print(f"an embedded Kafka broker (Tansu, in memory) at {broker.bootstrap} and the kafka-sidecar daemon at "
              f"{endpoint}: everything on loopback", flush=True)
        with daemon_log.open("wb") as log:
            daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--bootstrap-servers",
                                       broker.bootstrap, "--endpoint", endpoint],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            outcome = _stages(broker, endpoint, job_log, processes, records, partitions, spark)
        finally:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    if daemon.returncode != 0:
        outcome.failed.append(f"the daemon exited with code {daemon.returncode}")
    return outcome


def _stages(broker: EmbeddedBroker, endpoint: str, job_log: Path, processes: int, records: int, partitions: int,
            spark: bool) -> Outcome:
    print(f"\n{processes} application processes send {records:,} records each to topic {DEMO_TOPIC} "
          f"({partitions} partitions) through the daemon; then librdkafka reads them back", flush=True)
    demo = _run_demo(endpoint, DEMO_TOPIC, processes, records)
    connections = [_connections(endpoint)]
    # Waits for the records the delivery reports acknowledged: a failed one would only make it wait longer.
    read = _read_back(broker.bootstrap, DEMO_TOPIC, demo.delivered, 60.0)
    demo_check = check_demo(read, processes, records, partitions)
    _print_examples(demo_check)
    outcome = Outcome(broker_count(broker.bootstrap), demo, demo_check, connections, failed=list(demo.failures))
    if demo.errors:
        outcome.failed.append(f"delivery errors in the demo: {demo.errors}")
    if not demo_check.ok:
        outcome.failed.append("the demo's topic does not hold every record as it was sent")
    if spark:
        broker.create_topic(FLIGHTS_TOPIC, FLIGHTS_PARTITIONS)
        expected = _expected_flights(_load_job().dataset_path())
        print(f"\nthe Spark pipeline ({SPARK_JOB.relative_to(SPARK_JOB.parents[2])}, {SPARK_MASTER}) publishes "
              f"the {len(expected):,} completed flights of 2013 from New York to topic {FLIGHTS_TOPIC} through the "
              "daemon; then librdkafka reads them back", flush=True)
        pipeline = outcome.pipeline = _run_pipeline(endpoint, len(expected), job_log)
        connections.append(_connections(endpoint))
        # A failed job leaves no reason to wait long for flights that will not come.
        read = _read_back(broker.bootstrap, FLIGHTS_TOPIC, len(expected), 120.0 if pipeline.exit_code == 0 else 10.0)
        check = outcome.flights_check = check_flights(read, expected)
        _print_examples(check)
        if pipeline.exit_code is None:
            outcome.failed.append(f"the Spark job did not end within {SPARK_TIMEOUT:.0f} s")
        elif pipeline.exit_code != 0:
            outcome.failed.append(f"the Spark job failed (exit code {pipeline.exit_code})")
        if not check.ok:
            outcome.failed.append("the flights' topic does not hold every completed flight as it should")
    if None in connections:
        outcome.failed.append("the daemon did not give its metrics")
    return outcome


def _connections(endpoint: str) -> int | None:
    """The daemon's open broker connections (its producer's connection-count); None if it does not answer."""
    try:
        return int(request_stats(endpoint)["producer"]["connection-count"])
    except SidecarUnavailableError as exc:
        print(f"  the daemon did not give its metrics: {exc}")
        return None


def _print_examples(check: Check) -> None:
    for line in check.examples:
        print(f"  {line}")


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
