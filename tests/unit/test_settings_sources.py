"""The daemon's settings from a TOML file, the environment and the command line, and `check-config`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from client_stub.errors import ConfigError
from service import cli, log_format
from service.config import ProducerConfig
from service.settings_sources import COMMAND_LINE, DEFAULT, ENVIRONMENT, FILE, environment_name, gather

EXAMPLE = """
[producer]
bootstrap.servers = "kafka-1:9092,kafka-2:9092"
linger.ms = 10
"compression.type" = "lz4"

[sidecar]
endpoint = "ipc:///tmp/kafka-sidecar-test/sidecar.sock"
client.timeout.ms = 5000

[metrics]
port = 9464

[log]
format = "json"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kafka-sidecar.toml"
    path.write_text(text)
    return path


def test_a_file_gives_producer_sidecar_and_log_settings(tmp_path: Path) -> None:
    sources = gather(write(tmp_path, EXAMPLE), {}, {})
    config = ProducerConfig(sources.settings)
    # linger.ms = 10 is a table "linger" to TOML: read back as the dotted name; a quoted name as it is.
    assert (config["linger.ms"], config["compression.type"]) == (10, "lz4")
    assert config["bootstrap.servers"] == ["kafka-1:9092", "kafka-2:9092"]
    assert (config["sidecar.endpoint"], config["sidecar.client.timeout.ms"]) == (
        "ipc:///tmp/kafka-sidecar-test/sidecar.sock", 5000)
    assert (config["sidecar.metrics.port"], config["sidecar.metrics.host"]) == (9464, "127.0.0.1")
    assert sources.log == {"level": "INFO", "format": "json", "file": ""}
    assert (sources.origin("linger.ms"), sources.origin("acks")) == (FILE, DEFAULT)


def test_the_command_line_over_the_environment_over_the_file(tmp_path: Path) -> None:
    environment = {"KAFKA_SIDECAR_LINGER_MS": "20", "KAFKA_SIDECAR_CLIENT_TIMEOUT_MS": "7000",
                   "KAFKA_SIDECAR_PURE_PYTHON": "1", "PATH": "/bin"}
    sources = gather(write(tmp_path, EXAMPLE), environment, {"linger.ms": "30"})
    config = ProducerConfig(sources.settings)
    assert (config["linger.ms"], sources.origin("linger.ms")) == (30, COMMAND_LINE)
    assert (config["sidecar.client.timeout.ms"], sources.origin("sidecar.client.timeout.ms")) == (7000, ENVIRONMENT)
    assert (config["compression.type"], sources.origin("compression.type")) == ("lz4", FILE)


def test_every_setting_has_a_variable_of_its_own() -> None:
    assert environment_name("linger.ms") == "KAFKA_SIDECAR_LINGER_MS"
    assert environment_name("sidecar.endpoint") == "KAFKA_SIDECAR_ENDPOINT"  # as the clients read it
    from service.config import KEYS

    assert len({environment_name(name) for name in KEYS}) == len(KEYS)


def test_a_variable_of_the_prefix_that_is_no_setting_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        gather(None, {"KAFKA_SIDECAR_LINGERMS": "10"}, {})
    assert "KAFKA_SIDECAR_LINGERMS is no setting of the daemon's" in caplog.text
    assert "did you mean KAFKA_SIDECAR_LINGER_MS?" in caplog.text


@pytest.mark.parametrize(("text", "message"), [
    ("[producer]\nlinger.mss = 10\n", "unknown key 'linger.mss' in [producer] (did you mean linger.ms?)"),
    ("[producer]\nclient.timeout.ms = 10\n", "unknown key 'client.timeout.ms' in [producer] (it belongs in [sidecar]"),
    ("[sidecar]\nacks = 1\n", "unknown key 'acks' in [sidecar] (it belongs in [producer])"),
    ("[sidecar]\nsocket.mod = '0660'\n", "unknown key 'socket.mod' in [sidecar] (did you mean socket.mode?)"),
    ("[metric]\nport = 9100\n", "unknown section [metric]"),
    ("[metrics]\nprot = 9100\n", "unknown key 'prot' in [metrics] (did you mean port?)"),
    ("[sidecar]\nmetrics.port = 9100\n", "unknown key 'metrics.port' in [sidecar] (it belongs in [metrics]"),
    ("[producer]\nport = 9100\n", "unknown key 'port' in [producer] (it belongs in [metrics], without its prefix)"),
    ("[log]\nfile = 3\n", "invalid value 3 for file in [log]: expected a path"),
    ("linger = 5\n", "unknown section [linger]"),
    ("[log]\nformat = 'xml'\n", "invalid value 'xml' for format in [log]: expected one of text, json"),
    ("[log]\nlevl = 'INFO'\n", "unknown key 'levl' in [log] (did you mean level?)"),
    ("[producer\n", "is not TOML"),
])
def test_a_file_that_is_wrong_is_refused_saying_where(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        gather(write(tmp_path, text), {}, {})
    assert message in str(refused.value) and str(tmp_path / "kafka-sidecar.toml") in str(refused.value)


def test_a_value_of_the_file_is_checked_as_any_other(tmp_path: Path) -> None:
    sources = gather(write(tmp_path, "[producer]\nbootstrap.servers = 'k:9092'\nlinger.ms = 'ten'\n"), {}, {})
    with pytest.raises(ConfigError, match="invalid value 'ten' for linger.ms"):
        ProducerConfig(sources.settings)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file .*missing.toml"):
        gather(tmp_path / "missing.toml", {}, {})


def test_check_config_prints_every_setting_with_where_it_came_from(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_SIDECAR_ACKS", "1")
    monkeypatch.setenv("KAFKA_SIDECAR_ENABLE_IDEMPOTENCE", "false")
    assert cli.main(["check-config", "--config", str(write(tmp_path, EXAMPLE)), "-X", "linger.ms=50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "linger.ms = 50  # command line" in lines
    assert "acks = 1  # environment" in lines
    assert "compression.type = lz4  # file" in lines
    assert "batch.size = 16384  # default" in lines
    assert "sidecar.socket.mode = 0660  # default" in lines
    assert "log.format = json" in lines


def test_check_config_refuses_what_run_would_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[producer]\nbootstrap.servers = 'k:9092'\nbatch.size = 65536\nbuffer.memory = 16384\n")
    assert cli.main(["check-config", "--config", str(path)]) == 2
    assert "batch.size (65536) must not be above buffer.memory (16384)" in capsys.readouterr().err


def test_json_log_lines_are_one_object_each(capsys: pytest.CaptureFixture[str]) -> None:
    log_format.configure("INFO", "json")
    try:
        logging.getLogger("service.test").warning("a %s", "message")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("service.test").exception("failed")
    finally:
        log_format.configure("WARNING", "text")
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{"))
    assert {k: first[k] for k in ("level", "logger", "message")} == {"level": "WARNING", "logger": "service.test",
                                                                     "message": "a message"}
    assert second["message"] == "failed" and "ValueError: boom" in second["exception"]


def test_the_annotated_example_is_a_configuration_the_daemon_takes() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "kafka-sidecar.toml"
    # Its socket group is the service's, which a test machine may not have: the daemon's own instead.
    sources = gather(example, {}, {"sidecar.socket.group": ""})
    config = ProducerConfig(sources.settings)
    assert config["compression.type"] == "lz4" and config["sidecar.endpoint"].startswith("ipc://")
    assert (config["sidecar.metrics.port"], config["sidecar.metrics.host"]) == (9464, "127.0.0.1")
    assert {sources.origin(name) for name in sources.settings} == {FILE, COMMAND_LINE}
