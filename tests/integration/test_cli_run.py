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
from tests.support.waiting import wait_until

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
        assert wait_until(lambda: (tmp_path / "sidecar.sock").exists() or daemon.poll() is not None)
        with Producer(endpoint) as producer:
            assert producer.send(topic, b"from the file's daemon").result(30).offset == 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, log
    assert [r.value for r in read_topic(broker.bootstrap, topic, expected=1)] == [b"from the file's daemon"]
    lines = [json.loads(line) for line in log.splitlines()]
    assert any(line["logger"] == "service.daemon" and endpoint in line["message"] for line in lines)


def test_sighup_reopens_the_log_file_and_takes_the_settings_that_can_change_live(broker, topic_factory,
                                                                                  tmp_path) -> None:
    topic = topic_factory(1)
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    log_file = tmp_path / "kafka-sidecar.log"
    config = tmp_path / "kafka-sidecar.toml"
    settings = (f'[producer]\nbootstrap.servers = "{broker.bootstrap}"\nlinger.ms = 1\nbatch.size = 16384\n\n'
                f'[sidecar]\nendpoint = "{endpoint}"\n\n[log]\nfile = "{log_file}"\n')
    config.write_text(settings)
    daemon = subprocess.Popen([sys.executable, "-m", "service.cli", "run", "--config", str(config)],
                              stderr=subprocess.PIPE, text=True, cwd=users.ROOT)
    try:
        with Producer(endpoint) as producer:
            assert producer.send(topic, b"before").result(30).offset == 0
            assert "serving" in log_file.read_text()
            # logrotate moves the file away, then asks the daemon to open a new one.
            log_file.rename(tmp_path / "kafka-sidecar.log.1")
            config.write_text(settings.replace("linger.ms = 1", "linger.ms = 20").replace("16384", "32768"))
            daemon.send_signal(signal.SIGHUP)
            assert wait_until(lambda: log_file.exists() and "reload:" in log_file.read_text())
            text = log_file.read_text()
            assert "reload: now linger.ms=20" in text
            assert "batch.size changed, which only a restart applies" in text
            # A configuration that breaks a rule is not taken; the daemon goes on as it was.
            config.write_text(settings.replace("linger.ms = 1", "linger.ms = -5"))
            daemon.send_signal(signal.SIGHUP)
            assert wait_until(lambda: "the settings are not taken" in log_file.read_text())
            assert "invalid value -5 for linger.ms" in log_file.read_text()
            # A log file that cannot be opened is no reason to stop: the old one goes on.
            config.write_text(settings.replace("linger.ms = 1", "linger.ms = 20")
                              .replace(str(log_file), str(tmp_path / "missing" / "kafka-sidecar.log")))
            daemon.send_signal(signal.SIGHUP)
            assert wait_until(lambda: "cannot open the log file" in log_file.read_text())
            assert producer.send(topic, b"after").result(30).offset == 1
        # A client that connects now gets the new linger.ms.
        with Producer(endpoint) as producer:
            assert producer.send(topic, b"new client").result(30).offset == 2
            assert producer.linger_ms == 20
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, stderr
    assert stderr == ""  # everything went to the file
    assert "kafka-sidecar stopped" in log_file.read_text()
    assert "reload" not in (tmp_path / "kafka-sidecar.log.1").read_text()
