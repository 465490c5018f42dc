"""Spark writes DataFrames and streams to Kafka through the kafka-sidecar daemon of each node.

    from client_stub import spark as sidecar_spark
    sidecar_spark.register(spark)                      # the data source "kafka-sidecar" (Spark 4.1+)
    df.write.format("kafka-sidecar").mode("append").option("topic", "events").save()
    df.writeStream.format("kafka-sidecar").option("topic", "events").option("checkpointLocation", path).start()

    totals = sidecar_spark.write_partitions(df, topic="events")   # Spark 3.3+, mapInArrow

The columns are those of Spark's own Kafka sink: ``value`` (required), ``key``,
``topic``, ``partition``, ``headers``, ``timestamp``. Each task waits until
Kafka has confirmed every record it sent, and fails with the Kafka error
otherwise; Spark retries failed tasks, so delivery is at-least-once (the
``idempotence.header`` option lets consumers drop what a retry wrote again).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .options import SinkOptions
from .schema import Columns, check_write
from .task import IDEMPOTENCE_HEADER, Origin, WriteTotals, task_context, write_batches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["IDEMPOTENCE_HEADER", "WriteTotals", "register", "write_partitions"]

# One status row per task: what it wrote, per topic.
_STATUS_SCHEMA = "records map<string, bigint>, bytes map<string, bigint>"


def register(spark: SparkSession) -> None:
    """Register the data source ``kafka-sidecar`` in this SparkSession (needs pyspark 4.1 or newer)."""
    try:
        from .datasource import KafkaSidecarDataSource
    except ImportError as exc:
        raise ImportError(f"the kafka-sidecar data source needs pyspark 4.1 or newer and pyarrow ({exc}); "
                          "on older Spark, use client_stub.spark.write_partitions") from exc
    spark.dataSource.register(KafkaSidecarDataSource)


def write_partitions(df: DataFrame, topic: str | None = None, *, job_id: str | None = None, batch_id: int = 0,
                     **options: Any) -> WriteTotals:
    """Write ``df`` to Kafka with mapInArrow (Spark 3.3+); the job's totals, or the first task's error.

    ``options`` are the data source's: ``endpoint``, ``linger_ms`` (or ``**{"linger.ms": 5}``),
    ``max_block_ms``, ``partitioner``, ``delivery_timeout_ms``, ``idempotence_header``. The
    idempotence header names ``job_id`` (a new id per call if not given) and ``batch_id``: in a
    streaming query's ``foreachBatch``, give the query's own name or id and the micro-batch id, so
    that a micro-batch run again after a restart writes the same ids.
    """
    sink_options, columns = check_write({**options, "topic": topic}, df.schema)
    job = _PartitionWriter(sink_options, columns, job_id or uuid.uuid4().hex, batch_id)
    totals = WriteTotals()
    for row in df.mapInArrow(job, _STATUS_SCHEMA).collect():
        totals.add(WriteTotals(records=Counter(row.records), bytes=Counter(row.bytes), tasks=1))
    return totals


class _PartitionWriter:
    """The function mapInArrow runs in each task (pickled with what it needs, nothing more)."""

    def __init__(self, options: SinkOptions, columns: Columns, job_id: str, batch_id: int) -> None:
        self.options = options
        self.columns = columns
        self.job_id = job_id
        self.batch_id = batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        origin = Origin(self.job_id, self.batch_id, task_context().partitionId())
        totals = write_batches(batches, self.options, self.columns, origin)
        topics = sorted(totals.records)
        yield pa.RecordBatch.from_pydict(
            {"records": [[(t, totals.records[t]) for t in topics]], "bytes": [[(t, totals.bytes[t]) for t in topics]]},
            schema=pa.schema([("records", pa.map_(pa.string(), pa.int64())),
                              ("bytes", pa.map_(pa.string(), pa.int64()))]))
