"""compare.py's arithmetic and bookkeeping: CPU per record, W1L's rate, the clients of a case, the spreads
over runs, the targets and the table (no broker, no processes); what a report shows: test_perf_report.py."""

from __future__ import annotations

import pytest

from tests.perf.compare import (
    CONFLUENT,
    KAFKA_PYTHON,
    SIDECAR,
    W5_BATCH_SIZE,
    W5_CEILING_BATCH_SIZE,
    _parse,
    case_clients,
    cases,
    cpu_per_record,
    medians,
    table,
    targets,
    too_many_to_hold,
    w1l_rate,
)

W6_DEFAULT = {"processes": 128, "target_records_per_s": 6400.0}  # W6's default scale, as a measurement records it

ALL = {"W1", "W1L", "W1C", "W2", "W3", "W5", "W6"}


def by_key(only: set[str] = ALL, **kwargs: object) -> dict[str, object]:
    return {case.key: case for case in cases(only, 32, 500, **kwargs)}  # type: ignore[arg-type]


# -- CPU per record -----------------------------------------------------------------------------

def test_host_cpu_per_record_adds_the_daemons_cpu_to_the_producing_processes() -> None:
    assert cpu_per_record(3.0, 1.0, 1_000_000) == {"client_cpu_us_per_record": 3.0, "cpu_us_per_record": 4.0}


def test_a_client_without_a_daemon_has_the_same_host_and_client_cpu() -> None:
    figures = cpu_per_record(2.5, 0.0, 500_000)
    assert figures["cpu_us_per_record"] == figures["client_cpu_us_per_record"] == 5.0


def test_cpu_per_record_of_no_record_delivered_is_zero() -> None:
    assert cpu_per_record(1.0, 1.0, 0) == {"client_cpu_us_per_record": 0.0, "cpu_us_per_record": 0.0}


# -- W1L's rate -----------------------------------------------------------------------------------

def test_w1l_runs_each_client_at_80_percent_of_its_own_w1_k4_none_figure() -> None:
    results = {"W1.K4.none": {SIDECAR: {"records_per_s": 300_000.0}, CONFLUENT: {"records_per_s": 200_000.0}},
               "W1.K1.none": {SIDECAR: {"records_per_s": 900_000.0}}}
    assert w1l_rate(results, SIDECAR, None) == 240_000.0
    assert w1l_rate(results, CONFLUENT, None) == 160_000.0


def test_w1l_rate_given_is_every_clients() -> None:
    assert w1l_rate({}, KAFKA_PYTHON, 50_000.0) == 50_000.0


@pytest.mark.parametrize("figures", [{}, {"error": "TimeoutError: boom"}])
def test_w1l_without_the_clients_w1_figure_says_what_to_do(figures: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="--w1l-rate"):
        w1l_rate({"W1.K4.none": {SIDECAR: figures}}, SIDECAR, None)


def test_w1l_needs_w1_in_the_run_or_a_rate() -> None:
    with pytest.raises(SystemExit):
        _parse(["--only", "W1L"])
    assert _parse(["--only", "W1L", "--w1l-rate", "1000"]).w1l_rate == 1000
    assert _parse(["--only", "W1,W1L"]).only == {"W1", "W1L"}


def test_w1l_runs_after_w1() -> None:
    keys = list(by_key({"W1L", "W1"}))
    assert keys.index("W1L") > keys.index("W1.K4.none")


# -- the cases ------------------------------------------------------------------------------------

def test_w5_runs_the_ceiling_first_then_kafka_sidecar_whatever_the_order() -> None:
    w5 = by_key({"W5"})["W5"]
    assert case_clients(w5, [KAFKA_PYTHON, SIDECAR, CONFLUENT]) == [CONFLUENT, SIDECAR]  # type: ignore[arg-type]


def test_the_ceiling_is_one_producer_with_1_mib_batches_and_the_sidecar_its_own_settings() -> None:
    w5 = by_key({"W5"})["W5"]
    ceiling, sidecar = w5.for_client(CONFLUENT), w5.for_client(SIDECAR)  # type: ignore[attr-defined]
    assert (ceiling.processes, ceiling.batch_size) == (1, W5_CEILING_BATCH_SIZE)
    assert (sidecar.processes, sidecar.batch_size) == (8, W5_BATCH_SIZE)
    assert dict(sidecar.daemon_settings)["buffer.memory"]
    assert not ceiling.make_workload("t", 10, 100, CONFLUENT).callbacks
    assert not sidecar.make_workload("t", 10, 100, SIDECAR).callbacks


