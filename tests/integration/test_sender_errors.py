"""The Sender's handling of broker errors, against FakeBroker: retries, final errors, splits,
ordering, idempotence, acks=0, flush and close, figures.

Each broker answer the Sender must handle is scripted with a Produce handler; what the
broker received (requests, record batches decoded from the wire) is checked alongside
each batch's outcome. :class:`SequencedLog` keeps producer state per partition as a
Kafka broker does, so that sequence errors come when a real broker would give them.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from client_stub.errors import (
    AuthorizationError,
    BrokerError,
    InvalidRecordError,
    KafkaError,
    KafkaTimeoutError,
    RecordTooLargeError,
    RetriableError,
    UnsupportedError,
)
from service.config import ProducerConfig
from service.network.client import monotonic_ms
from service.producer.batch import FinalState, ProducerBatch, TopicPartition
from service.producer.core import ProducerCore
from service.protocol import messages as m
from service.protocol.api import encode_request
from service.tools.embedded import free_port
from tests.support.batches import Deliveries, SentRecord, encode_records
from tests.support.broker_codec import RequestHeader
from tests.support.core import JumpingClock, run_until
from tests.support.fake_broker import CLOSE, FakeBroker, codec_api_versions, produce_response
from tests.support.producer_batches import queued
from tests.support.record_batches import RecordBatch, decode_batches
from tests.support.waiting import HANG_S, wait_until

TOPIC = "orders"
PRODUCE, METADATA, INIT_PRODUCER_ID = m.PRODUCE, m.METADATA, m.INIT_PRODUCER_ID

NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
NETWORK_EXCEPTION = 13
RECORD_LIST_TOO_LARGE = 18
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
TOPIC_AUTHORIZATION_FAILED = 29
INVALID_TIMESTAMP = 32
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
KAFKA_STORAGE_ERROR = 56
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87
UNKNOWN_SERVER_ERROR = -1

PartitionResponse = m.ProduceResponse.TopicProduceResponse.PartitionProduceResponse


def expired_after_ms(batch: ProducerBatch) -> int:
    """How old ``batch`` was when it expired, read from its error: Kafka's message, as Java's Sender writes it."""
    assert isinstance(batch.error, KafkaTimeoutError)
    match = re.fullmatch(rf"Expiring {batch.record_count} record\(s\) for {batch.tp.topic}-{batch.tp.partition}:"
                         r"(\d+) ms has passed since batch creation", str(batch.error))
    assert match, str(batch.error)
    return int(match[1])


@pytest.fixture
def make_core() -> Iterator[Callable[..., ProducerCore]]:
    """``make_core(*brokers, clock=None, **settings)``: a core bootstrapped from ``brokers``
    (settings with ``_`` for ``.``; retry.backoff.ms 10 and no coalescing unless given), closed at teardown."""
    cores: list[ProducerCore] = []

    def make(*brokers: FakeBroker, clock: Callable[[], int] | None = None, **settings: Any) -> ProducerCore:
        settings.setdefault("retry_backoff_ms", 10)
        # These tests follow batches one by one through requests and retries: the small batches they
        # queue must not be coalesced (coalescing has tests of its own).
        settings.setdefault("sidecar_coalesce_batches", False)
        config = ProducerConfig({"bootstrap.servers": ",".join(b.address for b in brokers),
                                 **{k.replace("_", "."): v for k, v in settings.items()}})
        core = ProducerCore(config, clock=clock or monotonic_ms)
        cores.append(core)
        return core

    yield make
    for core in cores:
        core.close(0)


_values = itertools.count()


def new_batches(deliveries: Deliveries, partition: int = 0, batches: int = 1, records: int = 5,
                created_ms: int | None = None) -> list[ProducerBatch]:
    """``batches`` batches of ``records`` records for ``partition``, values unique in the module."""
    now = int(time.time() * 1000)
    out = []
    for _ in range(batches):
        sent = []
        for _ in range(records):
            n = next(_values)
            sent.append(SentRecord(partition, f"k{n}".encode(), f"v-{n:08d}".encode().ljust(40, b"."), (), now))
        out.append(deliveries.batch(partition, sent, created_ms=created_ms))
    return out


def values_of(batch: ProducerBatch, deliveries: Deliveries) -> list[bytes | None]:
    """The values the test put in ``batch`` (one it built, not a part of a split)."""
    records = next(r for b, r in deliveries.sent[batch.tp.partition] if b is batch)
    return [r.value for r in records]


def produce_batches(broker: FakeBroker, partition: int = 0) -> list[RecordBatch]:
    """Every batch for ``partition`` that reached ``broker`` in a Produce request (answered or not), in order."""
    out = []
    for _, request in broker.requests_of(PRODUCE):
        for topic in request.topic_data:
            for p in topic.partition_data:
                if topic.name == TOPIC and p.index == partition:
                    out.extend(decode_batches(bytes(p.records)))
    return out


def log_of(broker: FakeBroker, partition: int = 0) -> list[RecordBatch]:
    """The batches ``broker`` appended to its log of ``partition``, in order."""
    return [b for raw in broker.batches.get((TOPIC, partition), []) for b in decode_batches(raw)]


def log_values(broker: FakeBroker, partition: int = 0) -> list[bytes | None]:
    return [r.value for b in log_of(broker, partition) for r in b.records]


def fail_first(broker: FakeBroker, count: int, error: int, message: str | None = None) -> Callable[..., Any]:
    """A Produce handler answering ``error`` to the first ``count`` requests, then as a healthy broker."""
    answered = itertools.count()

    def handle(header: RequestHeader, request: m.ProduceRequest) -> Any:
        if next(answered) < count:
            return produce_response(request, error, error_message=message)
        return broker.default_response(header, request)

    return handle


def fresh_producer_ids(broker: FakeBroker, first: int = 1000) -> None:
    """Give every InitProducerId a new producer id (epoch 0), as a broker does for a producer without one."""
    ids = itertools.count(first)
    broker.set_handler(INIT_PRODUCER_ID,
                       lambda header, request: m.InitProducerIdResponse(producer_id=next(ids), producer_epoch=0))


@dataclass
class _ProducerState:
    producer_id: int
    epoch: int
    next_sequence: int


@dataclass
class SequencedLog:
    """A Produce handler keeping each partition's producer state as a Kafka broker does.

    A batch of the partition's producer and epoch with the next sequence is appended
    (by the broker's default answer); one with an earlier sequence is a duplicate
    (DUPLICATE_SEQUENCE_NUMBER), a later one leaves a gap (OUT_OF_ORDER_SEQUENCE_NUMBER).
    A producer or epoch the partition does not know must start at sequence 0, else it
    gets ``unknown_producer_error``. Before that, a batch of more than ``max_records``
    records is refused with MESSAGE_TOO_LARGE, and ``faults`` (base sequence -> error
    codes) answers the next batches of that sequence with those errors, one each
    (``fault_partition`` only).
    ``lose_next_response`` appends the next batch and closes the connection unanswered.
    Non-idempotent batches (no producer id) skip the sequence checks. A batch whose records do
    not decode is answered ``unreadable_error`` (None: the handler fails).
    """

    broker: FakeBroker
    max_records: int | None = None
    unreadable_error: int | None = None
    unknown_producer_error: int = OUT_OF_ORDER_SEQUENCE_NUMBER
    faults: dict[int, list[int]] = field(default_factory=dict)
    fault_partition: int = 0
    lose_next_response: bool = False
    producers: dict[tuple[str, int], _ProducerState] = field(default_factory=dict)
    # Every batch received: (partition, producer id, epoch, base sequence, record count, answer).
    seen: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)

    def install(self) -> SequencedLog:
        self.broker.set_handler(PRODUCE, self)
        return self

    def forget_producers(self) -> None:
        """Lose every producer's state, as a broker whose producer state expired."""
        self.producers.clear()

    def _check(self, tp: tuple[str, int], batch: RecordBatch) -> tuple[int, str | None]:
        if self.max_records is not None and batch.record_count > self.max_records:
            return MESSAGE_TOO_LARGE, f"{batch.record_count} records are more than {self.max_records}"
        faults = self.faults.get(batch.base_sequence) if tp[1] == self.fault_partition else None
        if faults:
            return faults.pop(0), "scripted fault"
        if batch.producer_id < 0:
            return NONE, None
        state = self.producers.get(tp)
        if state is None or state.producer_id != batch.producer_id or batch.producer_epoch > state.epoch:
            if batch.base_sequence != 0:
                return self.unknown_producer_error, f"producer {batch.producer_id} must start at sequence 0"
        elif batch.base_sequence != state.next_sequence:
            if batch.base_sequence < state.next_sequence:
                return DUPLICATE_SEQUENCE_NUMBER, None
            return OUT_OF_ORDER_SEQUENCE_NUMBER, (f"expected sequence {state.next_sequence}, "
                                                  f"got {batch.base_sequence}")
        self.producers[tp] = _ProducerState(batch.producer_id, batch.producer_epoch,
                                            batch.base_sequence + batch.record_count)
        return NONE, None

    def __call__(self, header: RequestHeader, request: m.ProduceRequest) -> Any:
        refused: dict[tuple[str, int], PartitionResponse] = {}
        accepted: dict[str, list[m.ProduceRequest.TopicProduceData.PartitionProduceData]] = {}
        for topic in request.topic_data:
            for p in topic.partition_data:
                try:
                    (batch,) = decode_batches(bytes(p.records))
                except ValueError as exc:
                    if self.unreadable_error is None:
                        raise
                    refused[(topic.name, p.index)] = PartitionResponse(
                        index=p.index, error_code=self.unreadable_error, error_message=str(exc), base_offset=-1)
                    continue
                code, message = self._check((topic.name, p.index), batch)
                self.seen.append((p.index, batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                  batch.record_count, code))
                if code == NONE:
                    accepted.setdefault(topic.name, []).append(p)
                else:
                    refused[(topic.name, p.index)] = PartitionResponse(
                        index=p.index, error_code=code, error_message=message, base_offset=-1, log_start_offset=0)
        appended = None
        if accepted:
            appended = self.broker.default_response(header, m.ProduceRequest(
                transactional_id=None, acks=request.acks, timeout_ms=request.timeout_ms,
                topic_data=[m.ProduceRequest.TopicProduceData(name=t, partition_data=ps)
                            for t, ps in accepted.items()]))
        if self.lose_next_response:
            self.lose_next_response = False
            return CLOSE
        if request.acks == 0:
            return None
        answers = {(t.name, p.index): p
                   for t in (appended.responses if appended else []) for p in t.partition_responses}
        answers.update(refused)
        topic_cls = m.ProduceResponse.TopicProduceResponse
        return m.ProduceResponse(responses=[
            topic_cls(name=t.name, partition_responses=[answers[(t.name, p.index)] for p in t.partition_data])
            for t in request.topic_data])


def metric(core: ProducerCore, name: str) -> float:
    """One of the sender's producer-metrics, as ``kafka-sidecar stats`` shows it."""
    return core.metrics.producer_metrics(core.clock())[name]


def warm_up(core: ProducerCore, deliveries: Deliveries, partition: int = 1) -> None:
    """Metadata, a connection to the leader and (idempotent) a producer id, through one delivered batch."""
    (batch,) = new_batches(deliveries, partition=partition, records=1)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.SUCCEEDED


# -- 1. retriable errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("error, stale_metadata", [
    (NOT_LEADER_OR_FOLLOWER, True),
    (LEADER_NOT_AVAILABLE, True),
    (UNKNOWN_TOPIC_OR_PARTITION, True),
    (KAFKA_STORAGE_ERROR, True),
    (NETWORK_EXCEPTION, True),
    (REQUEST_TIMED_OUT, False),
    (NOT_ENOUGH_REPLICAS, False),
    (NOT_ENOUGH_REPLICAS_AFTER_APPEND, False),
])
@pytest.mark.parametrize("idempotent", [True, False])
def test_retriable_error_is_retried_then_succeeds(fake_broker, make_core, error: int, stale_metadata: bool,
                                                  idempotent: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, enable_idempotence=idempotent)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    metadata_before = len(broker.requests_of(METADATA))
    produce_before = len(broker.requests_of(PRODUCE))

    broker.set_handler(PRODUCE, fail_first(broker, 2, error, "try again"))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert batch.final_state is FinalState.SUCCEEDED and batch.error is None
    assert batch.attempts == 2
    assert len(broker.requests_of(PRODUCE)) == produce_before + 3
    attempts = produce_batches(broker)
    assert len({(b.producer_id, b.base_sequence) for b in attempts}) == 1, "a retry changed the batch's sequence"
    assert (attempts[0].producer_id >= 0) is idempotent
    assert log_values(broker) == values_of(batch, deliveries)
    assert batch.base_offset == 0
    metadata_requests = len(broker.requests_of(METADATA)) - metadata_before
    if stale_metadata:
        assert metadata_requests >= 1, "a stale-metadata error did not refresh metadata"
    else:
        assert metadata_requests == 0
    assert metric(core, "record-retry-total") == 2 * batch.record_count
    assert deliveries.releases[batch.origin] == 1


