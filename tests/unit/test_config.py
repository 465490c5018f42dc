"""ProducerConfig: Kafka's keys and defaults, parsing, and the checks the Java producer makes."""

from __future__ import annotations

import logging

import pytest

from client_stub.errors import ConfigError
from service.config import INT_MAX, KEYS, ProducerConfig, sasl_credentials, shown

BOOTSTRAP = {"bootstrap.servers": "localhost:9092"}


def config(**settings: object) -> ProducerConfig:
    return ProducerConfig({**BOOTSTRAP, **{k.replace("_", "."): v for k, v in settings.items()}})


def given(settings: dict[str, object]) -> ProducerConfig:
    return ProducerConfig({**BOOTSTRAP, **settings})


KAFKA_DEFAULTS = {
    "acks": -1,
    "linger.ms": 5,  # Kafka 4.0's default (KIP-1030)
    "batch.size": 16384,
    "buffer.memory": 33554432,
    "max.block.ms": 60000,
    "retries": 2147483647,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1000,
    "delivery.timeout.ms": 120000,
    "request.timeout.ms": 30000,
    "max.in.flight.requests.per.connection": 5,
    "enable.idempotence": True,
    "compression.type": "none",
    "max.request.size": 1048576,
    "metadata.max.age.ms": 300000,
    "metadata.max.idle.ms": 300000,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1000,
    "socket.connection.setup.timeout.ms": 10000,
    "send.buffer.bytes": 131072,
    "receive.buffer.bytes": 32768,
    "security.protocol": "PLAINTEXT",
}


@pytest.mark.parametrize("key, value", KAFKA_DEFAULTS.items())
def test_defaults_are_kafkas(key: str, value: object) -> None:
    cfg = ProducerConfig(BOOTSTRAP)
    assert cfg[key] == value
    assert type(cfg[key]) is type(value)
    assert not cfg.given(key)


def test_defaults_keep_idempotence() -> None:
    cfg = ProducerConfig(BOOTSTRAP)
    assert cfg.idempotent
    assert cfg.given("bootstrap.servers")
    assert cfg["bootstrap.servers"] == ["localhost:9092"]


# -- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("all", -1), ("ALL", -1), (" all ", -1), ("-1", -1), ("1", 1), ("0", 0)])
def test_acks_strings(text: str, value: int) -> None:
    assert given({"acks": text, "enable.idempotence": "false"})["acks"] == value


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), (" True", True), ("false", False),
                                         ("False", False)])
def test_boolean_strings(text: str, value: bool) -> None:
    assert given({"enable.idempotence": text})["enable.idempotence"] is value


def test_int_strings() -> None:
    cfg = given({"linger.ms": "10", "batch.size": " 65536 ", "retries": "3", "delivery.timeout.ms": "200000"})
    assert (cfg["linger.ms"], cfg["batch.size"], cfg["retries"], cfg["delivery.timeout.ms"]) == (10, 65536, 3, 200000)
    assert cfg.given("linger.ms") and not cfg.given("acks")


def test_typed_values_are_taken_as_they_are() -> None:
    cfg = given({"linger.ms": 0, "enable.idempotence": False, "acks": 1, "compression.type": "zstd",
                 "bootstrap.servers": ["a:1", "b:2"]})
    assert (cfg["linger.ms"], cfg["enable.idempotence"], cfg["acks"]) == (0, False, 1)
    assert cfg["bootstrap.servers"] == ["a:1", "b:2"]
    assert cfg["compression.type"] == "zstd"


def test_bootstrap_servers_list_string() -> None:
    cfg = ProducerConfig({"bootstrap.servers": " a:1, b:2 ,,[::1]:9093"})
    assert cfg["bootstrap.servers"] == ["a:1", "b:2", "[::1]:9093"]


# -- unknown keys and bad values -----------------------------------------------------------------


def test_unknown_key_with_hint() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'linger\.msec'.*did you mean linger\.ms\?"):
        given({"linger.msec": "5"})


