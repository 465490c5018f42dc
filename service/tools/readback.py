"""Read a topic back with librdkafka, an independent Kafka implementation, checking CRCs.

The quickstart checks what it published with it, and the tests everything they produce.
Needs confluent-kafka (the `quickstart` and `dev` extras).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

# How many records read_topic reads between two calls of its progress callback.
PROGRESS_EVERY = 1000


@dataclass(frozen=True)
class ConsumedRecord:
    """One record as librdkafka decoded it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int
    timestamp_type: int  # confluent_kafka.TIMESTAMP_{NOT_AVAILABLE,CREATE_TIME,LOG_APPEND_TIME}


class ReadTimeout(TimeoutError):
    """``read_topic`` gave up waiting; ``records`` holds what it had read, sorted."""

    def __init__(self, message: str, records: list[ConsumedRecord]) -> None:
        super().__init__(message)
        self.records = records


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
    settings: Mapping[str, str] | None = None,
) -> list[ConsumedRecord]:
    """Read every record of ``topic`` from the beginning, sorted by (partition, offset).

    Reads until each partition is at its end and, when ``expected`` is given, until at
    least that many records arrived; raises ReadTimeout, a TimeoutError carrying what was
    read, if that takes longer than ``timeout`` seconds. A consumer error other than
    partition EOF (a CRC mismatch, say) raises AssertionError: a corrupt batch fails the test.
    ``progress``, if given, is called with the number of records read since its last call,
    every ``PROGRESS_EVERY`` records and once more when the reading ends (a progress bar's
    ``update``). ``settings`` are more of librdkafka's (security.protocol, ssl.*, sasl.*: a
    cluster that requires them).

    Partitions are assigned directly: the broker's consumer groups are not trusted.
    """
    deadline = time.monotonic() + timeout
    client_errors: list[KafkaError] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # Required by librdkafka even without subscribe(); nothing is committed.
            "group.id": f"verifier-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "check.crcs": True,
            # The log as written, whatever the broker thinks the last stable offset is.
            "isolation.level": "read_uncommitted",
            "fetch.wait.max.ms": 100,
            # Client-level errors (a dropped connection, all brokers down) are transient and
            # librdkafka recovers from them: keep them for the timeout message instead of
            # letting them reach poll(), where record-level errors such as CRC failures arrive.
            "error_cb": client_errors.append,
            **(settings or {}),
        }
    )
    records: list[ConsumedRecord] = []
    reported = 0
    try:
        partitions = _partitions(consumer, topic, deadline)
        # Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not the
        # true end, so this is only a lower bound: a partition is done when librdkafka
        # reports EOF (from the Fetch high watermark) at or beyond it.
        lower_bounds = {
            p: consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=max(deadline - time.monotonic(), 0.1)
            )[1]
            for p in partitions
        }
        at_end = dict.fromkeys(partitions, False)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        while not (all(at_end.values()) and (expected is None or len(records) >= expected)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                records.sort(key=_position)
                behind = sorted(p for p, done in at_end.items() if not done)
                raise ReadTimeout(
                    f"read {len(records)} records from {topic} in {timeout}s (expected "
                    f"{expected}; per partition {Counter(r.partition for r in records)}; "
                    f"partitions not at their end {behind}; client errors "
                    f"{[str(e) for e in client_errors]}); the first: {records[:10]}",
                    records,
                )
            message = consumer.poll(min(remaining, 0.5))
            if message is None:
                continue
            error = message.error()
            partition, offset = message.partition(), message.offset()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"consumer error on {topic} [{partition}]: {error}")
            # Both are set on records and on partition EOF, the only events left here.
            assert partition is not None and offset is not None
            if error is not None:
                at_end[partition] = offset >= lower_bounds[partition]
                continue
            at_end[partition] = False
            timestamp_type, timestamp_ms = message.timestamp()
            # A consumed message's headers are a list of (name, value) pairs, or None.
            headers = cast(list[tuple[str, bytes | None]], message.headers() or [])
            records.append(
                ConsumedRecord(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    key=message.key(),
                    value=message.value(),
                    headers=headers,
                    timestamp_ms=timestamp_ms,
                    timestamp_type=timestamp_type,
                )
            )
            if progress is not None and len(records) - reported >= PROGRESS_EVERY:
                progress(len(records) - reported)
                reported = len(records)
    finally:
        consumer.close()
        if progress is not None and len(records) > reported:
            progress(len(records) - reported)
    return sorted(records, key=_position)


def broker_count(bootstrap: str, timeout: float = 10.0) -> int:
    """How many brokers the cluster at ``bootstrap`` has, as its metadata says."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verifier-{uuid.uuid4().hex}"})
    try:
        return len(consumer.list_topics(timeout=timeout).brokers)
    finally:
        consumer.close()


def _position(record: ConsumedRecord) -> tuple[int, int]:
    return record.partition, record.offset


def _partitions(consumer: Consumer, topic: str, deadline: float) -> list[int]:
    """The partition ids of ``topic``, waiting for it to appear in metadata until ``deadline``."""
    problem = "no metadata"
    while time.monotonic() < deadline:
        try:
            cluster = consumer.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            problem = str(exc)
        else:
            metadata = cluster.topics.get(topic)
            if metadata is not None and metadata.error is None and metadata.partitions:
                return sorted(metadata.partitions)
            problem = str(metadata.error) if metadata is not None else "not in metadata"
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} not found: {problem}")
