"""A scriptable Kafka broker on loopback that speaks the real wire protocol.

``FakeBroker`` decodes requests with the broker's half of the sidecar's codec (``tests.support.broker_codec``) and
answers with ``encode_response``, over real sockets served by one background
thread. By default it answers ApiVersions, Metadata, InitProducerId and Produce
the way a healthy one-broker cluster would (a Produce to a topic it does not have
gets UNKNOWN_TOPIC_OR_PARTITION; acks=0 gets no answer). ``pause()`` and
``resume()`` stop and restart reading, to hold requests in flight;
``close_connections()`` cuts every connection. :meth:`FakeBroker.set_handler`
replaces the answer to one API, for the faults a real broker will not produce on
demand::

    with FakeBroker(1, topics={"t": 2}) as broker:
        # Every Produce fails with MESSAGE_TOO_LARGE (10).
        broker.set_handler(PRODUCE, lambda header, request: produce_response(request, error_code=10))

A handler ``fn(header, request)`` runs in the broker's thread and returns:

- a response ``Message``: encoded at the request's version and correlation id;
- ``None``: no answer (the request stays unanswered forever);
- ``bytes``: written to the connection as they are, size prefix included (a wrong
  correlation id, an oversized frame ...);
- :data:`CLOSE`: no answer, and the connection is closed (once what was written
  before is sent);
- a list of the above, done in order: ``[response, CLOSE]`` answers, then closes.

Handlers may call the broker's methods (``default_response`` to delegate,
``set_brokers`` ...). An exception in a handler stops the broker; ``stop()``
raises it.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from service.protocol import messages as m
from service.protocol.api import APIS
from service.protocol.framing import FrameReader
from service.protocol.primitives import ProtocolError
from service.protocol.schema import Message
from tests.support.broker_codec import RequestHeader, decode_request, encode_response, peek_request_header

# The selector thread, wake-ups and frame splitting of the fault proxy serve here too.
from .proxy import _SelectorServer

CLOSE: Final = object()
"""A handler's answer that closes the connection instead of responding."""

UNSUPPORTED_VERSION = 35
UNKNOWN_TOPIC_OR_PARTITION = 3
PRODUCER_ID = 1000

Handler = Callable[[RequestHeader, Message], Any]

_RECORD_BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
_RECORD_COUNT = struct.Struct(">i")
_RECORD_COUNT_OFFSET = 57  # in a v2 record batch
_RECV_SIZE = 256 * 1024


def codec_api_versions() -> dict[int, tuple[int, int]]:
    """The version range of every API the sidecar's codec implements."""
    return {key: (api.min_version, api.max_version) for key, api in APIS.items()}


def produce_response(request: m.ProduceRequest, error_code: int = 0, *, base_offset: int = -1,
                     error_message: str | None = None, log_append_time_ms: int = -1) -> m.ProduceResponse:
    """A ProduceResponse giving every partition of ``request`` the same outcome
    (``log_append_time_ms``: the broker's append time, for a topic with LogAppendTime)."""
    topic_cls = m.ProduceResponse.TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    return m.ProduceResponse(responses=[
        topic_cls(name=topic.name, partition_responses=[
            partition_cls(index=p.index, error_code=error_code, base_offset=base_offset,
                          log_append_time_ms=log_append_time_ms,
                          log_start_offset=0 if base_offset >= 0 else -1, error_message=error_message)
            for p in topic.partition_data])
        for topic in request.topic_data])


def record_count(records: bytes) -> int:
    """Records in a record set of v2 batches (from their headers; nothing is decompressed)."""
    count = pos = 0
    while pos + _RECORD_COUNT_OFFSET + 4 <= len(records):
        _, batch_length = _RECORD_BATCH_PREFIX.unpack_from(records, pos)
        count += _RECORD_COUNT.unpack_from(records, pos + _RECORD_COUNT_OFFSET)[0]
        pos += 12 + batch_length
    return count


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    frames: FrameReader = field(default_factory=FrameReader)
    outbuf: bytearray = field(default_factory=bytearray)
    closing: bool = False  # read nothing more; close once outbuf is sent


