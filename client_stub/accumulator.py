"""The client's half of Kafka's RecordAccumulator: open batches, and batches awaiting their reports.

Records are appended to the open batch of their partition, in shared-memory blocks
(by the fast path's Appender, or the producer's Python path), and published in the
segment's control area as they are written (:mod:`.contract.batch_slots`): the daemon
lingers, and claims each batch when it is due. This side closes a batch (publishes it
full, and writes no more into it) when it is full, when the daemon has claimed it, on
flush() and close(), and when the session ends; the daemon is told of a batch's first
record (WAKEUP, by the Appender) only when it would not look in time otherwise. Until its
records are reported, a batch is kept here, with its futures; the Appender counts the reports
against it, and closes it there too (``Appender.reported``), as it does the batches it fills.
Every method is called with the producer's lock held.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from .contract import batch_slots, ipc
from .contract.batch_slots import ControlArea
from .fastpath import OpenBatch
from .futures import RecordFuture
from .partitioner import Partitioner

# (topic, partition): what a partition's open batch is found by.
PartitionKey = tuple[str, int]


class RecordAccumulator:
    """Open and closed batches of one producer in one process (abandon() when its session is lost)."""

    def __init__(self, partitioner: Partitioner, post: Callable[[ipc.Message], None]) -> None:
        # (topic, partition) -> the open batch. The fast path appends to these batches and reads this dict.
        self.open: dict[PartitionKey, OpenBatch[RecordFuture]] = {}
        # batch id -> every batch not wholly reported, open or closed, in the order opened.
        self.unreported: dict[int, OpenBatch[RecordFuture]] = {}
        self._partitioner = partitioner
        self._post = post
        # The ids of the batches opened, here and by the fast path.
        self.batch_ids = itertools.count(1)
        # The segment's control area, while the session has one.
        self.control: ControlArea | None = None

    def open_batch(self, topic: str, topic_index: int, partition: int, blocks: list[int], view: memoryview,
                   timestamp_ms: int) -> OpenBatch[RecordFuture]:
        """A new open batch for the partition on ``blocks`` (``view``: their bytes); ``topic_index``: the
        session's number for the topic."""
        assert self.control is not None, "batches open in a session with a segment"
        key = (topic, partition)
        opened = self.open.get(key)
        if opened is not None:
            # Another thread opened one while this one waited for its blocks: it goes first.
            self.seal(opened)
        batch: OpenBatch[RecordFuture] = OpenBatch(next(self.batch_ids), topic, partition, blocks[0], len(blocks),
                                                   view, timestamp_ms, time.monotonic(), self.control.words,
                                                   topic_index)
        self.open[key] = batch
        self.unreported[batch.batch_id] = batch
        return batch

    def want_reports(self, *, wakeup: bool) -> None:
        """Say in the segment's header that this process waits on its reports (a callback, a future waited on):
        the daemon then reports at once. With ``wakeup``, a daemon holding back reports of this process is told
        to send them now. Safe without the producer's lock: only a report with nothing left in flight clears the
        word (:meth:`reports_settled`)."""
        try:
            turned_on = self._turn_reports_on()
        except ValueError:
            return  # the segment was let go meanwhile (the producer closes, or lost its session)
        if turned_on and wakeup and self.unreported:
            self._post(ipc.Wakeup())

    def _turn_reports_on(self) -> bool:
        """Set the header's ``reports_wanted``; whether it was 0."""
        control = self.control
        if control is None or control.header(batch_slots.REPORTS_WANTED):
            return False
        control.set_header(batch_slots.REPORTS_WANTED, 1)
        return True

    def reports_settled(self) -> None:
        """Nothing is in flight (every record reported): the process waits on no report any more."""
        if self.control is not None:
            self.control.set_header(batch_slots.REPORTS_WANTED, 0)

    def granted(self, blocks: list[int]) -> None:
        """Blocks granted: any of them that an open batch here is on was that batch's, which the daemon claimed,
        sent and freed before this process saw the claim (and could write no more into it since): it is closed."""
        granted = set(blocks)
        for batch in list(self.open.values()):
            first = batch.first_block
            if not granted.isdisjoint(range(first, first + batch.block_count)):
                self.seal(batch)

    def seal_if_open(self, batch: OpenBatch[RecordFuture]) -> None:
        """Close a batch unless it is closed already (the fast path filled it while another thread closed it; its
        report or its block's next grant came after a claim this side had not seen)."""
        if self.open.get((batch.topic, batch.partition)) is batch:
            self.seal(batch)

    def seal(self, batch: OpenBatch[RecordFuture]) -> None:
        """Close an open batch: published full (the daemon claims it at its next look, if it has not), it takes
        no more records; an empty one's blocks go back."""
        del self.open[(batch.topic, batch.partition)]
        self._partitioner.batch_sealed(batch.topic, batch.partition)
        batch.release()
        if not batch.record_count:
            del self.unreported[batch.batch_id]
            self._post(ipc.Release(list(range(batch.first_block, batch.first_block + batch.block_count))))

    def seal_all(self) -> None:
        """Close every open batch, and have the daemon claim them now and report them at once (flush, close, the
        session's end)."""
        sealed = bool(self.open)
        for batch in list(self.open.values()):
            self.seal(batch)
        turned_on = self._turn_reports_on()
        if self.control is not None and (sealed or turned_on and self.unreported):
            self._post(ipc.Wakeup())

    def resume_notices(self, now: float) -> list[ipc.SealNotice]:
        """Notices of every batch not reported yet, in the order opened: for the daemon that takes back the
        session of one that is gone (every batch is closed by then)."""
        return [_notice(batch, now) for batch in self.unreported.values()]

    def overdue(self, now: float, limit_s: float) -> list[OpenBatch[RecordFuture]]:
        """Forget and return the batches unreported ``limit_s`` after they opened."""
        overdue = [b for b in self.unreported.values() if now - b.created > limit_s]
        for batch in overdue:
            self.seal_if_open(batch)
            self.unreported.pop(batch.batch_id, None)
        return overdue

    def release_open(self) -> None:
        """Drop the open batches' views of shared memory (the segment is about to be unmapped)."""
        for batch in self.open.values():
            batch.release()
        self.open.clear()

    def abandon(self) -> list[RecordFuture]:
        """Forget every batch, open and closed (their blocks are not this process's any more); returns the
        futures of their records, for the caller to fail."""
        futures = [f for batch in self.unreported.values() for f in batch.futures]
        self.release_open()
        self.unreported.clear()
        return futures


def _notice(batch: OpenBatch[RecordFuture], now: float) -> ipc.SealNotice:
    return ipc.SealNotice(batch.batch_id, batch.first_block, batch.block_count, batch.topic, batch.partition,
                          batch.record_count, batch.pos, batch.base_timestamp, batch.max_timestamp,
                          int((now - batch.created) * 1000))
