"""RecordAccumulator: per-partition FIFO queues of sealed batches, ready() and drain().

As in the Java producer, ready() tells the sender which nodes have something to
send and how long to sleep otherwise; drain() takes at most one batch per
partition per node (brokers reject a request with two batches for a partition)
up to max.request.size, starting each time at a different partition so that
none starves. Batches arrive sealed (the application filled and sealed them),
so a queued batch is sendable at once unless its partition backs off after a
failure (retry.backoff.ms, doubled per attempt with jitter, at most
retry.backoff.max.ms), is muted, or has no known leader.

Many clients feed one partition with small batches, and a request takes one
batch per partition: drain() coalesces the small batches queued at the head of
a partition, never sent yet, into one of at most ``coalesce_bytes`` bytes of
records (batch.size in the daemon, unless sidecar.coalesce.batches is off) that
fits in a request.

drain() reads a batch's records out of its client's memory before the batch
takes a sequence (ProducerBatch.read_records): one that is not well-formed
records leaves its queue unsent, in ``corrupt_batches``, for the sender to fail,
and the next batch takes its place; no sequence is spent on it.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from client_stub.contract.records import BATCH_HEADER_SIZE
from client_stub.errors import InvalidRecordError, KafkaError

from ..network.connection_states import ExponentialBackoff
from ..network.metadata import Cluster, Node
from .batch import ProducerBatch, TopicPartition
from .transaction_manager import TransactionManager, sequence_after

log = logging.getLogger(__name__)

FOREVER = 2**62

# Java's producer: retry.backoff.ms doubled with every attempt, spread by +-20%, at most retry.backoff.max.ms.
RETRY_BACKOFF_MULTIPLIER = 2
RETRY_BACKOFF_JITTER = 0.2


@dataclass(slots=True)
class ReadyCheckResult:
    ready_nodes: set[Node] = field(default_factory=set)
    next_ready_check_delay_ms: int = FOREVER
    unknown_leader_topics: set[str] = field(default_factory=set)


class RecordAccumulator:
    """The daemon's queues of batches waiting to be sent, and every batch not yet finished."""

    def __init__(self, *, retry_backoff_ms: int, retry_backoff_max_ms: int, delivery_timeout_ms: int,
                 coalesce_bytes: int = 0, transaction_manager: TransactionManager | None = None,
                 rng: random.Random | None = None) -> None:
        self._retry_backoff = ExponentialBackoff(retry_backoff_ms, RETRY_BACKOFF_MULTIPLIER, retry_backoff_max_ms,
                                                 RETRY_BACKOFF_JITTER, rng)
        # The backoff of each queued batch back from a failed attempt. Drawn once per attempt (Java
        # draws at every check), so that ready() and drain() agree on when the batch may go.
        self._backoffs: dict[ProducerBatch, int] = {}
        self.delivery_timeout_ms = delivery_timeout_ms
        # Coalesced batches hold at most this many bytes of records (0: no coalescing).
        self.coalesce_bytes = coalesce_bytes
        self.transaction_manager = transaction_manager
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._muted: set[TopicPartition] = set()
        # Per node, the partition the next drain starts at: where the last one stopped.
        self._drain_start: dict[int, TopicPartition] = {}
        # Whether the last drain left batches behind on a partition it drained from, or stopped
        # at a full request: more may go to the same nodes at once.
        self.drain_left_batches = False
        # The batches the last drain took out of their queues unsent, their records malformed, with their
        # errors: the sender fails them.
        self.corrupt_batches: list[tuple[ProducerBatch, InvalidRecordError]] = []
        # Every batch appended and not final yet, queued or in flight: what flush waits for.
        self.incomplete: set[ProducerBatch] = set()
        self.closed = False
        # No queued batch expires before this (it may be early: batches drained since are not taken out).
        self.next_batch_expiry_ms = FOREVER

    # -- queues ----------------------------------------------------------------------------------

    def append(self, batch: ProducerBatch) -> None:
        """Queue a sealed batch at the tail of its partition's queue."""
        if self.closed:
            raise RuntimeError("the accumulator is closed")
        self._batches.setdefault(batch.tp, deque()).append(batch)
        self.incomplete.add(batch)
        self._track_expiry(batch)

    def _track_expiry(self, batch: ProducerBatch) -> None:
        self.next_batch_expiry_ms = min(self.next_batch_expiry_ms, batch.created_ms + self.delivery_timeout_ms)

    def reenqueue(self, batch: ProducerBatch, now: int) -> None:
        """Put a batch to retry back at the head of its queue (in sequence order with idempotence)."""
        batch.reenqueued(now)
        self._back_off(batch)
        queue = self._batches.setdefault(batch.tp, deque())
        if self.transaction_manager is not None and batch.has_sequence:
            self._insert_in_sequence_order(queue, batch)
        else:
            queue.appendleft(batch)
        self._track_expiry(batch)

    @staticmethod
    def _insert_in_sequence_order(queue: deque[ProducerBatch], batch: ProducerBatch) -> None:
        # Retried batches sit at the head, ordered by sequence (across the wrap to 0), before any
        # batch without one.
        index = 0
        for queued in queue:
            if not queued.has_sequence or sequence_after(queued.base_sequence, batch.base_sequence):
                break
            index += 1
        queue.insert(index, batch)

    def split_and_reenqueue(self, batch: ProducerBatch, max_records_bytes: int, now: int) -> int:
        """Split a batch the broker found too large and queue the parts in its place."""
        parts = batch.split(max_records_bytes)
        queue = self._batches.setdefault(batch.tp, deque())
        for part in reversed(parts):
            self.incomplete.add(part)
            self._track_expiry(part)
            part.last_attempt_ms = now
            self._back_off(part)
            if self.transaction_manager is not None and part.has_sequence:
                self.transaction_manager.add_in_flight_batch(part)
                self._insert_in_sequence_order(queue, part)
            else:
                queue.appendleft(part)
        self.incomplete.discard(batch)
        batch.release_after_split()
        return len(parts)

    def mute(self, tp: TopicPartition) -> None:
        self._muted.add(tp)

    def unmute(self, tp: TopicPartition) -> None:
        self._muted.discard(tp)

    def queued_batches(self) -> int:
        return sum(len(q) for q in self._batches.values())

    def queued_by_leader(self, cluster: Cluster) -> dict[int, int]:
        """Per leader node id, the batches queued for the partitions it leads."""
        counts: dict[int, int] = {}
        for tp, queue in self._batches.items():
            leader = cluster.leader_for(tp.topic, tp.partition) if queue else None
            if leader is not None:
                counts[leader.id] = counts.get(leader.id, 0) + len(queue)
        return counts

    def has_incomplete(self) -> bool:
        return bool(self.incomplete)

    # -- close -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Take no more batches; what is queued is still sent."""
        self.closed = True

    # -- ready and drain -------------------------------------------------------------------------

    def _back_off(self, batch: ProducerBatch) -> None:
        """Draw the backoff of a queued batch that has been tried before."""
        if batch.attempts > 0:
            self._backoffs[batch] = self._retry_backoff.backoff(batch.attempts - 1)

    def _backoff_ms(self, batch: ProducerBatch) -> int:
        return self._backoffs.get(batch, 0)

    def ready(self, cluster: Cluster, now: int) -> ReadyCheckResult:
        """Nodes with a sendable batch, the delay until the next check, topics with no leader."""
        result = ReadyCheckResult()
        for tp, queue in self._batches.items():
            if not queue:
                continue
            leader = cluster.leader_for(tp.topic, tp.partition)
            if leader is None:
                result.unknown_leader_topics.add(tp.topic)
                continue
            if leader in result.ready_nodes or tp in self._muted:
                continue
            batch = queue[0]
            wait = batch.last_attempt_ms + self._backoff_ms(batch) - now
            if wait > 0:
                result.next_ready_check_delay_ms = min(result.next_ready_check_delay_ms, wait)
            else:
                # Sealed by its client (full, linger.ms, flush or pool pressure): sendable now.
                result.ready_nodes.add(leader)
        return result

    def drain(self, cluster: Cluster, nodes: Iterable[Node], max_size: int,
              now: int) -> dict[int, list[ProducerBatch]]:
        """Per node id, the batches to send now: one per partition, within ``max_size`` bytes."""
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, queue in self._batches.items():
            if queue:
                leader = cluster.leader_for(tp.topic, tp.partition)
                if leader is not None:
                    by_leader.setdefault(leader.id, []).append(tp)
        drained: dict[int, list[ProducerBatch]] = {}
        self.drain_left_batches = False
        self.corrupt_batches = []
        for node in nodes:
            batches = self._drain_node(by_leader.get(node.id, []), node.id, max_size, now)
            if batches:
                drained[node.id] = batches
        return drained

    def _drain_node(self, partitions: list[TopicPartition], node_id: int, max_size: int,
                    now: int) -> list[ProducerBatch]:
        if not partitions:
            return []
        partitions.sort()
        # A partition, not an index: the partitions with batches change from one drain to the next.
        start = bisect.bisect_left(partitions, self._drain_start.get(node_id, partitions[0])) % len(partitions)
        self._drain_start[node_id] = partitions[(start + 1) % len(partitions)]
        size = 0
        ready: list[ProducerBatch] = []
        tm = self.transaction_manager
        # Never larger than a request may be (batch.size may exceed max.request.size).
        coalesce_bytes = min(self.coalesce_bytes, max_size - BATCH_HEADER_SIZE)
        for i in range(len(partitions)):
            tp = partitions[(start + i) % len(partitions)]
            if tp in self._muted:
                continue
            queue = self._batches[tp]
            batch = self._sendable_head(queue, coalesce_bytes, now)
            if batch is None:
                continue
            if ready and size + batch.size_in_bytes > max_size:
                # The first partition that did not fit goes first next time.
                self._drain_start[node_id] = tp
                self.drain_left_batches = True
                break
            if tm is not None and tm.should_stop_drain(batch):
                continue
            queue.popleft()
            if queue:
                self.drain_left_batches = True
            self._backoffs.pop(batch, None)
            batch.coalescible = False
            if tm is not None and not batch.has_sequence:
                tm.assign_sequence(batch)
            batch.drained_ms = now
            size += batch.size_in_bytes
            ready.append(batch)
        return ready

    def _sendable_head(self, queue: deque[ProducerBatch], coalesce_bytes: int, now: int) -> ProducerBatch | None:
        """The head of ``queue`` if it is not backing off, coalesced with the batches behind it if they fit,
        its records read. A batch whose records are malformed leaves the queue for ``corrupt_batches``, and
        the next one is looked at in its place."""
        while queue:
            batch = queue[0]
            if batch.last_attempt_ms + self._backoff_ms(batch) > now:
                return None
            if self.coalesce_bytes and batch.coalescible and len(queue) > 1:
                batch = self._coalesce(queue, coalesce_bytes, now)
            try:
                batch.read_records()
            except InvalidRecordError as exc:
                queue.popleft()
                self._backoffs.pop(batch, None)
                self.corrupt_batches.append((batch, exc))
                continue
            return batch
        return None

    # At most this many queued batches are looked at for one coalesced batch.
    _COALESCE_CANDIDATES = 256

    def _coalesce(self, queue: deque[ProducerBatch], max_records_bytes: int, now: int) -> ProducerBatch:
        """Put one batch in place of the small ones at the head of ``queue``, if two fit; the head batch."""
        # A batch at its delivery timeout expires as it is drained: younger ones must not go with it.
        timeout = self.delivery_timeout_ms
        # Lazily: coalesce() stops at the first batch that does not fit, and behind a backlog of full
        # batches that is the second one. Listed, every drain would look at all the candidates of every
        # partition: the daemon's hottest loop when the pool is full.
        candidates = itertools.takewhile(lambda b: not b.has_reached_delivery_timeout(timeout, now),
                                         itertools.islice(queue, self._COALESCE_CANDIDATES))
        combined, taken = ProducerBatch.coalesce(candidates, max_records_bytes)
        if combined is None:
            return queue[0]
        for _ in range(taken):
            self.incomplete.discard(queue.popleft())
        queue.appendleft(combined)
        self.incomplete.add(combined)
        return combined

    # -- expiry and abort ------------------------------------------------------------------------

    def expired_batches(self, now: int) -> list[ProducerBatch]:
        """Queued batches whose delivery timeout has passed, removed from their queues.

        A queue is not in creation order (several clients, each batch with its own age, feed a
        partition), so every batch is looked at; but only once the next-expiry bound is reached.
        """
        if now < self.next_batch_expiry_ms:
            return []
        expired: list[ProducerBatch] = []
        self.next_batch_expiry_ms = FOREVER
        for queue in self._batches.values():
            kept: list[ProducerBatch] = []
            for batch in queue:
                if batch.has_reached_delivery_timeout(self.delivery_timeout_ms, now):
                    expired.append(batch)
                    self._backoffs.pop(batch, None)
                else:
                    kept.append(batch)
                    self._track_expiry(batch)
            if len(kept) < len(queue):
                queue.clear()
                queue.extend(kept)
        return expired

    def take_led_by(self, cluster: Cluster, node_id: int) -> list[ProducerBatch]:
        """Remove and return the batches queued for the partitions ``node_id`` leads (they will be failed)."""
        taken: list[ProducerBatch] = []
        for tp, queue in self._batches.items():
            leader = cluster.leader_for(tp.topic, tp.partition) if queue else None
            if leader is not None and leader.id == node_id:
                taken += queue
                queue.clear()
        for batch in taken:
            self._backoffs.pop(batch, None)
        return taken

    def drain_all(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (closing: they will be failed)."""
        batches = [b for queue in self._batches.values() for b in queue]
        self._batches.clear()
        self._backoffs.clear()
        return batches

    def abort_undrained(self, error: KafkaError) -> int:
        """Abort every batch still queued; returns how many."""
        batches = self.drain_all()
        for batch in batches:
            self.incomplete.discard(batch)
            batch.abort(error)
        return len(batches)

    def completed(self, batch: ProducerBatch) -> None:
        """Forget a batch that reached its final state."""
        self.incomplete.discard(batch)
