"""The ``kafka-sidecar`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from client_stub.contract import ipc
from client_stub.errors import ConfigError

from . import log_format
from .config import KEYS, ProducerConfig, parse_settings, shown
from .producer.core import security
from .settings_sources import Sources, gather


def _sources(args: argparse.Namespace) -> tuple[Sources, ProducerConfig]:
    """The settings of --config, the environment and the command line, checked."""
    command_line: dict[str, Any] = parse_settings(args.settings)
    if getattr(args, "bootstrap_servers", None):
        command_line["bootstrap.servers"] = args.bootstrap_servers
    if getattr(args, "endpoint", None):
        command_line["sidecar.endpoint"] = args.endpoint
    sources = gather(args.config, os.environ, command_line)
    config = ProducerConfig(sources.settings)
    security(config)  # the certificates, keys and SASL settings can be used
    return sources, config


def _run(args: argparse.Namespace) -> int:
    from .daemon import SidecarDaemon

    def settings() -> tuple[ProducerConfig, dict[str, str]]:
        """The settings as they are now (at start, and again on SIGHUP), and the log's: the command line's
        --log-level and --log-format over the configuration's."""
        sources, config = _sources(args)
        return config, {**sources.log, "level": args.log_level or sources.log["level"],
                        "format": args.log_format or sources.log["format"]}

    config, log_settings = settings()
    log_format.configure(log_settings["level"], log_settings["format"], log_settings["file"])
    daemon = SidecarDaemon(config, config["sidecar.endpoint"], reload=settings)
    daemon.install_signal_handlers()
    daemon.run()
    return 0


