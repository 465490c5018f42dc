"""confluent-kafka's configuration on kafka-sidecar (client_stub.compat.confluent.settings): taken and refused as
confluent-kafka takes and refuses it, and as docs/migration/confluent-kafka.md lists it. confluent-kafka is
installed with the dev extra: its Producer is the reference. No daemon is needed: a producer connects on its first
record."""

from __future__ import annotations

import confluent_kafka
import pytest

from client_stub.compat import confluent
from client_stub.compat.confluent import settings
from tests.support.migration_pages import MIGRATION, settings_tables


@pytest.mark.parametrize("config", [
    {"bogus.setting": 1},
    {"linger.ms": "soon"},
    {"linger.ms": 5, "queue.buffering.max.ms": -1},
    {"on_delivery": 5},
    {"partitioner": "nobody's"},
], ids=lambda c: ",".join(c))
def test_a_bad_configuration_raises_as_confluent_kafka_does(config) -> None:
    with pytest.raises(confluent_kafka.KafkaException) as theirs:
        confluent_kafka.Producer(config)
    with pytest.raises(confluent.KafkaException) as ours:
        confluent.Producer(config)
    [their_error], [our_error] = theirs.value.args, ours.value.args
    assert our_error.code() == their_error.code() == confluent.KafkaError._INVALID_ARG
    if "partitioner" not in config:
        assert our_error.str() == their_error.str()


def test_configuration_as_confluent_kafka_takes_it() -> None:
    # A dict, keywords, or both; the settings of the topic, and every property librdkafka knows, accepted.
    confluent.Producer({"bootstrap.servers": "b:9092"}, **{"linger.ms": 10, "client.id": "c"})
    confluent.Producer(**{"bootstrap.servers": "b:9092", "group.id": "consumers' own", "statistics.interval.ms": 0})
    confluent.Producer({"default.topic.config": {"acks": "all", "message.timeout.ms": 1000}})
    with pytest.raises(confluent.KafkaException, match="transactions are not supported"):
        confluent.Producer({"transactional.id": "t"})
    # Daemon-owned values that cannot be read are refused now, not warned of later.
    with pytest.raises(confluent.KafkaException, match='"compression.codec"'):
        confluent.Producer({"compression.codec": "brotli"})


@pytest.mark.parametrize("config", [
    {"enable.idempotence": 1}, {"enable.idempotence": "0"}, {"enable.idempotence": "True"},
    {"linger.ms": 0.5}, {"linger.ms": "2.5"}, {"retries": "3"}, {"retries": 2.5},
], ids=lambda c: ",".join(f"{k}={v!r}" for k, v in c.items()))
def test_values_librdkafka_takes_are_taken(config) -> None:
    confluent_kafka.Producer(config)  # librdkafka takes it: so must the adapter
    confluent.Producer(config)


def test_a_fraction_of_a_millisecond_lingers_a_whole_one() -> None:
    assert settings.read_settings({"linger.ms": 0.5}).linger_ms == 1
    assert settings.read_settings({"linger.ms": "2.5"}).linger_ms == 3
    assert settings.read_settings({"linger.ms": 0}).linger_ms == 0


def test_the_settings_table_of_the_confluent_page_is_the_code_s() -> None:
    ignored, honoured, owned = settings_tables(MIGRATION / "confluent-kafka.md")
    assert ignored == settings._IGNORED
    assert honoured == settings._HONOURED | settings._REFUSED
    assert owned == set(settings._DAEMON_OWNED)
