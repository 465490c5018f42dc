"""perf-test adapters for the anchor producers: confluent-kafka and kafka-python.

Each ``make_*_client(options)`` returns an object with send / poll / flush /
undelivered / close, as ``service.tools.perf_test.Client`` asks; ``options`` is ``{"config": {...}}``, the
producer's own configuration. ``client_options(client, ...)`` maps the benchmark's
settings (acks=all, idempotence, linger.ms, batch.size, compression) onto each
client's configuration, so that all three run the same producer settings.

The client libraries are imported by ``prepare()`` (which perf-test's workers call
before they report ready), not at import time, so that merely importing this module
(the benchmark's parent does) loads neither.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from service.tools.perf_test import Client, DeliveryCallback

CLIENTS = ("kafka-sidecar", "confluent-kafka", "kafka-python")

ADAPTERS = {
    "kafka-sidecar": "service.tools.perf_test:make_sidecar_client",
    "confluent-kafka": "tests.perf.clients:make_confluent_client",
    "kafka-python": "tests.perf.clients:make_kafka_python_client",
}

# The module each client's prepare() imports: what a forkserver preloads for its workers (perf_test.run).
LIBRARIES = {"kafka-sidecar": "client_stub", "confluent-kafka": "confluent_kafka", "kafka-python": "kafka"}

# librdkafka's local queue holds at most this many records (default 100000): large, so that the
# queue never caps throughput; produce() raising BufferError is handled all the same.
CONFLUENT_QUEUE_MAX_MESSAGES = 2_000_000


@dataclass(frozen=True)
class Security:
    """The security every client of a secured run uses: ``protocol`` (SSL, SASL_PLAINTEXT, SASL_SSL),
    the CA that signed the broker's certificate (TLS), and the SASL mechanism and account (SASL)."""

    protocol: str
    ca: str | None = None
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def kafka_python_supports_idempotence() -> bool:
    """Whether the installed kafka-python has ``enable_idempotence`` (2.1 and later do)."""
    from kafka import KafkaProducer

    return "enable_idempotence" in KafkaProducer.DEFAULT_CONFIG


def kafka_python_supports_sasl_mechanism(mechanism: str) -> bool:
    """Whether the installed kafka-python can authenticate with SASL ``mechanism``."""
    try:
        from kafka.net.sasl import get_sasl_mechanism  # kafka-python 3
    except ImportError:
        try:
            from kafka.sasl import get_sasl_mechanism  # kafka-python 2.1 and 2.2
        except ImportError:
            return mechanism in ("PLAIN", "GSSAPI", "OAUTHBEARER")  # older releases: these only
    try:
        get_sasl_mechanism(mechanism)
    except Exception:
        return False
    return True


def librdkafka_security(security: Security | None) -> dict[str, str]:
    """librdkafka's (confluent-kafka's) settings for ``security``, as the security tests write them."""
    if security is None:
        return {}
    from tests.support.secure_proxy import librdkafka_settings

    settings = librdkafka_settings("", security.protocol, ca_location=security.ca,  # type: ignore[arg-type]
                                   mechanism=security.mechanism, username=security.username,
                                   password=security.password)
    del settings["bootstrap.servers"]
    return settings


def client_options(client: str, *, bootstrap: str, compression: str = "none", linger_ms: int = 5,
                   batch_size: int = 16384, endpoint: str | None = None,
                   security: Security | None = None, callbacks: bool = True) -> dict[str, Any]:
    """The adapter options of ``client`` for the benchmark's producer settings.

    kafka-sidecar's settings are the daemon's (see ``sidecar_settings``); its client
    takes only the endpoint (and a long max_block_ms: a full pool blocks, as a full
    buffer does in the others). ``security`` (None: PLAINTEXT) is added to the others'.
    Without ``callbacks`` (records sent without a delivery callback), librdkafka reports
    failed deliveries only (``delivery.report.only.error``), so that none runs per record.
    """
    if client == "kafka-sidecar":
        return {"endpoint": endpoint, "producer": {"max_block_ms": 120_000}}
    if client == "confluent-kafka":
        return {"config": {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "batch.size": batch_size,
            "compression.type": compression,
            "queue.buffering.max.messages": CONFLUENT_QUEUE_MAX_MESSAGES,
            # Java's partitioner, as kafka-sidecar and kafka-python use: the same keys land in the
            # same partitions for all three.
            "partitioner": "murmur2_random",
            # A librdkafka batch is at most message.max.bytes (its default: 1000000) as well as batch.size.
            "message.max.bytes": max(batch_size, 1_000_000),
            **({} if callbacks else {"delivery.report.only.error": True}),
            **librdkafka_security(security),
        }}
    if client == "kafka-python":
        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "acks": "all",
            "linger_ms": linger_ms,
            "batch_size": batch_size,
            "compression_type": None if compression == "none" else compression,
        }
        if kafka_python_supports_idempotence():
            config["enable_idempotence"] = True
        if security is not None:
            config["security_protocol"] = security.protocol
            if security.tls:
                config["ssl_cafile"] = security.ca
                config["ssl_check_hostname"] = True  # its default, said aloud as for librdkafka
            if security.sasl:
                if not kafka_python_supports_sasl_mechanism(security.mechanism or ""):
                    raise ValueError(f"kafka-python cannot authenticate with {security.mechanism}")
                config.update(sasl_mechanism=security.mechanism, sasl_plain_username=security.username,
                              sasl_plain_password=security.password)
        return {"config": config}
    raise ValueError(f"unknown client {client!r}; one of {', '.join(CLIENTS)}")


