"""The daemon beside careless and hostile clients: what one process sends costs the others nothing."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from client_stub import Producer
from service.tools.readback import read_topic

pytestmark = pytest.mark.broker


def peak_resident_mb(pid: int) -> float:
    """VmHWM: the most memory the process has held resident since it started."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_300_mib_frame_is_dropped_before_it_is_read(broker, topic_factory, sidecar) -> None:
    topic = topic_factory(3)
    daemon = sidecar(broker.bootstrap)
    context = zmq.Context()
    hostile = context.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    delivered: list[int] = []
    try:
        with Producer(daemon.endpoint) as producer:
            producer.send(topic, b"warm").result(30)
            before = peak_resident_mb(daemon.pid)
            done = threading.Event()

            def well_behaved() -> None:
                # Beside the hostile client, all along: every record delivered.
                n = 0
                while not done.is_set():
                    futures = [producer.send(topic, b"good-%d" % m) for m in range(n, n + 1000)]
                    delivered.extend(f.result(30).offset >= 0 for f in futures)
                    n += 1000

            sender = threading.Thread(target=well_behaved)
            sender.start()
            hostile.connect(daemon.endpoint)
            hostile.send(bytes(300 << 20))
            time.sleep(3)  # ZeroMQ streams it out; the daemon drops the connection at its header
            done.set()
            sender.join(60)
            after = peak_resident_mb(daemon.pid)
        assert daemon.is_running()
    finally:
        hostile.close(0)
        context.term()
    # The frame never came into the daemon's memory (its peak grew by less than a tenth of it).
    assert after - before < 30, (before, after)
    assert delivered and all(delivered)
    values = {r.value for r in read_topic(broker.bootstrap, topic, expected=len(delivered) + 1)}
    assert values == {b"warm"} | {b"good-%d" % n for n in range(len(delivered))}

