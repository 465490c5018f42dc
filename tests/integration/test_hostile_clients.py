"""The daemon beside careless and hostile clients: what one process sends costs the others nothing."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import zmq
from confluent_kafka.admin import AdminClient

from client_stub import Producer
from client_stub.contract import batch_slots, ipc
from client_stub.errors import InvalidRecordError
from service.tools.readback import read_topic
from tests.support import workers
from tests.support.raw_session import RawSession
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.broker

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def hostile() -> Iterator[zmq.Socket]:
    """A DEALER of the test's, to speak to the daemon by hand (what no Producer would send); closed at the end."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    yield sock
    sock.close(0)
    context.term()


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
        """Every record it sent was delivered, and is in the topic once (beside ``others``)."""
        assert self.delivered and all(offset >= 0 for offset in self.delivered)
        values = [r.value for r in read_topic(bootstrap, self.topic, expected=len(self.delivered) + len(others))]
        assert sorted(values) == sorted([*others, *(b"good-%d" % n for n in range(len(self.delivered)))])


def test_a_300_mib_frame_is_dropped_before_it_is_read(broker, topic_factory, sidecar, hostile) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"warm").result(30)
        before = peak_resident_mb(daemon.pid)
        with WellBehaved(producer, topic) as good:
            hostile.connect(daemon.endpoint)
            hostile.send(bytes(300 << 20))
            time.sleep(3)  # ZeroMQ streams it out; the daemon drops the connection at its header
        after = peak_resident_mb(daemon.pid)
    assert daemon.is_running()
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
    unread = RawSession(daemon.endpoint, "never reads")
    try:
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            with WellBehaved(producer, topic) as good:
                for request_id in range(20_000):
                    unread.send(ipc.Blocks.TYPE, request_id, "x" * 10_000, False, 1000)
                assert wait_until(lambda: daemon.stats()["sidecar"]["sessions-ended-unread-total"] == 1, timeout=60)
            after = peak_resident_mb(daemon.pid)
        stats = daemon.stats()
        assert daemon.is_running()
    finally:
        unread.close()
    assert stats["sidecar"]["reply-buffer-bytes"] == 0 and stats["sidecar"]["messages-refused-total"] >= 10_000
    assert f"(pid {os.getpid()}, uid {os.getuid()}, 'never reads') does not read its replies" in daemon.log_tail(200)
    # Bounded by the reply buffer and what ZeroMQ queues each way (340 MB before the bounds).
    assert after - before < 40, (before, after)
    good.check(broker.bootstrap, b"warm")


TWO_SESSIONS_TAKING_THE_POOL = """
import os, sys, time
import zmq
from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
endpoint = sys.argv[1]
context = zmq.Context()
held = []
for n in range(2):
    sock = context.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(ipc.encode(ipc.Hello(PROTOCOL_VERSION, os.getpid(), f"greedy-{n}", ipc.HelloOptions())))
    welcome = ipc.decode(sock.recv())
    path = shared_memory.memory_socket_path(endpoint, welcome.daemon_id)
    conn, fd = shared_memory.connect(path, welcome.memory_token, 10.0)
    sock.send(ipc.pack(ipc.Blocks.TYPE, 1, welcome.block_count, False, 3_600_000))
    held.append((sock, conn))
print("asked", flush=True)
time.sleep(3600)  # until the test kills it
"""