class FakeBroker(_SelectorServer):
    """Broker ``node_id`` of a scriptable cluster, listening on 127.0.0.1 (a free port).

    ``topics`` maps topic name -> partition count; every partition is led by this
    broker (leader epoch 0) unless :meth:`set_leader` says otherwise. ``api_versions``
    maps api key -> (min, max) advertised; the default is what the codec implements.

    Records: ``requests`` (every decoded request, as (header, body)), ``batches``
    (the raw record sets of every Produce answered by default, per (topic, partition)),
    ``connections_accepted`` and ``open_connections``. All methods are thread-safe.
    """

    def __init__(self, node_id: int = 1, *, topics: dict[str, int] | None = None,
                 api_versions: dict[int, tuple[int, int]] | None = None, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        # Reentrant: handlers run in the loop thread with the lock held and may call our methods.
        self._lock = threading.RLock()  # type: ignore[assignment]
        self.node_id = node_id
        self.api_versions = dict(codec_api_versions() if api_versions is None else api_versions)
        self._topics = dict(topics or {})
        self._leaders: dict[tuple[str, int], tuple[int, int]] = {}
        self._brokers: list[tuple[int, str, int]] | None = None
        self._handlers: dict[int, Handler] = {}
        self._connections: dict[socket.socket, _Connection] = {}
        self._paused = False
        self._requests: list[tuple[RequestHeader, Message]] = []
        self._batches: dict[tuple[str, int], list[bytes]] = {}
        self._next_offsets: dict[tuple[str, int], int] = {}

    # -- scripting ---------------------------------------------------------------------------------

    def set_handler(self, api_key: int, handler: Handler | None) -> None:
        """Answer ``api_key`` requests with ``handler`` (see the module doc); None: the default."""
        with self._lock:
            if handler is None:
                self._handlers.pop(api_key, None)
            else:
                self._handlers[api_key] = handler

    def set_brokers(self, brokers: list[tuple[int, str, int]] | None) -> None:
        """The brokers Metadata lists, as (node_id, host, port); None: this broker alone."""
        with self._lock:
            self._brokers = None if brokers is None else list(brokers)

    def add_topic(self, name: str, partitions: int) -> None:
        with self._lock:
            self._topics[name] = partitions

    def set_leader(self, topic: str, partition: int, node_id: int, leader_epoch: int | None = None) -> None:
        """Make ``node_id`` the leader Metadata names; the epoch goes up by one unless given."""
        with self._lock:
            _, epoch = self._leaders.get((topic, partition), (self.node_id, 0))
            self._leaders[(topic, partition)] = (node_id, epoch + 1 if leader_epoch is None else leader_epoch)

    def pause(self) -> None:
        """Stop reading from connections: requests wait in the socket buffers, unanswered."""
        with self._lock:
            self._paused = True
        self._in_loop(self._update_all)

    def resume(self) -> None:
        """Read and answer again, starting with what waited while paused."""
        with self._lock:
            self._paused = False
        self._in_loop(self._update_all)

    def close_connections(self) -> None:
        """Close every open connection (new ones are accepted as usual)."""
        self._in_loop(self._close_all)

    # -- what happened -----------------------------------------------------------------------------

    @property
    def requests(self) -> list[tuple[RequestHeader, Message]]:
        """Every request decoded since start, oldest first."""
        with self._lock:
            return list(self._requests)

    def requests_of(self, api_key: int) -> list[tuple[RequestHeader, Message]]:
        return [(h, r) for h, r in self.requests if h.api_key == api_key]

    @property
    def batches(self) -> dict[tuple[str, int], list[bytes]]:
        """Raw record sets of the Produce requests answered by default, per (topic, partition).

        ``tests.support.record_batches.decode_batches`` reads them (and checks CRCs).
        """
        with self._lock:
            return {tp: list(sets) for tp, sets in self._batches.items()}

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # -- default answers ---------------------------------------------------------------------------

    def default_response(self, header: RequestHeader, request: Message) -> Any:
        """The answer of a healthy broker (what handlers may delegate to)."""
        with self._lock:
            if header.api_key == m.API_VERSIONS:
                return self._api_versions_response()
            if header.api_key == m.METADATA:
                return self._metadata_response(request)
            if header.api_key == m.INIT_PRODUCER_ID:
                return self._init_producer_id_response(request)
            if header.api_key == m.PRODUCE:
                return self._produce_response(request)
            return CLOSE  # an API a broker would not take before authentication

    def _api_versions_response(self, error_code: int = 0) -> m.ApiVersionsResponse:
        version_cls = m.ApiVersionsResponse.ApiVersion
        return m.ApiVersionsResponse(error_code=error_code, api_keys=[
            version_cls(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(self.api_versions.items())])

    def _metadata_response(self, request: m.MetadataRequest) -> m.MetadataResponse:
        r = m.MetadataResponse
        brokers = self._brokers if self._brokers is not None else [(self.node_id, self.host, self.port)]
        names = sorted(self._topics) if request.topics is None else [t.name for t in request.topics]
        topics = []
        for name in names:
            if name not in self._topics:
                topics.append(r.MetadataResponseTopic(error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name))
                continue
            partitions = []
            for index in range(self._topics[name]):
                leader, epoch = self._leaders.get((name, index), (self.node_id, 0))
                replicas = [leader] if leader >= 0 else []
                partitions.append(r.MetadataResponseTopic.MetadataResponsePartition(
                    partition_index=index, leader_id=leader, leader_epoch=epoch,
                    replica_nodes=replicas, isr_nodes=replicas))
            topics.append(r.MetadataResponseTopic(name=name, partitions=partitions))
        return r(brokers=[r.MetadataResponseBroker(node_id=i, host=h, port=p) for i, h, p in brokers],
                 cluster_id="fake-cluster", controller_id=brokers[0][0] if brokers else -1, topics=topics)

    def _init_producer_id_response(self, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        # A producer that gives its id back (v3+) gets its epoch bumped, as from Kafka.
        epoch = request.producer_epoch + 1 if request.producer_id == PRODUCER_ID else 0
        return m.InitProducerIdResponse(producer_id=PRODUCER_ID, producer_epoch=epoch)

    def _produce_response(self, request: m.ProduceRequest) -> m.ProduceResponse | None:
        r = m.ProduceResponse.TopicProduceResponse
        responses = []
        for topic in request.topic_data:
            partitions = []
            for p in topic.partition_data:
                tp = (topic.name, p.index)
                if topic.name not in self._topics or not 0 <= p.index < self._topics[topic.name]:
                    partitions.append(r.PartitionProduceResponse(
                        index=p.index, error_code=UNKNOWN_TOPIC_OR_PARTITION, base_offset=-1))
                    continue
                records = bytes(p.records or b"")
                base_offset = self._next_offsets.get(tp, 0)
                self._next_offsets[tp] = base_offset + record_count(records)
                self._batches.setdefault(tp, []).append(records)
                partitions.append(r.PartitionProduceResponse(index=p.index, base_offset=base_offset,
                                                             log_start_offset=0))
            responses.append(r(name=topic.name, partition_responses=partitions))
        # Kafka does not answer acks=0.
        return m.ProduceResponse(responses=responses) if request.acks != 0 else None

    # -- the loop thread, with _lock held ----------------------------------------------------------

    def _in_loop(self, function: Callable[[], None]) -> None:
        if threading.current_thread() is self._thread:
            function()  # from a handler: already in the loop
        else:
            self._call_in_loop(function)

    def _on_accept(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(sock)
        self._connections[sock] = connection
        self._update_interest(connection)

    def _on_event(self, connection: _Connection, mask: int) -> None:
        if connection.sock not in self._connections:
            return  # closed earlier in this batch of events
        try:
            if mask & selectors.EVENT_READ and not self._paused and not connection.closing:
                data = connection.sock.recv(_RECV_SIZE)
                if not data:
                    raise ConnectionError("closed by the client")
                for frame in connection.frames.feed(data):
                    self._handle(connection, frame)
                    if connection.closing:
                        break
            if connection.outbuf:
                sent = connection.sock.send(connection.outbuf)
                del connection.outbuf[:sent]
        except BlockingIOError:
            pass
        except (OSError, ProtocolError):
            self._close(connection)
            return
        if connection.closing and not connection.outbuf:
            self._close(connection)
        else:
            self._update_interest(connection)

    def _handle(self, connection: _Connection, frame: bytes) -> None:
        """Answer one request."""
        api_key, version, correlation_id = peek_request_header(frame)
        advertised = self.api_versions.get(api_key)
        decoded: tuple[RequestHeader, Message] | None = None
        try:
            decoded = decode_request(frame)
        except ProtocolError:
            pass  # a version beyond the codec's
        else:
            self._requests.append(decoded)
        if api_key == m.API_VERSIONS and (advertised is None or version > advertised[1]):
            # Kafka answers an ApiVersions version it does not know in v0, with its ranges.
            connection.outbuf += encode_response(self._api_versions_response(UNSUPPORTED_VERSION), 0,
                                                 correlation_id)
            return
        if decoded is None or advertised is None or not advertised[0] <= version <= advertised[1]:
            connection.closing = True  # as Kafka does with a version it does not support
            return
        answer = self._handlers.get(api_key, self.default_response)(*decoded)
        for item in answer if isinstance(answer, list) else [answer]:
            if item is CLOSE:
                connection.closing = True
                return
            if isinstance(item, (bytes, bytearray)):
                connection.outbuf += item
            elif item is not None:
                connection.outbuf += encode_response(item, version, correlation_id)

    def _update_interest(self, connection: _Connection) -> None:
        reading = not self._paused and not connection.closing
        events = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if connection.outbuf else 0)
        self._watch(connection.sock, events, partial(self._on_event, connection))

    def _update_all(self) -> None:
        for connection in self._connections.values():
            self._update_interest(connection)

    def _close(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        self._forget(connection.sock)

    def _close_all(self) -> None:
        for connection in list(self._connections.values()):
            self._close(connection)
