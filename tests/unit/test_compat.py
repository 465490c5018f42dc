"""The drop-in producers' names, codes, settings and errors, against the libraries they stand in for.

confluent-kafka and kafka-python are installed with the dev extra: their own classes and messages are the
reference. No daemon is needed: a producer connects on its first record.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import confluent_kafka
import kafka
import kafka.errors
import pytest

from client_stub import errors
from client_stub.compat import DaemonSettingWarning, confluent, kafka_python
from client_stub.compat._settings import SettingsCheck
from client_stub.contract import ipc

ROOT = Path(__file__).parents[2]
SETTINGS = ipc.WelcomeSettings(max_request_size=1048576, linger_ms=5, max_block_ms=60000, delivery_timeout_ms=120000,
                               buffer_memory=32 << 20, heartbeat_interval_ms=3000, acks=-1, compression_type="none",
                               enable_idempotence=True, retries=2**31 - 1, batch_size=16384, request_timeout_ms=30000,
                               max_in_flight_requests_per_connection=5, retry_backoff_ms=100,
                               allow_auto_create_topics=True)


# -- confluent-kafka ------------------------------------------------------------------------------------------


def test_the_error_classes_are_confluent_kafkas_when_it_is_installed() -> None:
    # The application's own except clauses and isinstance checks hold.
    assert confluent.KafkaError is confluent_kafka.KafkaError
    assert confluent.KafkaException is confluent_kafka.KafkaException


def test_kafka_error_has_librdkafkas_codes_names_and_descriptions() -> None:
    # The stand-in used where confluent-kafka is not installed.
    own = confluent._OwnKafkaError
    theirs = {name: code for name, code in vars(confluent_kafka.KafkaError).items() if type(code) is int}
    ours = {name: code for name, code in vars(own).items() if type(code) is int and not name.startswith("__")}
    assert ours == theirs
    for code in ours.values():
        assert (own(code).name(), own(code).str()) == (
            confluent_kafka.KafkaError(code).name(), confluent_kafka.KafkaError(code).str())
    assert str(own(3)) == str(confluent_kafka.KafkaError(3))
    assert str(own(-192, "why")) == str(confluent_kafka.KafkaError(-192, "why"))
    # Compared with codes, as confluent-kafka's users do.
    assert own(3) == own.UNKNOWN_TOPIC_OR_PART == 3
    assert own(3) == own(3) != own(-192)


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
    assert confluent._read_settings({"linger.ms": 0.5}).linger_ms == 1
    assert confluent._read_settings({"linger.ms": "2.5"}).linger_ms == 3
    assert confluent._read_settings({"linger.ms": 0}).linger_ms == 0


def test_sidecar_errors_map_to_confluent_kafka_codes() -> None:
    cases = [
        (errors.for_code(3, "topic t: UNKNOWN_TOPIC_OR_PARTITION"), confluent.KafkaError.UNKNOWN_TOPIC_OR_PART),
        (errors.for_code(29), confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED),
        (errors.KafkaTimeoutError("Expiring 3 record(s)"), confluent.KafkaError._MSG_TIMED_OUT),
        (errors.BufferExhaustedError("no memory"), confluent.KafkaError._QUEUE_FULL),
        (errors.RecordTooLargeError("too large"), confluent.KafkaError.MSG_SIZE_TOO_LARGE),
        (errors.SidecarUnavailableError("no daemon"), confluent.KafkaError._TRANSPORT),
        (errors.ProducerClosedError("closed"), confluent.KafkaError._PURGE_QUEUE),
        (errors.SslAuthenticationError("untrusted"), confluent.KafkaError._SSL),
        (errors.KafkaError("else"), confluent.KafkaError._FAIL),
    ]
    for ours, code in cases:
        assert confluent._error(ours).code() == code, ours
    # A broker's error reads as librdkafka's; a local one says what happened after it.
    assert confluent._error(cases[0][0]).str() == "Broker: Unknown topic or partition"
    assert confluent._error(cases[2][0]).str() == "Local: Message timed out: Expiring 3 record(s)"


def test_the_settings_table_of_the_confluent_page_is_the_code_s() -> None:
    ignored, honoured, owned = _page_tables(ROOT / "docs/migration/confluent-kafka.md")
    assert ignored == confluent._IGNORED
    assert honoured == confluent._HONOURED | confluent._REFUSED
    assert owned == set(confluent._DAEMON_OWNED)


# -- kafka-python ---------------------------------------------------------------------------------------------


def test_error_classes_are_kafka_pythons() -> None:
    for name, ours in kafka_python._OWN_ERRORS.items():
        # Installed, kafka-python's own classes are the module's; the stand-ins have their names and hierarchy.
        theirs = getattr(kafka.errors, name)
        assert getattr(kafka_python, name) is theirs
        assert (ours.retriable, ours.invalid_metadata) == (theirs.retriable, theirs.invalid_metadata), ours
        assert [b.__name__ for b in ours.__bases__] == [b.__name__ for b in theirs.__bases__], ours
        if issubclass(ours, kafka_python._OWN_ERRORS["BrokerResponseError"]):
            assert (ours.errno, ours.message) == (theirs.errno, theirs.message), ours
            assert ours.description == theirs.description or theirs.description is None, ours
            assert str(ours("t")) == str(theirs("t"))
    assert str(kafka_python._OWN_ERRORS["KafkaTimeoutError"]("late")) == str(kafka.errors.KafkaTimeoutError("late"))
    assert kafka_python.for_code is kafka.errors.for_code


def test_sidecar_errors_map_to_kafka_python_classes() -> None:
    cases = [
        (errors.for_code(3), kafka_python.UnknownTopicOrPartitionError),
        (errors.for_code(10), kafka_python.MessageSizeTooLargeError),
        (errors.for_code(15), kafka.errors.CoordinatorNotAvailableError),  # kafka.errors' full table, retriable
        (errors.for_code(133), kafka_python.UnknownError),
        (errors.KafkaTimeoutError("Expiring 3 record(s)"), kafka_python.KafkaTimeoutError),
        (errors.BufferExhaustedError("no memory"), kafka_python.KafkaTimeoutError),
        (errors.SidecarUnavailableError("no daemon"), kafka_python.KafkaTimeoutError),
        (errors.RecordTooLargeError("too large"), kafka_python.MessageSizeTooLargeError),
        (errors.ProducerClosedError("closed"), kafka_python.IllegalStateError),
        (errors.NetworkError("reset"), kafka_python.KafkaConnectionError),
        (errors.KafkaError("else"), kafka_python.KafkaError),
    ]
    for ours, cls in cases:
        mapped = kafka_python._error(ours)
        assert type(mapped) is cls or (cls is kafka_python.UnknownError and isinstance(mapped, cls)), ours
        assert mapped.__cause__ is ours
        assert mapped.retriable == cls.retriable


def test_configuration_as_kafka_python_takes_it() -> None:
    with pytest.raises(ValueError) as theirs:
        kafka.KafkaProducer(bootstrap_servers="b:9092", linger=5)
    with pytest.raises(ValueError) as ours:
        kafka_python.KafkaProducer(bootstrap_servers="b:9092", linger=5)
    assert str(ours.value) == str(theirs.value)
    for refused in ({"transactional_id": "fizzbuzz"}, {"partitioner": lambda key, all, available: 0}):
        with pytest.raises(kafka_python.KafkaConfigurationError, match="is not supported by kafka-sidecar"):
            kafka_python.KafkaProducer(**refused)
    with pytest.raises(ValueError, match='"compression_type"'):
        kafka_python.KafkaProducer(compression_type="brotli")
    kafka_python.KafkaProducer(bootstrap_servers=["b:9092"], security_protocol="SSL", buffer_memory=1 << 20,
                               api_version=(2, 8), retries=float("inf")).close()
    # Values kafka-python takes as they are: a boolean as 1, milliseconds as floats.
    kafka_python.KafkaProducer(enable_idempotence=1, linger_ms=0.5, max_block_ms=2500.0).close()
    with pytest.raises(kafka_python.KafkaConfigurationError, match="numbers of milliseconds"):
        kafka_python.KafkaProducer(linger_ms="soon")


def test_the_serializers_are_kafka_pythons() -> None:
    for ours, theirs, values in (
            (kafka_python.JsonSerializer(), kafka.JsonSerializer(), [{"a": [1, "b"]}, "text", 3.5, None]),
            (kafka_python.DefaultSerializer(), kafka.DefaultSerializer(), ["text", "\u00e9t\u00e9", b"bytes", None]),
            (kafka_python.DefaultSerializer("latin-1"), kafka.DefaultSerializer("latin-1"), ["\u00e9t\u00e9"])):
        assert [ours.serialize("t", [], value) for value in values] == [theirs.serialize("t", [], value)
                                                                         for value in values]


def test_the_settings_table_of_the_kafka_python_page_is_the_code_s() -> None:
    ignored, honoured, owned = _page_tables(ROOT / "docs/migration/kafka-python.md")
    assert ignored == kafka_python._IGNORED
    assert honoured == kafka_python._HONOURED | kafka_python._REFUSED
    assert owned == set(kafka_python._DAEMON_OWNED)
    # Every setting kafka-python's KafkaProducer has is one of them.
    assert set(kafka.KafkaProducer.DEFAULT_CONFIG) <= ignored | honoured | owned


# -- the daemon's settings ----------------------------------------------------------------------------------


def test_a_setting_the_daemon_owns_is_checked_once_its_value_is_known() -> None:
    check = SettingsCheck({"acks": ("acks", "all"), "batch.size": ("batch_size", 32768),
                           "compression.type": ("compression_type", None), "retries": ("retries", 3)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check.check(None)  # the daemon has not said yet
        check.check(SETTINGS._replace(retries=None))  # a daemon of an earlier release does not say retries
        check.check(SETTINGS)  # checked once
    assert [str(w.message).split(" is not")[0] for w in caught if w.category is DaemonSettingWarning] == [
        "batch_size=32768"]


def _page_tables(page: Path) -> tuple[set[str], set[str], set[str]]:
    """The settings a migration page lists: with no meaning here, honoured (or refused), and the daemon's (each
    table's first column, in backquotes)."""
    text = page.read_text()
    tables = {}
    for heading in ("Settings with no meaning here", "Settings honoured", "Settings the daemon owns"):
        section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
        tables[heading] = {name for row in re.findall(r"^\|([^|\n]+)\|", section, re.M)
                           for name in re.findall(r"`([^`]+)`", row)}
    return (tables["Settings with no meaning here"], tables["Settings honoured"],
            tables["Settings the daemon owns"])


