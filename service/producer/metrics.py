"""The sender's metrics, as the Java producer's Sender keeps them (its SenderMetrics).

Overall (``producer-metrics``), per topic (``producer-topic-metrics``) and per broker
(the request latency of ``producer-node-metrics``; the rest of a node's metrics are the
Selector's), under Kafka's names and with Kafka's meanings: a record is counted as sent
when a ProduceRequest carries it (again on each retry), as an error when its batch fails
for good (expired included), as a retry when its batch goes back to the queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..metrics import NUM_SAMPLES, SAMPLE_WINDOW_MS, Sensor, avg_max, count_meter, meter


@dataclass(frozen=True, slots=True)
class Gauges:
    """Values of the moment, read when the metrics are (Java's gauges), overall and per node id."""

    requests_in_flight: int = 0
    batches_queued: int = 0
    node_requests_in_flight: dict[int, int] = field(default_factory=dict)
    # Batches queued for the partitions each node leads.
    node_queue_size: dict[int, int] = field(default_factory=dict)


class TopicMetrics:
    """One topic's sensors (Java's ``topic.<name>.*``)."""

    __slots__ = ("records", "bytes", "compression_rate", "retries", "errors")

    def __init__(self, window_ms: int, num_samples: int) -> None:
        self.records = Sensor(window_ms, num_samples)
        self.bytes = Sensor(window_ms, num_samples)
        self.compression_rate = Sensor(window_ms, num_samples)
        self.retries = Sensor(window_ms, num_samples)
        self.errors = Sensor(window_ms, num_samples)

    def read(self, now: int) -> dict[str, float]:
        """The topic's producer-topic-metrics."""
        return {**meter(self.records, "record-send", now), **meter(self.bytes, "byte", now),
                "compression-rate": self.compression_rate.avg(now), **meter(self.retries, "record-retry", now),
                **meter(self.errors, "record-error", now)}


class SenderMetrics:
    """What the sender measures, recorded as it sends and settles batches."""

    def __init__(self, window_ms: int = SAMPLE_WINDOW_MS, num_samples: int = NUM_SAMPLES) -> None:
        self.window_ms = window_ms
        self.num_samples = num_samples
        # Java's sensors: records per request (record-send-rate and -total, records-per-request-avg), each
        # batch's size on the wire and compression ratio, each batch's time queued, each produce response's
        # latency and throttle time, records retried and failed, batches split.
        self.records_per_request = self._sensor()
        self.batch_size = self._sensor()
        self.compression_rate = self._sensor()
        self.queue_time = self._sensor()
        self.request_latency = self._sensor()
        self.throttle_time = self._sensor()
        self.retries = self._sensor()
        self.errors = self._sensor()
        self.splits = self._sensor()
        self.topics: dict[str, TopicMetrics] = {}
        self.node_latency: dict[int, Sensor] = {}
        # The sidecar's own: batches failed before they were sent, their records not what their clients said
        # (their records are errors too).
        self.batches_corrupt = 0
        # Reads the gauges; the sender that owns what they measure sets it.
        self.gauges: Callable[[], Gauges] = Gauges

    def _sensor(self) -> Sensor:
        return Sensor(self.window_ms, self.num_samples)

    def topic(self, topic: str) -> TopicMetrics:
        metrics = self.topics.get(topic)
        if metrics is None:
            metrics = self.topics[topic] = TopicMetrics(self.window_ms, self.num_samples)
        return metrics

    @property
    def records_sent(self) -> int:
        return int(self.records_per_request.total)

    # -- recording -------------------------------------------------------------------------------

    def record_batch(self, topic: str, records: int, size: int, compression_rate: float, queue_time_ms: int,
                     now: int) -> None:
        """A batch going out in a ProduceRequest: ``size`` bytes on the wire, header included."""
        self.batch_size.record(size, now)
        self.compression_rate.record(compression_rate, now)
        self.queue_time.record(queue_time_ms, now)
        metrics = self.topic(topic)
        metrics.records.record(records, now)
        metrics.bytes.record(size, now)
        metrics.compression_rate.record(compression_rate, now)

    def record_request(self, records: int, now: int) -> None:
        """A ProduceRequest of ``records`` records sent (after each of its batches' record_batch)."""
        self.records_per_request.record(records, now)

    def record_response(self, node_id: int, latency_ms: float, throttle_time_ms: int | None, now: int) -> None:
        """A produce response (``throttle_time_ms`` None: none came, acks=0)."""
        self.request_latency.record(latency_ms, now)
        if throttle_time_ms is not None:
            self.throttle_time.record(throttle_time_ms, now)
        sensor = self.node_latency.get(node_id)
        if sensor is None:
            sensor = self.node_latency[node_id] = self._sensor()
        sensor.record(latency_ms, now)

    def record_retry(self, topic: str, records: int, now: int) -> None:
        """A batch of ``records`` back to the head of its queue."""
        self.retries.record(records, now)
        self.topic(topic).retries.record(records, now)

    def record_error(self, topic: str, records: int, now: int) -> None:
        """A batch of ``records`` failed for good (expired included)."""
        self.errors.record(records, now)
        self.topic(topic).errors.record(records, now)

    def record_split(self, now: int) -> None:
        self.splits.record(1, now)

    # -- reading ---------------------------------------------------------------------------------

    def producer_metrics(self, now: int) -> dict[str, float]:
        """The sender's part of producer-metrics."""
        gauges = self.gauges()
        return {**meter(self.records_per_request, "record-send", now),
                "records-per-request-avg": self.records_per_request.avg(now),
                **avg_max(self.batch_size, "batch-size", now),
                "compression-rate-avg": self.compression_rate.avg(now),
                **avg_max(self.queue_time, "record-queue-time", now),
                **avg_max(self.request_latency, "request-latency", now),
                **avg_max(self.throttle_time, "produce-throttle-time", now),
                **meter(self.retries, "record-retry", now),
                **meter(self.errors, "record-error", now),
                **count_meter(self.splits, "batch-split", now),
                "requests-in-flight": float(gauges.requests_in_flight),
                "batches-queued": float(gauges.batches_queued)}

    def node_metrics(self, now: int) -> dict[int, dict[str, float]]:
        """The sender's part of producer-node-metrics: request latency, and the sidecar's queue and requests in
        flight per broker."""
        gauges = self.gauges()
        metrics: dict[int, dict[str, float]] = {}
        for node_id in self.node_latency.keys() | gauges.node_requests_in_flight.keys():
            sensor = self.node_latency.get(node_id) or self._sensor()
            metrics[node_id] = {**avg_max(sensor, "request-latency", now),
                                "requests-in-flight": float(gauges.node_requests_in_flight.get(node_id, 0)),
                                "batches-queued": float(gauges.node_queue_size.get(node_id, 0))}
        return metrics

    def topic_metrics(self, now: int) -> dict[str, dict[str, Any]]:
        return {topic: metrics.read(now) for topic, metrics in sorted(self.topics.items())}
