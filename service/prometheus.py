"""The daemon's metrics on Prometheus' text format, over HTTP, with the prometheus_client library.

Names follow the Java producer's, as a JMX exporter shows them: ``kafka_producer_`` and
the metric's name with ``_`` for ``-`` (``kafka_producer_record_send_rate``), with the
labels ``client_id`` and, per node or topic, ``node_id`` or ``topic``
(``kafka_producer_node_request_latency_avg``, ``kafka_producer_topic_record_send_total``);
the sidecar's own as ``kafka_sidecar_`` (``kafka_sidecar_blocks_free``) and, per client
process, ``kafka_sidecar_process_`` with ``pid``, ``uid`` and ``name``. A ``-total`` is a
counter, anything else a gauge. The page shows the metrics the event loop last published
(once a second): the HTTP server's thread never touches the loop's state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .daemon_metrics import DESCRIPTIONS

log = logging.getLogger(__name__)

# How often the loop publishes its metrics for the page.
PUBLISH_INTERVAL_MS = 1000


class MetricsCollector(Collector):
    """Metric families made from the last metrics the loop published (see
    :func:`~service.daemon_metrics.daemon_metrics`)."""

    def __init__(self) -> None:
        self.metrics: Mapping[str, Any] | None = None

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics  # one reference: the loop replaces it whole
        if metrics is None:
            return
        client = {"client_id": str(metrics["client-id"])}
        groups: list[tuple[str, list[tuple[dict[str, str], Mapping[str, float]]]]] = [
            ("kafka_producer_", [(client, metrics["producer"])]),
            ("kafka_producer_node_", [({**client, "node_id": n}, f) for n, f in metrics["nodes"].items()]),
            ("kafka_producer_topic_", [({**client, "topic": t}, f) for t, f in metrics["topics"].items()]),
            ("kafka_sidecar_", [({}, metrics["sidecar"])]),
            ("kafka_sidecar_process_", [
                ({"pid": str(p["pid"]), "uid": str(p["uid"]), "name": p["name"]},
                 {k: v for k, v in p.items() if k not in ("pid", "uid", "name")}) for p in metrics["processes"]]),
        ]
        for prefix, rows in groups:
            yield from _families(prefix, rows)


def _families(prefix: str, rows: list[tuple[dict[str, str], Mapping[str, float]]]) -> Iterator[Metric]:
    """One family per metric name, a sample per row that has it."""
    families: dict[str, Metric] = {}
    for labels, values in rows:
        for name, value in values.items():
            family = families.get(name)
            if family is None:
                metric = prefix + name.replace("-", "_")
                kind = CounterMetricFamily if name.endswith("-total") else GaugeMetricFamily
                family = families[name] = kind(metric, DESCRIPTIONS.get(name, name), labels=list(labels))
            family.add_metric(list(labels.values()), math.nan if value is None else float(value))
    yield from families.values()


class PrometheusExporter:
    """The metrics page on ``host``:``port``, served by prometheus_client's HTTP server in its own thread."""

    def __init__(self, host: str, port: int) -> None:
        self.collector = MetricsCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        log.info("metrics on http://%s:%d/metrics", host, port)

    def publish(self, metrics: Mapping[str, Any]) -> None:
        """Show ``metrics`` from now on (called by the loop)."""
        self.collector.metrics = metrics

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
