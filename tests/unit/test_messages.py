"""The schema-driven message codec: transcription, round trips, wire bytes, kafka-python agreement."""

from __future__ import annotations

import functools
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import kafka.protocol
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol import metadata as kp_metadata
from kafka.protocol import producer as kp_producer
from kafka.protocol import sasl as kp_sasl

from client_stub.contract.records import uvarint
from service.protocol import messages as m
from service.protocol import primitives as prim
from service.protocol.api import (
    APIS,
    decode_response,
    encode_request,
    peek_correlation_id,
    write_request_header,
)
from service.protocol.primitives import ProtocolError
from service.protocol.schema import Field, Message, Struct
from tests.support.broker_codec import decode_request, encode_response, read_request_header

MESSAGES: list[type[Message]] = sorted(
    (obj for obj in vars(m).values() if isinstance(obj, type) and issubclass(obj, Message) and obj is not Message),
    key=lambda cls: (cls.API_KEY, cls.__name__))
REQUESTS = [cls for cls in MESSAGES if cls.__name__.endswith("Request")]
RESPONSES = [cls for cls in MESSAGES if cls.__name__.endswith("Response")]
MESSAGE_VERSIONS = [pytest.param(cls, v, id=f"{cls.__name__}-v{v}")
                    for cls in MESSAGES for v in range(cls.min_version(), cls.max_version() + 1)]
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_api_has_its_request_and_response() -> None:
    assert len(MESSAGES) == 12
    assert {(api.request, api.response) for api in APIS.values()} == {
        (req, next(r for r in RESPONSES if r.__name__ == req.__name__.replace("Request", "Response")))
        for req in REQUESTS}
    for cls in MESSAGES:
        assert cls in (APIS[cls.API_KEY].request, APIS[cls.API_KEY].response)


# -- (a) transcription from Kafka's JSON message schemas -----------------------------------------

SCHEMA_DIR = Path(kafka.protocol.__file__).parent / "schemas" / "resources"


def load_schema(name: str) -> dict[str, Any]:
    text = (SCHEMA_DIR / f"{name}.json").read_text()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE))


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def versions(text: str | None) -> tuple[int, float]:
    """A version range as Kafka's generator reads it; (0, -1) is empty."""
    if text is None or text == "none":
        return (0, -1)
    if text.endswith("+"):
        return (int(text[:-1]), math.inf)
    if "-" in text:
        low, high = text.split("-")
        return (int(low), int(high))
    return (int(text), int(text))


def within(version: int, text: str | None) -> bool:
    low, high = versions(text)
    return low <= version <= high


def json_default(spec: dict[str, Any]) -> Any:
    """The default a Kafka-generated class gives a scalar or array field."""
    t = spec["type"]
    given_default = spec.get("default")
    if given_default == "null":
        return None
    if t.startswith("[]"):
        return []
    if t in ("int8", "int16", "int32", "int64", "uint16"):
        return int(str(given_default), 0) if given_default is not None else 0
    if t == "bool":
        return str(given_default).lower() == "true" if given_default is not None else False
    if t == "string":
        return given_default if given_default is not None else ""
    if t == "bytes":
        return b""
    if t == "records":
        return None
    if t == "uuid":
        return bytes(16)
    if t == "float64":
        return float(given_default) if given_default is not None else 0.0
    raise AssertionError(f"unexpected type {t}")


def compare_fields(specs: list[dict[str, Any]], cls: type[Struct], version: int, all_versions: range,
                   path: str) -> None:
    theirs = [s for s in specs if within(version, s["versions"])]
    ours = [f for f in cls._schema_fields if version in f.versions]
    assert [snake(s["name"]) for s in theirs] == [f.name for f in ours], f"{path} v{version}: fields"
    for spec, f in zip(theirs, ours, strict=True):
        where = f"{path}.{f.name} v{version}"
        assert spec["type"] == f.type, where
        assert within(version, spec.get("nullableVersions")) == (version in f.nullable), f"{where}: nullable"
        tagged = within(version, spec.get("taggedVersions"))
        assert tagged == (version in f.tagged), f"{where}: tagged"
        if tagged:
            assert spec["tag"] == f.tag, f"{where}: tag"
        if "fields" in spec:
            assert f.is_struct, where
            compare_fields(spec["fields"], getattr(cls, f.element), version, all_versions, where)
        else:
            assert not f.is_struct, where
            # A default reaches the wire when a tagged field is left out for being at its default,
            # or when a field missing from a version is decoded; elsewhere it is a convenience.
            if f.tag is not None or any(v not in f.versions for v in all_versions):
                assert cls._defaults[f.name]() == json_default(spec), f"{where}: default"


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda c: c.__name__)
def test_fields_agree_with_kafkas_json_schema(cls: type[Message]) -> None:
    schema = load_schema(cls.__name__)
    assert schema["apiKey"] == cls.API_KEY
    assert schema["type"] == ("request" if cls in REQUESTS else "response")
    assert "commonStructs" not in schema
    all_versions = range(cls.min_version(), cls.max_version() + 1)
    for version in all_versions:
        assert within(version, schema["validVersions"]), f"{cls.__name__} v{version} is not a valid version"
        assert within(version, schema["flexibleVersions"]) == cls.is_flexible(version), \
            f"{cls.__name__} v{version}: flexible"
        compare_fields(schema["fields"], cls, version, all_versions, cls.__name__)


