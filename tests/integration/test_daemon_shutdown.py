"""SIGTERM: the daemon takes no more records, delivers what its clients handed off or reports it failed to
them, and leaves nothing behind; its clients learn of it at once and leave no future pending."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from client_stub import Producer
from client_stub.errors import ProducerClosedError, SidecarUnavailableError
from service.tools.readback import read_topic
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


class Sender(threading.Thread):
    """Sends numbered records as fast as it can until send() refuses; keeps every future it got."""

    def __init__(self, producer: Producer, topic: str) -> None:
        super().__init__(name="sender")
        self.producer = producer
        self.topic = topic
        self.futures: dict[bytes, concurrent.futures.Future] = {}
        self.refusal: BaseException | None = None

    def run(self) -> None:
        n = 0
        while True:
            value = b"record-%d" % n
            try:
                self.futures[value] = self.producer.send(self.topic, value, key=b"%d" % (n % 97))
            except Exception as exc:
                self.refusal = exc
                return
            n += 1


def left_behind(daemon: SidecarProcess) -> set[str]:
    """What is in the daemon's directory beside its log: its endpoint's socket, lock and memory socket, if left."""
    return set(os.listdir(daemon.log_path.parent)) - {daemon.log_path.name}


def test_sigterm_under_load_delivers_every_record_handed_off_and_fails_the_rest_at_once(
        broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint, max_block_ms=2000) as producer:
        sender = Sender(producer, topic)
        sender.start()
        assert wait_until(lambda: len(sender.futures) >= 50_000)
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(60) == 0, daemon.log_tail()
        sender.join(30)
        assert not sender.is_alive()
        # A record sent after the shutdown waited max_block_ms for another daemon, then failed saying why.
        assert isinstance(sender.refusal, SidecarUnavailableError)
        assert "shut down (SIGTERM)" in str(sender.refusal)
        # No future is left pending: each record handed off was delivered (or its failure reported).
        done, pending = concurrent.futures.wait(sender.futures.values(), timeout=30)
        assert not pending
        assert producer.flush(0) == 0
    delivered = {value for value, future in sender.futures.items() if future.exception() is None}
    errors = Counter(type(f.exception()).__name__ for f in sender.futures.values() if f.exception())
    assert not errors, errors
    # The brokers have every delivered record once, and nothing else.
    read = Counter(record.value for record in read_topic(broker.bootstrap, topic, expected=len(delivered),
                                                          timeout=60))
    assert set(read) == delivered and set(read.values()) == {1}
    assert "shutting down: delivering what the clients handed off" in daemon.log_path.read_text()
    assert left_behind(daemon) == set()


def test_what_cannot_be_delivered_by_the_close_timeout_is_reported_failed(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("held", 1)
    # The drain outlasts sidecar.client.timeout.ms: the client, which sends nothing more, still says it lives.
    daemon = sidecar(tansu.bootstrap, settings={"sidecar.close.timeout.ms": 3000, "sidecar.client.timeout.ms": 1000,
                                                "request.timeout.ms": 60000, "delivery.timeout.ms": 120000})
    with Producer(daemon.endpoint, max_block_ms=1000) as producer:
        assert producer.send("held", b"first").result(30).offset == 0
        proxy.blackhole()  # the broker hears nothing more, and says nothing
        futures = [producer.send("held", b"held %d" % n) for n in range(100)]
        producer.flush(0)  # sealed and handed off: in the daemon's hands once it has the seal notice
        assert wait_until(lambda: daemon.stats()["sidecar"]["records-sealed-total"] >= 1 + 100)
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(30) == 0, daemon.log_tail()
        done, pending = concurrent.futures.wait(futures, timeout=30)
        assert not pending
    assert {type(f.exception()) for f in futures} == {ProducerClosedError}
    assert "before this batch was delivered" in str(futures[0].exception())
    assert "silent for" not in daemon.log_path.read_text()
    assert left_behind(daemon) == set()


def test_a_send_waiting_for_blocks_at_the_shutdown_waits_for_the_next_daemon(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("held", 1)
    # A pool of 8 blocks, which the batches the broker never answers hold.
    daemon = sidecar(tansu.bootstrap, settings={"buffer.memory": 8 * 16384, "sidecar.close.timeout.ms": 1000,
                                                "request.timeout.ms": 60000, "delivery.timeout.ms": 120000})
    with Producer(daemon.endpoint, max_block_ms=5000) as producer:
        producer.send("held", b"first").result(30)
        proxy.blackhole()
        held = [producer.send("held", bytes(15_000)) for _ in range(8)]
        waiting: list[BaseException] = []

        def send_large() -> None:  # three blocks, for which it waits
            try:
                producer.send("held", bytes(40_000))
            except BaseException as exc:
                waiting.append(exc)

        sender = threading.Thread(target=send_large)
        sender.start()
        # Two requests wait in the pool's FIFO: the client's for spare blocks, and the send's for its run.
        assert wait_until(lambda: daemon.stats()["producer"]["waiting-threads"] == 2), waiting
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(30) == 0, daemon.log_tail()
        sender.join(30)
        assert [type(exc) for exc in waiting] == [SidecarUnavailableError], waiting
        assert "shut down (SIGTERM)" in str(waiting[0])
        concurrent.futures.wait(held, timeout=30)
        assert {type(f.exception()) for f in held} == {ProducerClosedError}


def test_a_second_signal_cuts_the_drain_short(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("held", 1)
    daemon = sidecar(tansu.bootstrap, settings={"sidecar.close.timeout.ms": 600000, "request.timeout.ms": 600000,
                                                "delivery.timeout.ms": 1200000})
    with Producer(daemon.endpoint, max_block_ms=1000) as producer:
        producer.send("held", b"first").result(30)
        proxy.blackhole()
        future = producer.send("held", b"held")
        producer.flush(0)
        assert wait_until(lambda: daemon.stats()["sidecar"]["records-sealed-total"] >= 2)
        daemon.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "shutting down" in daemon.log_path.read_text())
        daemon.process.send_signal(signal.SIGINT)  # an operator's second Ctrl-C
        assert daemon.process.wait(30) == 0, daemon.log_tail()
        assert isinstance(future.exception(30), ProducerClosedError)


def test_sigterm_leaves_no_directory_the_daemon_made(broker, tmp_path: Path) -> None:
    endpoint_dir = tmp_path / "run" / "kafka-sidecar"
    with SidecarProcess(broker.bootstrap, endpoint=f"ipc://{endpoint_dir}/sidecar.sock") as daemon:
        assert endpoint_dir.is_dir()
        assert daemon.stop() == 0
    assert not endpoint_dir.exists() and (tmp_path / "run").is_dir()
