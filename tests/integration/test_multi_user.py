"""The daemon and its clients as different users of one host, as the README and systemd/ deploy them.

The daemon runs as one system user, the applications as others, all in the daemon's group; the
tests run as root and start each as the user it would be, on a copy of the packages they can read
(tests.support.users). Where that cannot be done the tests are skipped, and fail in a CI run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_stub import Producer
from client_stub.errors import SidecarUnavailableError
from service.tools.readback import read_topic
from tests.support import users
from tests.support.sidecar import SidecarProcess
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.broker

# A client that sends for a few seconds, then reports what its futures say.
CLIENT = """
import json, os, sys, time
from client_stub import Producer
topic, count, endpoint, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].encode()
producer = Producer(endpoint, max_block_ms=int(sys.argv[5]))
futures = []
started = time.monotonic()
for n in range(count):
    futures.append(producer.send(topic, b"%s-%d" % (name, n), key=b"%d" % (n % 7)))
    if n % 500 == 499:
        time.sleep(max(0.0, started + 3.0 * (n + 1) / count - time.monotonic()))
left = producer.flush()
errors = [repr(f.exception(0)) for f in futures if f.done() and f.exception(0) is not None]
offsets = [(f.result(0).partition, f.result(0).offset) for f in futures if f.done() and f.exception(0) is None]
producer.close(10)
print(json.dumps({"uid": os.getuid(), "left": left, "errors": errors[:5], "error_count": len(errors),
                  "delivered": len(offsets), "distinct": len(set(offsets))}))
"""

# A client that sends records with a secret in them until told to stop on its stdin.
SECRET_SENDER = """
import json, os, sys, threading
from client_stub import Producer
topic, endpoint = sys.argv[1], sys.argv[2]
producer = Producer(endpoint)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
futures = [producer.send(topic, b"SECRET-OF-B-%d" % n) for n in range(1000)]
producer.flush()
print("SENDING", os.getpid(), flush=True)
n = 1000
while not stop.is_set():
    futures += [producer.send(topic, b"SECRET-OF-B-%d" % m) for m in range(n, n + 100)]
    n += 100
    stop.wait(0.002)
left = producer.flush()
producer.close(10)
print(json.dumps({"left": left, "delivered": sum(f.exception(0) is None for f in futures), "sent": len(futures)}))
"""

# What another client of the group tries against B while B sends.
SNOOPER = """
import json, os, sys
from client_stub import Producer
from client_stub.contract import shared_memory
b_pid, daemon_pid, endpoint = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
found = {"shm": sorted(os.listdir("/dev/shm")), "secret_in_shm": [], "proc": {}}
for name in found["shm"]:
    try:
        with open(os.path.join("/dev/shm", name), "rb") as f:
            if b"SECRET-OF-B" in f.read():
                found["secret_in_shm"].append(name)
    except OSError:
        pass
for who, pid in (("b", b_pid), ("daemon", daemon_pid)):
    for what in ("fd", "map_files", "mem"):
        path = f"/proc/{pid}/{what}"
        try:
            os.listdir(path) if what != "mem" else open(path, "rb").close()
            found["proc"][f"{who}/{what}"] = "open"
        except PermissionError:
            found["proc"][f"{who}/{what}"] = "denied"
try:
    shared_memory.connect(endpoint[len("ipc://"):] + ".memory", os.urandom(16), 5.0)
    found["guessed_token"] = "segment"
except shared_memory.HandshakeError as exc:
    found["guessed_token"] = str(exc)
with Producer(endpoint) as mine:
    mine.send(sys.argv[4], b"mine").result(30)
    found["secret_in_own_segment"] = b"SECRET-OF-B" in bytes(mine._io.segment.buf)