def test_snake_case_names() -> None:
    assert [snake(n) for n in ("TopicData", "IsrNodes", "ThrottleTimeMs", "ZkMigrationReady")] == \
        ["topic_data", "isr_nodes", "throttle_time_ms", "zk_migration_ready"]


# -- strategies built from the declarations ------------------------------------------------------

_SCALARS = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "bool": st.booleans(),
    "uuid": st.binary(min_size=16, max_size=16),
    "string": st.text(max_size=8),
    "bytes": st.binary(max_size=16),
    "records": st.binary(max_size=40),
    "float64": st.floats(allow_nan=False),
}


def field_values(f: Field, cls: type[Struct], version: int) -> st.SearchStrategy[Any]:
    if version not in f.versions:
        return st.builds(cls._defaults[f.name])
    element = struct_values(getattr(cls, f.element), version) if f.is_struct else _SCALARS[f.element]
    values = st.lists(element, max_size=3) if f.is_array else element
    return st.none() | values if version in f.nullable else values


@functools.cache
def struct_values(cls: type[Struct], version: int) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries({f.name: field_values(f, cls, version) for f in cls._schema_fields}) \
        .map(lambda kw: cls(**kw))


# -- (b) round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize(("cls", "version"), MESSAGE_VERSIONS)
@FAST
@given(data=st.data(), correlation_id=st.integers(-(2**31), 2**31 - 1),
       client_id=st.none() | st.text(max_size=10))
def test_round_trip(cls: type[Message], version: int, data: st.DataObject, correlation_id: int,
                    client_id: str | None) -> None:
    message = data.draw(struct_values(cls, version))
    encoded = message.encode(version)
    assert cls.decode(encoded, version) == message
    assert cls.decode(b"\xff" * 5 + encoded, version, 5) == message
    assert cls.decode(memoryview(bytearray(encoded)), version) == message
    # And framed, with the request or response header of that version.
    if cls in REQUESTS:
        frame = b"".join(encode_request(message, version, correlation_id, client_id))
        header, decoded = decode_request(frame[4:])
        assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
            (cls.API_KEY, version, correlation_id, client_id)
    else:
        frame = encode_response(message, version, correlation_id)
        assert peek_correlation_id(frame[4:]) == correlation_id
        decoded = decode_response(frame[4:], cls.API_KEY, version)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    assert frame.endswith(encoded)
    assert decoded == message


PR = m.ProduceResponse
TPR = PR.TopicProduceResponse
PPR = TPR.PartitionProduceResponse


def produce_response(**partition: Any) -> m.ProduceResponse:
    return PR(responses=[TPR(name="topic", partition_responses=[PPR(index=2, error_code=6, base_offset=-1,
                                                                    **partition)])],
              throttle_time_ms=0)


def test_produce_response_v10_tagged_fields() -> None:
    leader = PPR.LeaderIdAndEpoch(leader_id=3, leader_epoch=17)
    message = produce_response(current_leader=leader)
    message.node_endpoints = [PR.NodeEndpoint(node_id=3, host="broker-3", port=9093, rack="r1")]
    encoded = message.encode(10)
    decoded = PR.decode(encoded, 10)
    assert decoded == message
    assert decoded.responses[0].partition_responses[0].current_leader == leader
    assert decoded.node_endpoints[0].host == "broker-3"
    # The top-level tagged section: one field, tag 0, then the NodeEndpoint array.
    endpoints = (uvarint(2) + struct.pack(">i", 3) + uvarint(9) + b"broker-3" + struct.pack(">i", 9093)
                 + uvarint(3) + b"r1" + b"\x00")
    assert encoded.endswith(b"\x01\x00" + uvarint(len(endpoints)) + endpoints)
    # The partition's section: tag 0 holding LeaderIdAndEpoch (two int32 and its own empty tags).
    assert b"\x01\x00\x09" + struct.pack(">ii", 3, 17) + b"\x00" in encoded


def test_tagged_fields_at_their_defaults_are_left_out() -> None:
    message = produce_response()
    encoded = message.encode(10)
    assert encoded == message.encode(9)  # v10 only adds tagged fields
    assert encoded.endswith(b"\x00" + struct.pack(">i", 0) + b"\x00")
    decoded = PR.decode(encoded, 10)
    leader = decoded.responses[0].partition_responses[0].current_leader
    assert (leader.leader_id, leader.leader_epoch) == (-1, -1)
    assert decoded.node_endpoints == []


