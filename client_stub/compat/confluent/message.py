"""confluent-kafka's Message, as a delivery report gives it, and the delivery callback that receives it."""

from __future__ import annotations

from collections.abc import Callable

from .errors import KafkaError

__all__ = ["TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE", "DeliveryCallback",
           "Message"]

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

DeliveryCallback = Callable[["KafkaError | None", "Message"], None]


class Message:
    """confluent_kafka.Message, as a delivery report gives it: the record produced and where it went.

    ``partition()`` is None while the record had none (none was given, and it failed before one was chosen),
    ``offset()`` None unless the broker gave one; ``timestamp()`` is (TIMESTAMP_CREATE_TIME or
    TIMESTAMP_LOG_APPEND_TIME, milliseconds); ``latency()`` the seconds from produce() to the report.
    """

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_error", "_timestamp",
                 "_latency", "_leader_epoch")

    def __init__(self, topic: str | None = None, partition: int | None = None, offset: int | None = None,
                 key: bytes | None = None, value: bytes | None = None,
                 headers: list[tuple[str, bytes | None]] | None = None, error: KafkaError | None = None,
                 timestamp: tuple[int, int] | None = None, latency: float | None = None,
                 leader_epoch: int | None = None) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._error = error
        self._timestamp = timestamp
        self._latency = latency
        self._leader_epoch = leader_epoch

    def topic(self) -> str | None:
        """The topic."""
        return self._topic

    def partition(self) -> int | None:
        """The partition, None if none was chosen."""
        return None if self._partition is None or self._partition < 0 else self._partition

    def offset(self) -> int | None:
        """The record's offset in its partition, None if the broker gave none."""
        return None if self._offset is None or self._offset < 0 else self._offset

    def key(self) -> bytes | None:
        """The key, as bytes."""
        return self._key

    def value(self) -> bytes | None:
        """The value, as bytes."""
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The headers as (name, value) pairs, None if there were none."""
        return self._headers

    def error(self) -> KafkaError | None:
        """Why the delivery failed, None if it did not."""
        return self._error

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch); (TIMESTAMP_NOT_AVAILABLE, 0) if unknown."""
        return self._timestamp or (TIMESTAMP_NOT_AVAILABLE, 0)

    def latency(self) -> float | None:
        """Seconds from produce() to the delivery report."""
        return self._latency

    def leader_epoch(self) -> int | None:
        """The partition leader's epoch (not known here: None)."""
        return self._leader_epoch

    def set_headers(self, headers: list[tuple[str, bytes | None]] | None) -> None:
        """Replace the headers."""
        self._headers = headers

    def set_key(self, key: bytes | None) -> None:
        """Replace the key."""
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        """Replace the value."""
        self._value = value

    def __len__(self) -> int:
        return 0 if self._value is None else len(self._value)
