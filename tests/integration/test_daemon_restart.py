"""A daemon killed with SIGKILL and started again loses no record its clients handed off.

Clients hand the session of a dead daemon to the next one: their segments, and the batches they sealed
that were not reported, which are sent again. At least once: only those may be written twice, and the
first copy of every record keeps its order per client and partition.
"""

from __future__ import annotations

import multiprocessing
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from client_stub import Producer
from service.tools.readback import read_topic
from tests.support import workers
from tests.support.sidecar import SidecarProcess

pytestmark = pytest.mark.broker

CLIENTS = 4
RECORDS = 50_000
KILLS = 5
SPAWN = multiprocessing.get_context("spawn")


def kill_and_restart(daemon: SidecarProcess, clients: list, rng: random.Random, during_restart=None) -> int:
    """SIGKILL the daemon ``KILLS`` times while the clients send, restarting it after 0.5 to 2 s each time;
    returns how many kills happened while every client was still sending."""
    kills_while_sending = 0
    for kill in range(KILLS):
        time.sleep(rng.uniform(0.5, 1.5))
        kills_while_sending += all(c.is_alive() for c in clients)
        daemon.kill()
        time.sleep(rng.uniform(0.5, 2.0))
        if during_restart is not None and kill == KILLS // 2:
            during_restart()
        daemon.start()
    return kills_while_sending


def check_at_least_once(bootstrap: str, topic: str, tmp_path: Path) -> dict[str, int]:
    """Every record read back at least once; only records handed back to a restarted daemon twice; the
    first copies in order per client and partition; every future resolved with the metadata of a copy."""
    results = {c: workers.read_results(tmp_path / f"results-{c}.jsonl") for c in range(CLIENTS)}
    errors = [r for rows in results.values() for r in rows if "error" in r]
    assert errors == [], errors[:5]
    read = read_topic(bootstrap, topic, expected=CLIENTS * RECORDS, timeout=120)
    ids = [dict(r.headers)["id"].decode() for r in read]
    copies = Counter(ids)
    assert set(copies) == {f"{c}:{n}" for c in range(CLIENTS) for n in range(RECORDS)}
    duplicates = sum(copies.values()) - len(copies)
    handed_back = sum(int(count) for c in range(CLIENTS)
                      for count in re.findall(r"\((\d+) record\(s\), sent again\)",
                                              (tmp_path / f"client-{c}.log").read_text()))
    assert duplicates <= handed_back
    # Read sorted by (partition, offset): the first copies of each client's records, per partition, in order.
    first: dict[tuple[int, int], list[int]] = {}
    seen = set()
    for record, record_id in zip(read, ids, strict=True):
        if record_id not in seen:
            seen.add(record_id)
            client, n = map(int, record_id.split(":"))
            first.setdefault((client, record.partition), []).append(n)
    assert all(numbers == sorted(numbers) for numbers in first.values())
    # Each future names a copy of its own record.
    by_position = {(r.partition, r.offset): record_id for r, record_id in zip(read, ids, strict=True)}
    for client, rows in results.items():
        assert all(by_position[(row["partition"], row["offset"])] == f"{client}:{row['n']}" for row in rows)
    return {"duplicates": duplicates, "handed_back": handed_back}


def start_clients(endpoint: str, topic: str, tmp_path: Path) -> list:
    clients = [SPAWN.Process(target=workers.produce_paced,
                             args=(endpoint, topic, c, RECORDS, str(tmp_path / f"results-{c}.jsonl"), 14.0,
                                   str(tmp_path / f"client-{c}.log")))
               for c in range(CLIENTS)]
    for client in clients:
        client.start()
    return clients


def join_clients(clients: list) -> None:
    try:
        for client in clients:
            client.join(240)
            assert client.exitcode == 0
    finally:
        for client in clients:
            if client.is_alive():
                client.kill()
                client.join()


def test_five_kills_lose_nothing(broker, topic_factory, sidecar, tmp_path) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    clients = start_clients(daemon.endpoint, topic, tmp_path)
    try:
        assert kill_and_restart(daemon, clients, random.Random(24)) >= 3
    finally:
        join_clients(clients)
    figures = check_at_least_once(broker.bootstrap, topic, tmp_path)
    assert figures["handed_back"] > 0, "no kill found anything unreported: the test did not test"


def test_five_kills_with_the_broker_cut_during_a_restart_lose_nothing(proxied_broker, sidecar, tmp_path) -> None:
    tansu, proxy = proxied_broker
    tansu.create_topic("restarts", 3)
    daemon = sidecar(proxy.address, settings={"request.timeout.ms": 3000, "retry.backoff.ms": 100})
    clients = start_clients(daemon.endpoint, "restarts", tmp_path)

    def cut() -> None:
        # The restarted daemon finds no broker: it takes the sessions back and waits with them.
        proxy.blackhole()
        time.sleep(1.0)

    try:
        assert kill_and_restart(daemon, clients, random.Random(2024), during_restart=cut) >= 3
        time.sleep(2.0)
        proxy.heal()
    finally:
        proxy.heal()
        join_clients(clients)
    figures = check_at_least_once(proxy.address, "restarts", tmp_path)
    assert figures["handed_back"] > 0


def test_a_daemon_down_long_enough_for_hellos_said_again_loses_nothing(broker, topic_factory, sidecar) -> None:
    # While no daemon answers, the client says HELLO again every few seconds; the restarted daemon gets
    # them all at once, and the client takes the welcome of its last only.
    topic = topic_factory(1)
    daemon = sidecar(broker.bootstrap)
    with Producer(daemon.endpoint, linger_ms=600_000) as producer:
        held = [producer.send(topic, f"held-{n}".encode()) for n in range(100)]
        daemon.kill()
        time.sleep(12)
        daemon.start()
        assert [f.result(30).offset for f in held] == list(range(100))
    assert [r.value for r in read_topic(broker.bootstrap, topic, expected=100)] == \
        [f"held-{n}".encode() for n in range(100)]
    assert daemon.log_tail(100).count("resuming its session") == 1
