"""The client's public API as applications use it, against a real daemon and a real broker.

Delivery callbacks, serializers, serialized sizes, flush() and close() with a timeout, len(),
linger, sealing under pool pressure and blocking for memory, the Future contract of what send()
returns, and the client's fixes from the issue-4 audit; what arrived is read back with the
confluent-kafka verifier. Faults come from the FaultProxy between daemon and broker.
"""

from __future__ import annotations

import concurrent.futures
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import pytest
import zmq

from client_stub import Producer, RecordMetadata
from client_stub.contract import PROTOCOL_VERSION, ipc
from client_stub.errors import (
    BufferExhaustedError,
    KafkaError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SidecarUnavailableError,
)
from service.protocol.messages import PRODUCE
from service.tools.readback import read_topic
from tests.support.fake_broker import produce_response, record_count
from tests.support.record_batches import decode_batches
from tests.support.waiting import HANG_S, wait_until
from tests.support.workers import run_children

ROOT = Path(__file__).parents[2]
FORK = multiprocessing.get_context("fork")
# A daemon behind a FaultProxy: a blackholed request is retried after a short request timeout.
SHORT_TIMEOUTS = {"request.timeout.ms": 2000, "retry.backoff.ms": 50}


class Deliveries:
    """An on_delivery callback that keeps what each call got, in order, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[KafkaError | None, RecordMetadata | None, float]] = []
        self._lock = threading.Lock()

    def __call__(self, err: KafkaError | None, metadata: RecordMetadata | None) -> None:
        with self._lock:
            self.calls.append((err, metadata, time.monotonic()))


def outcome(future: Future) -> tuple[KafkaError | None, RecordMetadata | None]:
    """What on_delivery should get for a completed future: (err, metadata)."""
    error = future.exception(0)
    return (error, None) if error is not None else (None, future.result(0))


# -- delivery callbacks ---------------------------------------------------------------------------


def test_on_delivery_gets_no_error_and_the_metadata(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    deliveries = Deliveries()
    with Producer(daemon.endpoint) as producer:
        futures = [producer.send(topic, f"v{n}".encode(), key=b"one-key", on_delivery=deliveries)
                   for n in range(200)]
        assert producer.flush(30) == 0
        metadata = [f.result(30) for f in futures]
    # One key, one partition: the callbacks come in the order of the records, each with (None, metadata).
    assert [(err, md) for err, md, _ in deliveries.calls] == [(None, md) for md in metadata]
    assert all(isinstance(md, RecordMetadata) for md in metadata)
    read = read_topic(broker.bootstrap, topic, expected=200)
    assert [(r.partition, r.offset, r.value) for r in read] == \
        [(md.partition, md.offset, f"v{n}".encode()) for n, md in enumerate(metadata)]


def test_flush_returns_after_the_on_delivery_callbacks_have_run(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    done = []

    def slow_callback(err: KafkaError | None, metadata: RecordMetadata | None) -> None:
        time.sleep(0.0005)  # as a callback that logs to a file or a socket: it lets other threads run
        done.append(err)

    with Producer(daemon.endpoint) as producer:
        for n in range(2000):
            producer.send(topic, b"%d" % n, on_delivery=slow_callback)
        assert producer.flush(60) == 0
        # As with the Java producer: what flush() waited for includes the callbacks.
        assert len(done) == 2000


def test_a_process_that_waits_on_no_report_is_woken_for_them_far_less_often(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)

    def reported() -> tuple[int, int]:
        """The records of this process the daemon reported delivered, and the DELIVERY messages it sent it."""
        [process] = [p for p in daemon.stats()["processes"] if p["pid"] == os.getpid()]
        return process["records-delivered-total"], process["delivery-messages-total"]

    def delivery_messages(producer: Producer, on_delivery: Deliveries | None) -> int:
        """The DELIVERY messages the daemon sends this process while it sends a record every 10 ms (a batch of its
        own, at linger.ms 1), with ``on_delivery`` or none, until the last is acknowledged."""
        delivered, messages = reported()
        for n in range(100):
            producer.send(topic, b"%d" % n, on_delivery=on_delivery)
            time.sleep(0.01)
        assert wait_until(lambda: reported()[0] == delivered + 100, HANG_S)
        return reported()[1] - messages

    with Producer(daemon.endpoint, linger_ms=1) as producer:
        producer.send(topic, b"first").result(HANG_S)
        called_back = Deliveries()
        woken_for_callbacks = delivery_messages(producer, called_back)
        assert producer.flush(HANG_S) == 0 and len(called_back.calls) == 100
        sent_and_forgotten = delivery_messages(producer, None)
        # Its reports come with the blocks it is granted (a grant every few batches here), not each alone.
        assert sent_and_forgotten * 2 <= woken_for_callbacks, (sent_and_forgotten, woken_for_callbacks)
        futures = [producer.send(topic, b"last %d" % n) for n in range(3)]
        # Waited on, a record's report comes without flush(), which gets the rest.
        assert futures[-1].result(HANG_S).offset >= 0
        assert producer.flush(HANG_S) == 0 and all(f.done() for f in futures)
    assert len(read_topic(broker.bootstrap, topic, expected=204)) == 204


def test_a_producer_at_a_steady_rate_gets_its_blocks_back_with_its_reports_without_asking(
        broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)

    def block_requests() -> int:
        """The requests for blocks this process made."""
        [process] = [p for p in daemon.stats()["processes"] if p["pid"] == os.getpid()]
        return int(process["block-requests-total"])

    with Producer(daemon.endpoint, linger_ms=1) as producer:
        producer.send(topic, b"first").result(HANG_S)
        asked = block_requests()
        called_back = Deliveries()
        # A record every 20 ms, each a batch on a block of its own: without its blocks back with the reports, it
        # would ask for more every other batch.
        for n in range(100):
            producer.send(topic, b"%d" % n, on_delivery=called_back)
            time.sleep(0.02)
        assert producer.flush(HANG_S) == 0 and len(called_back.calls) == 100
        assert block_requests() - asked <= 10
    assert len(read_topic(broker.bootstrap, topic, expected=101)) == 101


def test_the_batches_of_a_linger_ms_are_claimed_together_and_reported_in_one_message(
        broker, topic_factory, sidecar) -> None:
    topic = topic_factory(6)
    # Long enough that only a machine stalled for seconds puts a send past the first batch's claim.
    daemon = sidecar(broker.bootstrap, settings={"linger.ms": 2000})

    def delivery_messages() -> int:
        [process] = [p for p in daemon.stats()["processes"] if p["pid"] == os.getpid()]
        return int(process["delivery-messages-total"])

    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"first")
        assert producer.flush(HANG_S) == 0
        before = delivery_messages()
        called_back = Deliveries()
        # A batch a partition, opened 10 ms apart: each due 10 ms after the one before, all within the linger.ms
        # of the first. Claimed each when due, they would come in six produce responses, each reported alone.
        futures = []
        for n in range(6):
            futures.append(producer.send(topic, b"%d" % n, partition=n, on_delivery=called_back))
            time.sleep(0.01)
        assert [f.result(HANG_S).partition for f in futures] == list(range(6))
        assert delivery_messages() - before == 1
        assert producer.flush(HANG_S) == 0 and len(called_back.calls) == 6
    assert len(read_topic(broker.bootstrap, topic, expected=7)) == 7


def test_on_delivery_gets_the_error_and_no_metadata(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("expire", 1)
    daemon = sidecar(proxy.address, settings={**SHORT_TIMEOUTS, "delivery.timeout.ms": 3000})
    deliveries = Deliveries()
    with Producer(daemon.endpoint) as producer:
        producer.send("expire", b"warm").result(30)
        proxy.blackhole()
        futures = [producer.send("expire", b"%d" % n, on_delivery=deliveries) for n in range(5)]
        errors = [f.exception(60) for f in futures]
        assert all(isinstance(e, KafkaTimeoutError) for e in errors), errors
        assert producer.flush(30) == 0
    # (err, metadata): the future's exception first, no metadata.
    assert [(err, md) for err, md, _ in deliveries.calls] == [(e, None) for e in errors]


def test_offsets_of_the_parts_of_a_batch_the_daemon_split(fake_broker, sidecar) -> None:
    """A broker refusing a batch as too large (a fault the test broker will not produce): the daemon
    splits it and each part gets its own base offset; each record's RecordMetadata says where it is."""
    broker = fake_broker(1, topics={"split": 1})

    def three_records_at_most(header, request):
        records = request.topic_data[0].partition_data[0].records
        if record_count(bytes(records)) > 3:
            return produce_response(request, error_code=10)  # MESSAGE_TOO_LARGE
        return broker.default_response(header, request)

    broker.set_handler(PRODUCE, three_records_at_most)
    daemon = sidecar(broker.address)
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:
        producer.send("split", b"warm")
        futures = [producer.send("split", b"%d" % n) for n in range(10)]  # one batch, sealed by flush()
        assert producer.flush(30) == 0
        offsets = [f.result(0).offset for f in futures]
    stored = [record.value for records in broker.batches[("split", 0)]
              for batch in decode_batches(records) for record in batch.records]
    assert len(broker.batches[("split", 0)]) >= 4  # the batch of ten was split
    assert offsets == [stored.index(b"%d" % n) for n in range(10)]


