"""Grants: the clients' requests for blocks of the BufferPool, and the blocks they give back.

A request the pool cannot serve at once waits in its FIFO until blocks come back or its
timeout (the client's max_block_ms, capped) passes; while anyone waits for the pool, the
batches every client published are claimed and each is asked to give back its spare blocks
(SEAL_NOW), and so are those of every client of a process at its limit.
"""

from __future__ import annotations

from collections.abc import Callable

from client_stub.contract import ipc

from ..buffer_pool import BufferPool
from ..client_error import ClientError
from .checks import check_block_list, check_int, clip
from .replies import Replies
from .reports import DeliveryReports
from .sessions import ClientSession, SessionTable

# A client asks for at most this long for blocks (its max_block_ms is capped by it).
MAX_BLOCK_WAIT_MS = 3_600_000
# How often to repeat SEAL_NOW while the pool stays exhausted.
SEAL_NOW_INTERVAL_MS = 50


class Grants:
    """Blocks granted to the clients, now or when the pool has them."""

    def __init__(self, pool: BufferPool, sessions: SessionTable, replies: Replies,
                 claim_all: Callable[[ClientSession, int], None], reports: DeliveryReports) -> None:
        """``claim_all`` claims every batch a client published."""
        self.pool = pool
        self.sessions = sessions
        self.replies = replies
        self.reports = reports
        self._claim_all = claim_all
        self._seal_now_sent_ms = 0
        # Why no more blocks are granted (the daemon is shutting down), once none are.
        self.refusing: str | None = None
        # BLOCKS requests by process, for as long as it has a session (kept ones included: a count only grows).
        self._requests_by_process: dict[int, int] = {}

    def request(self, session: ClientSession, message: ipc.Blocks, now: int) -> None:
        """A BLOCKS request: granted now, or waiting in the pool's FIFO."""
        request_id = message.request_id
        check_int(request_id, "request_id")
        self._requests_by_process[session.pid] = self._requests_by_process.get(session.pid, 0) + 1
        if self.refusing is not None:
            self.replies.send(session, ipc.GrantFailed(request_id, self.refusing))
            return
        try:
            check_int(message.count, "count", 1, self.pool.block_count)
            check_int(message.timeout_ms, "timeout_ms", 0, 2**62)
            blocks = self.pool.request(session.client_id, request_id, message.count, bool(message.contiguous),
                                       now + min(message.timeout_ms, MAX_BLOCK_WAIT_MS))
        except ClientError as exc:
            # The client waits for an answer to this request: it fails now rather than at its timeout.
            exc.answer = ipc.GrantFailed(request_id, clip(f"the daemon refused the request: {exc}"))
            raise
        if blocks is not None:
            self._grant(session, ipc.Grant(request_id, blocks), now)

    def requests_of(self, pid: int) -> int:
        """The BLOCKS requests a process made: each a round trip that a send() may wait on."""
        return self._requests_by_process.get(pid, 0)

    def forget_process(self, pid: int) -> None:
        """Forget the requests of a process with no session left (its pid may be another's next)."""
        self._requests_by_process.pop(pid, None)

    def release(self, session: ClientSession, message: ipc.Release) -> None:
        """RELEASE: blocks granted and not used go back to the pool."""
        self.pool.give_back(session.client_id, check_block_list(message.blocks, "RELEASE"))

    def serve(self, now: int) -> None:
        """Fail the requests whose time is up, grant those the pool can serve now, and while requests wait for
        the pool, claim what the clients published and ask them for their spare blocks."""
        # Expiries first: an expired request at the head of the FIFO must not hold back those behind it.
        for waiter in self.pool.expire_waiters(now):
            self._answer(waiter.client_id, ipc.GrantFailed(waiter.request_id,
                                                           f"no {waiter.count} free block(s) of the BufferPool in "
                                                           "time"))
        for waiter, blocks in self.pool.serve_waiters():
            session = self.sessions.owner(waiter.client_id)
            if session is not None:  # None if its session ended in this turn of the loop: its blocks went with it
                self._grant(session, ipc.Grant(waiter.request_id, blocks), now)
        if self.pool.waiters and now - self._seal_now_sent_ms >= SEAL_NOW_INTERVAL_MS:
            self._seal_now_sent_ms = now
            # Everyone holds what the pool lacks; a client at its process's limit waits only for the blocks of
            # its process, which any client of it may hold. When the queue is what is full, the blocks that come
            # back are the sealed ones, as they are sent.
            exhausted = self.pool.exhausted and not self.pool.queue_full
            at_limit = self.pool.clients_at_limit()
            for session in list(self.sessions):
                if exhausted or session.client_id in at_limit:
                    self._claim_all(session, now)
                    if self.sessions.is_live(session):
                        self.replies.send(session, ipc.SealNow())

    def refuse_all(self, reason: str) -> None:
        """Grant no more blocks: the requests waiting fail now, those to come at once."""
        self.refusing = reason
        for waiter in self.pool.expire_waiters(2**63 - 1):
            self._answer(waiter.client_id, ipc.GrantFailed(waiter.request_id, reason))

    def due_in_ms(self, now: int) -> list[int]:
        """When the requests waiting next need the loop: their deadlines, and the next SEAL_NOW."""
        if not self.pool.waiters:
            return []
        return [SEAL_NOW_INTERVAL_MS, *(waiter.deadline_ms - now for waiter in self.pool.waiters)]

    def _grant(self, session: ClientSession, grant: ipc.Grant, now: int) -> None:
        """Grant blocks, after the reports held for the client: they may be the blocks of the batches reported."""
        self.reports.send_now(session, now)
        self.replies.send(session, grant)

    def _answer(self, client_id: int, message: ipc.Message) -> None:
        session = self.sessions.owner(client_id)
        if session is not None:
            self.replies.send(session, message)
