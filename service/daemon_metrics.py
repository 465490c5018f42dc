"""The daemon's metrics: every one a running daemon reports, by the names Kafka's producer gives them.

:func:`daemon_metrics` reads them into one mapping (``producer-metrics``,
``producer-node-metrics``, ``producer-topic-metrics``, beside the sidecar's own and one
entry per client process): what ``kafka-sidecar stats`` prints, the Prometheus page
exposes and systemd's STATUS line sums up. :data:`DESCRIPTIONS` says what each means.
"""

from __future__ import annotations

import math
from typing import Any

from .buffer_pool import BufferPool
from .front import SidecarFront
from .producer.core import ProducerCore


def daemon_metrics(core: ProducerCore, pool: BufferPool, front: SidecarFront) -> dict[str, Any]:
    """Every metric of a daemon: ``producer`` (Kafka's producer-metrics), ``nodes`` (producer-node-metrics
    by node id), ``topics`` (producer-topic-metrics by topic), ``sidecar`` (the daemon's own) and
    ``processes`` (one entry per client process). Map keys are strings (msgpack and JSON carry them)."""
    now = core.clock()
    producer = core.metrics.producer_metrics(now)
    producer.update(core.selector.metrics.producer_metrics(now))
    producer.update({
        "connection-count": float(core.selector.connection_count()),
        "metadata-age": (now - core.metadata.last_successful_refresh_ms) / 1000
        if core.metadata.last_successful_refresh_ms else math.nan,
        "buffer-total-bytes": float(pool.block_count * pool.block_size),
        "buffer-available-bytes": float(pool.free_blocks * pool.block_size),
        "bufferpool-wait-time-ns-total": float(pool.wait_time_ns_total),
        "waiting-threads": float(len(pool.waiters)),
        "buffer-queue-limit-bytes": float(pool.queue_limit * pool.block_size),
    })
    nodes = core.metrics.node_metrics(now)
    for node_id, metrics in core.selector.metrics.node_metrics(now).items():
        nodes.setdefault(node_id, {}).update(metrics)
    return {"client-id": core.config["client.id"], "producer": producer,
            "nodes": {str(n): f for n, f in sorted(nodes.items())}, "topics": core.metrics.topic_metrics(now),
            "sidecar": sidecar_metrics(core, pool, front), "processes": process_metrics(pool, front)}


