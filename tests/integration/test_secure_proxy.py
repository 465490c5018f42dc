"""The TLS- and SASL-terminating proxy of the tests, proved by librdkafka, an independent client.

confluent-kafka producers and consumers with the settings librdkafka users write get through the
proxy (and fail at it) as they would at a Kafka broker; a hand-written client checks the Kafka
behaviour librdkafka does not show: what is allowed before authentication, the answers' exact
codes, re-authentication and the expiry of a session.
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from client_stub.fastpath import encode_record
from service.protocol import messages as m
from service.protocol.api import decode_response, encode_request
from service.protocol.framing import SIZE
from service.protocol.schema import Message
from tests.support.certificates import Certificates
from tests.support.fake_broker import FakeBroker
from tests.support.record_batches import build_batch
from tests.support.secure_proxy import (
    BROKER_GONE,
    CLIENT_GONE,
    ILLEGAL_SASL_STATE,
    MECHANISMS,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    FaultPlacement,
    Listener,
    SecureBroker,
    SecureProxy,
    ServerTls,
    authentication_failed_message,
    librdkafka_settings,
)
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.broker

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
TOPIC = "secured"
PARTITIONS = 3
# librdkafka 2.16 reports a certificate it cannot verify (unknown CA, wrong name) as _SSL ("SSL handshake
# failed: ... certificate verify failed"), and now and then as _TRANSPORT with the same OpenSSL error.
TLS_VERIFY_ERRORS = (KafkaError._SSL, KafkaError._TRANSPORT)


@pytest.fixture
def secured(secure_broker: Callable[..., SecureBroker]) -> Callable[..., SecureBroker]:
    """``secured(listener, fault_proxy=None)``: secure_broker's, with topic TOPIC."""

    def start(listener: Listener, fault_proxy: FaultPlacement | None = None) -> SecureBroker:
        kafka = secure_broker(listener, fault_proxy)
        kafka.create_topic(TOPIC, PARTITIONS)
        return kafka

    return start


def _server_tls(certs: Certificates, **options: Any) -> ServerTls:
    return ServerTls(certs.server.certificate, certs.server.key, certs.key_password, **options)


def _listener(security_protocol: str, certs: Certificates, mechanisms: tuple[str, ...] = (),
              **options: Any) -> Listener:
    tls = _server_tls(certs) if security_protocol.endswith("SSL") else None
    return Listener(security_protocol, tls=tls, mechanisms=mechanisms,  # type: ignore[arg-type]
                    users=USERS if mechanisms else {}, **options)


def _client_settings(kafka: SecureBroker, certs: Certificates, mechanism: str | None = None,
                     user: str = "alice", password: str | None = None, **options: Any) -> dict[str, str]:
    """What a librdkafka user writes for ``kafka``'s listener, as ``user``."""
    protocol = kafka.listener.security_protocol
    sasl: dict[str, Any] = {}
    if mechanism is not None:
        sasl = {"mechanism": mechanism, "username": user, "password": password or USERS.get(user, "no-password")}
    return librdkafka_settings(kafka.bootstrap, protocol, ca_location=certs.ca if protocol.endswith("SSL") else None,
                               **sasl, **options)