def test_list_topics_without_a_topic_raises_transport_when_no_daemon_answers(tmp_path) -> None:
    producer = confluent.Producer({"sidecar.endpoint": f"ipc://{tmp_path}/nobody.sock"})
    try:
        with pytest.raises(confluent.KafkaException) as refused:
            producer.list_topics(timeout=0.3)
        assert refused.value.args[0].code() == confluent.KafkaError._TRANSPORT
        assert "no kafka-sidecar daemon answered" in refused.value.args[0].str()
    finally:
        producer.close()


class _NumpyLikeInt:
    """An integer that is not an int (as numpy's int64): it has __index__."""

    def __index__(self) -> int:
        return -1


def test_produce_takes_any_integer_for_the_partition(tmp_path) -> None:
    # Taken for its value, not its type; the record waits here for a daemon, till its message.timeout.ms.
    producer = confluent.Producer({"sidecar.endpoint": f"ipc://{tmp_path}/nobody.sock", "message.timeout.ms": 300})
    try:
        producer.produce("t", b"v", partition=_NumpyLikeInt())  # type: ignore[arg-type]
        assert len(producer) == 1
        with pytest.raises(confluent.KafkaException) as refused:
            producer.produce("t", b"v", partition="0")  # type: ignore[arg-type]
        assert refused.value.args[0].code() == confluent.KafkaError._INVALID_ARG
    finally:
        assert producer.close()
    assert len(producer) == 0