def test_tagged_fields_do_not_exist_before_their_version() -> None:
    message = produce_response(current_leader=PPR.LeaderIdAndEpoch(leader_id=3, leader_epoch=17))
    decoded = PR.decode(message.encode(9), 9)
    assert decoded.responses[0].partition_responses[0].current_leader == PPR.LeaderIdAndEpoch()


def test_api_versions_response_v3_features() -> None:
    AV = m.ApiVersionsResponse
    message = AV(error_code=0, api_keys=[AV.ApiVersion(api_key=0, min_version=3, max_version=12)],
                 throttle_time_ms=5,
                 supported_features=[AV.SupportedFeatureKey(name="metadata.version", min_version=1,
                                                            max_version=27)],
                 finalized_features_epoch=42,
                 finalized_features=[AV.FinalizedFeatureKey(name="metadata.version", max_version_level=27,
                                                            min_version_level=27)],
                 zk_migration_ready=True)
    encoded = message.encode(3)
    assert AV.decode(encoded, 3) == message
    tags = encoded[len(AV(error_code=0, api_keys=message.api_keys, throttle_time_ms=5).encode(3)) - 1:]
    assert tags[0] == 4  # four tagged fields, in tag order
    assert AV.decode(encoded, 4) == message
    # Before v3 the features do not exist: they decode to their defaults.
    old = AV.decode(message.encode(2), 2)
    assert (old.supported_features, old.finalized_features_epoch, old.zk_migration_ready) == ([], -1, False)
    assert old.api_keys == message.api_keys


def test_unknown_tagged_fields_are_skipped() -> None:
    # InitProducerIdResponse v2: throttle, error, producer id, epoch, then tags: tag 7 of 3 bytes.
    body = struct.pack(">ihqh", 0, 0, 4000, 2) + b"\x01\x07\x03abc"
    decoded = m.InitProducerIdResponse.decode(body, 2)
    assert (decoded.producer_id, decoded.producer_epoch) == (4000, 2)
    # A known and an unknown tag together, and an unknown one in a nested struct.
    AV = m.ApiVersionsResponse
    body = (struct.pack(">h", 0) + uvarint(2) + struct.pack(">hhh", 18, 0, 4) + b"\x01\x05\x01z"
            + struct.pack(">i", 0) + b"\x02" + b"\x01\x08" + struct.pack(">q", 9) + b"\x63\x02hi")
    decoded = AV.decode(body, 3)
    assert decoded.api_keys == [AV.ApiVersion(api_key=18, min_version=0, max_version=4)]
    assert decoded.finalized_features_epoch == 9
    # In the response header (v1; not for ApiVersions, whose header stays v0) and the request header (v2).
    body = struct.pack(">ihqh", 0, 0, 4000, 2) + b"\x00"
    frame = struct.pack(">i", 77) + b"\x01\x00\x02hi" + body
    assert decode_response(frame, m.INIT_PRODUCER_ID, 2) == m.InitProducerIdResponse.decode(body, 2)
    request = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=100)
    plain = b"".join(encode_request(request, 2, 5, "c"))[4:]
    tags_at = 8 + 2 + 1  # after api key, version, correlation id and the client id "c"
    assert plain[tags_at] == 0
    with_tag = plain[:tags_at] + b"\x01\x03\x01x" + plain[tags_at + 1:]
    assert decode_request(with_tag)[1] == request


# -- (c) wire bytes, built by hand ------------------------------------------------------------

def sized(*pieces: bytes) -> bytes:
    body = b"".join(pieces)
    return struct.pack(">i", len(body)) + body


def test_api_versions_request_v0_bytes() -> None:
    expected = sized(b"\x00\x12", b"\x00\x00", b"\x00\x00\x00\x01", b"\x00\x03abc")
    assert expected[:4] == b"\x00\x00\x00\x0d"
    assert b"".join(encode_request(m.ApiVersionsRequest(), 0, 1, "abc")) == expected


def test_api_versions_request_v3_bytes() -> None:
    body = m.ApiVersionsRequest(client_software_name="kafka-sidecar", client_software_version="0.1.0")
    expected = sized(
        b"\x00\x12",              # api key 18
        b"\x00\x03",              # version 3
        b"\x00\x00\x00\x2a",      # correlation id 42
        b"\x00\x03abc",           # client id: INT16-length string even in header v2
        b"\x00",                  # header tagged fields
        b"\x0ekafka-sidecar",     # compact string: length 13 + 1
        b"\x060.1.0",             # length 5 + 1
        b"\x00",                  # body tagged fields
    )
    assert b"".join(encode_request(body, 3, 42, "abc")) == expected


