"""MkDocs hooks of the kafka-sidecar site: what the pages show of the code is made from the code when the site is
built, so that it cannot drift from it. A page asks for it with an HTML comment on a line of its own:

``<!-- settings -->``
    The daemon's settings, from its table of settings (``service.config.KEYS``): name, default, allowed values,
    whether a reload (SIGHUP) takes it, what it does; one table per section of the settings file, and the keys of
    its [log] section (``service.settings_sources.LOG_KEYS``).

``<!-- metrics -->``
    The daemon's metrics, by the names a daemon reports them (a daemon is started for the build in a subprocess,
    with no broker, and one client connects to it: ``service.daemon_metrics.daemon_metrics``), each with its name on the
    Prometheus page and what it means (``service.daemon_metrics.DESCRIPTIONS``).

``<!-- spark-options -->``
    The Spark sink's options (``client_stub.spark.options``): name, ``write_partitions`` keyword, default, meaning.

``<!-- cli -->``
    ``kafka-sidecar --help`` and each command's ``--help``, as argparse prints them (``service/cli.py``).

``<!-- kafka-errors -->``
    Kafka's error codes, each with its name, whether it is retriable and the exception it is reported as
    (``client_stub.errors.ERROR_CODES``).

``<!-- include PATH -->``, ``<!-- include PATH as LANG -->``, ``<!-- include PATH section "HEADING > HEADING" -->``
    A file of the repository as it is: a Markdown file (or the section of one under a heading, down to the next
    heading of the same or a higher level; headings one inside the other with ``>``) inline, any other file as a
    code block (LANG: its language).

``<!-- benchmark-charts PATH -->``
    Charts of the figures of a report of ``tests/perf/compare.py`` (a JSON file of the repository): every
    workload's ratios to confluent-kafka, each client's CPU a record (the host's and the client processes' own),
    each client's latency; inline SVG, drawn from what ``compare.charts`` picks out of the report.

A directive that cannot be carried out (a missing file, a heading that is gone, a report that is not one, a
setting or metric without its description) fails the build.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
# The code the pages are made from is the repository's own (the mkdocs command's sys.path may not hold it).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_DIRECTIVE = re.compile(r"^<!--\s*(?P<what>[a-z-]+)\b(?P<args>[^\n]*?)\s*-->[ \t]*$", re.MULTILINE)
_INCLUDE = re.compile(r'^\s+(?P<path>\S+)(?:\s+as\s+(?P<lang>\w+)|\s+section\s+"(?P<section>[^"]+)")?$')
_PATH = re.compile(r"^\s+(?P<path>\S+)$")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Carry out each directive of a page (an HTML comment of another word is left as it is)."""
    tables = {"settings": settings_tables, "metrics": metrics_tables, "spark-options": spark_options_table,
              "cli": cli_help, "kafka-errors": kafka_errors_table}

    def expand(match: re.Match[str]) -> str:
        what, args = match["what"], match["args"]
        where = f"{page.file.src_uri}: {match[0]}"
        if what in tables and not args.strip():
            return tables[what]()
        if what == "include" and (include := _INCLUDE.match(args)) is not None:
            return included(include["path"], include["lang"], include["section"], where)
        if what == "benchmark-charts" and (report := _PATH.match(args)) is not None:
            return benchmark_charts(report["path"], where)
        if what in tables or what in ("include", "benchmark-charts"):
            raise PluginError(f"{where}: not a directive of docs/hooks.py (see its docstring)")
        return match[0]

    return _DIRECTIVE.sub(expand, markdown)


# -- settings ------------------------------------------------------------------------------------------------------