print(json.dumps(found))
"""


def run_client(user: users.User, topic: str, count: int, endpoint: str) -> dict[str, object]:
    code = with_argv(CLIENT, topic, count, endpoint, user.name, int(HANG_S * 1000))
    done = users.run_python(user, code)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_argv(code: str, *args: object) -> str:
    return f"import sys; sys.argv = ['client', *{[str(a) for a in args]!r}]\n" + code


def start_secret_sender(user: users.User, topic: str, endpoint: str) -> tuple[subprocess.Popen[str], int]:
    """B, sending its secrets once its first thousand are delivered; and its pid."""
    sender = users.start_python(user, with_argv(SECRET_SENDER, topic, endpoint))
    line = sender.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("SENDING"):
        sender.kill()
        raise AssertionError(line or sender.communicate()[1][-3000:])
    return sender, int(line.split()[1])


@pytest.fixture(autouse=True)
def other_users_possible() -> None:
    """Every test here starts processes of other users, or as root in a pid namespace of its own."""
    users.skip_or_fail()


@pytest.fixture(scope="module")
def host_users() -> Iterator[dict[str, users.User]]:
    """The daemon's user, two clients' in its group, and an outsider's, on a copy of the packages they can read."""
    users.skip_or_fail()
    with users.SharedPackages() as packages:
        made = {name: users.ensure_user(f"{users.GROUP}-{name}", users.GROUP, packages)
                for name in ("daemon", "b", "c")}
        made["outsider"] = users.ensure_user(f"{users.GROUP}-outsider", users.OUTSIDER_GROUP, packages)
        yield made


# The unit's umask, a common default, and the tightest: the deployment works the same under each.
@pytest.mark.parametrize("umask", [0o007, 0o022, 0o077], ids=["umask-007", "umask-022", "umask-077"])
def test_clients_of_other_users_in_the_group_keep_their_sessions(broker, topic_factory, host_users,
                                                                 umask: int) -> None:
    topic = topic_factory(3)
    count = 50_000
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"], umask=umask) as daemon:
        assert os.stat(daemon.endpoint[len("ipc://"):]).st_uid == host_users["daemon"].uid
        reports = {name: run_client(host_users[name], topic, count, daemon.endpoint) for name in ("b", "c")}
        log = daemon.log_tail(400)
    for name, report in reports.items():
        assert report["uid"] == host_users[name].uid
        assert report == {**report, "left": 0, "error_count": 0, "delivered": count, "distinct": count}, report
        # The daemon knows each client's user from the kernel, not from what the client says.
        assert f", uid {host_users[name].uid}, " in log
    # The daemon, another user, took neither client for dead: each kept its one session to the end.
    assert "is gone: ending its session" not in log and "silent for" not in log, log
    assert len(re.findall(r"client \d+ \(pid \d+, .*\) connected", log)) == 2
    records = read_topic(broker.bootstrap, topic, expected=2 * count)
    values = sorted(record.value for record in records)
    assert values == sorted(b"%s-%d" % (f"{users.GROUP}-{name}".encode(), n)
                            for name in ("b", "c") for n in range(count))


def test_a_client_cannot_reach_the_records_of_another(broker, topic_factory, host_users) -> None:
    topic = topic_factory(1)
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"]) as daemon:
        sender, pid = start_secret_sender(host_users["b"], topic, daemon.endpoint)
        try:
            snoop = users.run_python(host_users["c"], with_argv(SNOOPER, pid, daemon.pid, daemon.endpoint, topic))
            assert sender.poll() is None, "B was still sending while C looked"
            out, err = sender.communicate("stop\n", timeout=120)
        finally:
            sender.kill()
            sender.wait()
    assert snoop.returncode == 0, snoop.stderr[-3000:]
    found = json.loads(snoop.stdout.strip().splitlines()[-1])
    # No segment has a name: nothing of the daemon's is in /dev/shm, let alone B's records.
    assert not [name for name in found["shm"] if "kafka-sidecar" in name] and found["secret_in_shm"] == []
    # Neither B's nor the daemon's file descriptors or memory are open to C.
    assert set(found["proc"].values()) == {"denied"}, found["proc"]
    # The memory socket gives a segment for the token of a session only.
    assert "unknown token" in found["guessed_token"]
    # C's own segment has C's records only.
    assert found["secret_in_own_segment"] is False
    result = json.loads(out.strip().splitlines()[-1])
    assert result["left"] == 0 and result["delivered"] == result["sent"], (result, err[-2000:])