@pytest.mark.parametrize(("header_version", "encoded"), [
    (0, b"\x00\x07\x00\x00\x00\x00\x00\x0c"),                          # key, version, correlation id
    (1, b"\x00\x07\x00\x00\x00\x00\x00\x0c" + b"\x00\x02id"),            # + client id
    (2, b"\x00\x07\x00\x00\x00\x00\x00\x0c" + b"\x00\x02id" + b"\x00"),  # + tagged fields
])
def test_request_header_versions(header_version: int, encoded: bytes) -> None:
    # Header v0 (Kafka's for ControlledShutdown v0, api key 7) has no client id.
    buf = bytearray()
    write_request_header(buf, header_version, 7, 0, 12, "id")
    assert bytes(buf) == encoded
    header, end = read_request_header(encoded + b"body", header_version)
    assert (header.api_key, header.api_version, header.correlation_id) == (7, 0, 12)
    assert header.client_id == (None if header_version == 0 else "id")
    assert end == len(encoded)


def test_null_client_id() -> None:
    assert b"".join(encode_request(m.ApiVersionsRequest(), 0, 1, None)) == \
        sized(b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")


@pytest.mark.parametrize(("version", "topics", "body"), [
    (1, None, b"\xff\xff\xff\xff"),
    (1, [], b"\x00\x00\x00\x00"),
    (0, [], b"\x00\x00\x00\x00"),
    (4, None, b"\xff\xff\xff\xff\x01"),
    (8, [], b"\x00\x00\x00\x00\x01\x00\x00"),
    (9, None, b"\x00\x01\x00\x00\x00"),      # compact array: null 0, allow, cluster ops, topic ops, tags
    (9, [], b"\x01\x01\x00\x00\x00"),
    (11, None, b"\x00\x01\x00\x00"),         # cluster authorized operations gone after v10
])
def test_metadata_request_null_and_empty_topics(version: int, topics: list | None, body: bytes) -> None:
    assert m.MetadataRequest(topics=topics).encode(version) == body
    assert m.MetadataRequest.decode(body, version).topics == topics


def test_metadata_request_v1_frame() -> None:
    expected = sized(b"\x00\x03\x00\x01\x00\x00\x00\x07\x00\x02id", b"\xff\xff\xff\xff")
    assert b"".join(encode_request(m.MetadataRequest(topics=None), 1, 7, "id")) == expected


def test_metadata_request_topic_bytes() -> None:
    Topic = m.MetadataRequest.MetadataRequestTopic
    assert m.MetadataRequest(topics=[Topic(name="t1")], allow_auto_topic_creation=False).encode(4) == \
        b"\x00\x00\x00\x01\x00\x02t1\x00"
    uuid = bytes(range(16))
    assert m.MetadataRequest(topics=[Topic(topic_id=uuid, name="t1")]).encode(10) == \
        b"\x02" + uuid + b"\x03t1" + b"\x00" + b"\x01\x00\x00" + b"\x00"


@pytest.mark.parametrize(("version", "name", "encoded"), [
    (10, None, b"\x00"),     # compact nullable string: null is length 0
    (10, "", b"\x01"),       # empty is length 0 + 1
    (10, "ab", b"\x03ab"),
])
def test_compact_nullable_string(version: int, name: str | None, encoded: bytes) -> None:
    Topic = m.MetadataRequest.MetadataRequestTopic
    body = b"\x02" + bytes(16) + encoded + b"\x00" + b"\x01\x00\x00" + b"\x00"
    message = m.MetadataRequest(topics=[Topic(name=name)])
    assert message.encode(version) == body
    assert m.MetadataRequest.decode(body, version) == message


@pytest.mark.parametrize(("version", "transactional_id", "encoded"), [
    (3, None, b"\xff\xff"), (3, "", b"\x00\x00"), (3, "tx", b"\x00\x02tx"),
    (9, None, b"\x00"), (9, "", b"\x01"), (9, "tx", b"\x03tx"),
])
def test_nullable_string_null_vs_empty(version: int, transactional_id: str | None, encoded: bytes) -> None:
    body = m.ProduceRequest(transactional_id=transactional_id, acks=-1, timeout_ms=1000).encode(version)
    assert body.startswith(encoded + struct.pack(">hi", -1, 1000))
    assert m.ProduceRequest.decode(body, version).transactional_id == transactional_id


@pytest.mark.parametrize(("message", "version", "where"), [
    (m.MetadataRequest(topics=None), 0, "MetadataRequest v0: topics"),  # null means "all topics" from v1
    (m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=None)]), 9,
     "MetadataRequest v9: MetadataRequestTopic.name"),                 # nullable from v10
    (m.ProduceRequest(acks=-1, timeout_ms=1, topic_data=None), 9, "ProduceRequest v9: topic_data"),
    (m.ProduceRequest(acks=-1, timeout_ms=1, topic_data=[m.ProduceRequest.TopicProduceData(name=None)]), 3,
     "ProduceRequest v3: TopicProduceData.name"),
    (m.ProduceRequest(acks=None, timeout_ms=1), 12, "ProduceRequest v12: acks"),
    (m.InitProducerIdRequest(transaction_timeout_ms=1, producer_id=None), 3, "InitProducerIdRequest v3: producer_id"),
    (m.SaslAuthenticateRequest(auth_bytes=None), 2, "SaslAuthenticateRequest v2: auth_bytes"),
])
def test_none_where_the_version_allows_no_null_is_refused(message: Message, version: int, where: str) -> None:
    # Written, it would read back as something else (-1 length: empty, or "all topics").
    with pytest.raises(ProtocolError, match=f"^{re.escape(where)} is None, but not nullable in this version$"):
        message.encode(version)
    with pytest.raises(ProtocolError, match=re.escape(where)):
        encode_request(message, version, 1, "c")


