"""The daemon core against real brokers: delivery, ordering, retries, expiry, idempotence.

Batches are built as applications build them (tests/support/batches.py) and handed
to ProducerCore; what arrived is read back by the confluent-kafka verifier.
"""

from __future__ import annotations

import logging
import re
import threading

import pytest

from client_stub.errors import KafkaTimeoutError
from service.producer.batch import FinalState
from service.producer.transaction_manager import ProducerIdAndEpoch
from service.tools.readback import read_topic
from tests.support.batches import Deliveries
from tests.support.core import (
    JumpingClock,
    assert_delivered_once_in_order,
    assert_each_reported_and_released_once,
    make_core,
    run_until,
)

EXPIRY_MESSAGE = re.compile(r"Expiring (\d+) record\(s\) for (.+)-(\d+):(\d+) ms has passed since batch creation")


@pytest.mark.parametrize("acks", ["all", "1", "0"])
def test_100k_records_arrive_once_in_order(broker, topic_factory, acks: str) -> None:
    topic = topic_factory(6)
    deliveries = Deliveries(topic)
    # 6 partitions x 70 batches x 240 records (of ~60 bytes: about 16 KiB a batch) = 100 800 records.
    batches = deliveries.numbered(partitions=6, batches_per_partition=70, records_per_batch=240)
    core = make_core(broker.bootstrap, acks=acks)
    assert core.config.idempotent is (acks == "all")
    for batch in batches:
        core.append(batch)
    assert core.flush()
    core.close()

    assert len(deliveries.succeeded()) == len(batches)
    assert_each_reported_and_released_once(deliveries, batches)
    consumed = read_topic(broker.bootstrap, topic, expected=100_800)
    assert len(consumed) == 100_800
    if acks == "0":
        assert {b.base_offset for b in deliveries.succeeded()} == {-1}
    assert_delivered_once_in_order(deliveries, consumed, check_offsets=acks != "0")


# Compressed by the loop itself (the default: 0 threads), and by compression threads beside it.
@pytest.mark.parametrize(("codec", "threads"),
                         [("gzip", 0), ("snappy", 0), ("lz4", 0), ("zstd", 0), ("lz4", 2), ("zstd", 2)])
def test_100k_records_with_each_compression_codec(broker, topic_factory, codec: str, threads: int) -> None:
    topic = topic_factory(6)
    deliveries = Deliveries(topic)
    batches = deliveries.numbered(partitions=6, batches_per_partition=70, records_per_batch=240)
    uncompressed = sum(b.size_in_bytes for b in batches)
    core = make_core(broker.bootstrap, compression_type=codec, sidecar_compression_threads=threads)
    for batch in batches:
        core.append(batch)
    assert core.flush()
    core.close()

    assert len(deliveries.succeeded()) == len(batches)
    # Bytes of the batches on the wire, and their compression rate, as Kafka's metrics say.
    figures = core.metrics.producer_metrics(core.clock())
    assert core.metrics.batch_size.total < uncompressed / 2, "batches went uncompressed"
    assert figures["compression-rate-avg"] < 0.5
    consumed = read_topic(broker.bootstrap, topic, expected=100_800)
    assert_delivered_once_in_order(deliveries, consumed)


def test_three_brokers_get_their_own_requests_in_one_loop_iteration(mock_cluster) -> None:
    topic, leaders = mock_cluster.topic_led_by_several("three-brokers")
    deliveries = Deliveries(topic)
    core = make_core(mock_cluster.bootstrap)
    # Warm up: metadata, a connection to every leader, a producer id.
    for batch in deliveries.numbered(partitions=len(leaders), batches_per_partition=1, records_per_batch=5):
        core.append(batch)
    assert core.flush()
    run_until(core, lambda: all(core.client.can_send_request(n) for n in set(leaders.values())))

    for batch in deliveries.numbered(partitions=len(leaders), batches_per_partition=1, records_per_batch=5):
        core.append(batch)
    in_flight_before = core.client.in_flight_request_count()
    core.sender.send_producer_data(core.clock())
    # One produce request to each leader, and none to any other broker.
    assert core.client.in_flight_request_count() == in_flight_before + len(set(leaders.values()))
    for node in set(leaders.values()):
        assert core.client.in_flight_request_count(node) == 1, f"broker {node}"
    # One channel per leader; a broker that leads nothing may have one too (metadata and
    # InitProducerId go to the least loaded broker).
    assert set(leaders.values()) <= set(core.selector.channels())
    assert core.flush()
    core.close()
    assert len(deliveries.succeeded()) == 2 * len(leaders)
    consumed = read_topic(mock_cluster.bootstrap, topic, expected=10 * len(leaders))
    assert_delivered_once_in_order(deliveries, consumed)


