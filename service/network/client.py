"""NetworkClient: requests to Kafka nodes over the Selector, as the Java client's NetworkClient.

It owns the connection life cycle (connect, ApiVersions negotiation, ready,
reconnect backoff), the in-flight requests of each connection with their
correlation ids and timeouts, and the metadata refresh. Callers ask
:meth:`NetworkClient.ready` for a node, :meth:`NetworkClient.send` requests to
ready nodes and drive everything with :meth:`NetworkClient.poll`, which returns
the responses that completed (or failed: disconnected, timed out, unsupported).
"""

from __future__ import annotations

import importlib.metadata
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from client_stub.errors import (
    ERRORS_BY_NAME,
    AuthenticationError,
    KafkaError,
    NetworkError,
    UnsupportedError,
    error_code,
)

from ..protocol import messages as m
from ..protocol.api import APIS, decode_response, encode_request, peek_correlation_id
from ..protocol.primitives import INT16, ProtocolError
from ..protocol.schema import Message
from .connection_states import ClusterConnectionStates, ConnectionState
from .in_flight import InFlightRequests
from .metadata import Metadata, Node
from .sasl import SaslCredentials, SaslExchange
from .selector import Selector

log = logging.getLogger(__name__)

UNSUPPORTED_VERSION = ERRORS_BY_NAME["UNSUPPORTED_VERSION"].code

# How many unanswered (acks=0) correlation ids to remember per node.
_UNANSWERED_KEPT = 1024

SOFTWARE_NAME = "kafka-sidecar"


def software_version() -> str:
    """The installed kafka-sidecar's version, for ApiVersions; "unknown" (as Java's) from an uninstalled tree."""
    try:
        return importlib.metadata.version(SOFTWARE_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


SOFTWARE_VERSION = software_version()


def monotonic_ms() -> int:
    """The loop's clock: milliseconds that only move forward."""
    return time.monotonic_ns() // 1_000_000


@dataclass(eq=False, slots=True)
class ClientRequest:
    """A request for one node. ``version`` and ``correlation_id`` are set when it is sent.

    ``request_timeout_ms`` below 0 means the client's ``request.timeout.ms``.
    """

    destination: int
    body: Message
    created_ms: int
    callback: Callable[[ClientResponse], None] | None = None
    expect_response: bool = True
    request_timeout_ms: int = -1
    max_version: int | None = None
    version: int = -1
    correlation_id: int = -1
    send_ms: int = -1
    size: int = 0

    @property
    def api_key(self) -> int:
        return self.body.API_KEY


@dataclass(eq=False, slots=True)
class ClientResponse:
    """The outcome of a request: a body, or why there is none."""

    request: ClientRequest
    received_ms: int
    body: Message | None = None
    disconnected: bool = False
    timed_out: bool = False
    error: KafkaError | None = None

    @property
    def destination(self) -> int:
        return self.request.destination

    @property
    def latency_ms(self) -> int:
        return self.received_ms - self.request.send_ms if self.request.send_ms >= 0 else 0


@dataclass(slots=True)
class NodeApiVersions:
    """The version range a node supports per API, as its ApiVersions response said."""

    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)

    def latest_usable_version(self, api_key: int, max_version: int | None = None) -> int:
        """Highest version both sides support; UnsupportedError naming the API if none."""
        api = APIS[api_key]
        ours_max = api.max_version if max_version is None else min(api.max_version, max_version)
        theirs = self.ranges.get(api_key)
        if theirs is None:
            raise UnsupportedError(f"the broker does not support the {api.name} API")
        low, high = max(api.min_version, theirs[0]), min(ours_max, theirs[1])
        if low > high:
            raise UnsupportedError(
                f"the broker supports {api.name} v{theirs[0]}-v{theirs[1]}, "
                f"kafka-sidecar speaks v{api.min_version}-v{ours_max}: no common version",
                code=35, name="UNSUPPORTED_VERSION")
        return high


