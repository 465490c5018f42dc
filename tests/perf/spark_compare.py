"""Spark: one DataFrame written to Kafka by the kafka-sidecar data source and by producers in mapInArrow.

    .venv/bin/python tests/perf/spark_compare.py [--rows N] [--runs N] [--json PATH]

The DataFrame: --rows rows (default 2 000 000) in 8 partitions, a 100-byte binary value
(sha2 hex digits) and a 16-byte binary key over 1000 distinct ones, made with spark.range
and SQL, cached and counted before anything is timed. Spark runs in local[2] (8 tasks,
two at a time), on one embedded Tansu broker on 127.0.0.1. Four writers, each into a
fresh 6-partition topic:

kafka-sidecar             df.write.format("kafka-sidecar") through one daemon started with
                          -X acks=all -X enable.idempotence=true -X linger.ms=5 -X batch.size=16384
confluent-kafka           df.mapInArrow: a confluent_kafka.Producer per task with the same settings,
                          produce() every row, flush(), delivery errors counted by on_delivery
confluent-kafka (cached)  df.mapInArrow: one confluent_kafka.Producer per Python worker process,
                          made by the first task the process runs and kept for the later ones
                          (Spark reuses its Python workers); every task produce()s its rows and
                          flush()es, its delivery errors counted on their own
kafka-python              df.mapInArrow: a kafka.KafkaProducer per task with the same settings,
                          send() every row, flush(), delivery errors counted by errbacks
(the producers' configurations are compare.py's: tests/perf/clients.py). The cached variant's
tasks report their process and whether they made its Producer: the JSON has the producers made
per worker process (warm-up and timed write). After its timed write a Spark job drops the
workers' cached Producers, so that their idle connections do not count in the next writer's peak.

For each write: rows/s (rows over the wall time of the Spark action); the peak of the
writer's ESTABLISHED connections to the broker, from /proc/net/tcp every 0.2 s while the
write runs (the daemon's for kafka-sidecar; for the others every connection to the broker's
port but the daemon's, which stays connected throughout); the CPU seconds of the daemon, the
broker and the whole machine. Every write is then read back with librdkafka (CRCs checked)
and must hold every row, in the partition that murmur2 of its key gives (every writer
uses Java's partitioner). Before each timed write its writer writes 20 000 rows to a scratch
topic, so that Python workers' start-up is not timed (Spark stops idle workers after a
minute, so once per invocation would not do). --runs N repeats the four timed writes N
times, rotating their order, and reports every run and the medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.perf and tests.support

from tests.perf.compare import (  # noqa: E402
    BATCH_SIZE,
    KEY_COUNT,
    KEY_SIZE,
    LINGER_MS,
    PARTITIONS,
    RECORD_SIZE,
    delete_topic,
    established,
    machine_cpu_s,
    machine_facts,
    machine_notes,
    process_cpu_s,
    results_path,
    wait_for_quiet,
    write_report,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

WRITERS = ("kafka-sidecar", "confluent-kafka", "confluent-kafka (cached)", "kafka-python")
SIDECAR, CONFLUENT, CONFLUENT_CACHED, KAFKA_PYTHON = WRITERS
OTHERS = WRITERS[1:]  # kafka-sidecar's rows/s is compared with each of these
CORES = 2  # local[2]
TASKS = 8  # DataFrame partitions, so tasks per write
WARMUP_ROWS = 20_000
TICK_S = 0.2  # how often broker connections are sampled during a write
READBACK_TIMEOUT_S = 120.0
RELEASE_TASKS = 16  # tasks of the job that drops the workers' cached producers (reaches every idle worker)


# -- the DataFrame --------------------------------------------------------------------------------

def frame(spark: SparkSession, rows: int) -> DataFrame:
    """``rows`` rows in TASKS partitions: key = 16 bytes over KEY_COUNT values, value = RECORD_SIZE bytes."""
    digests = -(-RECORD_SIZE // 64)  # a sha2-256 hex digest is 64 characters
    return spark.range(rows, numPartitions=TASKS).selectExpr(
        f"cast(lpad(cast(id % {KEY_COUNT} as string), {KEY_SIZE}, 'k') as binary) as key",
        f"cast(substring(repeat(sha2(cast(id as string), 256), {digests}), 1, {RECORD_SIZE}) as binary) as value")


def cached(spark: SparkSession, rows: int) -> tuple[DataFrame, dict[str, float]]:
    """The DataFrame, cached and materialized (its sizes checked), and where Spark keeps it."""
    df = frame(spark, rows).cache()
    [row] = df.selectExpr("count(*) as n", "min(octet_length(key)) as k0", "max(octet_length(key)) as k1",
                          "min(octet_length(value)) as v0", "max(octet_length(value)) as v1").collect()
    if (row.n, row.k0, row.k1, row.v0, row.v1) != (rows, KEY_SIZE, KEY_SIZE, RECORD_SIZE, RECORD_SIZE):
        raise RuntimeError(f"the DataFrame is not what it should be: {row}")
    infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()  # type: ignore[union-attr]
    storage = {"memory_mb": round(sum(i.memSize() for i in infos) / 2**20, 1),
               "disk_mb": round(sum(i.diskSize() for i in infos) / 2**20, 1)}
    return df, storage


def expected_partitions(rows: int) -> dict[int, int]:
    """Rows per topic partition, as murmur2 of the keys places them (Java's partitioner, in every writer)."""
    from client_stub.partitioner import murmur2_partition

    counts: Counter[int] = Counter()
    for k in range(KEY_COUNT):
        key = str(k).rjust(KEY_SIZE, "k").encode()
        counts[murmur2_partition(key, PARTITIONS)] += rows // KEY_COUNT + (k < rows % KEY_COUNT)
    return dict(sorted(counts.items()))


# -- the writers ----------------------------------------------------------------------------------

def produce_rows(producer: Any, batches: Iterator[pa.RecordBatch], topic: str) -> int:
    """produce() every row of ``batches`` with a confluent_kafka.Producer (poll(0) after each batch); the rows."""
    produce, poll = producer.produce, producer.poll
    rows = 0
    for batch in batches:
        for value, key in zip(batch.column("value").to_pylist(), batch.column("key").to_pylist(), strict=True):
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:
                    poll(0.05)  # the local queue is full: serve delivery reports, retry
        poll(0)
        rows += batch.num_rows
    return rows


class ConfluentTask:
    """The mapInArrow function of one task: a confluent_kafka.Producer, produce() every row, flush()."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.config = config
        self.topic = topic

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from confluent_kafka import Producer

        errors: list[Any] = []

        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(error)

        producer = Producer({**self.config, "on_delivery": on_delivery})
        rows = produce_rows(producer, batches, self.topic)
        undelivered = producer.flush(120)
        if errors or undelivered:
            raise RuntimeError(f"confluent-kafka: {len(errors)} delivery errors (first: {errors[:1]}), "
                               f"{undelivered} records undelivered after flush(120)")
        yield pa.RecordBatch.from_pydict({"n": pa.array([rows], pa.int64())})


# confluent-kafka (cached): this Python worker process's Producer, kept across its tasks. The task
# functions are pickled by value (this file runs as __main__), and so would be a dict they refer to:
# a new, empty one in every task. So the tasks import this module by name (tests.perf.spark_compare)
# and keep the Producer in its _worker_producer, which lives as long as the worker process.
_worker_producer: dict[str, Any] = {}  # pid, key (the configuration), producer, errors
_inherited_producers: list[Any] = []  # a forked child's copies of its parent's: never destroyed there


def cached_producer(config: dict[str, Any]) -> tuple[Any, list[Any], bool]:
    """This process's Producer for ``config`` (made on first use), the list its delivery errors go to, and
    whether this call made it."""
    from confluent_kafka import Producer

    key, pid, cache = tuple(sorted(config.items())), os.getpid(), _worker_producer
    if cache.get("pid") == pid and cache.get("key") == key:
        return cache["producer"], cache["errors"], False
    if cache.get("pid") not in (None, pid):
        _inherited_producers.append(cache["producer"])  # librdkafka's threads are the parent's
    elif cache:
        release_cached_producer()  # another configuration
    errors: list[Any] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)

    producer = Producer({**config, "on_delivery": on_delivery})
    cache.clear()
    cache.update(pid=pid, key=key, producer=producer, errors=errors)
    return producer, errors, True


def release_cached_producer() -> int:
    """Flush and drop this process's cached Producer (librdkafka closes its connections); 1 if there was one."""
    cache = _worker_producer
    if cache.get("pid") != os.getpid():
        return 0
    producer = cache.pop("producer")
    cache.clear()
    producer.flush(30)
    del producer  # the last reference: the Producer is destroyed here
    return 1


def _by_name(root: str) -> Any:
    """This module imported by name in a Spark worker (the cache's home), ``root`` on sys.path."""
    if root not in sys.path:
        sys.path.insert(0, root)
    import importlib

    return importlib.import_module("tests.perf.spark_compare")


class CachedConfluentTask:
    """The mapInArrow function of one task: the worker process's cached Producer, produce() every row,
    flush(); one row (rows, the process id, 1 if this task made the Producer)."""

    def __init__(self, config: dict[str, Any], topic: str, root: str) -> None:
        self.config = config
        self.topic = topic
        self.root = root

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        module = _by_name(self.root)
        producer, errors, created = module.cached_producer(self.config)
        errors.clear()  # the previous task's flush() served all of its reports
        rows = module.produce_rows(producer, batches, self.topic)
        undelivered = producer.flush(120)
        if errors or undelivered:
            failed = len(errors), errors[:1]
            module.release_cached_producer()  # Spark's retry of the task starts with a new Producer
            raise RuntimeError(f"confluent-kafka (cached): {failed[0]} delivery errors (first: {failed[1]}), "
                               f"{undelivered} records undelivered after flush(120)")
        yield pa.RecordBatch.from_pydict({"n": pa.array([rows], pa.int64()), "pid": pa.array([os.getpid()], pa.int64()),
                                          "created": pa.array([int(created)], pa.int64())})


class ReleaseTask:
    """The mapInArrow function of the job that drops the workers' cached Producers: (process id, released)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for _ in batches:
            pass
        released = _by_name(self.root).release_cached_producer()
        yield pa.RecordBatch.from_pydict({"pid": pa.array([os.getpid()], pa.int64()),
                                          "released": pa.array([released], pa.int64())})


class KafkaPythonTask:
    """The mapInArrow function of one task: a kafka.KafkaProducer, send() every row, flush()."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.config = config
        self.topic = topic

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from kafka import KafkaProducer

        errors: list[BaseException] = []
        producer = KafkaProducer(**self.config)
        try:
            send, topic = producer.send, self.topic
            rows = 0
            for batch in batches:
                for value, key in zip(batch.column("value").to_pylist(), batch.column("key").to_pylist(),
                                      strict=True):
                    send(topic, value=value, key=key).add_errback(errors.append)
                rows += batch.num_rows
            producer.flush(timeout=120)
        finally:
            producer.close(timeout=30)
        if errors:
            raise RuntimeError(f"kafka-python: {len(errors)} delivery errors (first: {errors[0]!r})")
        yield pa.RecordBatch.from_pydict({"n": pa.array([rows], pa.int64())})


def write(writer: str, df: DataFrame, topic: str, bootstrap: str, endpoint: str
          ) -> tuple[int | None, list[tuple[int, int]]]:
    """One Spark action writing ``df`` to ``topic``: the rows the tasks say they wrote (None: the sink logs
    them), and for the cached variant each task's (process id, 1 if it made the process's Producer)."""
    from tests.perf.clients import client_options

    if writer == SIDECAR:
        df.write.format("kafka-sidecar").mode("append").option("topic", topic).option("endpoint", endpoint).save()
        return None, []
    client = KAFKA_PYTHON if writer == KAFKA_PYTHON else CONFLUENT
    config = client_options(client, bootstrap=bootstrap, linger_ms=LINGER_MS, batch_size=BATCH_SIZE)["config"]
    if writer == CONFLUENT_CACHED:
        rows = df.mapInArrow(CachedConfluentTask(config, topic, str(ROOT)), "n long, pid long, created long").collect()
        return sum(row.n for row in rows), [(row.pid, row.created) for row in rows]
    task_class = ConfluentTask if writer == CONFLUENT else KafkaPythonTask
    return sum(row.n for row in df.mapInArrow(task_class(config, topic), "n long").collect()), []


def topic_name(writer: str) -> str:
    """``writer`` as a piece of a topic name: confluent-kafka (cached) -> confluent-kafka-cached."""
    return "-".join("".join(c if c.isalnum() or c in "._-" else " " for c in writer).split())


# -- measuring ------------------------------------------------------------------------------------

def connections_of(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections of process ``pid`` to ``port`` (the client side: its sockets, by inode)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return 0
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                        count += 1
        except OSError:
            continue
    return count


class ConnectionSampler:
    """Broker connections sampled every TICK_S in a thread while in the block: the peak of all of them, and
    the peak of the writer's (the daemon's for kafka-sidecar, all but the daemon's for the others)."""

    def __init__(self, port: int, daemon_pid: int, sidecar: bool) -> None:
        self.port, self.daemon_pid, self.sidecar = port, daemon_pid, sidecar
        self.peak_all = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-sampler", daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._sample()
        self._thread.start()
        return self

    def _sample(self) -> None:
        total, daemon = established(self.port), connections_of(self.daemon_pid, self.port)
        self.peak_all = max(self.peak_all, total)
        self.peak = max(self.peak, daemon if self.sidecar else total - daemon)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def count_topic(bootstrap: str, topic: str, expected: int) -> dict[int, int]:
    """Records per partition of ``topic``, counted by reading every one back with librdkafka (CRCs checked).

    service.tools.readback.read_topic's end-of-partition rule (Tansu's ListOffsets gives only a lower bound
    of the end), without keeping the records, which read_topic holds as Python objects.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"spark-compare-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "check.crcs": True,
                         "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 100})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        lower_bounds = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        counts = dict.fromkeys(partitions, 0)
        at_end = dict.fromkeys(partitions, False)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + READBACK_TIMEOUT_S
        while not (all(at_end.values()) and sum(counts.values()) >= expected):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read back {sum(counts.values())} of {expected} records from {topic} in "
                                   f"{READBACK_TIMEOUT_S:.0f} s (per partition {counts})")
            for message in consumer.consume(10_000, 0.5):
                error, partition = message.error(), message.partition()
                if error is None:
                    counts[partition] += 1
                    at_end[partition] = False
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end[partition] = message.offset() >= lower_bounds[partition]
                else:
                    raise RuntimeError(f"consumer error on {topic} [{partition}]: {error}")
        return counts
    finally:
        consumer.close()


class Bench:
    """The broker, daemon and Spark session of one invocation, and one timed write at a time."""

    def __init__(self, spark: SparkSession, broker: Any, daemon: Any, df: DataFrame, rows: int) -> None:
        self.spark, self.broker, self.daemon = spark, broker, daemon
        self.df, self.rows = df, rows
        self.warmup_df = frame(spark, WARMUP_ROWS).cache()
        self.expected = expected_partitions(rows)

    def warm_up(self, writer: str) -> list[tuple[int, int]]:
        """WARMUP_ROWS through ``writer`` to a scratch topic: its Python workers and libraries are loaded (and
        the cached variant's Producers made); for the cached variant its tasks' (process id, made a Producer)."""
        topic = f"spark-warmup-{topic_name(writer)}-{uuid.uuid4().hex[:6]}"
        self.broker.create_topic(topic, PARTITIONS)
        try:
            return write(writer, self.warmup_df, topic, self.broker.bootstrap, self.daemon.endpoint)[1]
        finally:
            delete_topic(self.broker, topic)

    def other_connections(self) -> int:
        """ESTABLISHED connections to the broker but the daemon's."""
        return max(established(self.broker.port) - connections_of(self.daemon.pid, self.broker.port), 0)

    def release_cached(self) -> dict[str, Any]:
        """Drop the workers' cached Producers (a job of RELEASE_TASKS tasks, again if connections are left)."""
        released, pids, left = 0, set(), 0
        for _ in range(3):
            job = self.spark.range(RELEASE_TASKS, numPartitions=RELEASE_TASKS).mapInArrow(
                ReleaseTask(str(ROOT)), "pid long, released long")
            for row in job.collect():
                released += row.released
                pids.add(row.pid)
            deadline = time.monotonic() + 5.0
            while (left := self.other_connections()) and time.monotonic() < deadline:
                time.sleep(TICK_S)
            if not left:
                break
        if left:
            print(f"      {left} broker connections left after dropping the cached producers", file=sys.stderr,
                  flush=True)
        return {"released": released, "release_job_pids": len(pids), "connections_left": left}

    def measure(self, writer: str, run_index: int) -> dict[str, Any]:
        """Warm up, wait for a quiet machine, then one timed write of the DataFrame, read back and checked."""
        try:
            return self._measure(writer, run_index)
        except BaseException:
            if writer == CONFLUENT_CACHED:
                self.release_cached()
            raise

    def _measure(self, writer: str, run_index: int) -> dict[str, Any]:
        warm_tasks = self.warm_up(writer)
        topic = f"spark-{topic_name(writer)}-r{run_index}-{uuid.uuid4().hex[:6]}"
        self.broker.create_topic(topic, PARTITIONS)
        try:
            other_load = wait_for_quiet(60.0)
            broker_pid, daemon_pid = self.broker._process.pid, self.daemon.pid
            cpu_before = (process_cpu_s(daemon_pid), process_cpu_s(broker_pid), machine_cpu_s()[0])
            with ConnectionSampler(self.broker.port, daemon_pid, writer == SIDECAR) as connections:
                start = time.monotonic()
                reported, tasks = write(writer, self.df, topic, self.broker.bootstrap, self.daemon.endpoint)
                seconds = time.monotonic() - start
            cpu_after = (process_cpu_s(daemon_pid), process_cpu_s(broker_pid), machine_cpu_s()[0])
            producers = producer_counts(warm_tasks, tasks) if writer == CONFLUENT_CACHED else None
            if producers is not None:
                producers.update(self.release_cached())
            if not self.daemon.is_running():
                raise RuntimeError(f"the daemon exited; its log:\n{self.daemon.log_tail()}")
            read_start = time.monotonic()
            counts = count_topic(self.broker.bootstrap, topic, self.rows)
            figures: dict[str, Any] = {
                "seconds": round(seconds, 3),
                "rows_per_s": round(self.rows / seconds),
                "mb_per_s": round(self.rows * (RECORD_SIZE + KEY_SIZE) / seconds / 1e6, 2),
                "connections_peak": connections.peak,
                "connections_peak_all": connections.peak_all,  # every one, the idle daemon's included
                "cpu_s_daemon": round(cpu_after[0] - cpu_before[0], 2) if writer == SIDECAR else None,
                "cpu_s_broker": round(cpu_after[1] - cpu_before[1], 2),
                # all cores: Spark's JVM and Python workers, the daemon, the broker and anything else
                "cpu_s_machine": round(cpu_after[2] - cpu_before[2], 2),
                "rows_reported_by_tasks": reported,
                "rows_read_back": sum(counts.values()),
                "rows_per_partition": counts,
                "readback_s": round(time.monotonic() - read_start, 1),
                "other_load_before_cores": other_load,
            }
            if producers is not None:
                figures["producers"] = producers
            problems = []
            if counts != self.expected:
                problems.append(f"read back {sum(counts.values())} rows, per partition {counts}; "
                                f"expected {self.rows}, per partition {self.expected}")
            if reported is not None and reported != self.rows:
                problems.append(f"the tasks reported {reported} rows written, not {self.rows}")
            figures["mismatch"] = "; ".join(problems) or None
            return figures
        finally:
            delete_topic(self.broker, topic)


def producer_counts(warm_tasks: list[tuple[int, int]], tasks: list[tuple[int, int]]) -> dict[str, Any]:
    """The cached variant's tasks and Producers made per worker process, in its warm-up and timed write."""
    per_pid: dict[int, dict[str, int]] = {}
    for phase, phase_tasks in (("warmup", warm_tasks), ("write", tasks)):
        for pid, created in phase_tasks:
            counts = per_pid.setdefault(pid, {"tasks": 0, "created": 0, "created_in_write": 0})
            counts["tasks"] += 1
            counts["created"] += created
            if phase == "write":
                counts["created_in_write"] += created
    return {"tasks": len(warm_tasks) + len(tasks), "pids": len(per_pid),
            "created": sum(c["created"] for c in per_pid.values()),
            "created_in_write": sum(c["created_in_write"] for c in per_pid.values()),
            "per_pid": {str(pid): counts for pid, counts in sorted(per_pid.items())}}


# -- the report -----------------------------------------------------------------------------------

def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """kafka-sidecar's rows/s over each other writer's."""
    sidecar = (results.get(SIDECAR) or {}).get("rows_per_s")
    found: dict[str, float | None] = {}
    for other in OTHERS:
        theirs = (results.get(other) or {}).get("rows_per_s")
        found[other] = round(sidecar / theirs, 3) if sidecar and theirs else None
    return found


def table(results: dict[str, dict[str, Any]], run_ratios: dict[str, float | None]) -> str:
    """One line per writer: seconds, rows/s, connections, CPU, the read-back's verdict."""
    header = ["writer", "seconds", "rows/s", "MB/s", "connections peak (all)", "CPU s daemon / broker / machine",
              "read back"]
    rows = [header]
    for writer in WRITERS:
        f = results.get(writer)
        if f is None:
            continue
        if "error" in f:
            rows.append([writer, "FAILED", "-", "-", "-", "-", f["error"][:60]])
            continue
        daemon = f"{f['cpu_s_daemon']:.1f}" if isinstance(f.get("cpu_s_daemon"), (int, float)) else "-"
        rows.append([writer, f"{f['seconds']:.2f}", f"{f['rows_per_s']:,.0f}", f"{f['mb_per_s']:.1f}",
                     f"{f['connections_peak']:.0f} ({f['connections_peak_all']:.0f})",
                     f"{daemon} / {f['cpu_s_broker']:.1f} / {f['cpu_s_machine']:.1f}",
                     "MISMATCH" if f.get("mismatch") else f"{f['rows_read_back']:,.0f} ok"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines.append("kafka-sidecar rows/s over " + ", ".join(
        f"{other}: {value:.2f}" if value is not None else f"{other}: -" for other, value in run_ratios.items()))
    return "\n".join(lines)


def medians(runs: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, float | None]]:
    """The median of every numeric figure per writer, and of every run's ratios (failed writes left out)."""
    results: dict[str, dict[str, Any]] = {}
    for writer in WRITERS:
        values: dict[str, list[float]] = {}
        for run in runs:
            figures = run["results"].get(writer) or {}
            if "error" in figures:
                continue
            for metric, value in figures.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(metric, []).append(value)
        if values:
            results[writer] = {metric: statistics.median(v) for metric, v in values.items()}
    run_ratios: dict[str, float | None] = {}
    for other in OTHERS:
        values = [r["ratios"][other] for r in runs if r["ratios"].get(other) is not None]
        run_ratios[other] = round(statistics.median(values), 3) if values else None
    return results, run_ratios


def targets(runs: list[dict[str, Any]], median_ratios: dict[str, float | None]) -> list[dict[str, Any]]:
    """kafka-sidecar >= 1.0 x confluent-kafka's rows/s (median of the runs' ratios), one broker connection."""
    peaks = [r["results"][SIDECAR]["connections_peak"] for r in runs
             if "connections_peak" in r["results"].get(SIDECAR, {})]
    ratio = median_ratios.get(CONFLUENT)
    return [
        {"target": "kafka-sidecar rows/s / confluent-kafka rows/s >= 1.0", "actual": ratio,
         "ok": None if ratio is None else ratio >= 1.0},
        {"target": "kafka-sidecar broker connections peak == 1 (every run)", "actual": peaks,
         "ok": None if not peaks else all(p == 1 for p in peaks)},
    ]


def informative(median_ratios: dict[str, float | None]) -> list[dict[str, Any]]:
    """Figures reported beside the targets, not checked: kafka-sidecar against the cached confluent-kafka."""
    return [{"figure": "kafka-sidecar rows/s / confluent-kafka (cached) rows/s (not a target)",
             "actual": median_ratios.get(CONFLUENT_CACHED)}]


# -- main -----------------------------------------------------------------------------------------

def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the DataFrame (default 2 000 000)")
    parser.add_argument("--runs", type=int, default=1, help="how many times to time the four writes (default 1)")
    parser.add_argument("--json", default=None,
                        help="where to write the results (default tests/perf/results/spark-compare-<time>.json)")
    args = parser.parse_args(argv)
    if args.rows < TASKS or args.runs < 1:
        parser.error(f"--rows must be at least {TASKS} and --runs positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # SIGTERM ends the run as Ctrl-C does: every finally and with below stops what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import pyspark

    from client_stub import spark as sidecar_spark
    from tests.perf.clients import sidecar_settings
    from tests.support.broker import TansuBroker
    from tests.support.sidecar import SidecarProcess
    from tests.support.spark import local_session

    json_path = results_path(args.json, "spark-compare")
    facts = {**machine_facts(), "nproc": len(os.sched_getaffinity(0)), "pyspark": pyspark.__version__}
    notes = machine_notes(facts)
    print(f"spark_compare: {args.rows:,} rows, {TASKS} tasks on local[{CORES}], {args.runs} run(s); "
          f"{facts['nproc']} cores ({facts['cpu']}), pyspark {facts['pyspark']}, git {facts['git']['head'][:10]}"
          f"{' (uncommitted changes)' if facts['git']['modified'] else ''}", flush=True)
    for note in notes:
        print(f"note: {note}")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": facts, "notes": notes, "runs": [],
        "settings": {"rows": args.rows, "runs": args.runs, "spark_master": f"local[{CORES}]", "tasks": TASKS,
                     "topic_partitions": PARTITIONS, "value_bytes": RECORD_SIZE, "key_bytes": KEY_SIZE,
                     "distinct_keys": KEY_COUNT, "acks": "all", "idempotence": True, "linger_ms": LINGER_MS,
                     "batch_size": BATCH_SIZE, "warmup_rows": WARMUP_ROWS, "connection_sample_s": TICK_S},
    }
    failures = 0
    try:
        with TansuBroker() as broker, SidecarProcess(broker.bootstrap, settings=sidecar_settings(
                linger_ms=LINGER_MS, batch_size=BATCH_SIZE)) as daemon:
            started = time.monotonic()
            spark = local_session(CORES, "kafka-sidecar-spark-compare")
            try:
                sidecar_spark.register(spark)
                df, storage = cached(spark, args.rows)
                report["settings"]["dataframe_cache"] = storage
                print(f"session and DataFrame ready in {time.monotonic() - started:.1f} s (cached: "
                      f"{storage['memory_mb']} MB in memory, {storage['disk_mb']} MB on disk)", flush=True)
                bench = Bench(spark, broker, daemon, df, args.rows)
                failures = run_all(bench, args.runs, report, json_path)
            finally:
                spark.stop()
    finally:
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_report(json_path, report)
        print(f"\nresults: {json_path}")
    return 1 if failures else 0


def run_all(bench: Bench, runs: int, report: dict[str, Any], json_path: Path) -> int:
    """The timed writes of every run, their tables, the medians and the targets; how many writes failed."""
    failures = 0
    for run_index in range(runs):
        order = [WRITERS[(i + run_index) % len(WRITERS)] for i in range(len(WRITERS))]
        print(f"\n== run {run_index + 1} of {runs} (order: {', '.join(order)})", flush=True)
        results: dict[str, dict[str, Any]] = {}
        entry: dict[str, Any] = {"index": run_index, "order": order, "results": results}
        report["runs"].append(entry)
        for writer in order:
            print(f"  {writer:24} ...", flush=True)
            try:
                figures = bench.measure(writer, run_index)
            except Exception as exc:
                failures += 1
                figures = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {writer:24} FAILED: {figures['error']}", file=sys.stderr, flush=True)
            else:
                print(f"  {writer:24} {figures['rows_per_s']:,} rows/s in {figures['seconds']:.2f} s, connections "
                      f"peak {figures['connections_peak']}, read back {figures['rows_read_back']:,} in "
                      f"{figures['readback_s']} s", flush=True)
                if "producers" in figures:
                    p = figures["producers"]
                    print(f"  {'':24} producers made: {p['created']} in {p['pids']} worker processes over "
                          f"{p['tasks']} tasks (warm-up and timed write), {p['created_in_write']} in the timed write; "
                          f"per process {p['per_pid']}; dropped afterwards: {p['released']}", flush=True)
                if figures["mismatch"]:
                    failures += 1
                    print(f"  {writer:24} MISMATCH: {figures['mismatch']}", file=sys.stderr, flush=True)
            results[writer] = figures
            write_report(json_path, report)
        entry["ratios"] = ratios(results)
        print(f"\nrun {run_index + 1}:\n{table(results, entry['ratios'])}", flush=True)
    median_results, median_ratios = medians(report["runs"])
    checks = targets(report["runs"], median_ratios)
    infos = informative(median_ratios)
    report["median"] = {"results": median_results, "ratios": median_ratios, "targets": checks,
                        "informative": infos}
    if runs > 1:
        print(f"\nmedian of {runs} runs (each ratio: the median of the runs' ratios):\n"
              f"{table(median_results, median_ratios)}")
    print("targets:")
    for check in checks:
        print(f"  {({True: 'ok  ', False: 'MISS', None: 'n/a '})[check['ok']]} {check['target']}: {check['actual']}")
    for info in infos:
        print(f"  info {info['figure']}: {info['actual']}")
    write_report(json_path, report)
    return failures


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("spark_compare: interrupted", file=sys.stderr)
        sys.exit(130)
