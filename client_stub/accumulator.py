"""The client's half of Kafka's RecordAccumulator: open batches, sealed batches awaiting their reports.

Records are appended to the open batch of their partition, in shared-memory blocks
(by the fast path's Appender, or the producer's Python path). A batch is sealed
when full, when it has lingered, on flush() and close(), and when the daemon asks;
the seal notice hands it to the daemon, which owns it from then on (the daemon's
RecordAccumulator, in service.producer.accumulator). Until its records are
reported, a sealed batch is kept here: its futures, and what its report is
counted against. Every method is called with the producer's lock held.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from .contract import ipc
from .fastpath import OpenBatch
from .futures import RecordFuture
from .partitioner import Partitioner

# Reports are slow when they take this many linger_ms (smoothed, or the oldest awaited one so far).
# The daemon or the broker is then behind, and a partition's open batch is not sealed at linger_ms
# while its previous sealed batch awaits its report: it keeps filling until full (or flush), as a
# Java batch that is ready but not yet drained does. Without that, many clients each sealing a batch
# every linger_ms queue more batches per partition than the daemon can send (one per partition per
# request), and the queue only grows. While reports come back quickly, holding a batch would only
# add the previous one's round trip to the latency of its records.
_SLOW_REPORT_LINGERS = 2

# (topic, partition): what a partition's open batch is found by.
PartitionKey = tuple[str, int]


class RecordAccumulator:
    """Open and sealed batches of one producer in one process (abandon() when its session is lost)."""

    def __init__(self, partitioner: Partitioner, post: Callable[[ipc.Message], None],
                 wake: Callable[[], None]) -> None:
        # (topic, partition) -> the open batch. The fast path appends to these batches and reads this dict.
        self.open: dict[PartitionKey, OpenBatch[RecordFuture]] = {}
        # batch id -> a sealed batch awaiting its report, in the order sealed.
        self.sealed: dict[int, OpenBatch[RecordFuture]] = {}
        # How many sealed batches of each partition await their reports.
        self._unreported: dict[PartitionKey, int] = {}
        self._notices: list[ipc.SealNotice] = []
        self._partitioner = partitioner
        self._post = post
        self._wake = wake
        self._next_batch_id = 1
        # Seal to report, smoothed; and whether reports were slow when the I/O thread last looked.
        self._report_time_s = 0.0
        self._holding = False
        self.linger_s = 0.0  # set when the daemon welcomes the producer, before any batch opens
        # When the I/O thread plans to look at the open batches again.
        self.wakes_at = 0.0

    def open_batch(self, topic: str, partition: int, blocks: list[int], view: memoryview,
                   timestamp_ms: int) -> OpenBatch[RecordFuture]:
        """A new open batch for the partition on ``blocks`` (``view``: their bytes)."""
        key = (topic, partition)
        opened = self.open.get(key)
        if opened is not None:
            # Another thread opened one while this one waited for its blocks: it goes first.
            self.seal(opened)
        batch: OpenBatch[RecordFuture] = OpenBatch(self._next_batch_id, topic, partition, blocks[0], len(blocks),
                                                   view, timestamp_ms, time.monotonic())
        self._next_batch_id += 1
        self.open[key] = batch
        if self._linger_deadline(batch.created) < self.wakes_at and not (self._holding and key in self._unreported):
            self._wake()  # the I/O thread must wake sooner than it planned, for this batch's linger
        return batch

    def seal_filled(self, batch: OpenBatch[RecordFuture]) -> None:
        """Seal a batch the fast path filled, unless another thread sealed it meanwhile."""
        if self.open.get((batch.topic, batch.partition)) is batch:
            self.seal(batch)

    def seal(self, batch: OpenBatch[RecordFuture]) -> None:
        """Hand a batch to the daemon: its notice goes in the next SEAL message; an empty one's blocks go back."""
        key = (batch.topic, batch.partition)
        del self.open[key]
        self._partitioner.batch_sealed(batch.topic, batch.partition)
        batch.release()
        if not batch.record_count:
            self._post(ipc.Release(list(range(batch.first_block, batch.first_block + batch.block_count))))
            return
        self.sealed[batch.batch_id] = batch
        self._unreported[key] = self._unreported.get(key, 0) + 1
        batch.sealed = time.monotonic()
        # Notices wait for the I/O thread, which sends all it finds in one SEAL message.
        self._notices.append(_notice(batch, batch.sealed))
        if len(self._notices) == 1:
            self._wake()

    def seal_all(self) -> None:
        """Seal every open batch (flush, close, the daemon's SealNow)."""
        for batch in list(self.open.values()):
            self.seal(batch)

    def seal_lingered(self, now: float) -> float:
        """Once a batch has waited linger_ms, seal it and every other open batch; returns when to look again.

        Sealing the younger batches too is what the Java producer does in effect (a
        ready node takes the first batch of each of its partitions, lingered or not),
        and it puts them all in one SEAL message, one wake-up of the I/O thread.
        While reports are slow, batches of partitions with a batch awaiting its
        report stay open: a report wakes the I/O thread, which looks again then.
        """
        self._holding = self._reports_slow(now)
        if self._holding:
            due = [b for key, b in self.open.items() if key not in self._unreported]
        else:
            due = list(self.open.values())
        oldest = min((b.created for b in due), default=None)
        if oldest is not None and self._linger_deadline(oldest) <= now:
            for batch in due:
                self.seal(batch)
            oldest = None
        self.wakes_at = now + 1.0 if oldest is None else self._linger_deadline(oldest)
        return self.wakes_at

    def _linger_deadline(self, created: float) -> float:
        """When a batch opened at ``created`` has lingered: linger_ms later on a clock of whole
        milliseconds, as the Java producer counts a batch's waited time."""
        return math.floor(created * 1000) / 1000 + self.linger_s

    def _reports_slow(self, now: float) -> bool:
        """Whether reports take _SLOW_REPORT_LINGERS x linger_ms, lately or the oldest awaited."""
        # Sealed batches are kept in the order they were sealed: the first one waited longest.
        oldest = next(iter(self.sealed.values()), None)
        waited = now - oldest.sealed if oldest is not None else 0.0
        return max(self._report_time_s, waited) >= _SLOW_REPORT_LINGERS * self.linger_s

    def resume_notices(self, now: float) -> list[ipc.SealNotice]:
        """Notices of every sealed batch not reported yet, in the order sealed: for the daemon that takes
        back the session of one that is gone."""
        return [_notice(batch, now) for batch in self.sealed.values()]

    def take_notices(self) -> ipc.Seal | None:
        """The waiting seal notices as one SEAL message, if any."""
        if not self._notices:
            return None
        notices, self._notices = self._notices, []
        return ipc.Seal(notices)

    def reported(self, rows: list[Any], now: float) -> list[tuple[OpenBatch[RecordFuture], ipc.DeliveryReport, int]]:
        """Count delivery reports against their batches; the batches still known, each with its report
        (its record_count within the batch) and how many of its records it reports for the first time."""
        reported = []
        for row in rows:
            report = ipc.DeliveryReport._make(row)
            batch = self.sealed.get(report.batch_id)
            if batch is None:
                continue  # of a batch given up on, or of another session
            # WHOLE_BATCH, and anything past the batch's end, count up to the batch's end.
            span = max(min(report.record_count, batch.record_count - report.first_record), 0)
            if batch.reported:
                # Part of it was reported before (a batch the daemon split, sent again whole by the daemon
                # that took the session back): only records whose futures are not done count now.
                fresh = sum(not f.done() for f in batch.futures[report.first_record:report.first_record + span])
            else:
                fresh = span
            fresh = min(fresh, batch.record_count - batch.reported)
            batch.reported += fresh
            if batch.reported >= batch.record_count:
                self._forget_sealed(batch)
                # Smoothed as TCP smooths its round-trip time (RFC 6298): one slow report is not slow reports.
                self._report_time_s += (now - batch.sealed - self._report_time_s) / 8
            reported.append((batch, report._replace(record_count=span), fresh))
        return reported

    def overdue(self, now: float, limit_s: float) -> list[OpenBatch[RecordFuture]]:
        """Forget and return the sealed batches unreported ``limit_s`` after sealing."""
        overdue = [b for b in self.sealed.values() if now - b.sealed > limit_s]
        for batch in overdue:
            self._forget_sealed(batch)
        return overdue

    def _forget_sealed(self, batch: OpenBatch[RecordFuture]) -> None:
        del self.sealed[batch.batch_id]
        key = (batch.topic, batch.partition)
        left = self._unreported[key] - 1
        if left:
            self._unreported[key] = left
        else:
            del self._unreported[key]

    def release_open(self) -> None:
        """Drop the open batches' views of shared memory (the segment is about to be unmapped)."""
        for batch in self.open.values():
            batch.release()
        self.open.clear()

    def abandon(self) -> list[RecordFuture]:
        """Forget every batch, open and sealed (their blocks are not this process's any more); returns the
        futures of their records, for the caller to fail."""
        futures = [f for batch in [*self.open.values(), *self.sealed.values()] for f in batch.futures]
        self.release_open()
        self.sealed.clear()
        self._unreported.clear()
        self._notices.clear()
        return futures


def _notice(batch: OpenBatch[RecordFuture], now: float) -> ipc.SealNotice:
    return ipc.SealNotice(batch.batch_id, batch.first_block, batch.block_count, batch.topic, batch.partition,
                          batch.record_count, batch.pos, batch.base_timestamp, batch.max_timestamp,
                          int((now - batch.created) * 1000))
