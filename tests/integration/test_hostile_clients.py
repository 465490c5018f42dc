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
from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from service.tools.readback import read_topic
from tests.support import workers
from tests.support.sidecar import wait_until

pytestmark = pytest.mark.broker

SPAWN = multiprocessing.get_context("spawn")


def peak_resident_mb(pid: int) -> float:
    """VmHWM: the most memory the process has held resident since it started."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


class WellBehaved:
    """A client that sends records in a thread beside a hostile one, all along, waiting for each thousand."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer, self.topic = producer, topic
        self.delivered: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._send)

    def __enter__(self) -> WellBehaved:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(60)

    def _send(self) -> None:
        n = 0
        while not self._done.is_set():
            futures = [self.producer.send(self.topic, b"good-%d" % m) for m in range(n, n + 1000)]
            self.delivered.extend(f.result(30).offset for f in futures)
            n += 1000

    def check(self, bootstrap: str, *others: bytes) -> None:
        """Every record it sent was delivered, and is in the topic (beside ``others``)."""
        assert self.delivered and all(offset >= 0 for offset in self.delivered)
        values = {r.value for r in read_topic(bootstrap, self.topic, expected=len(self.delivered) + len(others))}
        assert values == set(others) | {b"good-%d" % n for n in range(len(self.delivered))}


def test_a_300_mib_frame_is_dropped_before_it_is_read(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    context = zmq.Context()
    hostile = context.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    try:
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            with WellBehaved(producer, topic) as good:
                hostile.connect(daemon.endpoint)
                hostile.send(bytes(300 << 20))
                time.sleep(3)  # ZeroMQ streams it out; the daemon drops the connection at its header
            after = peak_resident_mb(daemon.pid)
        assert daemon.is_running()
    finally:
        hostile.close(0)
        context.term()
    # The frame never came into the daemon's memory (its peak grew by less than a tenth of it).
    assert after - before < 30, (before, after)
    good.check(broker.bootstrap, b"warm")


def test_a_client_that_never_reads_its_replies_costs_the_daemon_a_bounded_memory(broker, topic_factory,
                                                                                   sidecar) -> None:
    # 20 000 requests refused, each answered with an ERROR and a GRANT_FAILED quoting a 10 KB field, and not
    # one read: the replies ZeroMQ will not queue wait in the session up to sidecar.client.reply.buffer.bytes
    # (8 MiB), then the session ends, with a log line naming the process.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    context = zmq.Context()
    hostile = context.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    memory = None
    try:
        hostile.connect(daemon.endpoint)
        hostile.send(ipc.encode(ipc.Hello(PROTOCOL_VERSION, os.getpid(), "never reads", ipc.HelloOptions())))
        assert hostile.poll(10_000)
        welcome = ipc.decode(hostile.recv())
        assert isinstance(welcome, ipc.Welcome)
        memory, fd = shared_memory.connect(shared_memory.memory_socket_path(daemon.endpoint, welcome.daemon_id),
                                           welcome.memory_token, 10.0)
        assert fd is not None
        os.close(fd)
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            with WellBehaved(producer, topic) as good:
                for request_id in range(20_000):
                    hostile.send(ipc.pack(ipc.Blocks.TYPE, request_id, "x" * 10_000, False, 1000))
                assert wait_until(lambda: daemon.stats()["sessions_ended_unread"] == 1, timeout=60)
            after = peak_resident_mb(daemon.pid)
        stats = daemon.stats()
        assert daemon.is_running()
    finally:
        hostile.close(0)
        context.term()
        if memory is not None:
            memory.close()
    assert stats["reply_buffer_bytes"] == 0 and stats["messages_refused"] >= 10_000
    assert f"(pid {os.getpid()}, uid {os.getuid()}, 'never reads') does not read its replies" in daemon.log_tail(200)
    # Bounded by the reply buffer and what ZeroMQ queues each way (340 MB before the bounds).
    assert after - before < 40, (before, after)
    good.check(broker.bootstrap, b"warm")


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