def test_unknown_key_without_close_match() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'zzz'") as info:
        given({"zzz": "1"})
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("key, value", [
    ("linger.ms", "soon"),
    ("linger.ms", "-1"),
    ("batch.size", "0"),
    ("acks", "2"),
    ("acks", "most"),
    ("enable.idempotence", "maybe"),
    ("compression.type", "brotli"),
    ("compression.type", "GZIP"),  # Kafka's names are lower case
    ("max.in.flight.requests.per.connection", "0"),
    ("retries", "-1"),
    ("retries", str(INT_MAX + 1)),
    ("security.protocol", "TLS"),
    ("ssl.endpoint.identification.algorithm", "none"),
    ("ssl.enabled.protocols", "TLSv1.1"),
    ("compression.zstd.level", "23"),
    ("metadata.max.idle.ms", "4999"),
    ("sidecar.metrics.port", "65536"),
    ("sidecar.metrics.port", "http"),
    ("metrics.num.samples", "0"),
    # values given typed rather than as text are checked as well
    ("acks", 2),
    ("linger.ms", None),
    ("linger.ms", 2.5),
    ("linger.ms", True),
    ("batch.size", -5),
    ("enable.idempotence", "yes please"),
    ("compression.type", 3),
])
def test_bad_value_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        given({key: value})
    assert key in str(info.value)
    assert repr(value) in str(info.value)


def test_every_key_parses_its_own_default_as_text() -> None:
    for name, key in KEYS.items():
        default = key.default
        text = ",".join(default) if isinstance(default, list) else str(default).lower() \
            if isinstance(default, bool) else str(default)
        if name == "bootstrap.servers":
            continue
        if name == "sidecar.socket.mode":
            text = f"{default:04o}"  # modes are octal
        elif default is None:
            text = ""  # none: the daemon's own group, no metrics port
        assert given({name: text})[name] == default, name


# -- cross-key checks ----------------------------------------------------------------------------


def test_delivery_timeout_must_cover_linger_and_request_timeout() -> None:
    with pytest.raises(ConfigError) as info:
        config(delivery_timeout_ms=30000, linger_ms=10, request_timeout_ms=30000)
    message = str(info.value)
    assert "delivery.timeout.ms (30000)" in message
    assert "linger.ms (10) + request.timeout.ms (30000)" in message
    assert config(delivery_timeout_ms=30010, linger_ms=10, request_timeout_ms=30000)["delivery.timeout.ms"] == 30010


def test_delivery_timeout_left_at_default_follows_a_larger_request_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """As KafkaProducer.configureDeliveryTimeout: only an explicit delivery.timeout.ms is an error."""
    with caplog.at_level(logging.WARNING, logger="service.config"):
        cfg = config(request_timeout_ms=200000, linger_ms=100)
    assert cfg["delivery.timeout.ms"] == 200100
    assert "delivery.timeout.ms" in caplog.text


def test_reconnect_backoff_max_not_below_backoff() -> None:
    with pytest.raises(ConfigError, match="reconnect.backoff.max.ms"):
        config(reconnect_backoff_ms=2000)
    assert config(reconnect_backoff_ms=2000, reconnect_backoff_max_ms=2000)["reconnect.backoff.ms"] == 2000


def test_batch_size_must_fit_in_the_buffer_memory() -> None:
    with pytest.raises(ConfigError, match=r"batch.size \(65536\) must not be above buffer.memory \(16384\)"):
        config(batch_size=65536, buffer_memory=16384)
    assert config(batch_size=16384, buffer_memory=16384)["batch.size"] == 16384


@pytest.mark.parametrize("servers", ["", " , ", "localhost", "localhost:", ":9092", "host:0", "host:65536",
                                     "host:port", "a:1,b"])
def test_bootstrap_servers_validation(servers: str) -> None:
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        ProducerConfig({"bootstrap.servers": servers})


def test_bootstrap_servers_required() -> None:
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        ProducerConfig({})
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        ProducerConfig()


# -- idempotence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, conflict", [
    ({"acks": "1"}, "acks"),
    ({"acks": "0"}, "acks"),
    ({"retries": "0"}, "retries"),
    ({"max.in.flight.requests.per.connection": "6"}, "max.in.flight.requests.per.connection"),
])
def test_explicit_idempotence_conflict_is_an_error(settings: dict[str, str], conflict: str) -> None:
    with pytest.raises(ConfigError, match="enable.idempotence=true") as info:
        given({"enable.idempotence": "true", **settings})
    assert conflict in str(info.value)


def test_explicit_idempotence_names_every_conflict() -> None:
    with pytest.raises(ConfigError) as info:
        given({"enable.idempotence": True, "acks": "1", "retries": "0",
               "max.in.flight.requests.per.connection": "10"})
    message = str(info.value)
    for key in ("acks", "retries", "max.in.flight.requests.per.connection"):
        assert key in message


