"""``kafka-sidecar perf-test``: Kafka's kafka-producer-perf-test, through the sidecar.

K processes send N records of S bytes in total (optionally at R records/s in
total) and report what Kafka's tool reports: records/s, MB/s, and the latency
from send() to the delivery report (average, max, 50th, 95th, 99th, 99.9th
percentiles), with a progress line every few seconds. With a duration
(``Workload.duration_s``) every process sends until the time is up and the
record count is only a cap. Without callbacks (``Workload.callbacks``) no
record gets a delivery callback: latencies are not measured, and the records
delivered are those sent less those the client counts as not delivered once
flush() has returned (``Client.undelivered``).

The measuring is separate from the producer: a worker drives any client through
an adapter (``make_client(options) -> Client``), so that benchmarks can run
other producers on the same workload with the same clock. A worker imports the
adapter's module (and calls ``make_client.prepare()`` if the adapter has one, to
import the client library) before it reports ready, and makes the client only
after the parent says go: whatever the parent samples between the two (the
workers' memory, say: ``run(on_ready=...)``) is the cost of an idle process
with the library loaded, before any producer exists. Workers are spawned, or
forked from a server that has imported the client library
(``run(forkserver_preload=...)``), which starts hundreds of them in seconds.
"""

from __future__ import annotations

import array
import importlib
import math
import multiprocessing
import os
import queue
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Protocol

DeliveryCallback = Callable[[Any, Any], None]

# The shortest wait of a throttled worker (Kafka's ThroughputThrottler.MIN_SLEEP_NS): it runs this far
# ahead of the schedule, then sleeps until the schedule catches up.
MIN_SLEEP_S = 0.002
# The latencies a worker keeps, as Kafka's Stats (at most 500 000): past that, an even sample.
LATENCY_SAMPLES = 500_000
# A worker copies its counts to the shared progress counters once every this many delivery reports.
PUBLISH_EVERY = 256


class Client(Protocol):
    """What a worker needs of a producer.

    ``send`` hands one record over and arranges for ``on_delivery(err, metadata)``
    to run once when its delivery report arrives (err None on success); with
    ``on_delivery`` None, no callback of the benchmark's runs for the record. ``poll``
    must not block; the worker calls it after every send, so that clients whose
    callbacks run only in poll() (librdkafka) report as promptly as clients with an
    I/O thread. ``flush`` returns once every record has been reported.
    ``undelivered`` counts the records sent without a callback that the client
    knows were not delivered (failed, or still unreported after flush()).
    """

    def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None) -> None: ...

    def poll(self) -> None: ...

    def flush(self) -> None: ...

    def undelivered(self) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Workload:
    topic: str
    num_records: int  # in total; with duration_s, a cap
    record_size: int
    processes: int = 1
    throughput: float = -1  # records/s in total; negative: as fast as possible
    key_size: int = 0  # 0: records without keys
    key_count: int = 1000
    duration_s: float = 0.0  # > 0: every process sends until this many seconds have passed (or its share is sent)
    # Records each process sends, and waits for, before the measured part (not counted): connections,
    # metadata and producer id are then in place, and the measurements show the steady state.
    warmup_records: int = 0
    # False: no record gets a delivery callback (latency not measured; delivered = sent - client.undelivered()).
    callbacks: bool = True

    def __post_init__(self) -> None:
        problems = [f"{name} must be at least {least}, got {value}" for name, value, least in (
            ("num_records", self.num_records, 1), ("record_size", self.record_size, 0),
            ("processes", self.processes, 1), ("key_size", self.key_size, 0), ("key_count", self.key_count, 1))
            if value < least]
        if self.throughput == 0:
            problems.append("throughput must be positive (records/s) or negative (as fast as possible), got 0")
        if problems:
            # Imported here: the workers of confluent-kafka and kafka-python import this module, and
            # client_stub's package loads pyzmq and msgpack, which are not their libraries.
            from client_stub.errors import ConfigError

            raise ConfigError("perf-test: " + "; ".join(problems))


