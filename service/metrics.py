"""Kafka's way of keeping a metric: the Sensor, and the names of what it reads.

A Kafka client measures with sensors: each keeps a cumulative total and samples of
``metrics.sample.window.ms`` (30 s), of which ``metrics.num.samples`` (2) are kept; its
``-rate``, ``-avg`` and ``-max`` are taken over the kept samples, its ``-total`` since the
start. :class:`Sensor` is that, for one measured quantity; the daemon's metrics as a whole
are :mod:`service.daemon_metrics`'.
"""

from __future__ import annotations

import math
from typing import Any

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
