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

# pyarrow has no types (pyproject.toml's [tool.mypy]): what its calls return is declared where it is kept.
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from ..errors import KafkaError, KafkaTimeoutError
from ..futures import RecordMetadata
from ..producer import Producer
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


def task_context() -> TaskContext:
    """The context of the Spark task this runs in (a writer's write(), a mapInArrow function)."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("kafka-sidecar's Spark writer runs in a Spark task, and this is none")
    return context


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
    task = _Task(options, columns, origin)
    for batch in batches:
        if task.error is not None:
            break  # the task fails: sending the rest would only add to what Spark's retry sends again
        task.send(batch)
    task.wait()
    return task.totals


class _Task:
    """One task's records on their way: what it sent, what Kafka confirmed, and its totals.

    The instance is also the on_delivery callback of every record it sends (one object for all,
    called on the producer's I/O thread): it counts the reports and keeps the first error.
    """

    def __init__(self, options: SinkOptions, columns: Columns, origin: Origin) -> None:
        self.options = options
        self.columns = columns
        self.origin = origin
        self.producer = producer_for(options)
        self.totals = WriteTotals(tasks=1)
        self.sent = 0
        self.reported = 0
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, metadata: RecordMetadata | None) -> None:
        self.reported += 1
        if error is not None and self.error is None:
            self.error = error

    def wait(self) -> None:
        """Return once Kafka has confirmed every record sent; raise the first error, or on timeout."""
        self.producer.flush(self.options.delivery_timeout_ms / 1000)
        if self.error is not None:
            raise self.error
        # Counted by this task's own reports: the process's Producer may hold other records too.
        if self.reported < self.sent:
            raise KafkaTimeoutError(f"{self.sent - self.reported} records of the task were not confirmed within "
                                    f"delivery.timeout.ms={self.options.delivery_timeout_ms} (option of the sink)")

    def send(self, batch: pa.RecordBatch) -> None:
        """Send the rows of ``batch`` (an exception raised for a row names it in a note)."""
        values = _as_binary(batch.column("value"))
        keys = _as_binary(batch.column("key")) if self.columns.key else None
        topics = batch.column("topic") if self.columns.topic else None
        self._count(values, keys, topics)
        first_row = self.sent
        self.sent += batch.num_rows
        rows = self._rows(batch, values, keys, topics, first_row)
        send = self.producer.send
        row = first_row
        try:
            if rows is None:
                # The common case, nothing per row but the key and the value: the fast path of send().
                topic = self._topic_option()
                key_list = keys.to_pylist() if keys is not None else itertools.repeat(None)
                # strict=False: a column the batch lacks is itertools.repeat(None), which never ends.
                for row, (value, key) in enumerate(  # noqa: B007 (row: for the note below)
                        zip(values.to_pylist(), key_list, strict=False), first_row):
                    send(topic, value, key, on_delivery=self)
            else:
                for row, (topic, value, key, partition, timestamp_ms, headers) in enumerate(  # noqa: B007
                        rows, first_row):
                    send(topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers,
                         on_delivery=self)
        except Exception as exc:
            exc.add_note(f"kafka-sidecar: while sending row {row} of Spark partition {self.origin.partition}")
            raise

    def _topic_option(self) -> str:
        """The topic of the rows, when the DataFrame has no topic column (check_schema then requires the option)."""
        assert self.options.topic is not None, "check_schema lets no DataFrame without a topic through"
        return self.options.topic

    def _rows(self, batch: pa.RecordBatch, values: pa.Array, keys: pa.Array | None, topics: pa.Array | None,
              first_row: int) -> Iterator[tuple[Any, ...]] | None:
        """(topic, value, key, partition, timestamp_ms, headers) per row; None when only keys and values vary."""
        columns = self.columns
        if not (topics is not None or columns.partition or columns.headers or columns.timestamp
                or self.options.idempotence_header):
            return None
        none = itertools.repeat(None)
        header_list: Iterator[Any] = (
            (None if row is None else [(h["key"], h["value"]) for h in row]
             for row in batch.column("headers").to_pylist()) if columns.headers else none)
        if self.options.idempotence_header:
            prefix = f"{self.origin.query}/{self.origin.batch_id}/{self.origin.partition}/"
            header_list = ([*(headers or ()), (IDEMPOTENCE_HEADER, f"{prefix}{row}".encode())]
                           for row, headers in enumerate(header_list, first_row))
        return zip(topics.to_pylist() if topics is not None else itertools.repeat(self.options.topic),
                   values.to_pylist(),
                   keys.to_pylist() if keys is not None else none,
                   batch.column("partition").to_pylist() if columns.partition else none,
                   _timestamps_ms(batch.column("timestamp")) if columns.timestamp else none,
                   header_list, strict=False)

    def _count(self, values: pa.Array, keys: pa.Array | None, topics: pa.Array | None) -> None:
        """Add the batch to the totals: records, and the bytes of keys and values, per topic."""
        totals = self.totals
        if topics is None:
            topic = self._topic_option()
            totals.records[topic] += len(values)
            totals.bytes[topic] += _byte_count(values) + (_byte_count(keys) if keys is not None else 0)
            return
        if topics.null_count:
            row = self.sent + pc.index(pc.is_null(topics), True).as_py()
            raise ValueError(f"Row {row} of Spark partition {self.origin.partition} has a null 'topic' and the "
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


def _as_binary(column: pa.Array) -> pa.Array:
    """The column as binary or large_binary: strings as their UTF-8 bytes (a cast that copies no data),
    so that send() gets bytes and takes its fast path, and the offsets give the byte count."""
    column_type = column.type
    if pa.types.is_string(column_type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column_type):
        return column.cast(pa.large_binary())
    if pa.types.is_string_view(column_type) or pa.types.is_binary_view(column_type):
        return column.cast(pa.large_binary())
    return column


def _byte_count(column: pa.Array) -> int:
    """The bytes of a binary or large_binary column's values: from its offsets when it has no nulls (no pass
    over the rows; the offsets of a null may span bytes)."""
    if column.null_count or not len(column):
        total: int = pc.sum(pc.binary_length(column)).as_py() or 0
        return total
    offsets = memoryview(column.buffers()[1]).cast("q" if pa.types.is_large_binary(column.type) else "i")
    first: int = column.offset
    return offsets[first + len(column)] - offsets[first]


def _timestamps_ms(column: pa.Array) -> list[int | None]:
    timestamps: list[int | None] = pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()),
                                             1000).to_pylist()
    return timestamps