@dataclass
class Result:
    records: int  # delivered successfully
    errors: int  # delivery reports with an error
    seconds: float  # the slowest process, from its first send() to its last delivery report
    record_size: int
    latencies_ms: list[float]  # of the successful deliveries: all of them, or an even sample (LATENCY_SAMPLES)
    sent: int = 0  # records handed to send()
    cpu_seconds: float = 0.0  # user + system of the producing processes, from go to after close()
    startup_seconds: float = 0.0  # the slowest process, from go to its producer made and warm-up delivered
    latency_sum_ms: float | None = None  # of every successful delivery (None: take the sample's)
    latency_max_ms: float | None = None
    callbacks: bool = True  # False: sent without delivery callbacks, no latency measured

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.records_per_s * self.record_size / (1024 * 1024)

    def percentile(self, fraction: float, ordered: list[float] | None = None) -> float:
        ordered = ordered if ordered is not None else sorted(self.latencies_ms)
        if not ordered:
            return 0.0
        return ordered[min(int(len(ordered) * fraction), len(ordered) - 1)]

    def summary(self) -> dict[str, float | None]:
        """Kafka's metrics; the latencies None without callbacks (not measured)."""
        summary: dict[str, float | None] = {
            "records": self.records, "errors": self.errors, "sent": self.sent, "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records_per_s, 1), "mb_per_s": round(self.mb_per_s, 3)}
        lat = self.latencies_ms
        ordered = sorted(lat)
        total = self.latency_sum_ms if self.latency_sum_ms is not None else sum(lat)
        most = self.latency_max_ms if self.latency_max_ms is not None else (ordered[-1] if lat else 0.0)
        latencies = {"latency_avg_ms": total / self.records if self.records else 0.0, "latency_max_ms": most,
                     **{f"latency_{name}_ms": self.percentile(fraction, ordered)
                        for name, fraction in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))}}
        summary.update({name: round(value, 3) if self.callbacks else None for name, value in latencies.items()})
        summary.update(cpu_s=round(self.cpu_seconds, 3), startup_s=round(self.startup_seconds, 3))
        return summary

    def line(self) -> str:
        s = self.summary()
        sent = f"{s['records']} records sent, {s['records_per_s']:.1f} records/sec ({s['mb_per_s']:.2f} MB/sec)"
        if not self.callbacks:
            return f"{sent}, latency not measured (no delivery callbacks)."
        return (f"{sent}, {s['latency_avg_ms']:.2f} ms avg latency, {s['latency_max_ms']:.2f} ms max latency, "
                f"{s['latency_p50_ms']:.0f} ms 50th, {s['latency_p95_ms']:.0f} ms 95th, "
                f"{s['latency_p99_ms']:.0f} ms 99th, {s['latency_p999_ms']:.0f} ms 99.9th.")


class LatencySample:
    """Latencies kept for the percentiles: every one while there is room, then an even sample of all.

    Its array is allocated and filled at once, as Kafka's Stats allocates its int[] up
    front: grown by append() instead, it would be reallocated over and over in whichever
    thread runs the delivery callbacks, memory that would count as the producer's.
    Kafka's Stats keeps every n-th latency, n chosen from the record count; here the count
    is not known in advance (a run by duration), so n doubles whenever the array is full:
    every other latency kept is dropped, and from then on every other one is kept
    (``next_kept``). The latencies passed over cost a comparison each.
    """

    __slots__ = ("array", "capacity", "stride", "next_kept", "_kept", "seen")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a LatencySample keeps at least one latency, not {capacity}")
        self.array = array.array("d", [0.0]) * capacity
        self.capacity = capacity
        self.stride = 1
        self.next_kept = capacity
        self._kept = capacity
        self.seen = 0

    def add(self, latency: float) -> None:
        seen = self.seen
        self.seen = seen + 1
        if seen < self.capacity:
            self.array[seen] = latency
        elif seen == self.next_kept:
            self.keep(latency)

    def keep(self, latency: float) -> None:
        """Keep the latency of record ``next_kept``, one past the capacity (the caller counted it seen)."""
        if self._kept == self.capacity:
            # Full: every other latency kept goes, and the grid of records kept is twice as wide.
            half = self.array[::2]
            self.array[:len(half)] = half
            self._kept = len(half)
            self.stride *= 2
        if self.next_kept == self._kept * self.stride:  # off the grid only right after thinning
            self.array[self._kept] = latency
            self._kept += 1
        # Always _kept x stride: kept as an attribute for the delivery callback's one comparison.
        self.next_kept = self._kept * self.stride

    def values(self) -> array.array:
        """The latencies kept."""
        # Before the first thinning _kept is the capacity; after it, fewer than seen.
        return self.array[:min(self.seen, self._kept)]


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

        def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None) -> None:
            self.producer.send(topic, value, key, on_delivery=on_delivery)

        def poll(self) -> None:
            pass  # delivery reports arrive on the producer's I/O thread

        def flush(self) -> None:
            self.producer.flush()

        def undelivered(self) -> int:
            """Records whose future failed, and those still without an outcome (Producer.metrics())."""
            metrics = self.producer.metrics()
            return int(metrics["record-error-total"] + metrics["records-outstanding"])

        def close(self) -> None:
            self.producer.close()

    return SidecarClient()


