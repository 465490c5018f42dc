"""``kafka-sidecar quickstart``: the whole path on one machine, with an embedded broker.

Starts the embedded Tansu broker, creates a topic, starts the sender daemon,
runs several application processes that produce through it with the client
stub, and prints what arrived where. Then runs the example Spark pipeline
(deploy/spark/flights_to_kafka.py) in local mode through the same daemon, reads
every record it published back with librdkafka and checks each one against the
dataset. Everything listens on loopback and stops at the end; the exit code is
non-zero if a record is missing or wrong.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from client_stub import Producer
from client_stub.partitioner import murmur2_partition

from .embedded import EmbeddedBroker

# The example pipeline, in a clone of the repository.
SPARK_JOB = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "flights_to_kafka.py"
FLIGHTS_TOPIC = "flights"
FLIGHTS_PARTITIONS = 6


def local_spark_env() -> dict[str, str]:
    """The environment of a local-mode Spark driver on loopback only, whose workers run this interpreter.

    Spark binds to the address its host name resolves to, else to an interface's, and serves a web
    UI; its Python workers run PYSPARK_PYTHON, which must import this project.
    """
    confs = ["spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1", "spark.ui.enabled=false",
             "spark.ui.showConsoleProgress=false"]
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": " ".join(f"--conf {conf}" for conf in confs) + " pyspark-shell"}


def _produce(endpoint: str, topic: str, worker: int, records: int, results: multiprocessing.Queue) -> None:
    started = time.monotonic()
    with Producer(endpoint) as producer:
        futures = [producer.send(topic, f"worker {worker} record {n}".encode(), key=f"user-{n % 100}".encode(),
                                 headers={"worker": str(worker)}) for n in range(records)]
        undelivered = producer.flush(60)
        partitions = Counter(f.result().partition for f in futures if not f.exception())
        errors = Counter(type(f.exception()).__name__ for f in futures if f.exception())
    results.put((worker, time.monotonic() - started, undelivered, dict(partitions), dict(errors)))


def run(processes: int = 4, records: int = 25_000, partitions: int = 6, spark: bool = True) -> int:
    topic = "quickstart"
    print("starting the embedded broker (Tansu, in memory, loopback) ...", flush=True)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="kafka-sidecar-") as workdir:
        broker.create_topic(topic, partitions)
        endpoint = f"ipc://{workdir}/sidecar.sock"
        log_path = Path(workdir) / "daemon.log"
        print(f"broker at {broker.bootstrap}; starting the sender daemon at {endpoint} ...", flush=True)
        with log_path.open("wb") as log:
            daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--bootstrap-servers",
                                       broker.bootstrap, "--endpoint", endpoint], stdout=log, stderr=log)
            try:
                failed = _run_workers(endpoint, topic, processes, records)
                if spark:
                    failed |= _run_pipeline(broker, endpoint)
                return failed
            finally:
                daemon.terminate()
                daemon.wait(30)
                print(f"daemon stopped (exit code {daemon.returncode}); its log:\n{log_path.read_text()}")


def _run_workers(endpoint: str, topic: str, processes: int, records: int) -> int:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    print(f"{processes} application processes send {records} records each through the daemon ...", flush=True)
    started = time.monotonic()
    workers = [context.Process(target=_produce, args=(endpoint, topic, w, records, results))
               for w in range(processes)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    total = Counter[int]()
    failed = 0
    for worker, seconds, undelivered, partitions, errors in sorted(outcomes):
        total.update(partitions)
        failed += undelivered + sum(errors.values())
        print(f"  worker {worker}: {sum(partitions.values())} delivered in {seconds:.1f}s, errors {errors or 'none'}")
    delivered = sum(total.values())
    print(f"delivered {delivered} of {processes * records} records in {elapsed:.1f}s "
          f"({delivered / elapsed:,.0f} records/s); per partition: {dict(sorted(total.items()))}")
    return 0 if failed == 0 and delivered == processes * records else 1


def _run_pipeline(broker: EmbeddedBroker, endpoint: str) -> int:
    if not SPARK_JOB.exists():
        print(f"the example Spark pipeline is not here ({SPARK_JOB}): run the quickstart from a clone")
        return 1
    broker.create_topic(FLIGHTS_TOPIC, FLIGHTS_PARTITIONS)
    print(f"the Spark pipeline ({SPARK_JOB.name}, local[2]) publishes the 2013 NYC flights through the daemon ...",
          flush=True)
    started = time.monotonic()
    job = subprocess.run([sys.executable, str(SPARK_JOB), "--master", "local[2]", "--topic", FLIGHTS_TOPIC,
                          "--endpoint", endpoint], env={**os.environ, **local_spark_env()}, check=False)
    if job.returncode != 0:
        print(f"the Spark job failed (exit code {job.returncode})")
        return 1
    print(f"  the job ran in {time.monotonic() - started:.1f}s; reading the topic back with librdkafka ...", flush=True)
    return check_flights(broker.bootstrap, FLIGHTS_TOPIC)


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flights_to_kafka", SPARK_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_flights(dataset: Path) -> dict[str, dict[str, Any]]:
    """Each completed flight's record, derived from the dataset with pandas (not with the job's code)."""
    import pandas as pd

    flights = pd.read_csv(dataset)
    flights = flights[flights.dep_time.notna() & flights.arr_delay.notna()]
    expected = {}
    for f in flights.itertuples(index=False):
        flight_id = f"{f.year:04d}-{f.month:02d}-{f.day:02d}-{f.carrier}{f.flight}-{f.origin}-{f.sched_dep_time:04d}"
        value = {"flight_id": flight_id, "carrier": f.carrier, "flight": f.flight, "tailnum": f.tailnum,
                 "origin": f.origin, "dest": f.dest, "dep_delay": int(f.dep_delay), "arr_delay": int(f.arr_delay),
                 "delay_gained": int(f.dep_delay - f.arr_delay), "distance": f.distance,
                 "air_time": int(f.air_time), "speed_mph": int(f.distance * 60 / f.air_time)}
        scheduled_ms = int(pd.Timestamp(f.time_hour).timestamp() * 1000) + f.minute * 60_000
        key = f.tailnum.encode()
        expected[flight_id] = {"key": key, "value": value, "timestamp_ms": scheduled_ms,
                               "partition": murmur2_partition(key, FLIGHTS_PARTITIONS),
                               "headers": [("origin", f.origin.encode()), ("carrier", f.carrier.encode())]}
    return expected


def check_flights(bootstrap: str, topic: str, timeout: float = 120.0) -> int:
    """Read ``topic`` back and check it holds each completed flight once, as it should be; 0 if so, else 1.

    Waits up to ``timeout`` seconds for as many records as there are flights.
    """
    from .readback import ReadTimeout, read_topic

    expected = _expected_flights(_load_job().dataset_path())
    try:
        records = read_topic(bootstrap, topic, expected=len(expected), timeout=timeout)
    except ReadTimeout as exc:
        records = exc.records  # fewer than expected: the check below says which are missing
    seen: Counter[str] = Counter()
    wrong = []
    for record in records:
        value = json.loads(record.value or b"null")
        flight_id = value.get("flight_id") if isinstance(value, dict) else None
        seen[flight_id] += 1
        actual = {"key": record.key, "value": value, "timestamp_ms": record.timestamp_ms,
                  "partition": record.partition, "headers": record.headers}
        if actual != expected.get(flight_id):
            wrong.append((actual, expected.get(flight_id)))
    missing = len(expected.keys() - seen.keys())
    duplicated = sum(count - 1 for count in seen.values() if count > 1)
    print(f"read {len(records)} records of {len(expected)} completed flights: {missing} missing, "
          f"{duplicated} duplicated, {len(wrong)} wrong")
    for actual, wanted in wrong[:3]:
        print(f"  read     {actual}\n  expected {wanted}")
    return 0 if not (missing or duplicated or wrong) else 1
