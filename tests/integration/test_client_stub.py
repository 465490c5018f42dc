"""Applications produce through a real daemon process: the client stub, the BufferPool, the front.

Everything here runs the real parts: a daemon started with the CLI, client
processes (spawned, forked, killed), the Tansu broker or librdkafka's mock
cluster, and the confluent-kafka verifier reading back what arrived.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import Future

import confluent_kafka
import msgpack
import pytest
import zmq

import client_stub.producer
from client_stub import Producer, RecordMetadata
from client_stub.contract import PROTOCOL_VERSION, batch_slots, ipc
from client_stub.errors import BufferExhaustedError, KafkaTimeoutError, RecordTooLargeError, SidecarUnavailableError
from service.tools.readback import ConsumedRecord, read_topic
from tests.support import workers
from tests.support.raw_session import TIMESTAMP_MS, RawSession
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import HANG_S, wait_until

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")


def by_id(consumed: list[ConsumedRecord]) -> dict[str, ConsumedRecord]:
    records: dict[str, ConsumedRecord] = {}
    for record in consumed:
        ident = dict(record.headers)["id"].decode()
        assert ident not in records, f"record {ident} read twice"
        records[ident] = record
    return records


def check_client_records(client: int, count: int, results: list[dict], read: dict[str, ConsumedRecord],
                         big_at: int | None = None) -> None:
    """Every record of a client arrived once, intact, where its RecordMetadata says, in order."""
    assert [r["n"] for r in results] == list(range(count))
    last_offset: dict[int, int] = {}
    for result in results:
        n = result["n"]
        assert "error" not in result, result
        sent = workers.record(client, n, big_at)
        got = read.pop(f"{client}:{n}")
        assert got.key == sent["key"] and got.value == sent["value"], f"record {client}:{n}"
        assert got.headers == sent["headers"]
        if sent["timestamp_ms"] is not None:
            assert got.timestamp_ms == sent["timestamp_ms"]
        assert (got.partition, got.offset, got.timestamp_ms) == \
            (result["partition"], result["offset"], result["timestamp_ms"])
        assert (result["key_size"], result["value_size"]) == (
            -1 if sent["key"] is None else len(sent["key"]), -1 if sent["value"] is None else len(sent["value"]))
        assert got.offset > last_offset.get(got.partition, -1), "order per client and partition"
        last_offset[got.partition] = got.offset


def test_four_processes_send_50k_records_each(broker, topic_factory, sidecar, tmp_path) -> None:
    topic = topic_factory(6)
    daemon = sidecar(broker.bootstrap)
    count = 50_000
    processes = []
    for client in range(4):
        big_at = count // 2 if client == 0 else None
        p = SPAWN.Process(target=workers.produce_numbered,
                          args=(daemon.endpoint, topic, client, count, str(tmp_path / f"{client}.jsonl"), big_at))
        p.start()
        processes.append(p)
    for p in processes:
        p.join(300)
        assert p.exitcode == 0
    read = by_id(read_topic(broker.bootstrap, topic, expected=4 * count, timeout=120))
    for client in range(4):
        results = workers.read_results(tmp_path / f"{client}.jsonl")
        check_client_records(client, count, results, read, count // 2 if client == 0 else None)
    assert not read, f"{len(read)} records nobody sent"
    assert daemon.is_running()


def test_keys_land_where_confluent_kafka_murmur2_random_puts_them(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(6)
    daemon = sidecar(broker.bootstrap)
    keys = [f"key-{i}".encode() for i in range(300)] + [os.urandom(n) for n in range(1, 40)]
    with Producer(daemon.endpoint) as producer:
        ours = [producer.send(topic, b"x", key=k).result(30).partition for k in keys]
    theirs: dict[bytes, int] = {}
    reference = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        reference.produce(topic, b"y", key=key,
                          on_delivery=lambda err, msg: theirs.__setitem__(msg.key(), msg.partition()))
    assert reference.flush(30) == 0
    assert ours == [theirs[k] for k in keys]
    assert len(set(ours)) == 6


def _send_in_child(producer: Producer, topic: str, child: int, queue, send=None) -> None:
    """500 records from a forked child, by ``producer.send`` (the child's), or by ``send``, bound before the fork."""
    send = send or producer.send
    futures = [send(topic, f"child{child}-{n}".encode(), key=f"c{child}".encode()) for n in range(500)]
    producer.flush(60)
    queue.put((child, os.getpid(), [f.result(60).offset for f in futures]))


def test_producer_made_before_fork_works_in_four_children(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(4)
    daemon = sidecar(broker.bootstrap)
    producer = Producer(daemon.endpoint)
    producer.send(topic, b"parent-before").result(30)
    queue = FORK.Queue()
    children = [FORK.Process(target=_send_in_child, args=(producer, topic, c, queue)) for c in range(4)]
    results = workers.run_children(children, queue)
    assert sorted(c for c, _, _ in results) == [0, 1, 2, 3]
    assert all(offsets == sorted(offsets) and min(offsets) >= 0 for _, _, offsets in results)
    producer.send(topic, b"parent-after").result(30)
    producer.close()
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=2 + 4 * 500)]
    assert values.count(b"parent-before") == 1 and values.count(b"parent-after") == 1
    for child in range(4):
        assert [v for v in values if v.startswith(f"child{child}-".encode())] == \
            [f"child{child}-{n}".encode() for n in range(500)]