def _check_config(args: argparse.Namespace) -> int:
    sources, config = _sources(args)
    for name in KEYS:
        print(f"{name} = {shown(name, config[name])}  # {sources.origin(name)}")
    for key, value in sources.log.items():
        print(f"log.{key} = {value}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from .stats import main

    if args.watch is not None and args.watch <= 0:
        raise ConfigError(f"--watch takes a number of seconds above 0, got {args.watch}")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout takes a number of seconds above 0, got {args.timeout}")
    return main(args.endpoint or ipc.default_endpoint(), json_output=args.json, watch=args.watch,
                timeout=args.timeout)


def _quickstart(args: argparse.Namespace) -> int:
    from .tools.quickstart import run

    return run(processes=args.processes, records=args.records, spark=not args.skip_spark)


def _perf_test(args: argparse.Namespace) -> int:
    from .tools.perf_test import main

    return main(args)


def _produce(args: argparse.Namespace) -> int:
    from .tools.produce import main

    return main(args)


def _dev_broker(args: argparse.Namespace) -> int:
    from .tools.dev_broker import main

    return main(args)


def _add_settings(command: argparse.ArgumentParser, config_required: bool = False) -> None:
    command.add_argument("--config", required=config_required, metavar="FILE",
                         help="a TOML file: [producer], [sidecar] and [log] settings")
    command.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                         help="a setting, e.g. -X linger.ms=10, over the file's and the environment's "
                              "(see `kafka-sidecar settings`)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-sidecar", description="A node-local Kafka producer sidecar.")
    parser.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="default INFO (for run: the configuration's [log] level)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the sender daemon in the foreground")
    run.add_argument("--bootstrap-servers", help="host:port[,host:port...] of the Kafka cluster "
                                                 "(else the configuration's bootstrap.servers)")
    run.add_argument("--endpoint", help=f"ZeroMQ endpoint to serve (default: the configuration's sidecar.endpoint, "
                                        f"${ipc.ENDPOINT_ENV} or {ipc.DEFAULT_ENDPOINT})")
    _add_settings(run)
    run.add_argument("--log-format", choices=["text", "json"],
                     help="text, or one JSON object a line (default: the configuration's [log] format, text)")
    run.set_defaults(handler=_run)

    check = commands.add_parser("check-config", help="check the settings and print them, with where each came from")
    _add_settings(check, config_required=True)
    check.set_defaults(handler=_check_config)

    stats = commands.add_parser("stats", help="print a running daemon's metrics, asked over its endpoint")
    stats.add_argument("--endpoint", help=f"the daemon's endpoint (default: ${ipc.ENDPOINT_ENV} or "
                                          f"{ipc.DEFAULT_ENDPOINT})")
    stats.add_argument("--json", action="store_true", help="every metric, as JSON")
    stats.add_argument("--watch", type=float, metavar="SECONDS", help="print them again every SECONDS until "
                                                                      "interrupted")
    stats.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                       help="how long to wait for the daemon's answer (default 10)")
    stats.set_defaults(handler=_stats)

    quickstart = commands.add_parser("quickstart", help="run broker, daemon and producers on this machine")
    quickstart.add_argument("--processes", type=int, default=4, help="application processes (default 4)")
    quickstart.add_argument("--records", type=int, default=25_000, help="records per process (default 25000)")
    quickstart.add_argument("--skip-spark", action="store_true",
                            help="leave out the Spark pipeline (deploy/spark/flights_to_kafka.py)")
    quickstart.set_defaults(handler=_quickstart)

    perf = commands.add_parser("perf-test", help="measure throughput and latency (as kafka-producer-perf-test)")
    perf.add_argument("--topic", required=True)
    perf.add_argument("--num-records", type=int, required=True)
    perf.add_argument("--record-size", type=int, required=True, help="value size in bytes")
    perf.add_argument("--processes", type=int, default=1, help="producing processes (default 1)")
    perf.add_argument("--throughput", type=float, default=-1,
                      help="records/s in total (default: as fast as possible)")
    perf.add_argument("--key-size", type=int, default=0, help="key size in bytes (default 0: no keys)")
    perf.add_argument("--key-count", type=int, default=1000, help="distinct keys (default 1000)")
    perf.add_argument("--no-callbacks", dest="callbacks", action="store_false",
                      help="send without delivery callbacks, as a process that sends and forgets (latency is "
                           "not measured)")
    perf.add_argument("--endpoint", default=None, help="a running daemon's endpoint")
    perf.add_argument("--bootstrap-servers", default=None, help="start a daemon for this cluster")
    perf.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                      help="a setting of the daemon perf-test starts")
    perf.add_argument("--json", default=None, help="also write the result to this file as JSON")
    perf.set_defaults(handler=_perf_test)

    produce = commands.add_parser(
        "produce", help="send lines of standard input, or files, to a topic through the daemon (as kcat -P)",
        usage="%(prog)s TOPIC [FILE ...] [--endpoint ENDPOINT] [-K SEP] [-H NAME=VALUE ...] [-p PARTITION] [-l] "
              "[--max-block-ms MS]",
        description="One record a line of standard input, as kcat -P (an empty line is skipped), or one a file. "
                    "Exit code 0 when every record was delivered, 1 when any was not (each is named on standard "
                    "error) or no daemon answered, 2 for a usage error.")
    produce.add_argument("topic", metavar="TOPIC")
    # "+", made optional, rather than "*": argparse (3.11) gives a "*" positional its empty match at once, and
    # would then refuse the FILEs of `produce TOPIC -l FILE`.
    produce.add_argument("files", nargs="+", default=[], metavar="FILE",
                         help="send each file as one record (with -l: one record a line) instead of standard "
                              "input").required = False
    produce.add_argument("--endpoint", help=f"the daemon's endpoint (default: ${ipc.ENDPOINT_ENV} or "
                                            f"{ipc.DEFAULT_ENDPOINT})")
    produce.add_argument("-K", dest="key_separator", metavar="SEP",
                         help="split each line at the first SEP into key and value (a line without it: the value, "
                              "with a null key); kcat's escapes \\t, \\xNN")
    produce.add_argument("-H", dest="headers", action="append", default=[], metavar="NAME=VALUE",
                         help="a header on every record (repeatable; NAME alone: a null value)")
    produce.add_argument("-p", dest="partition", type=int, metavar="PARTITION",
                         help="send every record to this partition (default, or -1: the partitioner)")
    produce.add_argument("-l", dest="line_mode", action="store_true",
                         help="with FILEs: one record a line of each, as standard input")
    produce.add_argument("--max-block-ms", type=int, metavar="MS",
                         help="how long to wait for the daemon, the topic's metadata or memory (default: the "
                              "daemon's max.block.ms)")
    produce.set_defaults(handler=_produce)

    dev_broker = commands.add_parser("dev-broker", help="run the embedded Kafka broker (Tansu) on 127.0.0.1 in the "
                                                        "foreground, for local development")
    dev_broker.add_argument("--port", type=int, help="the port to listen on (default: a free one)")
    dev_broker.add_argument("--partitions", type=int, default=1,
                            help="partitions of each --topic (default 1, as Kafka's num.partitions)")
    dev_broker.add_argument("--topic", dest="topics", action="append", default=[], metavar="NAME",
                            help="a topic to create (repeatable)")
    dev_broker.set_defaults(handler=_dev_broker)

    settings = commands.add_parser("settings", help="list the settings -X takes, with their defaults")
    settings.set_defaults(handler=_list_settings)
    return parser


def _list_settings(args: argparse.Namespace) -> int:
    for key in KEYS.values():
        print(f"{key.name:40} {shown(key.name, key.default):>12}  {'[reload] ' if key.live else ''}{key.doc}"
              .rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    log_format.configure(args.log_level or "INFO", "text")
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"kafka-sidecar: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
