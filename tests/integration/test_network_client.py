"""The network layer against real peers: the Tansu broker (read back by librdkafka),
librdkafka's 3-broker mock cluster, and a listener that never answers."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from client_stub.errors import NetworkError
from client_stub.fastpath import encode_record_into, record_size
from service.network.client import ClientRequest, ClientResponse, NetworkClient, monotonic_ms
from service.network.connection_states import ConnectionState
from service.network.metadata import Metadata, Node
from service.network.selector import Selector
from service.protocol import messages as m
from service.protocol.api import APIS
from service.protocol.compression import CompressionType
from service.tools.readback import read_topic
from tests.support.broker import TansuBroker
from tests.support.mock_cluster import MockCluster
from tests.support.proxy import SilentListener
from tests.support.record_batches import build_batch
from tests.support.waiting import HANG_S


class Clock:
    """The loop's clock: real time plus the jumps the test makes."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return monotonic_ms() + self.offset

    def advance(self, ms: int) -> None:
        self.offset += ms


@pytest.fixture
def make_client() -> Iterator[Callable[..., NetworkClient]]:
    """``make_client(bootstrap, topics=(), **settings)``; every client is closed at teardown."""
    clients: list[NetworkClient] = []

    def make(bootstrap: str, topics: tuple[str, ...] = (), clock: Callable[[], int] = monotonic_ms,
             **settings: Any) -> NetworkClient:
        metadata = Metadata(bootstrap.split(","), refresh_backoff_ms=50)
        for topic in topics:
            metadata.add_topic(topic, clock())
        client = NetworkClient(Selector(), metadata, clock=clock, rng=random.Random(5), **settings)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close_all()


def run_until(client: NetworkClient, condition: Callable[[], bool], seen: list[ClientResponse] | None = None,
              timeout: float = HANG_S) -> list[ClientResponse]:
    seen = [] if seen is None else seen
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the client did not get there in time"
        seen += client.poll(20)
    return seen


def wait_ready(client: NetworkClient, node_id: int) -> Node:
    run_until(client, lambda: node_id in client.metadata.cluster.nodes)
    node = client.metadata.cluster.nodes[node_id]
    run_until(client, lambda: client.ready(node, client.clock()))
    return node


def request(client: NetworkClient, node_id: int, body: m.Message) -> ClientResponse:
    """Send ``body`` to ``node_id`` once it is ready and wait for the answer."""
    wait_ready(client, node_id)
    sent = ClientRequest(node_id, body, client.clock())
    client.send(sent, client.clock())
    seen: list[ClientResponse] = []
    run_until(client, lambda: any(r.request is sent for r in seen), seen)
    (response,) = [r for r in seen if r.request is sent]
    assert response.error is None, response.error
    return response


def broker_versions(client: NetworkClient, node_id: int) -> dict[int, tuple[int, int]]:
    """The version range of each API, as the broker ``node_id`` tells it in an ApiVersions answer of its own."""
    body = request(client, node_id, m.ApiVersionsRequest(client_software_name="tests",
                                                         client_software_version="0")).body
    assert body.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}


def common_version(client: NetworkClient, node_id: int, api_key: int) -> int:
    """The highest version of ``api_key`` that both the broker ``node_id`` and the codec speak."""
    low, high = broker_versions(client, node_id)[api_key]
    version = min(high, APIS[api_key].max_version)
    assert max(low, APIS[api_key].min_version) <= version
    return version


def wait_for_leaders(client: NetworkClient, topic: str, partitions: int) -> None:
    def known() -> bool:
        cluster = client.metadata.cluster
        if len(cluster.available_partitions(topic)) == partitions:
            return True
        client.metadata.request_update()  # the topic may be new to the broker
        return False

    run_until(client, known)


# -- the real broker -----------------------------------------------------------------------------


def known_brokers(client: NetworkClient) -> list[int]:
    run_until(client, lambda: not client.metadata.cluster.is_bootstrap)
    return list(client.metadata.cluster.nodes)


def test_api_versions_are_negotiated(broker: TansuBroker, make_client: Callable[..., NetworkClient]) -> None:
    client = make_client(broker.bootstrap)
    (node_id,) = known_brokers(client)
    node = wait_ready(client, node_id)
    assert client.connection_states.state(node.id) is ConnectionState.READY
    # Each request goes at the highest version both sides speak (Produce: test_produce_is_read_back_intact).
    asked = request(client, node.id, m.ApiVersionsRequest(client_software_name="tests", client_software_version="0"))
    assert asked.request.version == common_version(client, node.id, m.API_VERSIONS)
    metadata = request(client, node.id, m.MetadataRequest(topics=[]))
    assert metadata.request.version == common_version(client, node.id, m.METADATA)
    # What Tansu is known to speak (DESIGN.md), at most what the codec implements.
    assert common_version(client, node.id, m.PRODUCE) >= 9
    assert metadata.request.version >= 9


