"""The daemon to brokers that require TLS, SASL or both: the tests' TLS- and SASL-terminating proxy in front
of Tansu (tests/support/secure_proxy.py, proven with librdkafka by test_secure_proxy.py), every record read
back by a librdkafka consumer with the same security settings."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from client_stub import Producer
from client_stub.errors import AuthenticationError, SslAuthenticationError
from service.tools.readback import read_topic
from tests.support import users
from tests.support.certificates import Certificates
from tests.support.secure_proxy import (
    Listener,
    SecureBroker,
    ServerTls,
    librdkafka_settings,
)
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.broker

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
RECORDS = 100_000


def listener(protocol: str, certs: Certificates, mechanism: str | None = None, **options: object) -> Listener:
    tls = ServerTls(certs.server.certificate, certs.server.key, certs.key_password) if protocol.endswith("SSL") \
        else None
    return Listener(protocol, tls=tls, mechanisms=(mechanism,) if mechanism else (),  # type: ignore[arg-type]
                    users=USERS if mechanism else {}, **options)  # type: ignore[arg-type]


def daemon_settings(protocol: str, certs: Certificates, mechanism: str | None = None, user: str = "alice",
                    password: str | None = None) -> dict[str, object]:
    """The daemon's settings for a listener, as its users write them (Kafka's names; SCRAM by JAAS line)."""
    settings: dict[str, object] = {"security.protocol": protocol}
    if protocol.endswith("SSL"):
        settings["ssl.truststore.location"] = certs.ca
    if mechanism is not None:
        password = USERS.get(user, "") if password is None else password
        module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
        settings["sasl.mechanism"] = mechanism
        settings["sasl.jaas.config"] = (f"org.apache.kafka.common.security.{module} required "
                                        f'username="{user}" password="{password}";')
    return settings


def reader_settings(kafka: SecureBroker, protocol: str, certs: Certificates, mechanism: str | None = None) -> dict:
    """A librdkafka consumer's settings for the same listener (bob's account: another user of the cluster)."""
    return librdkafka_settings(kafka.bootstrap, protocol, ca_location=certs.ca if protocol.endswith("SSL") else None,
                               mechanism=mechanism, username="bob" if mechanism else None,
                               password=USERS["bob"] if mechanism else None)


def produce(endpoint: str, topic: str, count: int) -> list[bytes]:
    values = [b"record-%d" % n for n in range(count)]
    with Producer(endpoint) as producer:
        futures = [producer.send(topic, value, key=b"%d" % (n % 101)) for n, value in enumerate(values)]
        assert producer.flush(120) == 0
    errors = Counter(repr(f.exception()) for f in futures if f.exception() is not None)
    assert not errors, errors
    return values


@pytest.mark.parametrize(("protocol", "mechanism"), [
    ("SSL", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_SSL", "SCRAM-SHA-512"),
])
def test_100k_records_through_a_broker_that_requires_it(secure_broker, sidecar, certs, protocol: str,
                                                        mechanism: str | None) -> None:
    kafka = secure_broker(listener(protocol, certs, mechanism))
    kafka.create_topic("secure", 3)
    daemon = sidecar(kafka.bootstrap, settings=daemon_settings(protocol, certs, mechanism))
    sent = produce(daemon.endpoint, "secure", RECORDS)
    read = read_topic(kafka.bootstrap, "secure", expected=RECORDS, timeout=120,
                      settings=reader_settings(kafka, protocol, certs, mechanism))
    assert Counter(r.value for r in read) == Counter(sent)
    if mechanism is not None:
        # The daemon authenticated as alice, on as few connections as the cluster needs.
        assert {s.user for s in kafka.proxy.sessions if s.user is not None} >= {"alice"}
    # Nothing secret in the log.
    assert "secret" not in daemon.log_path.read_text()


@pytest.mark.parametrize(("case", "protocol", "mechanism", "error", "cause"), [
    ("wrong password", "SASL_SSL", "SCRAM-SHA-512", AuthenticationError, "SASL_AUTHENTICATION_FAILED"),
    ("unknown user", "SASL_PLAINTEXT", "PLAIN", AuthenticationError, "Invalid username or password"),
    ("mechanism not offered", "SASL_PLAINTEXT", "SCRAM-SHA-256", AuthenticationError,
     "does not offer SASL mechanism SCRAM-SHA-256 (it offers PLAIN)"),
    ("untrusted CA", "SSL", None, SslAuthenticationError, "certificate is not trusted"),
    ("name mismatch", "SSL", None, SslAuthenticationError, "certificate is not for 127.0.0.1"),
])
def test_a_broker_that_refuses_the_daemon_fails_the_clients_with_the_cause(
        secure_broker, sidecar, certs, case: str, protocol: str, mechanism: str | None, error: type,
        cause: str) -> None:
    tls = None
    if protocol.endswith("SSL"):
        served = certs.wrong_name if case == "name mismatch" else certs.server
        tls = ServerTls(served.certificate, served.key, certs.key_password)
    offered = ("PLAIN",) if case == "mechanism not offered" else (mechanism,) if mechanism else ()
    kafka = secure_broker(Listener(protocol, tls=tls, mechanisms=offered, users=USERS))  # type: ignore[arg-type]
    kafka.create_topic("refused", 1)
    settings = daemon_settings(protocol, certs, mechanism, user="mallory" if case == "unknown user" else "alice",
                               password={"wrong password": "not-the-password",
                                         "unknown user": "mallory-password"}.get(case))
    if case == "untrusted CA":
        settings["ssl.truststore.location"] = certs.untrusted_ca
    daemon = sidecar(kafka.bootstrap, settings=settings)
    # However long the refusal takes to come (it ends the wait): max.block.ms only bounds a hang.
    with Producer(daemon.endpoint, max_block_ms=int(HANG_S * 1000)) as producer, pytest.raises(error) as refused:
        producer.send("refused", b"never sent")
    assert cause in str(refused.value)
    # The daemon goes on, tries again after its backoff, and says why once, not at every attempt.
    assert wait_until(lambda: daemon.log_path.read_text().count("authentication with node") >= 1)
    assert daemon.is_running() and daemon.stats()["sidecar"]["sessions"] >= 0
    log = daemon.log_path.read_text()
    assert log.count("authentication with node -1 failed") == 1, log
    assert "not-the-password" not in log and "secret" not in log


def test_cutting_tls_connections_mid_record_loses_and_duplicates_nothing(secure_broker, sidecar, certs) -> None:
    kafka = secure_broker(listener("SASL_SSL", certs, "SCRAM-SHA-512"), fault_proxy="broker-side")
    kafka.create_topic("cut", 3)
    # Small batches, not coalesced: at least 50 requests (a batch a partition each), some 7 cuts, however busy
    # the machine is.
    daemon = sidecar(kafka.bootstrap, settings={**daemon_settings("SASL_SSL", certs, "SCRAM-SHA-512"),
                                                "batch.size": 4096, "sidecar.coalesce.batches": "false"})
    assert kafka.fault is not None
    kafka.fault.cut_every(7)  # every 7th produce request: the proxy resets the daemon's TLS connection
    sent = produce(daemon.endpoint, "cut", 30_000)
    kafka.fault.cut_every(None)
    assert kafka.fault.connections_accepted > 5  # the daemon connected again, and again
    read = read_topic(kafka.bootstrap, "cut", expected=len(sent), timeout=120,
                      settings=reader_settings(kafka, "SASL_SSL", certs, "SCRAM-SHA-512"))
    assert Counter(r.value for r in read) == Counter(sent)  # each once: idempotence across reconnections


def test_the_daemon_authenticates_again_before_its_session_expires(secure_broker, sidecar, certs) -> None:
    kafka = secure_broker(listener("SASL_SSL", certs, "SCRAM-SHA-256", session_lifetime_ms=2000))
    kafka.create_topic("renewed", 1)
    daemon = sidecar(kafka.bootstrap, settings=daemon_settings("SASL_SSL", certs, "SCRAM-SHA-256"))
    with Producer(daemon.endpoint) as producer:
        futures = []
        # Records for more than twice the session's lifetime, over the same connections.
        until = time.monotonic() + 5
        while time.monotonic() < until:
            futures.append(producer.send("renewed", b"%d" % len(futures)))
            time.sleep(0.001)
        assert producer.flush(30) == 0
    assert all(f.exception() is None for f in futures)
    sessions = [s for s in kafka.proxy.sessions if s.user == "alice"]
    assert sum(s.reauthentications for s in sessions) >= 2
    assert not any(s.closed and "expired" in s.closed for s in sessions), sessions


def test_certificates_and_credentials_are_read_again_on_sighup(secure_broker, certs, tmp_path: Path) -> None:
    kafka = secure_broker(listener("SASL_SSL", certs, "PLAIN"))
    kafka.create_topic("reloaded", 1)
    trusted = tmp_path / "trusted.pem"
    trusted.write_bytes(certs.untrusted_ca.read_bytes())
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    config = tmp_path / "kafka-sidecar.toml"
    settings = (f'[producer]\nbootstrap.servers = "{kafka.bootstrap}"\nsecurity.protocol = "SASL_SSL"\n'
                f'ssl.truststore.location = "{trusted}"\nsasl.mechanism = "PLAIN"\nsasl.username = "alice"\n'
                f'sasl.password = "wrong"\n\n[sidecar]\nendpoint = "{endpoint}"\n')
    config.write_text(settings)
    daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--config", str(config)],
                              stderr=subprocess.PIPE, text=True, cwd=users.ROOT)
    try:
        with Producer(endpoint, max_block_ms=int(HANG_S * 1000)) as producer:
            with pytest.raises(SslAuthenticationError):
                producer.send("reloaded", b"refused")
            # The operator puts the right CA in the file, then the right password, and reloads.
            trusted.write_bytes(certs.ca.read_bytes())
            config.write_text(settings.replace('"wrong"', f'"{USERS["alice"]}"'))
            daemon.send_signal(signal.SIGHUP)
            assert wait_until(lambda: _sends(producer, "reloaded"))
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, log
    assert "sasl.password=[hidden]" in log and USERS["alice"] not in log and "wrong" not in log


def _sends(producer: Producer, topic: str) -> bool:
    try:
        producer.send(topic, b"accepted").result(10)
    except (AuthenticationError, TimeoutError):
        return False
    return True


def test_check_config_says_what_is_wrong_without_the_secrets(certs, tmp_path: Path) -> None:
    config = tmp_path / "kafka-sidecar.toml"
    config.write_text('[producer]\nbootstrap.servers = "127.0.0.1:9092"\nsecurity.protocol = "SASL_SSL"\n'
                      f'ssl.truststore.location = "{tmp_path / "missing.pem"}"\nsasl.mechanism = "SCRAM-SHA-256"\n'
                      'sasl.username = "alice"\nsasl.password = "alice-secret"\n')
    done = subprocess.run([sys.executable, "-m", "service.cli", "check-config", "--config", str(config)],
                          capture_output=True, text=True, cwd=users.ROOT)
    assert done.returncode == 2
    assert "ssl.truststore.location: no CA certificates in PEM could be read" in done.stderr
    config.write_text(config.read_text().replace(str(tmp_path / "missing.pem"), str(certs.ca)))
    done = subprocess.run([sys.executable, "-m", "service.cli", "check-config", "--config", str(config)],
                          capture_output=True, text=True, cwd=users.ROOT, check=True)
    assert "sasl.password = [hidden]  # file" in done.stdout and "alice-secret" not in done.stdout


def test_a_client_certificate_when_the_broker_asks_for_one(secure_broker, sidecar, certs) -> None:
    tls = ServerTls(certs.server.certificate, certs.server.key, certs.key_password, client_ca=certs.ca)
    kafka = secure_broker(Listener("SSL", tls=tls))
    kafka.create_topic("mutual", 1)
    # The key (encrypted) and chain inline, as Kafka's ssl.keystore.key and ssl.keystore.certificate.chain take them.
    daemon = sidecar(kafka.bootstrap, settings={
        "security.protocol": "SSL", "ssl.truststore.location": certs.ca,
        "ssl.keystore.key": certs.client.key.read_text(), "ssl.key.password": certs.key_password,
        "ssl.keystore.certificate.chain": certs.client.certificate.read_text()})
    sent = produce(daemon.endpoint, "mutual", 1000)
    read = read_topic(kafka.bootstrap, "mutual", expected=1000, settings=librdkafka_settings(
        kafka.bootstrap, "SSL", ca_location=certs.ca, certificate=certs.client.certificate, key=certs.client.key,
        key_password=certs.key_password))
    assert sorted(r.value for r in read) == sorted(sent)
