"""``kafka-sidecar perf-test``: Kafka's kafka-producer-perf-test, through the sidecar.

K processes send N records of S bytes in total (optionally at R records/s in
total) and report what Kafka's tool reports: records/s, MB/s, and the latency
from send() to the delivery report (average, max, 50th, 95th, 99th, 99.9th
percentiles), with a progress line every few seconds.

The measuring is separate from the producer: a worker drives any client through
an adapter (``make_client(options) -> Client``), so that benchmarks can run
other producers on the same workload with the same clock.
"""

from __future__ import annotations

import array
import importlib
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

DeliveryCallback = Callable[[Any, Any], None]


class Client(Protocol):
    """What a worker needs of a producer."""

    def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback) -> None: ...

    def poll(self) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Workload:
    topic: str
    num_records: int
    record_size: int
    processes: int = 1
    throughput: float = -1  # records/s in total; negative: as fast as possible
    key_size: int = 0  # 0: records without keys
    key_count: int = 1000


@dataclass
class Result:
    records: int
    errors: int
    seconds: float
    record_size: int
    latencies_ms: list[float]

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.record_size / (1024 * 1024)

    def percentile(self, fraction: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(int(len(ordered) * fraction), len(ordered) - 1)]

    def summary(self) -> dict[str, float]:
        lat = self.latencies_ms
        return {"records": self.records, "errors": self.errors, "seconds": round(self.seconds, 3),
                "records_per_s": round(self.records_per_s, 1), "mb_per_s": round(self.mb_per_s, 3),
                "latency_avg_ms": round(sum(lat) / len(lat), 3) if lat else 0.0,
                "latency_max_ms": round(max(lat), 3) if lat else 0.0,
                "latency_p50_ms": self.percentile(0.50), "latency_p95_ms": self.percentile(0.95),
                "latency_p99_ms": self.percentile(0.99), "latency_p999_ms": self.percentile(0.999)}

    def line(self) -> str:
        s = self.summary()
        return (f"{s['records']} records sent, {s['records_per_s']:.1f} records/sec ({s['mb_per_s']:.2f} MB/sec), "
                f"{s['latency_avg_ms']:.2f} ms avg latency, {s['latency_max_ms']:.2f} ms max latency, "
                f"{s['latency_p50_ms']:.0f} ms 50th, {s['latency_p95_ms']:.0f} ms 95th, "
                f"{s['latency_p99_ms']:.0f} ms 99th, {s['latency_p999_ms']:.0f} ms 99.9th.")


class _Progress:
    """Counters a worker shares with the parent for the progress line (written by one thread each)."""

    def __init__(self, context: Any, processes: int) -> None:
        self.acked = context.Array("q", processes, lock=False)
        self.latency_sum = context.Array("d", processes, lock=False)
        self.latency_max = context.Array("d", processes, lock=False)


def make_sidecar_client(options: dict[str, Any]) -> Client:
    """The adapter of kafka-sidecar's own client."""
    from client_stub import Producer

    class SidecarClient:
        def __init__(self) -> None:
            self.producer = Producer(options.get("endpoint"), **options.get("producer", {}))

        def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback) -> None:
            self.producer.send(topic, value, key, on_delivery=on_delivery)

        def poll(self) -> None:
            pass  # delivery reports arrive on the producer's I/O thread

        def flush(self) -> None:
            self.producer.flush()

        def close(self) -> None:
            self.producer.close()

    return SidecarClient()


def _load(adapter: str) -> Callable[[dict[str, Any]], Client]:
    module, _, function = adapter.partition(":")
    return getattr(importlib.import_module(module), function)


