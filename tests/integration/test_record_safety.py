"""A record is safe from the moment send() returns: a process killed after its last send(), before anything it
sent was sealed, has its records delivered, because the daemon claims what a dead client published."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import Counter

import pytest

from service.tools.readback import read_topic
from tests.support import workers

pytestmark = pytest.mark.broker

SPAWN = multiprocessing.get_context("spawn")
# Fewer than fill a block of any partition: nothing is full, so nothing is claimed before the kill.
RECORDS = 300


def test_a_process_killed_right_after_send_returns_has_its_records_delivered(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(partitions=3)
    daemon = sidecar(broker.bootstrap)
    receive, send = SPAWN.Pipe(duplex=False)
    client = SPAWN.Process(target=workers.send_then_wait_to_be_killed,
                           args=(daemon.endpoint, topic, 0, RECORDS, send))
    client.start()
    try:
        assert receive.poll(workers.HANG_S), "the client did not send its records"
        assert receive.recv() == RECORDS
        # Nothing sealed yet: the batches linger for an hour, and nothing asked for them.
        assert daemon.stats()["producer"]["record-send-total"] == 0
        os.kill(client.pid, signal.SIGKILL)
        client.join(workers.HANG_S)
        assert client.exitcode == -signal.SIGKILL
    finally:
        if client.is_alive():
            client.kill()
            client.join()
    read = read_topic(broker.bootstrap, topic, expected=RECORDS, timeout=workers.HANG_S)
    ids = Counter(dict(r.headers)["id"].decode() for r in read)
    assert ids == Counter(f"0:{n}" for n in range(RECORDS))
    # Each record as it was sent.
    by_id = {dict(r.headers)["id"].decode(): r for r in read}
    for n in range(RECORDS):
        sent = workers.record(0, n)
        got = by_id[f"0:{n}"]
        assert (got.key, got.value) == (sent["key"], sent["value"])