def test_w6_runs_128_processes_at_50_records_a_second_unless_told_otherwise() -> None:
    args = _parse([])
    assert (args.w6_processes, args.w6_rate) == (128, 50)
    w6 = by_key({"W6"})["W6"]
    assert (w6.label, w6.processes, w6.throughput) == ("W6 128x50/s", 128, 6400)  # type: ignore[attr-defined]
    assert "W6" in args.only


def test_w6_runs_the_clients_it_names_in_the_runs_order_and_forks_its_workers() -> None:
    w6 = by_key({"W6"}, w6_processes=16, w6_rate=100)["W6"]
    assert (w6.processes, w6.throughput, w6.forked, w6.proxied) == (16, 1600, True, True)  # type: ignore[attr-defined]
    assert case_clients(w6, [CONFLUENT, KAFKA_PYTHON, SIDECAR]) == [CONFLUENT, SIDECAR]  # type: ignore[arg-type]


def test_w1c_sends_a_count_per_process_with_start_up_and_callbacks_for_confluent_only() -> None:
    w1c = by_key({"W1C"}, w1c_records=1000)["W1C.K4"]
    workloads = {client: w1c.make_workload("t", 10, 100, client) for client in (SIDECAR, CONFLUENT, KAFKA_PYTHON)}  # type: ignore[attr-defined]
    assert {w.num_records for w in workloads.values()} == {4000}
    assert {w.warmup_records for w in workloads.values()} == {0}
    assert {w.duration_s for w in workloads.values()} == {0.0}
    assert {client: w.callbacks for client, w in workloads.items()} == {SIDECAR: False, CONFLUENT: True,
                                                                         KAFKA_PYTHON: False}


def test_the_proxied_workloads_refuse_security() -> None:
    with pytest.raises(SystemExit):
        _parse(["--only", "W1,W6", "--security", "SASL_SSL"])


def test_the_machine_holds_processes_while_memory_is_available_for_each() -> None:
    assert too_many_to_hold(256, 256 * 64) is None
    assert "256 processes" in (too_many_to_hold(256, 1000, per_process_mb=64) or "")


# -- medians, spreads and targets -----------------------------------------------------------------

def run_of(w1: float, w3_memory: float, w6_p99: float) -> dict[str, object]:
    return {"results": {"W1.K4.none": {SIDECAR: {"records_per_s": w1 * 100}, CONFLUENT: {"records_per_s": 100.0}},
                        "W3": {SIDECAR: {"memory_added_mb": w3_memory * 30}, CONFLUENT: {"memory_added_mb": 30.0}},
                        "W6": {SIDECAR: {"latency_p99_ms": w6_p99, "connections_peak": 1, "callbacks": True,
                                         **W6_DEFAULT},
                               CONFLUENT: {"error": "NotHeld: no room", "not_held": True}}},
            "ratios": {"W1.K4.none": {"records_per_s": {CONFLUENT: w1, KAFKA_PYTHON: None}},
                       "W3": {"memory_added_mb": {CONFLUENT: w3_memory}}}}


def test_medians_come_with_the_spread_of_every_ratio_and_figure_over_the_runs() -> None:
    results, ratio_medians, spreads = medians([run_of(1.4, 0.3, 40), run_of(1.7, 0.4, 60), run_of(1.5, 0.2, 45)])
    assert ratio_medians["W1.K4.none"]["records_per_s"] == {CONFLUENT: 1.5}
    assert spreads["ratios"]["W1.K4.none"]["records_per_s"] == {CONFLUENT: [1.4, 1.7]}
    assert spreads["ratios"]["W3"]["memory_added_mb"] == {CONFLUENT: [0.2, 0.4]}
    assert results["W6"][SIDECAR]["latency_p99_ms"] == 45
    assert spreads["results"]["W6"][SIDECAR]["latency_p99_ms"] == [40, 60]
    assert "callbacks" not in results["W6"][SIDECAR]  # not a figure
    assert CONFLUENT not in results["W6"]  # a measurement that failed has no figures


