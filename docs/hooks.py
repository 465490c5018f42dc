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

A directive that cannot be carried out (a missing file, a heading that is gone, a setting or metric without its
description) fails the build.
"""

from __future__ import annotations

import json
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
        if what in tables or what == "include":
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


def included(path: str, lang: str | None, section: str | None, where: str) -> str:
    """The file at ``path`` (from the repository's root) as the page shows it."""
    file = (ROOT / path).resolve()
    if ROOT not in file.parents or not file.is_file():
        raise PluginError(f"{where}: no file {path} in the repository")
    text = file.read_text()
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


if __name__ == "__main__" and sys.argv[1:] == ["metrics"]:
    print(json.dumps(_metrics_of_a_daemon()))
