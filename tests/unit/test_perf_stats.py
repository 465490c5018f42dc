"""perf-test's latency bookkeeping: the sample kept for percentiles, and the summary's figures."""

import pytest

from service.tools.perf_test import LatencySample, Result


def test_every_latency_is_kept_while_there_is_room() -> None:
    sample = LatencySample(10)
    for latency in (3.0, 1.0, 2.0):
        sample.add(latency)
    assert list(sample.values()) == [3.0, 1.0, 2.0]
    assert sample.seen == 3


@pytest.mark.parametrize("capacity", [1000, 999])
def test_past_its_capacity_the_sample_is_every_nth_latency_of_the_whole_run(capacity: int) -> None:
    sample = LatencySample(capacity)
    for latency in range(100_000):
        sample.add(float(latency))
    kept = list(sample.values())
    assert sample.seen == 100_000
    # Every 128th record from the first (the stride doubled 7 times: 1000 x 2^7 > 100 000 > 1000 x 2^6):
    # evenly over the whole run, the last ones included, not the first 1000 seen.
    assert kept == [float(n) for n in range(0, 100_000, 128)]
    assert capacity // 2 <= len(kept) <= capacity


def test_the_sample_thins_as_it_fills_again_and_again() -> None:
    sample = LatencySample(4)
    for latency in range(8):
        sample.add(float(latency))
    assert list(sample.values()) == [0.0, 2.0, 4.0, 6.0]
    sample.add(8.0)  # full again: every 4th from now on
    assert list(sample.values()) == [0.0, 4.0, 8.0]
    for latency in range(9, 13):
        sample.add(float(latency))
    assert list(sample.values()) == [0.0, 4.0, 8.0, 12.0]


def test_a_sample_keeps_at_least_one_latency() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LatencySample(0)


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


def test_without_callbacks_the_summary_has_no_latencies() -> None:
    result = Result(records=1000, errors=0, seconds=2.0, record_size=100, latencies_ms=[], callbacks=False)
    summary = result.summary()
    assert summary["records_per_s"] == 500.0
    assert all(summary[name] is None for name in summary if name.startswith("latency_"))
    assert result.line().endswith("latency not measured (no delivery callbacks).")
