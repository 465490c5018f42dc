"""What one Spark task does: send every row of its partition through the node's daemon and wait.

A task hands each row to the Producer of its Python worker process, then waits
for every delivery report; it returns its totals only when Kafka has confirmed
every record, and raises the first delivery error otherwise (Spark then retries
the task: at-least-once, as Spark's own Kafka sink). Python workers are reused
across tasks and forked from pyspark.daemon, so the Producer is cached per
process and per setting; the Producer itself starts afresh in a forked child.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import KafkaError, KafkaTimeoutError
from ..producer import Producer, RecordMetadata
from .options import SinkOptions
from .schema import Columns

# The header that the ``idempotence.header`` option adds to every record:
# "<query or job id>/<batch id>/<Spark partition>/<row index in the partition>", UTF-8.
IDEMPOTENCE_HEADER = "kafka-sidecar-record-id"


@dataclass(slots=True)
class WriteTotals:
    """Records and bytes (keys and values) written per topic, and by how many tasks."""

    records: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    tasks: int = 0

    @property
    def total_records(self) -> int:
        return sum(self.records.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def add(self, other: WriteTotals) -> None:
        self.records.update(other.records)
        self.bytes.update(other.bytes)
        self.tasks += other.tasks

    def __str__(self) -> str:
        topics = ", ".join(f"{topic}: {self.records[topic]} records, {self.bytes[topic]} bytes"
                           for topic in sorted(self.records))
        return (f"{self.total_records} records, {self.total_bytes} bytes in {self.tasks} tasks"
                + (f" ({topics})" if topics else ""))


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a task's records come from, for the idempotence header."""

    query: str
    batch_id: int
    partition: int


class _DeliveryTally:
    """The on_delivery callback of a task's records: keeps the first error (one object for all records)."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, metadata: RecordMetadata | None) -> None:
        if error is not None and self.error is None:
            self.error = error


_producers: dict[tuple[Any, ...], Producer] = {}
_producers_lock = threading.Lock()


def producer_for(options: SinkOptions) -> Producer:
    """This process's Producer for these settings, made on first use and reused by later tasks."""
    settings = (options.endpoint, options.linger_ms, options.max_block_ms, options.partitioner)
    with _producers_lock:
        producer = _producers.get(settings)
        if producer is None:
            producer = _producers[settings] = Producer(
                options.endpoint, linger_ms=options.linger_ms, max_block_ms=options.max_block_ms,
                partitioner=options.partitioner, client_name="spark-task")
        return producer


def write_batches(batches: Iterable[pa.RecordBatch], options: SinkOptions, columns: Columns,
                  origin: Origin) -> WriteTotals:
    """Send every row of ``batches`` and wait for Kafka to confirm them all; the task's totals."""
    producer = producer_for(options)
    tally = _DeliveryTally()
    totals = WriteTotals(tasks=1)
    first_row = 0
    for batch in batches:
        if tally.error is not None:
            break  # the task fails: sending the rest would only add to what Spark's retry sends again
        _send_batch(producer, batch, options, columns, origin, first_row, tally, totals)
        first_row += batch.num_rows
    undelivered = producer.flush(options.delivery_timeout_ms / 1000)
    if tally.error is not None:
        raise tally.error
    if undelivered:
        raise KafkaTimeoutError(f"{undelivered} records of the task were not confirmed within "
                                f"delivery.timeout.ms={options.delivery_timeout_ms} (option of the sink)")
    return totals


def _send_batch(producer: Producer, batch: pa.RecordBatch, options: SinkOptions, columns: Columns,
                origin: Origin, first_row: int, tally: _DeliveryTally, totals: WriteTotals) -> None:
    values = _as_binary(batch.column("value"))
    keys = _as_binary(batch.column("key")) if columns.key else None
    topics = batch.column("topic") if columns.topic else None
    if topics is None:
        totals.records[options.topic] += batch.num_rows  # type: ignore[index]
        totals.bytes[options.topic] += _byte_count(values) + (_byte_count(keys) if keys is not None else 0)  # type: ignore[index]
    else:
        if topics.null_count:
            row = first_row + pc.index(pc.is_null(topics), True).as_py()
            raise ValueError(f"Row {row} of Spark partition {origin.partition} has a null 'topic' and the "
                             f"sink has no 'topic' option: give every row a topic, or set the option.")
        sizes = pc.fill_null(pc.binary_length(values), 0)
        if keys is not None:
            sizes = pc.add(sizes, pc.fill_null(pc.binary_length(keys), 0))
        by_topic = pa.table({"topic": topics, "size": sizes}).group_by("topic").aggregate(
            [("size", "count"), ("size", "sum")])
        for topic, count, size in zip(*(by_topic.column(n).to_pylist() for n in ("topic", "size_count", "size_sum")),
                                      strict=True):
            totals.records[topic] += count
            totals.bytes[topic] += size
    value_list = values.to_pylist()
    key_list = keys.to_pylist() if keys is not None else itertools.repeat(None)
    send = producer.send
    if not (topics is not None or columns.partition or columns.headers or columns.timestamp
            or options.idempotence_header):
        # The common case, with nothing per row but the key and the value: the C fast path of send().
        topic = options.topic
        # strict=False: a column the batch lacks is itertools.repeat(None), which never ends.
        for value, key in zip(value_list, key_list, strict=False):
            send(topic, value, key, on_delivery=tally)
        return
    topic_list = topics.to_pylist() if topics is not None else itertools.repeat(options.topic)
    partition_list = batch.column("partition").to_pylist() if columns.partition else itertools.repeat(None)
    timestamp_list = _timestamps_ms(batch.column("timestamp")) if columns.timestamp else itertools.repeat(None)
    header_list: Iterator[Any] = (
        (None if row is None else [(h["key"], h["value"]) for h in row] for row in batch.column("headers").to_pylist())
        if columns.headers else itertools.repeat(None))
    if options.idempotence_header:
        prefix = f"{origin.query}/{origin.batch_id}/{origin.partition}/"
        header_list = (
            [*(headers or ()), (IDEMPOTENCE_HEADER, f"{prefix}{row}".encode())]
            for row, headers in enumerate(header_list, first_row))
    for topic, value, key, partition, timestamp_ms, headers in zip(
            topic_list, value_list, key_list, partition_list, timestamp_list, header_list, strict=False):
        send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers, on_delivery=tally)


def _as_binary(column: pa.Array) -> pa.Array:
    """Strings as their UTF-8 bytes (a cast that copies no data), so that send() takes the C path."""
    if pa.types.is_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary())
    return column


def _byte_count(column: pa.Array) -> int:
    """The bytes of a binary column's values: from its offsets when it has no nulls (no pass over the rows)."""
    if column.null_count or not len(column):
        return pc.sum(pc.binary_length(column)).as_py() or 0
    offsets = memoryview(column.buffers()[1]).cast("q" if pa.types.is_large_binary(column.type) else "i")
    return offsets[column.offset + len(column)] - offsets[column.offset]


def _timestamps_ms(column: pa.Array) -> list[int | None]:
    return pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()), 1000).to_pylist()
