"""The client's public API as applications use it, against a real daemon and a real broker.

Delivery callbacks, serializers, serialized sizes, flush() and close() with a timeout, len(),
linger, sealing under pool pressure and blocking for memory; what arrived is read back with
the confluent-kafka verifier. Faults come from the FaultProxy between daemon and broker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from client_stub import Producer, RecordMetadata
from client_stub.errors import BufferExhaustedError, KafkaError, KafkaTimeoutError, ProducerClosedError
from service.protocol.messages import PRODUCE
from service.protocol.record_batch import decode_batches
from tests.support.fake_broker import produce_response, record_count
from tests.support.verifier import read_topic

ROOT = Path(__file__).parents[2]
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
        assert len(producer) == 10 and not any(f.done() for f in futures)  # still lingering
        offsets = [f.result(30).offset for f in futures]  # no flush: linger_ms seals the batch
        assert offsets == list(range(offsets[0], offsets[0] + 10))
        # Sealed at linger_ms, not before (a lower bound only: a busy machine can only make it later).
        assert min(at for _, _, at in deliveries.calls) - started >= 1.5


def test_pool_pressure_makes_a_lingering_client_seal(proxied_broker, sidecar) -> None:
    """The pool is eight blocks; a client lingering for an hour holds them all in open batches.
    Asked to seal (SEAL_NOW), it hands them over without flush(), and another client gets blocks."""
    tansu, proxy = proxied_broker
    tansu.create_topic("pressure", 8)
    daemon = sidecar(proxy.address, settings={"buffer.memory": 8 * 16384, "batch.size": 16384})
    with Producer(daemon.endpoint, linger_ms=3_600_000) as lingering, Producer(daemon.endpoint) as other:
        held = [lingering.send("pressure", b"held-%d" % p, partition=p) for p in range(8)]
        later = other.send("pressure", b"other", partition=0)
        assert later.result(30).offset >= 0
        assert [f.result(30).partition for f in held] == list(range(8))
        assert len(lingering) == 0
    values = sorted(r.value for r in read_topic(proxy.address, "pressure", expected=9))
    assert values == sorted([b"other"] + [b"held-%d" % p for p in range(8)])


def test_a_client_at_its_share_of_the_pool_seals_and_goes_on(proxied_broker, sidecar) -> None:
    """A client may hold half the pool (max.request.size needs no more here): a lingering client
    that has it is asked to seal and goes on, and another client is served meanwhile."""
    tansu, proxy = proxied_broker
    tansu.create_topic("share", 8)
    daemon = sidecar(proxy.address, settings={"buffer.memory": 8 * 16384, "batch.size": 16384,
                                              "max.request.size": 32768})
    with Producer(daemon.endpoint, linger_ms=3_600_000) as greedy, Producer(daemon.endpoint) as other:
        held = [greedy.send("share", b"greedy-%d" % p, partition=p) for p in range(8)]
        assert other.send("share", b"other", partition=0).result(30).offset >= 0
        assert [f.result(30).partition for f in held] == list(range(8))
    assert "at most 4 per client" in daemon.log_tail(400)
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
