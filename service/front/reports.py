"""DeliveryReports: each batch's outcome, back to the session that sealed it.

A batch finished (acknowledged, failed for good, expired) is reported to its client's
session, live or kept; a session's reports go out together, in DELIVERY messages of at
most 256 reports, at most once every REPORT_INTERVAL_MS: a client is woken once for all
the reports of that while, not for each produce response. A process that waits on none of
its reports (no callback to run, no future waited on, no flush: its segment's header says
so) gets them at most once every IDLE_REPORT_INTERVAL_MS, or once 256 wait. With the
reports go the spare blocks the client's segment says it would take, at most one a batch
reported: a client sending at a steady rate gets the blocks it needs without asking for
them. The records each process had delivered and failed are counted for its metrics.
"""

from __future__ import annotations

from client_stub.contract import batch_slots, ipc

from ..buffer_pool import BufferPool
from ..producer.batch import ProducerBatch
from .replies import Replies
from .sessions import ClientSession, SessionTable

# Reports in one DELIVERY: what a client can make grow in a reply (every other reply is a few dozen bytes, or a
# TOPIC's few KB).
REPORTS_PER_DELIVERY = 256
# The shortest time between two DELIVERY messages to a session: the first reports after a quiet while go at once.
REPORT_INTERVAL_MS = 2
# The same for a process that waits on none of its reports: what they settle then is the client's memory of its
# records in flight (their futures), at most a second's worth.
IDLE_REPORT_INTERVAL_MS = 1000


class DeliveryReports:
    """The reports waiting for each session, and the records of each process reported so far."""

    def __init__(self, sessions: SessionTable, replies: Replies, pool: BufferPool) -> None:
        self.sessions = sessions
        self.replies = replies
        self.pool = pool
        # Every report goes at REPORT_INTERVAL_MS (the daemon is shutting down: its clients wait on them all).
        self.hurry = False
        # Records reported delivered and failed, and DELIVERY messages sent, by process, for as long as it has a
        # session (kept ones included: a process's counts only grow).
        self._by_process: dict[int, list[int]] = {}

    def batch_done(self, batch: ProducerBatch) -> None:
        """A batch's outcome is final (its ``on_complete``): report it to its session."""
        client_id, batch_id = batch.origin
        session = self.sessions.owner(client_id)
        if session is None:
            return  # the client is gone; its records were still delivered (or failed) for it
        self._by_process.setdefault(session.pid, [0, 0, 0])[batch.error is not None] += batch.record_count
        left = session.unreported.pop(batch_id, 0) - batch.record_count
        if left > 0:
            session.unreported[batch_id] = left  # a part of a batch that was split
        session.reports.append(ipc.DeliveryReport(batch_id, batch.origin_index, batch.record_count, batch.base_offset,
                                                  batch.log_append_time_ms, ipc.error_to_wire(batch.error)))

    def send(self, session: ClientSession, now: int) -> None:
        """Send the session the reports waiting for it, unless it had some less than REPORT_INTERVAL_MS ago (or
        IDLE_REPORT_INTERVAL_MS, for a process that waits on none)."""
        if session.reports and now - session.reported_ms >= self._interval_ms(session):
            self.send_now(session, now)

    def send_now(self, session: ClientSession, now: int) -> None:
        """Send the session the reports waiting for it now: before it is granted blocks, which may be those of the
        batches they report (a client must know a batch finished before it writes into its blocks again). The last
        DELIVERY hands it the spare blocks its segment says it would take, at most one a batch reported."""
        reports = session.reports
        if not reports:
            return
        session.reports = []
        session.reported_ms = now
        for start in range(0, len(reports), REPORTS_PER_DELIVERY):
            spare = self._spare(session, len(reports)) if start + REPORTS_PER_DELIVERY >= len(reports) else []
            self.replies.send(session, ipc.Delivery(reports[start:start + REPORTS_PER_DELIVERY], spare))
        self._by_process.setdefault(session.pid, [0, 0, 0])[2] += -(-len(reports) // REPORTS_PER_DELIVERY)

    def _spare(self, session: ClientSession, batches: int) -> list[int]:
        """Spare blocks for the session with the reports of ``batches`` batches: what it says it would take, at
        most one a batch (none once the daemon is shutting down)."""
        control = self.pool.control(session.client_id)
        if self.hurry or control is None or not session.attached:
            return []
        return self.pool.hand_back(session.client_id, min(control.header(batch_slots.SPARE_WANTED), batches))

    def due_in_ms(self, now: int) -> list[int]:
        """When the reports held back are due."""
        return [session.reported_ms + self._interval_ms(session) - now for session in self.sessions if session.reports]

    def _interval_ms(self, session: ClientSession) -> int:
        """The shortest time between two DELIVERY messages to the session now."""
        if self.hurry or len(session.reports) >= REPORTS_PER_DELIVERY:
            return REPORT_INTERVAL_MS
        control = self.pool.control(session.client_id)
        if control is None or control.header(batch_slots.REPORTS_WANTED):
            return REPORT_INTERVAL_MS
        return IDLE_REPORT_INTERVAL_MS

    def records_of(self, pid: int) -> tuple[int, int]:
        """The records of a process reported delivered, and failed."""
        delivered, failed, _ = self._by_process.get(pid, (0, 0, 0))
        return delivered, failed

    def messages_to(self, pid: int) -> int:
        """The DELIVERY messages sent to a process: each wakes its producer's I/O thread."""
        return self._by_process.get(pid, (0, 0, 0))[2]

    def forget_process(self, pid: int) -> None:
        """Forget the records of a process with no session left (its pid may be another's next)."""
        self._by_process.pop(pid, None)
