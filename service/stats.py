"""``kafka-sidecar stats``: a running daemon's metrics, asked over its endpoint as any client may.

The daemon answers a STATS message without a session (see
:class:`~client_stub.contract.ipc.StatsReport`) with every metric of
:func:`~service.daemon_metrics.daemon_metrics`; this module asks and prints them, as a short
text or as JSON.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, TextIO

import zmq

from client_stub.contract import ipc
from client_stub.errors import SidecarUnavailableError


def request_stats(endpoint: str, timeout: float = 10.0) -> dict[str, Any]:
    """The metrics of the daemon at ``endpoint``; SidecarUnavailableError if none answers within ``timeout``
    seconds."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(ipc.encode(ipc.Stats()))
        if not sock.poll(int(timeout * 1000)):
            raise SidecarUnavailableError(f"no kafka-sidecar daemon answered at {endpoint} within {timeout:g} s")
        report = ipc.decode(sock.recv())
    finally:
        sock.close()
    if not isinstance(report, ipc.StatsReport):
        raise SidecarUnavailableError(f"the daemon at {endpoint} answered STATS with {type(report).__name__}")
    return report.metrics


def as_json(metrics: dict[str, Any]) -> str:
    """The metrics as JSON (a metric with no value yet, NaN, as null)."""
    return json.dumps(_without_nan(metrics), indent=2, sort_keys=True)


def _without_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_nan(item) for item in value]
    return value


def _n(value: float, digits: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def as_text(endpoint: str, metrics: dict[str, Any]) -> str:
    """What an operator looks at first: clients, records, requests, the BufferPool, brokers, topics, processes."""
    p, s = metrics["producer"], metrics["sidecar"]
    lines = [
        f"kafka-sidecar at {endpoint} (client.id {metrics['client-id']})",
        f"clients    {_n(s['clients-connected'])} connected, {len(metrics['processes'])} processes, "
        f"{_n(s['sessions-kept'])} sessions kept",
        f"records    {_n(p['record-send-total'])} sent ({_n(p['record-send-rate'], 1)}/s), "
        f"{_n(p['record-error-total'])} errors ({_n(p['record-error-rate'], 1)}/s), "
        f"{_n(p['record-retry-total'])} retries; {_n(s['records-sealed-total'])} handed off by clients",
        f"requests   {_n(p['requests-in-flight'])} in flight, latency avg {_n(p['request-latency-avg'], 1)} ms "
        f"max {_n(p['request-latency-max'])} ms, {_n(p['records-per-request-avg'], 1)} records a request, "
        f"throttled avg {_n(p['produce-throttle-time-avg'], 1)} ms",
        f"batches    {_n(p['batches-queued'])} queued, size avg {_n(p['batch-size-avg'])} bytes, compression rate "
        f"{_n(p['compression-rate-avg'], 2)}, queue time avg {_n(p['record-queue-time-avg'], 1)} ms "
        f"max {_n(p['record-queue-time-max'])} ms",
        f"buffer     {_n(p['buffer-available-bytes'])} of {_n(p['buffer-total-bytes'])} bytes free; blocks: "
        f"{_n(s['blocks-free'])} free, {_n(s['blocks-granted'])} granted, {_n(s['blocks-sealed'])} sealed "
        f"({_n(s['blocks-in-flight'])} in flight); {_n(p['waiting-threads'])} waiting, "
        f"{_n(p['bufferpool-wait-time-ns-total'] / 1e9, 3)} s waited",
        f"brokers    {_n(p['connection-count'])} connections, metadata {_n(p['metadata-age'], 1)} s old",
    ]
    for node_id, n in metrics["nodes"].items():
        lines.append(f"  node {node_id:<5} {_n(n.get('request-rate'), 1)} requests/s, "
                     f"{_n(n.get('outgoing-byte-rate'))} bytes/s out, latency avg {_n(n.get('request-latency-avg'), 1)}"
                     f" ms, {_n(n.get('requests-in-flight'))} in flight")
    if metrics["topics"]:
        lines.append("topics")
    for topic, t in metrics["topics"].items():
        lines.append(f"  {topic:<30} {_n(t['record-send-total'])} sent ({_n(t['record-send-rate'], 1)}/s), "
                     f"{_n(t['record-error-total'])} errors, {_n(t['byte-rate'])} bytes/s")
    if metrics["processes"]:
        lines.append("processes")
    for process in metrics["processes"]:
        lines.append(f"  pid {process['pid']:<8} uid {process['uid']:<6} {process['name'][:30]!r:32} "
                     f"{process['sessions']} sessions, {process['blocks-held']} blocks, "
                     f"{process['records-delivered-total']:,} delivered, {process['record-error-total']:,} failed")
    return "\n".join(lines)


def main(endpoint: str, *, json_output: bool = False, watch: float | None = None, timeout: float = 10.0,
         out: TextIO = sys.stdout) -> int:
    """Print the metrics once, or every ``watch`` seconds until interrupted; 1 if the daemon does not answer
    within ``timeout`` seconds."""
    try:
        while True:
            try:
                metrics = request_stats(endpoint, timeout)
            except SidecarUnavailableError as exc:
                print(f"kafka-sidecar: {exc}", file=sys.stderr)
                return 1
            print(as_json(metrics) if json_output else as_text(endpoint, metrics), file=out, flush=True)
            if watch is None:
                return 0
            time.sleep(watch)
            if not json_output:
                print(file=out)
    except KeyboardInterrupt:
        return 0