def test_none_is_written_where_the_version_allows_it() -> None:
    assert m.MetadataRequest(topics=None).encode(1) == b"\xff\xff\xff\xff"
    Topic = m.MetadataRequest.MetadataRequestTopic
    assert m.MetadataRequest(topics=[Topic(name=None)]).encode(10).startswith(b"\x02" + bytes(16) + b"\x00")
    TD = m.ProduceRequest.TopicProduceData
    request = m.ProduceRequest(acks=1, timeout_ms=1, topic_data=[TD(name="t", partition_data=[
        TD.PartitionProduceData(index=0, records=None)])])
    assert m.ProduceRequest.decode(request.encode(3), 3) == request
    # Numbers out of range still fail as struct does.
    with pytest.raises(struct.error):
        m.ProduceRequest(acks=2**15, timeout_ms=1).encode(3)


def test_produce_request_records_are_not_copied() -> None:
    TD = m.ProduceRequest.TopicProduceData
    shm = bytearray(b"R" * 100)
    batch = [bytearray(b"H" * 61), memoryview(shm)[10:40]]
    message = m.ProduceRequest(acks=1, timeout_ms=30000, topic_data=[TD(name="t", partition_data=[
        TD.PartitionProduceData(index=0, records=batch)])])
    for version in (3, 9):
        parts = encode_request(message, version, 9, "c")
        assert any(p is batch[1] for p in parts)
        data = b"".join(parts)
        assert struct.unpack_from(">i", data)[0] == len(data) - 4
        _, decoded = decode_request(data[4:])
        assert decoded.topic_data[0].partition_data[0].records == b"H" * 61 + b"R" * 30


def test_produce_request_v3_bytes() -> None:
    TD = m.ProduceRequest.TopicProduceData
    message = m.ProduceRequest(acks=-1, timeout_ms=1500, topic_data=[TD(name="t", partition_data=[
        TD.PartitionProduceData(index=4, records=b"BATCH")])])
    assert message.encode(3) == (b"\xff\xff" + struct.pack(">hi", -1, 1500) + b"\x00\x00\x00\x01\x00\x01t"
                                 + b"\x00\x00\x00\x01" + struct.pack(">i", 4) + b"\x00\x00\x00\x05BATCH")
    assert message.encode(9) == (b"\x00" + struct.pack(">hi", -1, 1500) + b"\x02\x02t"
                                 + b"\x02" + struct.pack(">i", 4) + b"\x06BATCH" + b"\x00"
                                 + b"\x00" + b"\x00")


def test_api_versions_response_header_is_always_v0() -> None:
    AV = m.ApiVersionsResponse
    message = AV(error_code=0, api_keys=[AV.ApiVersion(api_key=18, min_version=0, max_version=4)])
    expected = sized(b"\x00\x00\x00\x05",                     # correlation id, no header tags
                     b"\x00\x00", b"\x02", b"\x00\x12\x00\x00\x00\x04\x00",
                     b"\x00\x00\x00\x00", b"\x00")
    assert encode_response(message, 3, 5) == expected
    assert decode_response(expected[4:], m.API_VERSIONS, 3) == message


def test_flexible_response_header_has_tags() -> None:
    message = m.InitProducerIdResponse(producer_id=9, producer_epoch=1)
    flexible = encode_response(message, 2, 6)
    assert flexible == sized(b"\x00\x00\x00\x06", b"\x00", struct.pack(">ihqh", 0, 0, 9, 1), b"\x00")
    assert encode_response(message, 1, 6) == sized(b"\x00\x00\x00\x06", struct.pack(">ihqh", 0, 0, 9, 1))


