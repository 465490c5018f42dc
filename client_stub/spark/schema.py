"""The DataFrame columns the sink reads, as Spark's own Kafka sink (spark-sql-kafka-0-10) names them.

``value`` (binary or string) is required; ``key`` (binary or string), ``topic``
(string), ``partition`` (an integer type; null lets the partitioner choose),
``headers`` (array<struct<key: string, value: binary>>) and ``timestamp``
(timestamp; timestamp_ntz is taken as UTC) are optional. Other columns are ignored, as Spark's sink ignores
them. The check runs on the driver, before any row is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as spark_types
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from ..errors import ConfigError
from .options import SinkOptions, parse_options

_BYTES = (BinaryType, StringType)
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
# timestamp_ntz (taken as UTC) exists from Spark 3.4 on; write_partitions runs on 3.3.
_TIMESTAMPS = (TimestampType, *filter(None, [getattr(spark_types, "TimestampNTZType", None)]))
_HEADERS = "array<struct<key: string, value: binary>>"


@dataclass(frozen=True, slots=True)
class Columns:
    """Which of the optional columns the DataFrame has (``value`` it always has)."""

    key: bool = False
    topic: bool = False
    partition: bool = False
    headers: bool = False
    timestamp: bool = False


def check_write(options: Mapping[str, Any], schema: StructType) -> tuple[SinkOptions, Columns]:
    """A write's options and its DataFrame's columns, checked together on the driver (ConfigError names
    what is wrong): whether a topic is needed per row depends on both."""
    sink_options = parse_options(options)
    return sink_options, check_schema(schema, topic_option=sink_options.topic is not None)


def check_schema(schema: StructType, *, topic_option: bool) -> Columns:
    """The sink's view of ``schema``; ConfigError names the first column it cannot write."""
    fields = {field.name: field.dataType for field in schema.fields}
    if "value" not in fields:
        raise ConfigError(f"The kafka-sidecar sink needs a 'value' column (binary or string); the DataFrame has "
                          f"{', '.join(fields) or 'no columns'}.")
    _expect(fields, "value", _BYTES, "binary or string")
    for name, types, expected in (("key", _BYTES, "binary or string"), ("topic", (StringType,), "string"),
                                  ("partition", _INTEGERS, "an integer type (int)"),
                                  ("timestamp", _TIMESTAMPS, "timestamp")):
        _expect(fields, name, types, expected)
    if "headers" in fields and not _is_headers(fields["headers"]):
        raise ConfigError(f"Column 'headers' must be {_HEADERS}, not {fields['headers'].simpleString()}.")
    if "topic" not in fields and not topic_option:
        raise ConfigError("No topic to write to: set the 'topic' option, or give the DataFrame a 'topic' column.")
    return Columns(key="key" in fields, topic="topic" in fields and not topic_option,
                   partition="partition" in fields, headers="headers" in fields, timestamp="timestamp" in fields)


def _expect(fields: dict[str, DataType], name: str, types: tuple[type[DataType], ...], expected: str) -> None:
    data_type = fields.get(name)
    if data_type is not None and not isinstance(data_type, types):
        raise ConfigError(f"Column {name!r} must be {expected}, not {data_type.simpleString()}.")


def _is_headers(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    members = {field.name: field.dataType for field in data_type.elementType.fields}
    return (set(members) == {"key", "value"} and isinstance(members["key"], StringType)
            and isinstance(members["value"], _BYTES))
