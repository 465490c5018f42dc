"""perf-test's latency bookkeeping: the sample kept for percentiles, and the summary's figures."""

import random

from service.perf_test import LatencySample, Result


def test_every_latency_is_kept_while_there_is_room() -> None:
    sample = LatencySample(10, random.Random(1))
    for latency in (3.0, 1.0, 2.0):
        sample.add(latency)
    assert list(sample.values()) == [3.0, 1.0, 2.0]
    assert sample.seen == 3


def test_past_its_capacity_the_sample_is_uniform_over_all_latencies() -> None:
    sample = LatencySample(1000, random.Random(7))
    for latency in range(100_000):
        sample.add(float(latency))
    kept = list(sample.values())
    assert sample.seen == 100_000
    assert len(kept) == len(set(kept)) == 1000
    assert all(0 <= v < 100_000 for v in kept)
    # Uniform over the whole run, not the first 1000 seen: the mean is near the middle (its standard
    # error is 913 here) and the later half of the run has about half of the sample.
    assert abs(sum(kept) / len(kept) - 50_000) < 4_600
    assert 420 < sum(v >= 50_000 for v in kept) < 580


def test_summary_takes_average_and_maximum_over_every_delivery_not_the_sample() -> None:
    result = Result(records=4, errors=0, seconds=1.0, record_size=100, latencies_ms=[1.0, 2.0],
                    latency_sum_ms=20.0, latency_max_ms=9.0)
    summary = result.summary()
    assert summary["latency_avg_ms"] == 5.0
    assert summary["latency_max_ms"] == 9.0
    assert summary["latency_p50_ms"] == 2.0


def test_summary_of_a_sample_that_is_every_latency() -> None:
    summary = Result(records=3, errors=0, seconds=1.0, record_size=100, latencies_ms=[1.0, 2.0, 6.0]).summary()
    assert (summary["latency_avg_ms"], summary["latency_max_ms"]) == (3.0, 6.0)