def _prepare_sidecar() -> None:
    importlib.import_module("client_stub")


make_sidecar_client.prepare = _prepare_sidecar  # type: ignore[attr-defined]


def _load(adapter: str) -> Callable[[dict[str, Any]], Client]:
    module, _, function = adapter.partition(":")
    return getattr(importlib.import_module(module), function)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _worker(adapter: str, options: dict[str, Any], workload: Workload, index: int, count: int,
            progress: _Progress, events: Any, go: Any, go_timeout: float) -> None:
    try:
        _work(adapter, options, workload, index, count, progress, events, go, go_timeout)
    except BaseException:
        events.put(("error", index, traceback.format_exc()))
        sys.exit(1)


def _work(adapter: str, options: dict[str, Any], workload: Workload, index: int, count: int,
          progress: _Progress, events: Any, go: Any, go_timeout: float) -> None:
    factory = _load(adapter)
    prepare = getattr(factory, "prepare", None)
    if prepare is not None:
        prepare()  # import the client library now, so that the parent's baseline includes it
    rng = random.Random(index)
    keys = [rng.randbytes(workload.key_size) for _ in range(workload.key_count)] if workload.key_size else [None]
    key_count = len(keys)
    payload = rng.randbytes(workload.record_size)
    # Made before the parent's memory baseline: the benchmark's own bookkeeping is not memory the producer adds.
    latencies = LatencySample(max(min(count, LATENCY_SAMPLES), 1))
    kept, capacity = latencies.array, latencies.capacity
    errors = [0]
    rate = workload.throughput / workload.processes if workload.throughput > 0 else 0.0
    clock = time.perf_counter
    # Reports counted, and the sum and max of their latencies: kept here and copied to the shared progress
    # counters every PUBLISH_EVERY reports, since an element of a shared ctypes array costs ~150 ns an access.
    tally = [0, 0.0, 0.0]

    def publish() -> None:
        progress.acked[index], progress.latency_sum[index], progress.latency_max[index] = tally

    def delivered(started: float, err: Any, _metadata: Any) -> None:
        """The delivery callback of the record sent at ``started``, bound to it with functools.partial."""
        latency = (clock() - started) * 1000
        if err is not None:
            errors[0] += 1
        else:
            # add() inlined (past the capacity, keep() is called for one record in ``stride``): a Python
            # call per record would slow every client down, the fastest most.
            seen = latencies.seen
            latencies.seen = seen + 1
            if seen < capacity:
                kept[seen] = latency
            elif seen == latencies.next_kept:
                latencies.keep(latency)
            tally[1] += latency
            if latency > tally[2]:
                tally[2] = latency
        tally[0] += 1
        if not tally[0] % PUBLISH_EVERY:
            publish()

    events.put(("ready", index, os.getpid()))
    if not go.wait(go_timeout):
        raise TimeoutError(f"no go from the parent in {go_timeout}s")
    cpu_start = _cpu_seconds()
    began = clock()
    client = factory(options)
    topic = workload.topic
    sleep = time.sleep
    callbacks = workload.callbacks
    if workload.warmup_records > 0:
        warm = [0]

        def warmed(err: Any, _metadata: Any) -> None:
            if err is not None:
                errors[0] += 1
            warm[0] += 1

        for n in range(workload.warmup_records):
            client.send(topic, keys[n % key_count], payload, warmed if callbacks else None)
            client.poll()
        client.flush()
        deadline = clock() + 60
        while callbacks and warm[0] < workload.warmup_records and clock() < deadline:
            client.poll()
            sleep(0.001)
        failed = errors[0] if callbacks else client.undelivered()
        if failed:
            raise RuntimeError(f"{failed} of {workload.warmup_records} warm-up records failed")
    undelivered_before = 0 if callbacks else client.undelivered()
    start = clock()
    startup = start - began
    end = start + workload.duration_s if workload.duration_s > 0 else math.inf
    n = 0
    while n < count:
        now = clock()
        if now >= end:
            break
        if rate and n > rate * (now - start):
            # Ahead of the target rate: once at least MIN_SLEEP_S ahead, wait until the schedule catches
            # up, as Kafka's ThroughputThrottler does (not a sleep per record: at thousands of records
            # per second the wake-ups alone would load the machine more than the producer does).
            delay = n / rate - (now - start)
            if delay >= MIN_SLEEP_S:
                sleep(delay)
                now = clock()
        # A partial, not a closure: one object for the garbage collector per record instead of three (the
        # function, its cell and their tuple). They live until the record's report, long enough to be
        # promoted and scanned again and again: collector time that every client would pay, the fastest most.
        client.send(topic, keys[n % key_count], payload, partial(delivered, now) if callbacks else None)
        client.poll()
        n += 1
    client.flush()
    if callbacks:
        # flush() returns when every record is reported; wait for the callbacks to have run, to be sure.
        deadline = clock() + 60
        while tally[0] < n and clock() < deadline:
            client.poll()
            sleep(0.001)
        good, failed = latencies.seen, errors[0]
    else:
        failed = client.undelivered() - undelivered_before
        good = n - failed
    seconds = clock() - start
    publish()
    client.close()
    cpu = _cpu_seconds() - cpu_start
    events.put(("result", index, n, good, failed, seconds, cpu, latencies.values().tobytes(), startup,
                tally[1], tally[2]))