def test_connection_cut_every_few_requests_loses_and_duplicates_nothing(proxied_broker) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("cut", 6)
    proxy.cut_every(3, api_key=0)
    deliveries = Deliveries("cut")
    batches = deliveries.numbered(partitions=6, batches_per_partition=40, records_per_batch=50)
    # Batch by batch: coalesced, these batches would take too few requests for many cuts.
    core = make_core(proxy.address, retry_backoff_ms=10, sidecar_coalesce_batches=False)
    for batch in batches:
        core.append(batch)
    assert core.flush()
    core.close()

    assert proxy.connections_accepted > 5, "the proxy did not cut connections"
    assert core.metrics.producer_metrics(core.clock())["record-retry-total"] > 0
    assert len(deliveries.succeeded()) == len(batches)
    assert_each_reported_and_released_once(deliveries, batches)
    proxy.heal()
    consumed = read_topic(proxy.address, "cut", expected=6 * 40 * 50)
    assert len(consumed) == 6 * 40 * 50
    assert_delivered_once_in_order(deliveries, consumed, check_offsets=False)


def test_a_request_whose_connection_goes_while_it_is_compressed_goes_on_the_next(proxied_broker) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("compressing", 3)
    deliveries = Deliveries("compressing")
    core = make_core(proxy.address, compression_type="zstd", sidecar_compression_threads=1, retry_backoff_ms=10)
    warm_up = deliveries.numbered(partitions=3, batches_per_partition=1, records_per_batch=10)
    for batch in warm_up:
        core.append(batch)
    assert core.flush()
    # The fault: the one compression thread is held, so that a request waits for its batches while its
    # connection is cut (a real codec takes microseconds: too short a window to cut into).
    held = threading.Event()
    assert core.sender._compressor is not None
    core.sender._compressor.submit(held.wait, 30)
    batches = deliveries.numbered(partitions=3, batches_per_partition=4, records_per_batch=200)
    for batch in batches:
        core.append(batch)
    run_until(core, lambda: bool(core.sender._compressing))
    proxy.cut()
    run_until(core, lambda: all(r.disconnected for r in core.sender._compressing.values()))
    held.set()
    assert core.flush()
    core.close()

    assert proxy.connections_accepted >= 2
    assert len(deliveries.succeeded()) == len(warm_up) + len(batches)
    assert_each_reported_and_released_once(deliveries, warm_up + batches)
    consumed = read_topic(proxy.address, "compressing", expected=3 * 10 + 3 * 4 * 200)
    assert_delivered_once_in_order(deliveries, consumed, check_offsets=False)


def test_lost_responses_are_retried_and_recognised_as_duplicates(proxied_broker) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("lost", 3)
    deliveries = Deliveries("lost")
    # Batch by batch, so that many requests are in flight when responses are lost.
    core = make_core(proxy.address, retry_backoff_ms=10, sidecar_coalesce_batches=False)
    warmup = deliveries.numbered(partitions=3, batches_per_partition=1, records_per_batch=10)
    for batch in warmup:
        core.append(batch)
    assert core.flush()
    written_before = proxy.requests_forwarded.get(0, 0)

    proxy.drop_responses(3, api_key=0)
    batches = deliveries.numbered(partitions=3, batches_per_partition=10, records_per_batch=20)
    for batch in batches:
        core.append(batch)
    assert core.flush()
    core.close()

    assert proxy.responses_dropped == 3
    assert core.metrics.producer_metrics(core.clock())["record-retry-total"] > 0
    assert proxy.requests_forwarded[0] > written_before + 10, "no produce request was sent twice"
    assert len(deliveries.succeeded()) == len(warmup) + len(batches)
    consumed = read_topic(proxy.address, "lost", expected=3 * 10 + 3 * 10 * 20)
    assert len(consumed) == 3 * 10 + 3 * 10 * 20
    assert_delivered_once_in_order(deliveries, consumed, check_offsets=False)