def test_sasl_bytes() -> None:
    assert b"".join(encode_request(m.SaslHandshakeRequest(mechanism="PLAIN"), 1, 2, "c")) == \
        sized(b"\x00\x11\x00\x01\x00\x00\x00\x02\x00\x01c", b"\x00\x05PLAIN")
    assert m.SaslAuthenticateRequest(auth_bytes=b"\x00u\x00p").encode(1) == b"\x00\x00\x00\x04\x00u\x00p"
    assert m.SaslAuthenticateRequest(auth_bytes=b"\x00u\x00p").encode(2) == b"\x05\x00u\x00p\x00"
    response = m.SaslAuthenticateResponse.decode(b"\x00\x00\xff\xff\x00\x00\x00\x00" + struct.pack(">q", 60000), 1)
    assert (response.error_message, response.auth_bytes, response.session_lifetime_ms) == (None, b"", 60000)


def test_peek_correlation_id() -> None:
    assert peek_correlation_id(b"\x00\x00\x01\x00rest") == 256
    with pytest.raises(ProtocolError):
        peek_correlation_id(b"\x00\x00\x01")


# -- (d) kafka-python's own encoder ------------------------------------------------------------

KAFKA_PYTHON = {cls.__name__: getattr(mod, cls.__name__)
                for cls in MESSAGES for mod in (kp_metadata, kp_producer, kp_sasl)
                if hasattr(mod, cls.__name__)}


def kp_request_bytes(message: Any, correlation_id: int, client_id: str) -> bytes:
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def test_kafka_python_has_every_message() -> None:
    assert sorted(KAFKA_PYTHON) == sorted(cls.__name__ for cls in MESSAGES)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_request_like_kafka_python(version: int) -> None:
    KP = KAFKA_PYTHON["ApiVersionsRequest"]
    kw = dict(client_software_name="kafka-sidecar", client_software_version="0.1") if version >= 3 else {}
    ours = b"".join(encode_request(m.ApiVersionsRequest(**kw), version, 11, "client-1"))
    assert ours == kp_request_bytes(KP(version=version, **kw), 11, "client-1")


@pytest.mark.parametrize("version", [1, 4, 7, 8, 9, 10, 11, 12])
@pytest.mark.parametrize("topics", [None, [], ["a", "bb"]])
def test_metadata_request_like_kafka_python(version: int, topics: list[str] | None) -> None:
    KP = KAFKA_PYTHON["MetadataRequest"]
    kp_topics = None if topics is None else [KP.MetadataRequestTopic(name=t, version=version) for t in topics]
    ours_topics = None if topics is None else [m.MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    ours = m.MetadataRequest(topics=ours_topics, allow_auto_topic_creation=False,
                             include_topic_authorized_operations=True)
    kp = KP(topics=kp_topics, allow_auto_topic_creation=False, include_topic_authorized_operations=True,
            include_cluster_authorized_operations=False, version=version)
    assert b"".join(encode_request(ours, version, 3, "c")) == kp_request_bytes(kp, 3, "c")


@pytest.mark.parametrize("version", [3, 5, 7, 8, 9, 10, 11, 12])
@pytest.mark.parametrize("transactional_id", [None, "tx-1"])
def test_produce_request_like_kafka_python(version: int, transactional_id: str | None) -> None:
    KP = KAFKA_PYTHON["ProduceRequest"]
    TD = m.ProduceRequest.TopicProduceData
    batches = {0: b"first-batch", 3: b"\x00" * 70}
    ours = m.ProduceRequest(transactional_id=transactional_id, acks=-1, timeout_ms=30000, topic_data=[
        TD(name="topic-a", partition_data=[TD.PartitionProduceData(index=p, records=[memoryview(r)])
                                           for p, r in batches.items()])])
    kp = KP(transactional_id=transactional_id, acks=-1, timeout_ms=30000, version=version, topic_data=[
        KP.TopicProduceData(name="topic-a", version=version, partition_data=[
            KP.TopicProduceData.PartitionProduceData(index=p, records=r, version=version)
            for p, r in batches.items()])])
    assert b"".join(encode_request(ours, version, 1234, "sidecar")) == kp_request_bytes(kp, 1234, "sidecar")


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_init_producer_id_request_like_kafka_python(version: int) -> None:
    KP = KAFKA_PYTHON["InitProducerIdRequest"]
    ours = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
    kp = KP(transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1,
            version=version)
    assert b"".join(encode_request(ours, version, 8, "c")) == kp_request_bytes(kp, 8, "c")


def test_sasl_requests_like_kafka_python() -> None:
    KH, KA = KAFKA_PYTHON["SaslHandshakeRequest"], KAFKA_PYTHON["SaslAuthenticateRequest"]
    for version in (0, 1):
        assert b"".join(encode_request(m.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), version, 1, "c")) == \
            kp_request_bytes(KH(mechanism="SCRAM-SHA-256", version=version), 1, "c")
    for version in (0, 1, 2):
        assert b"".join(encode_request(m.SaslAuthenticateRequest(auth_bytes=b"n,,n=u,r=x"), version, 2, "c")) == \
            kp_request_bytes(KA(auth_bytes=b"n,,n=u,r=x", version=version), 2, "c")


