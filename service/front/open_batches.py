"""OpenBatches: the batches clients have open in their segments, watched, and claimed when they are ready.

A client appends records to the open batch of a partition and publishes what it wrote in its segment's control
area (:mod:`client_stub.contract.batch_slots`); the daemon lingers and seals. It claims a batch when it is
ready, as the Java producer's ``RecordAccumulator.ready()`` finds a batch sendable: linger.ms (the client's)
after the batch opened, published full (the block is, or the client flushes or ends), the pool exhausted,
the client's session over (whatever its process published is delivered, dead or alive).

The daemon looks at the open batches of the clients it watches at least every ``scan_interval_ms`` (its
linger.ms), sooner while it finds full ones, and writes in each watched client's segment until when it will:
a client that opens a batch it would see in time tells it nothing. A client is watched from its WAKEUP, for as
long as it has open batches and :data:`WATCH_MS` after; then its header says the watch is over, and its next
batch comes with a WAKEUP.
"""

from __future__ import annotations

from collections import deque

from client_stub.contract import batch_slots

from ..buffer_pool import BufferPool
from .seals import Seals
from .sessions import ClientSession, SessionTable

# How long a client stays watched once it has no open batch.
WATCH_MS = 1000


class OpenBatches:
    """The clients watched, and the claims of their batches."""

    def __init__(self, pool: BufferPool, sessions: SessionTable, seals: Seals, scan_interval_ms: int) -> None:
        self.pool = pool
        self.sessions = sessions
        self.seals = seals
        self.scan_interval_ms = max(scan_interval_ms, 1)
        # Each client watched, and until when (ms, the front's clock).
        self._watched: dict[ClientSession, int] = {}
        self._next_scan_ms = 0
        # The earliest linger deadline of the batches seen open.
        self._next_due_ms: int | None = None
        # The clients that said WAKEUP (or BLOCKS) since the last scan.
        self._woken: set[ClientSession] = set()
        # By client, the batches claimed and not handed over yet.
        self._claims: dict[ClientSession, deque[tuple[int, ...]]] = {}

    def wakeup(self, session: ClientSession, now: int) -> None:
        """The client asks to be looked at now (WAKEUP; BLOCKS too, which often follows a full batch): it is, once
        this turn of the loop has read the clients' messages (however many it sent)."""
        if not self._watched:
            # The first client watched, looked at now: the next look is a scan interval away, not due at once.
            self._next_scan_ms = now + self.scan_interval_ms
        self._watched[session] = now + WATCH_MS
        self._woken.add(session)

    def attached(self, session: ClientSession) -> None:
        """The session has its segment: its header says it is not watched (one taken back says what the daemon
        that had it last wrote, which is not looking)."""
        self._tell_watch(session)

    def scan(self, now: int) -> None:
        """Claim the batches that are ready of the clients woken, and of every client watched if it is time to look
        (after each poll)."""
        woken, self._woken = self._woken, set()
        if not self._watched or (now < self._next_scan_ms and (self._next_due_ms is None or now < self._next_due_ms)):
            for session in woken:
                if self.sessions.is_live(session) and session.attached and session in self._watched:
                    self._scan(session, now, claim_all=False)
                    if self.sessions.is_live(session):
                        self._tell_watch(session)
            return
        self._next_due_ms = None
        found_full = False
        for session in list(self._watched):
            if not self.sessions.is_live(session) or not session.attached:
                del self._watched[session]
                continue
            still_open, claimed_full = self._scan(session, now, claim_all=False)
            found_full |= claimed_full
            if not self.sessions.is_live(session):
                continue  # ended by a reply it did not take, as its batches were claimed: forgotten already
            if still_open:
                self._watched[session] = now + WATCH_MS
            elif now >= self._watched[session]:
                del self._watched[session]  # its header says so: its next batch comes with a WAKEUP
            self._tell_watch(session)
        # A client that fills blocks fills more: look again at the next turn.
        self._next_scan_ms = now + (1 if found_full else self.scan_interval_ms)

    def claim_all(self, session: ClientSession, now: int) -> None:
        """Claim every batch the client has published records in (its session ends, or the pool is exhausted)."""
        self._scan(session, now, claim_all=True)

    def forget(self, session: ClientSession) -> None:
        """The session is over: it is watched no more."""
        self._watched.pop(session, None)
        self._woken.discard(session)
        self._claims.pop(session, None)

    def due_in_ms(self, now: int) -> list[int]:
        """When the loop must next look at the open batches."""
        if self._woken:
            return [0]
        if not self._watched:
            return []
        due = self._next_scan_ms if self._next_due_ms is None else min(self._next_scan_ms, self._next_due_ms)
        return [due - now]

    def _scan(self, session: ClientSession, now: int, *, claim_all: bool) -> tuple[bool, bool]:
        """Claim the client's batches that are ready (all that hold records, with ``claim_all``) and hand them over;
        whether some stay open, and whether some were full."""
        claimed, next_due, still_open, found_full = self.pool.claim_ready(session.client_id, now, claim_all)
        if next_due is not None:
            self._next_due_ms = next_due if self._next_due_ms is None else min(self._next_due_ms, next_due)
        # A batch refused may end the session (a reply it does not take), which claims and hands over what is left
        # of the client's batches before its blocks go back: those claimed here first, in the same order.
        claims = self._claims.setdefault(session, deque())
        claims.extend(claimed)
        while claims and self.sessions.is_live(session):
            self.seals.claim(session, claims.popleft(), now)
        return still_open, found_full

    def _tell_watch(self, session: ClientSession) -> None:
        """Write in the client's header until when it is watched, and how often."""
        control = self.pool.control(session.client_id)
        if control is not None and self.sessions.is_live(session):
            control.set_header(batch_slots.WATCHED_UNTIL_NS, self._watched.get(session, 0) * 1_000_000)
            control.set_header(batch_slots.SCAN_INTERVAL_NS, self.scan_interval_ms * 1_000_000)
