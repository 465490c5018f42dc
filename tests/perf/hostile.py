"""The daemon beside careless and hostile clients (issue 25): what one client does, the others pay for?

    python tests/perf/hostile.py [--only CASE,...] [--duration S] [--runs N] [--json PATH]

Every measurement gets a fresh broker (warmed up), a fresh 6-partition topic and a fresh
daemon with compare.py's settings. A well-behaved client, one spawned process through
service.tools.perf_test, sends 20 000 records/s (100-byte values, 16-byte keys) for
--duration seconds and measures each record's latency from send() to its delivery callback.
The baseline is that client alone (once per run, before the cases); in each case a hostile
client runs beside it in a process of its own, from the moment the well-behaved client's
warm-up records are delivered until the measurement ends:

  big-frame       a DEALER sends one 300 MiB frame (the daemon's ZMQ_MAXMSGSIZE drops it)
  unread-replies  a session, then 20 000 BLOCKS with a 10 KiB string as request_id, each refused
                  with an ERROR that quotes it; the replies are never read
  two-sockets     one process, two sessions, each asking for the pool's every block and
                  holding what it gets (a process may hold half the pool)
  metadata-flood  a session, then METADATA for 5 000 topics that do not exist (the broker
                  creates the topics the daemon asks it to)
  garbage-loop    a DEALER sending garbage (random bytes, other msgpack, wrong types, the old
                  SEAL, extra frames) as fast as the daemon takes it
  garbage-seal    a session publishing batches of random bytes (not Kafka records) in its
                  blocks' slots for the well-behaved client's topic, with a WAKEUP each, 100 a
                  second: the daemon claims each and fails it
  wakeup-flood    a session holding 64 batches published and not due (its linger.ms: an hour),
                  saying WAKEUP as fast as the daemon takes it

Per case: the well-behaved client's p50 and p99 and p99 / the baseline's p99, records
delivered of those sent, failures; the daemon's peak and final resident memory (VmHWM,
VmRSS) and growth over its resident memory when started, its CPU seconds, whether it still
runs, and its own figures (SidecarProcess.stats(), as it returns them); what the hostile
client did. Nothing is asserted: the figures are for the issue's closing note.

Only the standard library and tests.perf.compare (which imports service.tools.perf_test) are
imported at module level: spawned processes import this module again.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.perf and tests.support, here and in the spawned processes

from service.tools.perf_test import DeliveryCallback, Workload, run  # noqa: E402
from tests.perf.compare import (  # noqa: E402
    KEY_COUNT,
    KEY_SIZE,
    PARTITIONS,
    RECORD_SIZE,
    Monitor,
    machine_facts,
    process_cpu_s,
    results_path,
    start_daemon,
    warm_up,
    write_report,
)

RATE = 20_000  # records/s of the well-behaved client
WARMUP_RECORDS = 100  # sent and delivered before the measured part, and before the hostile client starts
# The well-behaved client waits at most this long for blocks (its max_block_ms): a record it cannot hand
# over by then fails, rather than stalling the run.
MAX_BLOCK_MS = 5_000
# After its last send, the well-behaved client waits this long for the outstanding records; those not
# confirmed by then fail (Producer.close), so that every record sent is counted either way.
FINAL_FLUSH_S = 15.0
ADAPTER = "tests.perf.hostile:make_well_behaved_client"

BIG_FRAME_BYTES = 300 << 20
UNREAD_MESSAGES = 20_000
UNREAD_FIELD_BYTES = 10 << 10
FLOOD_TOPICS = 5_000
GARBAGE_SEAL_INTERVAL_S = 0.01
GARBAGE_SEAL_BYTES = 1000
WAKEUP_FLOOD_BLOCKS = 64
HEARTBEAT_S = 1.0  # hostile sessions stay alive (the daemon ends a session silent for 30 s)
SNDTIMEO_MS = 100  # a hostile send that would block gives way this often, to see whether it should stop


# -- the well-behaved client --------------------------------------------------------------------

def make_well_behaved_client(options: dict[str, Any]) -> Any:
    """perf_test's kafka-sidecar client, except that a record that fails in send() (no block in
    MAX_BLOCK_MS) counts as a failed delivery, the end waits at most FINAL_FLUSH_S, and the first
    flush (the warm-up's) sets ``options["warmed"]``, the hostile client's signal to start."""
    from client_stub import Producer
    from client_stub.errors import KafkaError

    class WellBehavedClient:
        def __init__(self) -> None:
            self.producer = Producer(options["endpoint"], max_block_ms=MAX_BLOCK_MS)
            self.warmed = options["warmed"]

        def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback) -> None:
            try:
                self.producer.send(topic, value, key, on_delivery=on_delivery)
            except KafkaError as exc:
                on_delivery(exc, None)

        def poll(self) -> None:
            pass  # delivery reports arrive on the producer's I/O thread

        def flush(self) -> None:
            if not self.warmed.is_set():
                self.producer.flush(60)
                self.warmed.set()
            else:
                self.producer.close(FINAL_FLUSH_S)  # fails what is still unconfirmed: every callback runs

        def close(self) -> None:
            self.producer.close(0)  # already closed by the last flush()

    return WellBehavedClient()


make_well_behaved_client.prepare = lambda: __import__("client_stub")  # type: ignore[attr-defined]


# -- hostile clients (each runs in a spawned process) -------------------------------------------

class RawClient:
    """A DEALER speaking the daemon's contract by hand, for what no Producer would send."""

    def __init__(self, endpoint: str, stop: Any) -> None:
        import zmq

        self.zmq = zmq
        self.endpoint = endpoint
        self.stop = stop
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDTIMEO, SNDTIMEO_MS)
        self.sock.connect(endpoint)
        self.memory: Any = None  # the memory socket's connection: the session ends with it

    def put(self, *frames: bytes) -> bool:
        """Send one message of ``frames``, waiting while the daemon does not take it; False once told to stop."""
        while not self.stop.is_set():
            try:
                self.sock.send_multipart(frames)
                return True
            except self.zmq.Again:
                continue
        return False

    def send(self, *fields: Any) -> bool:
        from client_stub.contract import ipc

        return self.put(ipc.pack(*fields))

    def recv(self, timeout_ms: int) -> Any:
        """The next message from the daemon (None after ``timeout_ms``); what does not decode, as is."""
        from client_stub.contract import ipc

        if not self.sock.poll(timeout_ms):
            return None
        data = self.sock.recv()
        try:
            return ipc.decode(data)
        except ValueError:
            return data

    def drain(self) -> int:
        """Read and drop whatever has arrived; how many messages."""
        count = 0
        while self.sock.poll(0):
            self.sock.recv()
            count += 1
        return count

    def hello(self) -> Any:
        """A session: HELLO, then its WELCOME (what comes before is dropped)."""
        from client_stub.contract import PROTOCOL_VERSION, ipc

        self.send(*_hello_fields(PROTOCOL_VERSION))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = self.recv(100)
            if isinstance(message, ipc.Welcome):
                return message
        raise TimeoutError("no WELCOME from the daemon in 30 s")

    def attach(self, welcome: Any) -> int:
        """The memory handshake of ``welcome``'s session: the segment's file descriptor."""
        from client_stub.contract import shared_memory

        path = shared_memory.memory_socket_path(self.endpoint, welcome.daemon_id)
        self.memory, fd = shared_memory.connect(path, welcome.memory_token, 10.0)
        return fd

    def map(self, welcome: Any) -> tuple[Any, Any]:
        """The memory handshake of ``welcome``'s session, and its segment mapped: the Segment and its
        ControlArea (release the area, then close the segment)."""
        from client_stub.contract.batch_slots import ControlArea
        from client_stub.contract.shared_memory import Layout, Segment

        fd = self.attach(welcome)
        try:
            segment = Segment(fd, Layout(welcome.block_size, welcome.block_count))
        finally:
            os.close(fd)
        return segment, ControlArea(segment.control, welcome.block_count)

    def follow(self, topic: str) -> int:
        """The session's number for ``topic``, once the daemon knows its partitions (what comes before is dropped)."""
        from client_stub.contract import ipc

        self.send(ipc.Metadata.TYPE, topic)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = self.recv(100)
            if isinstance(message, ipc.Topic) and message.topic == topic and message.partition_count is not None:
                return message.index
        raise TimeoutError(f"no partitions of {topic} from the daemon in 30 s")

    def close(self) -> None:
        self.sock.close(0)
        if self.memory is not None:
            self.memory.close()