def test_a_target_holds_in_the_median_and_carries_the_spread() -> None:
    results, ratio_medians, spreads = medians([run_of(1.9, 0.4, 40), run_of(2.3, 0.6, 60), run_of(2.1, 0.45, 45)])
    checks = {c["target"]: c for c in targets(results, ratio_medians, spreads)}
    w1 = checks["W1 K=4 none records/s sidecar/confluent >= 2"]
    assert (w1["actual"], w1["ok"], w1["spread"]) == (2.1, True, [1.9, 2.3])
    memory = checks["W3 memory added sidecar/confluent <= 0.5"]
    assert (memory["ok"], memory["spread"]) == (True, [0.4, 0.6])
    p99 = checks["W6 128x50/s sidecar p99 ms <= 50"]
    assert (p99["actual"], p99["ok"], p99["spread"]) == (45, True, [40, 60])
    assert checks["W1 K=4 none records/s sidecar/kafka-python >= 10"]["ok"] is None  # not measured


def test_the_targets_are_the_projects() -> None:
    ratios = {key: {} for key in ("W1.K4.none", "W1.K1.none", "W1.K4.lz4", "W1L", "W2", "W3", "W5", "W6")}
    assert [c["target"] for c in targets({}, ratios)] == [
        "W1 K=4 none records/s sidecar/confluent >= 2",
        "W1 K=4 none records/s sidecar/kafka-python >= 10",
        "W1 K=1 none records/s sidecar/confluent >= 1.5",
        "W1 K=4 lz4 records/s sidecar/confluent >= 1.5",
        "W1L (K=4 at 80%) p50 sidecar/confluent <= 2",
        "W2 p99 sidecar/confluent <= 1",
        "W2 host CPU/record sidecar/confluent <= 1",
        "W2 client CPU/record sidecar/confluent <= 0.5",
        "W3 host CPU/record sidecar/confluent <= 1",
        "W3 client CPU/record sidecar/confluent <= 0.5",
        "W3 memory added sidecar/confluent <= 0.5",
        "W3 sidecar broker connections (1 broker) == 1",
        "W5 sidecar records/s / the ceiling's >= 0.8",
        "W6 128x50/s sidecar p99 ms <= 50",
        "W6 128x50/s sidecar broker connections (1 broker) == 1",
        "W6 128x50/s host CPU/record sidecar/confluent <= 1",
    ]


@pytest.mark.parametrize("workload", ["W2", "W3"])
def test_the_host_and_the_client_processes_cpu_a_record_each_have_a_bound(workload: str) -> None:
    figures = {"cpu_us_per_record": {CONFLUENT: 0.9}, "client_cpu_us_per_record": {CONFLUENT: 0.6}}
    checks = {c["target"]: c["ok"] for c in targets({}, {workload: figures})}
    assert checks[f"{workload} host CPU/record sidecar/confluent <= 1"] is True
    assert checks[f"{workload} client CPU/record sidecar/confluent <= 0.5"] is False


def test_w6s_targets_are_checked_at_its_default_scale_only() -> None:
    def w6_checks(processes: int, rate: float) -> list[dict[str, object]]:
        results = {"W6": {SIDECAR: {"latency_p99_ms": 20.0, "connections_peak": 1, "processes": processes,
                                    "target_records_per_s": processes * rate}}}
        return [c for c in targets(results, {"W6": {"cpu_us_per_record": {CONFLUENT: 0.8}}})
                if c["target"].startswith("W6")]  # type: ignore[union-attr]

    assert [c["ok"] for c in w6_checks(128, 50)] == [True, True, True]
    smaller = w6_checks(32, 50)
    assert [c["ok"] for c in smaller] == [None, None, None]  # neither met nor missed: another workload
    assert {c["note"] for c in smaller} == {"W6 ran at 32 x 50/s"}
    assert smaller[0]["actual"] == 20.0


def test_targets_of_one_run_have_no_spread_and_miss_what_they_miss() -> None:
    checks = targets({"W5": {}}, {"W5": {"records_per_s": {CONFLUENT: 0.7}}})
    assert checks == [{"target": "W5 sidecar records/s / the ceiling's >= 0.8", "actual": 0.7, "ok": False,
                       "spread": None}]


def test_the_median_table_shows_each_ratio_with_its_spread_and_a_client_not_held() -> None:
    case_list = cases({"W6"}, 32, 500)
    results = {"W6": {SIDECAR: {"latency_p99_ms": 45.0}, CONFLUENT: {"error": "NotHeld", "not_held": True}}}
    ratio_medians = {"W6": {"latency_p99_ms": {CONFLUENT: 0.5, KAFKA_PYTHON: None}}}
    text = table(case_list, results, ratio_medians, ratio_spreads={"W6": {"latency_p99_ms": {CONFLUENT: [0.4, 0.9]}}})
    p99 = next(line for line in text.splitlines() if "latency p99" in line)
    assert "45.0" in p99 and "not held" in p99 and "0.50 (0.40-0.90)" in p99
