"""What a report of compare.py shows: the figures it picks (the medians, else its last complete run), the README's
"Current figures" made from them, and the documentation's charts; and that the README shows the committed report
the documentation charts (no broker, no processes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.perf.compare import (
    CONFLUENT,
    KAFKA_PYTHON,
    ROOT,
    SIDECAR,
    Bar,
    cases,
    charts,
    markdown_figures,
    medians,
    ratios,
    shown,
)

CURRENT = ROOT / "tests" / "perf" / "results" / "current.json"


def figures(records_per_s: float, host: float, client: float, p50: float | None = None,
            p99: float | None = None) -> dict[str, Any]:
    return {"records_per_s": records_per_s, "cpu_us_per_record": host, "client_cpu_us_per_record": client,
            "latency_p50_ms": p50, "latency_p99_ms": p99}


def run_results(scale: float = 1.0) -> dict[str, dict[str, dict[str, Any]]]:
    """W1 K=4 none, W2 and W6 (confluent-kafka not held) of one run; ``scale`` moves kafka-sidecar's figures."""
    return {
        "W1.K4.none": {SIDECAR: figures(200_000 * scale, 8.0, 6.0, 100.0, 250.0),
                       CONFLUENT: figures(100_000, 10.0, 10.0, 3_600.0, 6_300.0)},
        "W2": {SIDECAR: figures(20_000, 40.0 * scale, 10.0, 6.0, 20.0 * scale),
               CONFLUENT: figures(20_000, 30.0, 30.0, 9.0, 30.0)},
        "W6": {SIDECAR: figures(1_600, 60.0, 30.0, 8.0, 30.0),
               CONFLUENT: {"error": "NotHeld: no room", "not_held": True}},
    }


def report(*scales: float, interrupted: bool = False) -> dict[str, Any]:
    """A report of kafka-sidecar and confluent-kafka in W1, W2 and W6 at 16 x 100/s, a run per scale."""
    case_list = cases({"W1", "W2", "W6"}, 32, 500, w6_processes=16, w6_rate=100)
    runs = []
    for index, scale in enumerate(scales):
        results = run_results(scale)
        runs.append({"index": index, "results": results,
                     "ratios": {case.key: ratios(results.get(case.key, {}), case.workload) for case in case_list}})
    if interrupted:
        runs.append({"index": len(runs), "results": {"W2": {SIDECAR: figures(1, 1, 1)}}})
    found = {
        "command": "compare.py --only W1,W2,W6 --w6-processes 16 --w6-rate 100",
        "machine": {"cores": 2, "cpu": "AMD EPYC", "memory_gb": 23.5, "python": "3.11.7",
                    "confluent_kafka": "2.16.1", "librdkafka": "2.16.0", "kafka_python": "3.0.12",
                    "pyzmq": "27.3.0", "git": {"head": "0123456789abcdef", "modified": []}},
        "settings": {"workloads": ["W1", "W2", "W6"], "clients": [SIDECAR, CONFLUENT], "runs": len(scales),
                     "w3_processes": 32, "w3_rate_per_process": 500, "w1c_records_per_process": 600_000,
                     "w6_processes": 16, "w6_rate_per_process": 100, "w6_clients": [SIDECAR, CONFLUENT]},
        "runs": runs, "finished": "2026-11-28T01:02:03",
    }
    if len(scales) > 1:
        results, ratio_medians, spreads = medians([r for r in runs if "ratios" in r])
        found["median"] = {"results": results, "ratios": ratio_medians, "ratio_spreads": spreads["ratios"],
                           "result_spreads": spreads["results"], "targets": []}
    return found


# -- the figures shown ----------------------------------------------------------------------------

def test_a_report_of_several_runs_shows_their_medians_with_spreads() -> None:
    view = shown(report(1.0, 2.0, 1.5))
    assert view.runs == 3
    assert view.results["W2"][SIDECAR]["cpu_us_per_record"] == 60.0
    assert view.ratio_spreads is not None
    assert view.ratio_spreads["W2"]["cpu_us_per_record"][CONFLUENT] == [1.333, 2.667]
    assert [case.key for case in view.cases] == ["W1.K1.none", "W1.K4.none", "W1.K1.lz4", "W1.K4.lz4", "W2", "W6"]
    assert view.clients == [SIDECAR, CONFLUENT]


def test_a_report_of_one_run_shows_its_last_complete_run_without_spreads() -> None:
    view = shown(report(1.0, interrupted=True))
    assert (view.runs, view.ratio_spreads, view.result_spreads) == (1, None, None)
    assert view.results["W2"][SIDECAR]["cpu_us_per_record"] == 40.0


