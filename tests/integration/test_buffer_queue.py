"""The BufferPool's queue limit (sidecar.buffer.queue.ms) against a real broker behind the FaultProxy.

While batches flow, the blocks sealed and not acknowledged are held to what the daemon acknowledges in
sidecar.buffer.queue.ms, at least two max.request.size worth: a faster producer waits in send(). When
nothing is acknowledged, the whole pool buffers, as Java's buffer.memory does. Every record is read back.
"""

from __future__ import annotations

import uuid

from client_stub import Producer
from service.tools.readback import read_topic

BLOCK = 16384
# 256 blocks of 16 KiB; two requests of 64 KiB are 8 blocks, the least the queue may hold.
SETTINGS = {"buffer.memory": 256 * BLOCK, "batch.size": BLOCK, "max.request.size": 4 * BLOCK,
            "sidecar.buffer.queue.ms": 20, "linger.ms": 5}
VALUE = b"v" * 1000
# Records sent while nothing is acknowledged: 16 to a block.
RECORDS = 1500


def test_a_producer_faster_than_the_broker_queues_little_and_every_record_arrives(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    topic = f"queue-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 3)
    daemon = sidecar(proxy.address, settings=SETTINGS)
    limits = []
    with Producer(daemon.endpoint) as producer:
        producer.send(topic, b"warm").result(30)
        proxy.delay(20)  # every response 20 ms late: the broker is the slower side
        futures = []
        for n in range(20_000):
            futures.append(producer.send(topic, VALUE, str(n).encode()))
            if n % 2000 == 0:
                limits.append(daemon.stats()["producer"]["buffer-queue-limit-bytes"])
        assert producer.flush(120) == 0
    assert all(f.result(0).offset >= 0 for f in futures)
    # Flowing, the limit followed the rate: below the whole pool most of the time.
    assert min(limits) < SETTINGS["buffer.memory"], limits
    proxy.heal()
    records = read_topic(proxy.address, topic, expected=20_001)
    assert sorted(int(r.key) for r in records if r.key is not None) == list(range(20_000))


def test_while_nothing_is_acknowledged_the_whole_pool_buffers(proxied_broker, sidecar) -> None:
    tansu, proxy = proxied_broker
    topic = f"queue-away-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 3)
    # Requests the blackhole swallowed are sent again 3 s after they went, once it is healed.
    daemon = sidecar(proxy.address, settings={**SETTINGS, "request.timeout.ms": 3000})
    # Batches are sealed full: not by linger.ms while a busy machine holds send() up.
    with Producer(daemon.endpoint, max_block_ms=5000, linger_ms=1000) as producer:
        for _ in range(2000):  # flowing: the limit comes down to what is acknowledged
            producer.send(topic, VALUE, b"warm")
        assert producer.flush(30) == 0
        proxy.blackhole()
        # ~1.5 MiB, 12 times the least the queue holds: handed off without a BufferExhaustedError, once the daemon
        # has seen an interval with nothing acknowledged (else send() would raise it after 5 s). Less than the half
        # of the pool that one process may hold, with its spare blocks and open batches.
        futures = [producer.send(topic, VALUE, str(n).encode()) for n in range(RECORDS)]
        stats = daemon.stats()["producer"]
        assert stats["buffer-queue-limit-bytes"] == SETTINGS["buffer.memory"], stats
        proxy.heal()
        assert producer.flush(120) == 0
    assert all(f.result(0).offset >= 0 for f in futures)
    records = read_topic(proxy.address, topic, expected=2000 + RECORDS)
    assert sorted(int(r.key) for r in records if r.key != b"warm") == list(range(RECORDS))