def sidecar_metrics(core: ProducerCore, pool: BufferPool, front: SidecarFront) -> dict[str, float]:
    """The sidecar's own metrics: its clients, the BufferPool's blocks by state, what it refused."""
    granted, sealed = pool.block_states()
    block_size = pool.block_size
    in_flight: dict[Any, int] = {}
    for batch in core.sender.in_flight_batches():
        for part in batch.parts or [batch]:
            # The halves of a split batch share their blocks: each origin's counted once.
            in_flight[part.origin] = max(in_flight.get(part.origin, 0), -(-part.records_size // block_size))
    sessions = list(front.sessions)
    metrics = {"clients-connected": sum(s.attached for s in sessions), "sessions": len(sessions),
               "sessions-kept": len(front.sessions.kept()), "blocks-total": pool.block_count,
               "blocks-free": pool.free_blocks, "blocks-granted": granted, "blocks-sealed": sealed,
               "blocks-in-flight": sum(in_flight.values()), "block-size-bytes": block_size,
               "records-sealed-total": front.seals.records_sealed,
               "topics-awaiting-creation": len(core.metadata.awaiting_creation()),
               "reply-buffer-bytes": sum(s.waiting_bytes for s in sessions),
               "messages-refused-total": front.refusals.messages_refused,
               "replies-dropped-total": front.replies.replies_dropped,
               "sessions-ended-unread-total": front.replies.sessions_ended_unread,
               "batches-corrupt-total": core.metrics.batches_corrupt}
    return {name: float(value) for name, value in metrics.items()}


def process_metrics(pool: BufferPool, front: SidecarFront) -> list[dict[str, Any]]:
    """One entry per client process (as the kernel names it) with a session, kept ones included: its sessions,
    the blocks they hold and the requests for blocks they made, and their records reported delivered and
    failed."""
    processes: dict[int, dict[str, Any]] = {}
    for session in front.sessions.attached():
        delivered, failed = front.reports.records_of(session.pid)
        entry = processes.setdefault(session.pid, {"pid": session.pid, "uid": session.uid, "name": session.name,
                                                   "sessions": 0, "blocks-held": 0,
                                                   "block-requests-total": front.grants.requests_of(session.pid),
                                                   "records-delivered-total": delivered,
                                                   "record-error-total": failed,
                                                   "delivery-messages-total": front.reports.messages_to(session.pid)})
        entry["sessions"] += 1
        entry["blocks-held"] += pool.held_by(session.client_id)
    return [processes[pid] for pid in sorted(processes)]


def stats_report(core: ProducerCore, pool: BufferPool, front: SidecarFront) -> dict[str, Any]:
    """What a :class:`~client_stub.contract.ipc.Stats` request gets: every metric of the daemon, and the pool's
    blocks by client (``clients``: [client id, pid, blocks held] of each live session; ``held``: [client id,
    blocks held] of each segment)."""
    held = pool.held()
    return {**daemon_metrics(core, pool, front),
            "clients": [[s.client_id, s.pid, held.get(s.client_id, 0)] for s in front.sessions],
            "held": [[client_id, count] for client_id, count in held.items()]}


# What each metric means: the Java producer's descriptions for Kafka's, the sidecar's for its own.
DESCRIPTIONS: dict[str, str] = {
    "record-send-rate": "The average number of records sent per second.",
    "record-send-total": "The total number of records sent.",
    "records-per-request-avg": "The average number of records per request.",
    "batch-size-avg": "The average number of bytes sent per partition per-request.",
    "batch-size-max": "The max number of bytes sent per partition per-request.",
    "compression-rate-avg": "The average compression rate of record batches, defined as the average ratio of the "
                            "compressed batch size over the uncompressed size.",
    "compression-rate": "The average compression rate of record batches for a topic.",
    "record-queue-time-avg": "The average time in ms record batches spent in the send buffer.",
    "record-queue-time-max": "The maximum time in ms record batches spent in the send buffer.",
    "request-latency-avg": "The average request latency in ms.",
    "request-latency-max": "The maximum request latency in ms.",
    "produce-throttle-time-avg": "The average time in ms a request was throttled by a broker.",
    "produce-throttle-time-max": "The maximum time in ms a request was throttled by a broker.",
    "record-retry-rate": "The average per-second number of retried record sends.",
    "record-retry-total": "The total number of retried record sends.",
    "record-error-rate": "The average per-second number of record sends that resulted in errors.",
    "record-error-total": "The total number of record sends that resulted in errors.",
    "batch-split-rate": "The average number of batch splits per second.",
    "batch-split-total": "The number of batch splits.",
    "requests-in-flight": "The current number of in-flight requests awaiting a response.",
    "batches-queued": "Batches sealed by clients and not sent yet (the sidecar's).",
    "metadata-age": "The age in seconds of the current producer metadata being used.",
    "buffer-total-bytes": "The maximum amount of buffer memory the client can use (whether or not it is currently "
                          "used).",
    "buffer-available-bytes": "The total amount of buffer memory that is not being used (either unallocated or in "
                              "the free list).",
    "bufferpool-wait-time-ns-total": "The total time in nanoseconds an appender waits for space allocation.",
    "waiting-threads": "The number of user threads blocked waiting for buffer memory to enqueue their records "
                       "(here: block requests of clients waiting in the BufferPool's FIFO).",
    "buffer-queue-limit-bytes": "Of buffer memory, how much may be sealed and not yet acknowledged now "
                                "(sidecar.buffer.queue.ms; the sidecar's).",
    "connection-count": "The current number of active connections.",
    "connection-creation-rate": "The number of new connections established per second.",
    "connection-creation-total": "The total number of new connections established.",
    "connection-close-rate": "The number of connections closed per second.",
    "connection-close-total": "The total number of connections closed.",
    "request-rate": "The number of requests sent per second.",
    "request-total": "The total number of requests sent.",
    "request-size-avg": "The average size of requests sent.",
    "request-size-max": "The maximum size of any request sent.",
    "outgoing-byte-rate": "The number of outgoing bytes sent to all servers per second.",
    "outgoing-byte-total": "The total number of outgoing bytes sent to all servers.",
    "response-rate": "The number of responses received per second.",
    "response-total": "The total number of responses received.",
    "incoming-byte-rate": "The number of bytes read off all sockets per second.",
    "incoming-byte-total": "The total number of bytes read off all sockets.",
    "byte-rate": "The average number of bytes sent per second for a topic.",
    "byte-total": "The total number of bytes sent for a topic.",
    "clients-connected": "Client sessions with their shared memory (Producer instances connected).",
    "sessions": "Client sessions, those still making their memory handshake included.",
    "sessions-kept": "Sessions the daemon ended while their processes may live, kept for them.",
    "blocks-total": "Blocks of the BufferPool (buffer.memory / batch.size).",
    "blocks-free": "Blocks not granted to any client.",
    "blocks-granted": "Blocks granted to clients and not sealed.",
    "blocks-sealed": "Blocks of sealed batches not finished (queued or in flight).",
    "blocks-in-flight": "Blocks of sealed batches in requests in flight.",
    "block-size-bytes": "The size of a block (batch.size).",
    "records-sealed-total": "Records handed off to the daemon in sealed batches.",
    "topics-awaiting-creation": "Topics the cluster does not have, waiting for their turn to be created.",
    "reply-buffer-bytes": "Replies waiting in the daemon for clients that read them slowly.",
    "messages-refused-total": "Client messages the daemon refused.",
    "replies-dropped-total": "Answers to sockets without a session that ZeroMQ would not take.",
    "sessions-ended-unread-total": "Sessions ended because their clients did not read their replies.",
    "batches-corrupt-total": "Batches failed unsent because their records did not parse.",
    "blocks-held": "Blocks a client process holds, granted or sealed.",
    "records-delivered-total": "Records of a client process the brokers acknowledged.",
    "delivery-messages-total": "Messages of delivery reports sent to a client process: each wakes its producer.",
    "block-requests-total": "Requests for blocks of the BufferPool a client process's sessions made (its spare "
                            "blocks come back with its delivery reports otherwise).",
}