def _produce(settings: dict[str, str], count: int, *, spread: float = 0.0) -> None:
    """Produce ``count`` records (value = their number) with idempotence, in chunks of 100 sent evenly over
    ``spread`` seconds (0: at once); every one must be delivered."""
    failures: list[str] = []

    def on_delivery(error: KafkaError | None, message: KafkaMessage) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer({**settings, "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 30000})
    start = time.monotonic()
    try:
        for n in range(count):
            producer.produce(TOPIC, value=str(n).encode(), key=str(n).encode(), on_delivery=on_delivery)
            if n % 100 == 99:
                producer.poll(0)
                time.sleep(max(start + spread * n / count - time.monotonic(), 0))
        assert producer.flush(HANG_S) == 0
    finally:
        del producer  # closes its connections before the proxy stops
    assert not failures, failures[:5]


def _read_back(settings: dict[str, str], count: int, timeout: float = HANG_S) -> list[int]:
    """The values of TOPIC's records from the beginning, CRCs checked, read until at least ``count`` came and
    every partition is at its end (so that a duplicate shows)."""
    consumer = Consumer({**settings, "group.id": f"verifier-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "check.crcs": True, "fetch.wait.max.ms": 50, "enable.partition.eof": True})
    values: list[int] = []
    at_end = dict.fromkeys(range(PARTITIONS), False)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        while (len(values) < count or not all(at_end.values())) and time.monotonic() < deadline:
            for message in consumer.consume(10000, 0.2):
                error = message.error()
                at_end[message.partition()] = error is not None and error.code() == KafkaError._PARTITION_EOF
                if not at_end[message.partition()]:
                    assert error is None, error
                    values.append(int(message.value()))
    finally:
        consumer.close()
    return values


def _sleep_until(moment: float) -> None:
    """Sleep until time.monotonic() reaches ``moment`` (at once if it has)."""
    time.sleep(max(moment - time.monotonic(), 0))


def _first_error(settings: dict[str, str], timeout: float = HANG_S) -> KafkaError:
    """The first error (other than "all brokers down") a producer with ``settings`` reports."""
    errors: list[KafkaError] = []
    producer = Producer({**settings, "error_cb": errors.append, "log_level": 0})
    try:
        meaningful = [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        deadline = time.monotonic() + timeout
        while not meaningful and time.monotonic() < deadline:
            producer.poll(0.05)
            meaningful = [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
    finally:
        del producer
    assert meaningful, f"no error in {timeout}s: {errors}"
    return meaningful[0]


# -- librdkafka gets through -------------------------------------------------------------------------------

@pytest.mark.parametrize(("security_protocol", "mechanism", "count"), [
    ("SSL", None, 5000),
    ("SASL_PLAINTEXT", "PLAIN", 5000),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", 5000),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", 5000),
    ("SASL_SSL", "SCRAM-SHA-512", 100_000),  # the count: the proxy keeps up
])
def test_librdkafka_produces_and_reads_back_through_the_proxy(
        secured: Callable[..., SecureBroker], certs: Certificates,
        security_protocol: str, mechanism: str | None, count: int) -> None:
    kafka = secured(_listener(security_protocol, certs, (mechanism,) if mechanism else ()))
    settings = _client_settings(kafka, certs, mechanism)

    _produce(settings, count)
    assert sorted(_read_back(settings, count)) == list(range(count))

    sessions = kafka.proxy.sessions
    assert sessions and all(s.closed in (None, CLIENT_GONE) for s in sessions), sessions
    if mechanism is not None:
        assert {(s.user, s.mechanism) for s in sessions} == {("alice", mechanism)}


def test_client_certificates_when_the_listener_requires_them(
        secured: Callable[..., SecureBroker], certs: Certificates) -> None:
    kafka = secured(Listener("SSL", tls=_server_tls(certs, client_ca=certs.ca)))
    with_certificate = _client_settings(kafka, certs, certificate=certs.client.certificate, key=certs.client.key,
                                        key_password=certs.key_password)

    _produce(with_certificate, 1000)
    assert sorted(_read_back(with_certificate, 1000)) == list(range(1000))

    before = len(kafka.proxy.sessions)
    producer = Producer({**_client_settings(kafka, certs), "log_level": 0})
    assert wait_until(lambda: len(kafka.proxy.sessions) > before and kafka.proxy.sessions[-1].closed)
    del producer
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in (kafka.proxy.sessions[-1].closed or "")


def test_librdkafka_reauthenticates_before_its_session_expires(
        secured: Callable[..., SecureBroker], certs: Certificates) -> None:
    # librdkafka (KIP-368, since 2.2.0) re-authenticates at about 90 % of the lifetime.
    kafka = secured(_listener("SASL_SSL", certs, ("SCRAM-SHA-256",), session_lifetime_ms=1000))
    settings = _client_settings(kafka, certs, "SCRAM-SHA-256")

    _produce(settings, 3000, spread=2.0)  # two lifetimes on one connection

    sessions = kafka.proxy.sessions
    assert max(s.reauthentications for s in sessions) >= 1, sessions
    assert not [s for s in sessions if s.closed == "session expired"], sessions
    assert sorted(_read_back(settings, 3000)) == list(range(3000))


# -- and fails where a broker would refuse it ---------------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "alice-secret")],
                         ids=["wrong-password", "unknown-user"])
def test_bad_credentials_fail_with_kafkas_authentication_error(
        secured: Callable[..., SecureBroker], certs: Certificates, mechanism: str, user: str,
        password: str) -> None:
    kafka = secured(_listener("SASL_SSL", certs, MECHANISMS))

    error = _first_error(_client_settings(kafka, certs, mechanism, user=user, password=password))

    message = authentication_failed_message(mechanism)
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert f"SASL authentication error: {message}" in error.str()
    assert _session_closed(kafka) == f"authentication failed: {message}"
    assert kafka.proxy.sessions[0].user is None


def test_a_mechanism_the_listener_does_not_enable_fails_with_the_enabled_ones(
        secured: Callable[..., SecureBroker], certs: Certificates) -> None:
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("PLAIN", "SCRAM-SHA-512")))

    error = _first_error(_client_settings(kafka, certs, "SCRAM-SHA-256"))

    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "Unsupported SASL mechanism: broker's supported mechanisms: PLAIN,SCRAM-SHA-512" in error.str()


def test_an_untrusted_certificate_authority_fails_the_tls_handshake(
        secured: Callable[..., SecureBroker], certs: Certificates) -> None:
    kafka = secured(_listener("SSL", certs))

    error = _first_error({**_client_settings(kafka, certs), "ssl.ca.location": str(certs.untrusted_ca)})

    assert error.code() in TLS_VERIFY_ERRORS, error
    assert "certificate verify failed" in error.str()
    assert "UNKNOWN_CA" in (_session_closed(kafka) or "")


def test_a_certificate_for_another_name_fails_the_tls_handshake(
        secured: Callable[..., SecureBroker], certs: Certificates) -> None:
    tls = ServerTls(certs.wrong_name.certificate, certs.wrong_name.key, certs.key_password)
    kafka = secured(Listener("SSL", tls=tls))

    error = _first_error(_client_settings(kafka, certs))

    assert error.code() in TLS_VERIFY_ERRORS, error
    assert "certificate verify failed" in error.str()
    assert "BAD_CERTIFICATE" in (_session_closed(kafka) or "")
    # The same certificate is fine without the name check: only the name is wrong.
    without_check = {**_client_settings(kafka, certs), "ssl.endpoint.identification.algorithm": "none"}
    _produce(without_check, 10)


# -- the Kafka protocol, by hand -----------------------------------------------------------------------------

class _RawClient:
    """A blocking Kafka connection that sends one request at a time (TLS when ``ca`` is given)."""

    def __init__(self, address: str, ca: Path | None = None, *,
                 minimum_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=HANG_S)
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca))
            context.minimum_version = minimum_version
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.correlation_id = 0

    def send(self, body: Message, version: int) -> None:
        self.correlation_id += 1
        self.sock.sendall(b"".join(bytes(part) for part in
                                   encode_request(body, version, self.correlation_id, "raw-client")))

    def request(self, body: Message, version: int) -> Any:
        self.send(body, version)
        (size,) = SIZE.unpack(self._receive(SIZE.size))
        frame = self._receive(size)
        assert SIZE.unpack_from(frame)[0] == self.correlation_id
        return decode_response(frame, body.API_KEY, version)

    def closed_by_peer(self) -> bool:
        """Whether the peer closed the connection (after sending nothing more)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def authenticate_plain(self, user: str, password: str) -> Any:
        assert self.request(m.SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
        token = b"\0" + user.encode() + b"\0" + password.encode()
        return self.request(m.SaslAuthenticateRequest(auth_bytes=token), 2)

    def _receive(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError(f"closed after {len(data)} of {size} bytes")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def connect() -> Iterator[Callable[..., _RawClient]]:
    """``connect(address, ca=None, minimum_version=...) -> _RawClient``, closed at teardown."""
    clients: list[_RawClient] = []

    def make(address: str, ca: Path | None = None, **options: Any) -> _RawClient:
        clients.append(_RawClient(address, ca, **options))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def _session_closed(kafka: SecureBroker, index: int = 0) -> str | None:
    assert wait_until(lambda: kafka.proxy.sessions[index].closed is not None)
    return kafka.proxy.sessions[index].closed


def test_the_listener_serves_only_the_tls_versions_it_is_given(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates) -> None:
    kafka = secured(Listener("SSL", tls=_server_tls(certs, maximum_version=ssl.TLSVersion.TLSv1_2)))

    assert cast(ssl.SSLSocket, connect(kafka.bootstrap, certs.ca).sock).version() == "TLSv1.2"
    with pytest.raises(ssl.SSLError):
        connect(kafka.bootstrap, certs.ca, minimum_version=ssl.TLSVersion.TLSv1_3)
    assert "UNSUPPORTED_PROTOCOL" in (_session_closed(kafka, 1) or "")


@pytest.mark.parametrize(("request_", "version", "reason"), [
    (m.MetadataRequest(topics=None), 12, "request 3 v12 during SASL authentication"),
    (m.SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"), 2, "request 36 v2 during SASL authentication"),
    (m.SaslHandshakeRequest(mechanism="PLAIN"), 0, "SaslHandshake v0"),
], ids=["metadata", "authenticate-before-handshake", "handshake-v0"])
def test_before_authentication_only_api_versions_and_sasl_are_served(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates, request_: Message, version: int,
        reason: str) -> None:
    kafka = secured(_listener("SASL_SSL", certs, ("PLAIN",)))
    client = connect(kafka.bootstrap, certs.ca)

    # ApiVersions goes to the broker, and the broker advertises the SASL requests.
    versions = {k.api_key: (k.min_version, k.max_version) for k in client.request(m.ApiVersionsRequest(), 3).api_keys}
    assert versions[m.SASL_HANDSHAKE] == (0, 1)
    assert versions[m.SASL_AUTHENTICATE] == (0, 2)
    client.send(request_, version)

    assert client.closed_by_peer()  # unanswered
    assert _session_closed(kafka) == reason


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates) -> None:
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("SCRAM-SHA-256", "SCRAM-SHA-512")))
    client = connect(kafka.bootstrap)

    response = client.request(m.SaslHandshakeRequest(mechanism="GSSAPI"), 1)

    assert response.error_code == UNSUPPORTED_SASL_MECHANISM
    assert response.mechanisms == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert client.closed_by_peer()


@pytest.mark.parametrize(("token", "message"), [
    (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
    (b"bob\0alice\0alice-secret",
     "Authentication failed: Client requested an authorization id that is different from username"),
    (b"alice-secret",
     "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN"),
], ids=["wrong-password", "other-authorization-id", "malformed"])
def test_refused_plain_credentials_are_answered_then_closed(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates, token: bytes, message: str) -> None:
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("PLAIN",)))
    client = connect(kafka.bootstrap)
    assert client.request(m.SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0

    response = client.request(m.SaslAuthenticateRequest(auth_bytes=token), 2)

    assert (response.error_code, response.error_message) == (SASL_AUTHENTICATION_FAILED, message)
    assert client.closed_by_peer()


def test_a_request_the_broker_leaves_unanswered_holds_up_no_other_answer(
        fake_broker: Callable[..., FakeBroker], connect: Callable[..., _RawClient], certs: Certificates) -> None:
    # The fake broker does not answer a Produce with acks=0, as Kafka (Tansu answers it, and that passes).
    broker = fake_broker(topics={TOPIC: 1})
    with SecureProxy(_listener("SASL_PLAINTEXT", certs, ("PLAIN",)), broker.host, broker.port) as proxy:
        client = connect(proxy.address)
        assert client.authenticate_plain("alice", USERS["alice"]).error_code == 0
        batch = b"".join(bytes(part) for part in build_batch(encode_record(0, 0, None, b"7"), record_count=1,
                                                             last_offset_delta=0, base_timestamp=1, max_timestamp=1))
        produce = m.ProduceRequest
        client.send(produce(acks=0, timeout_ms=1000, topic_data=[produce.TopicProduceData(name=TOPIC, partition_data=[
            produce.TopicProduceData.PartitionProduceData(index=0, records=batch)])]), 9)

        assert client.request(m.MetadataRequest(topics=None), 12).brokers  # the next answer is the Metadata's
    assert len(broker.requests_of(m.PRODUCE)) == 1


def test_a_session_is_renewed_by_reauthentication_and_closed_once_expired(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates) -> None:
    # A lifetime long beside a round trip on a busy machine: each step below has half of it to spare.
    lifetime_s = 3.0
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("PLAIN",), session_lifetime_ms=int(lifetime_s * 1000)))
    client = connect(kafka.bootstrap)

    assert client.authenticate_plain("alice", USERS["alice"]).session_lifetime_ms == 3000
    first_ends_by = time.monotonic() + lifetime_s
    assert client.request(m.MetadataRequest(topics=None), 12).brokers  # authenticated: forwarded
    # A SaslAuthenticate out of turn is answered, as KafkaApis does; the connection stays.
    assert client.request(m.SaslAuthenticateRequest(auth_bytes=b""), 2).error_code == ILLEGAL_SASL_STATE
    _sleep_until(first_ends_by - lifetime_s / 2)
    assert client.authenticate_plain("alice", USERS["alice"]).error_code == 0  # re-authenticated: 3 s more
    second_ends_by = time.monotonic() + lifetime_s
    _sleep_until(first_ends_by)  # past the first session's end, within the second's (with half of it to go)
    assert client.request(m.MetadataRequest(topics=None), 12).brokers
    assert kafka.proxy.sessions[0].reauthentications == 1

    _sleep_until(second_ends_by)
    client.send(m.MetadataRequest(topics=None), 12)
    assert client.closed_by_peer()
    assert _session_closed(kafka) == "session expired"


def test_reauthentication_cannot_change_the_user(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates) -> None:
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("PLAIN",), session_lifetime_ms=60000))
    client = connect(kafka.bootstrap)
    assert client.authenticate_plain("alice", USERS["alice"]).error_code == 0

    response = client.authenticate_plain("bob", USERS["bob"])

    assert response.error_code == SASL_AUTHENTICATION_FAILED
    assert response.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
    assert client.closed_by_peer()


def test_reauthentication_cannot_change_the_mechanism(
        secured: Callable[..., SecureBroker], connect: Callable[..., _RawClient],
        certs: Certificates) -> None:
    kafka = secured(_listener("SASL_PLAINTEXT", certs, ("PLAIN", "SCRAM-SHA-256"), session_lifetime_ms=60000))
    client = connect(kafka.bootstrap)
    assert client.authenticate_plain("alice", USERS["alice"]).error_code == 0

    client.send(m.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1)

    assert client.closed_by_peer()
    assert _session_closed(kafka) == "SASL mechanism changed from PLAIN to SCRAM-SHA-256 on re-authentication"


# -- behind and in front of the fault proxy ---------------------------------------------------------------------

def test_a_fault_proxy_in_front_of_tls_is_refused(certs: Certificates) -> None:
    with pytest.raises(ValueError, match="cannot pass TLS"):
        SecureBroker(_listener("SASL_SSL", certs, ("PLAIN",)), fault_proxy="client-side")


@pytest.mark.parametrize(("placement", "security_protocol", "mechanism"), [
    ("client-side", "SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("broker-side", "SASL_SSL", "SCRAM-SHA-512"),
])
def test_connections_cut_by_the_fault_proxy_lose_and_duplicate_nothing(
        secured: Callable[..., SecureBroker], certs: Certificates, placement: FaultPlacement,
        security_protocol: str, mechanism: str) -> None:
    kafka = secured(_listener(security_protocol, certs, (mechanism,)), fault_proxy=placement)
    assert kafka.fault is not None
    settings = _client_settings(kafka, certs, mechanism)
    kafka.fault.cut_every(10, api_key=m.PRODUCE)

    try:
        # At most 50 records a request: at least 100 requests, ten cuts, however busy the machine is.
        _produce({**settings, "batch.num.messages": 50}, 5000, spread=1.0)
    except AssertionError as exc:
        # Whether the broker behind both proxies survived the cuts: the records' errors do not say.
        raise AssertionError(f"{exc}; broker exit code {kafka.broker.exit_code()}, sessions "
                             f"{kafka.proxy.sessions}, log tail:\n{kafka.broker.log_tail()}") from exc
    kafka.fault.heal()

    assert sorted(_read_back(settings, 5000)) == list(range(5000))
    if placement == "broker-side":
        # The cut reached the client as one: the proxy reset its connection.
        assert [s for s in kafka.proxy.sessions if s.closed == BROKER_GONE], kafka.proxy.sessions
    assert kafka.fault.requests_forwarded[m.PRODUCE] >= 20
    assert kafka.fault.connections_accepted > 2
