"""kafka-python's drop-in producer's names, settings and errors, against kafka-python's, and the daemon's settings
both drop-in producers check (confluent-kafka's: test_compat_confluent_*.py).

kafka-python is installed with the dev extra: its own classes and messages are the reference. No daemon is needed:
a producer connects on its first record.
"""

from __future__ import annotations

import warnings

import kafka
import kafka.errors
import pytest

from client_stub import errors
from client_stub.compat import DaemonSettingWarning, kafka_python
from client_stub.compat._settings import SettingsCheck
from client_stub.contract import ipc
from tests.support.migration_pages import MIGRATION, settings_tables

SETTINGS = ipc.WelcomeSettings(max_request_size=1048576, linger_ms=5, max_block_ms=60000, delivery_timeout_ms=120000,
                               buffer_memory=32 << 20, heartbeat_interval_ms=3000, acks=-1, compression_type="none",
                               enable_idempotence=True, retries=2**31 - 1, batch_size=16384, request_timeout_ms=30000,
                               max_in_flight_requests_per_connection=5, retry_backoff_ms=100,
                               allow_auto_create_topics=True)


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
    ignored, honoured, owned = settings_tables(MIGRATION / "kafka-python.md")
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
