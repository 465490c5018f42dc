"""confluent-kafka's Producer on kafka-sidecar (client_stub.compat.confluent), against a real daemon and broker.

confluent-kafka's own producer examples run with only their imports changed (json_producer.py's Schema Registry
client is confluent-kafka's in-process one); delivery callbacks run on the thread
that calls poll() or flush(); a full pool raises BufferError; a missing topic reaches on_delivery as
UNKNOWN_TOPIC_OR_PART, as the real confluent-kafka reports it on the same broker; a setting the daemon owns that
differs from the daemon's warns once. What arrived is read back with the confluent-kafka verifier.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest

from client_stub.compat import DaemonSettingWarning
from client_stub.compat.confluent import (
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from service.tools.readback import read_topic
from tests.support.broker import TansuBroker
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import HANG_S
from tests.support.workers import default_sigint

ROOT = Path(__file__).parents[2]
EXAMPLES = Path(__file__).parent / "compat_examples"


@pytest.fixture(scope="module")
def daemon(broker: TansuBroker) -> Iterator[SidecarProcess]:
    """One daemon with the default settings for the tests of this module that need no other."""
    with SidecarProcess(broker.bootstrap) as process:
        yield process


def example_env(daemon: SidecarProcess) -> dict[str, str]:
    """An example's environment: the daemon's endpoint, and this tree on the import path."""
    return {**os.environ, "KAFKA_SIDECAR_ENDPOINT": daemon.endpoint,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class Reports:
    """An on_delivery callback keeping (err, msg, the thread it ran on)."""

    def __init__(self) -> None:
        self.calls: list[tuple[KafkaError | None, Message, threading.Thread]] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.calls.append((err, msg, threading.current_thread()))


# -- confluent-kafka's examples ---------------------------------------------------------------------------------


def test_the_delivery_report_example_runs_unchanged(broker, topic_factory, daemon) -> None:
    topic = topic_factory(3)
    lines = [f"line {n}" for n in range(50)]
    result = subprocess.run([sys.executable, str(EXAMPLES / "confluent_producer.py"), "ignored-by-the-sidecar", topic],
                            input="\n".join(lines) + "\n", capture_output=True, text=True, env=example_env(daemon),
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    delivered = [line for line in result.stderr.splitlines() if line.startswith(f"% Message delivered to {topic} [")]
    assert len(delivered) == 50, result.stderr
    assert "failed delivery" not in result.stderr and "queue is full" not in result.stderr
    records = read_topic(broker.bootstrap, topic, expected=50)
    assert sorted(r.value for r in records) == sorted(line.encode() for line in lines)


def test_the_json_example_runs_with_its_serializer(broker, topic_factory, daemon) -> None:
    topic = topic_factory(2)
    users = [("Ada", "1 Loop Road", 7, "green"), ("Grace", "2 Stack Street", 42, "blue"),
             ("Linus", "3 Fork Way", 3, "red")]
    answers = "".join(f"{name}\n{address}\n{number}\n{color}\n" for name, address, number, color in users)
    process = subprocess.Popen([sys.executable, str(EXAMPLES / "confluent_json_producer.py"), "-b", "ignored",
                                "-s", "mock://", "-t", topic], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=example_env(daemon), cwd=ROOT,
                               preexec_fn=default_sigint)  # the example stops on ^C
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(answers.encode())
        process.stdin.flush()
        # Each user is asked for by name; once all are in, the example waits at the next "Enter name: ", where it
        # stops on ^C and flushes.
        seen = _read_until(process.stdout.fileno(), b"Enter name: ", len(users) + 1)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    output = (seen + out).decode()
    assert process.returncode == 0, err.decode()
    assert output.count(f"successfully produced to {topic} [") == len(users), output
    framed = [r.value for r in read_topic(broker.bootstrap, topic, expected=len(users))]
    # JSONSerializer's framing: magic byte 0 and the schema's id (4 bytes), then the JSON text.
    assert all(value[0] == 0 for value in framed), framed
    values = [json.loads(value[5:]) for value in framed]
    # user_to_dict leaves the address out.
    assert sorted(values, key=lambda v: v["name"]) == [
        {"name": name, "favorite_number": number, "favorite_color": color} for name, _, number, color in users]


def _read_until(fd: int, marker: bytes, count: int, timeout: float = 60) -> bytes:
    """Read from ``fd`` until ``marker`` has come ``count`` times."""
    data = b""
    while data.count(marker) < count:
        ready, _, _ = select.select([fd], [], [], timeout)
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            raise AssertionError(f"the example stopped or went silent after: {data.decode()!r}")
        data += chunk
    return data


# -- delivery callbacks ---------------------------------------------------------------------------------------


def test_callbacks_run_inside_poll_and_flush_on_the_calling_thread(broker, topic_factory, daemon) -> None:
    topic = topic_factory(3)
    reports = Reports()
    producer = Producer({"bootstrap.servers": "ignored", "sidecar.endpoint": daemon.endpoint, "linger.ms": 5})
    for n in range(20):
        producer.produce(topic, f"v{n}", key=f"k{n}", headers={"n": str(n)}, timestamp=1_700_000_000_000 + n,
                         on_delivery=reports)
    # Every record is in the topic, and no callback ran: none runs outside poll() and flush().
    assert len(read_topic(broker.bootstrap, topic, expected=20)) == 20
    assert reports.calls == []
    assert len(producer) == 20  # the reports not yet served count
    assert producer.flush(30) == 0
    assert len(producer) == 0
    assert {thread for _, _, thread in reports.calls} == {threading.main_thread()}
    assert [err for err, _, _ in reports.calls] == [None] * 20
    by_value = {msg.value(): msg for _, msg, _ in reports.calls}
    for n in range(20):
        msg = by_value[f"v{n}".encode()]
        assert (msg.topic(), msg.key(), msg.headers(), msg.timestamp()) == (
            topic, f"k{n}".encode(), [("n", str(n).encode())], (TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + n))
        assert msg.partition() in (0, 1, 2) and msg.offset() >= 0 and msg.latency() >= 0 and msg.error() is None

    # Another thread's poll() runs the callbacks of the reports it serves on that thread.
    producer.produce(topic, b"from another thread's poll", callback=reports)
    served: list[int] = []
    poller = threading.Thread(target=lambda: served.append(producer.poll(30)), name="application-poller")
    poller.start()
    poller.join(60)
    assert served == [1]
    assert reports.calls[-1][2] is poller and reports.calls[-1][1].value() == b"from another thread's poll"
    assert producer.poll(0) == 0

    assert sorted(producer.list_topics(topic, timeout=HANG_S).topics[topic].partitions) == [0, 1, 2]
    # Without a topic, the health check confluent-kafka's users write: the daemon answered; the topics produced to.
    listed = producer.list_topics(timeout=HANG_S)
    assert list(listed.topics) == [topic] and sorted(listed.topics[topic].partitions) == [0, 1, 2]
    assert producer.close()
    with pytest.raises(RuntimeError, match="Producer has been closed"):
        producer.produce(topic, b"after close")


# -- errors as confluent-kafka reports them -------------------------------------------------------------------


def test_a_full_pool_raises_buffer_error(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(8)
    # Four blocks of 16 KiB; the records linger for a minute, each partition's batch holding a block.
    daemon = sidecar(broker.bootstrap, settings={"buffer.memory": 4 * 16384, "batch.size": 16384})
    producer = Producer({"sidecar.endpoint": daemon.endpoint, "linger.ms": 60_000})
    producer.produce(topic, b"first", partition=0)
    producer.flush(30)  # the session and the topic's metadata are there: what follows is handed off at once
    accepted = []
    with pytest.raises(BufferError):
        for partition in range(8):
            producer.produce(topic, b"p%d" % partition, partition=partition)
            accepted.append(partition)
    assert 1 <= len(accepted) <= 4
    assert len(producer) == len(accepted)  # produce() did not wait: the refused record is not counted
    # As confluent-kafka's users do: serve the queue, then produce again.
    assert producer.flush(30) == 0
    refused = len(accepted)
    producer.produce(topic, b"p%d" % refused, partition=refused)
    assert producer.flush(30) == 0
    values = {r.value for r in read_topic(broker.bootstrap, topic, expected=len(accepted) + 2)}
    assert values == {b"first", *(b"p%d" % p for p in range(refused + 1))}

    producer.close()  # its spare blocks go back to the pool

    # queue.buffering.max.messages: BufferError once that many records wait, with room in the pool.
    limited = Producer({"sidecar.endpoint": daemon.endpoint, "linger.ms": 60_000, "queue.buffering.max.messages": 2})
    limited.produce(topic, b"one", partition=0)
    limited.produce(topic, b"two", partition=0)
    with pytest.raises(BufferError, match="Local: Queue full"):
        limited.produce(topic, b"three", partition=0)
    assert limited.flush(30) == 0
    limited.produce(topic, b"three", partition=0)
    assert limited.flush(30) == 0
    limited.close()


def test_a_missing_topic_reaches_on_delivery_as_confluent_kafka_reports_it(broker, sidecar) -> None:
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false"})
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    reports = Reports()
    producer = Producer({"sidecar.endpoint": daemon.endpoint, "topic.metadata.propagation.max.ms": 500})
    producer.produce(topic, b"nowhere to go", on_delivery=reports)  # does not raise, as confluent-kafka's
    assert producer.flush(30) == 0
    [(err, msg, thread)] = reports.calls
    assert thread is threading.main_thread()
    assert (err.code(), err.name(), msg.topic(), msg.partition(), msg.offset(), msg.value()) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART, "UNKNOWN_TOPIC_OR_PART", topic, None, None, b"nowhere to go")
    assert err == 3 and msg.error() is err
    assert isinstance(err, confluent_kafka.KafkaError)  # confluent-kafka's own class, installed

    # confluent-kafka itself, on the same broker with auto-creation off, reports the same.
    theirs: list[tuple[confluent_kafka.KafkaError, confluent_kafka.Message]] = []
    real = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": False,
                                     "topic.metadata.propagation.max.ms": 500})
    real.produce(topic, b"nowhere to go", on_delivery=lambda e, m: theirs.append((e, m)))
    assert real.flush(30) == 0
    [(their_err, their_msg)] = theirs
    assert (err.code(), err.name(), err.str(), err.retriable(), msg.partition(), msg.offset()) == (
        their_err.code(), their_err.name(), their_err.str(), their_err.retriable(), their_msg.partition(),
        their_msg.offset())

    # A record of an explicit partition fails with it, as confluent-kafka reports it (another topic: confluent-kafka
    # refuses at produce() a topic it knows to be missing).
    other = f"missing-{uuid.uuid4().hex[:8]}"
    producer.produce(other, b"to partition 0", partition=0, on_delivery=reports)
    real.produce(other, b"to partition 0", partition=0, on_delivery=lambda e, m: theirs.append((e, m)))
    assert producer.flush(30) == real.flush(30) == 0
    (err, msg, _), (their_err, their_msg) = reports.calls[-1], theirs[-1]
    assert (err.code(), msg.partition(), msg.offset()) == (their_err.code(), their_msg.partition(),
                                                           their_msg.offset()) == (3, 0, None)
    producer.close()


# -- settings -------------------------------------------------------------------------------------------------


def test_a_setting_the_daemon_owns_warns_once_if_it_differs(broker, topic_factory, daemon) -> None:
    topic = topic_factory(1)
    config = {"sidecar.endpoint": daemon.endpoint, "request.required.acks": 1, "compression.type": "lz4",
              "enable.idempotence": True, "message.timeout.ms": 120_000}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = Producer(config), Producer(config)
        for producer in (first, second):
            producer.produce(topic, b"v")
            assert producer.flush(30) == 0
            producer.produce(topic, b"w")
            assert producer.flush(30) == 0
    mismatches = [str(w.message) for w in caught if issubclass(w.category, DaemonSettingWarning)]
    # acks and the codec differ from the daemon's (all, none); idempotence and the timeout do not.
    assert sorted(mismatches) == [
        "compression.type='lz4' is not what the kafka-sidecar daemon does: its compression.type is 'none', which "
        "applies to every record; set it in the daemon's configuration",
        "request.required.acks=1 is not what the kafka-sidecar daemon does: its acks is -1, which applies to every "
        "record; set it in the daemon's configuration"]
    assert all(w.filename == __file__ for w in caught if issubclass(w.category, DaemonSettingWarning))
    assert len(read_topic(broker.bootstrap, topic, expected=4)) == 4
    first.close()
    second.close()


# -- the producer's life ----------------------------------------------------------------------------------------


def test_producers_dropped_without_close_end_their_sessions(broker, topic_factory, sidecar) -> None:
    # confluent-kafka's usual pattern: a Producer made in a function, flushed, never closed. More of them, one
    # after another, than the daemon takes sessions of one process (sidecar.process.max.sessions).
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"sidecar.process.max.sessions": 2})

    def send_one(n: int) -> int:
        producer = Producer({"sidecar.endpoint": daemon.endpoint})
        producer.produce(topic, b"v%d" % n)
        return producer.flush(30)

    assert [send_one(n) for n in range(5)] == [0] * 5
    values = {r.value for r in read_topic(broker.bootstrap, topic, expected=5)}
    assert values == {b"v%d" % n for n in range(5)}


def test_produce_refusals_keep_their_reason(broker, topic_factory, daemon) -> None:
    topic = topic_factory(2)
    producer = Producer({"sidecar.endpoint": daemon.endpoint})
    producer.produce(topic, b"known", partition=1)
    assert producer.flush(30) == 0
    # Only a partition the topic does not have is _UNKNOWN_PARTITION, as librdkafka's.
    with pytest.raises(confluent_kafka.KafkaException) as unknown:  # confluent-kafka's own class, installed
        producer.produce(topic, b"nowhere", partition=2)
    assert unknown.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
    producer.close()
    # An endpoint that cannot be connected to is a bad configuration, with the reason given.
    misconfigured = Producer({"sidecar.endpoint": "bogus://nowhere"})
    with pytest.raises(KafkaException) as invalid:
        misconfigured.produce(topic, b"v", partition=0)
    err = invalid.value.args[0]
    assert err.code() == KafkaError._INVALID_ARG
    assert "cannot connect to the kafka-sidecar endpoint 'bogus://nowhere'" in err.str()
    misconfigured.close()


def test_records_waiting_on_a_broken_hand_off_fail_instead_of_hanging(topic_factory, daemon, monkeypatch,
                                                                      caplog) -> None:
    topic = topic_factory(1)
    reports = Reports()
    producer = Producer({"sidecar.endpoint": daemon.endpoint})

    def broken(topic: str, timeout: float | None = None) -> list[int]:
        raise RuntimeError("a bug")

    # The topic's metadata is not there yet: the records wait in the process, for a hand-off that breaks.
    monkeypatch.setattr(producer._producer, "partitions_for", broken)
    producer.produce(topic, b"one", on_delivery=reports)
    producer.produce(topic, b"two", on_delivery=reports)
    assert producer.flush(30) == 0
    assert [(err.code(), msg.value()) for err, msg, _ in reports.calls] == [
        (KafkaError._FAIL, b"one"), (KafkaError._FAIL, b"two")]
    assert "RuntimeError('a bug')" in reports.calls[0][0].str()
    assert "RuntimeError: a bug" in caplog.text
    monkeypatch.undo()
    producer.produce(topic, b"three", on_delivery=reports)  # the topic's records are handed off again
    assert producer.flush(30) == 0
    assert reports.calls[-1][0] is None
    producer.close()