def sidecar_settings(*, compression: str = "none", linger_ms: int = 5, batch_size: int = 16384,
                     security: Security | None = None) -> dict[str, str]:
    """The daemon's -X settings for the benchmark's producer settings (and Kafka's security settings, as the
    daemon's users write them: a truststore in PEM, SCRAM by a JAAS line)."""
    settings = {"acks": "all", "enable.idempotence": "true", "linger.ms": str(linger_ms),
                "batch.size": str(batch_size), "compression.type": compression}
    if security is not None:
        settings["security.protocol"] = security.protocol
        if security.tls:
            settings["ssl.truststore.location"] = str(security.ca)
        if security.sasl:
            module = "plain.PlainLoginModule" if security.mechanism == "PLAIN" else "scram.ScramLoginModule"
            settings["sasl.mechanism"] = str(security.mechanism)
            settings["sasl.jaas.config"] = (f"org.apache.kafka.common.security.{module} required "
                                            f'username="{security.username}" password="{security.password}";')
    return settings


def make_confluent_client(options: dict[str, Any]) -> Client:
    """confluent_kafka.Producer: callbacks run in poll(0), after every send and in flush(). A record sent
    without a callback reports to the producer's own ``on_delivery``, which counts the failures."""
    from confluent_kafka import Producer

    class ConfluentClient:
        def __init__(self) -> None:
            self.failed = 0
            self.producer = Producer({**options["config"], "on_delivery": self._count_failure})
            self._poll = self.producer.poll

        def _count_failure(self, err: Any, _message: Any) -> None:
            if err is not None:
                self.failed += 1

        def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None) -> None:
            while True:
                try:
                    self.producer.produce(topic, value, key, on_delivery=on_delivery)
                    return
                except BufferError:
                    self._poll(0.05)  # the local queue is full: serve delivery reports, retry

        def poll(self) -> None:
            self._poll(0)

        def flush(self) -> None:
            left = self.producer.flush(120)
            if left:
                raise TimeoutError(f"confluent-kafka: {left} records still undelivered after flush(120)")

        def undelivered(self) -> int:
            return self.failed + len(self.producer)

        def close(self) -> None:
            pass  # a librdkafka producer has no close(); flush() was called

    return ConfluentClient()


def make_kafka_python_client(options: dict[str, Any]) -> Client:
    """kafka.KafkaProducer: callbacks run on its sender thread. It counts no failed records (its metrics
    have rates only), so a record sent without a callback gets an errback that counts its failure: it
    runs on failure only, and costs the record one list append."""
    from kafka import KafkaProducer

    class KafkaPythonClient:
        def __init__(self) -> None:
            self.failed = 0
            self.producer = KafkaProducer(**options["config"])

        def _count_failure(self, _exc: Any) -> None:
            self.failed += 1

        def send(self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None) -> None:
            future = self.producer.send(topic, value=value, key=key)
            if on_delivery is None:
                future.add_errback(self._count_failure)
                return
            future.add_callback(on_delivery, None)  # on_delivery(None, metadata)
            future.add_errback(lambda exc: on_delivery(exc, None))

        def poll(self) -> None:
            pass  # delivery reports arrive on the sender thread

        def flush(self) -> None:
            self.producer.flush(timeout=120)

        def undelivered(self) -> int:
            return self.failed

        def close(self) -> None:
            self.producer.close(timeout=30)

    return KafkaPythonClient()


make_confluent_client.prepare = lambda: importlib.import_module(LIBRARIES["confluent-kafka"])  # type: ignore[attr-defined]
make_kafka_python_client.prepare = lambda: importlib.import_module(LIBRARIES["kafka-python"])  # type: ignore[attr-defined]
