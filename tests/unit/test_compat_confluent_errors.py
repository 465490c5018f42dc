"""confluent-kafka's errors on kafka-sidecar (client_stub.compat.confluent.errors): its own classes where it is
installed, a stand-in of librdkafka's codes, names and descriptions, and the code each error of kafka-sidecar's is
reported with. confluent-kafka is installed with the dev extra: its classes and messages are the reference."""

from __future__ import annotations

import confluent_kafka

from client_stub import errors
from client_stub.compat import confluent
from client_stub.compat.confluent.errors import _OwnKafkaError, as_kafka_error


def test_the_error_classes_are_confluent_kafkas_when_it_is_installed() -> None:
    # The application's own except clauses and isinstance checks hold.
    assert confluent.KafkaError is confluent_kafka.KafkaError
    assert confluent.KafkaException is confluent_kafka.KafkaException


def test_kafka_error_has_librdkafkas_codes_names_and_descriptions() -> None:
    # The stand-in used where confluent-kafka is not installed.
    own = _OwnKafkaError
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
        assert as_kafka_error(ours).code() == code, ours
    # A broker's error reads as librdkafka's; a local one says what happened after it.
    assert as_kafka_error(cases[0][0]).str() == "Broker: Unknown topic or partition"
    assert as_kafka_error(cases[2][0]).str() == "Local: Message timed out: Expiring 3 record(s)"