def run(workload: Workload, adapter: str = "service.tools.perf_test:make_sidecar_client",
        options: dict[str, Any] | None = None, progress_every_s: float = 5.0,
        out: Callable[[str], None] = print, *, on_ready: Callable[[list[int]], None] | None = None,
        on_tick: Callable[[], None] | None = None, tick_every_s: float = 1.0,
        ready_timeout_s: float = 120.0, timeout_s: float | None = None,
        forkserver_preload: Sequence[str] | None = None) -> Result:
    """Run ``workload`` with ``processes`` workers; returns the merged result.

    ``on_ready(pids)`` runs once every worker has loaded its client library and before
    any makes its producer; ``on_tick()`` runs about every ``tick_every_s`` seconds while
    they all send (until the first has finished). ``timeout_s`` bounds the run after go
    (None: no bound). Workers that are still alive when this returns or raises are terminated.
    The workers are spawned (a fresh interpreter each, ~0.25 CPU s) unless
    ``forkserver_preload`` names the client library's modules: then they are forked from a
    server that has imported the parent's main module, the adapter's module and those
    (as gunicorn --preload and pyspark.daemon fork theirs), and stopped with the run.
    """
    context = _context(adapter, forkserver_preload)
    try:
        return _run(context, workload, adapter, options, progress_every_s, out, on_ready, on_tick, tick_every_s,
                    ready_timeout_s, timeout_s)
    finally:
        if forkserver_preload is not None:
            _stop_forkserver()


def _context(adapter: str, forkserver_preload: Sequence[str] | None) -> Any:
    """The multiprocessing context of a run: spawn, or a forkserver preloading the client library."""
    if forkserver_preload is None:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    _stop_forkserver()  # a server preloading another run's library must not fork this run's workers
    context.set_forkserver_preload(["__main__", adapter.partition(":")[0], *forkserver_preload])
    return context


