"""A Producer's configuration, read as confluent-kafka reads it: the properties it honours (onto the client's
producer), those the daemon owns (checked against the daemon's), those it refuses, and those that mean nothing here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .._settings import SettingsCheck, whole_ms
from .errors import KafkaError, KafkaException, invalid_arg
from .message import DeliveryCallback

__all__ = ["Settings", "read_settings"]

# Every property librdkafka knows (its CONFIGURATION.md: global, topic and consumer ones), and those
# confluent-kafka adds: a producer accepts each. The ones below that are not honoured, the daemon's or refused
# mean nothing here (docs/migration/confluent-kafka.md lists them).
_PROPERTY_NAMES = """
acks allow.auto.create.topics api.version.fallback.ms api.version.request api.version.request.timeout.ms
auto.commit.enable auto.commit.interval.ms auto.offset.reset background_event_cb batch.num.messages batch.size
bootstrap.servers broker.address.family broker.address.ttl broker.version.fallback builtin.features check.crcs
client.dns.lookup client.id client.rack closesocket_cb compression.codec compression.level compression.type
connect_cb connections.max.idle.ms consume.callback.max.messages consume_cb coordinator.query.interval.ms debug
default_topic_conf delivery.report.only.error delivery.timeout.ms dr_cb dr_msg_cb enable.auto.commit
enable.auto.offset.store enable.gapless.guarantee enable.idempotence enable.metrics.push enable.partition.eof
enable.random.seed enable.sasl.oauthbearer.unsecure.jwt enable.ssl.certificate.verification enabled_events error_cb
fetch.error.backoff.ms fetch.max.bytes fetch.message.max.bytes fetch.min.bytes fetch.queue.backoff.ms
fetch.wait.max.ms group.id group.instance.id group.protocol group.protocol.type group.remote.assignor
heartbeat.interval.ms https.ca.location https.ca.pem interceptors internal.termination.signal isolation.level
linger.ms log.connection.close log.queue log.thread.name log_cb log_level logger max.in.flight
max.in.flight.requests.per.connection max.partition.fetch.bytes max.poll.interval.ms max.poll.records
message.copy.max.bytes message.max.bytes message.send.max.retries message.timeout.ms metadata.broker.list
metadata.max.age.ms metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy msg_order_cmp oauth_cb
oauthbearer_token_refresh_cb offset.store.method offset.store.path offset.store.sync.interval.ms offset_commit_cb
on_delivery opaque open_cb partition.assignment.strategy partitioner partitioner_cb plugin.library.paths
produce.offset.report queue.buffering.backpressure.threshold queue.buffering.max.kbytes queue.buffering.max.messages
queue.buffering.max.ms queued.max.messages.kbytes queued.min.messages queuing.strategy rebalance_cb
receive.message.max.bytes reconnect.backoff.jitter.ms reconnect.backoff.max.ms reconnect.backoff.ms
request.required.acks request.timeout.ms resolve_cb retries retry.backoff.max.ms retry.backoff.ms
sasl.kerberos.keytab sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin sasl.kerberos.principal
sasl.kerberos.service.name sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm
sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub sasl.oauthbearer.assertion.file
sasl.oauthbearer.assertion.jwt.template.file sasl.oauthbearer.assertion.private.key.file
sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.private.key.pem
sasl.oauthbearer.client.credentials.client.id sasl.oauthbearer.client.credentials.client.secret
sasl.oauthbearer.client.id sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions
sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type sasl.oauthbearer.method
sasl.oauthbearer.scope sasl.oauthbearer.sub.claim.name sasl.oauthbearer.token.endpoint.url sasl.password
sasl.username security.protocol session.timeout.ms share.acknowledgement.mode socket.blocking.max.ms
socket.connection.setup.timeout.ms socket.keepalive.enable socket.max.fails socket.nagle.disable
socket.receive.buffer.bytes socket.send.buffer.bytes socket.timeout.ms socket_cb ssl.ca.certificate.stores
ssl.ca.location ssl.ca.pem ssl.certificate.location ssl.certificate.pem ssl.certificate.verify_cb ssl.cipher.suites
ssl.crl.location ssl.curves.list ssl.endpoint.identification.algorithm ssl.engine.id ssl.engine.location
ssl.key.location ssl.key.password ssl.key.pem ssl.keystore.location ssl.keystore.password ssl.providers
ssl.sigalgs.list ssl_ca ssl_certificate ssl_engine_callback_data ssl_key statistics.interval.ms stats_cb
sticky.partitioning.linger.ms throttle_cb topic.blacklist topic.metadata.propagation.max.ms
topic.metadata.refresh.fast.cnt topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms
topic.metadata.refresh.sparse transaction.timeout.ms transactional.id
"""
_KNOWN = frozenset(_PROPERTY_NAMES.split())

# librdkafka's names (aliases too) of the daemon's settings, by the daemon's (Kafka's) name: accepted, and
# checked against the daemon's.
_DAEMON_OWNED: dict[str, str] = {
    "acks": "acks", "request.required.acks": "acks",
    "compression.type": "compression.type", "compression.codec": "compression.type",
    "enable.idempotence": "enable.idempotence",
    "retries": "retries", "message.send.max.retries": "retries",
    "delivery.timeout.ms": "delivery.timeout.ms", "message.timeout.ms": "delivery.timeout.ms",
    "request.timeout.ms": "request.timeout.ms",
    "batch.size": "batch.size",
    "message.max.bytes": "max.request.size",
    "max.in.flight.requests.per.connection": "max.in.flight.requests.per.connection",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "retry.backoff.ms": "retry.backoff.ms",
    "allow.auto.create.topics": "allow.auto.create.topics",
}

# Those that mean here what they mean to confluent-kafka, and kafka-sidecar's own.
_HONOURED = frozenset({"sidecar.endpoint", "client.id", "linger.ms", "queue.buffering.max.ms", "partitioner",
                       "queue.buffering.max.messages", "topic.metadata.propagation.max.ms",
                       "delivery.report.only.error", "on_delivery"})

# Those that would change what the producer does in a way it cannot.
_REFUSED = frozenset({"transactional.id"})

_IGNORED = frozenset(_KNOWN - _HONOURED - set(_DAEMON_OWNED) - _REFUSED)

# The partitioners of librdkafka that the client has.
_PARTITIONERS = ("consistent_random", "murmur2_random", "random")


class Settings(NamedTuple):
    """A Producer's configuration, read."""

    endpoint: str | None
    client_id: str | None
    linger_ms: int | None
    partitioner: str
    max_messages: int
    propagation_ms: int
    only_errors: bool
    on_delivery: DeliveryCallback | None
    message_timeout_ms: int | None
    check: SettingsCheck