def _worker(adapter: str, options: dict[str, Any], workload: Workload, index: int, count: int,
            progress: _Progress, results: Any, ready: Any, go: Any) -> None:
    rng = random.Random(index)
    keys = [rng.randbytes(workload.key_size) for _ in range(workload.key_count)] if workload.key_size else [None]
    payload = rng.randbytes(workload.record_size)
    latencies = array.array("d", bytes(8 * count))
    errors = [0]
    client = _load(adapter)(options)
    rate = workload.throughput / workload.processes if workload.throughput > 0 else 0.0
    clock = time.perf_counter
    acked = progress.acked
    lat_sum = progress.latency_sum
    lat_max = progress.latency_max

    def delivered(n: int, started: float) -> DeliveryCallback:
        def callback(err: Any, _metadata: Any) -> None:
            latency = (clock() - started) * 1000
            latencies[n] = latency
            if err is not None:
                errors[0] += 1
            acked[index] += 1
            lat_sum[index] += latency
            if latency > lat_max[index]:
                lat_max[index] = latency
        return callback

    ready.put(index)
    go.wait()
    topic = workload.topic
    start = clock()
    for n in range(count):
        if rate and n > rate * (clock() - start):
            # Ahead of the target rate: wait until the schedule catches up (Kafka's ThroughputThrottler).
            delay = n / rate - (clock() - start)
            if delay > 0:
                time.sleep(delay)
        client.send(topic, keys[n % len(keys)], payload, delivered(n, clock()))
        if n % 1000 == 0:
            client.poll()
    client.flush()
    seconds = clock() - start
    client.close()
    results.put((index, count, errors[0], seconds, latencies.tobytes()))


def run(workload: Workload, adapter: str = "service.perf_test:make_sidecar_client",
        options: dict[str, Any] | None = None, progress_every_s: float = 5.0,
        out: Callable[[str], None] = print) -> Result:
    """Run ``workload`` with ``processes`` spawned workers; returns the merged result."""
    context = multiprocessing.get_context("spawn")
    progress = _Progress(context, workload.processes)
    results = context.Queue()
    ready = context.Queue()
    go = context.Event()
    share, extra = divmod(workload.num_records, workload.processes)
    workers = [context.Process(target=_worker, daemon=True,
                               args=(adapter, options or {}, workload, i, share + (i < extra), progress, results,
                                     ready, go))
               for i in range(workload.processes)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    go.set()
    start = time.perf_counter()
    last = (start, 0, 0.0)
    finished = []
    while len(finished) < len(workers):
        try:
            finished.append(results.get(timeout=progress_every_s))
        except Exception:  # queue.Empty: time for a progress line
            now = time.perf_counter()
            acked = sum(progress.acked)
            total_latency = sum(progress.latency_sum)
            window = acked - last[1]
            if window:
                out(f"{window} records sent, {window / (now - last[0]):.1f} records/sec "
                    f"({window / (now - last[0]) * workload.record_size / 1048576:.2f} MB/sec), "
                    f"{(total_latency - last[2]) / window:.1f} ms avg latency, "
                    f"{max(progress.latency_max):.1f} ms max latency.")
            last = (now, acked, total_latency)
            if any(not w.is_alive() and w.exitcode for w in workers):
                raise RuntimeError("a perf-test worker failed") from None
    for worker in workers:
        worker.join()
    latencies: list[float] = []
    for _, _, _, _, data in finished:
        latencies += array.array("d", data)
    records = sum(f[1] for f in finished)
    return Result(records=records, errors=sum(f[2] for f in finished), seconds=max(f[3] for f in finished),
                  record_size=workload.record_size, latencies_ms=latencies)


def main(args: Any) -> int:
    """The CLI command (see service.cli)."""
    import json
    import subprocess
    import tempfile

    from .cli import _settings

    settings = _settings(args.settings)
    workload = Workload(args.topic, args.num_records, args.record_size, args.processes, args.throughput,
                        args.key_size, args.key_count)
    daemon = None
    endpoint = args.endpoint
    with tempfile.TemporaryDirectory(prefix="kafka-sidecar-perf-") as workdir:
        if args.bootstrap_servers:
            endpoint = endpoint or f"ipc://{workdir}/sidecar.sock"
            command = [sys.executable, "-m", "service.cli", "--log-level", "WARNING", "run", "--bootstrap-servers",
                       args.bootstrap_servers, "--endpoint", endpoint]
            for key, value in settings.items():
                command += ["-X", f"{key}={value}"]
            daemon = subprocess.Popen(command)
        elif settings:
            print("kafka-sidecar perf-test: -X settings go to the daemon; give --bootstrap-servers "
                  "to let perf-test start one", file=sys.stderr)
            return 2
        try:
            result = run(workload, options={"endpoint": endpoint, "producer": {"max_block_ms": 120_000}})
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(60)
    print(result.line())
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"workload": asdict(workload), "result": result.summary(), "pid": os.getpid()}, out,
                      indent=2)
    return 0 if result.errors == 0 else 1
