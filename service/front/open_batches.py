"""OpenBatches: the batches clients have open in their segments, watched, and claimed when they are ready.

A client appends records to the open batch of a partition and publishes what it wrote in its segment's control
area (:mod:`client_stub.contract.batch_slots`); the daemon lingers and seals. It claims a batch when it is
ready, as the Java producer's ``RecordAccumulator.ready()`` finds a batch sendable: linger.ms (the client's)
after the batch opened, published full (the block is, or the client flushes or ends), the pool exhausted,
the client's session over (whatever its process published is delivered, dead or alive). Once it claims a
batch due of a client lingering the daemon's linger.ms at least, it claims with it every open batch of every
client watched that is due within the next linger.ms (the daemon's), as the Java producer's ``drain()`` takes
a batch of every partition of a node once one is sendable: the batches of a linger.ms go in one turn of the
daemon's loop, in one produce request per broker, and usually one DELIVERY a process. At most once a
linger.ms, and never for a client that lingers less (``linger_ms=0`` asks for its own batches to go at once,
not everyone's).

The daemon looks at the open batches of each client it watches at least every ``scan_interval_ms`` (its
linger.ms) or the client's linger.ms if shorter, sooner while it finds full ones or a batch is due, and
writes in each watched client's segment until when it will, and how often:
a client that opens a batch it would see in time tells it nothing. A client is watched from its WAKEUP, for as
long as it has open batches and :data:`WATCH_MS` after; then its header says the watch is over, and its next
batch comes with a WAKEUP.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from client_stub.contract import batch_slots

from ..buffer_pool import BufferPool
from ..fastpath import MAX_LINGER_MS
from .seals import Seals
from .sessions import ClientSession, SessionTable

# How long a client stays watched once it has no open batch.
WATCH_MS = 1000


class Look(NamedTuple):
    """What a look at a client's open batches found."""

    still_open: bool  # some are left open
    found_full: bool  # some were claimed full
    next_due: int | None  # when the first of those left open is due
    found_due: bool  # some with records were claimed because linger.ms passed (not full, not claimed early)