def test_not_leader_with_a_moved_leader_ends_on_the_new_leader(fake_broker, make_core) -> None:
    old, new = fake_broker(1, topics={TOPIC: 2}), fake_broker(2, topics={TOPIC: 2})
    for broker in (old, new):
        broker.set_brokers([(1, old.host, old.port), (2, new.host, new.port)])
    core = make_core(old)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    def leadership_moved(header: RequestHeader, request: m.ProduceRequest) -> Any:
        for broker in (old, new):
            broker.set_leader(TOPIC, 0, 2)
        return produce_response(request, NOT_LEADER_OR_FOLLOWER, error_message="leader moved to 2")

    old.set_handler(PRODUCE, leadership_moved)
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert batch.final_state is FinalState.SUCCEEDED
    # A retry may reach the old leader again before the new metadata is in (both wait retry.backoff.ms).
    assert batch.attempts == len(produce_batches(old)) >= 1
    assert log_values(old) == []
    assert log_values(new) == values_of(batch, deliveries)
    (written,) = log_of(new)
    assert (written.producer_id, written.base_sequence) == (produce_batches(old)[0].producer_id, 0)
    assert core.metadata.cluster.leader_for(TOPIC, 0).id == 2
    assert core.metrics.node_latency[2].count == 1  # one produce request, answered


