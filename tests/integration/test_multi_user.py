"""The daemon and its clients as different users of one host, as the README and systemd/ deploy them.

The daemon runs as one system user, the applications as others, all in the daemon's group; the
tests run as root and start each as the user it would be (tests.support.users).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from client_stub.contract import ipc
from service.tools.readback import read_topic
from tests.support import users
from tests.support.sidecar import SidecarProcess

NOT_HERE = users.why_not()
pytestmark = [pytest.mark.broker, pytest.mark.skipif(NOT_HERE is not None, reason=str(NOT_HERE))]

# A client that sends for a few seconds (several of the daemon's liveness checks, 500 ms apart), then
# reports what its futures say.
CLIENT = """
import json, os, sys, time
from client_stub import Producer
topic, count, endpoint, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].encode()
producer = Producer(endpoint, max_block_ms=20000)
futures = []
started = time.monotonic()
for n in range(count):
    futures.append(producer.send(topic, b"%s-%d" % (name, n), key=b"%d" % (n % 7)))
    if n % 500 == 499:
        time.sleep(max(0.0, started + 3.0 * (n + 1) / count - time.monotonic()))
left = producer.flush(60)
errors = [repr(f.exception(0)) for f in futures if f.done() and f.exception(0) is not None]
offsets = [(f.result(0).partition, f.result(0).offset) for f in futures if f.done() and f.exception(0) is None]
producer.close(10)
print(json.dumps({"uid": os.getuid(), "left": left, "errors": errors[:5], "error_count": len(errors),
                  "delivered": len(offsets), "distinct": len(set(offsets))}))
"""


def run_client(user: users.User, topic: str, count: int, endpoint: str) -> dict[str, object]:
    code = f"import sys; sys.argv = ['client', {topic!r}, '{count}', {endpoint!r}, {user.name!r}]\n" + CLIENT
    done = users.run_python(user, code, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def host_users() -> dict[str, users.User]:
    made = {name: users.ensure_user(f"{users.GROUP}-{name}", users.GROUP) for name in ("daemon", "b", "c")}
    made["outsider"] = users.ensure_user(f"{users.GROUP}-outsider", users.OUTSIDER_GROUP)
    return made


# The unit's umask, a common default, and the tightest: the deployment works the same under each.
@pytest.mark.parametrize("umask", [0o007, 0o022, 0o077], ids=["umask-007", "umask-022", "umask-077"])
def test_clients_of_other_users_in_the_group_keep_their_sessions(broker, topic_factory, host_users,
                                                                 umask: int) -> None:
    topic = topic_factory(3)
    count = 5000
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"], umask=umask) as daemon:
        assert os.stat(daemon.endpoint[len("ipc://"):]).st_uid == host_users["daemon"].uid
        reports = {name: run_client(host_users[name], topic, count, daemon.endpoint) for name in ("b", "c")}
        log = daemon.log_tail(400)
    for name, report in reports.items():
        assert report["uid"] == host_users[name].uid
        assert report == {**report, "left": 0, "error_count": 0, "delivered": count, "distinct": count}, report
    # The daemon, another user, took neither client for dead: each kept its one session to the end.
    assert "is gone: ending its session" not in log and "silent for" not in log, log
    assert log.count("connected: pid") == 3  # the start-up probe, and one session per client
    records = read_topic(broker.bootstrap, topic, expected=2 * count)
    values = sorted(record.value for record in records)
    assert values == sorted(b"%s-%d" % (f"{users.GROUP}-{name}".encode(), n)
                            for name in ("b", "c") for n in range(count))


def test_a_user_outside_the_group_can_neither_connect_nor_map(broker, host_users) -> None:
    with SidecarProcess(broker.bootstrap, user=host_users["daemon"], umask=0o000) as daemon:
        segment = f"/dev/shm/{daemon.segment_name}"
        code = ("from client_stub import Producer\n"
                "from client_stub.errors import SidecarUnavailableError\n"
                f"producer = Producer({daemon.endpoint!r}, max_block_ms=2000)\n"
                "try:\n"
                "    producer.send('t', b'v')\n"
                "except SidecarUnavailableError as exc:\n"
                "    print('refused:', exc)\n"
                "producer.close(0)\n"
                "try:\n"
                f"    open({segment!r}, 'rb')\n"
                "except PermissionError:\n"
                "    print('cannot map')\n")
        outside = users.run_python(host_users["outsider"], code, umask=0o000)
        inside = users.run_python(host_users["b"], code.replace("2000", "20000"), umask=0o000)
    assert outside.returncode == 0, outside.stderr[-2000:]
    assert "refused: no kafka-sidecar daemon answered" in outside.stdout and "cannot map" in outside.stdout
    # The same code as a member of the group: it connects, and could map the segment.
    assert inside.returncode == 0 and "refused" not in inside.stdout and "cannot map" not in inside.stdout, inside


def test_the_daemon_watches_clients_it_has_no_privilege_over(host_users) -> None:
    # As the daemon's user: a client process of another user is alive, then gone, by its start time.
    client = subprocess.Popen(["sleep", "30"], user=host_users["b"].uid, group=host_users["b"].gid, extra_groups=[])
    try:
        identity = ipc.process_identity(client.pid)  # what the client sends of itself
        assert identity is not None
        check = ("import sys; from client_stub.contract import ipc\n"
                 f"print(ipc.process_alive({client.pid}, {identity[1]!r}), ipc.process_identity({client.pid}))")
        seen = users.run_python(host_users["daemon"], check)
        assert seen.returncode == 0, seen.stderr
        # Alive, though its namespace cannot be read without ptrace rights (which the old check needed).
        assert seen.stdout.split() == ["True", "None"]
    finally:
        client.kill()
        client.wait()
    gone = users.run_python(host_users["daemon"], "from client_stub.contract import ipc\n"
                                                  f"print(ipc.process_alive({client.pid}, {identity[1]!r}))")
    assert gone.stdout.split() == ["False"]
