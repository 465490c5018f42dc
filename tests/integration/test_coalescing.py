"""The daemon coalesces the small batches of a partition: fewer requests, the same records at the same offsets.

Against the real Tansu broker behind the FaultProxy, which counts the produce requests it
forwards; what arrived is read back by the confluent-kafka verifier. A broker refusing a
coalesced batch as too large is the fake broker (a fault Tansu will not produce on demand).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from client_stub import Producer, RecordMetadata
from client_stub.errors import KafkaTimeoutError
from service.producer.batch import FinalState, ProducerBatch
from service.producer.core import ProducerCore
from service.protocol.messages import PRODUCE
from service.tools.readback import read_topic
from tests.support.batches import Deliveries, SentRecord
from tests.support.core import (
    JumpingClock,
    assert_delivered_once_in_order,
    assert_each_reported_and_released_once,
    make_core,
    run_until,
)
from tests.support.fake_broker import produce_response, record_count
from tests.support.proxy import FaultProxy
from tests.support.record_batches import decode_batches
from tests.support.waiting import wait_until

MESSAGE_TOO_LARGE = 10


def one_record_batches(deliveries: Deliveries, partitions: int, per_partition: int,
                       name: bytes = b"r") -> list[ProducerBatch]:
    """One-record batches, as many clients at linger.ms=0 seal them: null keys, headers (some null),
    timestamps not in order, and each batch from an origin of its own. Values (``name``, partition,
    number) are unique."""
    now = int(time.time() * 1000)
    batches = []
    for n in range(per_partition):
        for p in range(partitions):
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if n % 2:
                headers = (("client", b"%d" % (n % 8)), ("nil", None))
            record = SentRecord(p, None if n % 3 == 0 else b"key-%d" % n, b"%s-p%d-%05d" % (name, p, n), headers,
                                now - n % 5)
            batches.append(deliveries.batch(p, [record]))
    return batches


def produce_requests(proxy: FaultProxy) -> int:
    return proxy.requests_forwarded.get(PRODUCE, 0)


def warmed_up_core(proxy: FaultProxy, deliveries: Deliveries, partitions: int,
                   **settings: object) -> tuple[ProducerCore, list[ProducerBatch]]:
    """A core with metadata, a connection and a producer id, so that what follows counts only the
    produce requests; and the batches it sent for that."""
    core = make_core(proxy.address, **settings)
    warm_up = one_record_batches(deliveries, partitions, 1, b"warm-up")
    for batch in warm_up:
        core.append(batch)
    assert core.flush()
    return core, warm_up


def send_all(core: ProducerCore, batches: list[ProducerBatch]) -> None:
    """Queue every batch before the loop runs, then flush: they are all there at the first drain."""
    for batch in batches:
        core.append(batch)
    assert core.flush()
    core.close()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_small_batches_of_a_partition_go_in_few_requests(proxied_broker, codec: str) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("small", 1)
    deliveries = Deliveries("small")
    core, warm_up = warmed_up_core(proxy, deliveries, 1, compression_type=codec)
    before = produce_requests(proxy)
    # More than one coalesced batch holds (batch.size, 256 batches at most): several go, in order.
    batches = one_record_batches(deliveries, 1, 600)
    send_all(core, batches)

    requests = produce_requests(proxy) - before
    assert requests <= len(batches) // 20, f"{requests} produce requests for {len(batches)} batches"
    assert len(deliveries.succeeded()) == len(batches) + 1
    assert_each_reported_and_released_once(deliveries, warm_up + batches)
    consumed = read_topic(proxy.address, "small", expected=601)
    assert len(consumed) == 601
    # every record once, in order, with its key, headers and timestamp, where its batch's report says
    assert_delivered_once_in_order(deliveries, consumed)


def test_without_coalescing_each_batch_goes_in_a_request_of_its_own(proxied_broker) -> None:
    """sidecar.coalesce.batches=false: one batch per partition per request, so at least
    batches / partitions requests."""
    tansu, proxy = proxied_broker
    tansu.create_topic("alone", 2)
    deliveries = Deliveries("alone")
    core, warm_up = warmed_up_core(proxy, deliveries, 2, sidecar_coalesce_batches=False)
    before = produce_requests(proxy)
    batches = one_record_batches(deliveries, 2, 100)
    send_all(core, batches)

    assert produce_requests(proxy) - before >= len(batches) / 2
    assert_each_reported_and_released_once(deliveries, warm_up + batches)
    consumed = read_topic(proxy.address, "alone", expected=202)
    assert len(consumed) == 202
    assert_delivered_once_in_order(deliveries, consumed)


def test_coalesced_batches_retried_after_cut_connections_arrive_once_in_order(proxied_broker) -> None:
    """A coalesced batch whose answer is lost goes again as it was, under its sequence: the broker
    recognises it, and nothing is lost or written twice."""
    tansu, proxy = proxied_broker
    tansu.create_topic("cut", 2)
    deliveries = Deliveries("cut")
    # One request at a time: the cut loses only the answer to the request it follows.
    core, warm_up = warmed_up_core(proxy, deliveries, 2, retry_backoff_ms=10,
                                   max_in_flight_requests_per_connection=1)
    proxy.cut_every(2)
    batches = []
    for _ in range(3):
        batches += one_record_batches(deliveries, 2, 300, b"round-%d" % len(batches))
    send_all(core, batches)

    assert core.metrics.producer_metrics(core.clock())["record-retry-total"] > 0
    assert_each_reported_and_released_once(deliveries, warm_up + batches)
    assert len(deliveries.succeeded()) == len(warm_up + batches)
    proxy.heal()
    consumed = read_topic(proxy.address, "cut", expected=len(warm_up + batches))
    assert len(consumed) == len(warm_up + batches)
    assert_delivered_once_in_order(deliveries, consumed, check_offsets=False)
    # Tansu answers a duplicate with offset -1 (unknown): every other part is where its report says.
    offsets = {r.value: r.offset for r in consumed}
    known = [(batch, records[0].value) for sent in deliveries.sent.values() for batch, records in sent
             if batch.base_offset >= 0]
    assert {batch for batch, _ in known} & set(batches), "no coalesced batch was answered with its offset"
    assert all(offsets[value] == batch.base_offset for batch, value in known)


def test_coalesced_batches_behind_a_silent_broker_expire_with_their_parts_once(proxied_broker) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("silent", 2)
    clock = JumpingClock()
    deliveries = Deliveries("silent")
    core, warm_up = warmed_up_core(proxy, deliveries, 2, clock=clock, delivery_timeout_ms=60_000,
                                   request_timeout_ms=30_000)

    proxy.blackhole()
    # Batches of about 5 KiB: a few to a coalesced batch, more than five requests carry. Made 35 s
    # ago, so that they expire in flight before their requests time out.
    stuck = deliveries.numbered(partitions=2, batches_per_partition=30, records_per_batch=100)
    for batch in stuck:
        batch.created_ms = clock.now - 35_000
        core.append(batch)
    run_until(core, lambda: core.client.in_flight_request_count() == 5)
    in_flight = core.sender.in_flight_batches()
    assert all(len(b.parts) > 1 for b in in_flight)
    assert core.accumulator.queued_batches() > 0

    clock.advance(25_000)
    core.run_once(0)
    expired = deliveries.reports[len(warm_up):]
    assert sorted(b.origin for b in expired) == sorted(b.origin for b in stuck)  # each part once
    assert all(b.final_state is FinalState.FAILED and isinstance(b.error, KafkaTimeoutError) for b in expired)
    # The coalesced batches own copies of the records: every part's buffer is back, in flight or not.
    assert all(deliveries.releases[b.origin] == 1 for b in stuck)
    clock.advance(10_000)
    run_until(core, lambda: core.client.in_flight_request_count() == 0)
    assert len(deliveries.reports) == len(warm_up) + len(stuck), "a part was reported twice"
    assert all(deliveries.releases[b.origin] == 1 for b in stuck)
    assert not core.accumulator.has_incomplete()
    core.close(0)


def test_producers_at_linger_0_on_one_partition_get_the_offsets_the_verifier_reads(
        broker, topic_factory, sidecar) -> None:
    """Several clients, each sealing a batch per record, into one partition through one daemon."""
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    clients, per_client = 4, 300

    def produce(client: int) -> list[RecordMetadata]:
        with Producer(daemon.endpoint, linger_ms=0) as producer:
            futures = [producer.send(topic, b"c%d-%04d" % (client, n), key=None if n % 2 else b"c%d" % client,
                                     headers={"client": b"%d" % client}, partition=0) for n in range(per_client)]
            assert producer.flush(60) == 0
            return [future.result(0) for future in futures]

    with ThreadPoolExecutor(clients) as pool:
        metadata = list(pool.map(produce, range(clients)))
    consumed = read_topic(broker.bootstrap, topic, expected=clients * per_client)
    assert len(consumed) == clients * per_client
    assert [r.offset for r in consumed] == list(range(clients * per_client))  # each once
    for client, mds in enumerate(metadata):
        assert [(md.partition, consumed[md.offset].value) for md in mds] == [
            (0, b"c%d-%04d" % (client, n)) for n in range(per_client)]
        assert all(consumed[md.offset].timestamp_ms == md.timestamp_ms for md in mds)
        assert all(consumed[md.offset].headers == [("client", b"%d" % client)] for md in mds)


# -- a coalesced batch refused as too large ---------------------------------------------------------


def refusing_more_than(broker, most: int, refused: list[int]):
    """A Produce handler: MESSAGE_TOO_LARGE for a batch of more than ``most`` records (their counts go
    to ``refused``), the default answer otherwise."""

    def handler(header, request):
        count = record_count(bytes(request.topic_data[0].partition_data[0].records))
        if count > most:
            refused.append(count)
            return produce_response(request, error_code=MESSAGE_TOO_LARGE)
        return broker.default_response(header, request)

    return handler


def stored_batches(broker, topic: str) -> list:
    return [batch for records in broker.batches[(topic, 0)] for batch in decode_batches(records)]


def test_parts_of_a_coalesced_batch_refused_as_too_large_go_on_their_own(fake_broker) -> None:
    broker = fake_broker(1, topics={"large": 1})
    refused: list[int] = []
    broker.set_handler(PRODUCE, refusing_more_than(broker, 3, refused))
    deliveries = Deliveries("large")
    core = make_core(broker.address)
    parts = [deliveries.batch(0, [SentRecord(0, None, b"b%d-r%d" % (b, r), (), 1_700_000_000_000 + b)
                                  for r in range(count)]) for b, count in enumerate((3, 1, 2, 3))]
    send_all(core, parts)

    assert refused == [9]  # the four parts, coalesced
    assert core.metrics.producer_metrics(core.clock())["batch-split-total"] == 1
    stored = stored_batches(broker, "large")
    # Each part went as it was, under the sequences the coalesced batch had.
    assert [[r.value for r in b.records] for b in stored] == [
        [r.value for r in records] for _, records in deliveries.sent[0]]
    assert [b.base_sequence for b in stored] == [0, 3, 4, 6]
    assert all(b.crc_valid for b in stored)
    assert [b.final_state for b in deliveries.reports] == [FinalState.SUCCEEDED] * 4
    assert_each_reported_and_released_once(deliveries, parts)
    values = [r.value for b in stored for r in b.records]
    for batch, records in deliveries.sent[0]:
        assert values.index(records[0].value) == batch.base_offset


def test_records_of_a_coalesced_batch_refused_as_too_large_are_reported_once_where_they_are(
        fake_broker, sidecar) -> None:
    """Through the daemon: batches sealed by several clients while the partition waits are coalesced;
    the broker refuses that batch; each record's RecordMetadata says where it is."""
    broker = fake_broker(1, topics={"large": 1})
    refused: list[int] = []
    broker.set_handler(PRODUCE, refusing_more_than(broker, 3, refused))
    # One request at a time: while one is out, the partition's batches wait, and are coalesced.
    daemon = sidecar(broker.address, settings={"max.in.flight.requests.per.connection": 1})
    producers = [Producer(daemon.endpoint, linger_ms=600_000) for _ in range(4)]
    try:
        # Metadata, a connection and a producer id first: they would wait for the paused broker too.
        first = producers[0].send("large", b"first", partition=0)
        assert producers[0].flush(30) == 0
        broker.pause()  # the first batch sealed goes out alone and waits; the others queue behind it
        futures = {}
        for client, producer in enumerate(producers):
            futures[client] = [producer.send("large", b"c%d-%d" % (client, n), partition=0) for n in range(3)]
            producer.flush(0)  # seals without waiting
        # The seal notices reach the daemon while the first batch waits.
        assert wait_until(lambda: daemon.stats()["sidecar"]["records-sealed-total"] >= 1 + 4 * 3)
        broker.resume()
        for producer in producers:
            assert producer.flush(30) == 0
    finally:
        for producer in producers:
            producer.close()
    assert refused and max(refused) > 3, "no coalesced batch was refused"
    stored = stored_batches(broker, "large")
    assert all(b.record_count <= 3 for b in stored)
    values = [r.value for b in stored for r in b.records]
    assert sorted(values) == sorted([b"first"] + [b"c%d-%d" % (c, n) for c in range(4) for n in range(3)])
    assert first.result(0).offset == values.index(b"first")
    for client, client_futures in futures.items():
        assert [f.result(0).offset for f in client_futures] == [values.index(b"c%d-%d" % (client, n))
                                                                for n in range(3)]
