"""The options of the Spark sink, checked on the driver before any row is sent.

Spark hands a data source its options lower-cased, with string values; the
``write_partitions`` helper takes them as keyword arguments, where ``linger_ms``
stands for ``linger.ms``. Both end up here. Kafka's producer settings are the
daemon's, for every process of the host: an option that is one of them is
refused with a message saying where it is set, never silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contract.ipc import check_topic
from ..errors import ConfigError
from ..partitioner import PARTITIONERS

# Kafka's own default for delivery.timeout.ms: how long a task waits for the reports of its records.
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000

# Options a task may set; everything else is refused.
_OPTIONS = ("topic", "endpoint", "linger.ms", "max.block.ms", "partitioner", "delivery.timeout.ms",
            "idempotence.header")
# Spark passes these to every sink; they are Spark's, not ours.
_SPARK_OPTIONS = ("path", "checkpointlocation")


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What a write needs on the executors (picklable: it travels with every task)."""

    topic: str | None = None
    """The topic of every row; none: each row's ``topic`` column (the option, when set, overrides the column)."""
    endpoint: str | None = None
    """The node's daemon; none: ``$KAFKA_SIDECAR_ENDPOINT`` of each executor, else the default ipc socket."""
    linger_ms: int | None = None
    """How long a task's producer waits for more records before sealing a batch; none: the daemon's linger.ms."""
    max_block_ms: int | None = None
    """How long send() may wait for the daemon, a topic's metadata or memory; none: the daemon's max.block.ms."""
    partitioner: str = "murmur2_random"
    """The partitioner of rows whose ``partition`` is null: murmur2_random, consistent_random or random."""
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    """How long a task waits for the reports of its records (at least 1) before it fails."""
    idempotence_header: bool = False
    """Add the header ``kafka-sidecar-record-id`` (job or query id/batch id/Spark partition/row) to each record."""


def parse_options(options: Mapping[str, Any]) -> SinkOptions:
    """SinkOptions from Spark's options (or keyword arguments); ConfigError names a bad one."""
    given: dict[str, Any] = {}
    for raw_name, value in options.items():
        name = raw_name.lower().replace("_", ".")
        if name in _SPARK_OPTIONS or value is None:
            continue
        if name not in _OPTIONS:
            raise ConfigError(_unknown(raw_name))
        given[name] = value
    topic = given.get("topic")
    if topic is not None:
        try:
            check_topic(str(topic))
        except ValueError as exc:
            raise ConfigError(f"Invalid value {topic!r} for option topic: {exc}") from None
    partitioner = str(given.get("partitioner", "murmur2_random"))
    if partitioner not in PARTITIONERS:
        raise ConfigError(f"Invalid value {partitioner!r} for option partitioner: "
                          f"expected one of {', '.join(PARTITIONERS)}")
    endpoint = given.get("endpoint")
    delivery_timeout_ms = _non_negative(given, "delivery.timeout.ms")
    if delivery_timeout_ms == 0:
        raise ConfigError("Invalid value 0 for option delivery.timeout.ms: a task must wait for its reports "
                          "(at least 1 ms)")
    return SinkOptions(
        topic=None if topic is None else str(topic),
        endpoint=None if endpoint is None else str(endpoint),
        linger_ms=_non_negative(given, "linger.ms"),
        max_block_ms=_non_negative(given, "max.block.ms"),
        partitioner=partitioner,
        delivery_timeout_ms=DEFAULT_DELIVERY_TIMEOUT_MS if delivery_timeout_ms is None else delivery_timeout_ms,
        idempotence_header=_boolean(given, "idempotence.header"),
    )


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name.lower().replace("_", "."), _OPTIONS, n=1)
    if close:
        return f"Unknown option {name!r} of the kafka-sidecar sink; did you mean {close[0]}?"
    setting = name[len("kafka."):] if name.lower().startswith("kafka.") else name
    return (f"{name!r} is not an option of the kafka-sidecar sink (its options: {', '.join(_OPTIONS)}). "
            f"Kafka's producer settings (acks, compression.type, retries, batch.size, security ...) belong "
            f"to the node's kafka-sidecar daemon, which sends for every process of the host: set them where "
            f"the daemon starts (kafka-sidecar run -X {setting.replace('_', '.')}=...).")


def _non_negative(given: Mapping[str, Any], name: str) -> int | None:
    value = given.get(name)
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"Invalid value {value!r} for option {name}: expected a non-negative integer")
    return number


def _boolean(given: Mapping[str, Any], name: str) -> bool:
    value = given.get(name, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(f"Invalid value {value!r} for option {name}: expected true or false")
