"""The Spark sink's options and schema check: what is refused on the driver, and with which message."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from client_stub.errors import ConfigError  # noqa: E402
from client_stub.spark.options import DEFAULT_DELIVERY_TIMEOUT_MS, SinkOptions, parse_options  # noqa: E402
from client_stub.spark.schema import Columns, check_schema  # noqa: E402


def schema(**columns: DataType) -> StructType:
    return StructType([StructField(name, data_type) for name, data_type in columns.items()])


def headers(key: DataType = StringType(), value: DataType = BinaryType(), key_name: str = "key") -> ArrayType:  # noqa: B008
    return ArrayType(StructType([StructField(key_name, key), StructField("value", value)]))


def test_spark_options_lower_cased_and_strings_become_settings() -> None:
    # Spark lower-cases option names and passes every value as a string; checkpointLocation and path are Spark's.
    options = parse_options({"topic": "events", "endpoint": "ipc:///tmp/s.sock", "linger.ms": "20",
                             "max.block.ms": "1500", "partitioner": "consistent_random",
                             "delivery.timeout.ms": "9000", "idempotence.header": "TRUE",
                             "checkpointlocation": "/tmp/cp", "path": "ignored"})
    assert options == SinkOptions(topic="events", endpoint="ipc:///tmp/s.sock", linger_ms=20, max_block_ms=1500,
                                  partitioner="consistent_random", delivery_timeout_ms=9000, idempotence_header=True)


def test_keyword_spellings_and_defaults() -> None:
    assert parse_options({"topic": None, "linger_ms": 0, "idempotence_header": False}) == SinkOptions(linger_ms=0)
    assert parse_options({}).delivery_timeout_ms == DEFAULT_DELIVERY_TIMEOUT_MS == 120_000


@pytest.mark.parametrize(("options", "message"), [
    ({"acks": "all"}, r"^'acks' is not an option of the kafka-sidecar sink .*kafka-sidecar run -X acks=\.\.\.\)"),
    ({"kafka.bootstrap.servers": "b:9092"}, r"belong to the node's kafka-sidecar daemon.*-X bootstrap.servers="),
    ({"compression_type": "lz4"}, r"-X compression.type="),
    ({"lingerms": "5"}, r"^Unknown option 'lingerms' of the kafka-sidecar sink; did you mean linger.ms\?$"),
    ({"linger.ms": "-1"}, r"Invalid value '-1' for option linger.ms: expected a non-negative integer"),
    ({"delivery.timeout.ms": "0"}, r"Invalid value 0 for option delivery.timeout.ms: a task must wait"),
    ({"delivery.timeout.ms": "2m"}, r"Invalid value '2m' for option delivery.timeout.ms"),
    ({"partitioner": "sticky"}, r"Invalid value 'sticky' for option partitioner: expected one of murmur2_random"),
    ({"idempotence.header": "yes please"}, r"Invalid value 'yes please' for option idempotence.header"),
    ({"topic": "a topic"}, r"Invalid value 'a topic' for option topic: invalid topic name"),
])
def test_bad_options_are_refused_with_the_option_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_options(options)


def test_the_columns_of_sparks_kafka_sink() -> None:
    full = schema(value=BinaryType(), key=StringType(), topic=StringType(), partition=IntegerType(),
                  headers=headers(), timestamp=TimestampType(), other=DoubleType())
    assert check_schema(full, topic_option=False) == Columns(key=True, topic=True, partition=True, headers=True,
                                                              timestamp=True)
    # The topic option overrides the column, as in Spark's sink.
    assert check_schema(full, topic_option=True).topic is False
    assert check_schema(schema(value=StringType(), partition=LongType(), timestamp=TimestampNTZType()),
                        topic_option=True) == Columns(partition=True, timestamp=True)
    assert check_schema(schema(value=StringType(), headers=headers(value=StringType())), topic_option=True).headers


VALUE = {"value": BinaryType()}


@pytest.mark.parametrize(("columns", "message"), [
    ({"key": BinaryType()}, r"needs a 'value' column \(binary or string\); the DataFrame has key"),
    ({"value": IntegerType()}, r"Column 'value' must be binary or string, not int"),
    (VALUE | {"key": ArrayType(StringType())}, r"Column 'key' must be binary or string, not array<string>"),
    (VALUE | {"topic": BinaryType()}, r"Column 'topic' must be string, not binary"),
    (VALUE | {"partition": DoubleType()}, r"Column 'partition' must be an integer type \(int\), not double"),
    (VALUE | {"timestamp": DateType()}, r"Column 'timestamp' must be timestamp, not date"),
    (VALUE | {"headers": headers(key_name="name")},
     r"Column 'headers' must be array<struct<key: string, value: binary>>, "
     r"not array<struct<name:string,value:binary>>"),
    (VALUE | {"headers": headers(key=BinaryType())}, r"Column 'headers' must be array<struct"),
    (VALUE | {"headers": MapType(StringType(), BinaryType())}, r"Column 'headers' must be .*, not map<string,binary>"),
])
def test_a_column_of_the_wrong_type_is_named_with_the_type_expected(columns: dict[str, DataType],
                                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_schema(schema(**columns), topic_option=True)


def test_no_topic_anywhere_is_refused() -> None:
    with pytest.raises(ConfigError, match="set the 'topic' option, or give the DataFrame a 'topic' column"):
        check_schema(schema(value=BinaryType()), topic_option=False)