def test_the_daemon_sees_a_client_of_another_user_die_at_once(broker, topic_factory, host_users) -> None:
    topic = topic_factory(1)
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"]) as daemon:
        sender, pid = start_secret_sender(host_users["b"], topic, daemon.endpoint)
        try:
            client = daemon.client_id_of(pid)
            assert daemon.held().get(client, 0) > 0  # spare blocks, an open batch
            os.kill(pid, signal.SIGKILL)
        finally:
            sender.kill()
            sender.wait()
        # Its connection to the memory socket ended with it: the daemon, with no privilege over it, ends
        # the session for that, not after sidecar.client.timeout.ms (the log says which), and takes its
        # blocks back.
        assert wait_until(lambda: client not in daemon.held(), timeout=HANG_S)
        log = daemon.log_tail(200)
    assert re.search(rf"client \d+ \(pid {pid}, .*\) is gone: ending its session", log) and "silent for" not in log


def test_a_user_outside_the_group_can_neither_connect_nor_get_memory(broker, host_users) -> None:
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"], umask=0o000) as daemon:
        memory = daemon.endpoint[len("ipc://"):] + ".memory"
        code = ("import os, socket, sys\n"
                "from client_stub import Producer\n"
                "from client_stub.errors import SidecarUnavailableError\n"
                f"producer = Producer({daemon.endpoint!r}, max_block_ms=int(sys.argv[1]))\n"
                "try:\n"
                "    producer.send('t', b'v')\n"
                "except SidecarUnavailableError as exc:\n"
                "    print('refused:', exc)\n"
                "producer.close(0)\n"
                "try:\n"
                "    socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect(" + repr(memory) + ")\n"
                "except PermissionError:\n"
                "    print('no memory socket')\n")
        # The outsider's send fails once it has waited max.block.ms for a daemon; a member's never waits that long.
        outside = users.run_python(host_users["outsider"], with_argv(code, 2000), umask=0o000)
        inside = users.run_python(host_users["b"], with_argv(code, int(HANG_S * 1000)), umask=0o000)
    assert outside.returncode == 0, outside.stderr[-2000:]
    assert "refused: no kafka-sidecar daemon answered" in outside.stdout and "no memory socket" in outside.stdout
    # The same code as a member of the group: it connects and gets its segment.
    assert inside.returncode == 0 and "refused" not in inside.stdout and "no memory socket" not in inside.stdout, \
        inside


def test_a_client_the_daemon_cannot_see_is_told_to_share_the_hosts_pid_namespace(broker, topic_factory,
                                                                                  tmp_path) -> None:
    # The daemon in a container of its own pid namespace: the kernel names every process outside it 0 to the
    # daemon, and all of them would be one process to the per-process limits.
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is not installed")
    topic = topic_factory(1)
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    daemon = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-m", "service.cli", "run",
                               "--bootstrap-servers", broker.bootstrap, "--endpoint", endpoint],
                              stderr=subprocess.PIPE, text=True, cwd=users.ROOT)
    try:
        with Producer(endpoint, max_block_ms=3000) as producer, pytest.raises(SidecarUnavailableError) as refused:
            producer.send(topic, b"from another pid namespace")
    finally:
        # unshare forwards no signal: the daemon is its child (pid 1 of the new namespace).
        children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGTERM)
        _, log = daemon.communicate(timeout=60)
    assert "the daemon cannot see this process (pid 0 in its pid namespace)" in str(refused.value), log
    assert "hostPID: true" in str(refused.value)