def test_metadata_of_a_six_partition_topic(broker: TansuBroker, topic_factory: Callable[..., str],
                                           make_client: Callable[..., NetworkClient]) -> None:
    topic = topic_factory(6)
    client = make_client(broker.bootstrap, topics=(topic,))
    wait_for_leaders(client, topic, 6)

    cluster = client.metadata.cluster
    assert not cluster.is_bootstrap
    assert cluster.partition_count(topic) == 6
    (node,) = cluster.nodes.values()
    assert node.address == (broker.host, broker.port) and node.id >= 0
    assert all(cluster.leader_for(topic, p) == node for p in range(6))
    assert topic not in cluster.topic_errors
    # Answered at the highest common version; the bootstrap connection is gone.
    assert client.selector.channels() in ([], [node.id])


def test_init_producer_id_at_the_negotiated_version(broker: TansuBroker,
                                                    make_client: Callable[..., NetworkClient]) -> None:
    client = make_client(broker.bootstrap)
    (node_id,) = known_brokers(client)
    response = request(client, node_id, m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000))

    assert response.request.version == common_version(client, node_id, m.INIT_PRODUCER_ID)
    assert response.body.error_code == 0
    assert response.body.producer_id >= 0 and response.body.producer_epoch >= 0


def _records(partition: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    """(key, value, headers, timestamp) covering null and empty keys, values and header values."""
    base = 1_700_000_000_000 + partition * 1000
    return [
        (b"key-0", b"value-0", [], base),
        (None, b"null key", [("h", b"v")], base + 5),
        (b"null value", None, [], base + 1),  # timestamps need not increase
        (b"empty value", b"", [("empty", b""), ("null", None)], base + 7),
        (b"", b"empty key", [("dup", b"1"), ("dup", b"2")], base + 7),
        (b"k" * 300, random.Random(partition).randbytes(2000) * 3, [("trace", b"x" * 100)], base + 100),
    ]


def _batch(partition: int, compression: CompressionType, producer_id: int, producer_epoch: int) -> bytes:
    records = _records(partition)
    base_ts = records[0][3]
    encoded = [(key, value, [(k.encode(), v) for k, v in headers], ts - base_ts) for key, value, headers, ts in records]
    buf = bytearray(sum(record_size(i, delta, key, value, headers)
                        for i, (key, value, headers, delta) in enumerate(encoded)))
    pos = 0
    for i, (key, value, headers, delta) in enumerate(encoded):
        pos = encode_record_into(buf, pos, i, delta, key, value, headers)
    parts = build_batch(buf, record_count=len(records), last_offset_delta=len(records) - 1, base_timestamp=base_ts,
                        max_timestamp=max(r[3] for r in records), producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=0, compression=compression)
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("compression", list(CompressionType), ids=lambda c: c.setting)
def test_produce_is_read_back_intact(broker: TansuBroker, topic_factory: Callable[..., str],
                                     make_client: Callable[..., NetworkClient], compression: CompressionType) -> None:
    topic = topic_factory(3)
    client = make_client(broker.bootstrap, topics=(topic,))
    wait_for_leaders(client, topic, 3)
    leader = client.metadata.cluster.leader_for(topic, 0)
    producer = request(client, leader.id, m.InitProducerIdRequest(transaction_timeout_ms=60000)).body

    r = m.ProduceRequest
    body = r(acks=-1, timeout_ms=30000, topic_data=[r.TopicProduceData(name=topic, partition_data=[
        r.TopicProduceData.PartitionProduceData(
            index=p, records=_batch(p, compression, producer.producer_id, producer.producer_epoch))
        for p in range(3)])])
    response = request(client, leader.id, body)

    assert response.request.version == common_version(client, leader.id, m.PRODUCE)
    (topic_response,) = response.body.responses
    assert topic_response.name == topic
    assert sorted((p.index, p.error_code, p.base_offset) for p in topic_response.partition_responses) == \
        [(0, 0, 0), (1, 0, 0), (2, 0, 0)]

    consumed = read_topic(broker.bootstrap, topic, expected=18, timeout=HANG_S)
    assert [(c.partition, c.offset) for c in consumed] == [(p, o) for p in range(3) for o in range(6)]
    for c in consumed:
        key, value, headers, timestamp = _records(c.partition)[c.offset]
        assert (c.key, c.value, c.headers, c.timestamp_ms) == (key, value, headers, timestamp), (c.partition, c.offset)


# -- librdkafka's mock cluster -------------------------------------------------------------------


def _established_to(ports: set[int]) -> int:
    """This process's ESTABLISHED TCP connections to 127.0.0.1 on ``ports`` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    with open("/proc/self/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            host, port = remote.split(":")
            if state == "01" and host == "0100007F" and int(port, 16) in ports and inode in inodes:
                count += 1
    return count


@pytest.fixture
def mock_topic(mock_cluster: MockCluster, request: pytest.FixtureRequest) -> tuple[str, dict[int, int]]:
    name = f"network-{request.node.name}-{random.randrange(10**9)}"
    return name, mock_cluster.ensure_topic(name)


def test_mock_cluster_metadata_lists_every_broker_and_leader(
        mock_cluster: MockCluster, mock_topic: tuple[str, dict[int, int]],
        make_client: Callable[..., NetworkClient]) -> None:
    topic, leaders = mock_topic
    client = make_client(mock_cluster.bootstrap, topics=(topic,))
    wait_for_leaders(client, topic, len(leaders))

    cluster = client.metadata.cluster
    assert {n.id: (n.host, n.port) for n in cluster.nodes.values()} == mock_cluster.brokers
    assert len(cluster.nodes) == 3
    assert {p: cluster.leader_for(topic, p).id for p in leaders} == leaders


def test_mock_cluster_one_connection_per_broker(mock_cluster: MockCluster, mock_topic: tuple[str, dict[int, int]],
                                                make_client: Callable[..., NetworkClient]) -> None:
    topic, leaders = mock_topic
    client = make_client(mock_cluster.bootstrap, topics=(topic,))
    wait_for_leaders(client, topic, len(leaders))
    ports = {port for _, port in mock_cluster.brokers.values()}

    # A request to every broker, several to each, in whatever order.
    for node_id in sorted(mock_cluster.brokers) * 2:
        body = m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)])
        response = request(client, node_id, body)
        assert {b.node_id for b in response.body.brokers} == set(mock_cluster.brokers)

    # One channel per broker id, none left to the bootstrap servers; one socket each.
    assert sorted(client.selector.channels()) == sorted(mock_cluster.brokers)
    assert _established_to(ports) == 3
    assert all(client.connection_states.is_ready(node_id) for node_id in mock_cluster.brokers)


# -- a listener that never answers ---------------------------------------------------------------


def test_a_silent_broker_times_out_and_is_reconnected_after_backoff(
        silent_listener: SilentListener, make_client: Callable[..., NetworkClient]) -> None:
    clock = Clock()
    # A timeout and a backoff that the test's real time does not reach: only the clock's jumps do.
    client = make_client(silent_listener.address, clock=clock, request_timeout_ms=60_000,
                         reconnect_backoff_ms=60_000, reconnect_backoff_max_ms=60_000)
    # The metadata refresh connects to the bootstrap server and asks for its ApiVersions.
    run_until(client, lambda: client.in_flight_request_count(-1) == 1)
    assert client.connection_states.state(-1) is ConnectionState.CHECKING_API_VERSIONS
    run_until(client, lambda: silent_listener.connections_accepted == 1)  # the listener's thread accepts it

    seen: list[ClientResponse] = []
    for _ in range(5):
        seen += client.poll(5)
    assert seen == []  # no answer, and not timed out on the loop's clock yet

    clock.advance(60_001)
    run_until(client, lambda: bool(seen), seen)
    (response,) = seen
    assert response.request.api_key == m.API_VERSIONS
    assert response.disconnected and response.timed_out
    assert isinstance(response.error, NetworkError) and "request timed out" in str(response.error)
    assert client.connection_states.state(-1) is ConnectionState.DISCONNECTED
    assert client.selector.channels() == []

    # Not before the backoff (reconnect.backoff.ms = max: 60 s exactly) has passed ...
    assert 0 < client.connection_delay(-1, clock()) <= 60_000
    for _ in range(5):
        client.poll(5)
    assert silent_listener.connections_accepted == 1
    # ... then the refresh, still due, connects again.
    clock.advance(60_000)
    run_until(client, lambda: client.in_flight_request_count(-1) == 1)
    run_until(client, lambda: silent_listener.connections_accepted == 2)