def _zero_error(message: Any) -> Any:
    # kafka-python reads an ApiVersions response with an error as v0 (what brokers send then).
    if isinstance(message, m.ApiVersionsResponse):
        message.error_code = 0
    return message


@pytest.mark.parametrize(("cls", "version"), MESSAGE_VERSIONS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kafka_python_reads_and_rewrites_our_bytes(cls: type[Message], version: int, data: st.DataObject) -> None:
    """kafka-python decodes what we encode and, encoding it again, gives the same bytes."""
    message = _zero_error(data.draw(struct_values(cls, version)))
    ours = message.encode(version)
    theirs = KAFKA_PYTHON[cls.__name__].decode(ours, version=version)
    theirs._header = None  # decode leaves it unset, encode reads it
    assert bytes(theirs.encode(version=version)) == ours


def test_we_read_kafka_python_responses() -> None:
    KP = KAFKA_PYTHON["MetadataResponse"]
    for version in (1, 5, 9, 12):
        kp = KP(version=version, throttle_time_ms=10, cluster_id="cluster", controller_id=1, brokers=[
            KP.MetadataResponseBroker(node_id=1, host="h1", port=9092, rack=None, version=version)],
            topics=[KP.MetadataResponseTopic(error_code=0, name="t", is_internal=False, version=version, partitions=[
                KP.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=0, partition_index=0, leader_id=1, leader_epoch=4, replica_nodes=[1, 2],
                    isr_nodes=[1], offline_replicas=[2], version=version)])])
        kp.with_header(correlation_id=99)
        frame_bytes = bytes(kp.encode(header=True, framed=True))
        assert peek_correlation_id(frame_bytes[4:]) == 99
        ours = decode_response(frame_bytes[4:], m.METADATA, version)
        partition = ours.topics[0].partitions[0]
        assert (ours.brokers[0].host, ours.topics[0].name, partition.isr_nodes) == ("h1", "t", [1])
        assert partition.replica_nodes == [1, 2]
        assert partition.offline_replicas == ([2] if version >= 5 else [])
        assert partition.leader_epoch == (4 if version >= 7 else -1)
        assert ours.cluster_id == ("cluster" if version >= 2 else None)


# -- (e) malformed input -----------------------------------------------------------------------

@pytest.mark.parametrize(("cls", "version"), MESSAGE_VERSIONS)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_truncated_or_overlong_bodies_raise(cls: type[Message], version: int, data: st.DataObject) -> None:
    encoded = data.draw(struct_values(cls, version)).encode(version)
    for cut in range(len(encoded)):
        with pytest.raises(ProtocolError):
            cls.decode(encoded[:cut], version)
    with pytest.raises(ProtocolError, match="unexpected bytes"):
        cls.decode(encoded + b"\x00", version)


def test_truncated_frames_raise() -> None:
    response = encode_response(produce_response(current_leader=PPR.LeaderIdAndEpoch(leader_id=1)), 10, 3)[4:]
    for cut in range(len(response)):
        with pytest.raises(ProtocolError):
            decode_response(response[:cut], m.PRODUCE, 10)
    request = b"".join(encode_request(m.MetadataRequest(topics=[]), 9, 1, "client"))[4:]
    for cut in range(len(request)):
        with pytest.raises(ProtocolError):
            decode_request(request[:cut])


def test_garbage_raises_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        m.ApiVersionsResponse.decode(b"\x00\x00" + b"\xff" * 11, 3)          # varint longer than 10 bytes
    with pytest.raises(ProtocolError):
        m.MetadataResponse.decode(struct.pack(">i", 0) + b"\x7f\xff\xff\xff", 3)  # 2**31-1 brokers
    with pytest.raises(ProtocolError):
        m.SaslHandshakeRequest.decode(b"\x00\x02\xff\xfe", 0)                  # not UTF-8
    with pytest.raises(ProtocolError):
        m.ApiVersionsRequest.decode(b"", 5)                                    # no such version
    with pytest.raises(ProtocolError):
        m.ApiVersionsRequest().encode(9)
    with pytest.raises(ProtocolError, match="api key"):
        decode_request(struct.pack(">hhi", 999, 0, 1) + b"\xff\xff")


# -- primitives --------------------------------------------------------------------------------


