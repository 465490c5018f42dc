"""What one task of the Spark sink does, without Spark: Arrow batches in, records confirmed by Kafka, totals out.

The task's Producer is cached per process and starts afresh in a forked child (Spark forks its
Python workers); a task waits for every report and fails with the Kafka error of a record that
failed, or when its records are not confirmed within its delivery.timeout.ms. Commit and abort
on the driver log the totals and what was aborted.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from client_stub.errors import KafkaTimeoutError, SidecarUnavailableError  # noqa: E402
from client_stub.spark.datasource import (  # noqa: E402
    KafkaSidecarStreamWriter,
    KafkaSidecarWriter,
    SidecarCommitMessage,
)
from client_stub.spark.options import SinkOptions  # noqa: E402
from client_stub.spark.schema import Columns  # noqa: E402
from client_stub.spark.task import Origin, WriteTotals, producer_for, write_batches  # noqa: E402
from service.tools.readback import read_topic  # noqa: E402

FORK = multiprocessing.get_context("fork")
# A daemon behind a FaultProxy: a blackholed request times out quickly, and its batch expires soon after.
SHORT_TIMEOUTS = {"request.timeout.ms": 1000, "delivery.timeout.ms": 2000, "linger.ms": 0, "retry.backoff.ms": 50}


def numbered(first: int, count: int, topics: tuple[str, ...] | None = None) -> pa.RecordBatch:
    columns = {"value": pa.array([f"v{n}".encode() for n in range(first, first + count)]),
               "key": pa.array([None if n % 4 == 0 else f"k{n}" for n in range(first, first + count)])}
    if topics:
        columns["topic"] = pa.array([topics[n % len(topics)] for n in range(first, first + count)])
    return pa.RecordBatch.from_pydict(columns)


def test_a_task_sends_every_row_waits_for_kafka_and_counts_per_topic(broker, topic_factory, sidecar) -> None:
    topics = (topic_factory(3), topic_factory(3))
    daemon = sidecar(broker.bootstrap)
    batches = [numbered(0, 700, topics), numbered(700, 300, topics)]
    totals = write_batches(iter(batches), SinkOptions(endpoint=daemon.endpoint), Columns(key=True, topic=True),
                           Origin("job", 0, 0))
    expected = WriteTotals(tasks=1)
    for n in range(1000):
        expected.records[topics[n % 2]] += 1
        expected.bytes[topics[n % 2]] += len(f"v{n}") + (0 if n % 4 == 0 else len(f"k{n}"))
    assert totals == expected
    for index, topic in enumerate(topics):
        values = sorted(r.value for r in read_topic(broker.bootstrap, topic, expected=500))  # type: ignore[type-var]
        assert values == sorted(f"v{n}".encode() for n in range(index, 1000, 2))


def _child_task(endpoint: str, topic: str, results: multiprocessing.Queue) -> None:
    options = SinkOptions(topic=topic, endpoint=endpoint)
    totals = write_batches(iter([numbered(1000, 500)]), options, Columns(key=True), Origin("job", 0, 1))
    results.put(totals.total_records)


def test_the_producer_is_cached_per_process_and_a_forked_worker_starts_afresh(broker, topic_factory,
                                                                              sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap)
    options = SinkOptions(topic=topic, endpoint=daemon.endpoint)
    write_batches(iter([numbered(0, 500)]), options, Columns(key=True), Origin("job", 0, 0))
    producer = producer_for(options)
    assert producer_for(SinkOptions(topic="other", endpoint=daemon.endpoint)) is producer  # topics share it
    assert producer_for(SinkOptions(topic=topic, endpoint=daemon.endpoint, linger_ms=50)) is not producer
    # pyspark.daemon forks its workers from a process that may have used the sink already.
    results: multiprocessing.Queue = FORK.Queue()
    child = FORK.Process(target=_child_task, args=(daemon.endpoint, topic, results))
    child.start()
    assert results.get(timeout=60) == 500
    child.join(30)
    assert child.exitcode == 0
    assert daemon.client_id_of(child.pid) != daemon.client_id_of(multiprocessing.current_process().pid)
    # The parent's Producer still works after the fork.
    write_batches(iter([numbered(1500, 500)]), options, Columns(key=True), Origin("job", 0, 2))
    values = Counter(r.value for r in read_topic(broker.bootstrap, topic, expected=1500))
    assert values == Counter(f"v{n}".encode() for n in [*range(500), *range(1000, 2000)])


def test_a_record_kafka_did_not_take_fails_the_task_with_its_error(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("expiring", 1)
    daemon = sidecar(proxy.address, settings=SHORT_TIMEOUTS)
    options = SinkOptions(topic="expiring", endpoint=daemon.endpoint)
    write_batches(iter([numbered(0, 10)]), options, Columns(key=True), Origin("job", 0, 0))
    proxy.blackhole()
    with pytest.raises(KafkaTimeoutError, match=r"Expiring \d+ record\(s\) for expiring-0:\d+ ms has passed"):
        write_batches(iter([numbered(10, 100)]), options, Columns(key=True), Origin("job", 0, 0))


def test_a_task_not_confirmed_within_its_delivery_timeout_fails(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("slow", 1)
    # A short request timeout: once the proxy heals, the requests it swallowed are sent again soon.
    daemon = sidecar(proxy.address, settings={"request.timeout.ms": 3000})
    options = SinkOptions(topic="slow", endpoint=daemon.endpoint, delivery_timeout_ms=1000)
    write_batches(iter([numbered(0, 10)]), options, Columns(key=True), Origin("job", 0, 0))
    proxy.blackhole()
    with pytest.raises(KafkaTimeoutError, match=r"100 records of the task were not confirmed within "
                                                r"delivery.timeout.ms=1000 \(option of the sink\)"):
        write_batches(iter([numbered(10, 100)]), options, Columns(key=True), Origin("job", 0, 0))
    proxy.heal()
    assert producer_for(options).flush(60) == 0


def test_large_and_view_types_timestamps_and_nulls_arrive_as_written(broker, topic_factory, sidecar) -> None:
    # Spark sends large_string/large_binary with spark.sql.execution.arrow.useLargeVarTypes, and
    # timestamp_ntz without a time zone; keys, partitions, timestamps and headers may be null.
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array(["é0", "v1", None, "v3"], pa.large_string()),
        "key": pa.array([b"k0", None, b"k2", b"k3"], pa.large_binary()),
        "partition": pa.array([2, None, 0, 1], pa.int64()),
        "timestamp": pa.array([1_700_000_000_123_456, None, 0, 5_000], pa.timestamp("us")),
        "headers": pa.array([[{"key": "h", "value": b"x"}], None, [], [{"key": "n", "value": None}]],
                            pa.list_(header)),
    })
    columns = Columns(key=True, partition=True, timestamp=True, headers=True)
    totals = write_batches(iter([batch]), SinkOptions(topic=topic, endpoint=daemon.endpoint), columns,
                           Origin("job", 0, 0))
    assert (totals.records[topic], totals.bytes[topic]) == (4, len("é0".encode()) + 2 + 2 + 2 + 2 + 2)
    read = {r.key: r for r in read_topic(broker.bootstrap, topic, expected=4)}
    assert (read[b"k0"].value, read[b"k0"].partition, read[b"k0"].timestamp_ms, read[b"k0"].headers) == (
        "é0".encode(), 2, 1_700_000_000_123, [("h", b"x")])
    assert (read[None].value, read[None].headers) == (b"v1", [])
    assert (read[b"k2"].value, read[b"k2"].partition, read[b"k2"].timestamp_ms) == (None, 0, 0)
    assert (read[b"k3"].partition, read[b"k3"].timestamp_ms, read[b"k3"].headers) == (1, 5, [("n", None)])


def test_a_row_the_producer_refuses_is_named(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap)
    batches = [pa.RecordBatch.from_pydict({"value": [b"v"] * 10, "partition": [0] * 10}),
               pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c"], "partition": [0, 1, 5]})]
    with pytest.raises(ValueError, match="partition 5 of topic .* does not exist") as refused:
        write_batches(iter(batches), SinkOptions(topic=topic, endpoint=daemon.endpoint), Columns(partition=True),
                      Origin("job", 0, 3))
    assert refused.value.__notes__ == ["kafka-sidecar: while sending row 12 of Spark partition 3"]


def _restart_between(batches: list[pa.RecordBatch], daemon, **settings: object) -> Iterator[pa.RecordBatch]:
    yield batches[0]
    daemon.kill()
    daemon.settings.update({key: str(value) for key, value in settings.items()})
    daemon.start()
    yield batches[1]


def test_a_task_across_a_daemon_restart_commits_every_row(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    # Batches that stay open until the task's flush: the restarted daemon gets them from the task.
    options = SinkOptions(topic=topic, endpoint=daemon.endpoint, linger_ms=600_000)
    totals = write_batches(_restart_between([numbered(0, 100), numbered(100, 100)], daemon), options,
                           Columns(key=True), Origin("job", 0, 0))
    assert totals.records == Counter({topic: 200})
    values = {r.value for r in read_topic(broker.bootstrap, topic, expected=200)}
    assert values == {f"v{n}".encode() for n in range(200)}


def test_a_task_whose_records_the_daemon_lost_fails_rather_than_commits(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap, settings={"batch.size": 16384})
    options = SinkOptions(topic=topic, endpoint=daemon.endpoint, linger_ms=600_000)
    # Restarted with another batch.size, the daemon cannot take the task's session back: what it held
    # is of unknown fate, and the task must fail (Spark runs it again) rather than commit.
    with pytest.raises(SidecarUnavailableError, match="could not take the session back"):
        write_batches(_restart_between([numbered(0, 100), numbered(100, 100)], daemon, **{"batch.size": 32768}),
                      options, Columns(key=True), Origin("job", 0, 0))


def test_commit_and_abort_log_the_totals_and_what_was_aborted(caplog) -> None:
    caplog.set_level(logging.INFO, logger="client_stub.spark")
    writer = KafkaSidecarWriter(SinkOptions(topic="t"), Columns(), "job-1")
    task = WriteTotals(records=Counter({"t": 3}), bytes=Counter({"t": 30}), tasks=1)
    writer.commit([SidecarCommitMessage(task), SidecarCommitMessage(task)])
    writer.abort([SidecarCommitMessage(task), None, None])
    stream = KafkaSidecarStreamWriter(SinkOptions(topic="t"), Columns())
    stream.commit([SidecarCommitMessage(task)], 7)
    # The sink's own messages (a producer of an earlier test may say that its daemon went).
    assert [r.getMessage() for r in caplog.records if r.name == "client_stub.spark"] == [
        "kafka-sidecar job job-1 committed: 6 records, 60 bytes in 2 tasks (t: 6 records, 60 bytes)",
        "kafka-sidecar job job-1 aborted: 2 of 3 tasks did not commit (the job's error says why); the tasks that did "
        "had written 3 records, 30 bytes in 1 tasks (t: 3 records, 30 bytes), which stay in Kafka (at-least-once: "
        "a rerun writes them again)",
        "kafka-sidecar micro-batch 7 committed: 3 records, 30 bytes in 1 tasks (t: 3 records, 30 bytes)",
    ]