def test_a_cut_connection_is_retried(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    cut = itertools.count()
    broker.set_handler(PRODUCE, lambda h, r: CLOSE if next(cut) == 0 else broker.default_response(h, r))

    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert batch.final_state is FinalState.SUCCEEDED and batch.attempts == 1
    assert broker.connections_accepted >= 3  # bootstrap, the leader, the leader again
    assert log_values(broker) == values_of(batch, deliveries)


def test_a_request_timeout_is_retried(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    clock = JumpingClock()
    core = make_core(broker, clock=clock, request_timeout_ms=5000, delivery_timeout_ms=60_000)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    unanswered = itertools.count()
    broker.set_handler(PRODUCE, lambda h, r: None if next(unanswered) == 0 else broker.default_response(h, r))

    (batch,) = new_batches(deliveries, created_ms=clock())
    core.append(batch)
    run_until(core, lambda: len(broker.requests_of(PRODUCE)) == 2)
    assert not core.flush(100), "the unanswered request ended before request.timeout.ms"
    clock.advance(5000)
    assert core.flush()

    assert batch.final_state is FinalState.SUCCEEDED and batch.attempts == 1
    assert log_values(broker) == values_of(batch, deliveries)


def test_a_retriable_answer_after_the_delivery_timeout_fails_the_batch(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    clock = JumpingClock()
    core = make_core(broker, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(broker.requests_of(PRODUCE))
    broker.set_handler(PRODUCE, fail_first(broker, 100, NOT_ENOUGH_REPLICAS, "1 of 3 in sync"))

    broker.pause()
    (batch,) = new_batches(deliveries, created_ms=clock() - 50_000)
    core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 1 and not core.selector.has_pending_send(1))
    # The answer is read after delivery.timeout.ms has passed, before the loop's own expiry check.
    clock.advance(10_000)
    broker.resume()
    deadline = time.monotonic() + HANG_S
    while not batch.is_done:
        assert time.monotonic() < deadline, "no answer"
        core.client.poll(10)

    assert batch.final_state is FinalState.FAILED
    assert (batch.error.name, batch.error.message) == ("NOT_ENOUGH_REPLICAS", "1 of 3 in sync")
    assert batch.attempts == 0 and metric(core, "record-retry-total") == 0
    # Failed once, with the broker's error, and not expired too.
    assert metric(core, "record-error-total") == batch.record_count
    assert core.flush()
    assert len(broker.requests_of(PRODUCE)) == produce_before + 1, "retried after delivery.timeout.ms"
    assert deliveries.releases[batch.origin] == 1


# -- 2, 3. final errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("error, name, family, records", [
    (MESSAGE_TOO_LARGE, "MESSAGE_TOO_LARGE", RecordTooLargeError, 1),
    (RECORD_LIST_TOO_LARGE, "RECORD_LIST_TOO_LARGE", RecordTooLargeError, 4),
    (INVALID_RECORD, "INVALID_RECORD", InvalidRecordError, 4),
    (INVALID_TIMESTAMP, "INVALID_TIMESTAMP", InvalidRecordError, 4),
    (TOPIC_AUTHORIZATION_FAILED, "TOPIC_AUTHORIZATION_FAILED", AuthorizationError, 4),
    (UNKNOWN_SERVER_ERROR, "UNKNOWN_SERVER_ERROR", BrokerError, 4),
])
@pytest.mark.parametrize("idempotent", [True, False])
def test_final_error_fails_the_batch_with_the_brokers_message(fake_broker, make_core, error: int, name: str,
                                                              family: type[KafkaError], records: int,
                                                              idempotent: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    fresh_producer_ids(broker)
    core = make_core(broker, enable_idempotence=idempotent)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(broker.requests_of(PRODUCE))

    message = f"the broker says no ({name})"
    broker.set_handler(PRODUCE, fail_first(broker, 1, error, message))
    (batch,) = new_batches(deliveries, records=records)
    core.append(batch)
    assert core.flush()

    assert batch.final_state is FinalState.FAILED
    assert type(batch.error) is family
    assert (batch.error.code, batch.error.name, batch.error.message) == (error, name, message)
    assert not batch.error.retriable
    assert str(batch.error) == f"{name} ({error}): {message}"
    assert len(broker.requests_of(PRODUCE)) == produce_before + 1, "a final error was retried"
    assert metric(core, "record-error-total") == records and metric(core, "record-retry-total") == 0
    assert deliveries.releases[batch.origin] == 1

    # The partition goes on: with idempotence, under a new producer id from sequence 0 (the
    # refused batch left a gap in its sequences).
    (after,) = new_batches(deliveries)
    core.append(after)
    assert core.flush()
    assert after.final_state is FinalState.SUCCEEDED
    if idempotent:
        assert (after.producer_id, after.base_sequence) == (1001, 0)
        assert len(broker.requests_of(INIT_PRODUCER_ID)) == 2
    assert log_values(broker) == values_of(after, deliveries)


def test_corrupt_message_is_retried_once_then_failed(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(broker.requests_of(PRODUCE))

    broker.set_handler(PRODUCE, fail_first(broker, 10, CORRUPT_MESSAGE, "CRC mismatch"))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert len(broker.requests_of(PRODUCE)) == produce_before + 2
    assert batch.final_state is FinalState.FAILED
    assert type(batch.error) is InvalidRecordError
    assert (batch.error.code, batch.error.name, batch.error.message) == (CORRUPT_MESSAGE, "CORRUPT_MESSAGE",
                                                                         "CRC mismatch")
    assert metric(core, "record-retry-total") == metric(core, "record-error-total") == batch.record_count


def test_corrupt_message_once_then_accepted(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    broker.set_handler(PRODUCE, fail_first(broker, 1, CORRUPT_MESSAGE, "CRC mismatch"))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.SUCCEEDED
    assert log_values(broker) == values_of(batch, deliveries)


def test_an_unusable_produce_version_fails_the_batch_and_the_partition_goes_on(fake_broker, make_core) -> None:
    versions = codec_api_versions()
    produce_versions = versions.pop(PRODUCE)
    broker = fake_broker(1, topics={TOPIC: 2}, api_versions=versions)
    # One request in flight: the partition is muted while its request is out.
    core = make_core(broker, enable_idempotence=False, max_in_flight_requests_per_connection=1)
    deliveries = Deliveries(TOPIC)
    (refused,) = new_batches(deliveries)
    core.append(refused)
    assert core.flush()
    assert refused.final_state is FinalState.FAILED
    assert isinstance(refused.error, UnsupportedError) and "Produce" in str(refused.error)
    assert deliveries.releases[refused.origin] == 1

    # The broker is upgraded: the partition must not have stayed muted.
    broker.api_versions[PRODUCE] = produce_versions
    broker.close_connections()
    # The versions go with the connection: the next one asks again.
    run_until(core, lambda: not core.client.connection_states.is_ready(1))
    (after,) = new_batches(deliveries)
    core.append(after)
    assert core.flush()
    assert after.final_state is FinalState.SUCCEEDED
    assert log_values(broker) == values_of(after, deliveries)


def test_a_partition_named_twice_in_a_response_is_completed_once(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(produce_batches(broker))
    answers = itertools.count()

    def twice(header: RequestHeader, request: m.ProduceRequest) -> Any:
        if next(answers):
            return broker.default_response(header, request)
        answer = PartitionResponse(index=0, error_code=NOT_ENOUGH_REPLICAS, base_offset=-1)
        return m.ProduceResponse(responses=[m.ProduceResponse.TopicProduceResponse(
            name=TOPIC, partition_responses=[answer, answer])])

    broker.set_handler(PRODUCE, twice)
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert batch.final_state is FinalState.SUCCEEDED
    assert batch.attempts == 1 and metric(core, "record-retry-total") == batch.record_count
    assert len(produce_batches(broker)) == produce_before + 2, "the batch went out more than once per attempt"
    assert log_values(broker) == values_of(batch, deliveries)
    assert deliveries.releases[batch.origin] == 1


def test_log_append_time_from_the_broker_reaches_the_batch(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    (create_time,) = new_batches(deliveries)
    core.append(create_time)
    assert core.flush()
    assert (create_time.base_offset, create_time.log_append_time_ms) == (0, -1)  # a CreateTime topic

    append_time = 1_700_000_123_456
    broker.set_handler(PRODUCE, lambda h, r: produce_response(r, base_offset=5, log_append_time_ms=append_time))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.SUCCEEDED
    assert (batch.base_offset, batch.log_append_time_ms) == (5, append_time)


# -- 4. MESSAGE_TOO_LARGE: split -------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [True, False])
def test_too_large_batches_are_split_until_they_fit(fake_broker, make_core, idempotent: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    log = SequencedLog(broker, max_records=3).install()
    # Without idempotence only one request in flight keeps the order.
    core = make_core(broker, enable_idempotence=idempotent,
                     max_in_flight_requests_per_connection=5 if idempotent else 1)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    # A big batch and a small one behind it, both in flight: the small one must not overtake
    # the parts of the big one (with idempotence the broker answers it out of order).
    broker.pause()
    big, small = new_batches(deliveries, records=10)[0], new_batches(deliveries, records=2)[0]
    core.append(big)
    core.append(small)
    if idempotent:
        run_until(core, lambda: core.client.in_flight_request_count(1) == 2)
    broker.resume()
    assert core.flush()

    expected = values_of(big, deliveries) + values_of(small, deliveries)
    assert log_values(broker) == expected
    written = log_of(broker)
    assert all(b.record_count <= 3 for b in written)
    assert len(written) > 2
    assert metric(core, "batch-split-total") >= 3
    if idempotent:
        # Sequences continue from the big batch's base sequence through its parts to the small batch.
        assert written[0].base_sequence == 0
        for before, after in itertools.pairwise(written):
            assert after.base_sequence == before.base_sequence + before.record_count
        assert {b.producer_id for b in written} == {written[0].producer_id}
        assert any(code == OUT_OF_ORDER_SEQUENCE_NUMBER for *_, code in log.seen)

    # Every record reported once, each part with its first record's index and offset.
    parts = sorted((b for b in deliveries.reports if b.origin == big.origin), key=lambda b: b.origin_index)
    assert all(b.final_state is FinalState.SUCCEEDED for b in parts)
    assert [b.origin_index for b in parts] == list(itertools.accumulate([0] + [b.record_count for b in parts[:-1]]))
    assert sum(b.record_count for b in parts) == 10
    # The broker gives offsets in log order, from 0.
    offsets = {value: offset for offset, value in enumerate(log_values(broker))}
    for part in parts:
        values = values_of(big, deliveries)[part.origin_index:part.origin_index + part.record_count]
        assert [offsets[v] for v in values] == list(range(part.base_offset, part.base_offset + part.record_count))
    assert small.base_offset == offsets[values_of(small, deliveries)[0]]
    # The big batch's buffer went back once, when it was split; the parts own copies.
    assert deliveries.releases[big.origin] == 1


def test_a_single_record_too_large_fails(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    SequencedLog(broker, max_records=0).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    (batch,) = new_batches(deliveries, records=1)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.FAILED
    assert type(batch.error) is RecordTooLargeError
    assert batch.error.name == "MESSAGE_TOO_LARGE"
    assert metric(core, "batch-split-total") == 0


def partitions_of(request: m.ProduceRequest) -> list[int]:
    return [p.index for topic in request.topic_data for p in topic.partition_data]


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_batch_that_cannot_be_split_fails_alone_and_the_response_goes_on(fake_broker, make_core,
                                                                           idempotent: bool) -> None:
    """Its client sealed records that Kafka's framing allows but the daemon cannot re-encode (header keys
    that are not UTF-8: sent as they are, as a broker takes them); the broker finds the batch too large.
    Splitting it fails: that batch fails with CORRUPT_MESSAGE, its buffer goes back, the other batch of
    the same response is delivered, and the partition goes on."""
    broker = fake_broker(1, topics={TOPIC: 2})
    log = SequencedLog(broker, unreadable_error=MESSAGE_TOO_LARGE).install()
    fresh_producer_ids(broker)
    core = make_core(broker, enable_idempotence=idempotent)
    deliveries = Deliveries(TOPIC)
    # The drain starts at partition 0 next: the garbage comes first in the request, and in its response.
    warm_up(core, deliveries, partition=0)
    garbage = ProducerBatch(TopicPartition(TOPIC, 0), encode_records([(0, None, b"v", [(b"\xff", b"x")])] * 5), 5,
                            base_timestamp=0, max_timestamp=0, created_ms=monotonic_ms(),
                            on_complete=deliveries.reports.append, release=lambda: deliveries.releases.update(["bad"]),
                            origin="bad")
    (good,) = new_batches(deliveries, partition=1)
    broker.pause()
    core.append(garbage)
    core.append(good)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 1)
    broker.resume()
    assert core.flush()

    assert partitions_of(broker.requests_of(PRODUCE)[-1][1]) == [0, 1]
    assert garbage.final_state is FinalState.FAILED
    assert type(garbage.error) is InvalidRecordError
    assert (garbage.error.code, garbage.error.name, garbage.error.retriable) == (CORRUPT_MESSAGE, "CORRUPT_MESSAGE",
                                                                                False)
    assert "do not parse" in garbage.error.message
    assert deliveries.releases["bad"] == 1
    assert deliveries.reports.count(garbage) == 1
    assert metric(core, "batch-split-total") == 0 and metric(core, "record-error-total") == garbage.record_count
    assert good.final_state is FinalState.SUCCEEDED
    assert log_values(broker, 1) == values_of(good, deliveries)

    # The loop goes on, and so does the partition of the garbage (idempotent: from sequence 0 under a
    # new producer id, since the broker never had the garbage's sequences).
    after = new_batches(deliveries, partition=0)[0]
    core.append(after)
    assert core.flush()
    assert after.final_state is FinalState.SUCCEEDED
    assert log_values(broker, 0)[1:] == values_of(after, deliveries)
    if idempotent:
        assert len(broker.requests_of(INIT_PRODUCER_ID)) == 2  # one new producer id
        assert log.seen[-1][1:4] == (1001, 0, 0)


@pytest.mark.parametrize("coalesce", [True, False])
@pytest.mark.parametrize("idempotent", [True, False])
def test_a_batch_of_garbage_is_never_sent_and_its_neighbours_keep_their_sequences(fake_broker, make_core,
                                                                                idempotent: bool,
                                                                                coalesce: bool) -> None:
    """Its client sealed bytes that are no records, between well-formed batches of the same partition. The
    daemon reads it before it takes a sequence: it fails alone with CORRUPT_MESSAGE, unsent, its buffer
    back; the batches before and after it are delivered in order under the same producer id, with
    consecutive sequences, and none is refused or retried (a broker refusing the garbage would have cost
    the partition its sequences: a new producer id, the batches after it renumbered and sent again)."""
    broker = fake_broker(1, topics={TOPIC: 1})
    log = SequencedLog(broker).install()  # it fails on a batch it cannot decode
    fresh_producer_ids(broker)
    core = make_core(broker, enable_idempotence=idempotent, sidecar_coalesce_batches=coalesce)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries, partition=0)
    before = new_batches(deliveries, partition=0, batches=2)
    garbage = ProducerBatch(TopicPartition(TOPIC, 0), memoryview(bytearray(b"\xaa" * 1024)), 7,
                            base_timestamp=0, max_timestamp=0, created_ms=monotonic_ms(),
                            on_complete=deliveries.reports.append, release=lambda: deliveries.releases.update(["bad"]),
                            origin="bad")
    after = new_batches(deliveries, partition=0, batches=2)
    for batch in (*before, garbage, *after):
        core.append(batch)
    assert core.flush()

    assert garbage.final_state is FinalState.FAILED and not garbage.has_sequence
    assert type(garbage.error) is InvalidRecordError
    assert (garbage.error.code, garbage.error.name, garbage.error.retriable) == (CORRUPT_MESSAGE, "CORRUPT_MESSAGE",
                                                                                False)
    assert "not 7 well-formed records (record 0, byte 0 of 1024)" in garbage.error.message
    assert deliveries.releases["bad"] == 1 and deliveries.reports.count(garbage) == 1
    assert core.metrics.batches_corrupt == 1 and metric(core, "record-error-total") == garbage.record_count
    assert metric(core, "record-retry-total") == 0
    assert all(b.final_state is FinalState.SUCCEEDED for b in before + after)
    # What reached the broker: the warm-up and the well-formed batches, each once, in order.
    sent = produce_batches(broker)
    values = [v for b in before + after for v in values_of(b, deliveries)]
    assert [r.value for b in sent[1:] for r in b.records] == values and log_values(broker)[1:] == values
    assert len(sent) == (3 if coalesce else 5)
    assert all(code == NONE for *_, code in log.seen)
    if idempotent:
        assert {(b.producer_id, b.producer_epoch) for b in sent} == {(1000, 0)}
        assert [b.base_sequence for b in sent] == list(itertools.accumulate([0] + [b.record_count for b in sent[:-1]]))
        assert len(broker.requests_of(INIT_PRODUCER_ID)) == 1  # no new producer id


def test_an_error_settling_one_batch_does_not_leave_the_rest_of_the_response(fake_broker, make_core,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    broker = fake_broker(1, topics={TOPIC: 3})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    failures = itertools.count()

    def release_once_broken() -> None:
        if next(failures) == 0:
            raise RuntimeError("a broken release")

    batches = [new_batches(deliveries, partition=p)[0] for p in range(3)]
    for batch in batches:
        batch.release = release_once_broken
    broker.pause()
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 1)
    broker.resume()
    with caplog.at_level("ERROR"):
        assert core.flush()

    assert sorted(partitions_of(broker.requests_of(PRODUCE)[-1][1])) == [0, 1, 2]
    # The first settled raised after its report: reported once, as delivered; the others settled after it.
    assert [b.final_state for b in batches] == [FinalState.SUCCEEDED] * 3
    assert all(deliveries.reports.count(b) == 1 for b in batches)
    assert "a broken release" in caplog.text
    assert next(failures) == 3
    (after,) = new_batches(deliveries)
    core.append(after)
    assert core.flush() and after.final_state is FinalState.SUCCEEDED


# -- 5. retries exhausted --------------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [True, False])
def test_retries_exhausted_fail_with_the_last_error(fake_broker, make_core, idempotent: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, retries=2, enable_idempotence=idempotent)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(broker.requests_of(PRODUCE))

    broker.set_handler(PRODUCE, fail_first(broker, 100, NOT_ENOUGH_REPLICAS, "1 of 3 in sync"))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()

    assert len(broker.requests_of(PRODUCE)) == produce_before + 3
    assert batch.final_state is FinalState.FAILED
    assert isinstance(batch.error, RetriableError)
    assert (batch.error.code, batch.error.name, batch.error.message) == (NOT_ENOUGH_REPLICAS,
                                                                         "NOT_ENOUGH_REPLICAS", "1 of 3 in sync")
    assert metric(core, "record-retry-total") == 2 * batch.record_count
    assert metric(core, "record-error-total") == batch.record_count


def test_retries_zero_fails_at_the_first_error(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, retries=0)
    assert not core.config.idempotent
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    broker.set_handler(PRODUCE, fail_first(broker, 100, NOT_LEADER_OR_FOLLOWER, "not me"))
    (batch,) = new_batches(deliveries)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.FAILED and batch.attempts == 0
    assert batch.error.name == "NOT_LEADER_OR_FOLLOWER"


# -- 6. ordering -----------------------------------------------------------------------------------


def test_one_in_flight_a_retried_batch_is_not_overtaken(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, enable_idempotence=False, max_in_flight_requests_per_connection=1)
    assert core.sender.guarantee_message_order
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    before = len(produce_batches(broker))

    broker.set_handler(PRODUCE, fail_first(broker, 2, NOT_ENOUGH_REPLICAS))
    batches = new_batches(deliveries, batches=3)
    for batch in batches:
        core.append(batch)
    assert core.flush()

    first_values = [b.records[0].value for b in produce_batches(broker)[before:]]
    firsts = [values_of(b, deliveries)[0] for b in batches]
    assert first_values == [firsts[0], firsts[0], firsts[0], firsts[1], firsts[2]]
    assert log_values(broker) == [v for b in batches for v in values_of(b, deliveries)]
    assert [b.base_offset for b in batches] == [0, 5, 10]


@pytest.mark.parametrize("settings", [{"acks": "1"}, {"enable_idempotence": False}])
def test_without_idempotence_a_retry_never_reorders_a_partition(fake_broker, make_core,
                                                                 settings: dict[str, Any]) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, **settings)
    assert not core.config.idempotent
    assert core.config["max.in.flight.requests.per.connection"] == 5
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    broker.set_handler(PRODUCE, fail_first(broker, 1, NOT_ENOUGH_REPLICAS))
    broker.pause()
    batches = new_batches(deliveries, partition=0, batches=3)
    others = new_batches(deliveries, partition=1, batches=3)
    for batch in batches + others:
        core.append(batch)
    for _ in range(20):
        core.run_once(5)
    # One batch per partition in flight: both in one request, the others wait.
    assert core.client.in_flight_request_count(1) == 1
    broker.resume()
    assert core.flush()

    assert all(b.final_state is FinalState.SUCCEEDED for b in batches + others)
    assert batches[0].attempts == others[0].attempts == 1
    assert log_values(broker, 0) == [v for b in batches for v in values_of(b, deliveries)]
    assert log_values(broker, 1)[1:] == [v for b in others for v in values_of(b, deliveries)]


def test_idempotent_in_flight_batches_are_retried_in_sequence_order(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    log = SequencedLog(broker, faults={0: [NOT_ENOUGH_REPLICAS]}).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    broker.pause()
    batches = new_batches(deliveries, batches=7)
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 5)
    assert [b.base_sequence for b in core.sender.in_flight_batches()] == [0, 5, 10, 15, 20]
    broker.resume()
    assert core.flush()

    assert all(b.final_state is FinalState.SUCCEEDED for b in batches)
    sequences = [(seq, code) for p, _, _, seq, _, code in log.seen if p == 0]
    # The first fails; the four behind it are out of order until it is in; then one by one.
    assert sequences[:5] == [(0, NOT_ENOUGH_REPLICAS)] + [(s, OUT_OF_ORDER_SEQUENCE_NUMBER) for s in (5, 10, 15, 20)]
    accepted = [seq for seq, code in sequences if code == NONE]
    assert accepted == [0, 5, 10, 15, 20, 25, 30]
    assert log_values(broker) == [v for b in batches for v in values_of(b, deliveries)]
    assert [b.base_offset for b in batches] == list(range(0, 35, 5))


# -- 7, 8. idempotence -----------------------------------------------------------------------------


def test_duplicate_sequence_number_is_success(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    log = SequencedLog(broker).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    # Written, but the answer is lost with the connection: the retry is a duplicate.
    log.lose_next_response = True
    batch, after = new_batches(deliveries, batches=2)
    core.append(batch)
    assert core.flush()
    assert batch.final_state is FinalState.SUCCEEDED and batch.error is None
    assert [code for p, *_, code in log.seen if p == 0] == [NONE, DUPLICATE_SEQUENCE_NUMBER]
    assert metric(core, "record-error-total") == 0

    core.append(after)
    assert core.flush()
    assert after.final_state is FinalState.SUCCEEDED and after.base_sequence == 5
    assert log_values(broker) == values_of(batch, deliveries) + values_of(after, deliveries)


@pytest.mark.parametrize("error", [UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER])
def test_lost_producer_state_takes_a_new_producer_id(fake_broker, make_core, error: int) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    fresh_producer_ids(broker)
    log = SequencedLog(broker, unknown_producer_error=error).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    first, second, third = new_batches(deliveries, batches=3)
    core.append(first)
    assert core.flush()
    assert (first.producer_id, first.base_sequence) == (1000, 0)

    log.forget_producers()
    core.append(second)
    assert core.flush()

    assert second.final_state is FinalState.SUCCEEDED
    assert len(broker.requests_of(INIT_PRODUCER_ID)) == 2
    assert [(pid, seq, code) for _, pid, _, seq, _, code in log.seen] == [
        (1000, 0, NONE), (1000, 5, error), (1001, 0, NONE)]
    assert (second.producer_id, second.base_sequence) == (1001, 0)

    core.append(third)
    assert core.flush()
    assert (third.producer_id, third.base_sequence) == (1001, 5)
    assert log_values(broker) == [v for b in (first, second, third) for v in values_of(b, deliveries)]


# -- delivery timeout and unreachable brokers ------------------------------------------------------


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_batch_drained_after_its_delivery_timeout_is_failed_not_sent(fake_broker, make_core,
                                                                      idempotent: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    fresh_producer_ids(broker)
    SequencedLog(broker).install()
    core = make_core(broker, enable_idempotence=idempotent)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    produce_before = len(broker.requests_of(PRODUCE))

    # A client block that kept filling while its partition awaited a report reaches the daemon
    # already older than delivery.timeout.ms; a fresh batch of another partition goes in the same drain.
    (stale,) = new_batches(deliveries, partition=0, created_ms=core.clock() - 120_001)
    (fresh,) = new_batches(deliveries, partition=1)
    core.append(stale)
    core.append(fresh)
    assert core.flush()

    assert stale.final_state is FinalState.FAILED and expired_after_ms(stale) >= 120_001
    assert fresh.final_state is FinalState.SUCCEEDED
    sent = [(t.name, p.index) for _, r in broker.requests_of(PRODUCE)[produce_before:]
            for t in r.topic_data for p in t.partition_data]
    assert sent == [(TOPIC, 1)], "the expired batch was sent"
    assert deliveries.releases[stale.origin] == 1
    assert metric(core, "record-error-total") == stale.record_count

    # The partition goes on (with idempotence, under a new producer id: the batch used up a sequence).
    (after,) = new_batches(deliveries, partition=0)
    core.append(after)
    assert core.flush()
    assert after.final_state is FinalState.SUCCEEDED, after.error
    assert log_values(broker, 0) == values_of(after, deliveries)
    if idempotent:
        assert (after.producer_id, after.base_sequence) == (1001, 0)


def test_an_old_batch_in_flight_behind_a_younger_one_expires_on_time(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    clock = JumpingClock()
    core = make_core(broker, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    # Several clients feed one partition, each batch with its own age: the queue is not in creation order.
    broker.pause()
    (young,) = new_batches(deliveries, created_ms=clock())
    (old,) = new_batches(deliveries, created_ms=clock() - 50_000)
    core.append(young)
    core.append(old)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 2)
    clock.advance(10_000)
    core.run_once(0)
    assert old.final_state is FinalState.FAILED and 60_000 <= expired_after_ms(old) < 70_000
    assert not young.is_done

    broker.resume()
    assert core.flush()
    assert young.final_state is FinalState.SUCCEEDED and old.final_state is FinalState.FAILED
    assert sorted(deliveries.origins_reported().values()) == [1, 1, 1]
    assert deliveries.releases[old.origin] == deliveries.releases[young.origin] == 1


@pytest.mark.parametrize(("max_in_flight", "queued", "more_at_once"), [(5, 2, True), (5, 1, False), (1, 2, False)])
def test_the_loop_goes_round_at_once_only_while_more_can_be_sent(fake_broker, make_core, max_in_flight: int,
                                                                   queued: int, more_at_once: bool) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, max_in_flight_requests_per_connection=max_in_flight)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    broker.pause()  # the requests stay in flight
    for batch in new_batches(deliveries, batches=queued):
        core.append(batch)

    # One batch of a partition goes per request: a second one queued can follow at once, unless the
    # first request takes the only place in flight. Otherwise the loop sleeps until a response comes.
    wait_ms = core.sender.send_producer_data(core.clock())
    assert (wait_ms == 0) is more_at_once
    for _ in range(3):
        core.run_once(0)
    assert core.client.in_flight_request_count(1) == (2 if more_at_once else 1)
    broker.resume()
    assert core.flush()
    assert sorted(deliveries.origins_reported().values()) == [1] * (queued + 1)


def test_an_unreachable_broker_holds_back_only_its_own_partitions(fake_broker, make_core) -> None:
    one = fake_broker(1, topics={TOPIC: 2})
    # Broker 2 leads partition 1 and is down: nothing listens on its port.
    one.set_brokers([(1, one.host, one.port), (2, "127.0.0.1", free_port())])
    one.set_leader(TOPIC, 1, 2)
    clock = JumpingClock()
    # A reconnect backoff that outlasts the test's real time: a broker tried and refused is seen backing off.
    core = make_core(one, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000,
                     reconnect_backoff_ms=60_000, reconnect_backoff_max_ms=60_000)
    deliveries = Deliveries(TOPIC)
    held = new_batches(deliveries, partition=1, batches=2, created_ms=clock())
    going = new_batches(deliveries, partition=0, batches=3, created_ms=clock())
    for batch in held + going:
        core.append(batch)

    run_until(core, lambda: all(b.is_done for b in going))
    assert all(b.final_state is FinalState.SUCCEEDED for b in going)
    assert log_values(one, 0) == [v for b in going for v in values_of(b, deliveries)]
    assert not any(b.is_done for b in held)
    assert queued(core.accumulator, TopicPartition(TOPIC, 1)) == held
    assert produce_batches(one, 1) == []
    # Broker 2 was tried: it is being connected to, or backing off after the refusal.
    assert core.client.is_connecting(2) or core.client.connection_delay(2, clock()) > 0
    # Nothing to send to broker 1: the loop waits (for the reconnect backoff), it does not spin.
    assert core.sender.send_producer_data(clock()) > 0

    (more,) = new_batches(deliveries, partition=0, created_ms=clock())
    core.append(more)
    run_until(core, lambda: more.is_done)
    assert more.final_state is FinalState.SUCCEEDED

    clock.advance(60_000)
    core.run_once(0)
    assert all(b.final_state is FinalState.FAILED and expired_after_ms(b) >= 60_000 for b in held)
    assert all(deliveries.releases[b.origin] == 1 for b in held)
    assert produce_batches(one, 1) == []


# -- 9. acks=0 -------------------------------------------------------------------------------------


def test_acks_zero_completes_when_written(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker, acks="0")
    assert not core.config.idempotent
    deliveries = Deliveries(TOPIC)
    batches = new_batches(deliveries, batches=3) + new_batches(deliveries, partition=1, batches=2)
    for batch in batches:
        core.append(batch)
    assert core.flush()

    assert all(b.final_state is FinalState.SUCCEEDED and b.base_offset == -1 for b in batches)
    assert wait_until(lambda: len(produce_batches(broker, 0)) + len(produce_batches(broker, 1)) == 5), \
        "the broker did not get every batch"
    assert {r.acks for _, r in broker.requests_of(PRODUCE)} == {0}
    assert log_values(broker, 0) == [v for b in batches[:3] for v in values_of(b, deliveries)]
    assert all(deliveries.releases[b.origin] == 1 for b in batches)


# -- 10. flush and close ---------------------------------------------------------------------------


def test_flush_times_out_on_a_silent_broker_and_succeeds_once_it_answers(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    broker.pause()
    batches = new_batches(deliveries, batches=3)
    for batch in batches:
        core.append(batch)
    assert core.flush(200) is False
    assert not any(b.is_done for b in batches)
    broker.resume()
    assert core.flush() is True
    assert all(b.final_state is FinalState.SUCCEEDED for b in batches)


def test_close_with_a_silent_broker_fails_what_is_left_once(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)
    reported_before = len(deliveries.reports)

    broker.pause()
    batches = new_batches(deliveries, batches=8)
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 5)
    started = time.monotonic()
    core.close(300)
    elapsed = time.monotonic() - started

    # It returns, and does not wait for the broker: that would take request.timeout.ms at least.
    assert elapsed < core.config["request.timeout.ms"] / 1000, f"close(300) took {elapsed:.3f} s"
    reports = deliveries.reports[reported_before:]
    assert sorted(b.origin for b in reports) == sorted(b.origin for b in batches), "not each failed once"
    for batch in batches:
        assert batch.final_state in (FinalState.FAILED, FinalState.ABORTED)
        assert "producer closed" in str(batch.error)
    # The buffers of those still in flight go back too, once the connections are closed.
    assert all(deliveries.releases[b.origin] == 1 for b in batches)
    # Sent ones failed, each counted once as Kafka counts errors; queued ones were aborted, which Kafka does not
    # count (Java's abortBatches).
    failed = [b for b in batches if b.final_state is FinalState.FAILED]
    assert len(failed) == 5 and sum(b.final_state is FinalState.ABORTED for b in batches) == 3
    assert metric(core, "record-error-total") == sum(b.record_count for b in failed)

    # Closed: a batch handed over now fails at once.
    (late,) = new_batches(deliveries)
    core.append(late)
    assert late.final_state is FinalState.ABORTED and "closed" in str(late.error)


def test_close_sends_what_is_queued_when_the_broker_answers(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    batches = new_batches(deliveries, batches=8)
    for batch in batches:
        core.append(batch)
    core.close()
    assert all(b.final_state is FinalState.SUCCEEDED for b in batches)
    assert log_values(broker) == [v for b in batches for v in values_of(b, deliveries)]


# -- 11. figures -----------------------------------------------------------------------------------


def test_metrics_agree_with_what_happened(fake_broker, make_core) -> None:
    one, two = fake_broker(1, topics={TOPIC: 2}), fake_broker(2, topics={TOPIC: 2})
    for broker in (one, two):
        broker.set_brokers([(1, one.host, one.port), (2, two.host, two.port)])
        broker.set_leader(TOPIC, 1, 2)
    # Partition 0 (broker 1): NOT_ENOUGH_REPLICAS twice, then in. Partition 1 (broker 2): INVALID_RECORD.
    one.set_handler(PRODUCE, fail_first(one, 2, NOT_ENOUGH_REPLICAS))
    two.set_handler(PRODUCE, fail_first(two, 1, INVALID_RECORD, "bad record"))
    core = make_core(one)
    deliveries = Deliveries(TOPIC)
    (retried,) = new_batches(deliveries, partition=0, records=4)
    (failed,) = new_batches(deliveries, partition=1, records=3)
    (ok,) = new_batches(deliveries, partition=1, records=2)
    for batch in (retried, failed, ok):
        core.append(batch)
    assert core.flush()
    assert [b.final_state for b in (retried, failed, ok)] == [FinalState.SUCCEEDED, FinalState.FAILED,
                                                              FinalState.SUCCEEDED]

    now = core.clock()
    figures = core.metrics.producer_metrics(now)
    # Kafka's meanings: a record counts as sent in each request that carries it, retried once per retry, and
    # as an error when its batch fails for good.
    assert figures["record-retry-total"] == 8
    assert figures["record-error-total"] == 3 and failed.error.name == "INVALID_RECORD"
    assert figures["record-send-total"] == 3 * 4 + 3 + 2
    # The batches each broker received: the retried one three times, the other two once.
    assert (len(produce_batches(one, 0)), len(produce_batches(two, 1))) == (3, 2)
    topic = core.metrics.topic_metrics(now)[TOPIC]
    assert (topic["record-send-total"], topic["record-retry-total"], topic["record-error-total"]) == (17, 8, 3)
    # Each produce request's latency, overall and per broker.
    produce_requests = {1: len(one.requests_of(PRODUCE)), 2: len(two.requests_of(PRODUCE))}
    assert core.metrics.request_latency.count == sum(produce_requests.values()) == 5
    assert {n: core.metrics.node_latency[n].count for n in (1, 2)} == produce_requests
    # Every request the selector wrote, and its bytes: what each broker received, encoded again. Broker 1 was
    # reached as the bootstrap server (node -1) first, as Java's node metrics show it too.
    network = core.selector.metrics.node_metrics(now)
    for node_ids, broker in (((-1, 1), one), ((2,), two)):
        requests = broker.requests
        assert sum(network[n]["request-total"] for n in node_ids) == len(requests)
        assert sum(network[n]["outgoing-byte-total"] for n in node_ids) == sum(
            sum(len(bytes(b)) for b in encode_request(r, h.api_version, h.correlation_id, h.client_id))
            for h, r in requests)
        assert sum(network[n]["response-total"] for n in node_ids) == len(requests)
    assert figures["requests-in-flight"] == figures["batches-queued"] == 0

    # Figures of the moment: broker 2 holds five requests (one batch each), two more batches wait for it.
    two.pause()
    waiting = new_batches(deliveries, partition=1, batches=7, records=1)
    for batch in waiting:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(2) == 5)
    figures, nodes = core.metrics.producer_metrics(core.clock()), core.metrics.node_metrics(core.clock())
    assert (figures["requests-in-flight"], figures["batches-queued"]) == (5, 2)
    assert (nodes[2]["requests-in-flight"], nodes[2]["batches-queued"]) == (5, 2)
    assert (nodes[1]["requests-in-flight"], nodes[1]["batches-queued"]) == (0, 0)
    two.resume()
    assert core.flush()
    assert core.metrics.producer_metrics(core.clock())["requests-in-flight"] == 0


def test_expiry_figures_and_late_answers_counted_once(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    clock = JumpingClock()
    core = make_core(broker, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    broker.pause()
    batches = new_batches(deliveries, batches=7, records=3, created_ms=clock())
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 5)
    clock.advance(60_000)
    core.run_once(0)
    assert all(b.final_state is FinalState.FAILED and b.error.name == "KafkaTimeoutError" for b in batches)
    assert metric(core, "record-error-total") == 21

    # The broker answers after all: the answers change nothing.
    broker.resume()
    run_until(core, lambda: core.client.in_flight_request_count(1) == 0)
    assert all(b.final_state is FinalState.FAILED and b.error.name == "KafkaTimeoutError" for b in batches)
    assert metric(core, "record-error-total") == 21
    assert sorted(deliveries.origins_reported().values()) == [1] * 8
    assert all(deliveries.releases[b.origin] == 1 for b in batches)


# -- sequences after failures --------------------------------------------------------------------


def test_after_retries_are_exhausted_the_partition_goes_on(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    fresh_producer_ids(broker)
    log = SequencedLog(broker, faults={0: [NOT_ENOUGH_REPLICAS] * 3}).install()
    core = make_core(broker, retries=2)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    given_up, after = new_batches(deliveries, batches=2)
    core.append(given_up)
    assert core.flush()
    assert given_up.final_state is FinalState.FAILED and given_up.error.name == "NOT_ENOUGH_REPLICAS"
    core.append(after)
    assert core.flush()

    # The given-up batch's fate was unknown: the partition starts over under a new producer id.
    assert after.final_state is FinalState.SUCCEEDED, after.error
    assert (after.producer_id, after.base_sequence) == (1001, 0)
    assert log_values(broker) == values_of(after, deliveries)
    assert [(seq, code) for p, _, _, seq, _, code in log.seen if p == 0][:3] == [(0, NOT_ENOUGH_REPLICAS)] * 3


def test_a_cut_connection_with_five_in_flight_loses_and_duplicates_nothing(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    log = SequencedLog(broker).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    warm_up(core, deliveries)

    broker.pause()
    batches = new_batches(deliveries, batches=6)
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 5)
    # The first is written, its answer lost with the connection; the four behind it are never read.
    log.lose_next_response = True
    broker.resume()
    assert core.flush()

    assert all(b.final_state is FinalState.SUCCEEDED for b in batches)
    assert log_values(broker) == [v for b in batches for v in values_of(b, deliveries)]
    assert [(seq, code) for p, _, _, seq, _, code in log.seen if p == 0][:2] == [(0, NONE),
                                                                                (0, DUPLICATE_SEQUENCE_NUMBER)]


def test_unknown_producer_id_with_several_in_flight_renumbers_them_all(fake_broker, make_core) -> None:
    broker = fake_broker(1, topics={TOPIC: 2})
    fresh_producer_ids(broker)
    log = SequencedLog(broker, unknown_producer_error=UNKNOWN_PRODUCER_ID).install()
    core = make_core(broker)
    deliveries = Deliveries(TOPIC)
    (first,) = new_batches(deliveries)
    core.append(first)
    assert core.flush()

    log.forget_producers()
    broker.pause()
    batches = new_batches(deliveries, batches=4)
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count(1) == 4)
    broker.resume()
    assert core.flush()

    assert all(b.final_state is FinalState.SUCCEEDED for b in batches)
    assert [(b.producer_id, b.base_sequence) for b in batches] == [(1001, 0), (1001, 5), (1001, 10), (1001, 15)]
    assert len(broker.requests_of(INIT_PRODUCER_ID)) == 2  # one new producer id for the four
    assert log_values(broker) == [v for b in [first, *batches] for v in values_of(b, deliveries)]