def test_silent_broker_expires_queued_and_in_flight_batches_once(proxied_broker) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("silent", 2)
    clock = JumpingClock()
    deliveries = Deliveries("silent")
    core = make_core(proxy.address, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000,
                     sidecar_coalesce_batches=False)
    for batch in deliveries.numbered(partitions=2, batches_per_partition=1, records_per_batch=3):
        batch.created_ms = clock.now
        core.append(batch)
    assert core.flush()
    warmup = len(deliveries.reports)

    proxy.blackhole()
    # More batches than five requests carry (one per partition each): some stay queued. They
    # were made 35 s ago, so that they expire in flight before their requests time out.
    stuck = deliveries.numbered(partitions=2, batches_per_partition=7, records_per_batch=4)
    for batch in stuck:
        batch.created_ms = clock.now - 35_000
        core.append(batch)
    # Five requests go out and are never answered.
    run_until(core, lambda: core.client.in_flight_request_count() == 5)
    in_flight = core.sender.in_flight_batches()
    queued = [b for b in stuck if b not in in_flight]
    assert in_flight and queued

    clock.advance(20_000)
    core.run_once(0)
    assert len(deliveries.reports) == warmup, "nothing may expire before delivery.timeout.ms"
    clock.advance(5_000)
    core.run_once(0)
    expired = deliveries.reports[warmup:]
    assert sorted(b.origin for b in expired) == sorted(b.origin for b in stuck)
    for batch in expired:
        assert batch.final_state is FinalState.FAILED
        assert isinstance(batch.error, KafkaTimeoutError)
        match = EXPIRY_MESSAGE.fullmatch(str(batch.error))
        assert match, str(batch.error)
        assert (int(match[1]), match[2], int(match[3])) == (batch.record_count, "silent", batch.tp.partition)
        assert 60_000 <= int(match[4]) < 90_000
    # Batches still held by unanswered requests keep their buffers until the requests end.
    assert all(deliveries.releases[b.origin] == 0 for b in in_flight)
    assert all(deliveries.releases[b.origin] == 1 for b in queued)

    clock.advance(10_000)
    run_until(core, lambda: core.client.in_flight_request_count() == 0)
    assert all(deliveries.releases[b.origin] == 1 for b in stuck)
    assert len(deliveries.reports) == warmup + len(stuck), "a batch was reported twice"
    core.close(0)


def test_after_unresolved_expiry_a_new_producer_id_is_taken_and_new_records_accepted(
        proxied_broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="service.producer.transaction_manager")
    tansu, proxy = proxied_broker
    tansu.create_topic("bump", 1)
    clock = JumpingClock()
    deliveries = Deliveries("bump")
    core = make_core(proxy.address, clock=clock, delivery_timeout_ms=60_000, request_timeout_ms=30_000,
                     sidecar_coalesce_batches=False)
    first = deliveries.numbered(partitions=1, batches_per_partition=2, records_per_batch=5)
    for batch in first:
        batch.created_ms = clock.now
        core.append(batch)
    assert core.flush()
    tm = core.transaction_manager
    producer_id = tm.producer_id_and_epoch.producer_id

    proxy.blackhole()
    lost = deliveries.numbered(partitions=1, batches_per_partition=2, records_per_batch=5)
    for batch in lost:
        batch.created_ms = clock.now
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count() > 0)
    clock.advance(60_000)
    core.run_once(0)
    assert all(b.final_state is FinalState.FAILED for b in lost)
    clock.advance(30_000)
    run_until(core, lambda: core.client.in_flight_request_count() == 0)

    proxy.heal()
    after = deliveries.numbered(partitions=1, batches_per_partition=3, records_per_batch=5)
    for batch in after:
        batch.created_ms = clock.now
        core.append(batch)
    assert core.flush()
    core.close()
    # One new producer id, as the log tells an operator.
    assert sum("taking a new producer id" in r.getMessage() for r in caplog.records) == 1
    assert tm.producer_id_and_epoch.producer_id != producer_id
    assert all(b.final_state is FinalState.SUCCEEDED for b in after)
    assert [b.base_sequence for b in after] == [0, 5, 10]
    consumed = read_topic(proxy.address, "bump", expected=25)
    records_of = {id(batch): records for batch, records in deliveries.sent[0]}
    values = [r.value for r in consumed]
    lost_values = [r.value for b in lost for r in records_of[id(b)]]
    # The expired batches may or may not have reached the broker (the proxy still delivers
    # what it held when the connection closes): whatever did arrived once, in order.
    assert [v for v in values if v not in lost_values] == [r.value for b in first + after for r in records_of[id(b)]]
    arrived = [v for v in values if v in lost_values]
    assert arrived == lost_values[:len(arrived)]


def test_tansu_refuses_an_epoch_the_producer_bumped_itself(broker, topic_factory) -> None:
    """Why the producer takes a new producer id where Java bumps the epoch locally (KIP-360): Tansu
    fences a batch under an epoch it did not hand out (see TransactionManager._reset_producer_id)."""
    topic = topic_factory(2)
    deliveries = Deliveries(topic)
    core = make_core(broker.bootstrap)
    first, bumped = deliveries.numbered(partitions=2, batches_per_partition=1, records_per_batch=3)
    core.append(first)
    assert core.flush()
    tm = core.transaction_manager
    handed_out = tm.producer_id_and_epoch
    # Java's bumpIdempotentProducerEpoch: the same id, the next epoch; partition 1 never saw the producer.
    tm.producer_id_and_epoch = ProducerIdAndEpoch(handed_out.producer_id, handed_out.epoch + 1)
    core.append(bumped)
    assert core.flush()
    core.close(0)
    assert (bumped.producer_id, bumped.producer_epoch, bumped.base_sequence) == (
        handed_out.producer_id, handed_out.epoch + 1, 0)
    assert bumped.final_state is FinalState.FAILED and bumped.error.name == "PRODUCER_FENCED"
