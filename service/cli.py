"""The ``kafka-sidecar`` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from client_stub.contract import ipc
from client_stub.errors import ConfigError

from .config import KEYS, ProducerConfig, parse_settings


def _run(args: argparse.Namespace) -> int:
    from .daemon import SidecarDaemon

    settings = parse_settings(args.settings)
    settings["bootstrap.servers"] = args.bootstrap_servers
    daemon = SidecarDaemon(ProducerConfig(settings), args.endpoint)
    daemon.install_signal_handlers()
    daemon.run()
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    from .tools.quickstart import run

    return run(processes=args.processes, records=args.records, spark=not args.skip_spark)


def _perf_test(args: argparse.Namespace) -> int:
    from .tools.perf_test import main

    return main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-sidecar", description="A node-local Kafka producer sidecar.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the sender daemon in the foreground")
    run.add_argument("--bootstrap-servers", required=True, help="host:port[,host:port...] of the Kafka cluster")
    run.add_argument("--endpoint", default=ipc.default_endpoint(),
                     help=f"ZeroMQ endpoint to serve (default: ${ipc.ENDPOINT_ENV} or {ipc.DEFAULT_ENDPOINT})")
    run.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                     help="a Kafka producer setting, e.g. -X linger.ms=10 (see `kafka-sidecar settings`)")
    run.set_defaults(handler=_run)

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
    perf.add_argument("--endpoint", default=None, help="a running daemon's endpoint")
    perf.add_argument("--bootstrap-servers", default=None, help="start a daemon for this cluster")
    perf.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                      help="a setting of the daemon perf-test starts")
    perf.add_argument("--json", default=None, help="also write the result to this file as JSON")
    perf.set_defaults(handler=_perf_test)

    settings = commands.add_parser("settings", help="list the settings -X takes, with their defaults")
    settings.set_defaults(handler=_list_settings)
    return parser


def _list_settings(args: argparse.Namespace) -> int:
    for key in KEYS.values():
        default = ",".join(key.default) if isinstance(key.default, list) else key.default
        print(f"{key.name:40} {default!s:>12}  {key.doc}".rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"kafka-sidecar: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
