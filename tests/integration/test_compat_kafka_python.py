"""kafka-python's KafkaProducer on kafka-sidecar (client_stub.compat.kafka_python), against a real daemon and broker.

kafka-python's README producer examples run with only their imports changed; send()'s future behaves as
kafka-python's (get(timeout), callbacks and errbacks on the I/O thread, KafkaTimeoutError); errors are
kafka-python's classes; a setting the daemon owns that differs from the daemon's warns once. What arrived is read
back with the confluent-kafka verifier.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import kafka.errors
import kafka.serializer
import pytest

from client_stub.compat import DaemonSettingWarning
from client_stub.compat.kafka_python import (
    FutureRecordMetadata,
    IllegalStateError,
    KafkaProducer,
    KafkaTimeoutError,
    RecordMetadata,
    TopicPartition,
)
from service.tools.readback import read_topic
from tests.support.broker import TansuBroker
from tests.support.sidecar import SidecarProcess

ROOT = Path(__file__).parents[2]
EXAMPLES = Path(__file__).parent / "compat_examples"
# A daemon behind a FaultProxy: a blackholed request times out soon, and so does the record.
SHORT_TIMEOUTS = {"request.timeout.ms": 1000, "retry.backoff.ms": 50, "delivery.timeout.ms": 2000}


@pytest.fixture(scope="module")
def daemon(broker: TansuBroker) -> Iterator[SidecarProcess]:
    """One daemon with the default settings for the tests of this module that need no other."""
    with SidecarProcess(broker.bootstrap) as process:
        yield process


def test_the_readme_examples_run_unchanged(broker, daemon) -> None:
    env = {**os.environ, "KAFKA_SIDECAR_ENDPOINT": daemon.endpoint,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-W", "always::UserWarning",
                             str(EXAMPLES / "kafka_python_readme.py")], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    # compression_type='gzip' is the daemon's to set: one warning says so.
    assert result.stderr.count("DaemonSettingWarning") == 1, result.stderr
    assert "compression_type='gzip' is not what the kafka-sidecar daemon does" in result.stderr
    # Every record arrived, those of the producers the example drops without closing them too (as kafka-python's,
    # they flush when garbage-collected or at exit).
    foobar = read_topic(broker.bootstrap, "foobar", expected=1103)
    assert Counter(r.value for r in foobar) == Counter(
        {b"some_message_bytes": 100, b"another_message": 1, b"bar": 1, b"c29tZSB2YWx1ZQ==": 1,
         **{b"msg %d" % i: 1 for i in range(1000)}})
    assert {r.value: (r.key, r.headers) for r in foobar if r.value in (b"bar", b"c29tZSB2YWx1ZQ==")} == {
        b"bar": (b"foo", []), b"c29tZSB2YWx1ZQ==": (None, [("content-encoding", b"base64")])}
    [fizzbuzz] = read_topic(broker.bootstrap, "fizzbuzz", expected=1)
    assert fizzbuzz.value == b'{"foo": "bar"}'
    [flipflap] = read_topic(broker.bootstrap, "flipflap", expected=1)
    assert (flipflap.key, flipflap.value) == (b"ping", b"1234")


def test_the_future_of_send(broker, topic_factory, daemon) -> None:
    topic = topic_factory(3)
    producer = KafkaProducer(bootstrap_servers="ignored", sidecar_endpoint=daemon.endpoint,
                             key_serializer=str.encode, value_serializer=lambda v: v.upper().encode())
    called: list[tuple[str, object, threading.Thread]] = []
    future = producer.send(topic, "value", key="key", headers=[("h", b"1")], timestamp_ms=1_700_000_000_000)
    assert isinstance(future, FutureRecordMetadata)
    future.add_callback(lambda tag, md: called.append((tag, md, threading.current_thread())), "delivered")
    future.add_errback(lambda e: called.append(("failed", e, threading.current_thread())))
    metadata = future.get(timeout=30)
    assert metadata == RecordMetadata(topic, metadata.partition, TopicPartition(topic, metadata.partition),
                                      metadata.offset, 1_700_000_000_000, None, 3, 5, 2)
    assert future.is_done and future.succeeded() and not future.failed() and future.exception is None
    assert future.value == metadata
    producer.flush()
    # The callback ran on the client's I/O thread, as kafka-python's on its sender thread; one added later runs
    # at once, on the caller's.
    assert called == [("delivered", metadata, called[0][2])] and called[0][2].name == "kafka-sidecar-io"
    future.add_callback(lambda md: called.append(("late", md, threading.current_thread())))
    assert called[-1] == ("late", metadata, threading.main_thread())
    assert producer.partitions_for(topic) == {0, 1, 2}
    assert producer.metrics()["producer-metrics"]["records-delivered-total"] == 1.0
    [record] = read_topic(broker.bootstrap, topic, expected=1)
    assert (record.key, record.value, record.headers) == (b"key", b"VALUE", [("h", b"1")])

    # get(timeout) gives up with kafka-python's KafkaTimeoutError: a record lingering for a minute is not sent yet.
    lingering = KafkaProducer(sidecar_endpoint=daemon.endpoint, linger_ms=60_000)
    waiting = lingering.send(topic, b"lingers")
    with pytest.raises(KafkaTimeoutError, match=r"Timeout after waiting for 0.1 secs."):
        waiting.get(timeout=0.1)
    assert not waiting.is_done and waiting.value is None and waiting.exception is None
    lingering.flush(30)
    assert waiting.get(timeout=0).offset >= 0
    lingering.close()
    producer.close()


def test_delivery_failures_reach_errbacks_as_kafka_python_errors(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("expire", 1)
    daemon = sidecar(proxy.address, settings=SHORT_TIMEOUTS)
    producer = KafkaProducer(sidecar_endpoint=daemon.endpoint)
    producer.send("expire", b"warm").get(30)
    proxy.blackhole()
    failed: list[BaseException] = []
    future = producer.send("expire", b"lost").add_errback(failed.append)
    with pytest.raises(KafkaTimeoutError) as raised:
        future.get(timeout=60)  # delivery.timeout.ms passes: the record fails
    assert future.failed() and future.exception is raised.value and failed == [raised.value]
    assert future.retriable()
    producer.close(timeout=0)


def test_send_to_a_missing_topic_times_out_as_kafka_python_does(broker, sidecar) -> None:
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false"})
    producer = KafkaProducer(sidecar_endpoint=daemon.endpoint, max_block_ms=500)
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    # Caught as kafka-python's own class, by code that imports it from kafka.errors.
    with pytest.raises(kafka.errors.KafkaTimeoutError, match=f"Topic {topic} not present in metadata after 500 ms"):
        producer.send(topic, b"v")
    with pytest.raises(KafkaTimeoutError):
        producer.partitions_for(topic)
    producer.close()


def test_a_setting_the_daemon_owns_warns_once_if_it_differs(broker, topic_factory, daemon) -> None:
    topic = topic_factory(1)
    settings = {"sidecar_endpoint": daemon.endpoint, "acks": 0, "compression_type": "zstd", "retries": float("inf"),
                "enable_idempotence": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with KafkaProducer(**settings) as producer:
                producer.send(topic, b"v").get(30)
                producer.send(topic, b"w").get(30)
    mismatches = sorted(str(w.message) for w in caught if issubclass(w.category, DaemonSettingWarning))
    # acks and the codec differ from the daemon's (all, none); retries (as many as Kafka counts) and idempotence do
    # not.
    assert mismatches == [
        "acks=0 is not what the kafka-sidecar daemon does: its acks is -1, which applies to every record; set it in "
        "the daemon's configuration",
        "compression_type='zstd' is not what the kafka-sidecar daemon does: its compression.type is 'none', which "
        "applies to every record; set it in the daemon's configuration"]
    assert len(read_topic(broker.bootstrap, topic, expected=4)) == 4


def test_close_from_a_callback_closes_without_waiting(broker, topic_factory, sidecar) -> None:
    # One session per process: the next producer gets one only if the closed producer's ended.
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"sidecar.process.max.sessions": 1})
    producer = KafkaProducer(sidecar_endpoint=daemon.endpoint)
    raised: list[BaseException] = []

    def close_it(metadata: RecordMetadata) -> None:
        try:
            producer.close(timeout=30)  # kafka-python closes with timeout 0 from its own thread
        except BaseException as exc:
            raised.append(exc)

    producer.send(topic, b"first").add_callback(close_it).get(30)
    with pytest.raises(IllegalStateError, match="KafkaProducer already closed!"):
        producer.send(topic, b"after close")
    next_one = KafkaProducer(sidecar_endpoint=daemon.endpoint, max_block_ms=30_000)
    assert next_one.send(topic, b"second").get(30).offset >= 0
    next_one.close()
    assert raised == []
    assert sorted(r.value for r in read_topic(broker.bootstrap, topic, expected=2)) == [b"first", b"second"]


class Base64Serializer(kafka.serializer.Serializer):
    """A kafka.serializer.Serializer of an application's: kafka-python 3's serialize(topic, headers, data)."""

    closed = False

    def serialize(self, topic: str, headers: list[tuple[str, bytes]], data: bytes) -> bytes:
        return base64.b64encode(data)

    def close(self) -> None:
        self.closed = True


class UpperSerializer:
    """An object with kafka-python 2's serialize(topic, data), no Serializer subclass."""

    def serialize(self, topic: str, data: str) -> bytes:
        return data.upper().encode()


def test_kafka_pythons_serializers_serialize(broker, topic_factory, daemon) -> None:
    topic = topic_factory(1)
    values = Base64Serializer()
    producer = KafkaProducer(sidecar_endpoint=daemon.endpoint, value_serializer=values,
                             key_serializer=UpperSerializer())
    producer.send(topic, b"value", key="key").get(30)
    json_producer = KafkaProducer(sidecar_endpoint=daemon.endpoint,
                                  value_serializer=kafka.serializer.JsonSerializer(),
                                  key_serializer=kafka.serializer.DefaultSerializer())
    json_producer.send(topic, {"a": 1}, key="k").get(30)
    json_producer.close()
    producer.close()
    assert values.closed
    records = read_topic(broker.bootstrap, topic, expected=2)
    assert [(r.key, r.value) for r in records] == [(b"KEY", b"dmFsdWU="), (b"k", b'{"a": 1}')]