def _stop_forkserver() -> None:
    """Stop this process's forkserver, if it runs. Python keeps one per process, with the modules preloaded
    when it started, and offers no public way to stop it: ``_stop`` is what its own tests use."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # type: ignore[attr-defined]


def _run(context: Any, workload: Workload, adapter: str, options: dict[str, Any] | None, progress_every_s: float,
         out: Callable[[str], None], on_ready: Callable[[list[int]], None] | None, on_tick: Callable[[], None] | None,
         tick_every_s: float, ready_timeout_s: float, timeout_s: float | None) -> Result:
    progress = _Progress(context, workload.processes)
    events = context.Queue()
    go = context.Event()
    share, extra = divmod(workload.num_records, workload.processes)
    go_timeout = ready_timeout_s + 60
    workers = [context.Process(target=_worker, daemon=True, name=f"perf-test-worker-{i}",
                               args=(adapter, options or {}, workload, i, share + (i < extra), progress, events,
                                     go, go_timeout))
               for i in range(workload.processes)]
    try:
        for worker in workers:
            worker.start()
        pids = [worker.pid for worker in workers]
        ready: set[int] = set()
        deadline = time.monotonic() + ready_timeout_s
        while len(ready) < len(workers):
            event = _next_event(events, workers, min(0.5, max(deadline - time.monotonic(), 0.01)))
            if event is not None:
                ready.add(event[1])  # _next_event raises on errors; results cannot come before go
            elif time.monotonic() > deadline:
                raise TimeoutError(f"perf-test workers not ready after {ready_timeout_s}s "
                                   f"({len(ready)} of {len(workers)})")
        if on_ready is not None:
            on_ready(pids)  # type: ignore[arg-type]
        go.set()
        start = time.perf_counter()
        end = start + timeout_s if timeout_s is not None else math.inf
        last = (start, 0, 0.0)
        next_progress = start + progress_every_s
        next_tick = start + tick_every_s
        finished = []
        while len(finished) < len(workers):
            now = time.perf_counter()
            if now > end:
                raise TimeoutError(f"perf-test run not finished after {timeout_s}s "
                                   f"({len(finished)} of {len(workers)} workers done)")
            # Ticks while every worker sends: one that has finished is sending its result (a copy of its
            # latencies), which is the benchmark's memory, not the producer's.
            ticking = on_tick is not None and not finished
            wait = min(next_progress, next_tick if ticking else math.inf, end) - now
            event = _next_event(events, workers, max(wait, 0.0))
            if event is not None:
                finished.append(event)
                continue
            now = time.perf_counter()
            if ticking and now >= next_tick:
                on_tick()
                next_tick = now + tick_every_s
            if now >= next_progress:
                acked = sum(progress.acked)
                total_latency = sum(progress.latency_sum)
                window = acked - last[1]
                if window:
                    out(f"{window} records sent, {window / (now - last[0]):.1f} records/sec "
                        f"({window / (now - last[0]) * workload.record_size / 1048576:.2f} MB/sec), "
                        f"{(total_latency - last[2]) / window:.1f} ms avg latency, "
                        f"{max(progress.latency_max):.1f} ms max latency.")
                last = (now, acked, total_latency)
                next_progress = now + progress_every_s
        for worker in workers:
            worker.join(30)
    finally:
        go.set()  # nothing may wait for it any more
        _stop(workers)
    latencies: list[float] = []
    for event in finished:
        latencies += array.array("d", event[7])
    return Result(records=sum(e[3] for e in finished), errors=sum(e[4] for e in finished),
                  seconds=max(e[5] for e in finished), record_size=workload.record_size, latencies_ms=latencies,
                  sent=sum(e[2] for e in finished), cpu_seconds=sum(e[6] for e in finished),
                  startup_seconds=max(e[8] for e in finished), latency_sum_ms=sum(e[9] for e in finished),
                  latency_max_ms=max(e[10] for e in finished), callbacks=workload.callbacks)


def _next_event(events: Any, workers: list[Any], timeout: float) -> tuple[Any, ...] | None:
    """The next ready or result event (None after ``timeout``); raises if a worker failed."""
    try:
        event = events.get(timeout=timeout) if timeout > 0 else events.get_nowait()
    except queue.Empty:
        dead = [(index, worker.exitcode) for index, worker in enumerate(workers)
                if not worker.is_alive() and worker.exitcode]
        if not dead:
            return None
        try:
            event = events.get(timeout=1.0)  # its error report may still be on its way
        except queue.Empty:
            index, code = dead[0]
            raise RuntimeError(f"perf-test worker {index} exited with code {code}") from None
    if event[0] == "error":
        raise RuntimeError(f"perf-test worker {event[1]} failed:\n{event[2]}")
    return event


def _stop(workers: list[Any]) -> None:
    """Terminate (then kill) the workers still alive."""
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        if worker.pid is None:
            continue  # never started
        worker.join(5)
        if worker.is_alive():
            worker.kill()
            worker.join(5)


def main(args: Any) -> int:
    """The CLI command (see service.cli)."""
    import json
    import signal
    import subprocess
    import tempfile

    from ..config import parse_settings

    # SIGTERM ends the run as Ctrl-C does: the finally below stops the daemon it started and the workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = parse_settings(args.settings)
    workload = Workload(args.topic, args.num_records, args.record_size, args.processes, args.throughput,
                        args.key_size, args.key_count, callbacks=args.callbacks)
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
                try:
                    daemon.wait(60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
    print(result.line())
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"workload": asdict(workload), "result": result.summary(), "pid": os.getpid()}, out,
                      indent=2)
    return 0 if result.errors == 0 else 1
