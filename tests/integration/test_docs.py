"""The documentation site (mkdocs.yml, docs/) builds with warnings as errors, and every example in it runs.

The examples are the fenced code blocks of docs/**/*.md in these languages, each run from the repository's root
against one daemon (sending to the session's broker) that ``$KAFKA_SIDECAR_ENDPOINT`` names:

- ``python``: in a fresh interpreter of its own, which must exit 0;
- ``python {.spark}``: in this process, where ``SparkSession.builder.getOrCreate()`` returns the run's one
  SparkSession (the ``spark`` fixture; a session of its own would cost 5-10 s); it must not raise;
- ``bash`` (or ``sh``): with ``bash -euo pipefail``, this interpreter's ``bin`` directory (``kafka-sidecar``) first
  on ``PATH``; it must exit 0.

``{.no-run}`` after the language (```` ```bash {.no-run} ````) shows a block without running it: commands that need
systemd, a cluster, root, or a terminal of their own (a broker or a daemon in the foreground), or that would
replace the daemon's endpoint (``export KAFKA_SIDECAR_ENDPOINT=...``). Blocks in other languages (toml, yaml,
text) are files and output, not examples; so is what a page includes from the repository
(``<!-- include ... -->``, docs/hooks.py), shown as the file holds it. An example checks its own result: it
asserts what it prints or returns, and a command's exit status is its check.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.config import KEYS
from tests.perf.compare import charts
from tests.support.broker import TansuBroker
from tests.support.docs import DOCS, ROOT, Example, examples
from tests.support.sidecar import SidecarProcess

EXAMPLES = list(examples())


@pytest.fixture(scope="module")
def docs_daemon(broker: TansuBroker) -> Iterator[SidecarProcess]:
    """One daemon for every example of the pages; the topics they name are created on first use (Tansu's
    auto-creation, which the daemon asks for)."""
    with SidecarProcess(broker.bootstrap) as daemon:
        yield daemon


def repository_env() -> dict[str, str]:
    """This environment with the repository's code first on the module path, and this interpreter on PATH."""
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PYTHONPATH": python_path, "PATH": path}


def numbered(code: str) -> str:
    return "\n".join(f"{n:3} {line}" for n, line in enumerate(code.splitlines(), 1))


def test_the_pages_have_examples_of_each_kind() -> None:
    kinds = {example.language for example in EXAMPLES}
    assert kinds == {"python", "spark", "bash"}, kinds
    assert len(EXAMPLES) >= 15


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.language != "spark"], ids=lambda e: e.name)
def test_example_runs(example: Example, docs_daemon: SidecarProcess, tmp_path: Path) -> None:
    if example.language == "python":
        script = tmp_path / "example.py"
        script.write_text(example.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", example.code]
    env = {**repository_env(), "KAFKA_SIDECAR_ENDPOINT": docs_daemon.endpoint}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (f"the example at docs/{example.name} exited with {done.returncode}:\n"
                                  f"{numbered(example.code)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.language == "spark"], ids=lambda e: e.name)
def test_spark_example_runs(example: Example, docs_daemon: SidecarProcess, spark: Any,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver's environment; the executors get the endpoint from the example's "endpoint" option.
    monkeypatch.setenv("KAFKA_SIDECAR_ENDPOINT", docs_daemon.endpoint)
    monkeypatch.chdir(ROOT)
    try:
        exec(compile(example.code, f"docs/{example.name}", "exec"), {"__name__": "__docs_example__"})
    except Exception as exc:
        raise AssertionError(f"the example at docs/{example.name} failed:\n{numbered(example.code)}") from exc


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_text(site: Path, page: str) -> str:
    """A built page's text, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text()))


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the documentation needs the docs extra")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          env={**repository_env(), "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    # The tables made from the code: every setting, every figure, every command, the benchmarks' current rows and
    # the charts of the report they come from.
    configuration = page_text(site, "configuration")
    assert [name for name in KEYS if name not in configuration] == []
    metrics = page_text(site, "operations/metrics")
    for name in ("kafka_producer_record_send_total", "kafka_producer_node_request_latency_avg",
                 "kafka_producer_topic_byte_rate", "kafka_sidecar_blocks_free",
                 "kafka_sidecar_process_records_delivered_total"):
        assert name in metrics
    assert "kafka-sidecar produce --help" in page_text(site, "operations/cli")
    current = _hooks()._section((ROOT / "tests/perf/README.md").read_text(), "compare.py > Current figures", "")
    rows = [line.split("|")[1].strip() for line in current.splitlines() if line.startswith("| ")]
    benchmarks = page_text(site, "benchmarks")
    assert rows and [row for row in rows if row not in benchmarks] == []
    drawn = charts(json.loads((ROOT / "tests/perf/results/current.json").read_text()))
    assert (site / "benchmarks" / "index.html").read_text().count('<figure class="benchmark-chart">') == len(drawn) > 0
    assert [label for chart in drawn for label in (chart.title, *(group.label for group in chart.groups))
            if label not in benchmarks] == []
    spark = page_text(site, "spark")
    assert [name for name, *_ in _hooks().spark_options() if name not in spark] == []


def test_benchmark_charts_refuse_a_report_that_is_missing_or_not_one() -> None:
    pytest.importorskip("mkdocs", reason="the documentation needs the docs extra")
    from mkdocs.exceptions import PluginError

    hooks = _hooks()
    with pytest.raises(PluginError, match="no file tests/perf/results/gone.json in the repository"):
        hooks.benchmark_charts("tests/perf/results/gone.json", "benchmarks.md")
    for text in ("{not JSON", "[]", '{"settings": {}}', '{"settings": {"workloads": 1}, "runs": []}'):
        with pytest.raises(PluginError, match="not a report of tests/perf/compare.py with figures"):
            hooks.report_charts(text, "benchmarks.md: a report")
