"""The test-support layer itself, checked against the real peers."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import crc32c
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, Producer
from confluent_kafka import Message as KafkaMessage

from service.tools.readback import ReadTimeout, read_topic
from tests.support.broker import TansuBroker
from tests.support.mock_cluster import MockCluster
from tests.support.proxy import FaultProxy, SilentListener
from tests.support.waiting import HANG_S

API_VERSIONS = 18
PRODUCE = 0


Message = dict[str, Any]  # keyword arguments of Producer.produce


def _produce(bootstrap: str, messages: list[Message]) -> dict[tuple[int, int], Message]:
    """Produce ``messages`` with acks=all; return each by its (partition, offset)."""
    # linger.ms puts several records in a batch, as the sidecar will.
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    placed: dict[tuple[int, int], Message] = {}
    failures: list[KafkaError] = []

    def on_delivery(sent: Message, error: KafkaError | None, message: KafkaMessage) -> None:
        if error is not None:
            failures.append(error)
        else:
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            placed[(partition, offset)] = sent

    for sent in messages:
        producer.produce(**sent, on_delivery=partial(on_delivery, sent))
    assert producer.flush(HANG_S) == 0
    assert not failures
    return placed


def test_read_topic_returns_records_intact(
    broker: TansuBroker, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(6)
    messages: list[Message] = [
        {
            "topic": topic,
            "key": None if i % 7 == 0 else f"key-{i}".encode(),
            "value": None if i % 5 == 0 else f"value-{i}".encode() * (i % 4 + 1),
            "headers": [("trace", f"t{i}".encode()), ("empty", None), ("trace", b"again")],
            "timestamp": 1_700_000_000_000 + i,
        }
        for i in range(60)
    ]
    placed = _produce(broker.bootstrap, messages)

    # No `expected`: the producer has flushed, so reading to the end must find them all.
    records = read_topic(broker.bootstrap, topic, timeout=HANG_S)

    assert [(r.partition, r.offset) for r in records] == sorted(placed)
    assert len({r.partition for r in records}) > 1
    for record in records:
        sent = placed[(record.partition, record.offset)]
        assert record.topic == topic
        assert record.key == sent["key"]
        assert record.value == sent["value"]
        assert record.headers == sent["headers"]
        assert record.timestamp_ms == sent["timestamp"]
        assert record.timestamp_type == TIMESTAMP_CREATE_TIME


def test_read_topic_of_empty_topic(broker: TansuBroker, topic_factory: Callable[..., str]) -> None:
    assert read_topic(broker.bootstrap, topic_factory(3), timeout=HANG_S) == []


def test_read_topic_times_out_short_of_expected(
    broker: TansuBroker, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(2)
    _produce(broker.bootstrap, [{"topic": topic, "value": b"only one"}])
    with pytest.raises(TimeoutError, match="read 1 records") as raised:
        read_topic(broker.bootstrap, topic, expected=2, timeout=2)
    assert isinstance(raised.value, ReadTimeout)
    assert [r.value for r in raised.value.records] == [b"only one"]


def _varint(n: int) -> bytes:
    zigzag = (n << 1) ^ (n >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _record_batch(values: list[bytes], *, corrupt_crc: bool) -> bytes:
    """A minimal uncompressed v2 RecordBatch (null keys, no headers, no producer id)."""
    records = b""
    for delta, value in enumerate(values):
        body = b"\0" + _varint(0) + _varint(delta) + _varint(-1)
        body += _varint(len(value)) + value + _varint(0)
        records += _varint(len(body)) + body
    timestamp = 1_700_000_000_000
    # attributes, last offset delta, first and max timestamp, producer id and epoch,
    # base sequence, record count
    covered = struct.pack(
        ">hiqqqhii", 0, len(values) - 1, timestamp, timestamp, -1, -1, -1, len(values)
    )
    covered += records
    crc = crc32c.crc32c(covered) ^ (1 if corrupt_crc else 0)
    after_length = struct.pack(">ibI", -1, 2, crc) + covered  # leader epoch, magic, crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _raw_produce(address: tuple[str, int], topic: str, partition: int, batch: bytes) -> None:
    """Send one Produce v3 request (acks=-1) and check that the broker accepted it."""
    name = topic.encode()
    client_id = b"support-test"
    body = struct.pack(">hhih", PRODUCE, 3, 1, len(client_id)) + client_id
    body += struct.pack(">hhii", -1, -1, 10_000, 1)  # no transactional id, acks, timeout, 1 topic
    body += struct.pack(">h", len(name)) + name
    body += struct.pack(">iii", 1, partition, len(batch)) + batch
    with socket.create_connection(address, timeout=HANG_S) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        response = _read_frame(sock)
    assert response is not None
    # correlation id, 1 topic, its name, 1 partition, its index, then its error code
    (error_code,) = struct.unpack_from(">h", response, 4 + 4 + 2 + len(name) + 4 + 4)
    assert error_code == 0


def test_read_topic_fails_on_a_corrupt_batch(
    broker: TansuBroker, topic_factory: Callable[..., str]
) -> None:
    # Tansu stores batches without checking their CRC: only the verifier can notice.
    good, bad = topic_factory(1), topic_factory(1)
    address = (broker.host, broker.port)
    _raw_produce(address, good, 0, _record_batch([b"a", b"b"], corrupt_crc=False))
    _raw_produce(address, bad, 0, _record_batch([b"a", b"b"], corrupt_crc=True))

    assert [r.value for r in read_topic(broker.bootstrap, good, timeout=HANG_S)] == [b"a", b"b"]
    with pytest.raises(AssertionError, match="CRC"):
        read_topic(broker.bootstrap, bad, timeout=HANG_S)


def test_mock_cluster_brokers_and_leaders(mock_cluster: MockCluster) -> None:
    assert len(mock_cluster.brokers) == 3
    assert all(host == "127.0.0.1" for host, _ in mock_cluster.brokers.values())
    assert len(mock_cluster.bootstrap.split(",")) == 3

    leaders = mock_cluster.ensure_topic("spread")
    assert len(leaders) == 4
    assert set(leaders.values()) <= set(mock_cluster.brokers)
    assert mock_cluster.ensure_topic("spread") == leaders
    # Each partition's leader is drawn at random: over 16 partitions, more than one broker
    # leads (all on one broker has a chance of 3 / 3**16).
    leader_ids = set(leaders.values())
    for name in ("spread-1", "spread-2", "spread-3"):
        leader_ids |= set(mock_cluster.ensure_topic(name).values())
    assert len(leader_ids) > 1


def test_mock_cluster_round_trip(mock_cluster: MockCluster) -> None:
    mock_cluster.ensure_topic("round-trip")
    placed = _produce(
        mock_cluster.bootstrap,
        [{"topic": "round-trip", "key": f"k{i}".encode(), "value": b"v"} for i in range(20)],
    )
    records = read_topic(mock_cluster.bootstrap, "round-trip", expected=20, timeout=HANG_S)
    assert [(r.partition, r.offset) for r in records] == sorted(placed)


# A raw client for the proxy tests: the broker advertises its own address, so a real
# Kafka client would leave the proxy right after bootstrap.


def _api_versions_request(correlation_id: int) -> bytes:
    client_id = b"support-test"
    body = struct.pack(">hhih", API_VERSIONS, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def _read_frame(sock: socket.socket) -> bytes | None:
    """One size-prefixed frame without its size, or None when the peer closed."""
    try:
        header = sock.recv(4, socket.MSG_WAITALL)
        if len(header) < 4:
            return None
        (size,) = struct.unpack(">i", header)
        body = sock.recv(size, socket.MSG_WAITALL)
    except ConnectionResetError:
        return None
    return body if len(body) == size else None


def _api_versions(sock: socket.socket, correlation_id: int) -> bytes | None:
    """Send ApiVersions v0; return its response (checked), or None if the peer closed."""
    sock.sendall(_api_versions_request(correlation_id))
    response = _read_frame(sock)
    if response is not None:
        assert struct.unpack_from(">ih", response) == (correlation_id, 0)  # no error
    return response


def _connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=HANG_S)


def test_proxy_forwards_a_round_trip(
    broker: TansuBroker, fault_proxy: Callable[[str, int], FaultProxy]
) -> None:
    proxy = fault_proxy(broker.host, broker.port)
    assert proxy.address == f"127.0.0.1:{proxy.port}"
    with _connect(proxy) as sock:
        response = _api_versions(sock, 7)
        assert response is not None
        (count,) = struct.unpack_from(">i", response, 6)
        api_keys = {struct.unpack_from(">h", response, 10 + 6 * i)[0] for i in range(count)}
        assert {PRODUCE, API_VERSIONS} <= api_keys
        assert _api_versions(sock, 8) is not None
    assert proxy.connections_accepted == 1
    assert proxy.requests_forwarded == {API_VERSIONS: 2}
    assert proxy.responses_dropped == 0


def test_proxy_cut_every(
    broker: TansuBroker, fault_proxy: Callable[[str, int], FaultProxy]
) -> None:
    proxy = fault_proxy(broker.host, broker.port)
    proxy.cut_every(2, api_key=API_VERSIONS)
    with _connect(proxy) as sock:
        assert _api_versions(sock, 1) is not None
        assert _api_versions(sock, 2) is None
    with _connect(proxy) as sock:
        assert _api_versions(sock, 3) is not None
        assert _api_versions(sock, 4) is None
    assert proxy.requests_forwarded == {API_VERSIONS: 4}  # the cut ones reached the broker

    proxy.cut_every(2, api_key=PRODUCE)  # other api keys pass
    with _connect(proxy) as sock:
        assert all(_api_versions(sock, i) is not None for i in range(3))
    proxy.cut_every(None)
    with _connect(proxy) as sock:
        assert all(_api_versions(sock, i) is not None for i in range(3))


def test_proxy_drop_responses(
    broker: TansuBroker, fault_proxy: Callable[[str, int], FaultProxy]
) -> None:
    proxy = fault_proxy(broker.host, broker.port)
    proxy.drop_responses(1)  # Produce only: ApiVersions passes
    with _connect(proxy) as sock:
        assert _api_versions(sock, 1) is not None

    proxy.drop_responses(2, api_key=API_VERSIONS)
    for correlation_id in (2, 3):
        with _connect(proxy) as sock:
            assert _api_versions(sock, correlation_id) is None
    with _connect(proxy) as sock:
        assert _api_versions(sock, 4) is not None
    assert proxy.responses_dropped == 2
    assert proxy.requests_forwarded == {API_VERSIONS: 4}


def test_proxy_cut_delay_blackhole_heal(
    broker: TansuBroker, fault_proxy: Callable[[str, int], FaultProxy]
) -> None:
    proxy = fault_proxy(broker.host, broker.port)
    with _connect(proxy) as sock:
        assert _api_versions(sock, 1) is not None
        proxy.cut()
        assert _read_frame(sock) is None

    proxy.delay(150)
    with _connect(proxy) as sock:
        started = time.monotonic()
        assert _api_versions(sock, 2) is not None
        assert time.monotonic() - started >= 0.3  # held on the way there and back

    proxy.heal()
    proxy.blackhole()
    with _connect(proxy) as sock:
        sock.sendall(_api_versions_request(3))
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(HANG_S)
        proxy.heal()
        # The blackholed request never reached the broker; the connection still works.
        assert _api_versions(sock, 4) is not None
    assert proxy.requests_forwarded == {API_VERSIONS: 3}


def test_silent_listener(silent_listener: SilentListener) -> None:
    with socket.create_connection((silent_listener.host, silent_listener.port), timeout=HANG_S) as sock:
        sock.sendall(_api_versions_request(1))
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
    assert silent_listener.connections_accepted == 1
