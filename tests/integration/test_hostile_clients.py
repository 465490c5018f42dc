"""The daemon beside careless and hostile clients: what one process sends costs the others nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import Counter

import pytest
import zmq

from client_stub import Producer
from service.tools.readback import read_topic
from tests.support import workers

pytestmark = pytest.mark.broker

SPAWN = multiprocessing.get_context("spawn")


def peak_resident_mb(pid: int) -> float:
    """VmHWM: the most memory the process has held resident since it started."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_300_mib_frame_is_dropped_before_it_is_read(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    context = zmq.Context()
    hostile = context.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    delivered: list[int] = []
    try:
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            done = threading.Event()

            def well_behaved() -> None:
                # Beside the hostile client, all along: every record delivered.
                n = 0
                while not done.is_set():
                    futures = [producer.send(topic, b"good-%d" % m) for m in range(n, n + 1000)]
                    delivered.extend(f.result(30).offset >= 0 for f in futures)
                    n += 1000

            sender = threading.Thread(target=well_behaved)
            sender.start()
            hostile.connect(daemon.endpoint)
            hostile.send(bytes(300 << 20))
            time.sleep(3)  # ZeroMQ streams it out; the daemon drops the connection at its header
            done.set()
            sender.join(60)
            after = peak_resident_mb(daemon.pid)
        assert daemon.is_running()
    finally:
        hostile.close(0)
        context.term()
    # The frame never came into the daemon's memory (its peak grew by less than a tenth of it).
    assert after - before < 30, (before, after)
    assert delivered and all(delivered)
    values = {r.value for r in read_topic(broker.bootstrap, topic, expected=len(delivered) + 1)}
    assert values == {b"warm"} | {b"good-%d" % n for n in range(len(delivered))}


def test_a_client_stopped_past_the_client_timeout_gets_every_report_when_it_continues(broker, topic_factory, sidecar,
                                                                                     tmp_path) -> None:
    # SIGSTOP (a debugger, a paused container): the daemon takes it for silent and ends its session, keeping
    # the reports of what it sealed; when it continues, it takes the session back. Each record once.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap, settings={"sidecar.client.timeout.ms": 1000})
    results, client_log = tmp_path / "results.jsonl", tmp_path / "client.log"
    client = SPAWN.Process(target=workers.produce_paced,
                           args=(daemon.endpoint, topic, 0, 20_000, str(results), 6.0, str(client_log)))
    client.start()
    try:
        time.sleep(2.5)
        assert client.pid is not None and client.is_alive()
        os.kill(client.pid, signal.SIGSTOP)
        time.sleep(3.0)
        assert daemon.stats()["sessions_kept"] == 1, daemon.log_tail()
        os.kill(client.pid, signal.SIGCONT)
        client.join(120)
        assert client.exitcode == 0
    finally:
        if client.is_alive():
            client.kill()
            client.join()
    assert "silent for" in daemon.log_tail(200)
    assert "gave back the session it ended" in client_log.read_text()
    rows = workers.read_results(results)
    assert [r for r in rows if "error" in r] == []
    read = read_topic(broker.bootstrap, topic, expected=20_000)
    ids = [dict(r.headers)["id"] for r in read]
    assert sorted(ids) == sorted(f"0:{n}".encode() for n in range(20_000))  # each once
    assert daemon.stats()["sessions_kept"] == 0 and daemon.is_running()


def test_a_client_rewriting_its_sealed_blocks_hurts_only_its_own_records(broker, topic_factory, sidecar) -> None:
    """A client keeps rewriting the records it sealed while the daemon coalesces, checksums and sends them,
    beside a well-behaved client on the same partitions: the daemon stays up, logs no exception, and every
    well-behaved record is delivered; a consumer that checks CRCs reads the whole topic (Tansu checks no CRC:
    a batch sent unlike its CRC would be kept, and stop every reader of its partition there)."""
    partitions, count = 3, 20_000
    topic = topic_factory(partitions)
    daemon = sidecar(broker.bootstrap)
    rewriting = SPAWN.Event()
    hostile = SPAWN.Process(target=workers.rewrite_sealed_values, args=(daemon.endpoint, topic, partitions, rewriting))
    hostile.start()
    try:
        assert rewriting.wait(30), "the hostile client never rewrote a sealed block"
        with Producer(daemon.endpoint, linger_ms=1) as producer:
            futures = [producer.send(topic, b"good-%d" % n, partition=n % partitions) for n in range(count)]
            offsets = [f.result(60).offset for f in futures]
        assert hostile.is_alive(), "the hostile client stopped before the end"
    finally:
        hostile.kill()
        hostile.join()
    assert daemon.is_running()
    assert "Traceback" not in daemon.log_path.read_text(errors="replace")
    assert all(offset >= 0 for offset in offsets)
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=count, timeout=60)]
    good = Counter(v for v in values if v.startswith(b"good-"))
    assert good == Counter(b"good-%d" % n for n in range(count))
    # The hostile client's records went too, as whatever they held when the daemon read them.
    assert len(values) > count and all(len(v) == len(workers.HOSTILE_VALUE) for v in values if v not in good)