@pytest.mark.parametrize(("broken", "message"), [
    ({"runs": []}, "no 'settings'"),
    ({**report(1.0), "runs": [{"index": 0, "results": {}}]}, "no complete run"),
    ([1, 2], "not laid out as one"),
])
def test_what_is_not_a_report_with_figures_is_refused_with_what_it_lacks(broken: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shown(broken)


# -- the README's current figures ------------------------------------------------------------------

def test_the_readmes_figures_say_what_run_and_machine_and_have_the_columns_of_the_clients_run() -> None:
    text = markdown_figures(report(1.0))
    caption, table = text.split("\n\n")
    assert " ".join(caption.split()) == (
        "`compare.py --only W1,W2,W6 --w6-processes 16 --w6-rate 100` at 0123456 (2026-11-28): one run. 2 cores "
        "(AMD EPYC), 23.5 GB, Python 3.11.7, confluent-kafka 2.16.1 (librdkafka 2.16.0), pyzmq 27.3.0.")
    assert max(len(line) for line in caption.splitlines()) <= 110
    lines = table.splitlines()
    assert lines[0] == "| workload | metric | kafka-sidecar | confluent-kafka | sidecar/confluent |"
    assert "| W2 K=4 20000/s | latency p50 ms | 6.00 | 9.00 | 0.67 |" in lines
    assert "|  | host CPU us/record | 40.00 | 30.00 | 1.33 |" in lines  # the workload named once, on its first row
    assert "| W6 16x100/s | latency p50 ms | 8.0 | not held | - |" in lines


def test_the_readmes_figures_of_several_runs_give_each_ratio_its_spread() -> None:
    text = markdown_figures(report(1.0, 2.0, 1.5))
    assert "the median of 3 runs" in text
    assert "| W2 K=4 20000/s | latency p50 ms | 6.00 | 9.00 | 0.67 (0.67-0.67) |" in text


def test_the_readme_shows_the_committed_report_the_documentation_charts() -> None:
    current = json.loads(CURRENT.read_text())
    readme = (ROOT / "tests" / "perf" / "README.md").read_text()
    assert markdown_figures(current) in readme, (
        "tests/perf/README.md's Current figures are not those of tests/perf/results/current.json: paste the output of "
        "`python tests/perf/compare.py --markdown tests/perf/results/current.json` there")


# -- the charts -----------------------------------------------------------------------------------

def test_the_ratio_chart_has_each_workloads_ratios_to_confluent_kafka_from_1() -> None:
    ratio_chart = charts(report(1.0))[0]
    assert (ratio_chart.log, ratio_chart.reference) == (True, 1.0)
    groups = {group.label: group.bars for group in ratio_chart.groups}
    # W1's latency is its buffer's queue, not a figure to compare; W6 has no confluent-kafka to compare with.
    assert groups["W1 K=4 none"] == (Bar("records/s", 2.0), Bar("host CPU/record", 0.8),
                                     Bar("client CPU/record", 0.6))
    assert [bar.series for bar in groups["W2 K=4 20000/s"]] == ["records/s", "host CPU/record", "client CPU/record",
                                                                "latency p50", "latency p99"]
    assert list(groups) == ["W1 K=4 none", "W2 K=4 20000/s"]  # a workload without figures is left out


def test_the_cpu_chart_has_each_clients_host_cpu_a_record_with_the_client_processes_share() -> None:
    cpu = charts(report(1.0))[1]
    assert not cpu.log and cpu.reference is None
    groups = {group.label: group.bars for group in cpu.groups}
    assert groups["W2 K=4 20000/s"] == (Bar(SIDECAR, 40.0, 10.0), Bar(CONFLUENT, 30.0, 30.0))
    assert groups["W6 16x100/s"] == (Bar(SIDECAR, 60.0, 30.0),)  # confluent-kafka not held


def test_the_latency_chart_has_p99_with_p50_for_the_workloads_whose_latency_compares() -> None:
    latency = charts(report(1.0))[2]
    assert latency.log
    groups = {group.label: group.bars for group in latency.groups}
    assert list(groups) == ["W2 K=4 20000/s", "W6 16x100/s"]
    assert groups["W2 K=4 20000/s"] == (Bar(SIDECAR, 20.0, 6.0), Bar(CONFLUENT, 30.0, 9.0))


def test_the_charts_of_several_runs_carry_the_spreads() -> None:
    ratio_chart, cpu, latency = charts(report(1.0, 2.0, 1.5))
    w2 = {bar.series: bar for bar in next(g for g in ratio_chart.groups if g.label.startswith("W2")).bars}
    assert w2["host CPU/record"].spread == (1.333, 2.667)
    assert next(g for g in cpu.groups if g.label.startswith("W2")).bars[0].spread == (40.0, 80.0)
    assert next(g for g in latency.groups if g.label.startswith("W2")).bars[0].spread == (20.0, 40.0)


def test_a_chart_without_any_figure_is_left_out() -> None:
    only_w1 = report(1.0)
    for run in only_w1["runs"]:
        for key in ("W2", "W6"):
            run["results"].pop(key)
            run["ratios"].pop(key)
    assert [chart.title for chart in charts(only_w1)] == ["kafka-sidecar / confluent-kafka",
                                                          "CPU a record delivered"]
    assert KAFKA_PYTHON not in {bar.series for chart in charts(only_w1) for g in chart.groups for bar in g.bars}