def settings_tables() -> str:
    """A table per section of the settings file, each setting with its default, values, reload and meaning, and
    the [log] section's keys."""
    from service.config import INT_MAX, KEYS, LONG_MAX, shown
    from service.settings_sources import LOG_DEFAULTS, LOG_KEYS, SECTIONS

    def section_of(name: str) -> str:
        # The section of the longest prefix (settings_sources' rule).
        return max((s for s, prefix in SECTIONS.items() if name.startswith(prefix)), key=lambda s: len(SECTIONS[s]))

    def values(key: Any) -> str:
        if key.choices:
            return ", ".join(f"`{c}`" if c else '`""`' for c in key.choices)
        if key.low is None:
            return ""
        low = f"{key.low:g}"
        if key.high in (INT_MAX, LONG_MAX):
            return f"≥ {low}"
        return f"{low} to {key.high:g}"

    out = []
    for section, prefix in SECTIONS.items():
        rows = [key for name, key in KEYS.items() if section_of(name) == section]
        where = f", without their `{prefix}` prefix" if prefix else ""
        out += [f"### `[{section}]`", "", f"In the settings file under `[{section}]`{where}.", "",
                "| setting | default | values | reload | meaning |", "|---|---|---|---|---|"]
        for key in rows:
            if not key.doc:
                raise PluginError(f"the setting {key.name} has no doc in service/config.py (KEYS)")
            default = shown(key.name, key.default)
            out.append(f"| `{key.name}` | {f'`{default}`' if default else ''} | {values(key)} "
                       f"| {'yes' if key.live else ''} | {_cell(key.doc)} |")
        out.append("")
    out += ["### `[log]`", "", "| key | default | values |", "|---|---|---|"]
    for name, choices in LOG_KEYS.items():
        default = LOG_DEFAULTS[name]
        out.append(f"| `{name}` | {f'`{default}`' if default else ''} "
                   f"| {', '.join(f'`{c}`' for c in choices) if choices else 'a path'} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the Spark sink's options ---------------------------------------------------------------------------------------


def spark_options() -> list[tuple[str, str, Any, str]]:
    """The options the sink takes (``_OPTIONS``), each with its ``write_partitions`` keyword, and the default and
    docstring of its SinkOptions field: read from client_stub/spark/options.py's source, which needs pyspark to
    import."""
    import ast

    tree = ast.parse((ROOT / "client_stub/spark/options.py").read_text())
    constants: dict[str, Any] = {}  # the module's names bound to literals
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass  # not a literal
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "SinkOptions"]
    fields: dict[str, tuple[Any, str]] = {}
    for field, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and field.value is not None:
            default = constants[field.value.id] if isinstance(field.value, ast.Name) else ast.literal_eval(field.value)
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
            fields[field.target.id] = (default, " ".join(str(doc).split()))
    options = []
    for name in constants["_OPTIONS"]:
        keyword = name.replace(".", "_")
        default, doc = fields.get(keyword, (None, ""))
        if not doc:
            raise PluginError(f"the Spark option {name} has no docstring in SinkOptions (client_stub/spark/options.py)")
        options.append((name, keyword, default, doc))
    return options


def spark_options_table() -> str:
    """The Spark sink's options: name, keyword, default, meaning."""
    out = ["| option | `write_partitions` keyword | default | meaning |", "|---|---|---|---|"]
    for name, keyword, default, doc in spark_options():
        shown = "" if default is None else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        out.append(f"| `{name}` | `{keyword}` | {shown} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# -- Kafka's error codes ------------------------------------------------------------------------------------------


def kafka_errors_table() -> str:
    """Kafka's error codes as the client reports them."""
    from client_stub.errors import ERROR_CODES, NONE

    out = ["| code | Kafka's name | retriable | reported as |", "|---|---|---|---|"]
    for code, row in sorted(ERROR_CODES.items()):
        if code != NONE:
            out.append(f"| {code} | `{row.name}` | {'yes' if row.retriable else ''} | `{row.exception.__name__}` |")
    return "\n".join(out) + "\n"


# -- the command line -----------------------------------------------------------------------------------------------


def cli_help() -> str:
    """A section per command of ``kafka-sidecar``, with its help as the command prints it."""
    import argparse

    from service.cli import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out = ["```text", "$ kafka-sidecar --help", _help(parser), "```", ""]
    for name, command in commands.choices.items():
        out += [f"### `kafka-sidecar {name}`", "", "```text", f"$ kafka-sidecar {name} --help", _help(command),
                "```", ""]
    return "\n".join(out)


def _help(parser: Any) -> str:
    """A parser's help at a fixed width (argparse takes the terminal's)."""
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"COLUMNS": "110"}):
        return str(parser.format_help()).rstrip()


# -- metrics -------------------------------------------------------------------------------------------------------

# The groups of daemon_metrics(), as the Java producer names them, and the prefix of their Prometheus names.
_GROUPS = {
    "producer": ("producer-metrics", "kafka_producer_", "client_id"),
    "nodes": ("producer-node-metrics: per broker", "kafka_producer_node_", "client_id, node_id"),
    "topics": ("producer-topic-metrics: per topic", "kafka_producer_topic_", "client_id, topic"),
    "sidecar": ("the sidecar's own", "kafka_sidecar_", ""),
    "processes": ("per client process", "kafka_sidecar_process_", "pid, uid, name"),
}


