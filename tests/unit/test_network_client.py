"""NetworkClient against FakeBroker: readiness, version negotiation, in-flight requests,
timeouts, reconnects, brokers that move or leave, least loaded node.

Time that matters (request timeouts, reconnect backoff) is the loop's clock, which the
tests move forward; wall-clock waits are only generous upper bounds.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import logging
import random
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from client_stub.errors import NetworkError, UnsupportedError
from client_stub.fastpath import encode_record
from service.network.client import (
    SOFTWARE_VERSION,
    ClientRequest,
    ClientResponse,
    NetworkClient,
    NodeApiVersions,
    monotonic_ms,
    software_version,
)
from service.network.connection_states import ConnectionState
from service.network.metadata import Metadata, Node
from service.network.selector import Selector
from service.protocol import messages as m
from service.protocol.api import APIS
from tests.support.broker_codec import encode_response
from tests.support.fake_broker import CLOSE, FakeBroker, codec_api_versions
from tests.support.record_batches import build_batch, decode_batches
from tests.support.waiting import HANG_S

TOPIC = "events"


class Clock:
    """The loop's clock: real time plus the jumps the test makes (or, once frozen, only those)."""

    def __init__(self) -> None:
        self.offset = 0
        self.frozen_at: int | None = None

    def __call__(self) -> int:
        return (monotonic_ms() if self.frozen_at is None else self.frozen_at) + self.offset

    def advance(self, ms: int) -> None:
        self.offset += ms

    def freeze(self) -> None:
        """From now on the clock moves only as advance() moves it: durations it measures are exact."""
        self.frozen_at = monotonic_ms()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_client(clock: Clock) -> Iterator[Callable[..., NetworkClient]]:
    """``make_client(*brokers, **settings)``: a client bootstrapped from ``brokers``, closed at teardown."""
    clients: list[NetworkClient] = []

    def make(*brokers: FakeBroker, receive_buffer_bytes: int = -1, metadata_max_age_ms: int = 300_000,
             **settings: Any) -> NetworkClient:
        metadata = Metadata([b.address for b in brokers], refresh_backoff_ms=10,
                            metadata_max_age_ms=metadata_max_age_ms)
        metadata.add_topic(TOPIC, clock())
        client = NetworkClient(Selector(receive_buffer_bytes=receive_buffer_bytes), metadata, clock=clock,
                               rng=random.Random(7), **settings)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close_all()


def run_until(client: NetworkClient, condition: Callable[[], bool], responses: list[ClientResponse] | None = None,
              timeout: float = HANG_S) -> list[ClientResponse]:
    """Poll until ``condition()``; the responses seen are added to ``responses`` (and returned)."""
    seen = [] if responses is None else responses
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the client did not get there in time"
        seen += client.poll(10)
    return seen


def node(client: NetworkClient, node_id: int) -> Node:
    run_until(client, lambda: node_id in client.metadata.cluster.nodes)
    return client.metadata.cluster.nodes[node_id]


def wait_ready(client: NetworkClient, node_id: int) -> Node:
    target = node(client, node_id)
    run_until(client, lambda: client.ready(target, client.clock()))
    return target


def init_producer_id(node_id: int, now: int, **kwargs: Any) -> ClientRequest:
    return ClientRequest(node_id, m.InitProducerIdRequest(transaction_timeout_ms=60000), now, **kwargs)


def send_all(client: NetworkClient, requests: list[ClientRequest]) -> list[ClientResponse]:
    """Send ``requests``, each once the previous is written; returns responses seen meanwhile."""
    responses: list[ClientResponse] = []
    for request in requests:
        run_until(client, partial(client.can_send_request, request.destination), responses)
        client.send(request, client.clock())
        run_until(client, partial(_written, client, request.destination), responses)
    return responses


def _written(client: NetworkClient, node_id: int) -> bool:
    return not client.selector.has_pending_send(node_id)


def answers(client: NetworkClient, requests: list[ClientRequest], seen: list[ClientResponse] | None = None,
            timeout: float = HANG_S) -> list[ClientResponse]:
    """Poll until each of ``requests`` has its response; returns those in the order they came.

    (poll() also returns the responses to the client's own Metadata requests.)
    """
    seen = [] if seen is None else seen

    def mine() -> list[ClientResponse]:
        return [r for r in seen if r.request in requests]  # ClientRequest compares by identity

    run_until(client, lambda: len(mine()) == len(requests), seen, timeout)
    return mine()