def read_settings(config: Mapping[str, Any]) -> Settings:
    """The configuration as confluent-kafka takes it; KafkaException(_INVALID_ARG) as it would raise it."""
    config = dict(config)
    topic_config = config.pop("default.topic.config", None) or {}
    config = {**topic_config, **config}
    for name in config:
        if name not in _KNOWN and name not in _HONOURED:
            raise invalid_arg(f'No such configuration property: "{name}"')
    if config.get("transactional.id"):
        raise KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED,
                                        "transactions are not supported by kafka-sidecar (transactional.id)"))
    on_delivery = config.get("on_delivery")
    if on_delivery is not None and not callable(on_delivery):
        raise invalid_arg("on_delivery requires a callable object")

    def number(names: tuple[str, ...], low: int, high: int) -> int | None:
        """The number given for a property (``names[0]``, or an alias of it: the last given wins, as in
        librdkafka), whole (a fraction rounds up, see whole_ms), None if none was."""
        value = None
        for name, given in config.items():
            if name in names:
                try:
                    value = whole_ms(given)
                except (TypeError, ValueError, OverflowError):
                    value = None
                if value is None:
                    raise invalid_arg(f'Invalid value for configuration property "{names[0]}"')
                if not low <= value <= high:
                    raise invalid_arg(f'Configuration property "{names[0]}" value {value} is outside allowed range '
                                   f"{low}..{high}\n")
        return value

    partitioner = str(config.get("partitioner", "consistent_random"))
    if partitioner not in _PARTITIONERS:
        raise invalid_arg(f'Invalid value "{partitioner}" for configuration property "partitioner": kafka-sidecar '
                       f"has {', '.join(_PARTITIONERS)}")
    only_errors = str(config.get("delivery.report.only.error", False)).lower()
    if only_errors not in ("true", "false"):
        raise invalid_arg('Invalid value for configuration property "delivery.report.only.error"')
    try:
        check = SettingsCheck({kafka_name: (name, config[name]) for name, kafka_name in _DAEMON_OWNED.items()
                               if name in config})
    except ValueError as exc:
        raise invalid_arg(str(exc)) from None
    endpoint = config.get("sidecar.endpoint")
    client_id = config.get("client.id")
    max_messages = number(("queue.buffering.max.messages",), 0, 2**31 - 1)
    propagation = number(("topic.metadata.propagation.max.ms",), 0, 3_600_000)
    return Settings(endpoint=None if endpoint is None else str(endpoint),
                     client_id=None if client_id is None else str(client_id),
                     linger_ms=number(("queue.buffering.max.ms", "linger.ms"), 0, 900_000),
                     partitioner=partitioner,
                     max_messages=100_000 if max_messages is None else max_messages,
                     propagation_ms=30_000 if propagation is None else propagation,
                     only_errors=only_errors == "true", on_delivery=on_delivery,
                     message_timeout_ms=number(("message.timeout.ms", "delivery.timeout.ms"), 0, 2**31 - 1),
                     check=check)

