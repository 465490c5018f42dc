"""Kafka's way of keeping a figure, and the daemon's figures under the Java producer's names.

A Kafka client measures with sensors: each keeps a cumulative total and samples of
``metrics.sample.window.ms`` (30 s), of which ``metrics.num.samples`` (2) are kept; its
``-rate``, ``-avg`` and ``-max`` are taken over the kept samples, its ``-total`` since the
start. :class:`Sensor` is that, for one measured quantity. :func:`daemon_figures` reads
every figure of a running daemon into one mapping, by the names Kafka's producer gives
them (``producer-metrics``, ``producer-node-metrics``, ``producer-topic-metrics``) beside
the sidecar's own: what ``kafka-sidecar stats`` prints and the Prometheus page exposes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .buffer_pool import BufferPool
    from .front import SidecarFront
    from .producer.core import ProducerCore

# Kafka's defaults for metrics.sample.window.ms and metrics.num.samples.
SAMPLE_WINDOW_MS = 30_000
NUM_SAMPLES = 2


class Sensor:
    """One measured quantity: its cumulative count and total, and the rate, average and maximum of its
    values over the last samples (Kafka's Rate, Avg and Max over a SampledStat)."""

    __slots__ = ("count", "total", "window_ms", "num_samples", "_samples")

    def __init__(self, window_ms: int = SAMPLE_WINDOW_MS, num_samples: int = NUM_SAMPLES) -> None:
        self.count = 0
        self.total = 0.0
        self.window_ms = window_ms
        self.num_samples = num_samples
        # Each sample: [start ms, count, total, max], the newest last.
        self._samples: list[list[Any]] = []

    def record(self, value: float, now_ms: int) -> None:
        self.count += 1
        self.total += value
        samples = self._samples
        if not samples or now_ms - samples[-1][0] >= self.window_ms:
            samples.append([now_ms, 0, 0.0, -math.inf])
            if len(samples) > self.num_samples:
                del samples[0]
        sample = samples[-1]
        sample[1] += 1
        sample[2] += value
        if value > sample[3]:
            sample[3] = value

    def _live(self, now_ms: int) -> list[list[Any]]:
        # As Kafka's purgeObsoleteSamples: a sample older than all the samples' windows counts no more.
        expiry = self.window_ms * self.num_samples
        return [s for s in self._samples if now_ms - s[0] < expiry]

    def rate(self, now_ms: int) -> float:
        """The values' sum a second over the kept samples (Kafka's Rate)."""
        return self._rate(now_ms, 2)

    def count_rate(self, now_ms: int) -> float:
        """How many values a second were recorded over the kept samples (Kafka's Rate of a WindowedCount)."""
        return self._rate(now_ms, 1)

    def _rate(self, now_ms: int, field: int) -> float:
        # As Kafka's Rate: over at least num_samples - 1 whole windows, so that a new sensor's first values do
        # not read as a burst.
        live = self._live(now_ms)
        elapsed = now_ms - live[0][0] if live else 0
        full_windows = elapsed // self.window_ms
        if full_windows < self.num_samples - 1:
            elapsed += (self.num_samples - 1 - full_windows) * self.window_ms
        return sum(s[field] for s in live) * 1000 / max(elapsed, 1)

    def avg(self, now_ms: int) -> float:
        """The values' average over the kept samples; NaN without any (as Kafka's Avg)."""
        live = self._live(now_ms)
        count = sum(s[1] for s in live)
        return sum(s[2] for s in live) / count if count else math.nan

    def max(self, now_ms: int) -> float:
        """The largest value of the kept samples; NaN without any (as Kafka's Max)."""
        live = self._live(now_ms)
        return max(s[3] for s in live) if live else math.nan


def meter(sensor: Sensor, name: str, now_ms: int) -> dict[str, float]:
    """Kafka's Meter: ``name-rate`` and ``name-total`` of the values' sum."""
    return {f"{name}-rate": sensor.rate(now_ms), f"{name}-total": sensor.total}


def count_meter(sensor: Sensor, name: str, now_ms: int) -> dict[str, float]:
    """A Meter of occurrences: ``name-rate`` a second and ``name-total``."""
    return {f"{name}-rate": sensor.count_rate(now_ms), f"{name}-total": float(sensor.count)}


def avg_max(sensor: Sensor, name: str, now_ms: int) -> dict[str, float]:
    """``name-avg`` and ``name-max`` over the kept samples."""
    return {f"{name}-avg": sensor.avg(now_ms), f"{name}-max": sensor.max(now_ms)}


def daemon_figures(core: ProducerCore, pool: BufferPool, front: SidecarFront) -> dict[str, Any]:
    """Every figure of a daemon: ``producer`` (Kafka's producer-metrics), ``nodes`` (producer-node-metrics
    by node id), ``topics`` (producer-topic-metrics by topic), ``sidecar`` (the daemon's own) and
    ``processes`` (one entry per client process). Map keys are strings (msgpack and JSON carry them)."""
    now = core.clock()
    producer = core.metrics.producer_figures(now)
    producer.update(core.selector.metrics.figures(now))
    producer.update({
        "connection-count": float(core.selector.connection_count()),
        "metadata-age": (now - core.metadata.last_successful_refresh_ms) / 1000
        if core.metadata.last_successful_refresh_ms else math.nan,
        "buffer-total-bytes": float(pool.block_count * pool.block_size),
        "buffer-available-bytes": float(pool.free_blocks * pool.block_size),
        "bufferpool-wait-time-ns-total": float(pool.wait_time_ns_total),
        "waiting-threads": float(len(pool.waiters)),
        "buffer-queue-limit-bytes": float(pool.queue_limit * pool.block_size),
    })
    nodes = core.metrics.node_figures(now)
    for node_id, figures in core.selector.metrics.node_figures(now).items():
        nodes.setdefault(node_id, {}).update(figures)
    return {"client-id": core.config["client.id"], "producer": producer,
            "nodes": {str(n): f for n, f in sorted(nodes.items())}, "topics": core.metrics.topic_figures(now),
            "sidecar": front.sidecar_figures(), "processes": front.process_figures()}


# What each figure means: the Java producer's descriptions for Kafka's, the sidecar's for its own.
DESCRIPTIONS: dict[str, str] = {
    "record-send-rate": "The average number of records sent per second.",
    "record-send-total": "The total number of records sent.",
    "records-per-request-avg": "The average number of records per request.",
    "batch-size-avg": "The average number of bytes sent per partition per-request.",
    "batch-size-max": "The max number of bytes sent per partition per-request.",
    "compression-rate-avg": "The average compression rate of record batches, defined as the average ratio of the "
                            "compressed batch size over the uncompressed size.",
    "compression-rate": "The average compression rate of record batches for a topic.",
    "record-queue-time-avg": "The average time in ms record batches spent in the send buffer.",
    "record-queue-time-max": "The maximum time in ms record batches spent in the send buffer.",
    "request-latency-avg": "The average request latency in ms.",
    "request-latency-max": "The maximum request latency in ms.",
    "produce-throttle-time-avg": "The average time in ms a request was throttled by a broker.",
    "produce-throttle-time-max": "The maximum time in ms a request was throttled by a broker.",
    "record-retry-rate": "The average per-second number of retried record sends.",
    "record-retry-total": "The total number of retried record sends.",
    "record-error-rate": "The average per-second number of record sends that resulted in errors.",
    "record-error-total": "The total number of record sends that resulted in errors.",
    "batch-split-rate": "The average number of batch splits per second.",
    "batch-split-total": "The number of batch splits.",
    "requests-in-flight": "The current number of in-flight requests awaiting a response.",
    "batches-queued": "Batches sealed by clients and not sent yet (the sidecar's).",
    "metadata-age": "The age in seconds of the current producer metadata being used.",
    "buffer-total-bytes": "The maximum amount of buffer memory the client can use (whether or not it is currently "
                          "used).",
    "buffer-available-bytes": "The total amount of buffer memory that is not being used (either unallocated or in "
                              "the free list).",
    "bufferpool-wait-time-ns-total": "The total time in nanoseconds an appender waits for space allocation.",
    "waiting-threads": "The number of user threads blocked waiting for buffer memory to enqueue their records "
                       "(here: block requests of clients waiting in the BufferPool's FIFO).",
    "buffer-queue-limit-bytes": "Of buffer memory, how much may be sealed and not yet acknowledged now "
                                "(sidecar.buffer.queue.ms; the sidecar's).",
    "connection-count": "The current number of active connections.",
    "connection-creation-rate": "The number of new connections established per second.",
    "connection-creation-total": "The total number of new connections established.",
    "connection-close-rate": "The number of connections closed per second.",
    "connection-close-total": "The total number of connections closed.",
    "request-rate": "The number of requests sent per second.",
    "request-total": "The total number of requests sent.",
    "request-size-avg": "The average size of requests sent.",
    "request-size-max": "The maximum size of any request sent.",
    "outgoing-byte-rate": "The number of outgoing bytes sent to all servers per second.",
    "outgoing-byte-total": "The total number of outgoing bytes sent to all servers.",
    "response-rate": "The number of responses received per second.",
    "response-total": "The total number of responses received.",
    "incoming-byte-rate": "The number of bytes read off all sockets per second.",
    "incoming-byte-total": "The total number of bytes read off all sockets.",
    "byte-rate": "The average number of bytes sent per second for a topic.",
    "byte-total": "The total number of bytes sent for a topic.",
    "clients-connected": "Client sessions with their shared memory (Producer instances connected).",
    "sessions": "Client sessions, those still making their memory handshake included.",
    "sessions-kept": "Sessions the daemon ended while their processes may live, kept for them.",
    "blocks-total": "Blocks of the BufferPool (buffer.memory / batch.size).",
    "blocks-free": "Blocks not granted to any client.",
    "blocks-granted": "Blocks granted to clients and not sealed.",
    "blocks-sealed": "Blocks of sealed batches not finished (queued or in flight).",
    "blocks-in-flight": "Blocks of sealed batches in requests in flight.",
    "block-size-bytes": "The size of a block (batch.size).",
    "records-sealed-total": "Records handed off to the daemon in sealed batches.",
    "topics-awaiting-creation": "Topics the cluster does not have, waiting for their turn to be created.",
    "reply-buffer-bytes": "Replies waiting in the daemon for clients that read them slowly.",
    "messages-refused-total": "Client messages the daemon refused.",
    "replies-dropped-total": "Answers to sockets without a session that ZeroMQ would not take.",
    "sessions-ended-unread-total": "Sessions ended because their clients did not read their replies.",
    "batches-corrupt-total": "Batches failed unsent because their records did not parse.",
    "blocks-held": "Blocks a client process holds, granted or sealed.",
    "records-delivered-total": "Records of a client process the brokers acknowledged.",
}