def produce_request(value_size: int) -> m.ProduceRequest:
    records = encode_record(0, 0, b"key", b"v" * value_size)
    batch = b"".join(build_batch(records, record_count=1, last_offset_delta=0, base_timestamp=1_700_000_000_000,
                                 max_timestamp=1_700_000_000_000))
    partition = m.ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
    return m.ProduceRequest(acks=-1, timeout_ms=30000, topic_data=[
        m.ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[partition])])


# -- readiness -------------------------------------------------------------------------------------


def test_bootstrap_then_one_connection_per_broker(fake_broker: Callable[..., FakeBroker],
                                                  make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 3})
    client = make_client(broker)
    wait_ready(client, 1)

    cluster = client.metadata.cluster
    assert not cluster.is_bootstrap
    assert cluster.partition_count(TOPIC) == 3
    assert cluster.leader_for(TOPIC, 2) == Node(1, broker.host, broker.port)
    # The bootstrap connection (-1) was closed once the broker was known by id.
    assert client.selector.channels() == [1]
    run_until(client, lambda: broker.open_connections == 1)
    assert broker.connections_accepted == 2


def test_not_ready_until_api_versions_are_known(fake_broker: Callable[..., FakeBroker],
                                                make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    client = make_client(broker)
    target = node(client, 1)
    broker.pause()

    assert not client.ready(target, client.clock())  # starts connecting
    assert client.connection_states.state(1) is ConnectionState.CONNECTING
    run_until(client, lambda: client.connection_states.state(1) is ConnectionState.CHECKING_API_VERSIONS)
    for _ in range(10):
        client.poll(5)
    # Connected, but the broker has not answered ApiVersions.
    assert client.selector.is_connected(1)
    assert client.connection_states.state(1) is ConnectionState.CHECKING_API_VERSIONS
    assert not client.ready(target, client.clock())
    assert not client.can_send_request(1)

    broker.resume()
    run_until(client, lambda: client.ready(target, client.clock()))
    assert client.connection_states.state(1) is ConnectionState.READY
    # A request goes at the highest version the broker's answer allows.
    request = init_producer_id(1, client.clock())
    client.send(request, client.clock())
    (response,) = answers(client, [request])
    assert response.request.version == APIS[m.INIT_PRODUCER_ID].max_version
    assert [h.api_version for h, _ in broker.requests_of(m.INIT_PRODUCER_ID)] == [response.request.version]


def test_not_ready_while_a_send_is_pending(fake_broker: Callable[..., FakeBroker],
                                          make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    client = make_client(broker)
    wait_ready(client, 1)

    # Queued but not yet written: the next poll writes it.
    client.send(init_producer_id(1, client.clock()), client.clock())
    assert client.selector.has_pending_send(1)
    assert not client.is_ready(1, client.clock())
    run_until(client, lambda: not client.selector.has_pending_send(1))
    assert client.is_ready(1, client.clock())  # one in flight, below the limit

    # A request too big for the socket buffers while the broker reads nothing stays partly written.
    run_until(client, lambda: client.in_flight_request_count(1) == 0)
    broker.pause()
    request = produce_request(16 * 1024 * 1024)
    responses: list[ClientResponse] = []
    produce = ClientRequest(1, request, client.clock())
    client.send(produce, client.clock())
    for _ in range(20):
        responses += client.poll(5)
    assert client.selector.has_pending_send(1)
    assert client.in_flight_request_count(1) == 1
    assert not client.is_ready(1, client.clock())

    broker.resume()
    (response,) = answers(client, [produce], responses)
    assert response.error is None and response.body.responses[0].partition_responses[0].error_code == 0
    (records,) = broker.batches[(TOPIC, 0)]
    assert decode_batches(records)[0].records[0].value == b"v" * (16 * 1024 * 1024)
    assert client.is_ready(1, client.clock())


def test_not_ready_at_the_in_flight_limit_and_answers_come_in_order(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    client = make_client(broker, max_in_flight_requests_per_connection=3)
    wait_ready(client, 1)
    broker.pause()

    requests = [init_producer_id(1, client.clock()) for _ in range(3)]
    responses = send_all(client, requests)
    assert client.in_flight_request_count(1) == 3
    assert not client.selector.has_pending_send(1)
    assert not client.is_ready(1, client.clock())
    assert not client.can_send_request(1)

    broker.resume()
    responses = answers(client, requests, responses)
    assert [r.request for r in responses] == requests
    ids = [r.correlation_id for r in requests]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert all(r.body.producer_id == 1000 and not r.disconnected for r in responses)
    assert client.is_ready(1, client.clock())


def test_callbacks_get_the_responses(fake_broker: Callable[..., FakeBroker],
                                     make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    client = make_client(broker)
    wait_ready(client, 1)
    called: list[ClientResponse] = []
    request = init_producer_id(1, client.clock(), callback=called.append)
    responses = send_all(client, [request])
    run_until(client, lambda: len(called) == 1, responses)
    assert called[0] in responses
    assert called[0].body.producer_id == 1000
    assert called[0].request.version == APIS[m.INIT_PRODUCER_ID].max_version
    assert called[0].latency_ms >= 0


def test_close_all_fails_what_is_in_flight_and_runs_the_callbacks(fake_broker: Callable[..., FakeBroker],
                                                                  make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    broker.set_handler(m.INIT_PRODUCER_ID, lambda header, request: None)  # never answered
    client = make_client(broker)
    wait_ready(client, 1)
    called: list[ClientResponse] = []
    requests = [init_producer_id(1, client.clock(), callback=called.append) for _ in range(2)]
    assert send_all(client, requests) == []

    # No poll follows a close: the callbacks run in it.
    client.close_all()
    assert [r.request for r in called] == requests
    assert all(r.disconnected and isinstance(r.error, NetworkError) for r in called)
    assert client.in_flight_request_count() == 0


# -- broken responses ----------------------------------------------------------------------------


def test_correlation_id_mismatch_closes_the_connection(fake_broker: Callable[..., FakeBroker],
                                                       make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    broker.set_handler(m.INIT_PRODUCER_ID, lambda header, request: encode_response(
        m.InitProducerIdResponse(producer_id=1000), header.api_version, header.correlation_id + 1000))
    client = make_client(broker)
    wait_ready(client, 1)
    broker.pause()
    requests = [init_producer_id(1, client.clock()) for _ in range(2)]
    responses = send_all(client, requests)

    broker.resume()
    responses = answers(client, requests, responses)
    assert [r.request for r in responses] == requests
    for response in responses:
        assert response.disconnected and not response.timed_out and response.body is None
        assert isinstance(response.error, NetworkError)
        assert "correlation id" in str(response.error)
    assert not client.selector.has_channel(1)
    assert client.connection_states.state(1) is ConnectionState.DISCONNECTED
    assert client.in_flight_request_count() == 0
    run_until(client, lambda: broker.open_connections == 0)


def test_response_above_the_receive_maximum_disconnects(fake_broker: Callable[..., FakeBroker],
                                                        make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    broker.set_handler(m.INIT_PRODUCER_ID, lambda header, request: struct.pack(">i", 200_000_000))
    client = make_client(broker)
    wait_ready(client, 1)
    request = init_producer_id(1, client.clock())
    (response,) = answers(client, [request], send_all(client, [request]))
    assert response.disconnected
    assert "invalid receive of 200000000 bytes" in str(response.error)
    assert "receive.message.max.bytes" in str(response.error)


def test_a_response_sent_just_before_the_broker_closes_still_counts(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    size = 256 * 1024  # one full read of the selector, so that the end of stream comes in the same read

    def answer_then_close(header, request):
        response = broker.default_response(header, request)
        response.cluster_id = ""
        while (missing := size - len(encode_response(response, header.api_version, header.correlation_id))):
            # A longer string may take a longer length prefix: adjust until the size is right.
            response.cluster_id = "x" * (len(response.cluster_id) + missing)
        return [encode_response(response, header.api_version, header.correlation_id), CLOSE]

    client = make_client(broker, receive_buffer_bytes=1024 * 1024)
    wait_ready(client, 1)
    broker.pause()
    request = ClientRequest(1, m.MetadataRequest(topics=[]), client.clock())
    responses = send_all(client, [request])
    broker.set_handler(m.METADATA, answer_then_close)
    broker.resume()
    # Let the answer and the close arrive before the client reads anything.
    sock = client.selector._channels[1].transport.sock
    deadline = time.monotonic() + HANG_S
    while broker.open_connections or _pending(sock) < size:
        assert time.monotonic() < deadline
        time.sleep(0.01)

    (response,) = answers(client, [request], responses)
    assert not response.disconnected
    assert set(response.body.cluster_id) == {"x"}
    run_until(client, lambda: not client.selector.has_channel(1))
    assert client.connection_states.state(1) is ConnectionState.DISCONNECTED


def _pending(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


# -- version negotiation -------------------------------------------------------------------------


def test_no_common_produce_version_fails_the_request_naming_the_api(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1}, api_versions={**codec_api_versions(), m.PRODUCE: (0, 2)})
    client = make_client(broker)
    wait_ready(client, 1)
    called: list[ClientResponse] = []
    request = ClientRequest(1, produce_request(10), client.clock(), callback=called.append)
    client.send(request, client.clock())
    assert answers(client, [request]) == called
    error = called[0].error
    assert isinstance(error, UnsupportedError)
    assert "Produce" in str(error) and "v0-v2" in str(error)
    assert error.code == 35
    assert not called[0].disconnected and called[0].body is None
    assert broker.requests_of(m.PRODUCE) == []
    assert client.is_ready(1, client.clock())  # the connection is fine for other APIs


def test_api_versions_falls_back_to_what_the_broker_knows(fake_broker: Callable[..., FakeBroker],
                                                          make_client: Callable[..., NetworkClient]) -> None:
    # The v2 answer's ranges are those the client goes by: InitProducerId below what the codec speaks.
    ranges = {**codec_api_versions(), m.API_VERSIONS: (0, 2), m.INIT_PRODUCER_ID: (0, 3)}
    assert APIS[m.INIT_PRODUCER_ID].max_version > 3
    broker = fake_broker(1, topics={TOPIC: 1}, api_versions=ranges)
    client = make_client(broker)
    wait_ready(client, 1)

    versions = [h.api_version for h, _ in broker.requests_of(m.API_VERSIONS)]
    assert versions == [4, 2, 4, 2]  # the bootstrap connection, then node 1's
    # The metadata request went at the highest common version, and so does InitProducerId.
    assert {h.api_version for h, _ in broker.requests_of(m.METADATA)} == {APIS[m.METADATA].max_version}
    request = init_producer_id(1, client.clock())
    client.send(request, client.clock())
    (response,) = answers(client, [request])
    assert response.request.version == 3 and response.error is None
    assert [h.api_version for h, _ in broker.requests_of(m.INIT_PRODUCER_ID)] == [3]


def test_a_broker_without_api_versions_is_not_used(fake_broker: Callable[..., FakeBroker],
                                                   make_client: Callable[..., NetworkClient]) -> None:
    ranges = codec_api_versions()
    del ranges[m.API_VERSIONS]
    broker = fake_broker(1, api_versions=ranges)
    client = make_client(broker)
    reasons: list[str] = []

    def failed() -> bool:
        reasons.extend(client.disconnect_reasons.values())
        return bool(reasons)

    run_until(client, failed)
    assert reasons == ["ApiVersions failed: UNSUPPORTED_VERSION"]
    assert [h.api_version for h, _ in broker.requests_of(m.API_VERSIONS)] == [4, 3, 2, 1, 0]
    assert client.connection_states.state(-1) is ConnectionState.DISCONNECTED


def test_a_metadata_version_the_broker_lacks_fails_the_refresh_which_is_tried_again(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient], clock: Clock) -> None:
    # A broker that only speaks a Metadata version the codec does not have (a future Kafka).
    broker = fake_broker(1, topics={TOPIC: 1}, api_versions={**codec_api_versions(), m.METADATA: (13, 13)})
    client = make_client(broker)
    seen: list[ClientResponse] = []

    def failed_refreshes() -> list[ClientResponse]:
        return [r for r in seen if r.request.api_key == m.METADATA]

    run_until(client, lambda: len(failed_refreshes()) == 1, seen)
    (failure,) = failed_refreshes()
    assert isinstance(failure.error, UnsupportedError) and "Metadata" in str(failure.error)
    assert broker.requests_of(m.METADATA) == []  # nothing was sent
    # The refresh is tried again after the refresh backoff (10 ms), and fails again.
    clock.advance(10)
    run_until(client, lambda: len(failed_refreshes()) >= 2, seen)
    assert client.metadata.cluster.is_bootstrap

    # Once the broker speaks a version it shares (an upgrade, a reconnect), metadata arrives.
    broker.api_versions = codec_api_versions()
    broker.close_connections()
    run_until(client, lambda: not client.metadata.cluster.is_bootstrap)
    assert client.metadata.cluster.partition_count(TOPIC) == 1


def test_api_versions_names_the_sidecar_and_its_version(fake_broker: Callable[..., FakeBroker],
                                                        make_client: Callable[..., NetworkClient],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    wait_ready(make_client(broker), 1)
    _, request = broker.requests_of(m.API_VERSIONS)[0]
    assert request.client_software_name == "kafka-sidecar"
    assert request.client_software_version == SOFTWARE_VERSION == importlib.metadata.version("kafka-sidecar")

    # From a source tree that is not installed, as the Java client says.
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert software_version() == "unknown"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7")
    assert software_version() == "9.8.7"


def test_latest_usable_version() -> None:
    versions = NodeApiVersions({m.PRODUCE: (3, 9), m.METADATA: (0, 20), m.INIT_PRODUCER_ID: (0, 1)})
    assert versions.latest_usable_version(m.PRODUCE) == 9
    assert versions.latest_usable_version(m.PRODUCE, max_version=7) == 7
    assert versions.latest_usable_version(m.METADATA) == APIS[m.METADATA].max_version
    assert versions.latest_usable_version(m.INIT_PRODUCER_ID) == 1
    with pytest.raises(UnsupportedError, match="does not support the ApiVersions API"):
        versions.latest_usable_version(m.API_VERSIONS)
    with pytest.raises(UnsupportedError, match=r"supports Produce v0-v2.*no common version"):
        NodeApiVersions({m.PRODUCE: (0, 2)}).latest_usable_version(m.PRODUCE)
    with pytest.raises(UnsupportedError, match="Produce"):
        versions.latest_usable_version(m.PRODUCE, max_version=2)


# -- timeouts and reconnects ---------------------------------------------------------------------


def test_request_timeout_disconnects_and_fails_everything_in_flight(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient], clock: Clock) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    broker.set_handler(m.INIT_PRODUCER_ID, lambda header, request: None)  # never answered
    # A timeout and a backoff that the test's real time does not reach: only the clock's jumps do.
    client = make_client(broker, request_timeout_ms=60_000, reconnect_backoff_ms=60_000,
                         reconnect_backoff_max_ms=60_000)
    target = wait_ready(client, 1)
    requests = [init_producer_id(1, clock()) for _ in range(3)]
    responses = send_all(client, requests)
    assert responses == []
    assert all(r.request_timeout_ms == 60_000 for r in requests)  # the client's request.timeout.ms

    clock.advance(60_001)
    responses = answers(client, requests, responses)
    assert [r.request for r in responses] == requests
    for response in responses:
        assert response.disconnected and response.timed_out
        assert isinstance(response.error, NetworkError) and "request timed out" in str(response.error)
    assert not client.selector.has_channel(1)
    assert client.in_flight_request_count() == 0
    run_until(client, lambda: broker.open_connections == 0)
    accepted = broker.connections_accepted

    # Backing off: no reconnect until the backoff has passed on the loop's clock.
    assert client.connection_states.state(1).is_disconnected and not client.connection_states.can_connect(1, clock())
    assert 0 < client.connection_delay(1, clock()) <= 60_000  # reconnect.backoff.ms = max: no growth, no jitter
    assert not client.ready(target, clock())
    for _ in range(5):
        client.poll(5)
    assert broker.connections_accepted == accepted

    clock.advance(60_000)  # past the backoff
    run_until(client, lambda: client.ready(target, clock()))
    assert broker.connections_accepted == accepted + 1


def test_a_request_can_have_its_own_timeout(fake_broker: Callable[..., FakeBroker],
                                            make_client: Callable[..., NetworkClient], clock: Clock) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    broker.set_handler(m.INIT_PRODUCER_ID, lambda header, request: None)
    client = make_client(broker, request_timeout_ms=60_000)
    wait_ready(client, 1)
    request = init_producer_id(1, clock(), request_timeout_ms=500)
    responses = send_all(client, [request])
    clock.advance(501)
    (response,) = answers(client, [request], responses)
    assert response.timed_out


def test_a_failed_connection_backs_off_exponentially(make_client: Callable[..., NetworkClient],
                                                     clock: Clock, fake_broker: Callable[..., FakeBroker]) -> None:
    broker = fake_broker(1)
    broker.stop()  # nothing listens at its address any more
    client = make_client(broker, reconnect_backoff_ms=1000, reconnect_backoff_max_ms=8000)
    clock.freeze()  # each delay read is the whole backoff, however long the loop takes to get there
    delays = []
    for _ in range(6):
        # The metadata refresh keeps trying the bootstrap server once its backoff allows.
        client.poll(0)
        run_until(client, lambda: -1 in client.disconnect_reasons)
        delays.append(client.connection_delay(-1, clock()))
        clock.advance(delays[-1])
    for attempt, delay in enumerate(delays):
        expected = min(1000 * 2**attempt, 8000)
        # +-20% jitter, never above reconnect.backoff.max.ms.
        assert 0.8 * expected <= delay <= min(1.2 * expected, 8000), (attempt, delays)


# -- brokers that move or leave ------------------------------------------------------------------


def test_a_broker_that_moves_is_reconnected_at_its_new_address(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    old = fake_broker(1, topics={TOPIC: 1})
    new = fake_broker(1, topics={TOPIC: 1})
    client = make_client(old)
    wait_ready(client, 1)
    request = init_producer_id(1, client.clock())
    answers(client, [request], send_all(client, [request]))
    assert len(old.requests_of(m.INIT_PRODUCER_ID)) == 1

    old.set_brokers([(1, new.host, new.port)])
    client.metadata.request_update()
    run_until(client, lambda: client.metadata.cluster.nodes[1].port == new.port)
    assert not client.selector.has_channel(1)  # the connection to the old address is closed
    run_until(client, lambda: old.open_connections == 0)

    wait_ready(client, 1)
    request = init_producer_id(1, client.clock())
    answers(client, [request], send_all(client, [request]))
    assert len(new.requests_of(m.INIT_PRODUCER_ID)) == 1
    assert len(old.requests_of(m.INIT_PRODUCER_ID)) == 1
    assert new.connections_accepted == 1


def test_a_broker_that_leaves_is_disconnected(fake_broker: Callable[..., FakeBroker],
                                              make_client: Callable[..., NetworkClient]) -> None:
    one = fake_broker(1, topics={TOPIC: 2})
    two = fake_broker(2, topics={TOPIC: 2})
    brokers = [(1, one.host, one.port), (2, two.host, two.port)]
    for broker in (one, two):
        broker.set_brokers(brokers)
        broker.set_leader(TOPIC, 1, 2)
    # A reconnect backoff long enough to see whether a disconnected node's state is kept.
    client = make_client(one, reconnect_backoff_ms=60_000, reconnect_backoff_max_ms=60_000)
    wait_ready(client, 1)
    wait_ready(client, 2)
    assert client.metadata.cluster.leader_for(TOPIC, 1).id == 2
    assert sorted(client.selector.channels()) == [1, 2]

    # Node 2 leaves with a request in flight.
    two.pause()
    request = init_producer_id(2, client.clock())
    responses = send_all(client, [request])
    for broker in (one, two):
        broker.set_brokers(brokers[:1])
        broker.set_leader(TOPIC, 1, 1)
    client.metadata.request_update()
    run_until(client, lambda: 2 not in client.metadata.cluster.nodes, responses)
    (response,) = answers(client, [request], responses)
    assert response.disconnected
    assert client.selector.channels() == [1]
    # Forgotten, not backing off: were it to come back, it would be connected to at once.
    assert client.connection_delay(2, client.clock()) == 0
    assert client.metadata.cluster.leader_for(TOPIC, 1).id == 1
    two.resume()
    run_until(client, lambda: two.open_connections == 0)


def test_a_broker_never_connected_to_leaves_quietly(fake_broker: Callable[..., FakeBroker],
                                                   make_client: Callable[..., NetworkClient],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    one = fake_broker(1, topics={TOPIC: 1})
    two = fake_broker(2)
    brokers = [(1, one.host, one.port), (2, two.host, two.port)]
    one.set_brokers(brokers)
    client = make_client(one)
    wait_ready(client, 1)
    assert 2 in client.metadata.cluster.nodes and two.connections_accepted == 0

    one.set_brokers(brokers[:1])
    client.metadata.request_update()
    with caplog.at_level(logging.INFO, logger="service.network.client"):
        run_until(client, lambda: 2 not in client.metadata.cluster.nodes)
    # Nothing to close, so no warning of a failed connection and no extra refresh.
    assert [r.getMessage() for r in caplog.records if "node 2" in r.getMessage()] == []
    assert not client.metadata.update_requested
    assert client.is_ready(1, client.clock())


# -- the metadata refresh ------------------------------------------------------------------------


def test_metadata_is_refreshed_at_max_age_unasked(fake_broker: Callable[..., FakeBroker],
                                                  make_client: Callable[..., NetworkClient], clock: Clock) -> None:
    broker = fake_broker(1, topics={TOPIC: 1})
    client = make_client(broker, metadata_max_age_ms=60_000)
    wait_ready(client, 1)
    refreshes = len(broker.requests_of(m.METADATA))
    refreshed_at = client.metadata.last_successful_refresh_ms
    for _ in range(10):
        client.poll(5)
    assert len(broker.requests_of(m.METADATA)) == refreshes  # nothing asks for one, and it is not old

    clock.advance(60_000)
    run_until(client, lambda: len(broker.requests_of(m.METADATA)) == refreshes + 1)
    run_until(client, lambda: client.metadata.last_successful_refresh_ms >= refreshed_at + 60_000)
    assert not client.metadata.update_requested
    (_, request), = broker.requests_of(m.METADATA)[-1:]
    assert [t.name for t in request.topics] == [TOPIC]


def test_a_topic_added_while_a_refresh_is_out_gets_its_own_refresh_at_once(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 1, "new": 2})
    client = make_client(broker)  # metadata.max.age.ms 300 s: the clock is never moved that far
    wait_ready(client, 1)
    refreshes = len(broker.requests_of(m.METADATA))

    # A refresh goes out and is held ...
    broker.pause()
    client.metadata.request_update()
    run_until(client, lambda: client.in_flight_request_count(1) == 1)
    # ... while a client asks for a new topic, as the daemon's front does.
    client.metadata.add_topic("new", client.clock())
    client.metadata.request_update()
    broker.resume()

    # The held refresh is answered without the new topic; the next one asks for it without waiting max age.
    run_until(client, lambda: client.metadata.cluster.partition_count("new") == 2)
    held, following = (request for _, request in broker.requests_of(m.METADATA)[refreshes:])
    assert [t.name for t in held.topics] == [TOPIC]
    assert {t.name for t in following.topics} == {TOPIC, "new"}
    assert not client.metadata.update_requested
    for _ in range(10):
        client.poll(5)
    assert len(broker.requests_of(m.METADATA)) == refreshes + 2  # and nothing more


def test_a_callers_metadata_answer_does_not_change_the_clients_view(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    broker = fake_broker(1, topics={TOPIC: 2, "other": 1})
    client = make_client(broker)
    wait_ready(client, 1)
    version = client.metadata.update_version

    # A caller asks about another topic only, and gets its answer ...
    body = m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name="other")])
    request = ClientRequest(1, body, client.clock())
    (response,) = answers(client, [request], send_all(client, [request]))
    assert [t.name for t in response.body.topics] == ["other"]
    # ... which is not the client's refresh: the leaders of the topic it uses are still known.
    assert client.metadata.update_version == version
    assert client.metadata.cluster.partition_count(TOPIC) == 2
    assert client.metadata.cluster.leader_for(TOPIC, 1).id == 1
    assert client.metadata.cluster.partition_count("other") is None


def test_a_callers_metadata_answer_does_not_end_the_clients_refresh(
        fake_broker: Callable[..., FakeBroker], make_client: Callable[..., NetworkClient]) -> None:
    one = fake_broker(1, topics={TOPIC: 1})
    two = fake_broker(2, topics={TOPIC: 1})
    for broker in (one, two):
        broker.set_brokers([(1, one.host, one.port), (2, two.host, two.port)])
    client = make_client(one)
    wait_ready(client, 1)
    wait_ready(client, 2)

    def metadata_requests() -> int:
        return len(one.requests_of(m.METADATA)) + len(two.requests_of(m.METADATA))

    # The client's own refresh (of its topic) goes unanswered; a caller's (of no topic) is answered.
    for broker in (one, two):
        broker.set_handler(m.METADATA, lambda header, request, broker=broker: (
            None if request.topics else broker.default_response(header, request)))
    before, before_one = metadata_requests(), len(one.requests_of(m.METADATA))
    client.metadata.request_update()
    run_until(client, lambda: metadata_requests() == before + 1)
    refreshed = 1 if len(one.requests_of(m.METADATA)) > before_one else 2
    other = 3 - refreshed

    request = ClientRequest(other, m.MetadataRequest(topics=[]), client.clock())
    (response,) = answers(client, [request], send_all(client, [request]))
    assert response.body.topics == []
    # The refresh is still out: asked for another, the client waits for it rather than start a second.
    client.metadata.request_update()
    for _ in range(20):
        client.poll(5)
    assert metadata_requests() == before + 2
    assert client.in_flight_request_count(refreshed) == 1
    assert client.metadata.cluster.partition_count(TOPIC) == 1


# -- least loaded node ---------------------------------------------------------------------------


def test_least_loaded_node_has_the_fewest_in_flight(fake_broker: Callable[..., FakeBroker],
                                                    make_client: Callable[..., NetworkClient]) -> None:
    one = fake_broker(1)
    two = fake_broker(2)
    brokers = [(1, one.host, one.port), (2, two.host, two.port)]
    for broker in (one, two):
        broker.set_brokers(brokers)
        broker.add_topic(TOPIC, 1)
    client = make_client(one)
    wait_ready(client, 1)
    wait_ready(client, 2)
    one.pause()
    two.pause()

    send_all(client, [init_producer_id(1, client.clock()) for _ in range(2)])
    send_all(client, [init_producer_id(2, client.clock())])
    assert client.least_loaded_node(client.clock()).id == 2
    send_all(client, [init_producer_id(2, client.clock()) for _ in range(2)])
    assert client.least_loaded_node(client.clock()).id == 1

    # A node at its in-flight limit is never picked; with every node there, none is.
    send_all(client, [init_producer_id(1, client.clock()) for _ in range(3)])
    assert client.in_flight_request_count(1) == 5
    assert client.least_loaded_node(client.clock()).id == 2
    send_all(client, [init_producer_id(2, client.clock()) for _ in range(2)])
    assert client.least_loaded_node(client.clock()) is None


def test_least_loaded_node_without_connections(clock: Clock) -> None:
    metadata = Metadata(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    client = NetworkClient(Selector(), metadata, clock=clock, rng=random.Random(1))
    now = clock()
    # Nothing connected: any node that may be connected to.
    assert client.least_loaded_node(now).id in (-1, -2, -3)
    # A node already connecting beats one that is not.
    client.connection_states.connecting(-2, now)
    assert client.least_loaded_node(now).id == -2
    # Every node backing off: none.
    for node_id in (-1, -2, -3):
        client.connection_states.connecting(node_id, now)
        client.connection_states.disconnected(node_id, now)
    assert client.least_loaded_node(now) is None
    assert client.least_loaded_node(now + 10_000) is not None
