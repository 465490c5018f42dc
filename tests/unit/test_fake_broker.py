"""FakeBroker itself, driven over a plain blocking socket (no NetworkClient involved)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator

import pytest

from client_stub.fastpath import encode_record
from service.protocol import messages as m
from service.protocol.api import APIS, decode_response, encode_request
from service.protocol.schema import Message
from tests.support.fake_broker import CLOSE, FakeBroker, produce_response, record_count
from tests.support.record_batches import build_batch, decode_batches
from tests.support.waiting import HANG_S

MESSAGE_TOO_LARGE = 10


class Connection:
    """One blocking connection to a broker that sends requests and reads responses."""

    def __init__(self, broker: FakeBroker) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=HANG_S)
        self.correlation_id = 0

    def send(self, body: Message, version: int | None = None) -> int:
        self.correlation_id += 1
        version = APIS[body.API_KEY].max_version if version is None else version
        self.sock.sendall(b"".join(bytes(b) for b in encode_request(body, version, self.correlation_id, "t")))
        return self.correlation_id

    def frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def call(self, body: Message, version: int | None = None) -> Message:
        version = APIS[body.API_KEY].max_version if version is None else version
        correlation_id = self.send(body, version)
        frame = self.frame()
        assert struct.unpack_from(">i", frame)[0] == correlation_id
        return decode_response(frame, body.API_KEY, version)

    def closed(self) -> bool:
        return self.sock.recv(1) == b""

    def _exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return bytes(data)


@pytest.fixture
def connect() -> Iterator[Callable[[FakeBroker], Connection]]:
    connections: list[Connection] = []

    def make(broker: FakeBroker) -> Connection:
        connections.append(Connection(broker))
        return connections[-1]

    yield make
    for connection in connections:
        connection.sock.close()


def produce(topic: str, partition: int, values: list[bytes], acks: int = -1) -> m.ProduceRequest:
    records = b"".join(encode_record(i, 0, None, v) for i, v in enumerate(values))
    batch = b"".join(bytes(b) for b in build_batch(records, record_count=len(values), last_offset_delta=len(values) - 1,
                                                   base_timestamp=1, max_timestamp=1))
    r = m.ProduceRequest
    return r(acks=acks, timeout_ms=1000, topic_data=[r.TopicProduceData(name=topic, partition_data=[
        r.TopicProduceData.PartitionProduceData(index=partition, records=batch)])])


def test_default_answers(fake_broker: Callable[..., FakeBroker], connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker(7, topics={"t": 2})
    conn = connect(broker)

    versions = conn.call(m.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys} == broker.api_versions

    metadata = conn.call(m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=n) for n in "tx"]))
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(7, broker.host, broker.port)]
    t, x = metadata.topics
    assert [(p.partition_index, p.leader_id, p.leader_epoch) for p in t.partitions] == [(0, 7, 0), (1, 7, 0)]
    assert x.error_code == 3

    assert conn.call(m.InitProducerIdRequest(transaction_timeout_ms=1)).producer_id == 1000
    bumped = conn.call(m.InitProducerIdRequest(transaction_timeout_ms=1, producer_id=1000, producer_epoch=0))
    assert (bumped.producer_id, bumped.producer_epoch) == (1000, 1)

    offsets = [conn.call(produce("t", 1, [b"a", b"b", b"c"])).responses[0].partition_responses[0].base_offset
               for _ in range(2)]
    assert offsets == [0, 3]
    unknown = conn.call(produce("nope", 0, [b"a"])).responses[0].partition_responses[0]
    assert unknown.error_code == 3
    (first, second) = broker.batches[("t", 1)]
    assert [r.value for r in decode_batches(first)[0].records] == [b"a", b"b", b"c"]
    assert record_count(first + second) == 6
    assert [h.api_key for h, _ in broker.requests] == [18, 3, 22, 22, 0, 0, 0]
    assert broker.connections_accepted == 1 and broker.open_connections == 1


def test_acks_0_gets_no_answer(fake_broker: Callable[..., FakeBroker],
                               connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker(topics={"t": 1})
    conn = connect(broker)
    conn.send(produce("t", 0, [b"a"], acks=0))
    assert conn.call(m.InitProducerIdRequest(transaction_timeout_ms=1)).producer_id == 1000
    assert len(broker.batches[("t", 0)]) == 1


def test_unknown_api_versions_version_is_answered_in_v0(fake_broker: Callable[..., FakeBroker],
                                                        connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker(api_versions={m.API_VERSIONS: (0, 2), m.METADATA: (0, 12)})
    conn = connect(broker)
    correlation_id = conn.send(m.ApiVersionsRequest(), 4)
    frame = conn.frame()
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    answer = decode_response(frame, m.API_VERSIONS, 0)
    assert answer.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys} == broker.api_versions


def test_an_unadvertised_version_closes_the_connection(fake_broker: Callable[..., FakeBroker],
                                                       connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker(api_versions={m.API_VERSIONS: (0, 4), m.INIT_PRODUCER_ID: (0, 1)})
    conn = connect(broker)
    conn.send(m.InitProducerIdRequest(transaction_timeout_ms=1), 2)
    assert conn.closed()


def test_handlers_script_the_answers(fake_broker: Callable[..., FakeBroker],
                                    connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker(topics={"t": 1})
    answers = iter([produce_response, lambda request: None, lambda request: b"\0\0\0\1x",
                    lambda request: [broker.default_response(*broker.requests[-1]), CLOSE]])

    def handler(header, request):
        script = next(answers)
        if script is produce_response:
            return produce_response(request, MESSAGE_TOO_LARGE, error_message="too big")
        return script(request)

    broker.set_handler(m.PRODUCE, handler)
    conn = connect(broker)
    failed = conn.call(produce("t", 0, [b"a"])).responses[0].partition_responses[0]
    assert (failed.error_code, failed.base_offset, failed.error_message) == (MESSAGE_TOO_LARGE, -1, "too big")
    assert ("t", 0) not in broker.batches

    conn.send(produce("t", 0, [b"b"]))  # unanswered
    conn.send(produce("t", 0, [b"c"]))  # raw bytes
    assert conn.frame() == b"x"
    last = conn.call(produce("t", 0, [b"d"]))  # answered, then closed
    assert last.responses[0].partition_responses[0].error_code == 0
    assert conn.closed()

    broker.set_handler(m.PRODUCE, None)  # the default again
    conn = connect(broker)
    assert conn.call(produce("t", 0, [b"e"])).responses[0].partition_responses[0].base_offset == 1


def test_pause_holds_requests_until_resume(fake_broker: Callable[..., FakeBroker],
                                           connect: Callable[[FakeBroker], Connection]) -> None:
    broker = fake_broker()
    conn = connect(broker)
    conn.call(m.ApiVersionsRequest())  # connected and served
    broker.pause()
    conn.send(m.InitProducerIdRequest(transaction_timeout_ms=1))
    conn.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        conn.frame()
    assert len(broker.requests) == 1
    broker.resume()
    conn.sock.settimeout(5)
    assert conn.frame()
    broker.close_connections()
    assert conn.closed()
