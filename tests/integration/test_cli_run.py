"""`kafka-sidecar run --config FILE`: a daemon whose every setting comes from its configuration file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from client_stub import Producer
from service.tools.readback import read_topic
from tests.support import users
from tests.support.sidecar import wait_until

pytestmark = pytest.mark.broker


def test_a_daemon_runs_from_its_configuration_file_and_logs_json(broker, topic_factory, tmp_path) -> None:
    topic = topic_factory(1)
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    config = tmp_path / "kafka-sidecar.toml"
    config.write_text(f'[producer]\nbootstrap.servers = "{broker.bootstrap}"\nlinger.ms = 1\n\n'
                      f'[sidecar]\nendpoint = "{endpoint}"\n\n[log]\nformat = "json"\n')
    daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--config", str(config)],
                              stderr=subprocess.PIPE, text=True, cwd=users.ROOT)
    try:
        assert wait_until(lambda: (tmp_path / "sidecar.sock").exists() or daemon.poll() is not None, timeout=20)
        with Producer(endpoint) as producer:
            assert producer.send(topic, b"from the file's daemon").result(30).offset == 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, log
    assert [r.value for r in read_topic(broker.bootstrap, topic, expected=1)] == [b"from the file's daemon"]
    lines = [json.loads(line) for line in log.splitlines()]
    assert any(line["logger"] == "service.daemon" and endpoint in line["message"] for line in lines)