@pytest.mark.parametrize("settings", [
    {"acks": "1"}, {"acks": "0"}, {"retries": "0"}, {"max.in.flight.requests.per.connection": "6"},
])
def test_implicit_idempotence_is_disabled(settings: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="service.config"):
        cfg = given(settings)
    assert cfg["enable.idempotence"] is False
    assert not cfg.idempotent
    assert "idempotence disabled" in caplog.text


def test_idempotence_allowed_at_the_limits() -> None:
    cfg = given({"enable.idempotence": "true", "acks": "all", "retries": "1",
                 "max.in.flight.requests.per.connection": "5"})
    assert cfg.idempotent


def test_idempotence_off_allows_anything() -> None:
    cfg = given({"enable.idempotence": "false", "acks": "1", "retries": "0",
                 "max.in.flight.requests.per.connection": "10"})
    assert not cfg.idempotent and cfg["acks"] == 1


@pytest.mark.parametrize(("text", "error"), [("0777", "at most 0666"), ("0060", "own user must read and write"),
                                             ("9", "invalid value"), ("rw-rw----", "invalid value")])
def test_a_socket_mode_is_octal_read_and_write_bits_for_the_daemon_and_others(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        given({"sidecar.socket.mode": text})


def test_a_socket_group_by_name_or_number() -> None:
    assert given({"sidecar.socket.group": "0"})["sidecar.socket.group"] == 0
    assert given({"sidecar.socket.group": "root"})["sidecar.socket.group"] == 0
    with pytest.raises(ConfigError, match="no group named 'no-such-group-here'"):
        given({"sidecar.socket.group": "no-such-group-here"})


def test_a_reload_takes_the_live_settings_and_names_the_others() -> None:
    config = given({"linger.ms": "5", "batch.size": "16384"})
    taken, restart = config.reload(given({"linger.ms": "50", "batch.size": "32768"}))
    assert (taken, restart) == (["linger.ms"], ["batch.size"])
    assert (config["linger.ms"], config["batch.size"]) == (50, 16384)


def test_a_reload_that_would_move_a_setting_read_at_start_is_refused() -> None:
    config = given({})
    # A longer linger.ms would grow delivery.timeout.ms (left at its default), which the sender read at start.
    with pytest.raises(ConfigError, match="linger.ms=200000 would change delivery.timeout.ms"):
        config.reload(given({"linger.ms": "200000"}))
    assert (config["linger.ms"], config["delivery.timeout.ms"]) == (5, 120000)


SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.mark.parametrize(("settings", "message"), [
    ({"ssl.truststore.location": "/ca.pem", "ssl.truststore.certificates": "PEM"},
     "ssl.truststore.location and ssl.truststore.certificates are both set"),
    ({"ssl.keystore.location": "/k.pem", "ssl.keystore.key": "PEM", "ssl.keystore.certificate.chain": "PEM"},
     "ssl.keystore.location and ssl.keystore.key are both set"),
    ({"ssl.keystore.key": "PEM"}, "ssl.keystore.key and ssl.keystore.certificate.chain go together"),
    ({"ssl.key.password": "pw"}, "ssl.key.password is set, but no key"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs a user and a password"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI", "sasl.username": "u",
      "sasl.password": "p"}, "sasl.mechanism GSSAPI is not supported: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": f'{SCRAM_MODULE} required username="u" password="p";'},
     f"sasl.jaas.config's login module {SCRAM_MODULE} is not PLAIN's"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "other",
      "sasl.jaas.config": f'{SCRAM_MODULE} required username="u" password="p";'},
     "sasl.username or sasl.password differ from sasl.jaas.config's"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": "username=u p"},
     "sasl.jaas.config is not a login module line"),
])
def test_security_settings_that_contradict_each_other_are_refused(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        given(settings)
    assert message in str(refused.value)
    assert "p;" not in str(refused.value) and '"p"' not in str(refused.value)  # no password quoted


def test_sasl_credentials_come_from_kafkas_jaas_line_or_librdkafkas_names() -> None:
    jaas = given({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.jaas.config": f'{SCRAM_MODULE} required username="alice" password="a \\"quoted\\" one";'})
    assert sasl_credentials(jaas) == ("alice", 'a "quoted" one')
    named = given({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "bob",
                   "sasl.password": "secret"})
    assert sasl_credentials(named) == ("bob", "secret")


def test_secrets_are_hidden_when_shown() -> None:
    assert shown("sasl.password", "secret") == shown("ssl.keystore.key", "PEM") == "[hidden]"
    assert shown("sasl.password", "") == "" and shown("sasl.username", "bob") == "bob"