def metrics_tables() -> str:
    """A table per group of the daemon's metrics: each metric's name, its Prometheus name and type, its meaning."""
    from service.daemon_metrics import DESCRIPTIONS

    names = daemon_metric_names()
    out = []
    for group, (title, prefix, labels) in _GROUPS.items():
        out += [f"### {title}", "",
                f"Prometheus: `{prefix}*`" + (f", labels `{labels}`." if labels else ", no labels."), "",
                "| metric | on the Prometheus page | type | meaning |", "|---|---|---|---|"]
        for name in names[group]:
            description = DESCRIPTIONS.get(name)
            if not description:
                raise PluginError(f"the metric {name} ({group}) has no description in service/daemon_metrics.py "
                                  "(DESCRIPTIONS)")
            kind = "counter" if name.endswith("-total") else "gauge"
            out.append(f"| `{name}` | `{prefix}{name.replace('-', '_')}` | {kind} | {_cell(description)} |")
        out.append("")
    return "\n".join(out)


@cache
def daemon_metric_names() -> dict[str, list[str]]:
    """The names of every metric a daemon reports, by group (see :func:`_metrics_of_a_daemon`)."""
    done = subprocess.run([sys.executable, __file__, "metrics"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise PluginError(f"docs/hooks.py could not read a daemon's metrics:\n{done.stderr}")
    names: dict[str, list[str]] = json.loads(done.stdout)
    return names


def _metrics_of_a_daemon() -> dict[str, list[str]]:
    """Start a daemon with no broker, connect one client, and read the names of every metric it then reports:
    a node's and a topic's as it keeps them from its first request to a broker and its first batch of a topic."""
    import tempfile
    import threading

    from client_stub import Producer
    from client_stub.errors import KafkaTimeoutError, SidecarUnavailableError
    from service.config import ProducerConfig
    from service.daemon import SidecarDaemon
    from service.daemon_metrics import daemon_metrics
    from service.tools.embedded import free_port

    with tempfile.TemporaryDirectory(prefix="kafka-sidecar-docs-") as directory:
        endpoint = f"ipc://{directory}/sidecar.sock"
        # A broker address where nothing listens: the daemon's connections are refused.
        daemon = SidecarDaemon(ProducerConfig({"bootstrap.servers": f"127.0.0.1:{free_port()}"}), endpoint)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                daemon.run_once()

        loop = threading.Thread(target=serve)
        loop.start()
        try:
            # The client's session starts with its first send, which then waits for the topic's metadata in vain
            # (no broker). A machine too busy to welcome the client within the first wait gets a longer one.
            for max_block_ms in (300, 3_000, 30_000):
                producer = Producer(endpoint, max_block_ms=max_block_ms)
                try:
                    producer.send("docs", b"")
                except KafkaTimeoutError:
                    break
                except SidecarUnavailableError:
                    producer.close(0)
            else:
                raise RuntimeError("the daemon started for the build did not welcome its client")
            stop.set()
            loop.join()
            core = daemon.core
            now = core.clock()
            core.metrics.topic("docs")
            core.metrics.record_response(0, 1.0, 0, now)
            core.selector.metrics.record_request(0, 1)
            core.selector.metrics.record_response(0, 1)
            metrics = daemon_metrics(core, daemon.pool, daemon.front)
            producer.close(0)
        finally:
            stop.set()
            loop.join()
            daemon.front.close()
            daemon.pool.close()
            daemon.core.close(0)
    process = metrics["processes"][0]
    return {"producer": list(metrics["producer"]), "nodes": list(metrics["nodes"]["0"]),
            "topics": list(metrics["topics"]["docs"]), "sidecar": list(metrics["sidecar"]),
            "processes": [name for name in process if name not in ("pid", "uid", "name")]}


# -- include -------------------------------------------------------------------------------------------------------


def repository_file(path: str, where: str) -> str:
    """The text of the file at ``path`` (from the repository's root)."""
    file = (ROOT / path).resolve()
    if ROOT not in file.parents or not file.is_file():
        raise PluginError(f"{where}: no file {path} in the repository")
    return file.read_text()


def included(path: str, lang: str | None, section: str | None, where: str) -> str:
    """The file at ``path`` (from the repository's root) as the page shows it."""
    text = repository_file(path, where)
    if section is not None:
        return _section(text, section, where)
    if path.endswith(".md") and lang is None:
        return text
    fence = "````" if "```" in text else "```"
    return f'{fence}{lang or ""} title="{path}"\n{text.rstrip()}\n{fence}'


def _section(text: str, path: str, where: str) -> str:
    """The lines under a Markdown heading, down to the next heading of its level or a higher one. ``path`` names
    the heading, or headings one inside the other: "compare.py > Current figures"."""
    lines = text.splitlines()
    headings: list[tuple[int, int, str]] = []  # line, level, text; none inside fenced code
    fence = ""
    for number, line in enumerate(lines):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker and (not fence or marker[1].startswith(fence)):
            fence = "" if fence else marker[1]
        elif not fence and (heading := re.match(r"(#+)\s+(.*?)\s*#*\s*$", line)):
            headings.append((number, len(heading[1]), heading[2]))
    start, end, level = 0, len(lines), 0
    for name in (part.strip() for part in path.split(">")):
        found = [(n, lv) for n, lv, t in headings if start <= n < end and lv > level and t == name]
        if len(found) != 1:
            raise PluginError(f"{where}: {len(found)} headings {name!r} where one was expected")
        start, level = found[0]
        end = next((n for n, lv, _ in headings if n > start and lv <= level), len(lines))
    return "\n".join(lines[start + 1:end]).strip("\n")


# -- benchmark charts ----------------------------------------------------------------------------------------------

# The clients' colours in every chart, other series' (the metrics) in their order: colour-blind safe (Okabe and
# Ito's, Tol's), and readable on the light and the dark scheme.
_CLIENT_COLOURS = {"kafka-sidecar": "#0072b2", "confluent-kafka": "#e69f00", "kafka-python": "#009e73"}
_COLOURS = ("#56b4e9", "#d55e00", "#cc79a7", "#44aa99", "#999933")
_WIDTH, _BAR, _BAR_GAP, _GROUP_GAP, _TOP, _BOTTOM, _RIGHT = 760, 11, 3, 10, 68, 40, 90


def benchmark_charts(path: str, where: str) -> str:
    """The charts of the compare.py report at ``path``, as inline SVG."""
    return report_charts(repository_file(path, where), f"{where}: {path}")


def report_charts(text: str, where: str) -> str:
    """The charts of a compare.py report's JSON ``text``; ``where`` names it in the build's error."""
    from tests.perf.compare import charts

    try:
        found = charts(json.loads(text))
    except (ValueError, LookupError, TypeError, AttributeError) as exc:  # json.JSONDecodeError is a ValueError
        raise PluginError(f"{where}: not a report of tests/perf/compare.py with figures: {exc}") from exc
    if not found:
        raise PluginError(f"{where}: the report has no figure to chart")
    return "\n\n".join(chart_svg(chart) for chart in found) + "\n"


def chart_svg(chart: Any) -> str:
    """A horizontal bar chart (a ``compare.Chart``): the groups one under the other, a bar per series in each, its
    value at its end; the text in the page's colour (light and dark schemes alike)."""
    series = list(dict.fromkeys(bar.series for group in chart.groups for bar in group.bars))
    others = iter(_COLOURS * len(series))
    colour = {name: _CLIENT_COLOURS.get(name) or next(others) for name in series}
    label_width = 16 + 7 * max(len(group.label) for group in chart.groups)
    left, right = label_width, _WIDTH - _RIGHT
    values = [v for group in chart.groups for bar in group.bars
              for v in (bar.value, bar.part, *(bar.spread or ())) if v is not None and (v > 0 or not chart.log)]
    values += [chart.reference] if chart.reference is not None else []
    ticks = _ticks(min(values), max(values), chart.log)
    low, high = ticks[0], ticks[-1]

    def x(value: float) -> float:
        if chart.log:
            share = (math.log10(max(value, low)) - math.log10(low)) / (math.log10(high) - math.log10(low))
        else:
            share = (value - low) / (high - low)
        return round(left + share * (right - left), 1)

    out: list[str] = []
    y = _TOP
    origin = x(chart.reference) if chart.reference is not None else left
    for group in chart.groups:
        height = len(group.bars) * (_BAR + _BAR_GAP) - _BAR_GAP
        out.append(_text(left - 8, y + height / 2 + 4, group.label, anchor="end"))
        for bar in group.bars:
            end = x(bar.value)
            start, width = min(origin, end), max(abs(end - origin), 1)
            shown = _number(bar.value) + (f" ({_number(bar.part)})" if bar.part is not None else "")
            out.append(f"<g><title>{html.escape(f'{group.label}, {bar.series}: {shown}')}</title>")
            faded = ' fill-opacity="0.45"' if bar.part is not None else ""
            out.append(f'<rect x="{start}" y="{y}" width="{width}" height="{_BAR}" fill="{colour[bar.series]}"'
                       f"{faded}/>")
            if bar.part is not None:
                out.append(f'<rect x="{origin}" y="{y}" width="{max(x(bar.part) - origin, 1)}" height="{_BAR}" '
                           f'fill="{colour[bar.series]}"/>')
            far = end
            if bar.spread is not None:
                middle = y + _BAR / 2
                out.append(f'<path d="M{x(bar.spread[0])},{middle}H{x(bar.spread[1])}M{x(bar.spread[0])},'
                           f'{middle - 3}v6M{x(bar.spread[1])},{middle - 3}v6" stroke="currentColor"/>')
                far = max(far, x(bar.spread[1]))
            out.append(_text(max(far, origin) + 4, y + _BAR - 1, shown, size=11))
            out.append("</g>")
            y += _BAR + _BAR_GAP
        y += _GROUP_GAP - _BAR_GAP
    bottom = y
    grid = [f'<line x1="{x(t)}" y1="{_TOP - 4}" x2="{x(t)}" y2="{bottom}" stroke="currentColor" '
            f'stroke-opacity="0.15"/>' for t in ticks]
    grid += [_text(x(t), bottom + 14, f"{t:g}", anchor="middle", size=11) for t in ticks]
    if chart.reference is not None:
        grid.append(f'<line x1="{origin}" y1="{_TOP - 4}" x2="{origin}" y2="{bottom}" stroke="currentColor" '
                    'stroke-dasharray="4 3"/>')
    legend, at = [_text(0, 34, chart.part, size=11)] if chart.part else [], 0.0
    for name in series:
        legend.append(f'<rect x="{at}" y="42" width="10" height="10" fill="{colour[name]}"/>')
        legend.append(_text(at + 14, 51, name, size=11))
        at += 24 + 6.5 * len(name)
    height = bottom + _BOTTOM
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {height}" role="img" '
            f'style="width:100%;max-width:{_WIDTH}px;height:auto" font-family="sans-serif" font-size="12">',
            f"<title>{html.escape(chart.title)}</title>", _text(0, 16, chart.title, size=14, bold=True),
            _text((left + right) / 2, height - 8, chart.axis, anchor="middle", size=11)]
    return "\n".join(['<figure class="benchmark-chart">', *head, *grid, *legend, *out, "</svg>", "</figure>"])


def _ticks(low: float, high: float, log: bool) -> list[float]:
    """The axis's ticks, from ``low`` or below to ``high`` or above: on a log scale powers of ten (with 2 and 5
    between them over two decades or fewer), else from 0 in steps of 1, 2 or 5 times a power of ten."""
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        last = max(last, first + 1)
        steps = (1, 2, 5) if last - first <= 2 else (1,)
        ticks = [float(f"{step * 10.0**power:.6g}") for power in range(first, last) for step in steps]
        ticks.append(10.0**last)
        # From the last tick at or below low to the first at or above high, two at least.
        start = max(i for i, tick in enumerate(ticks) if tick <= low)
        end = min(i for i, tick in enumerate(ticks) if tick >= high)
        return ticks[start:max(end, start + 1) + 1]
    high = max(high, 1e-9)
    magnitude = 10.0 ** math.floor(math.log10(high / 5))
    step = next(s * magnitude for s in (1, 2, 5, 10) if high / (s * magnitude) <= 5)
    return [float(f"{n * step:.6g}") for n in range(math.ceil(high / step) + 1)]


def _number(value: float) -> str:
    """A bar's figure, to three digits or so."""
    for least, form in ((100, ",.0f"), (10, ".1f"), (0.1, ".2f")):
        if value >= least:
            return format(value, form)
    return format(value, ".2g")


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (f'<text x="{round(x, 1)}" y="{round(y, 1)}" text-anchor="{anchor}" font-size="{size}"{weight} '
            f'fill="currentColor">{html.escape(text)}</text>')


if __name__ == "__main__" and sys.argv[1:] == ["metrics"]:
    print(json.dumps(_metrics_of_a_daemon()))
