"""Hand-built ProducerBatches for the unit tests of the Sender side (no shared memory, no network)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from client_stub.contract.records import Header
from service.network.metadata import Cluster, Node, PartitionInfo
from service.producer.accumulator import RecordAccumulator
from service.producer.batch import ProducerBatch, TopicPartition
from tests.support.batches import encode_records

BASE_TS = 1_700_000_000_000
T0 = TopicPartition("t", 0)


def record_specs(count: int, *, prefix: str = "r") -> list[tuple[int, bytes | None, bytes | None, list[Header]]]:
    """``count`` (timestamp delta, key, value, headers) tuples, varied enough to catch a mix-up."""
    specs = []
    for i in range(count):
        key = None if i % 3 == 2 else f"{prefix}-key-{i}".encode()
        value = None if i % 5 == 4 else f"{prefix}-value-{i}".encode() * (1 + i % 4)
        headers: list[Header] = [(b"h", f"{i}".encode())] if i % 2 else [(b"a", None), (b"b", b"x" * i)]
        specs.append((i * 7, key, value, headers))
    return specs


def make_batch(tp: TopicPartition = T0, count: int = 3, *, created_ms: int = 0,
               specs: Sequence[tuple[int, bytes | None, bytes | None, Sequence[Header]]] | None = None,
               base_timestamp: int = BASE_TS, on_complete: Callable[[ProducerBatch], None] | None = None,
               release: Callable[[], None] | None = None, **kwargs: Any) -> ProducerBatch:
    """A sealed batch of ``count`` records (or of ``specs``), as the front hands them to the accumulator."""
    specs = record_specs(count) if specs is None else specs
    return ProducerBatch(tp, encode_records(specs), len(specs), base_timestamp=base_timestamp,
                         max_timestamp=base_timestamp + max(ts for ts, *_ in specs), created_ms=created_ms,
                         on_complete=on_complete, release=release, **kwargs)


def make_cluster(leaders: dict[TopicPartition, int | None], node_ids: Sequence[int] = (1, 2, 3)) -> Cluster:
    """Brokers ``node_ids`` on loopback and the given partition leaders (None: no leader known)."""
    nodes = {i: Node(i, "127.0.0.1", 9000 + i) for i in node_ids}
    partitions: dict[str, dict[int, PartitionInfo]] = {}
    for tp, leader in leaders.items():
        partitions.setdefault(tp.topic, {})[tp.partition] = PartitionInfo(
            tp.topic, tp.partition, -1 if leader is None else leader, 0)
    return Cluster(nodes=nodes, partitions=partitions)


def queued(accumulator: RecordAccumulator, tp: TopicPartition) -> list[ProducerBatch]:
    """The batches queued for ``tp``, in the order they will be drained (read off the accumulator's own queue:
    the producer itself only ever drains it)."""
    return list(accumulator._batches.get(tp, ()))
