"""The producer's I/O thread against a fake daemon (tests/support/fake_daemon.py) that speaks the IPC protocol over
real ZeroMQ and a real memory socket: faults a real daemon does not make, and how the thread carries out what its
session asks (under the producer's lock, waking send() when what it waits for changed, logging without the lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

import pytest

import client_stub.session
from client_stub import Producer
from client_stub.contract import ipc
from client_stub.errors import SidecarUnavailableError
from client_stub.session import HELLO_RETRY_S, Session, SessionProtocolError
from tests.support.fake_daemon import FakeDaemon
from tests.support.waiting import HANG_S, wait_until


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    fake = FakeDaemon()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def producer(daemon: FakeDaemon) -> Iterator[Producer]:
    producer = Producer(daemon.endpoint, max_block_ms=int(HANG_S * 1000))
    try:
        yield producer
    finally:
        producer.close(HANG_S)


@pytest.fixture
def quick_hello_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A HELLO whose session did not come is said again at the next heartbeat, not HELLO_RETRY_S after."""
    monkeypatch.setattr(client_stub.session, "HELLO_RETRY_S", 0.0)


def open_fds_to(name: str) -> list[int]:
    """This process's file descriptors open on the memory file ``name``."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed since
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} "):
                fds.append(int(fd))
    return fds


# -- records go by the segment ----------------------------------------------------------------------


def test_records_go_by_the_segment_with_a_wakeup_for_the_batch_opened_and_none_for_each_record(
        daemon: FakeDaemon) -> None:
    # The daemon claims the batch at linger.ms (a minute here) or when flush() publishes it full and says so.
    producer = Producer(daemon.endpoint, linger_ms=60_000, max_block_ms=int(HANG_S * 1000))
    try:
        futures = [producer.send("orders", b"v%d" % n, partition=0) for n in range(50)]
        assert producer.flush(HANG_S) == 0
        assert [f.result(0).offset for f in futures] == list(range(50))
    finally:
        producer.close(HANG_S)
    [claimed] = daemon.claimed
    assert (claimed.topic, claimed.partition, claimed.record_count) == ("orders", 0, 50)
    # What the producer said, all of it once its GOODBYE is in (it may be claimed before its WAKEUP comes).
    assert wait_until(lambda: daemon.goodbyes == 1, HANG_S)
    assert daemon.wakeups == 2  # the batch opened (the fake never says it watches it), and flush()
    assert len(daemon.block_requests) == 1


def test_the_header_says_whether_the_process_waits_on_a_report_and_a_future_waited_on_asks_for_them_now(
        daemon: FakeDaemon) -> None:
    # The daemon claims the batches when flush() publishes them full and says so, not at their linger.ms.
    producer = Producer(daemon.endpoint, linger_ms=60_000, max_block_ms=int(HANG_S * 1000))
    try:
        producer.send("orders", b"fire and forget", partition=0)
        assert daemon.reports_wanted() == 0
        called = threading.Event()
        producer.send("orders", b"called back", partition=0, on_delivery=lambda error, metadata: called.set())
        assert daemon.reports_wanted() == 1
        assert producer.flush(HANG_S) == 0 and called.is_set()
        # Nothing in flight: nothing waited on.
        assert wait_until(lambda: daemon.reports_wanted() == 0, HANG_S)
        daemon.reports_batches = False
        future = producer.send("orders", b"waited on", partition=0)
        assert wait_until(lambda: daemon.wakeups == 3, HANG_S)  # the batch opened (the fake never watches)
        assert daemon.reports_wanted() == 0
        with pytest.raises(TimeoutError):
            future.result(0)
        # Waited on: the header says so, and the daemon is told to report now.
        assert daemon.reports_wanted() == 1
        assert wait_until(lambda: daemon.wakeups == 4, HANG_S)
        daemon.reports_batches = True
    finally:
        producer.close(HANG_S)


# -- a memory handshake that fails is said again, whatever failed -----------------------------------


@pytest.mark.usefixtures("quick_hello_retry")
def test_a_welcome_whose_token_is_no_bytes_fails_its_handshake_and_the_next_hello_has_the_session(
        daemon: FakeDaemon, producer: Producer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="client_stub.producer")
    daemon.faulty_welcomes.append({"memory_token": "not bytes"})  # ipc.decode checks no field's kind
    producer.wait_for_daemon(HANG_S)
    assert len(daemon.hellos) >= 2
    assert producer.send("orders", b"v").result(HANG_S).offset == 0
    [failed] = [r for r in caplog.records if "memory handshake" in r.getMessage()]
    assert "failed (TypeError" in failed.getMessage() and failed.exc_info is not None


@pytest.mark.usefixtures("quick_hello_retry")
def test_a_segment_that_cannot_be_mapped_fails_its_handshake_leaves_nothing_open_and_the_next_hello_has_the_session(
        daemon: FakeDaemon, producer: Producer) -> None:
    daemon.faulty_segments.append(0)  # a memory file of no size: "mmap length is greater than file size"
    producer.wait_for_daemon(HANG_S)
    assert daemon.segments_handed == 2  # the session is the second segment's, not the one that would not map
    assert producer.send("orders", b"v").result(HANG_S).offset == 0
    # The first handshake's connection is closed (the daemon sees its end), and so is its segment.
    assert wait_until(lambda: daemon.hung_up_by_client == 1, HANG_S)
    assert open_fds_to("fake-segment-1") == []


# -- what the session logs, without the producer's lock ---------------------------------------------


class LockWitness(logging.Handler):
    """A handler that would send through the producer, as one that sends logs to Kafka: what it writes, and
    whether the producer's lock was free to take then (the test sees to it that no other thread holds it)."""

    def __init__(self, producer: Producer) -> None:
        super().__init__(logging.INFO)
        self._lock = producer._lock
        self.written: list[tuple[str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        free = self._lock.acquire(blocking=False)
        if free:
            self._lock.release()
        self.written.append((record.getMessage(), free))

    def saw(self, text: str) -> bool:
        return any(text in message for message, _ in self.written)


@pytest.mark.usefixtures("quick_hello_retry")
def test_what_the_session_logs_is_written_with_the_producers_lock_free(
        daemon: FakeDaemon, producer: Producer, caplog: pytest.LogCaptureFixture) -> None:
    # Written under the lock, a handler that sends through this producer would deadlock it, and a slow one would
    # stall every send().
    caplog.set_level(logging.INFO, logger="client_stub.producer")
    witness = LockWitness(producer)
    logger = logging.getLogger("client_stub.producer")
    logger.addHandler(witness)
    try:
        daemon.handshake_refusals.append("this process has as many sessions as it may")
        # Started without waiting on the producer (wait_for_daemon would take its lock as the I/O thread logs).
        producer._ensure_started()
        assert wait_until(lambda: daemon.segments_handed == 1, HANG_S)  # the second HELLO's session
        # What the daemon says next the I/O thread reads once the handshake, made as it reads, is over.
        daemon.say(ipc.Error(ipc.ERROR_REFUSED, "block 9 is not yours"))
        daemon.take_back = True
        daemon.say(ipc.Error(ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first"))
        assert wait_until(lambda: witness.saw("gave back the session it ended"), HANG_S)
        daemon.reports_batches = False
        future = producer.send("orders", b"v")
        assert wait_until(lambda: daemon.claimed, HANG_S)
        daemon.say(ipc.Shutdown("SIGTERM"))
        assert wait_until(lambda: witness.saw("is shutting down (SIGTERM)"), HANG_S)
        daemon.handshake_refusals.append("not a segment of this daemon's")
        daemon.hang_up()  # the next (the same fake) cannot take the session back: its record's fate is unknown
        assert isinstance(future.exception(HANG_S), SidecarUnavailableError)
        assert wait_until(lambda: witness.saw("1 record(s) handed to the lost session are failed"), HANG_S)
    finally:
        logger.removeHandler(witness)
    for text in ("as many sessions as it may", "refused a message: block 9", "does not know this client",
                 "lost the session", "did not take the lost session back"):
        assert witness.saw(text), text
    assert [message for message, free in witness.written if not free] == []


# -- who is woken ----------------------------------------------------------------------------------


def test_a_heartbeat_wakes_no_one_waiting_on_the_producer() -> None:
    with contextlib.closing(FakeDaemon(heartbeat_interval_ms=10)) as daemon:
        producer = Producer(daemon.endpoint)
        try:
            producer.wait_for_daemon(HANG_S)
            waiting, woken = threading.Event(), threading.Event()

            def wait_on_the_producer() -> None:
                # As a send() waiting for blocks with no deadline (max_block_ms=0): until what it waits for changes.
                with producer._cond:
                    waiting.set()
                    producer._cond.wait()
                    woken.set()

            waiter = threading.Thread(target=wait_on_the_producer)
            waiter.start()
            assert waiting.wait(HANG_S)
            heartbeats = daemon.heartbeats
            # A few may have been on their way before the waiter waited; the last ones were said after.
            assert wait_until(lambda: daemon.heartbeats >= heartbeats + 5, HANG_S)
            assert not woken.is_set()
            with producer._cond:
                producer._cond.notify_all()
            waiter.join(HANG_S)
        finally:
            producer.close(HANG_S)


def test_a_send_waiting_for_blocks_looks_again_when_the_session_is_lost(daemon: FakeDaemon) -> None:
    producer = Producer(daemon.endpoint, max_block_ms=0)
    try:
        producer.partitions_for("orders", HANG_S)
        daemon.grants_blocks = False  # the send() waits for the daemon's answer, without a deadline
        daemon.answers_hellos = False  # and no session comes after this one
        raised: list[BaseException] = []

        def send() -> None:
            try:
                producer.send("orders", b"v")
            except BaseException as exc:
                raised.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        assert wait_until(lambda: daemon.block_requests, HANG_S)  # it waits for the daemon's answer
        daemon.hang_up()
        sender.join(HANG_S)
        assert not sender.is_alive()
        [error] = raised
        assert isinstance(error, SidecarUnavailableError)
    finally:
        producer.close(HANG_S)


# -- the client's own bugs, and what the next changes may bring --------------------------------------


def test_a_session_told_what_it_cannot_take_is_logged_as_this_clients_bug(
        daemon: FakeDaemon, producer: Producer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    producer.wait_for_daemon(HANG_S)

    def out_of_turn(self: Session, error: ipc.Error, now: float) -> None:
        raise SessionProtocolError("an ERROR in a state that cannot take it")

    monkeypatch.setattr(Session, "refused", out_of_turn)
    caplog.set_level(logging.ERROR, logger="client_stub.producer")
    daemon.say(ipc.Error(ipc.ERROR_REFUSED, "block 9 is not yours"))
    assert wait_until(lambda: caplog.records, HANG_S)
    [logged] = caplog.records
    assert "a bug of this client" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[0] is SessionProtocolError


def test_a_message_whose_handling_says_hello_on_a_new_socket_leaves_the_thread_reading_the_new_one(
        daemon: FakeDaemon, producer: Producer, monkeypatch: pytest.MonkeyPatch) -> None:
    # No message's handling does today; the next changes may. Here an ERROR has the HELLO said again at once.
    monkeypatch.setattr(Session, "refused", lambda self, error, now: self.tick(now + HELLO_RETRY_S + 1))
    daemon.refusals.append(ipc.Error(ipc.ERROR_SHUTTING_DOWN, "the kafka-sidecar daemon is shutting down"))
    producer.wait_for_daemon(HANG_S)  # the WELCOME comes on the new socket
    assert len(daemon.hellos) >= 2
    assert producer.send("orders", b"v").result(HANG_S).offset == 0
