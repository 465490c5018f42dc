"""Kafka's error code table and the exception families built on it."""

from __future__ import annotations

import inspect
import pickle

import kafka.errors
import pytest

from client_stub.errors import (
    ERROR_CODES,
    ERRORS_BY_NAME,
    AuthorizationError,
    BrokerError,
    BufferExhaustedError,
    ConfigError,
    InvalidMetadataError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    ProducerStateError,
    RecordTooLargeError,
    RetriableError,
    error_code,
    for_code,
)


def test_codes_and_names_are_unique() -> None:
    assert all(code == row.code for code, row in ERROR_CODES.items())
    names = [row.name for row in ERROR_CODES.values()]
    assert len(names) == len(set(names))
    assert {row.name: row for row in ERROR_CODES.values()} == ERRORS_BY_NAME
    # Kafka numbers its errors densely from -1 (UNKNOWN_SERVER_ERROR) up.
    assert sorted(ERROR_CODES) == list(range(-1, max(ERROR_CODES) + 1))


@pytest.mark.parametrize(("code", "name"), [(6, "NOT_LEADER_OR_FOLLOWER"), (3, "UNKNOWN_TOPIC_OR_PARTITION"),
                                            (5, "LEADER_NOT_AVAILABLE")])
def test_stale_metadata_errors(code: int, name: str) -> None:
    row = error_code(code)
    assert row.name == name
    assert row.retriable and row.invalid_metadata
    err = for_code(code)
    assert isinstance(err, InvalidMetadataError) and isinstance(err, RetriableError)
    assert err.retriable and err.code == code and err.name == name


def test_request_timed_out() -> None:
    row = error_code(7)
    assert row.name == "REQUEST_TIMED_OUT" and row.retriable and not row.invalid_metadata
    err = for_code(7)
    assert isinstance(err, KafkaTimeoutError) and isinstance(err, RetriableError) and err.retriable


def test_message_too_large() -> None:
    err = for_code(10)
    assert err.name == "MESSAGE_TOO_LARGE"
    assert isinstance(err, RecordTooLargeError) and not isinstance(err, RetriableError)
    assert not err.retriable


def test_topic_authorization_failed() -> None:
    err = for_code(ERRORS_BY_NAME["TOPIC_AUTHORIZATION_FAILED"].code)
    assert err.code == 29
    assert isinstance(err, AuthorizationError) and not err.retriable


@pytest.mark.parametrize(("code", "name"), [(45, "OUT_OF_ORDER_SEQUENCE_NUMBER"), (46, "DUPLICATE_SEQUENCE_NUMBER")])
def test_sequence_errors(code: int, name: str) -> None:
    err = for_code(code)
    assert isinstance(err, ProducerStateError)
    assert err.name == name and not err.retriable


def test_network_exception_is_retriable_and_stale() -> None:
    err = for_code(13)
    assert isinstance(err, NetworkError) and err.retriable and error_code(13).invalid_metadata


@pytest.mark.parametrize(("code", "name", "retriable"), [
    (130, "STREAMS_INVALID_TOPOLOGY", False),         # StreamsInvalidTopologyException extends ApiException
    (131, "STREAMS_INVALID_TOPOLOGY_EPOCH", False),   # StreamsInvalidTopologyEpochException too
    (132, "STREAMS_TOPOLOGY_FENCED", False),          # StreamsTopologyFencedException too
    (133, "SHARE_SESSION_LIMIT_REACHED", True),       # ShareSessionLimitReachedException: a RetriableException
])
def test_the_codes_kafka_4_1_added(code: int, name: str, retriable: bool) -> None:
    # The last rows of Kafka 4.1's Errors.java, which kafka-python's table does not have yet.
    row = error_code(code)
    assert (row.name, row.retriable, row.invalid_metadata) == (name, retriable, False)
    assert ERRORS_BY_NAME[name] is row
    assert isinstance(for_code(code), RetriableError) == retriable


def test_unknown_code() -> None:
    row = error_code(4242)
    assert row.code == 4242 and not row.retriable and not row.invalid_metadata
    err = for_code(4242, "who knows")
    assert type(err) is BrokerError
    assert err.code == 4242 and "4242" in err.name and not err.retriable
    assert "4242" in str(err) and "who knows" in str(err)


def test_message_and_str() -> None:
    err = for_code(10, "the batch is 2 MB")
    assert err.message == "the batch is 2 MB"
    assert str(err) == "MESSAGE_TOO_LARGE (10): the batch is 2 MB"
    assert str(for_code(10)) == "MESSAGE_TOO_LARGE (10)"
    assert str(for_code(10, None)) == "MESSAGE_TOO_LARGE (10)"
    # Errors that are not the broker's show their message, or their class name.
    assert str(BufferExhaustedError("no block within 60000 ms")) == "no block within 60000 ms"
    assert str(ConfigError()) == "ConfigError"