def _hello_fields(version: int) -> list[Any]:
    from client_stub.contract import ipc

    return [ipc.Hello.TYPE, version, os.getpid(), "hostile", {}]


def big_frame(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    client = RawClient(endpoint, stop)
    try:
        sent = client.put(bytes(BIG_FRAME_BYTES))
        stop.wait()
        return {"frames_sent": int(sent), "frame_bytes": BIG_FRAME_BYTES}
    finally:
        client.close()


def unread_replies(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    from client_stub.contract import ipc

    client = RawClient(endpoint, stop)
    try:
        os.close(client.attach(client.hello()))  # a session of a process, as a real client's
        field = "x" * UNREAD_FIELD_BYTES  # each ERROR quotes it (the daemon cuts the quote to 400 characters)
        sent = 0
        while sent < UNREAD_MESSAGES and client.send(ipc.Blocks.TYPE, field, 1, False, 0):
            sent += 1
        while not stop.wait(HEARTBEAT_S):
            client.send(ipc.Heartbeat.TYPE)
        return {"messages_sent": sent, "field_bytes": UNREAD_FIELD_BYTES}
    finally:
        client.close()


def two_sockets(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    """Two sessions of one process, each asking for every block again as soon as it was answered."""
    from client_stub.contract import ipc

    clients = [RawClient(endpoint, stop) for _ in range(2)]
    try:
        welcomes = [client.hello() for client in clients]
        for client, welcome in zip(clients, welcomes, strict=True):
            os.close(client.attach(welcome))  # blocks are counted by the daemon; the memory is never touched
        held = [0, 0]
        request_id = 0

        def ask(client: RawClient, count: int) -> None:
            nonlocal request_id
            request_id += 1
            client.send(ipc.Blocks.TYPE, request_id, count, False, 3_600_000)

        for client, welcome in zip(clients, welcomes, strict=True):
            ask(client, welcome.block_count)
        next_beat = time.monotonic() + HEARTBEAT_S
        while not stop.is_set():
            for i, client in enumerate(clients):
                message = client.recv(10)
                if isinstance(message, ipc.Grant):
                    held[i] += len(message.blocks)
                if isinstance(message, ipc.Grant | ipc.GrantFailed):
                    ask(client, welcomes[i].block_count)
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                for client in clients:
                    client.send(ipc.Heartbeat.TYPE)
        return {"sessions": 2, "blocks_held": held, "pool_blocks": welcomes[0].block_count}
    finally:
        for client in clients:
            client.close()


def metadata_flood(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    from client_stub.contract import ipc

    client = RawClient(endpoint, stop)
    try:
        os.close(client.attach(client.hello()))  # topics are followed by sessions that made their handshake
        prefix = f"flood-{uuid.uuid4().hex[:8]}"
        asked = 0
        answers: Counter[str] = Counter()
        while asked < FLOOD_TOPICS and client.send(ipc.Metadata.TYPE, f"{prefix}-{asked}"):
            asked += 1
        next_beat = time.monotonic() + HEARTBEAT_S
        while not stop.is_set():
            message = client.recv(50)
            if message is not None:
                answers[_kind(message)] += 1
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                client.send(ipc.Heartbeat.TYPE)
        return {"topics_asked": asked, "answers": dict(answers)}
    finally:
        client.close()


def garbage_loop(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    client = RawClient(endpoint, stop)
    try:
        client.hello()  # a session too, so that its handlers meet the garbage, not only the unknown-client check
        garbage = _garbage(random.Random(25))
        sent = replies = 0
        while not stop.is_set():
            for frames in garbage:
                if not client.put(*frames):
                    break
                sent += 1
            replies += client.drain()  # read, so that this case is the garbage's cost, not unread replies'
        return {"messages_sent": sent, "replies_read": replies, "kinds": len(garbage)}
    finally:
        client.close()


def _garbage(rng: random.Random) -> list[list[bytes]]:
    """Messages the daemon must refuse: random bytes, msgpack that is no message, wrong types, extra frames
    (no valid HELLO: each would open a session)."""
    import msgpack

    from client_stub.contract import PROTOCOL_VERSION, ipc

    messages = [[rng.randbytes(rng.randrange(1, 300))] for _ in range(64)]
    messages += [[ipc.pack(*fields)] for fields in (
        [999], [True], ["HELLO"], [ipc.Hello.TYPE], _hello_fields(PROTOCOL_VERSION + 1000),
        [ipc.Hello.TYPE, PROTOCOL_VERSION, "pid", 5, []], [ipc.Blocks.TYPE, "one", -1, "no", None],
        [ipc.Blocks.TYPE, 1, 2**40, False, -1], [3, "notices"], [3, [[1, 2], None, "x"]],  # 3: the old SEAL
        [ipc.Wakeup.TYPE, "now"], [ipc.LastSeal.TYPE, [[1, 2], None, "x"]], [ipc.Release.TYPE, [None, -1]],
        [ipc.Metadata.TYPE, ""], [ipc.Metadata.TYPE, 5], [ipc.Heartbeat.TYPE, 1], [ipc.Welcome.TYPE],
        [ipc.Delivery.TYPE, []], [ipc.Stats.TYPE, "x"])]
    messages += [[msgpack.packb({"type": 1})], [b"\xc1"], [b""], [ipc.pack(ipc.Heartbeat.TYPE), b"second frame"]]
    return messages


def garbage_seal(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    """Batches whose record bytes are random, published full in the well-behaved client's topic, each with a
    WAKEUP: the daemon claims each, and fails it when it reads its records."""
    from client_stub.contract import ipc

    client = RawClient(endpoint, stop)
    segment = control = None
    try:
        welcome = client.hello()
        segment, control = client.map(welcome)
        index = client.follow(topic)
        rng = random.Random(25)
        outcomes: Counter[str] = Counter()
        sealed = 0
        while not stop.is_set():
            client.send(ipc.Blocks.TYPE, sealed, 1, False, 1000)
            message = client.recv(1000)
            while message is not None and not isinstance(message, ipc.Grant | ipc.GrantFailed):
                _count_reports(message, outcomes)
                message = client.recv(100)
            if not isinstance(message, ipc.Grant):
                outcomes[f"no block: {_kind(message)}"] += 1
                continue
            block = message.blocks[0]
            segment.blocks(block)[:GARBAGE_SEAL_BYTES] = rng.randbytes(GARBAGE_SEAL_BYTES)
            for other in message.blocks[1:]:
                client.send(ipc.Release.TYPE, [other])
            now_ms = int(time.time() * 1000)
            control.open(block, batch_id=sealed, topic_index=index, partition=sealed % PARTITIONS, block_count=1,
                         base_timestamp=now_ms, opened_ns=time.monotonic_ns())
            control.publish(block, 10, GARBAGE_SEAL_BYTES, now_ms, full=True)
            client.send(ipc.Wakeup.TYPE)
            sealed += 1
            stop.wait(GARBAGE_SEAL_INTERVAL_S)
        while (message := client.recv(200)) is not None:
            _count_reports(message, outcomes)
        return {"batches_sealed": sealed, "outcomes": dict(outcomes)}
    finally:
        if control is not None:
            control.release()
        if segment is not None:
            segment.close()
        client.close()


def wakeup_flood(endpoint: str, topic: str, stop: Any) -> dict[str, Any]:
    """A session whose batches wait in its blocks (one record each in the well-behaved client's topic, published,
    not due: its linger.ms is an hour), saying WAKEUP as fast as the daemon takes it: each has the daemon look at
    every block the session holds. The batches are claimed when the session ends, after the measurement."""
    from client_stub.contract import batch_slots, ipc
    from client_stub.fastpath import encode_record

    client = RawClient(endpoint, stop)
    segment = control = None
    try:
        welcome = client.hello()
        segment, control = client.map(welcome)
        index = client.follow(topic)
        control.set_header(batch_slots.LINGER_NS, 3600 * 10**9)
        client.send(ipc.Blocks.TYPE, 1, WAKEUP_FLOOD_BLOCKS, False, 10_000)
        grant = client.recv(10_000)
        while grant is not None and not isinstance(grant, ipc.Grant | ipc.GrantFailed):
            grant = client.recv(10_000)
        if not isinstance(grant, ipc.Grant):
            return {"error": f"no blocks: {_kind(grant)}"}
        now_ms = int(time.time() * 1000)
        for n, block in enumerate(grant.blocks):
            record = encode_record(0, 0, None, b"waiting-%d" % n, ())
            segment.blocks(block)[:len(record)] = record
            control.open(block, batch_id=n, topic_index=index, partition=n % PARTITIONS, block_count=1,
                         base_timestamp=now_ms, opened_ns=time.monotonic_ns())
            control.publish(block, 1, len(record), now_ms)
        wakeups = replies = 0
        while client.send(ipc.Wakeup.TYPE):
            wakeups += 1
            if wakeups % 1000 == 0:
                replies += client.drain()
        claimed = sum(bool(control.claim_word(block)) for block in grant.blocks)
        return {"wakeups_sent": wakeups, "batches_waiting": len(grant.blocks), "claimed_by_the_flood": claimed,
                "replies_read": replies}
    finally:
        if control is not None:
            control.release()
        if segment is not None:
            segment.close()
        client.close()


def _count_reports(message: Any, outcomes: Counter[str]) -> None:
    """Each delivery report by its error's Kafka name ("delivered" without one); other messages by kind."""
    from client_stub.contract import ipc

    if not isinstance(message, ipc.Delivery):
        outcomes[_kind(message)] += 1
        return
    for report in message.reports:
        error = report[5]
        outcomes["delivered" if error is None else f"failed: {error[2] or error[0]}"] += 1


def _kind(message: Any) -> str:
    if isinstance(message, bytes):
        return "undecodable"
    return type(message).__name__ if message is not None else "nothing"


HOSTILE: dict[str, Callable[[str, str, Any], dict[str, Any]]] = {
    "big-frame": big_frame, "unread-replies": unread_replies, "two-sockets": two_sockets,
    "metadata-flood": metadata_flood, "garbage-loop": garbage_loop, "garbage-seal": garbage_seal,
    "wakeup-flood": wakeup_flood,
}


def _hostile_main(case: str, endpoint: str, topic: str, warmed: Any, stop: Any, results: Any) -> None:
    """A hostile client's process: it waits for the well-behaved client's warm-up, acts until ``stop``,
    then puts what it did (or its error) on ``results``."""
    try:
        import zmq  # noqa: F401  (imported before the wait: the start is not the import's)

        import client_stub.contract.ipc  # noqa: F401

        while not warmed.wait(0.1):
            if stop.is_set():
                results.put({"error": "the well-behaved client never finished its warm-up"})
                return
        results.put(HOSTILE[case](endpoint, topic, stop))
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the whole process group: the parent reports it
    except BaseException as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


# -- one measurement ----------------------------------------------------------------------------

def memory_kb(pid: int) -> dict[str, int]:
    """VmHWM (the peak resident memory since the process started) and VmRSS of ``pid``, in KiB."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                found[name] = int(rest.split()[0])
    return found


def measure(case: str | None, duration: float) -> dict[str, Any]:
    """The well-behaved client beside ``case``'s hostile client (None: alone), on a fresh broker and daemon."""
    from tests.support.broker import TansuBroker

    name = case or "baseline"
    broker = TansuBroker()
    broker.start()
    try:
        warm_up(broker)
        topic = f"hostile-{name}-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        daemon = start_daemon(broker.bootstrap, "none")
        context = multiprocessing.get_context("spawn")
        warmed, stop, results = context.Event(), context.Event(), context.Queue()
        hostile = None
        try:
            started_kb = memory_kb(daemon.pid)["VmRSS"]
            if case is not None:
                hostile = context.Process(target=_hostile_main, name=f"hostile-{case}", daemon=True,
                                          args=(case, daemon.endpoint, topic, warmed, stop, results))
                hostile.start()
            monitor = Monitor(daemon.pid, broker._process.pid if broker._process else None, None, sampling=False)
            workload = Workload(topic, int(RATE * duration), RECORD_SIZE, 1, RATE, KEY_SIZE, KEY_COUNT,
                                duration_s=duration * 1.5, warmup_records=WARMUP_RECORDS)
            figures: dict[str, Any] = {"target_records": workload.num_records}
            try:
                result = run(workload, ADAPTER, {"endpoint": daemon.endpoint, "warmed": warmed},
                             out=lambda line: print(f"      {line}", flush=True), on_ready=monitor.ready,
                             ready_timeout_s=120.0, timeout_s=duration * 2 + FINAL_FLUSH_S + 90)
            except Exception as exc:
                figures["well_behaved_error"] = f"{type(exc).__name__}: {exc}"
            else:
                figures.update(result.summary())
                figures.update(monitor.finish(result))
                figures["unreported"] = result.sent - result.records - result.errors
            figures.update(daemon_figures(daemon, started_kb))
            if hostile is not None:
                figures["hostile_cpu_s"] = round(process_cpu_s(hostile.pid), 3) if hostile.pid else None
                stop.set()
                try:
                    figures["hostile"] = results.get(timeout=15)
                except Exception:
                    figures["hostile"] = {"error": "no report from the hostile client"}
            return figures
        finally:
            stop.set()
            if hostile is not None:
                _end(hostile)
            daemon.cleanup()
    finally:
        broker.stop()


def daemon_figures(daemon: Any, started_kb: int) -> dict[str, Any]:
    """The daemon's memory, whether it runs, and its own figures, at the end of a measurement."""
    running = daemon.is_running()
    figures: dict[str, Any] = {"daemon_running": running, "daemon_start_rss_mb": round(started_kb / 1024, 1)}
    if not running:
        figures["daemon_exit_code"] = daemon.process.returncode if daemon.process else None
        figures["daemon_log_tail"] = daemon.log_tail(20)
        return figures
    memory = memory_kb(daemon.pid)
    figures.update(daemon_peak_mb=round(memory["VmHWM"] / 1024, 1), daemon_final_mb=round(memory["VmRSS"] / 1024, 1),
                   daemon_growth_mb=round((memory["VmHWM"] - started_kb) / 1024, 1))
    try:
        figures["daemon_stats"] = daemon.stats(10.0)
    except Exception as exc:  # a daemon that no longer answers is a figure too
        figures["daemon_stats"] = {"error": f"{type(exc).__name__}: {exc}"}
    return figures


def _end(process: Any) -> None:
    """Join the hostile client's process; terminate, then kill, one that does not end."""
    process.join(10)
    if process.is_alive():
        process.terminate()
        process.join(5)
    if process.is_alive():
        process.kill()
        process.join(5)


# -- the table ----------------------------------------------------------------------------------

# The table's columns; _cells makes a row of them.
COLUMNS = ("case", "p50 ms", "p99 ms", "p99/base", "delivered/sent of target", "failed", "daemon peak MB", "final MB",
           "growth MB", "daemon CPU s", "hostile CPU s", "running")


def _cells(name: str, f: dict[str, Any], base_p99: float | None) -> list[str]:
    def num(key: str, fmt: str = "{:.1f}") -> str:
        value = f.get(key)
        return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"

    p99 = f.get("latency_p99_ms")
    ratio = f"{p99 / base_p99:.2f}" if isinstance(p99, (int, float)) and base_p99 else "-"
    if "records" not in f:
        delivered = "FAILED"
    else:  # of the target too: a client kept from sending falls short of it
        delivered = f"{f['records']:,.0f}/{f['sent']:,.0f} of {f['target_records']:,.0f}"
    return [name, num("latency_p50_ms", "{:.2f}"), num("latency_p99_ms", "{:.2f}"), ratio, delivered,
            num("errors", "{:,}"), num("daemon_peak_mb"), num("daemon_final_mb"), num("daemon_growth_mb"),
            num("cpu_s_daemon", "{:.2f}"), num("hostile_cpu_s", "{:.2f}"),
            {True: "yes", False: "NO"}.get(f.get("daemon_running"), "-")]


def table(measured: dict[str, dict[str, Any]]) -> str:
    """One row per measurement (the baseline first), then each case's daemon figures and hostile report."""
    base_p99 = (measured.get("baseline") or {}).get("latency_p99_ms")
    rows = [_cells(name, figures, base_p99) for name, figures in measured.items()]
    widths = [max(len(r[i]) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                              strict=True)))

    out = [line(COLUMNS), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)]
    for name, figures in measured.items():
        for key in ("daemon_stats", "hostile", "error", "well_behaved_error", "daemon_log_tail"):
            if key in figures:
                value = figures[key]
                out.append(f"{name} {key}: {value if isinstance(value, str) else json.dumps(value)}")
    return "\n".join(out)


def medians(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per measurement, the median of every numeric figure over the runs (failed ones left out)."""
    found: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(n for r in runs for n in r):
        values: dict[str, list[float]] = {}
        for r in runs:
            for key, value in r.get(name, {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(value)
        found[name] = {key: statistics.median(v) for key, v in values.items()}
        found[name]["daemon_running"] = all(r.get(name, {}).get("daemon_running") for r in runs)
    return found


# -- main ---------------------------------------------------------------------------------------

def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(HOSTILE), help="cases to run (default all): " + ", ".join(HOSTILE))
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--runs", type=int, default=1, help="how many times to run everything (default 1)")
    parser.add_argument("--json", default=None,
                        help="where to write the results (default tests/perf/results/hostile-<time>.json)")
    args = parser.parse_args(argv)
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(args.only) - set(HOSTILE)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; --only takes {', '.join(HOSTILE)}")
    if args.runs < 1 or args.duration <= 0:
        parser.error("--runs and --duration must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # SIGTERM ends the run as Ctrl-C does: every finally stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    json_path = results_path(args.json, "hostile")
    facts = machine_facts()
    print(f"hostile: {facts['cores']} cores ({facts['cpu']}), Python {facts['python']}, kafka-sidecar "
          f"{facts['kafka_sidecar']} (git {facts['git']['head'][:10]}"
          f"{', uncommitted changes' if facts['git']['modified'] else ''})", flush=True)
    report: dict[str, Any] = {
        "machine": facts,
        "settings": {"duration_s": args.duration, "runs": args.runs, "cases": args.only, "rate": RATE,
                     "record_size": RECORD_SIZE, "key_size": KEY_SIZE, "partitions": PARTITIONS,
                     "warmup_records": WARMUP_RECORDS, "max_block_ms": MAX_BLOCK_MS, "final_flush_s": FINAL_FLUSH_S},
        "runs": [],
    }
    failures = 0
    try:
        for run_index in range(args.runs):
            print(f"\n== run {run_index + 1} of {args.runs}", flush=True)
            measured: dict[str, dict[str, Any]] = {}
            report["runs"].append(measured)  # written after every measurement: an interrupted run keeps what it has
            for case in [None, *args.only]:
                name = case or "baseline"
                print(f"  {name} ...", flush=True)
                try:
                    measured[name] = measure(case, args.duration)
                except Exception as exc:
                    measured[name] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(f"  {name} FAILED: {measured[name]['error']}", file=sys.stderr, flush=True)
                failures += "error" in measured[name] or "well_behaved_error" in measured[name]
                base_p99 = measured.get("baseline", {}).get("latency_p99_ms")
                print("  " + ", ".join(f"{label} {cell}" for label, cell in
                                       zip(COLUMNS, _cells(name, measured[name], base_p99), strict=True)), flush=True)
                write_report(json_path, report)
            print(f"\nrun {run_index + 1}:\n{table(measured)}", flush=True)
        if args.runs > 1:
            report["median"] = medians(report["runs"])
            print(f"\nmedian of {args.runs} runs:\n{table(report['median'])}")
    finally:
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_report(json_path, report)
        print(f"\nresults: {json_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("hostile: interrupted", file=sys.stderr)
        sys.exit(130)
