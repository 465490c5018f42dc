"""The daemon's figures under the Java producer's names: on its Prometheus page, through `kafka-sidecar stats`,
and a client's own through Producer.metrics(); each checked against what the brokers hold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client_stub import Producer
from service.tools.embedded import free_port
from service.tools.readback import read_topic
from tests.support import users
from tests.support.waiting import HANG_S, wait_until
from tests.support.workers import default_sigint

pytestmark = pytest.mark.broker
# A watch that has not exited this long after its SIGINT never will: it is made to say where it hangs, within
# the test's own timeout.
WATCH_EXIT_S = 60


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics page, parsed by prometheus_client's own parser: each sample by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG_S) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def producer_sample(page: dict, name: str, **labels: str) -> float:
    return page[(name, tuple(sorted({"client_id": "kafka-sidecar", **labels}.items())))]


def test_the_prometheus_page_counts_what_the_brokers_hold(broker, topic_factory, sidecar) -> None:
    topic, other = topic_factory(3), topic_factory(1)
    port = free_port()
    daemon = sidecar(broker.bootstrap, settings={"sidecar.metrics.port": port})
    with Producer(daemon.endpoint) as producer:
        for n in range(20_000):
            producer.send(topic, b"value %d" % n, key=b"%d" % (n % 101))
        for n in range(500):
            producer.send(other, b"other %d" % n)
        assert producer.flush(60) == 0
        held = read_topic(broker.bootstrap, topic, expected=20_000) + read_topic(broker.bootstrap, other,
                                                                               expected=500)
        # Read while the client is connected: the loop publishes its figures once a second.
        assert wait_until(lambda: producer_sample(scrape(port), "kafka_producer_record_send_total") == len(held))
        page = scrape(port)
        assert producer_sample(page, "kafka_producer_topic_record_send_total", topic=topic) == 20_000
        assert producer_sample(page, "kafka_producer_topic_record_send_total", topic=other) == 500
        assert producer_sample(page, "kafka_producer_record_error_total") == 0
        assert producer_sample(page, "kafka_producer_connection_count") == 1  # one broker
        assert producer_sample(page, "kafka_producer_record_send_rate") > 0
        assert producer_sample(page, "kafka_producer_request_latency_avg") >= 0
        assert producer_sample(page, "kafka_producer_records_per_request_avg") > 1  # batched
        assert producer_sample(page, "kafka_producer_compression_rate_avg") == 1.0  # compression.type=none
        assert producer_sample(page, "kafka_producer_buffer_total_bytes") == 32 * 1024 * 1024
        assert page[("kafka_sidecar_clients_connected", ())] == 1
        assert page[("kafka_sidecar_records_sealed_total", ())] == 20_500
        process = [labels for (name, labels) in page if name == "kafka_sidecar_process_records_delivered_total"]
        assert [dict(labels)["pid"] for labels in process] == [str(os.getpid())]
        assert page[("kafka_sidecar_process_records_delivered_total", process[0])] == 20_500
        # The client's own figures agree.
        assert producer.metrics()["records-delivered-total"] == 20_500
        assert producer.metrics()["record-send-total"] == 20_500
    # Loopback only, and gone with the daemon.
    assert daemon.stop() == 0
    with pytest.raises(OSError):
        scrape(port)


def test_kafka_sidecar_stats_reads_the_figures_over_the_endpoint(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(2)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        for n in range(1000):
            producer.send(topic, b"%d" % n)
        assert producer.flush(30) == 0
        stats = [sys.executable, "-m", "service.cli", "stats", "--endpoint", daemon.endpoint]
        figures = json.loads(subprocess.run([*stats, "--json"], capture_output=True, text=True, check=True,
                                            cwd=users.ROOT).stdout)
        assert figures["producer"]["record-send-total"] == 1000
        assert figures["topics"][topic]["record-send-total"] == 1000
        assert [p["records-delivered-total"] for p in figures["processes"]] == [1000]
        # A process's figures are counters: a Producer of it that closes takes nothing away.
        with Producer(daemon.endpoint) as second:
            assert second.send(topic, b"second").result(30)
        figures = json.loads(subprocess.run([*stats, "--json"], capture_output=True, text=True, check=True,
                                            cwd=users.ROOT).stdout)
        assert [(p["sessions"], p["records-delivered-total"]) for p in figures["processes"]] == [(1, 1001)]
        text = subprocess.run(stats, capture_output=True, text=True, check=True, cwd=users.ROOT).stdout
        assert "1,001 sent" in text and topic in text
        # --watch prints again until interrupted.
        # -X faulthandler: a watch that outlives its SIGINT is made to say where it is (SIGABRT).
        watch = subprocess.Popen([sys.executable, "-X", "faulthandler", *stats[1:], "--watch", "0.2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=users.ROOT,
                                 preexec_fn=default_sigint)
        try:
            lines = [watch.stdout.readline() for _ in range(30)]  # type: ignore[union-attr]
            assert sum(line.startswith("kafka-sidecar at") for line in lines) >= 2
        finally:
            watch.send_signal(signal.SIGINT)
            try:
                status = watch.wait(WATCH_EXIT_S)
            except subprocess.TimeoutExpired:
                watch.send_signal(signal.SIGABRT)
                pytest.fail(f"stats --watch did not exit within {WATCH_EXIT_S} s of SIGINT:\n"
                            f"{watch.communicate(30)[1]}")
            assert status == 0, watch.communicate()[1]


def test_stats_says_when_no_daemon_answers(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "service.cli", "stats", "--endpoint", f"ipc://{tmp_path}/none.sock",
                           "--timeout", "0.5"], capture_output=True, text=True, cwd=users.ROOT, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"kafka-sidecar: no kafka-sidecar daemon answered at ipc://{tmp_path}/none.sock "
                                   "within 0.5 s")