def test_retriable_flag_matches_the_family() -> None:
    for row in ERROR_CODES.values():
        err = for_code(row.code)
        assert type(err) is row.exception
        assert err.retriable == row.retriable, row.name
        if row.invalid_metadata:
            assert row.retriable and isinstance(err, (InvalidMetadataError, NetworkError)), row.name
        if isinstance(err, InvalidMetadataError):
            assert row.invalid_metadata, row.name
        # One exception to "retriable == RetriableError": CORRUPT_MESSAGE is retried (as in the Java
        # client) yet grouped with the other record errors.
        if row.name != "CORRUPT_MESSAGE":
            assert isinstance(err, RetriableError) == row.retriable, row.name


def _same(a: KafkaError, b: KafkaError) -> None:
    assert type(a) is type(b)
    assert (a.code, a.name, a.retriable, a.message, str(a), a.args) == \
        (b.code, b.name, b.retriable, b.message, str(b), b.args)


@pytest.mark.parametrize("code", sorted(ERROR_CODES) + [4242])
def test_broker_errors_survive_pickling(code: int) -> None:
    err = for_code(code, f"message for {code}")
    _same(pickle.loads(pickle.dumps(err)), err)


@pytest.mark.parametrize("err", [
    BufferExhaustedError("no room"),
    ConfigError("bad acks"),
    RetriableError("forced", retriable=False),
    RecordTooLargeError("big", code=10, name="MESSAGE_TOO_LARGE"),
    KafkaError(),
], ids=lambda e: type(e).__name__)
def test_client_errors_survive_pickling(err: KafkaError) -> None:
    copy = pickle.loads(pickle.dumps(err, protocol=pickle.HIGHEST_PROTOCOL))
    _same(copy, err)
    if isinstance(err, ConfigError):
        assert isinstance(copy, ValueError)


# -- kafka-python's table ----------------------------------------------------------------------

def _kafka_python_table() -> dict[int, set[type]]:
    table: dict[int, set[type]] = {}
    for obj in vars(kafka.errors).values():
        if inspect.isclass(obj) and issubclass(obj, kafka.errors.BrokerResponseError) \
                and getattr(obj, "errno", None) is not None:
            table.setdefault(obj.errno, set()).add(obj)
    return table


KAFKA_PYTHON = _kafka_python_table()

# Where kafka-python still uses a name Kafka has since changed; ours follow Kafka's Errors.java.
KAFKA_PYTHON_OLD_NAMES = {
    -1: "UNKNOWN",                          # UNKNOWN_SERVER_ERROR
    0: "NO_ERROR",                          # NONE
    6: "NOT_LEADER_FOR_PARTITION",          # renamed NOT_LEADER_OR_FOLLOWER by KIP-392
    10: "MESSAGE_SIZE_TOO_LARGE",           # MESSAGE_TOO_LARGE
    17: "INVALID_TOPIC",                    # INVALID_TOPIC_EXCEPTION
    39: "INVALID_REPLICATION_ASSIGNMENT",   # INVALID_REPLICA_ASSIGNMENT
}
# Where kafka-python's flags depart from the Java client's hierarchy, which ours follow.
KAFKA_PYTHON_NOT_RETRIABLE = {2}           # CorruptRecordException is a RetriableException
KAFKA_PYTHON_STALE_METADATA = {75}         # UnknownLeaderEpochException is not an InvalidMetadataException


def test_kafka_python_table_is_there() -> None:
    assert len(set(KAFKA_PYTHON) & set(ERROR_CODES)) > 100


@pytest.mark.parametrize("code", sorted(set(KAFKA_PYTHON) & set(ERROR_CODES)))
def test_names_agree_with_kafka_python(code: int) -> None:
    theirs = {cls.message for cls in KAFKA_PYTHON[code]}
    assert len(theirs) == 1
    (name,) = theirs
    if code in KAFKA_PYTHON_OLD_NAMES:
        assert name == KAFKA_PYTHON_OLD_NAMES[code] != ERROR_CODES[code].name
    else:
        assert name == ERROR_CODES[code].name


@pytest.mark.parametrize("code", sorted(set(KAFKA_PYTHON) & set(ERROR_CODES)))
def test_flags_agree_with_kafka_python(code: int) -> None:
    (retriable,) = {cls.retriable for cls in KAFKA_PYTHON[code]}
    (stale,) = {cls.invalid_metadata for cls in KAFKA_PYTHON[code]}
    row = ERROR_CODES[code]
    assert row.retriable == (not retriable if code in KAFKA_PYTHON_NOT_RETRIABLE else retriable)
    assert row.invalid_metadata == (not stale if code in KAFKA_PYTHON_STALE_METADATA else stale)
