"""The client/daemon messages: typed encode/decode, the msgpack layer, topic names, errors on the wire."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_stub import errors
from client_stub.contract import PROTOCOL_VERSION, ipc

# -- pack / unpack --------------------------------------------------------------------------------


SETTINGS = ipc.WelcomeSettings(max_request_size=1048576, linger_ms=5, max_block_ms=60000,
                               delivery_timeout_ms=120000, buffer_memory=32 << 20, heartbeat_interval_ms=3000,
                               acks=-1, compression_type="lz4", enable_idempotence=True, retries=2**31 - 1,
                               batch_size=16384, request_timeout_ms=30000, max_in_flight_requests_per_connection=5,
                               retry_backoff_ms=100, allow_auto_create_topics=False)
RESUME = ipc.Resume("f00d", 3, 16384, 2048,
                    [ipc.SealNotice(9, 0, 2, "orders", 3, 10, 5000, 1_700_000_000_000, 1_700_000_000_010, 40)])
TYPED = [
    ipc.Hello(PROTOCOL_VERSION, 1234, "gunicorn worker", ipc.HelloOptions(linger_ms=5, partitioner="murmur2_random",
                                                                  retriable_topic_errors=True, hello_id=3)),
    ipc.Blocks(7, 3, True, 60000),
    ipc.Release([0, 5, 7]),
    ipc.Metadata("orders"),
    ipc.Heartbeat(),
    ipc.Goodbye(),
    ipc.Stats(),
    ipc.Welcome(PROTOCOL_VERSION, 3, b"\x01" * 16, 16384, 2048, SETTINGS, "f00d", False, 3),
    ipc.Grant(7, [4, 5, 6]),
    ipc.GrantFailed(7, "no 3 free block(s) of the BufferPool in time"),
    ipc.Delivery([ipc.DeliveryReport(1, 0, 10, 2**40, -1, None),
                  ipc.DeliveryReport.failed(2, errors.InvalidRequestError("refused"))], [8, 9]),
    ipc.Topic("orders", 12, [0, 1, 2], None, 4),
    ipc.SealNow(),
    ipc.Error(ipc.ERROR_REFUSED, "refused: \u00fcn\u00efcode"),
    ipc.StatsReport({"producer": {"record-send-total": 12.0, "request-latency-avg": float("inf")},
                     "sidecar": {"blocks-free": 2040.0}, "clients": [[3, 1234, 8]], "held": [[3, 8]]}),
    ipc.LastSeal(),
    ipc.Wakeup(),
    ipc.Shutdown("SIGTERM"),
]


@pytest.mark.parametrize("message", TYPED, ids=lambda m: type(m).__name__)
def test_every_typed_message_round_trips(message: ipc.Message) -> None:
    back = ipc.decode(ipc.encode(message))
    assert type(back) is type(message)
    # Rows inside a message (delivery reports) arrive as lists, read with their class's _make.
    if isinstance(message, ipc.Delivery):
        assert [ipc.DeliveryReport._make(row) for row in back.reports] == message.reports
    else:
        assert back == message


def test_type_numbers_are_the_wire_format() -> None:
    # Changing one is a new protocol version: old clients would read one message as another.
    assert {type(m).__name__: m.TYPE for m in TYPED} == {
        "Hello": 1, "Blocks": 2, "Release": 4, "Metadata": 5, "Heartbeat": 6, "Goodbye": 7, "Stats": 8,
        "LastSeal": 9, "Wakeup": 10, "Welcome": 101, "Grant": 102, "GrantFailed": 103, "Delivery": 104, "Topic": 105,
        "SealNow": 106, "Error": 107, "StatsReport": 108, "Shutdown": 109}
    assert ipc.unpack(ipc.encode(ipc.Blocks(7, 3, True, 60000))) == [2, 7, 3, True, 60000]


def test_handshake_maps_are_by_name() -> None:
    hello = ipc.unpack(ipc.encode(TYPED[0]))
    assert hello[4] == {"linger_ms": 5, "partitioner": "murmur2_random", "resume": None,
                        "retriable_topic_errors": True, "hello_id": 3, "shutdown_notice": False}
    welcome = ipc.unpack(ipc.encode(TYPED[7]))
    assert welcome[6] == SETTINGS._asdict()
    assert welcome[3] == b"\x01" * 16 and welcome[-2:] == [False, 3]


def test_a_resumed_session_travels_in_the_hello_options_as_a_list() -> None:
    hello = ipc.Hello(PROTOCOL_VERSION, 1234, "w", ipc.HelloOptions(resume=[*RESUME[:4], [list(RESUME.sealed[0])]]))
    back = ipc.decode(ipc.encode(hello))
    resume = ipc.Resume._make(back.options.resume)
    assert resume[:4] == RESUME[:4]
    assert [ipc.SealNotice._make(row) for row in resume.sealed] == RESUME.sealed


def test_hello_options_a_client_leaves_out_take_their_defaults_and_unknown_ones_are_ignored() -> None:
    message = ipc.decode(ipc.pack(ipc.Hello.TYPE, PROTOCOL_VERSION, 5, "old", {"linger_ms": 3, "from_the_future": 1}))
    assert message.options == ipc.HelloOptions(linger_ms=3)


def test_welcome_settings_must_all_be_there() -> None:
    settings = SETTINGS._asdict()
    del settings["heartbeat_interval_ms"]
    with pytest.raises(ValueError, match="WELCOME settings lack heartbeat_interval_ms"):
        ipc.decode(ipc.pack(ipc.Welcome.TYPE, PROTOCOL_VERSION, 3, b"token", 16384, 8, settings, "d", False, 1))


def test_welcome_settings_an_earlier_daemon_leaves_out_read_as_not_said() -> None:
    # A daemon of an earlier release sends only the settings it had: those added since read as None.
    added = ipc.WelcomeSettings._field_defaults
    first = {name: value for name, value in SETTINGS._asdict().items() if name not in added}
    welcome = ipc.decode(ipc.pack(ipc.Welcome.TYPE, PROTOCOL_VERSION, 3, b"token", 16384, 8, first, "d", False, 1))
    assert welcome.settings == SETTINGS._replace(**dict.fromkeys(ipc.WelcomeSettings._field_defaults))
    assert welcome.settings.acks is None and welcome.settings.compression_type is None


@pytest.mark.parametrize("fields, error", [
    ([999], "unknown message type 999"),
    ([ipc.Blocks.TYPE, 7, 3, True], "BLOCKS has 4 fields, got 3"),
    ([ipc.SealNow.TYPE, 1], "SEALNOW has 0 fields, got 1"),
    ([ipc.Hello.TYPE, PROTOCOL_VERSION, 5, "x", ["not", "a", "map"]], "HELLO options are a map"),
])
def test_decode_refuses_what_is_no_message_of_the_contract(fields: list[object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ipc.decode(ipc.pack(*fields))


@pytest.mark.parametrize("kind", [ipc.Hello, ipc.Welcome])
@pytest.mark.parametrize("fields", [[99, "other", "fields"], [], ["1"]], ids=["newer", "none", "text"])
def test_a_handshake_of_another_version_is_refused_before_its_fields_are_read(kind: type, fields: list) -> None:
    with pytest.raises(ipc.VersionMismatchError) as refused:
        ipc.decode(ipc.pack(kind.TYPE, *fields))
    assert refused.value.version == (fields[0] if fields else None)


@given(st.integers(min_value=0, max_value=2**63 - 1),
       st.lists(st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
                          st.text(max_size=20), st.binary(max_size=20),
                          st.lists(st.integers(min_value=-5, max_value=5), max_size=4)), max_size=6))
def test_pack_unpack_round_trip(kind: int, fields: list[object]) -> None:
    assert ipc.unpack(ipc.pack(kind, *fields)) == [kind, *fields]


def test_bytes_stay_bytes_and_text_stays_text() -> None:
    kind, blob, text = ipc.unpack(ipc.pack(1, b"\x00\xff", "\u00e9"))
    assert blob == b"\x00\xff" and isinstance(blob, bytes)
    assert text == "\u00e9" and isinstance(text, str)


@pytest.mark.parametrize("data", [
    b"",                                  # nothing
    b"\xc1",                              # a byte msgpack never uses
    b"\x93\x01\x02",                      # an array of 3 cut short
    msgpack.packb([1, 2]) + b"\x01",      # trailing bytes
    b"\xa5hel",                           # a string cut short
    msgpack.packb([1, {1: 2}]),           # a map with non-string keys
], ids=["empty", "reserved-byte", "truncated-array", "extra-data", "truncated-str", "int-map-key"])
def test_unpack_refuses_what_is_not_msgpack(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a msgpack message"):
        ipc.unpack(data)


@pytest.mark.parametrize("value", [5, "HELLO", b"\x01", None, {"kind": 1}, 1.5], ids=repr)
def test_unpack_refuses_what_is_not_an_array(value: object) -> None:
    with pytest.raises(ValueError, match="an array that starts with its type"):
        ipc.unpack(msgpack.packb(value))


def test_unpack_refuses_an_empty_array() -> None:
    with pytest.raises(ValueError, match="an array that starts with its type"):
        ipc.unpack(msgpack.packb([]))


@pytest.mark.parametrize("kind", ["1", b"\x01", 1.0, None, [1], {"a": 1}, True, False], ids=repr)
def test_unpack_refuses_a_type_that_is_not_an_integer(kind: object) -> None:
    # true would otherwise read as HELLO (1) and false as 0.
    with pytest.raises(ValueError, match="an array that starts with its type"):
        ipc.unpack(msgpack.packb([kind, 2]))


@given(st.binary(max_size=40))
def test_unpack_of_any_bytes_gives_a_message_or_value_error(data: bytes) -> None:
    try:
        message = ipc.unpack(data)
    except ValueError:
        return
    assert isinstance(message, list) and message and type(message[0]) is int


# -- topic names ----------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["t", "Orders", "a.b_c-d", "0", "...", "-", "_", "x" * 249,
                                   "__consumer_offsets", "A1.b2_C3-d4"])
def test_check_topic_accepts_kafkas_names(topic: str) -> None:
    assert ipc.check_topic(topic) == topic


@pytest.mark.parametrize("topic", ["", ".", "..", "x" * 250, "a b", "a/b", "a:b", "a*", "caf\u00e9", "\u0663",
                                   "t\n", "\nt", "t\x00", "a,b"],
                         ids=lambda t: repr(t)[:20])
def test_check_topic_refuses_what_kafka_refuses(topic: str) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        ipc.check_topic(topic)


@pytest.mark.parametrize("topic", [None, 5, b"bytes", ["t"]], ids=repr)
def test_check_topic_refuses_non_strings(topic: object) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        ipc.check_topic(topic)


# -- errors on the wire ---------------------------------------------------------------------------


def _error_classes() -> list[type[errors.KafkaError]]:
    return [value for value in vars(errors).values()
            if isinstance(value, type) and issubclass(value, errors.KafkaError)]


def test_every_family_class_is_tried() -> None:
    names = {cls.__name__ for cls in _error_classes()}
    assert {"KafkaError", "RetriableError", "InvalidMetadataError", "BufferExhaustedError", "ConfigError",
            "BrokerError", "ProducerStateError", "RecordTooLargeError"} <= names


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("retriable", [True, False])
def test_error_round_trip_of_every_class(cls: type[errors.KafkaError], retriable: bool) -> None:
    error = cls("what happened", code=42, name="SOME_ERROR", retriable=retriable)
    wire = ipc.error_to_wire(error)
    # It crosses the socket as msgpack.
    back = ipc.error_from_wire(ipc.unpack(ipc.pack(ipc.Error.TYPE, wire))[1])
    assert type(back) is cls
    assert (back.message, back.code, back.name, back.retriable) == ("what happened", 42, "SOME_ERROR", retriable)
    assert str(back) == str(error)


def test_error_round_trip_of_every_kafka_error_code() -> None:
    for code in errors.ERROR_CODES:
        error = errors.for_code(code, f"message {code}")
        back = ipc.error_from_wire(ipc.error_to_wire(error))
        assert type(back) is type(error)
        assert (back.code, back.name, back.retriable, back.message) == (code, error.name, error.retriable,
                                                                        f"message {code}")


def test_error_round_trip_without_a_code() -> None:
    back = ipc.error_from_wire(ipc.error_to_wire(errors.BufferExhaustedError("no room")))
    assert isinstance(back, errors.BufferExhaustedError) and isinstance(back, errors.RetriableError)
    assert back.code is None and back.name == "BufferExhaustedError" and back.retriable


@pytest.mark.parametrize("class_name", ["NoSuchError", "ErrorCode", "dataclass",
                                        "Exception", "ValueError", "", 17])
def test_error_of_an_unknown_class_arrives_as_kafka_error(class_name: object) -> None:
    back = ipc.error_from_wire([class_name, 35, "UNSUPPORTED_VERSION", "from a newer daemon", True])
    assert type(back) is errors.KafkaError
    assert (back.code, back.name, back.message, back.retriable) == (35, "UNSUPPORTED_VERSION",
                                                                    "from a newer daemon", True)


def test_no_error_is_none_on_the_wire() -> None:
    assert ipc.error_to_wire(None) is None
    assert ipc.error_from_wire(None) is None


def test_default_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ipc.ENDPOINT_ENV, raising=False)
    assert ipc.default_endpoint() == ipc.DEFAULT_ENDPOINT
    monkeypatch.setenv(ipc.ENDPOINT_ENV, "tcp://127.0.0.1:5555")
    assert ipc.default_endpoint() == "tcp://127.0.0.1:5555"
    monkeypatch.setenv(ipc.ENDPOINT_ENV, "")
    assert ipc.default_endpoint() == ipc.DEFAULT_ENDPOINT