@pytest.mark.parametrize(("writer", "value", "encoded"), [
    (prim.write_string, None, b"\xff\xff"),
    (prim.write_string, "", b"\x00\x00"),
    (prim.write_string, "é", b"\x00\x02\xc3\xa9"),
    (prim.write_compact_string, None, b"\x00"),
    (prim.write_compact_string, "", b"\x01"),
    (prim.write_compact_string, "é", b"\x03\xc3\xa9"),
    (prim.write_bytes, None, b"\xff\xff\xff\xff"),
    (prim.write_bytes, b"", b"\x00\x00\x00\x00"),
    (prim.write_bytes, b"ab", b"\x00\x00\x00\x02ab"),
    (prim.write_compact_bytes, None, b"\x00"),
    (prim.write_compact_bytes, b"", b"\x01"),
    (prim.write_compact_bytes, b"x" * 200, b"\xc9\x01" + b"x" * 200),
])
def test_primitive_bytes(writer, value, encoded: bytes) -> None:
    buf = bytearray()
    writer(buf, value)
    assert buf == encoded
    reader = {prim.write_string: prim.read_string, prim.write_compact_string: prim.read_compact_string,
              prim.write_bytes: prim.read_bytes, prim.write_compact_bytes: prim.read_compact_bytes}[writer]
    assert reader(b"\x00" + encoded, 1) == (value, 1 + len(encoded))
    for cut in range(len(encoded)):
        with pytest.raises(ProtocolError):
            reader(encoded[:cut], 0)


def test_string_too_long_for_int16_length() -> None:
    buf = bytearray()
    prim.write_string(buf, "x" * 0x7FFF)
    assert buf[:2] == b"\x7f\xff"
    with pytest.raises(ProtocolError):
        prim.write_string(bytearray(), "x" * 0x8000)


@pytest.mark.parametrize(("value", "flexible", "encoded"), [
    (None, False, b"\xff\xff\xff\xff"), ([], False, b"\x00\x00\x00\x00"), ([1, 2], False, b"\x00\x00\x00\x02"),
    (None, True, b"\x00"), ([], True, b"\x01"), ([1, 2], True, b"\x03"),
])
def test_array_lengths(value, flexible: bool, encoded: bytes) -> None:
    buf = bytearray()
    prim.write_array_length(buf, value, flexible)
    assert buf == encoded
    assert prim.read_array_length(encoded, 0, flexible) == (-1 if value is None else len(value), len(encoded))


def test_tagged_field_section() -> None:
    buf = bytearray()
    prim.write_tagged_fields(buf, [(0, b"ab"), (300, b""), (5, b"x" * 130)])
    assert buf == b"\x03" + b"\x00\x02ab" + b"\xac\x02\x00" + b"\x05\x82\x01" + b"x" * 130
    fields, end = prim.read_tagged_fields(bytes(buf) + b"tail", 0)
    assert end == len(buf)
    assert {tag: bytes(v) for tag, v in fields.items()} == {0: b"ab", 300: b"", 5: b"x" * 130}
    assert prim.skip_tagged_fields(bytes(buf) + b"tail", 0) == len(buf)
    for cut in range(len(buf)):
        with pytest.raises(ProtocolError):
            prim.read_tagged_fields(bytes(buf[:cut]), 0)
        with pytest.raises(ProtocolError):
            prim.skip_tagged_fields(bytes(buf[:cut]), 0)


def test_writer_keeps_external_buffers() -> None:
    w = prim.Writer()
    w.buf += b"head"
    shared = memoryview(bytearray(b"shared"))
    w.external([shared])
    w.buf += b"tail"
    parts = w.finish()
    assert parts[1] is shared
    assert b"".join(parts) == b"headsharedtail"
    records_writer = prim.Writer()
    prim.write_records(records_writer, [b"ab", memoryview(b"cde")], flexible=False)
    assert records_writer.getvalue() == b"\x00\x00\x00\x05abcde"
    records_writer = prim.Writer()
    prim.write_records(records_writer, memoryview(b"cde"), flexible=True)
    assert records_writer.getvalue() == b"\x04cde"
    records_writer = prim.Writer()
    prim.write_records(records_writer, None, flexible=True)
    assert records_writer.getvalue() == b"\x00"


def test_lenient_decoding_ignores_trailing_bytes_only() -> None:
    message = m.InitProducerIdResponse(producer_id=9, producer_epoch=1)
    body = message.encode(2)
    assert m.InitProducerIdResponse.decode(body + b"\x00extra", 2, strict=False) == message
    frame = encode_response(message, 2, 6)[4:]
    assert decode_response(frame + b"\x00\x00", m.INIT_PRODUCER_ID, 2, strict=False) == message
    with pytest.raises(ProtocolError):
        decode_response(frame + b"\x00\x00", m.INIT_PRODUCER_ID, 2)
    with pytest.raises(ProtocolError):
        m.InitProducerIdResponse.decode(body[:-1], 2, strict=False)