def test_two_sessions_of_one_process_take_at_most_the_share_of_one(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    greedy = subprocess.Popen([sys.executable, "-c", TWO_SESSIONS_TAKING_THE_POOL, daemon.endpoint],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert greedy.stdout is not None and greedy.stdout.readline() == "asked\n"
        pool = daemon.stats()
        share = pool["sidecar"]["blocks-total"] // 2  # client_block_limit: half the pool, for a process
        assert wait_until(lambda: sum(held for _, pid, held in daemon.stats()["clients"] if pid == greedy.pid)
                          == share)
        with Producer(daemon.endpoint) as producer, WellBehaved(producer, topic) as good:
            time.sleep(2)
        held = [held for _, pid, held in daemon.stats()["clients"] if pid == greedy.pid]
        assert len(held) == 2 and sum(held) == share, held
        assert daemon.is_running()
    finally:
        greedy.kill()
        greedy.wait()
    good.check(broker.bootstrap)


def test_a_flood_of_new_topic_names_creates_a_few_a_minute(broker, topic_factory, sidecar) -> None:
    # 5 000 METADATA requests for names the cluster does not have, from one session that does not wait for
    # answers: a process waits for at most 100 such names at once, and the cluster creates 5 a minute.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap, settings={"sidecar.auto.create.topics.per.minute": 5})
    prefix = f"flood-{uuid.uuid4().hex[:8]}"
    refused = 0
    flood = RawSession(daemon.endpoint, "flood")
    try:
        with Producer(daemon.endpoint) as producer:
            # Its topic known to the daemon first: this process's other session shares its limits.
            producer.send(topic, b"warm").result(30)
            good = WellBehaved(producer, topic)
            with good:
                flooded = time.monotonic()
                for n in range(5000):
                    flood.send(ipc.Metadata.TYPE, f"{prefix}-{n}")
                # Every refusal, however long the daemon takes (64 of one client's messages a loop turn),
                # and a moment for any beyond the bound.
                deadline = time.monotonic() + HANG_S
                while time.monotonic() < deadline:
                    if refused >= 4900 - 5:
                        deadline = min(deadline, time.monotonic() + 0.5)
                    if flood.sock.poll(100):
                        message = ipc.decode(flood.sock.recv())
                        refused += isinstance(message, ipc.Topic) and message.error is not None and \
                            "sidecar.process.max.unknown.topics" in str(ipc.error_from_wire(message.error))
        stats = daemon.stats()
        assert daemon.is_running()
    finally:
        flood.close()
    # The first 100 wait; the others are refused, but for as many as were created meanwhile (their places
    # among the 100 came free).
    assert 4900 - 5 <= refused <= 4900
    assert 0 < stats["sidecar"]["topics-awaiting-creation"] <= 100
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": False})
    created = [name for name in admin.list_topics(timeout=HANG_S).topics if name.startswith(prefix)]
    # The rate: 5 in any minute (the test takes less than one, unless the machine is busy).
    assert 0 < len(created) <= 5 * (1 + int((time.monotonic() - flooded) // 60)), created
    good.check(broker.bootstrap, b"warm")


def test_garbage_and_wakeups_at_full_speed_cost_the_others_nothing_but_a_share_of_the_loop(broker, topic_factory,
                                                                                           sidecar, hostile) -> None:
    # As fast as the daemon takes them, beside a well-behaved client: garbage from a DEALER without a session (each
    # message refused), and WAKEUPs from a session whose batches wait in its blocks, not due (its linger.ms: an
    # hour): each WAKEUP has the daemon look at every block it holds, and claim nothing.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    rng = random.Random(25)
    garbage = [rng.randbytes(rng.randrange(1, 300)) for _ in range(64)] + [
        ipc.pack(999), ipc.pack(ipc.Blocks.TYPE, "one", -1, "no", None), ipc.pack(3, "notices"),  # 3: the old SEAL
        ipc.pack(ipc.Wakeup.TYPE, "now"), ipc.pack(ipc.LastSeal.TYPE, [])]
    sent = 0
    hostile.connect(daemon.endpoint)
    waker = RawSession(daemon.endpoint, "waker")
    try:
        index = waker.follow(topic)
        waker.control.set_header(batch_slots.LINGER_NS, 3600 * 10**9)
        blocks = waker.blocks(64)
        waiting = [b"waiting-%d" % n for n in range(len(blocks))]
        for n, (block, value) in enumerate(zip(blocks, waiting, strict=True)):
            waker.publish(block, batch_id=n, topic_index=index, partition=n % 3,
                          length=waker.write_record(block, value), full=False)
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            with WellBehaved(producer, topic) as good:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    for message in garbage:
                        hostile.send(message)
                        sent += 1
                        waker.wakeup()
            after = peak_resident_mb(daemon.pid)
        # Every WAKEUP taken (a client's messages are taken in order), and not one of its batches claimed.
        waker.refused(ipc.Wakeup.TYPE, "last", reason="WAKEUP has 0 fields, got 1")
        assert [waker.control.claim_word(block) for block in blocks] == [0] * len(blocks)
        assert daemon.is_running()
    finally:
        waker.close()  # its session ends: the daemon claims what it published
    # Each message of garbage refused, however long the daemon takes to get through them.
    assert wait_until(lambda: daemon.stats()["sidecar"]["messages-refused-total"] >= sent)
    assert after - before < 40, (before, after)
    good.check(broker.bootstrap, b"warm", *waiting)


def test_a_client_stopped_past_the_client_timeout_gets_every_report_when_it_continues(broker, topic_factory, sidecar,
                                                                                     tmp_path) -> None:
    # SIGSTOP (a debugger, a paused container): the daemon takes it for silent and ends its session, claiming
    # what it published and keeping the reports; when it continues, it takes the session back. Each record once.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap, settings={"sidecar.client.timeout.ms": 1000})
    results, client_log = tmp_path / "results.jsonl", tmp_path / "client.log"
    client = SPAWN.Process(target=workers.produce_paced,
                           args=(daemon.endpoint, topic, 0, 20_000, str(results), 6.0, str(client_log)))
    client.start()
    try:
        # Stopped while it sends (over 6 s), once the daemon has some of its batches.
        assert wait_until(lambda: daemon.stats()["sidecar"]["records-sealed-total"] >= 2000)
        assert client.pid is not None and client.is_alive()
        os.kill(client.pid, signal.SIGSTOP)
        assert wait_until(lambda: daemon.stats()["sidecar"]["sessions-kept"] == 1), daemon.log_tail()
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
    assert daemon.stats()["sidecar"]["sessions-kept"] == 0 and daemon.is_running()


def test_a_client_rewriting_its_claimed_batches_hurts_only_its_own_records(broker, topic_factory, sidecar) -> None:
    """A client keeps rewriting the records of its batches the daemon claimed while it coalesces, checksums and
    sends them, beside a well-behaved client on the same partitions: the daemon stays up, logs no exception, and
    every well-behaved record is delivered; a consumer that checks CRCs reads the whole topic (Tansu checks no
    CRC: a batch sent unlike its CRC would be kept, and stop every reader of its partition there)."""
    partitions, count = 3, 20_000
    topic = topic_factory(partitions)
    daemon = sidecar(broker.bootstrap)
    rewriting = SPAWN.Event()
    hostile = SPAWN.Process(target=workers.rewrite_claimed_values, args=(daemon.endpoint, topic, partitions, rewriting))
    hostile.start()
    try:
        assert rewriting.wait(HANG_S), "the hostile client never rewrote a claimed batch"
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


def test_a_client_publishing_garbage_fails_its_own_batches_alone(broker, topic_factory, sidecar) -> None:
    """A client overwrites the records of its open batches with bytes that are no records before the daemon claims
    them (at its flush: they linger an hour), between the batches of a well-behaved client on the same partitions.
    Each garbage batch fails alone, with CORRUPT_MESSAGE to its client, before the daemon sends it: the
    well-behaved records are all delivered and read back with CRCs checked (a broker refusing the garbage would
    have renumbered them; Tansu would have kept it, and stopped every reader of its partition there), the daemon
    logs no exception, and every block comes back."""
    partitions, count = 3, 6000
    topic = topic_factory(partitions)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint, linger_ms=1) as good, Producer(daemon.endpoint, linger_ms=3_600_000) as hostile:
        futures = [good.send(topic, b"good-%d" % n, partition=n % partitions) for n in range(count // 2)]
        garbage = [hostile.send(topic, workers.HOSTILE_VALUE, partition=n % partitions) for n in range(30)]
        with hostile._lock:  # its open batches, one per partition, as its send() leaves them
            segment, batches = hostile._io.segment, list(hostile._accumulator.open.values())
            for batch in batches:
                segment.blocks(batch.first_block, batch.block_count)[:batch.pos] = b"\xaa" * batch.pos
        assert len(batches) == partitions
        hostile.flush(timeout=0)  # closes them and says WAKEUP: the daemon claims them
        futures += [good.send(topic, b"good-%d" % n, partition=n % partitions) for n in range(count // 2, count)]
        offsets = [f.result(60).offset for f in futures]
        errors = [f.exception(60) for f in garbage]
    assert all(offset >= 0 for offset in offsets)
    assert all(type(e) is InvalidRecordError and (e.code, e.name) == (2, "CORRUPT_MESSAGE") for e in errors), errors
    assert all("not 10 well-formed records (record 0, byte 0 of" in e.message for e in errors), errors[0]
    assert daemon.is_running()
    assert "Traceback" not in daemon.log_path.read_text(errors="replace")
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=count, timeout=60)]
    assert sorted(values) == sorted(b"good-%d" % n for n in range(count))
    assert wait_until(lambda: not daemon.held())
    stats = daemon.stats()
    sidecar = stats["sidecar"]
    assert sidecar["blocks-free"] == sidecar["blocks-total"] and sidecar["batches-corrupt-total"] == partitions, stats