# A parent with a session forks a child that lives on (and never produces), then waits to be killed: both
# live until the test kills them (an hour bounds what a test that died leaves behind).
PARENT_THAT_FORKS = """
import os, sys, time
from client_stub import Producer
producer = Producer(sys.argv[1])
producer.send(sys.argv[2], b"parent").result(30)
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)
print(os.getpid(), child, flush=True)
time.sleep(3600)
"""


def test_a_parent_that_dies_is_seen_gone_while_its_forked_child_lives(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    parent = subprocess.Popen([sys.executable, "-c", PARENT_THAT_FORKS, daemon.endpoint, topic],
                              stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    child = None
    try:
        parent_pid, child = map(int, parent.stdout.readline().split())
        client = daemon.client_id_of(parent_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # The child closed its copy of the parent's connection at the fork: the parent's end is the
        # connection's, not sidecar.client.timeout.ms (the log says which).
        assert wait_until(lambda: client not in [c for c, _, _ in daemon.stats()["clients"]])
        assert f"client {client} (pid {parent_pid}, " in daemon.log_tail(50) and "is gone" in daemon.log_tail(50)
        os.kill(child, 0)  # the child still lives
    finally:
        parent.kill()
        parent.wait()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_records_the_parent_holds_at_fork_stay_the_parents(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(4)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:
        # Published in the parent's open batches, not claimed (linger_ms), not reported when the children fork.
        held = [producer.send(topic, f"parent-{n}".encode(), partition=n % 4) for n in range(100)]
        assert len(producer) == 100
        queue = FORK.Queue()
        # Two children send by a send() bound before the fork: it must not write into the parent's batches.
        bound = producer.send
        children = [FORK.Process(target=_send_in_child, args=(producer, topic, c, queue, bound if c >= 2 else None))
                    for c in range(4)]
        workers.run_children(children, queue)
        assert len(producer) == 100 and not any(f.done() for f in held)
        assert producer.flush(30) == 0
        assert all(f.result().offset >= 0 for f in held)
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=100 + 4 * 500)]
    assert sorted(v for v in values if v.startswith(b"parent-")) == sorted(f"parent-{n}".encode() for n in range(100))
    for child in range(4):
        assert [v for v in values if v.startswith(f"child{child}-".encode())] == \
            [f"child{child}-{n}".encode() for n in range(500)]


def wait_for_held(daemon: SidecarProcess, done, timeout: float = HANG_S) -> dict[int, int]:
    """The blocks each client holds, as the daemon counts them, once ``done(held)`` holds (or at the timeout)."""
    deadline = time.monotonic() + timeout
    held = daemon.held()
    while not done(held) and time.monotonic() < deadline:
        time.sleep(0.1)
        held = daemon.held()
    return held


def test_killed_client_records_delivered_blocks_reclaimed(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    victim = subprocess.Popen([sys.executable, "-m", "tests.support.workers", daemon.endpoint, topic, "7", "3000"],
                              stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        with Producer(daemon.endpoint) as survivor:
            first = [survivor.send(topic, f"survivor-{n}".encode(), headers={"id": f"9:{n}"}) for n in range(2000)]
            assert victim.stdout.readline().strip() == f"PID {victim.pid}"
            assert victim.stdout.readline().strip() == "FLUSHED 3000"
            # Its WAKEUP reached the daemon, which claimed the batches it published full: of the records sealed, the
            # survivor's are 2000 at most.
            assert wait_until(lambda: daemon.stats()["sidecar"]["records-sealed-total"] >= 3000 + 2000)
            victim_client = daemon.client_id_of(victim.pid)
            # It is writing records now: it holds blocks, of its open batches and of those claimed on the way.
            assert wait_for_held(daemon, lambda held: held.get(victim_client, 0) > 0).get(victim_client, 0) > 0
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            second = [survivor.send(topic, f"survivor-{n}".encode(), headers={"id": f"9:{n}"})
                      for n in range(2000, 4000)]
            assert survivor.flush(60) == 0
            assert all(f.result(30).offset >= 0 for f in first + second)
        # Its end claimed what it published; its spare blocks are reclaimed, the others come back once their
        # batches are delivered: nothing is the victim's.
        assert victim_client not in wait_for_held(daemon, lambda held: victim_client not in held)
        # Nobody is connected any more: the whole pool is free.
        assert wait_for_held(daemon, lambda held: not held) == {}
        stats = daemon.stats()
        assert stats["sidecar"]["blocks-free"] == stats["sidecar"]["blocks-total"]
    finally:
        victim.kill()
        victim.wait()
    read = by_id(read_topic(broker.bootstrap, topic, expected=3000 + 4000))
    victims = {int(i.split(":")[1]) for i in read if i.startswith("7:")}
    # Every record it wrote arrived, once: those it flushed, and those it published in its open batches until it
    # was killed (claimed at its end); the one it was writing as it was killed, or not.
    assert len(victims) >= 3000 and victims == set(range(len(victims)))
    assert sorted(int(i.split(":")[1]) for i in read if i.startswith("9:")) == list(range(4000))
    assert daemon.is_running()


def test_exhausted_pool_raises_after_max_block_ms_and_recovers(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("tiny", 1)
    daemon = sidecar(proxy.address, settings={"buffer.memory": 4 * 16384, "request.timeout.ms": 2000,
                                              "delivery.timeout.ms": 120000, "retry.backoff.ms": 50})
    with Producer(daemon.endpoint, max_block_ms=1000, linger_ms=0) as producer:
        producer.send("tiny", b"warm").result(30)
        proxy.blackhole()
        futures = []
        started = time.monotonic()
        with pytest.raises(BufferExhaustedError):
            while time.monotonic() - started < 30:
                sending = time.monotonic()
                futures.append(producer.send("tiny", b"v" * 8000))
        assert time.monotonic() - started < 30
        assert time.monotonic() - sending >= 1.0, "send() gave up before max_block_ms"
        proxy.heal()
        assert all(f.result(60).offset >= 0 for f in futures)
        later = producer.send("tiny", b"after").result(30)
        assert later.offset >= len(futures)
    values = [r.value for r in read_topic(proxy.address, "tiny", expected=len(futures) + 2)]
    assert values.count(b"v" * 8000) == len(futures)


def test_a_slow_broker_makes_batches_bigger_not_more_numerous(proxied_broker, sidecar) -> None:
    # As in the Java producer, what has lingered but cannot be sent yet grows: while reports are slow
    # (here 600 ms, linger.ms 5), the daemon claims a client's batch every linger_ms, and those queued
    # behind the partition's requests in flight go coalesced, not a request each.
    tansu, proxy = proxied_broker
    tansu.create_topic("slow", 1)
    daemon = sidecar(proxy.address, settings={"linger.ms": 5})
    with Producer(daemon.endpoint) as producer:
        producer.send("slow", b"warm").result(30)
        proxy.delay(300)
        before = proxy.requests_forwarded.get(0, 0)
        futures = []
        started = time.monotonic()
        for n in range(200):
            futures.append(producer.send("slow", b"%d" % n))
            time.sleep(0.005)  # 200 records over about 1 s: a request per record if each claimed batch went alone
        sending_s = time.monotonic() - started
        offsets = [f.result(60).offset for f in futures]
        produce_requests = proxy.requests_forwarded.get(0, 0) - before
    assert offsets == list(range(offsets[0], offsets[0] + 200))
    # At most 20 requests for a second of sends (a few round trips of 600 ms), more only as the sends took longer.
    assert produce_requests <= 20 * max(sending_s, 1.0), f"{produce_requests} requests for 200 records in {sending_s} s"
    values = [r.value for r in read_topic(proxy.address, "slow", expected=201)]
    assert values == [b"warm"] + [b"%d" % n for n in range(200)]


def test_a_partition_pipelines_its_batches_while_reports_come_back_in_time(proxied_broker, sidecar) -> None:
    # A produce round trip of 1 s, between linger_ms and twice that: the daemon and the broker keep up,
    # and the next batch of the partition goes at linger_ms, while the previous one awaits its
    # response. (Held for the previous batch's report, it would wait about 200 ms longer, and one
    # produce request would be outstanding at a time.)
    tansu, proxy = proxied_broker
    tansu.create_topic("quick", 1)
    daemon = sidecar(proxy.address, settings={"linger.ms": 600})
    with Producer(daemon.endpoint) as producer:
        producer.send("quick", b"warm").result(30)
        proxy.delay(500)
        first = producer.send("quick", b"first")
        # The daemon claims its batch at 600 ms, and it reaches the proxy; its response comes back 1 s later.
        assert wait_until(lambda: proxy.produce_requests_outstanding == 1)
        second = producer.send("quick", b"second")  # a new batch, claimed 600 ms later, before that response
        offsets = [first.result(30).offset, second.result(30).offset]
    assert offsets == [1, 2]
    assert proxy.most_produce_requests_outstanding == 2
    assert [r.value for r in read_topic(proxy.address, "quick", expected=3)] == [b"warm", b"first", b"second"]


def _int64(word: int) -> int:
    """A 64-bit word as the daemon reads a signed field of a slot."""
    return word - (1 << 64) if word >= 1 << 63 else word


def test_ten_thousand_hostile_messages_leave_the_daemon_serving(broker, topic_factory, sidecar) -> None:
    topic, hostile_topic = topic_factory(3), topic_factory(1)
    daemon = sidecar(broker.bootstrap, transport="tcp")
    results: list[RecordMetadata] = []

    def well_behaved() -> None:
        with Producer(daemon.endpoint) as producer:
            futures = []
            for chunk in range(100):  # over a second or more: while the abuse goes on
                futures += [producer.send(topic, f"good-{n}".encode()) for n in range(chunk * 100, chunk * 100 + 100)]
                time.sleep(0.01)
            producer.flush(120)
            results.extend(f.result() for f in futures)

    context = zmq.Context()
    # Sessions that own blocks abuse them: they name blocks not granted to them, and publish in their slots what
    # no producer would (another client's blocks and slots are in its own segment: nothing of this one names them).
    abuser = RawSession(daemon.endpoint, "hostile-owner", context=context)
    other = RawSession(daemon.endpoint, "hostile-owner", context=context)
    # Followed first: the daemon's metadata has its partitions from then on (Tansu answers a request for no topic
    # with every topic, and the answer to a request made before a topic was followed would not have it).
    index = abuser.follow(hostile_topic)
    worker = threading.Thread(target=well_behaved)
    worker.start()
    words = random.Random(39)
    sealed = 0
    refused: list[int] = []  # batch ids of the garbage the daemon must refuse, each with a failed report
    corrupt: list[int] = []  # and of the garbage it finds out only when it reads the records
    for round_ in range(100):
        mine, theirs = sorted(abuser.blocks(9)), other.blocks(2)
        abuser.refused(ipc.Release.TYPE, [mine[0], mine[0]], reason="named more than once")
        abuser.send(ipc.Release.TYPE, [mine[0]])
        abuser.refused(ipc.Release.TYPE, [mine[0]], reason="not granted")
        abuser.refused(ipc.Release.TYPE, [max(mine) + 1], reason="not granted")
        # Valid batches in the slots of blocks it does not hold (one it gave back, one never granted to it):
        # never read, never claimed, never sent.
        not_mine = [mine[0], abuser.block_count - 1 - round_]
        for n, block in enumerate(not_mine):
            length = abuser.write_record(block, f"unread-{round_}-{n}".encode())
            abuser.publish(block, batch_id=20_000 + 2 * round_ + n, topic_index=index, length=length)
        # A valid batch of its own, published full: claimed at its WAKEUP, and delivered.
        valid_length = abuser.write_record(mine[1], f"hostile-{round_}".encode())
        abuser.publish(mine[1], batch_id=round_, topic_index=index, length=valid_length)
        sealed += 1
        # Garbage in the slots of its own blocks, each claimed when the daemon next looks (at its WAKEUP at the
        # latest) and refused alone, with its report. A refused batch's blocks, as many as it names, go back to the
        # pool: the huge block count is published last, below the batch of any words (whose count may be negative).
        first_id = 1_000_000 + 10 * round_
        anything = {"batch_id": words.getrandbits(64), "topic_index": words.getrandbits(32),
                    "partition": words.getrandbits(32), "length": words.getrandbits(32),
                    "records": words.getrandbits(31) | 1, "block_count": words.getrandbits(64),
                    "opened_ns": words.getrandbits(64), "timestamp_ms": words.getrandbits(63)}
        garbage = [  # (what is wrong, why the daemon refuses it: None if it finds out only as it reads the records)
            ({"length": abuser.segment.layout.block_size + 1}, "length must be an integer in [1, "),
            ({"topic_index": 12345}, "no topic is number 12345 of this session: it follows 1"),
            ({"partition": 7}, f"partition 7 of topic {hostile_topic} does not exist: it has 1"),
            ({"records": 5}, None),  # a count that lies: one record is there
            # Any 64-bit words at all (but for its claim, which is the daemon's to write, and a record at least).
            (anything, f"no topic is number {anything['topic_index']} of this session"),
            ({"block_count": 2**63 - 1}, "block_count must be an integer in [1, "),
        ]
        for n, (block, (fields, reason)) in enumerate(zip([*mine[3:7], mine[8], mine[7]], garbage, strict=True)):
            length = abuser.write_record(block, f"garbage-{round_}".encode())
            batch = {"batch_id": first_id + n, "topic_index": index, "length": length, **fields}
            abuser.publish(block, **batch)
            (corrupt if reason is None else refused).append(_int64(batch["batch_id"]))
        abuser.wakeup()
        errors = [abuser.expect(ipc.Error.TYPE)[2] for _ in range(5)]
        assert all(error.startswith("batch refused: ") for error in errors), errors
        assert all(sum(reason in error for error in errors) == 1 for _, reason in garbage if reason), errors
        # Each of its blocks that the daemon claimed, or freed as it refused their batch, is not the client's any
        # more: it counts a failed batch as finished.
        for block in [mine[1], *mine[3:]]:
            abuser.refused(ipc.Release.TYPE, [block], reason="not granted")
        assert abuser.control.claim_word(mine[1]) == batch_slots.CLAIMED | 1
        # Its claimed batch published again: not read again (it is delivered once).
        abuser.control.publish(mine[1], 1, valid_length, TIMESTAMP_MS, full=True)
        abuser.wakeup()
        # The old SEAL (type 3) naming a batch written in its block: an unknown message; the block stays its own.
        length = abuser.write_record(mine[2], f"unsealed-{round_}".encode())
        abuser.refused(3, [[round_, mine[2], 1, hostile_topic, 0, 1, length, TIMESTAMP_MS, TIMESTAMP_MS, 0]],
                       reason="unknown message type 3")
        abuser.refused(ipc.Wakeup.TYPE, "now", reason="WAKEUP has 0 fields, got 1")
        abuser.refused(ipc.LastSeal.TYPE, [], reason="LASTSEAL has 0 fields, got 1")
        # The sequence that once crashed the daemon: a block released thrice, then more requests.
        abuser.refused(ipc.Release.TYPE, [mine[2], mine[2], mine[2]], reason="named more than once")
        abuser.send(ipc.Release.TYPE, [mine[2]])
        other.send(ipc.Release.TYPE, theirs)
        # What it published where it held no block was never claimed; cleared before it may be granted again.
        assert [abuser.control.claim_word(block) for block in not_mine] == [0, 0]
        for block in not_mine:
            abuser.clear(block)
    rng = random.Random(1)
    hostile = [context.socket(zmq.DEALER) for _ in range(4)]
    for sock in hostile:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(daemon.endpoint)
    # One hostile client says hello properly and then abuses its session.
    hostile[0].send(ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), "hostile", {}))
    for i in range(10_000):
        sock = hostile[i % 4]
        choice = i % 8
        if choice == 0:
            payload = os.urandom(rng.randrange(0, 200))
        elif choice == 1:
            payload = msgpack.packb([rng.randrange(-5, 300)] + [rng.random() for _ in range(rng.randrange(5))])
        elif choice == 2:
            # The old SEAL, WAKEUP and LASTSEAL with fields they do not have, and WAKEUPs.
            payload = rng.choice([
                ipc.pack(3, [[i, rng.randrange(0, 5000), rng.randrange(-3, 9), topic, rng.randrange(-1, 4),
                              rng.randrange(-1, 9), rng.randrange(-1, 99999), 0, 0, 0]]),
                ipc.pack(ipc.Wakeup.TYPE, *[rng.randrange(-1, 9) for _ in range(rng.randrange(1, 4))]),
                ipc.pack(ipc.LastSeal.TYPE, [rng.randrange(-1, 5000)]),
                ipc.pack(ipc.Wakeup.TYPE)])
        elif choice == 3:
            payload = ipc.pack(ipc.Blocks.TYPE, i, rng.choice([-1, 0, 10**9, "x"]), True, 10)
        elif choice == 4:
            payload = ipc.pack(ipc.Release.TYPE, [rng.randrange(0, 2048) for _ in range(3)])
        elif choice == 5:
            payload = ipc.pack(ipc.Hello.TYPE, rng.randrange(2, 99), -5, None, [])
        elif choice == 6:
            payload = ipc.pack(ipc.Metadata.TYPE, "../" * rng.randrange(1, 90))
        else:
            sock.send_multipart([b"extra", os.urandom(10)])
            continue
        sock.send(payload)
    worker.join(180)
    # Every batch of the abuser's has its report: its valid ones delivered, each once; its garbage failed, each
    # once, the records read as records refused as corrupt; nothing of what it published in blocks not its own.
    expected = Counter([*range(sealed), *refused, *corrupt])
    while expected - Counter(r[0] for r in abuser.reports):
        abuser.reports += abuser.expect(ipc.Delivery.TYPE)[1]
    assert Counter(r[0] for r in abuser.reports) == expected
    delivered = sorted(r[0] for r in abuser.reports if r[5] is None)
    failed = {r[0]: ipc.error_from_wire(r[5]) for r in abuser.reports if r[5] is not None}
    abuser.close()
    other.close()
    for sock in hostile:
        sock.close()
    context.term()
    assert not worker.is_alive()
    assert delivered == list(range(sealed))
    assert sorted(failed) == sorted(refused + corrupt)
    assert all(failed[batch_id].message.startswith("the daemon refused the batch: ") for batch_id in refused)
    assert all(failed[batch_id].name == "CORRUPT_MESSAGE" for batch_id in corrupt)
    assert len(results) == 10_000 and all(r.offset >= 0 for r in results)
    assert daemon.is_running()
    assert "refused a client message" in daemon.log_tail(400)
    assert "Traceback" not in daemon.log_path.read_text(errors="replace")
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=10_000)]
    assert sorted(values) == sorted(f"good-{n}".encode() for n in range(10_000))
    hostile_values = [r.value for r in read_topic(broker.bootstrap, hostile_topic, expected=sealed)]
    assert sorted(hostile_values) == sorted(f"hostile-{n}".encode() for n in range(sealed))
    # The books are exact: once everyone has left and every batch is finished, every block is free.
    assert wait_for_held(daemon, lambda held: not held) == {}
    stats = daemon.stats()
    assert stats["sidecar"]["blocks-free"] == stats["sidecar"]["blocks-total"], stats


def _eight_clients(endpoint: str, topic: str, client: int) -> None:
    with Producer(endpoint) as producer:
        for n in range(3000):
            producer.send(topic, f"{client}-{n}".encode(), key=str(n).encode())
        assert producer.flush(60) == 0


def broker_connections(pid: int, ports: set[int]) -> int:
    """ESTABLISHED TCP connections of process ``pid`` to the given remote ports on loopback."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    with open(f"/proc/{pid}/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if fields[3] == "01" and remote_port in ports and fields[9] in inodes:
                count += 1
    return count


def test_one_connection_per_broker_with_eight_clients(mock_cluster, sidecar) -> None:
    topic = "eight-clients"
    leaders = mock_cluster.ensure_topic(topic)
    daemon = sidecar(mock_cluster.bootstrap)
    ports = {port for _, port in mock_cluster.brokers.values()}
    clients = [SPAWN.Process(target=_eight_clients, args=(daemon.endpoint, topic, c)) for c in range(8)]
    try:
        for client in clients:
            client.start()
        peak = 0
        deadline = time.monotonic() + 180
        while any(c.is_alive() for c in clients) and time.monotonic() < deadline:
            peak = max(peak, broker_connections(daemon.pid, ports))
            time.sleep(0.05)
        assert [c.exitcode for c in clients] == [0] * 8
    finally:
        for client in clients:
            if client.is_alive():
                client.kill()
                client.join()
    # One connection per broker at most (the one leading no partition may serve metadata).
    assert len(set(leaders.values())) <= peak <= len(mock_cluster.brokers)


def test_no_daemon_raises_sidecar_unavailable_naming_the_endpoint(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    producer = Producer(endpoint, max_block_ms=500)
    with pytest.raises(SidecarUnavailableError, match="nobody.sock"):
        producer.send("t", b"v")
    producer.close(0)


def test_a_malformed_endpoint_is_refused_at_the_first_send() -> None:
    # Refused, not waited for: max_block_ms would be the wait for a daemon that is not there yet.
    producer = Producer("ipc:/no-slashes", max_block_ms=60_000)
    with pytest.raises(ValueError, match="ipc:/no-slashes"):
        producer.send("t", b"v")
    producer.close(0)


def test_protocol_version_mismatch_is_refused_on_both_sides(broker, sidecar, monkeypatch) -> None:
    daemon = sidecar(broker.bootstrap)
    # The client of this process speaks version 99 (its handshake, and what it accepts); the daemon the real one.
    monkeypatch.setattr(ipc, "PROTOCOL_VERSION", 99)
    monkeypatch.setattr(client_stub.producer, "PROTOCOL_VERSION", 99)
    producer = Producer(daemon.endpoint, max_block_ms=5000)
    with pytest.raises(SidecarUnavailableError, match="version"):
        producer.send("t", b"v")
    producer.close(0)
    assert "protocol version mismatch" in daemon.log_tail()


def test_send_from_many_threads(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    sent: dict[int, list] = defaultdict(list)
    with Producer(daemon.endpoint) as producer:
        def run(thread: int) -> None:
            for n in range(3000):
                sent[thread].append(producer.send(topic, f"t{thread}-{n}".encode(), key=f"t{thread}".encode()))

        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert producer.flush(60) == 0
    for futures in sent.values():
        offsets = [f.result().offset for f in futures]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    values = [r.value for r in read_topic(broker.bootstrap, topic, expected=8 * 3000)]
    for thread in range(8):
        assert [v for v in values if v.startswith(f"t{thread}-".encode())] == \
            [f"t{thread}-{n}".encode() for n in range(3000)]


def test_bad_input_gets_clear_errors(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false"})
    with Producer(daemon.endpoint, max_block_ms=1500) as producer:
        producer.send(topic, b"ok").result(30)
        with pytest.raises(ValueError, match="partition 5 of topic .* has 2 partitions"):
            producer.send(topic, b"v", partition=5)
        with pytest.raises(RecordTooLargeError, match="max.request.size"):
            producer.send(topic, b"v" * (1024 * 1024 + 1))
        with pytest.raises(ValueError, match="invalid topic name"):
            producer.send("no spaces allowed", b"v")
        with pytest.raises(TypeError, match="value must be bytes, str or None"):
            producer.send(topic, 12345)
        with pytest.raises(KafkaTimeoutError, match="Topic no-such-topic not present in metadata after 1500 ms"):
            producer.send("no-such-topic", b"v")
        result = producer.send(topic, "text", key="k", headers={"a": "b"}).result(30)
        assert result.serialized_key_size == 1 and result.serialized_value_size == 4
        # A timestamp past Kafka's int64 is refused before any block is taken: more refusals than the
        # pool has blocks, and the next record still finds room.
        for timestamp in (2**63, 2**64, *[2**63 + n for n in range(1100)]):
            with pytest.raises(ValueError, match=r"timestamp_ms must be an integer from 0 to 2\*\*63-1"):
                producer.send(topic, b"v", timestamp_ms=timestamp)
        with pytest.raises(ValueError, match="timestamp_ms must be"):
            producer.send(topic, b"v", timestamp_ms=-1)
        assert producer.send(topic, b"after", timestamp_ms=2**63 - 1).result(30).offset >= 0
    with pytest.raises(Exception, match="closed"):
        producer.send(topic, b"after close")


def test_a_restarted_daemon_takes_back_what_the_client_held(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap)
    streamed: list[tuple[bytes, Future]] = []
    stop = threading.Event()
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:

        def stream() -> None:
            # Before, during and after the restart: full batches are claimed on the way, the last one stays open.
            n = 0
            while not stop.is_set():
                value = f"streamed-{n}-".encode().ljust(100, b".")
                streamed.append((value, producer.send(topic, value, partition=0)))
                n += 1
                if n % 20 == 0:
                    time.sleep(0.005)

        held = [producer.send(topic, f"held-{n}".encode(), partition=1) for n in range(10)]  # in an open batch
        streamer = threading.Thread(target=stream)
        streamer.start()
        try:
            assert wait_until(lambda: streamed and streamed[0][1].done()), "a claimed batch was delivered"
            daemon.kill()
            killed = len(streamed)
            # Sends go on into the segment, which outlives the daemon (while its blocks last).
            assert wait_until(lambda: len(streamed) > killed + 10)
            daemon.start()
            # The client sees the daemon go and offers its session to the next one, which sends what it held:
            # the batches not reported, those the daemon claimed and the open ones (closed when the daemon went).
            assert [f.result(30).partition for f in held] == [1] * 10
            restarted = len(streamed)
            assert wait_until(lambda: len(streamed) > restarted + 1000)
        finally:
            stop.set()
            streamer.join(60)
        assert not streamer.is_alive()
        assert producer.flush(30) == 0
        assert len(producer) == 0
    # Every record delivered, its future naming a copy of it; only records sent before the restart may be
    # there twice (those unreported at the kill), and the first copies are in the order sent.
    outcomes = [f.result(0) for _, f in streamed]
    read = read_topic(broker.bootstrap, topic, expected=len(streamed) + len(held), timeout=60)
    by_position = {(r.partition, r.offset): r.value for r in read}
    assert [by_position[(md.partition, md.offset)] for md in outcomes] == [value for value, _ in streamed]
    twice = [value for value, count in Counter(r.value for r in read).items() if count > 1]
    sent_before = {value for value, _ in streamed[:restarted]} | {f"held-{n}".encode() for n in range(10)}
    assert set(twice) <= sent_before, f"{len(twice)} records twice, sent {killed} before the kill"
    firsts = list(dict.fromkeys(r.value for r in read if r.partition == 0))
    assert firsts == [value for value, _ in streamed]
    assert sorted({r.value for r in read if r.partition == 1}) == sorted(f"held-{n}".encode() for n in range(10))


def test_a_daemon_that_cannot_take_the_session_back_fails_what_it_held_as_unknown(broker, topic_factory,
                                                                                  sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"batch.size": 16384})
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:
        held = [producer.send(topic, f"held-{n}".encode()) for n in range(10)]
        daemon.kill()
        # Restarted with another batch.size: the client's segment does not fit its pool.
        daemon.settings["batch.size"] = "32768"
        daemon.start()
        for future in held:
            with pytest.raises(SidecarUnavailableError, match="could not take the session back"):
                future.result(30)
        after = producer.send(topic, b"after")
        assert producer.flush(30) == 0
        assert after.result().offset >= 0
    assert "cannot be resumed: its segment has" in daemon.log_tail(100)
    assert [r.value for r in read_topic(broker.bootstrap, topic, expected=1)] == [b"after"]