class OpenBatches:
    """The clients watched, and the claims of their batches."""

    def __init__(self, pool: BufferPool, sessions: SessionTable, seals: Seals, linger_ms: int) -> None:
        self.pool = pool
        self.sessions = sessions
        self.seals = seals
        self.linger_ms: int
        self.scan_interval_ms: int
        self.use_linger(linger_ms)
        # When the batches due within linger.ms were last claimed together.
        self._drained_ms: int | None = None
        # Once the daemon reads nothing more of its clients (it is closing): what they publish stays theirs.
        self._stopped = False
        # Each client watched, and until when (ms, the front's clock).
        self._watched: dict[ClientSession, int] = {}
        # When to look next at each client watched, and the earliest of those.
        self._next_look: dict[ClientSession, int] = {}
        self._earliest_look_ms = 0
        # The clients that said WAKEUP (or BLOCKS) since the last scan.
        self._woken: set[ClientSession] = set()
        # By client, the batches claimed and not handed over yet.
        self._claims: dict[ClientSession, deque[tuple[int, ...]]] = {}

    def use_linger(self, linger_ms: int) -> None:
        """The daemon's linger.ms: how often it looks at a client it watches at least, and how early a batch is
        claimed with one that is due."""
        # A linger.ms is a day at most, as claim_ready() takes the clients' and the window it claims early in.
        self.linger_ms = min(linger_ms, MAX_LINGER_MS)
        self.scan_interval_ms = max(self.linger_ms, 1)

    def stop(self) -> None:
        """Claim nothing more: the producer is closing and would fail what it is handed, which the clients keep for
        the next daemon instead."""
        self._stopped = True

    def wakeup(self, session: ClientSession, now: int) -> None:
        """The client asks to be looked at now (WAKEUP; BLOCKS too, which often follows a full batch): it is, once
        this turn of the loop has read the clients' messages (however many it sent)."""
        self._watched[session] = now + WATCH_MS
        self._woken.add(session)

    def attached(self, session: ClientSession) -> None:
        """The session has its segment: its header says it is not watched (one taken back says what the daemon
        that had it last wrote, which is not looking)."""
        self._tell_watch(session)

    def scan(self, now: int) -> None:
        """Claim the batches that are ready of the clients woken, and of every client watched that is due a look
        (after each poll); once one is claimed due of a client lingering the daemon's linger.ms at least, those
        due within the next linger.ms of every client watched with it."""
        woken, self._woken = self._woken, set()
        if self._stopped or (not woken and (not self._watched or now < self._earliest_look_ms)):
            return
        looks: dict[ClientSession, Look] = {}
        for session in list(self._watched):
            if session in woken or now >= self._next_look.get(session, now):
                look = self._look(session, now, 0)
                if look is not None:
                    looks[session] = look
        if self._drains(looks, now):
            # As the Java producer's drain() takes every partition's batch of a node once one is sendable: one
            # turn, one produce request a broker and one DELIVERY a process for the batches of a linger.ms, not
            # one each. The batches of every broker: once claimed together they open together, each near its
            # linger.ms.
            self._drained_ms = now
            for session in list(self._watched):
                look = self._look(session, now, self.linger_ms)
                if look is not None:
                    earlier = looks.get(session)
                    looks[session] = look if earlier is None else look._replace(
                        found_full=look.found_full or earlier.found_full)
        for session, look in looks.items():
            if not self.sessions.is_live(session):
                continue  # ended by a reply it did not take, as its batches were claimed: forgotten already
            if look.still_open:
                self._watched[session] = now + WATCH_MS
            elif now >= self._watched[session]:
                self._unwatch(session)  # its header says so: its next batch comes with a WAKEUP
                self._tell_watch(session)
                continue
            # A client that fills blocks fills more: look again at the next turn.
            look_ms = now + (1 if look.found_full else self._interval_ms(session))
            self._next_look[session] = look_ms if look.next_due is None else min(look_ms, look.next_due)
            self._tell_watch(session)
        self._earliest_look_ms = min(self._next_look.values(), default=0)

    def claim_all(self, session: ClientSession, now: int) -> None:
        """Claim every batch the client has published records in (its session ends, or the pool is exhausted)."""
        if not self._stopped:
            self._scan(session, now, claim_all=True)

    def forget(self, session: ClientSession) -> None:
        """The session is over: it is watched no more."""
        self._unwatch(session)
        self._woken.discard(session)
        self._claims.pop(session, None)

    def due_in_ms(self, now: int) -> list[int]:
        """When the loop must next look at the open batches."""
        if self._woken:
            return [0]
        if not self._watched:
            return []
        return [self._earliest_look_ms - now]

    def _unwatch(self, session: ClientSession) -> None:
        self._watched.pop(session, None)
        self._next_look.pop(session, None)

    def _drains(self, looks: dict[ClientSession, Look], now: int) -> bool:
        """Whether the looks claimed a batch that lingered the daemon's linger.ms at least (a client that lingers
        less asks for its own batches to go sooner, not everyone's), a linger.ms after the last drain at least."""
        if not self.linger_ms or (self._drained_ms is not None and now - self._drained_ms < self.linger_ms):
            return False
        return any(look.found_due and self._client_linger_ms(session) >= self.linger_ms
                   for session, look in looks.items())

    def _interval_ms(self, session: ClientSession) -> int:
        """How often the daemon looks at a client's open batches: every linger.ms of its own, or of the client's
        if shorter (whose batches would otherwise each come with a WAKEUP). A client that lingers less than a
        millisecond says WAKEUP for each batch whatever the daemon does."""
        linger_ms = self._client_linger_ms(session)
        return linger_ms if 0 < linger_ms < self.scan_interval_ms else self.scan_interval_ms

    def _client_linger_ms(self, session: ClientSession) -> int:
        """The linger.ms the client's header says, a day at most (0 without a segment)."""
        control = self.pool.control(session.client_id)
        return 0 if control is None else min(control.header(batch_slots.LINGER_NS) // 1_000_000, MAX_LINGER_MS)

    def _look(self, session: ClientSession, now: int, early_ms: int) -> Look | None:
        """Claim the batches of a client watched that are ready or due within ``early_ms`` (:meth:`_scan`); None if
        it is not live and attached any more (it is watched no more)."""
        if not self.sessions.is_live(session) or not session.attached:
            self._unwatch(session)
            return None
        return self._scan(session, now, claim_all=False, early_ms=early_ms)

    def _scan(self, session: ClientSession, now: int, *, claim_all: bool, early_ms: int = 0) -> Look:
        """Claim the client's batches that are ready or due within ``early_ms`` (all that hold records, with
        ``claim_all``) and hand them over."""
        claimed, next_due, still_open, found_full, found_due = self.pool.claim_ready(session.client_id, now, claim_all,
                                                                                      early_ms)
        # A batch refused may end the session (a reply it does not take), which claims and hands over what is left
        # of the client's batches before its blocks go back: those claimed here first, in the same order.
        claims = self._claims.setdefault(session, deque())
        claims.extend(claimed)
        while claims and self.sessions.is_live(session):
            self.seals.claim(session, claims.popleft(), now)
        return Look(still_open, found_full, next_due, found_due)

    def _tell_watch(self, session: ClientSession) -> None:
        """Write in the client's header until when it is watched, and how often."""
        control = self.pool.control(session.client_id)
        if control is not None and self.sessions.is_live(session):
            control.set_header(batch_slots.WATCHED_UNTIL_NS, self._watched.get(session, 0) * 1_000_000)
            control.set_header(batch_slots.SCAN_INTERVAL_NS, self._interval_ms(session) * 1_000_000)
