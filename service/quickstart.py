"""``kafka-sidecar quickstart``: the whole path on one machine, with an embedded broker.

Starts the embedded Tansu broker, creates a topic, starts the sender daemon,
runs several application processes that produce through it with the client
stub, and prints what arrived where. Everything listens on loopback and stops
at the end.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from client_stub import Producer

from .embedded import EmbeddedBroker


def _produce(endpoint: str, topic: str, worker: int, records: int, results: multiprocessing.Queue) -> None:
    started = time.monotonic()
    with Producer(endpoint) as producer:
        futures = [producer.send(topic, f"worker {worker} record {n}".encode(), key=f"user-{n % 100}".encode(),
                                 headers={"worker": str(worker)}) for n in range(records)]
        undelivered = producer.flush(60)
        partitions = Counter(f.result().partition for f in futures if not f.exception())
        errors = Counter(type(f.exception()).__name__ for f in futures if f.exception())
    results.put((worker, time.monotonic() - started, undelivered, dict(partitions), dict(errors)))


def run(processes: int = 4, records: int = 25_000, partitions: int = 6) -> int:
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
                return _run_workers(endpoint, topic, processes, records)
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