# -- serializers and sizes ------------------------------------------------------------------------


def test_key_and_value_serializers(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    values = [{"n": n, "text": "é" * n} for n in range(20)] + [None]
    with Producer(daemon.endpoint, key_serializer=lambda key: key.to_bytes(4, "big"),
                  value_serializer=lambda value: None if value is None else json.dumps(value).encode()) as producer:
        futures = [producer.send(topic, value, key=n) for n, value in enumerate(values)]
        assert producer.flush(30) == 0
        metadata = [f.result(30) for f in futures]
    for n, (value, md) in enumerate(zip(values, metadata, strict=True)):
        serialized = None if value is None else json.dumps(value).encode()
        assert md.serialized_key_size == 4
        assert md.serialized_value_size == (-1 if serialized is None else len(serialized)), n
    read = {(r.partition, r.offset): r for r in read_topic(broker.bootstrap, topic, expected=len(values))}
    for n, (value, md) in enumerate(zip(values, metadata, strict=True)):
        record = read[(md.partition, md.offset)]
        assert record.key == n.to_bytes(4, "big")
        assert (None if record.value is None else json.loads(record.value)) == value


def test_serialized_sizes(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    sent = [(None, None), (b"", b""), ("k", "é"), (b"key", None), (None, b"value")]
    with Producer(daemon.endpoint) as producer:
        futures = [producer.send(topic, value, key=key, headers={"not": b"counted"}) for key, value in sent]
        sizes = [(md.serialized_key_size, md.serialized_value_size) for md in (f.result(30) for f in futures)]
    assert sizes == [(-1, -1), (0, 0), (1, 2), (3, -1), (-1, 5)]


# -- flush, close and len with a broker that does not answer -------------------------------------


def test_flush_with_a_silent_broker_returns_what_is_undelivered(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("silent", 2)
    daemon = sidecar(proxy.address, settings=SHORT_TIMEOUTS)
    with Producer(daemon.endpoint) as producer:
        producer.send("silent", b"warm").result(30)
        assert len(producer) == 0
        proxy.blackhole()
        futures = [producer.send("silent", b"%d" % n) for n in range(50)]
        assert len(producer) == 50
        assert producer.flush(0.5) == 50
        assert len(producer) == 50 and not any(f.done() for f in futures)
        proxy.heal()
        assert producer.flush(60) == 0
        assert len(producer) == 0
        assert all(f.result(0).offset >= 0 for f in futures)
    values = sorted(r.value for r in read_topic(proxy.address, "silent", expected=51))
    assert values == sorted([b"warm"] + [b"%d" % n for n in range(50)])


def test_close_with_a_timeout_fails_what_is_unconfirmed(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("closing", 1)
    daemon = sidecar(proxy.address, settings=SHORT_TIMEOUTS)
    deliveries = Deliveries()
    producer = Producer(daemon.endpoint)
    producer.send("closing", b"warm").result(30)
    proxy.blackhole()
    futures = [producer.send("closing", b"%d" % n, on_delivery=deliveries) for n in range(20)]
    producer.close(0.5)
    # Each record fails with ProducerClosedError, its callback has run, and nothing is left counted.
    assert all(isinstance(f.exception(0), ProducerClosedError) for f in futures)
    assert [(err, md) for err, md, _ in deliveries.calls] == [outcome(f) for f in futures]
    assert len(producer) == 0
    # The records were handed to the daemon: it still delivers them once the broker answers.
    proxy.heal()
    values = [r.value for r in read_topic(proxy.address, "closing", expected=21, timeout=60)]
    assert values == [b"warm"] + [b"%d" % n for n in range(20)]


# -- when batches are sealed ----------------------------------------------------------------------


def test_linger_seals_without_flush(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    deliveries = Deliveries()
    with Producer(daemon.endpoint, linger_ms=1500) as producer:
        producer.send(topic, b"warm").result(30)
        started = time.monotonic()
        futures = [producer.send(topic, b"%d" % n, on_delivery=deliveries) for n in range(10)]
        time.sleep(0.5)
        lingering = len(producer) == 10 and not any(f.done() for f in futures)
        # Still lingering, unless a busy machine looked only after linger_ms (the lower bound below holds anyway).
        assert lingering or time.monotonic() - started >= 1.5
        offsets = [f.result(30).offset for f in futures]  # no flush: linger_ms seals the batch
        assert offsets == list(range(offsets[0], offsets[0] + 10))
        # Sealed at linger_ms, not before (a lower bound only: a busy machine can only make it later).
        assert min(at for _, _, at in deliveries.calls) - started >= 1.5


def test_pool_pressure_makes_a_lingering_client_seal(proxied_broker, sidecar) -> None:
    """The pool is eight blocks, and a client lingering for an hour takes them for a batch on each of eight
    partitions. While a request waits for blocks (its own for spare ones, or another client's), the daemon claims
    the batches published and asks for spare blocks (SEAL_NOW): the first batch goes out without flush(), and
    another client gets blocks. A batch opened once the pool had blocks again lingers until close()."""
    tansu, proxy = proxied_broker
    tansu.create_topic("pressure", 8)
    daemon = sidecar(proxy.address, settings={"buffer.memory": 8 * 16384, "batch.size": 16384})
    with Producer(daemon.endpoint, linger_ms=3_600_000) as lingering, Producer(daemon.endpoint) as other:
        held = [lingering.send("pressure", b"held-%d" % p, partition=p) for p in range(8)]
        later = other.send("pressure", b"other", partition=0)
        assert later.result(30).offset >= 0
        assert held[0].result(30).partition == 0
    assert [f.result(0).partition for f in held] == list(range(8))
    values = sorted(r.value for r in read_topic(proxy.address, "pressure", expected=9))
    assert values == sorted([b"other"] + [b"held-%d" % p for p in range(8)])


def test_a_client_at_its_share_of_the_pool_seals_and_goes_on(proxied_broker, sidecar) -> None:
    """A process may hold half the pool (max.request.size needs no more here): a lingering client
    that has it is asked to seal and goes on, and another client of the process is served as its blocks
    come back. (A batch opened once the process had blocks again lingers until close().)"""
    tansu, proxy = proxied_broker
    tansu.create_topic("share", 8)
    daemon = sidecar(proxy.address, settings={"buffer.memory": 8 * 16384, "batch.size": 16384,
                                              "max.request.size": 32768})
    with Producer(daemon.endpoint, linger_ms=3_600_000) as greedy, Producer(daemon.endpoint) as other:
        held = [greedy.send("share", b"greedy-%d" % p, partition=p) for p in range(8)]
        assert other.send("share", b"other", partition=0).result(30).offset >= 0
        assert held[0].result(30).partition == 0
    assert [f.result(0).partition for f in held] == list(range(8))
    assert "at most 4 per process" in daemon.log_tail(400)
    values = sorted(r.value for r in read_topic(proxy.address, "share", expected=9))
    assert values == sorted([b"other"] + [b"greedy-%d" % p for p in range(8)])


# -- blocking for memory --------------------------------------------------------------------------


def test_buffer_exhausted_for_a_large_record_no_earlier_than_max_block_ms(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("large", 1)
    daemon = sidecar(proxy.address, settings={**SHORT_TIMEOUTS, "buffer.memory": 4 * 16384,
                                              "batch.size": 16384})
    with Producer(daemon.endpoint, max_block_ms=1500, linger_ms=0) as producer:
        producer.send("large", b"warm").result(30)
        proxy.blackhole()
        # Records of two blocks each: two fill the pool, and are not acknowledged.
        futures = [producer.send("large", b"L" * 20_000) for _ in range(2)]
        started = time.monotonic()
        with pytest.raises(BufferExhaustedError, match="1500 ms"):
            producer.send("large", b"L" * 20_000)
        assert time.monotonic() - started >= 1.5
        proxy.heal()
        assert all(f.result(60).offset >= 0 for f in futures)
        assert producer.send("large", b"L" * 20_000).result(30).offset >= 0


def test_a_missing_topic_fails_the_first_send_after_the_daemons_max_block_ms(broker, sidecar) -> None:
    # The producer has no max_block_ms of its own: the daemon's, which its welcome brings, is the one kept to
    # (before, the wait for the topic kept to the 60 000 ms assumed until the welcome came).
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false", "max.block.ms": 1000})
    with Producer(daemon.endpoint) as producer:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="not present in metadata after 1000 ms"):
            producer.send("no-such-topic", b"v")
        waited = time.monotonic() - started
    assert 1.0 <= waited < 30, waited


# -- the endpoint and the package -----------------------------------------------------------------


def test_endpoint_from_the_environment(broker, topic_factory, sidecar, monkeypatch) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    monkeypatch.setenv("KAFKA_SIDECAR_ENDPOINT", daemon.endpoint)
    with Producer() as producer:
        assert producer.endpoint == daemon.endpoint
        assert producer.send(topic, b"found").result(30).offset == 0


def test_client_stub_imports_nothing_of_the_daemon() -> None:
    code = (
        "import pkgutil, importlib, sys, client_stub\n"
        "for module in pkgutil.walk_packages(client_stub.__path__, 'client_stub.'):\n"
        "    importlib.import_module(module.name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'service' or m.startswith('service.'))\n"
        "assert not loaded, loaded\n"
        "print(len([m for m in sys.modules if m.startswith('client_stub')]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 6  # the package and its modules were imported


# -- the Future that send() returns ---------------------------------------------------------------


def test_record_futures_keep_the_future_contract(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:
        producer.send(topic, b"warm")
        assert producer.flush(30) == 0
        # Made by the fast path of send() (bytes, no headers) and by its Python path (headers, str).
        futures = [producer.send(topic, b"%d" % n, key=b"k%d" % (n % 7)) if n % 2 else
                   producer.send(topic, str(n), key=f"k{n % 7}", headers={"n": str(n)}) for n in range(2000)]
        pending = futures[:2]
        early_calls: list[Future] = []
        for future in pending:
            assert not future.done() and future.running()
            assert "running" in repr(future)
            with pytest.raises(TimeoutError):
                future.result(timeout=0.1)
            with pytest.raises(TimeoutError):
                future.exception(timeout=0.1)
            assert future.cancel() is False  # the record is handed off
            assert not future.cancelled()
            future.add_done_callback(early_calls.append)
        done, not_done = concurrent.futures.wait(futures, timeout=0.1)
        assert not done and not_done == set(futures)  # lingering: nothing is sent until flush()

        waited: dict[str, object] = {}

        def wait_for_all() -> None:
            waited["wait"] = concurrent.futures.wait(futures, timeout=60)

        def iterate_as_completed() -> None:
            waited["as_completed"] = list(concurrent.futures.as_completed(futures, timeout=60))

        waiters = [threading.Thread(target=wait_for_all), threading.Thread(target=iterate_as_completed)]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.5)  # they wait on pending futures (had they not begun yet, they would find them done)
        assert producer.flush(60) == 0
        for waiter in waiters:
            waiter.join(60)
        assert not any(waiter.is_alive() for waiter in waiters)

    assert waited["wait"] == (set(futures), set())
    assert Counter(map(id, waited["as_completed"])) == Counter(map(id, futures))  # each once
    assert early_calls == pending  # each callback ran once, with its future
    late_calls: list[Future] = []
    for future in futures:
        assert future.done() and not future.running()
        assert future.cancel() is False and not future.cancelled()
        assert future.exception(0) is None
        assert isinstance(future.result(0), RecordMetadata)
        assert "finished" in repr(future)
        assert gc.is_tracked(future)  # a done future may be in a cycle: the collector must see it
        future.add_done_callback(late_calls.append)  # done: runs at once, in this thread
    assert late_calls == futures
    read = {(r.partition, r.offset): r.value for r in read_topic(broker.bootstrap, topic, expected=2001)}
    assert [read[(md.partition, md.offset)] for md in (f.result() for f in futures)] == \
        [b"%d" % n for n in range(2000)]


def test_a_failed_record_future_raises_its_kafka_error(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("failing", 1)
    daemon = sidecar(proxy.address, settings={**SHORT_TIMEOUTS, "delivery.timeout.ms": 3000})
    with Producer(daemon.endpoint) as producer:
        producer.send("failing", b"warm").result(30)
        proxy.blackhole()
        watched = producer.send("failing", b"watched")
        calls: list[Future] = []
        watched.add_done_callback(calls.append)
        unwatched = [producer.send("failing", b"%d" % n) for n in range(5)]
        done, not_done = concurrent.futures.wait([watched, *unwatched], timeout=60)
        assert not not_done
        for future in [watched, *unwatched]:
            with pytest.raises(KafkaTimeoutError) as raised:
                future.result(0)
            assert isinstance(raised.value, KafkaError)
            assert future.exception(0) is raised.value
            assert future.done() and not future.cancelled() and not future.running()
            assert "raised KafkaTimeoutError" in repr(future)
            assert gc.is_tracked(future)
        assert calls == [watched]
        assert producer.flush(30) == 0


# -- fixes from the issue-4 audit -----------------------------------------------------------------


def test_large_records_and_small_ones_from_other_threads_share_a_partition(broker, topic_factory, sidecar) -> None:
    """Records larger than batch.size (a run of blocks, waited for) while other threads keep a batch
    of the same partition open: none is lost, and each thread's records keep their order."""
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"batch.size": 16384})
    sent: dict[str, list[bytes]] = {}
    futures: dict[str, list[Future]] = {}
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"warm").result(30)

        def run(name: str, count: int, size: int) -> None:
            values = [f"{name}-{n}-".encode().ljust(size, b".") for n in range(count)]
            sent[name] = values
            futures[name] = [producer.send(topic, value) for value in values]

        threads = [threading.Thread(target=run, args=("large", 40, 100_000))]
        threads += [threading.Thread(target=run, args=(f"small{t}", 3000, 50)) for t in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert producer.flush(60) == 0
    for name, thread_futures in futures.items():
        offsets = [f.result(0).offset for f in thread_futures]
        assert offsets == sorted(set(offsets)), f"{name}: offsets in the order of the sends"
    read = read_topic(broker.bootstrap, topic, expected=1 + 40 + 3 * 3000, timeout=60)
    assert len(read) == 1 + 40 + 3 * 3000
    for name, values in sent.items():
        assert [r.value for r in read if r.value.startswith(f"{name}-".encode())] == values, name
        assert [r.offset for r in read if r.value.startswith(f"{name}-".encode())] == \
            [f.result(0).offset for f in futures[name]]


def _first_partition_without_a_key(producer: Producer, topic: str, queue) -> None:
    futures = [producer.send(topic, b"no key") for _ in range(10)]
    producer.flush(60)
    queue.put(futures[0].result(60).partition)


def test_forked_children_do_not_all_pick_the_same_sticky_partition(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(12)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"parent").result(30)  # the parent has picked a sticky partition: a random draw
        queue = FORK.Queue()
        children = [FORK.Process(target=_first_partition_without_a_key, args=(producer, topic, queue))
                    for _ in range(8)]
        partitions = run_children(children, queue)
    # Eight children drawing from the same random state would all pick the same partition; drawing
    # independently, all eight pick the same one of twelve once in 12**7 runs.
    assert len(set(partitions)) > 1, partitions


def test_a_record_larger_than_buffer_memory_is_refused_at_once(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    # buffer.memory is 64 KiB; max.request.size stays at 1 MiB.
    daemon = sidecar(broker.bootstrap, settings={"buffer.memory": 4 * 16384, "batch.size": 16384})
    with Producer(daemon.endpoint, max_block_ms=30_000) as producer:
        producer.send(topic, b"warm").result(30)
        started = time.monotonic()
        with pytest.raises(RecordTooLargeError, match=r"buffer.memory configuration \(65536\)"):
            producer.send(topic, b"x" * 100_000)
        # Not after max_block_ms (30 s): it did not wait for memory that can never be there.
        assert time.monotonic() - started < 30, "it waited for memory that can never be there"
        assert producer.send(topic, b"after").result(30).offset == 1


def test_sends_during_and_after_close_are_refused(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("closing-race", 2)
    daemon = sidecar(proxy.address, settings=SHORT_TIMEOUTS)
    producer = Producer(daemon.endpoint)
    producer.send("closing-race", b"warm").result(30)
    proxy.blackhole()  # close() has to wait for what it flushes: the sender meets a closing producer
    accepted: list[Future] = []
    refused: list[Exception] = []
    sending = threading.Event()

    def keep_sending() -> None:
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline:
            try:
                # Both paths of send(): the fast one, and the Python one (headers).
                headers = {"n": b"%d" % n} if n % 3 == 0 else None
                accepted.append(producer.send("closing-race", b"%d" % n, partition=n % 2, headers=headers))
            except ProducerClosedError as exc:
                refused.append(exc)
                return
            n += 1
            if n % 100 == 0:
                sending.set()
                time.sleep(0.001)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    assert sending.wait(30)
    producer.close(1.0)
    sender.join(30)
    assert not sender.is_alive()
    assert len(refused) == 1, "send() during close() raises ProducerClosedError"
    # Nothing hangs: each record sent before close() began was flushed, and failed as unconfirmed.
    assert accepted and all(f.done() for f in accepted)
    assert all(isinstance(f.exception(0), ProducerClosedError) for f in accepted)
    assert len(producer) == 0
    with pytest.raises(ProducerClosedError):
        producer.send("closing-race", b"after close")
    from_thread: list[BaseException] = []

    def send_after_close() -> None:
        try:
            producer.send("closing-race", b"after close", headers={"a": b"b"})
        except ProducerClosedError as exc:
            from_thread.append(exc)

    thread = threading.Thread(target=send_after_close)
    thread.start()
    thread.join(30)
    assert len(from_thread) == 1
    proxy.heal()  # the daemon still holds the abandoned records: it delivers them and stops at once


def test_a_closed_producer_leaves_no_socket_open(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    producer = Producer(daemon.endpoint)
    producer.send(topic, b"one").result(30)
    producer.close(30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        del producer
        gc.collect()
    # An unclosed socket is reported when it is collected, as a ResourceWarning (python -X dev shows them).
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_wait_for_daemon_names_the_timeout_it_waited(tmp_path) -> None:
    producer = Producer(f"ipc://{tmp_path}/nobody.sock", max_block_ms=60_000)
    try:
        with pytest.raises(SidecarUnavailableError, match="within 200 ms"):
            producer.wait_for_daemon(0.2)
    finally:
        producer.close(5)


def test_waits_in_an_on_delivery_callback_raise_instead_of_deadlocking(broker, topic_factory, sidecar) -> None:
    topic, unknown_to_the_producer = topic_factory(1), topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    raised: dict[str, KafkaError] = {}
    with Producer(daemon.endpoint) as producer:

        def wait_in_callback(err: KafkaError | None, metadata: RecordMetadata | None) -> None:
            # Callbacks run on the I/O thread: what these would wait for only that thread brings.
            for name, call in (("flush", producer.flush), ("close", producer.close),
                               ("send", lambda: producer.send(unknown_to_the_producer, b"needs metadata"))):
                try:
                    call()
                except KafkaError as exc:
                    raised[name] = exc

        future = producer.send(topic, b"v", on_delivery=wait_in_callback)
        assert producer.flush(30) == 0
        assert future.result(0).offset == 0
        assert producer.send(topic, b"still open").result(30).offset == 1
    assert sorted(raised) == ["close", "flush", "send"]
    assert all("on_delivery callback" in str(exc) for exc in raised.values()), raised


def test_a_welcome_of_another_protocol_version_is_refused(tmp_path) -> None:
    """A daemon answering HELLO with a WELCOME of version 99 (a fake: a ROUTER socket in the test)."""
    endpoint = f"ipc://{tmp_path}/other-version.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    hellos: list[list] = []
    stop = threading.Event()

    def answer_hellos() -> None:
        while not stop.is_set():
            if router.poll(50):
                identity, data = router.recv_multipart()
                message = ipc.unpack(data)
                if message[0] == ipc.Hello.TYPE:
                    hellos.append(message)
                    router.send_multipart([identity, ipc.pack(ipc.Welcome.TYPE, 99, 1, "no-such-segment", 16384, 8,
                                                              {"max_block_ms": 60000}, "fake-daemon")])

    fake_daemon = threading.Thread(target=answer_hellos)
    fake_daemon.start()
    try:
        producer = Producer(endpoint, max_block_ms=30_000)
        started = time.monotonic()
        with pytest.raises(SidecarUnavailableError,
                           match=rf"other-version.sock speaks protocol version 99, this client {PROTOCOL_VERSION}"):
            producer.send("t", b"v")
        assert time.monotonic() - started < 30, "refused at the WELCOME, not after max_block_ms (30 s)"
        assert [hello[1] for hello in hellos] == [PROTOCOL_VERSION]
        producer.close(0)
    finally:
        stop.set()
        fake_daemon.join()
        router.close()
        context.term()


# The SystemExit ends the I/O thread, as it would any thread; pytest's thread exception hook reports it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_callback_that_raises_system_exit_stops_the_producer_loudly(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    calls = []

    def exits(err: KafkaError | None, metadata: RecordMetadata | None) -> None:
        calls.append(metadata)
        if len(calls) == 2:
            raise SystemExit("the application asked to stop")

    producer = Producer(daemon.endpoint, linger_ms=0)
    futures = [producer.send(topic, b"%d" % n, on_delivery=exits) for n in range(5)]
    producer.flush(30)
    producer._io.join(30)  # the thread that ran the callback has ended
    # Every record completed and had its callback once, the second one's SystemExit notwithstanding:
    # delivered, or failed with the reason once nothing could report it any more.
    assert len(calls) == 5 and all(f.done() for f in futures)
    assert futures[1].result(0).offset == 1
    with pytest.raises(KafkaError, match=r"I/O thread stopped \(SystemExit: the application asked to stop\)"):
        producer.send(topic, b"after")
    producer.close(5)
