"""The ``kafka-sidecar`` Python data source (pyspark.sql.datasource, Spark 4.1+): a batch and streaming sink.

Spark builds the DataSource and its writer on the driver, pickles them and runs
``write()`` in every task on the executors, with the task's rows as Arrow record
batches; each task sends its rows through the sidecar of its node and returns a
commit message with its totals once Kafka has confirmed every record. The driver
logs the totals at commit, and what was aborted at abort.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..errors import ConfigError
from .options import SinkOptions
from .schema import Columns, check_write
from .task import Origin, WriteTotals, task_context, write_batches

log = logging.getLogger("client_stub.spark")

NAME = "kafka-sidecar"
# Where Spark keeps a streaming query's id and micro-batch id among a task's local properties.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class SidecarCommitMessage(WriterCommitMessage):
    """What a task that succeeded tells the driver: its totals."""

    totals: WriteTotals


class KafkaSidecarDataSource(DataSource):
    """``df.write.format("kafka-sidecar")`` and ``df.writeStream.format("kafka-sidecar")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: StructType, overwrite: bool) -> KafkaSidecarWriter:
        if overwrite:
            raise ConfigError('The kafka-sidecar sink appends records to Kafka topics and cannot overwrite them: '
                              'use .mode("append").')
        options, columns = check_write(self.options, schema)
        # One id for the whole job, made at planning: a retried task carries the same one.
        return KafkaSidecarWriter(options, columns, uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaSidecarStreamWriter:
        options, columns = check_write(self.options, schema)
        return KafkaSidecarStreamWriter(options, columns)


class KafkaSidecarWriter(DataSourceArrowWriter):
    """The batch writer: a task commits once Kafka has confirmed every one of its records."""

    def __init__(self, options: SinkOptions, columns: Columns, job_id: str) -> None:
        self.options = options
        self.columns = columns
        self.job_id = job_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SidecarCommitMessage:
        origin = Origin(self.job_id, 0, task_context().partitionId())
        return SidecarCommitMessage(write_batches(iterator, self.options, self.columns, origin))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log(logging.INFO, "kafka-sidecar job %s committed: %s", self.job_id, _totals(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log(logging.ERROR, "kafka-sidecar job %s aborted: %s", self.job_id, _aborted(messages))


class KafkaSidecarStreamWriter(DataSourceStreamArrowWriter):
    """The streaming writer: the same per micro-batch (append and complete output modes)."""

    def __init__(self, options: SinkOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SidecarCommitMessage:
        context = task_context()
        query_id, batch_id = (context.getLocalProperty(_QUERY_ID_PROPERTY),
                              context.getLocalProperty(_BATCH_ID_PROPERTY))
        if self.options.idempotence_header and not (query_id and batch_id):
            # Ids made up here would repeat from one micro-batch to the next, and consumers drop real records.
            raise RuntimeError(f"idempotence.header: Spark did not give the task its query id ({_QUERY_ID_PROPERTY}="
                               f"{query_id!r}) and micro-batch id ({_BATCH_ID_PROPERTY}={batch_id!r})")
        origin = Origin(query_id or "", int(batch_id or -1), context.partitionId())
        return SidecarCommitMessage(write_batches(iterator, self.options, self.columns, origin))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 (Spark's name)
        _log(logging.INFO, "kafka-sidecar micro-batch %d committed: %s", batchId, _totals(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _log(logging.ERROR, "kafka-sidecar micro-batch %d aborted: %s", batchId, _aborted(messages))


def _log(level: int, message: str, *args: object) -> None:
    """Log at INFO or above, in the driver-side process where Spark runs commit and abort.

    Spark starts that process for them, and no application configures its logging: the totals are
    the job's record, so they are said at INFO there. spark.sql.pyspark.worker.logging.enabled
    sends them to Spark's python_worker_logs() table.
    """
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.log(level, message, *args)


def _totals(messages: list[WriterCommitMessage | None]) -> WriteTotals:
    totals = WriteTotals()
    for message in messages:
        if isinstance(message, SidecarCommitMessage):
            totals.add(message.totals)
    return totals


def _aborted(messages: list[WriterCommitMessage | None]) -> str:
    failed = sum(1 for message in messages if message is None)
    return (f"{failed} of {len(messages)} tasks did not commit (the job's error says why); the tasks that did "
            f"had written {_totals(messages)}, which stay in Kafka (at-least-once: a rerun writes them again)")
