"""The Spark sink as a PySpark job uses it: local[2], a real daemon, the real broker, librdkafka reading back.

Batch writes through the data source and through write_partitions (mapInArrow), a streaming
query of three micro-batches, delivery failures reaching the driver with Kafka's error name,
schema and option errors raised on the driver before anything is sent, and the idempotence
header that lets a consumer drop what a retried task wrote again.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from client_stub import spark as sidecar_spark
from client_stub.partitioner import murmur2_partition
from service.tools.readback import ConsumedRecord, read_topic

ROWS = 200_000
PARTITIONS = 4
BASE_TIMESTAMP_MS = 1_700_000_000_000


def mixed_rows(spark: SparkSession, topics: tuple[str, str], rows: int = ROWS) -> DataFrame:
    """Rows with keys and null keys, headers (some empty or null), a topic each, some explicit partitions."""
    even, odd = topics
    return spark.range(rows, numPartitions=4).selectExpr(
        "cast(concat('row-', id) as binary) as value",
        "case when id % 10 = 0 then null else concat('key-', id % 1000) end as key",
        f"case when id % 2 = 0 then '{even}' else '{odd}' end as topic",
        f"case when id % 3 = 0 then cast(id % {PARTITIONS} as int) end as partition",
        "case when id % 5 = 0 then array(named_struct('key', 'n', 'value', cast(cast(id as string) as binary)),"
        "                                named_struct('key', 'empty', 'value', cast(null as binary)))"
        "     when id % 5 = 1 then cast(null as array<struct<key: string, value: binary>>)"
        "     else array() end as headers",
        f"timestamp_millis({BASE_TIMESTAMP_MS} + id) as timestamp",
        "id as ignored_column")


def expected_row(n: int, topics: tuple[str, str]) -> dict[str, object]:
    """What librdkafka must read for row ``n`` of mixed_rows (partition None: the partitioner's choice)."""
    key = None if n % 10 == 0 else f"key-{n % 1000}".encode()
    partition = n % PARTITIONS if n % 3 == 0 else (murmur2_partition(key, PARTITIONS) if key is not None else None)
    headers = [("n", str(n).encode()), ("empty", None)] if n % 5 == 0 else []
    return {"topic": topics[n % 2], "key": key, "partition": partition, "headers": headers,
            "timestamp_ms": BASE_TIMESTAMP_MS + n}


def by_row(records: list[ConsumedRecord]) -> dict[int, ConsumedRecord]:
    """The records by the row number in their value; fails on a row read twice."""
    rows = Counter(int(r.value.removeprefix(b"row-")) for r in records)  # type: ignore[union-attr]
    assert [row for row, count in rows.items() if count > 1] == []
    return {int(r.value.removeprefix(b"row-")): r for r in records}  # type: ignore[union-attr]


def check_mixed_rows(bootstrap: str, topics: tuple[str, str], rows: int = ROWS) -> None:
    records = [r for topic in topics for r in read_topic(bootstrap, topic, expected=rows // 2, timeout=60)]
    read = by_row(records)
    assert sorted(read) == list(range(rows))
    wrong = []
    for n, record in read.items():
        expected = expected_row(n, topics)
        if expected["partition"] is None:
            expected["partition"] = record.partition
        actual = {"topic": record.topic, "key": record.key, "partition": record.partition,
                  "headers": record.headers, "timestamp_ms": record.timestamp_ms}
        if actual != expected:
            wrong.append((n, actual, expected))
    assert wrong[:5] == []


def mixed_totals(topics: tuple[str, str], rows: int = ROWS) -> sidecar_spark.WriteTotals:
    totals = sidecar_spark.WriteTotals(tasks=4)
    for n in range(rows):
        key = None if n % 10 == 0 else f"key-{n % 1000}".encode()
        totals.records[topics[n % 2]] += 1
        totals.bytes[topics[n % 2]] += len(f"row-{n}") + (len(key) if key is not None else 0)
    return totals


def worker_logs(spark: SparkSession, text: str) -> list[str]:
    """The messages of the sink's logger in Spark's python_worker_logs() that contain ``text``."""
    rows = spark.tvf.python_worker_logs().where("logger = 'client_stub.spark'").select("msg").collect()
    return [row.msg for row in rows if text in row.msg]


# -- batch writes ---------------------------------------------------------------------------------


def test_a_batch_write_delivers_every_row_once_with_its_key_headers_partition_and_timestamp(
        spark, broker, topic_factory, sidecar) -> None:
    topics = (topic_factory(PARTITIONS), topic_factory(PARTITIONS))
    daemon = sidecar(broker.bootstrap)
    (mixed_rows(spark, topics).write.format("kafka-sidecar").mode("append")
     .option("endpoint", daemon.endpoint).save())
    check_mixed_rows(broker.bootstrap, topics)
    # The driver's commit logged the job's totals: what the tasks counted, per topic.
    assert len(worker_logs(spark, f"committed: {mixed_totals(topics)}")) == 1


def test_write_partitions_writes_the_same_rows_and_returns_the_totals(spark, broker, topic_factory, sidecar) -> None:
    topics = (topic_factory(PARTITIONS), topic_factory(PARTITIONS))
    daemon = sidecar(broker.bootstrap)
    totals = sidecar_spark.write_partitions(mixed_rows(spark, topics), endpoint=daemon.endpoint, linger_ms=2)
    check_mixed_rows(broker.bootstrap, topics)
    assert totals == mixed_totals(topics)


def test_the_topic_option_overrides_the_topic_column_and_strings_are_utf8(spark, broker, topic_factory,
                                                                         sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    df = spark.createDataFrame([("élan", "ключ", "no-such-topic")], "value string, key string, topic string")
    df.write.format("kafka-sidecar").mode("append").options(topic=topic, endpoint=daemon.endpoint).save()
    [record] = read_topic(broker.bootstrap, topic, expected=1)
    assert (record.value, record.key) == ("élan".encode(), "ключ".encode())


def test_the_idempotence_header_names_job_partition_and_row_so_consumers_can_drop_duplicates(
        spark, broker, topic_factory, sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap)
    df = spark.range(1000, numPartitions=2).selectExpr("cast(id as string) as value")
    for _ in range(2):  # the same job twice: what a retried task, or a micro-batch run again, writes
        sidecar_spark.write_partitions(df, topic, endpoint=daemon.endpoint, idempotence_header=True,
                                       job_id="nightly", batch_id=7)
    sidecar_spark.write_partitions(df, topic, endpoint=daemon.endpoint, idempotence_header=True, batch_id=8)
    records = read_topic(broker.bootstrap, topic, expected=3000)
    ids = [dict(r.headers)[sidecar_spark.IDEMPOTENCE_HEADER].decode() for r in records]  # type: ignore[union-attr]
    # <job>/<batch>/<Spark partition>/<row in the partition>: rows 0-499 in each of the two partitions.
    assert Counter(i.split("/")[1] for i in ids) == {"7": 2000, "8": 1000}
    assert Counter(i for i in ids if i.startswith("nightly/7/")) == {
        f"nightly/7/{partition}/{row}": 2 for partition in (0, 1) for row in range(500)}
    # The third write, without a job_id, got one of its own.
    assert len({i.split("/")[0] for i in ids if not i.startswith("nightly/")}) == 1
    # A consumer that keeps what it saw, as the README shows, drops the second copy of each record.
    seen: set[str] = set()
    kept = []
    for record, record_id in zip(records, ids, strict=True):
        if record_id not in seen:
            seen.add(record_id)
            kept.append(int(record.value))  # type: ignore[arg-type]
    assert sorted(kept) == sorted([*range(1000), *range(1000)])  # batch 7 once, batch 8 once


# -- streaming ------------------------------------------------------------------------------------


def test_a_streaming_query_writes_each_micro_batch_and_commits_it_with_its_batch_id(
        spark, broker, topic_factory, sidecar, tmp_path: Path) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    source = tmp_path / "source"
    source.mkdir()
    for batch in range(3):
        lines = [json.dumps({"id": f"{batch}-{n}", "user": f"user-{n % 7}"}) for n in range(100 * (batch + 1))]
        path = source / f"part-{batch}.json"
        path.write_text("\n".join(lines) + "\n")
        # maxFilesPerTrigger takes the oldest file first: one second apart, the order is certain.
        os.utime(path, (1_700_000_000 + batch, 1_700_000_000 + batch))
    stream = (spark.readStream.schema("id string, user string").option("maxFilesPerTrigger", 1).json(str(source))
              .selectExpr("id as value", "user as key"))
    query: StreamingQuery = (stream.writeStream.format("kafka-sidecar").option("topic", topic)
                             .option("endpoint", daemon.endpoint).option("idempotence.header", "true")
                             .option("checkpointLocation", str(tmp_path / "checkpoint"))
                             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    records = read_topic(broker.bootstrap, topic, expected=600)
    assert sorted(r.value for r in records) == sorted(  # type: ignore[type-var]
        f"{b}-{n}".encode() for b in range(3) for n in range(100 * (b + 1)))
    # Each record names its query and micro-batch; the file of batch b went in micro-batch b.
    headers = [dict(r.headers)[sidecar_spark.IDEMPOTENCE_HEADER].decode().split("/") for r in records]  # type: ignore[union-attr]
    assert {h[0] for h in headers} == {query.id}
    assert Counter(h[1] for h in headers) == {"0": 100, "1": 200, "2": 300}
    assert all(r.value.startswith(f"{h[1]}-".encode()) for r, h in zip(records, headers, strict=True))  # type: ignore[union-attr]
    # Spark committed three micro-batches, one file each.
    assert [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]] == [
        (0, 100), (1, 200), (2, 300)]


def test_update_mode_is_refused(spark, tmp_path: Path) -> None:
    stream = spark.readStream.format("rate").load().selectExpr("cast(value as string) as value")
    with pytest.raises(PySparkException, match="(?i)update"):
        (stream.writeStream.format("kafka-sidecar").outputMode("update").option("topic", "t")
         .option("checkpointLocation", str(tmp_path)).start().awaitTermination(30))


# -- failures -------------------------------------------------------------------------------------


def test_a_topic_that_does_not_exist_fails_the_job_with_kafkas_error(spark, broker, sidecar) -> None:
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false", "max.block.ms": 3000})
    df = spark.range(10, numPartitions=1).selectExpr("cast(id as string) as value")
    with pytest.raises(PySparkException) as failure:
        df.write.format("kafka-sidecar").mode("append").options(topic="no-such-topic", endpoint=daemon.endpoint).save()
    assert "UNKNOWN_TOPIC_OR_PARTITION" in str(failure.value)


def test_a_record_larger_than_kafka_takes_fails_the_job_with_kafkas_error(spark, broker, topic_factory,
                                                                         sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"max.request.size": 10_000})
    df = spark.range(3, numPartitions=1).selectExpr("repeat('x', 20000 * cast(id = 1 as int) + 1) as value")
    with pytest.raises(PySparkException) as failure:
        sidecar_spark.write_partitions(df, topic, endpoint=daemon.endpoint)
    assert "RecordTooLargeError" in str(failure.value)
    assert "max.request.size" in str(failure.value)


def test_records_kafka_did_not_confirm_fail_the_job_with_kafkas_error(spark, proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("unconfirmed", 1)
    daemon = sidecar(proxy.address, settings={"request.timeout.ms": 1000, "delivery.timeout.ms": 2000,
                                              "linger.ms": 0, "retry.backoff.ms": 50})
    df = spark.range(100, numPartitions=1).selectExpr("cast(id as string) as value")
    sidecar_spark.write_partitions(df, "unconfirmed", endpoint=daemon.endpoint)  # metadata known, all well
    proxy.blackhole()
    with pytest.raises(PySparkException) as failure:
        df.write.format("kafka-sidecar").mode("append").options(topic="unconfirmed", endpoint=daemon.endpoint).save()
    # The daemon expired the batches (delivery.timeout.ms); the task raised what their reports said.
    assert "KafkaTimeoutError: Expiring" in str(failure.value)
    assert "ms has passed since batch creation" in str(failure.value)


@pytest.mark.parametrize(("columns", "message"), [
    (["cast(id as string) as key"], r"needs a 'value' column"),
    (["id as value"], r"Column 'value' must be binary or string, not bigint"),
    (["cast(id as string) as value", "1.5 as key"], r"Column 'key' must be binary or string, not decimal"),
    (["cast(id as string) as value", "'p' as partition"], r"Column 'partition' must be an integer type"),
    (["cast(id as string) as value", "map('k', 'v') as headers"], r"Column 'headers' must be array<struct<key"),
    (["cast(id as string) as value", "id as timestamp"], r"Column 'timestamp' must be timestamp, not bigint"),
])
def test_schema_errors_name_the_column_and_nothing_is_sent(spark, broker, topic_factory, sidecar, columns,
                                                           message) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    df = spark.range(5).selectExpr(*columns)
    with pytest.raises(PySparkException, match=message):
        df.write.format("kafka-sidecar").mode("append").options(topic=topic, endpoint=daemon.endpoint).save()
    with pytest.raises(ValueError, match=message):
        sidecar_spark.write_partitions(df, topic, endpoint=daemon.endpoint)
    assert read_topic(broker.bootstrap, topic) == []


def test_a_null_topic_without_the_topic_option_names_the_row(spark, broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    df = spark.range(10, numPartitions=1).selectExpr(
        "cast(id as string) as value", f"case when id = 6 then null else '{topic}' end as topic")
    with pytest.raises(PySparkException, match="Row 6 of Spark partition 0 has a null 'topic'"):
        df.write.format("kafka-sidecar").mode("append").option("endpoint", daemon.endpoint).save()
    with pytest.raises(PySparkException, match="No topic to write to"):
        df.drop("topic").write.format("kafka-sidecar").mode("append").save()


@pytest.mark.parametrize(("option", "message"), [
    ("acks", r"'acks' is not an option of the kafka-sidecar sink.*kafka-sidecar run -X acks="),
    ("kafka.compression.type", r"belong to the node's kafka-sidecar daemon.*-X compression.type="),
    ("linger.ms", r"Invalid value 'soon' for option linger.ms"),
])
def test_kafka_settings_and_bad_options_are_refused_on_the_driver(spark, option, message) -> None:
    df = spark.range(1).selectExpr("cast(id as string) as value")
    value = "soon" if option == "linger.ms" else "1"
    with pytest.raises(PySparkException, match=message):
        df.write.format("kafka-sidecar").mode("append").options(topic="t", **{option: value}).save()


def test_modes_other_than_append_are_refused_with_what_to_use(spark) -> None:
    df = spark.range(1).selectExpr("cast(id as string) as value")
    with pytest.raises(PySparkException, match=r'use \.mode\("append"\)'):
        df.write.format("kafka-sidecar").mode("overwrite").option("topic", "t").save()
    with pytest.raises(PySparkException, match="(?i)append"):
        df.write.format("kafka-sidecar").option("topic", "t").save()
