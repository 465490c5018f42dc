"""The README's quickstart: the multi-process demo and the Spark pipeline, each record read back and checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from client_stub import Producer
from service.tools.quickstart import check_flights

ROOT = Path(__file__).parents[2]


@pytest.mark.spark
def test_the_quickstart_runs_the_demo_and_the_pipeline_and_finds_every_flight() -> None:
    pytest.importorskip("pyspark")
    done = subprocess.run([sys.executable, "-m", "service.cli", "--log-level", "WARNING", "quickstart",
                           "--processes", "2", "--records", "2000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "delivered 4000 of 4000 records" in done.stdout
    assert "read 327346 records of 327346 completed flights: 0 missing, 0 duplicated, 0 wrong" in done.stdout


def test_the_check_fails_when_a_flight_is_missing_or_wrong(broker, topic_factory, sidecar, capsys) -> None:
    topic = topic_factory(6)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, json.dumps({"flight_id": "2013-01-01-UA1545-EWR-0515"}).encode(), key=b"N14228")
        assert producer.flush(30) == 0
    assert check_flights(broker.bootstrap, topic, timeout=5) == 1
    # One record, and it is not the flight it names (no timestamp, headers nor full value).
    summary = "read 1 records of 327346 completed flights: 327345 missing, 0 duplicated, 1 wrong"
    assert summary in capsys.readouterr().out