class NetworkClient:
    """Connections, requests and metadata for every node of one cluster."""

    def __init__(self, selector: Selector, metadata: Metadata, *, client_id: str = "kafka-sidecar",
                 max_in_flight_requests_per_connection: int = 5, request_timeout_ms: int = 30000,
                 reconnect_backoff_ms: int = 50, reconnect_backoff_max_ms: int = 1000,
                 connection_setup_timeout_ms: int = 10000, sasl: SaslCredentials | None = None,
                 clock: Callable[[], int] = monotonic_ms, rng: random.Random | None = None) -> None:
        self.selector = selector
        self.metadata = metadata
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.reconnect_backoff_ms = reconnect_backoff_ms
        self.clock = clock
        self.in_flight: InFlightRequests[ClientRequest] = InFlightRequests(max_in_flight_requests_per_connection)
        self.connection_states = ClusterConnectionStates(reconnect_backoff_ms, reconnect_backoff_max_ms,
                                                         connection_setup_timeout_ms, rng)
        self._rng = rng or random.Random()
        self._api_versions: dict[int, NodeApiVersions] = {}
        self._correlation_id = 0
        # The client's own metadata refresh while it is out: only its answer updates the metadata.
        self._metadata_request: ClientRequest | None = None
        # The metadata's request version that refresh was built at.
        self._metadata_request_version = 0
        self._pending: list[ClientResponse] = []
        # Correlation ids of recent requests sent without expecting a response, per node.
        self._unanswered: dict[int, deque[int]] = {}
        # Failures seen by the last poll, for callers that want to know why a node went away.
        self.disconnect_reasons: dict[int, str] = {}
        # SASL (security.protocol SASL_*): the credentials, each connection's exchange under way, and when
        # each connection authenticates again (its broker's session lifetime, KIP-368).
        self.sasl = sasl
        self._sasl_exchanges: dict[int, SaslExchange] = {}
        self._reauthenticate_at: dict[int, int] = {}
        # Nodes whose broker refused the daemon's credentials or certificate, why, until one gets through; and
        # what was logged of each (an error is logged once, not at every reconnect).
        self.authentication_errors: dict[int, AuthenticationError] = {}
        self._authentication_logged: dict[int, str] = {}

    # -- readiness -------------------------------------------------------------------------------

    def ready(self, node: Node, now: int) -> bool:
        """True if a request may be sent to ``node`` now; else start connecting if allowed."""
        if self.is_ready(node.id, now):
            return True
        if self.connection_states.can_connect(node.id, now):
            self._initiate_connect(node, now)
        return False

    def is_ready(self, node_id: int, now: int) -> bool:
        # While metadata is due, hold other requests so the refresh goes out first.
        return not self._metadata_update_due(now) and self.can_send_request(node_id)

    def can_send_request(self, node_id: int) -> bool:
        return (self.connection_states.is_ready(node_id)
                and self.selector.is_connected(node_id)
                and not self.selector.has_pending_send(node_id)
                and self.in_flight.can_send_more(node_id))

    def connection_delay(self, node_id: int, now: int) -> int:
        return self.connection_states.connection_delay(node_id, now)

    def is_connecting(self, node_id: int) -> bool:
        return self.connection_states.state(node_id) in (
            ConnectionState.CONNECTING, ConnectionState.AUTHENTICATING, ConnectionState.CHECKING_API_VERSIONS)

    def in_flight_request_count(self, node_id: int | None = None) -> int:
        return self.in_flight.count(node_id)

    def least_loaded_node(self, now: int) -> Node | None:
        """The node with the fewest requests in flight, for requests any node can answer.

        A ready node wins; then one already connecting; then one that may be
        connected to now. None when every node is backing off.
        """
        nodes = list(self.metadata.cluster.nodes.values())
        if not nodes:
            return None
        offset = self._rng.randrange(len(nodes))
        best, best_in_flight = None, None
        connecting = can_connect = None
        for i in range(len(nodes)):
            node = nodes[(offset + i) % len(nodes)]
            in_flight = self.in_flight.count(node.id)
            if self.can_send_request(node.id):
                if in_flight == 0:
                    return node
                if best_in_flight is None or in_flight < best_in_flight:
                    best, best_in_flight = node, in_flight
            elif self.is_connecting(node.id):
                connecting = connecting or node
            elif self.connection_states.can_connect(node.id, now):
                can_connect = can_connect or node
        return best or connecting or can_connect

    # -- connections -----------------------------------------------------------------------------

    def _initiate_connect(self, node: Node, now: int) -> None:
        self.connection_states.connecting(node.id, now)
        try:
            self.selector.connect(node.id, node.host, node.port)
        except OSError as exc:
            log.warning("connection to node %s (%s:%s) failed: %s", node.id, node.host, node.port, exc)
            self.connection_states.disconnected(node.id, now)
            self.disconnect_reasons[node.id] = str(exc)
            self.metadata.request_update()

    def close(self, node_id: int) -> None:
        """Close the connection to ``node_id``; what was in flight completes as disconnected."""
        self.selector.close(node_id)
        self._handle_disconnect(node_id, self.clock(), "closed by the client")

    def close_all(self, linger_ms: int = 0) -> None:
        """Close every connection, after letting the brokers read what was written (see Selector.close_all).

        What was in flight completes as disconnected, its callbacks run now: there may be no
        next poll, and the callers may hold buffers until their requests are over.
        """
        nodes = self.selector.channels()
        self.selector.close_all(linger_ms)
        now = self.clock()
        responses, self._pending = self._pending, []
        for node_id in nodes:
            self._handle_disconnect(node_id, now, "closed by the client", responses)
        self._run_callbacks(responses)

    # -- sending ---------------------------------------------------------------------------------

    def send(self, request: ClientRequest, now: int) -> None:
        """Send ``request`` to its node, which must be ready (see :meth:`ready`)."""
        if not self.can_send_request(request.destination):
            raise RuntimeError(f"node {request.destination} is not ready for a request")
        self._do_send(request, now)

    def _do_send(self, request: ClientRequest, now: int, version: int | None = None) -> None:
        node_id = request.destination
        if version is None:
            try:
                version = self._api_versions[node_id].latest_usable_version(request.api_key,
                                                                            request.max_version)
            except UnsupportedError as exc:
                log.error("cannot send %s to node %s: %s", APIS[request.api_key].name, node_id, exc)
                if request is self._metadata_request:
                    self._metadata_refresh_failed(now)
                self._pending.append(ClientResponse(request, now, error=exc))
                return
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        if request.request_timeout_ms < 0:
            request.request_timeout_ms = self.request_timeout_ms
        request.version = version
        request.correlation_id = self._correlation_id
        request.send_ms = now
        buffers = encode_request(request.body, version, request.correlation_id, self.client_id)
        request.size = sum(len(b) if not isinstance(b, memoryview) else b.nbytes for b in buffers)
        self.selector.send(node_id, buffers, tag=request, wakes=not request.expect_response)
        self.in_flight.add(request)

    # -- the poll --------------------------------------------------------------------------------

    def wakeup(self) -> None:
        """End the current or next poll() at once; safe from any thread (Java's NetworkClient.wakeup())."""
        self.selector.wakeup()

    def poll(self, timeout_ms: int, now: int | None = None) -> list[ClientResponse]:
        """Do network I/O for up to ``timeout_ms`` and return the completed responses."""
        now = self.clock() if now is None else now
        self.disconnect_reasons = {}
        if self._pending:
            timeout_ms = 0
        metadata_timeout = self._maybe_update_metadata(now)
        reauthentication_timeout = self._maybe_reauthenticate(now) if self._reauthenticate_at else timeout_ms
        self.selector.poll(min(timeout_ms, metadata_timeout, self.request_timeout_ms, reauthentication_timeout))
        now = self.clock()
        responses, self._pending = self._pending, []
        self._handle_completed_sends(responses, now)
        self._handle_completed_receives(responses, now)
        self._handle_disconnections(responses, now)
        self._handle_connections(now)
        self._handle_timed_out_requests(responses, now)
        self._handle_connection_setup_timeouts(now)
        if not self.metadata.cluster.is_bootstrap:
            self._close_bootstrap_connections()
        self._run_callbacks(responses)
        return responses

    @staticmethod
    def _run_callbacks(responses: list[ClientResponse]) -> None:
        for response in responses:
            callback = response.request.callback
            if callback is not None:
                try:
                    callback(response)
                except Exception:
                    log.exception("error in the callback of a %s response", APIS[response.request.api_key].name)

    def _handle_completed_sends(self, responses: list[ClientResponse], now: int) -> None:
        for node_id, request in self.selector.completed_sends:
            if not request.expect_response:
                self.in_flight.complete_last(node_id)
                self._unanswered.setdefault(node_id, deque(maxlen=_UNANSWERED_KEPT)).append(
                    request.correlation_id)
                responses.append(ClientResponse(request, now))

    def _handle_completed_receives(self, responses: list[ClientResponse], now: int) -> None:
        for node_id, frame in self.selector.completed_receives:
            # A connection the broker closed right after answering still delivers its answers.
            if node_id in self.disconnect_reasons:
                continue  # disconnected earlier in this poll: its requests have already failed
            if self._is_unexpected_answer(node_id, frame):
                continue
            request = self.in_flight.oldest(node_id)
            try:
                if request is None:
                    raise ProtocolError("a response arrived with no request in flight")
                correlation_id = peek_correlation_id(frame)
                if correlation_id != request.correlation_id:
                    raise ProtocolError(f"correlation id {correlation_id} of the response does not match "
                                        f"{request.correlation_id} of the request")
                body = self._decode(frame, request)
            except ProtocolError as exc:
                log.error("closing the connection to node %s: %s", node_id, exc)
                self.selector.close(node_id)
                self._handle_disconnect(node_id, now, str(exc), responses)
                continue
            self.in_flight.complete_next(node_id)
            if request.api_key == m.API_VERSIONS and self.connection_states.state(node_id) \
                    is ConnectionState.CHECKING_API_VERSIONS:
                self._handle_api_versions(node_id, request, body, now)
                continue
            if request is self._metadata_request:
                self._handle_metadata(body, now)
            responses.append(ClientResponse(request, now, body))

    def _is_unexpected_answer(self, node_id: int, frame: bytes) -> bool:
        """A response to a request that expects none (acks=0), which some brokers send anyway."""
        unanswered = self._unanswered.get(node_id)
        if not unanswered or len(frame) < 4:
            return False
        correlation_id = peek_correlation_id(frame)
        if correlation_id not in unanswered:
            return False
        log.debug("node %s answered request %s, sent with acks=0: ignored", node_id, correlation_id)
        unanswered.remove(correlation_id)
        return True

    def _decode(self, frame: bytes, request: ClientRequest) -> Message:
        try:
            return decode_response(frame, request.api_key, request.version)
        except ProtocolError:
            if request.api_key != m.API_VERSIONS or request.version == 0:
                # Trailing bytes after a complete body are ignored, as the Java client does
                # (librdkafka's mock cluster writes one too many after Metadata v9+).
                return decode_response(frame, request.api_key, request.version, strict=False)
        # A broker that does not know the ApiVersions version asked for answers in v0 ...
        try:
            return decode_response(frame, request.api_key, 0)
        except ProtocolError:
            # ... or, like librdkafka's mock cluster, in a form neither version reads. Its
            # error code, the body's first field, still says to try an older version.
            if len(frame) >= 6 and INT16.unpack_from(frame, 4)[0] == UNSUPPORTED_VERSION:
                return m.ApiVersionsResponse(error_code=UNSUPPORTED_VERSION)
            raise

    def _handle_disconnections(self, responses: list[ClientResponse], now: int) -> None:
        for node_id, reason in self.selector.disconnected.items():
            if node_id not in self.disconnect_reasons:  # else failed already, on one of its answers
                self._handle_disconnect(node_id, now, reason, responses)
            error = self.selector.authentication_failures.get(node_id)
            if error is not None:
                self._record_authentication_failure(node_id, error)

    def _handle_disconnect(self, node_id: int, now: int, reason: str,
                           responses: list[ClientResponse] | None = None, timed_out: bool = False) -> None:
        state = self.connection_states.state(node_id)
        self.connection_states.disconnected(node_id, now)
        self._forget_connection(node_id)
        self.disconnect_reasons[node_id] = reason
        if state is not ConnectionState.READY:
            log.warning("connection to node %s failed (%s): %s", node_id, state.value, reason)
        out = self._pending if responses is None else responses
        for request in self.in_flight.clear_all(node_id):
            if request is self._metadata_request:
                self._metadata_refresh_failed(now)
            error = NetworkError(f"disconnected from node {node_id}: {reason}",
                                 code=13, name="NETWORK_EXCEPTION")
            out.append(ClientResponse(request, now, disconnected=True, timed_out=timed_out, error=error))
        self.metadata.request_update()

    def _handle_connections(self, now: int) -> None:
        for node_id in self.selector.connected:
            log.debug("connected to node %s, checking api versions", node_id)
            self.connection_states.checking_api_versions(node_id)
            self._send_api_versions(node_id, now, m.ApiVersionsRequest.max_version())

    def _send_api_versions(self, node_id: int, now: int, version: int) -> None:
        body = m.ApiVersionsRequest(client_software_name=SOFTWARE_NAME,
                                    client_software_version=SOFTWARE_VERSION)
        self._do_send(ClientRequest(node_id, body, now), now, version)

    def _handle_api_versions(self, node_id: int, request: ClientRequest, body: m.ApiVersionsResponse,
                             now: int) -> None:
        ranges = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        if body.error_code == UNSUPPORTED_VERSION and request.version > 0:
            if not self.selector.is_connected(node_id):
                return  # the broker closed the connection after answering: handled as a disconnect
            theirs = ranges.get(m.API_VERSIONS)
            version = request.version - 1 if theirs is None else min(theirs[1], request.version - 1)
            self._send_api_versions(node_id, now, version)
            return
        if body.error_code:
            reason = f"ApiVersions failed: {error_code(body.error_code).name}"
            self.selector.close(node_id)
            self._handle_disconnect(node_id, now, reason)
            return
        self._api_versions[node_id] = NodeApiVersions(ranges)
        if self.sasl is None:
            self._ready(node_id)
        else:
            self._authenticate(node_id, now)

    def _ready(self, node_id: int) -> None:
        self.connection_states.ready(node_id)
        if self.authentication_errors.pop(node_id, None) is not None:
            log.info("node %s accepts the daemon again", node_id)
        self._authentication_logged.pop(node_id, None)
        log.debug("node %s ready", node_id)

    # -- SASL ------------------------------------------------------------------------------------

    def _authenticate(self, node_id: int, now: int) -> None:
        """SaslHandshake then SaslAuthenticate, before any other request (but ApiVersions) on the connection."""
        assert self.sasl is not None
        versions = self._api_versions[node_id]
        try:
            if versions.latest_usable_version(m.SASL_HANDSHAKE) < 1:
                raise UnsupportedError("its SaslHandshake is v0, whose SASL tokens go without Kafka's framing")
            versions.latest_usable_version(m.SASL_AUTHENTICATE)
        except UnsupportedError as exc:
            self._authentication_failed(node_id, AuthenticationError(
                f"node {node_id} cannot authenticate the daemon with SASL: {exc}", code=exc.code, name=exc.name), now)
            return
        self.connection_states.authenticating(node_id)
        exchange = self._sasl_exchanges[node_id] = SaslExchange(self.sasl)
        request = ClientRequest(node_id, m.SaslHandshakeRequest(mechanism=self.sasl.mechanism), now,
                                callback=lambda response: self._handle_sasl_handshake(node_id, exchange, response))
        self._do_send(request, now)

    def _handle_sasl_handshake(self, node_id: int, exchange: SaslExchange, response: ClientResponse) -> None:
        body = response.body
        if body is None or self._sasl_exchanges.get(node_id) is not exchange:
            return  # disconnected meanwhile: the disconnect is handled
        if body.error_code:
            row = error_code(body.error_code)
            self._authentication_failed(node_id, AuthenticationError(
                f"node {node_id} does not offer SASL mechanism {exchange.mechanism} (it offers "
                f"{', '.join(body.mechanisms) or 'none'})", code=row.code, name=row.name), response.received_ms)
            return
        self._send_sasl_token(node_id, exchange, exchange.first(), response.received_ms)

    def _send_sasl_token(self, node_id: int, exchange: SaslExchange, token: bytes, now: int) -> None:
        request = ClientRequest(node_id, m.SaslAuthenticateRequest(auth_bytes=token), now,
                                callback=lambda response: self._handle_sasl_authenticate(node_id, exchange, response))
        self._do_send(request, now)

    def _handle_sasl_authenticate(self, node_id: int, exchange: SaslExchange, response: ClientResponse) -> None:
        body = response.body
        if body is None or self._sasl_exchanges.get(node_id) is not exchange:
            return
        now = response.received_ms
        try:
            if body.error_code:
                row = error_code(body.error_code)
                raise AuthenticationError(f"node {node_id} refused the daemon's {exchange.mechanism} credentials: "
                                          f"{body.error_message or row.name}", code=row.code, name=row.name)
            token = exchange.respond(body.auth_bytes)
        except AuthenticationError as exc:
            self._authentication_failed(node_id, exc, now)
            return
        if token is not None:
            self._send_sasl_token(node_id, exchange, token, now)
            return
        del self._sasl_exchanges[node_id]
        if body.session_lifetime_ms > 0:
            # As Java's client: again at 85 to 95% of the session's lifetime, before the broker ends it.
            self._reauthenticate_at[node_id] = now + int(body.session_lifetime_ms * self._rng.uniform(0.85, 0.95))
        self._ready(node_id)

    def _maybe_reauthenticate(self, now: int) -> int:
        """Authenticate again the connections whose session is due (no new request goes to one meanwhile, and
        the exchange starts once its requests in flight are answered); returns how long until the next is due."""
        delay = 2**31 - 1
        for node_id, due in list(self._reauthenticate_at.items()):
            if due > now:
                delay = min(delay, due - now)
                continue
            if self.connection_states.is_ready(node_id):
                self.connection_states.authenticating(node_id)
            if self.in_flight.count(node_id) == 0 and not self.selector.has_pending_send(node_id):
                del self._reauthenticate_at[node_id]
                log.debug("node %s: authenticating again (KIP-368)", node_id)
                self._authenticate(node_id, now)
            else:
                delay = 0
        return delay

    def _authentication_failed(self, node_id: int, error: AuthenticationError, now: int) -> None:
        self.selector.close(node_id)
        self._handle_disconnect(node_id, now, str(error))
        self._record_authentication_failure(node_id, error)

    def _record_authentication_failure(self, node_id: int, error: AuthenticationError) -> None:
        """A node refused the daemon: its batches and the clients waiting for metadata fail with ``error``; it
        is tried again after the reconnect backoff (the credentials or certificates may be fixed by a reload)."""
        self.connection_states.authentication_failed(node_id)
        self.authentication_errors[node_id] = error
        self.metadata.authentication_error = error
        if self._authentication_logged.get(node_id) != str(error):
            self._authentication_logged[node_id] = str(error)
            log.error("authentication with node %s failed: %s", node_id, error)

    def _handle_timed_out_requests(self, responses: list[ClientResponse], now: int) -> None:
        for node_id in self.in_flight.nodes_with_timed_out_requests(now):
            log.warning("disconnecting from node %s due to request timeout", node_id)
            self.selector.close(node_id)
            self._handle_disconnect(node_id, now, "request timed out", responses, timed_out=True)

    def _handle_connection_setup_timeouts(self, now: int) -> None:
        for node_id in self.connection_states.connecting_nodes():
            if self.connection_states.connection_setup_expired(node_id, now):
                self.selector.close(node_id)
                self._handle_disconnect(node_id, now, "connection setup timed out")

    # -- metadata --------------------------------------------------------------------------------

    def _metadata_update_due(self, now: int) -> bool:
        return self._metadata_request is None and self.metadata.time_to_next_update(now) == 0

    def _maybe_update_metadata(self, now: int) -> int:
        """Send a metadata request if one is due; returns how long the poll may sleep for it."""
        if self._metadata_request is not None:
            return self.request_timeout_ms
        delay = self.metadata.time_to_next_update(now)
        if delay > 0:
            return delay
        node = self.least_loaded_node(now)
        if node is None:
            return self.reconnect_backoff_ms
        if self.can_send_request(node.id):
            self._metadata_request_version = self.metadata.request_version
            self._metadata_request = ClientRequest(node.id, self.metadata.build_request(now), now)
            self._do_send(self._metadata_request, now)
            # Not sent (no common version): this poll returns the error without waiting, and the
            # refresh is tried again after the refresh backoff.
            return self.request_timeout_ms if self._metadata_request is not None else 0
        if self.connection_states.can_connect(node.id, now):
            self._initiate_connect(node, now)
        return self.reconnect_backoff_ms

    def _metadata_refresh_failed(self, now: int) -> None:
        self._metadata_request = None
        self.metadata.failed_update(now)

    def _handle_metadata(self, body: m.MetadataResponse, now: int) -> None:
        """The answer to the client's own refresh (answers to callers' Metadata requests are theirs alone)."""
        self._metadata_request = None
        if not body.brokers:
            # Kafka answers with no brokers while it starts; keep what we know and retry.
            log.debug("metadata response without brokers, ignored")
            self.metadata.failed_update(now)
            return
        changes = self.metadata.update(body, now, self._metadata_request_version)
        for node in changes.removed + changes.moved:
            if self.selector.has_channel(node.id):  # else nothing to close, nothing failed
                log.info("node %s %s: closing its connection", node.id,
                         "moved" if node in changes.moved else "left the cluster")
                self.selector.close(node.id)
                self._handle_disconnect(node.id, now, "broker moved or left the cluster")
            self.connection_states.remove(node.id)
        self._close_bootstrap_connections()

    def _close_bootstrap_connections(self) -> None:
        """Bootstrap connections are done once the brokers are known by id (and idle)."""
        for node_id in self.selector.channels():
            if node_id < 0 and self.in_flight.count(node_id) == 0:
                self.selector.close(node_id)
                self.connection_states.remove(node_id)
                self._forget_connection(node_id)

    def _forget_connection(self, node_id: int) -> None:
        """What the client knew of a connection that is closed: its versions, its SASL session."""
        self._api_versions.pop(node_id, None)
        self._sasl_exchanges.pop(node_id, None)
        self._reauthenticate_at.pop(node_id, None)
