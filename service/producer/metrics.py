"""The sender's figures, overall and per broker (the Java producer's sender sensors)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class Stat:
    """Count, sum and max of a measured quantity (latency, queue time)."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def record(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value > self.max:
            self.max = value

    @property
    def avg(self) -> float:
        return self.total / self.count if self.count else 0.0

    def snapshot(self) -> dict[str, float]:
        return {"count": self.count, "avg": self.avg, "max": self.max}


@dataclass(frozen=True, slots=True)
class Gauges:
    """Figures of the moment, read when a snapshot is taken (Java's gauges), overall and per node id."""

    requests_in_flight: int = 0
    batches_queued: int = 0
    node_requests_in_flight: dict[int, int] = field(default_factory=dict)
    # Batches queued for the partitions each node leads.
    node_queue_size: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class NodeMetrics:
    requests_sent: int = 0
    bytes_sent: int = 0
    responses_received: int = 0
    request_latency_ms: Stat = field(default_factory=Stat)


@dataclass(slots=True)
class SenderMetrics:
    requests_sent: int = 0
    batches_sent: int = 0
    records_sent: int = 0
    bytes_sent: int = 0
    batches_succeeded: int = 0
    records_succeeded: int = 0
    batches_retried: int = 0
    records_retried: int = 0
    batches_failed: int = 0
    records_failed: int = 0
    batches_expired: int = 0
    records_expired: int = 0
    batches_aborted: int = 0
    # Failed before they were sent: their records were not what their clients said (counted as failed too).
    batches_corrupt: int = 0
    batch_splits: int = 0
    request_latency_ms: Stat = field(default_factory=Stat)
    queue_time_ms: Stat = field(default_factory=Stat)
    nodes: defaultdict[int, NodeMetrics] = field(default_factory=lambda: defaultdict(NodeMetrics))
    # Reads the gauges; the sender that owns what they measure sets it.
    gauges: Callable[[], Gauges] = field(default=Gauges, repr=False, compare=False)

    def record_request(self, node_id: int, batches: int, records: int, size: int) -> None:
        self.requests_sent += 1
        self.batches_sent += batches
        self.records_sent += records
        self.bytes_sent += size
        node = self.nodes[node_id]
        node.requests_sent += 1
        node.bytes_sent += size

    def record_response(self, node_id: int, latency_ms: float) -> None:
        self.request_latency_ms.record(latency_ms)
        node = self.nodes[node_id]
        node.responses_received += 1
        node.request_latency_ms.record(latency_ms)

    def snapshot(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gauges"}
        data["request_latency_ms"] = self.request_latency_ms.snapshot()
        data["queue_time_ms"] = self.queue_time_ms.snapshot()
        gauges = self.gauges()
        data["requests_in_flight"] = gauges.requests_in_flight
        data["batches_queued"] = gauges.batches_queued
        node_ids = self.nodes.keys() | gauges.node_requests_in_flight.keys() | gauges.node_queue_size.keys()
        data["nodes"] = {}
        for node_id in sorted(node_ids):
            n = self.nodes.get(node_id) or NodeMetrics()
            data["nodes"][node_id] = {"requests_sent": n.requests_sent, "bytes_sent": n.bytes_sent,
                                      "responses_received": n.responses_received,
                                      "request_latency_ms": n.request_latency_ms.snapshot(),
                                      "requests_in_flight": gauges.node_requests_in_flight.get(node_id, 0),
                                      "queue_size": gauges.node_queue_size.get(node_id, 0)}
        return data
