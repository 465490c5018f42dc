"""This process's share of the daemon's BufferPool: spare blocks at hand, and requests for more.

The daemon grants blocks of its shared-memory BufferPool; a client keeps a few
spare so that opening a batch needs no round trip, and asks for a run of
contiguous blocks for a record larger than one. It says in its segment's header
how many more spare blocks it would take now (``spare_wanted``), and the daemon
hands it that many, at most one a batch reported, with its delivery reports: at a
steady rate the blocks of the batches reported come back with their reports, and
the client asks for none. send() takes a spare block itself, in the fast path's
Appender, where take_spare() would ask for nothing and measure nothing (the
Appender's spare_policy(), which this side keeps up to date): take_spare() runs
when a request may be due, and once a _GRANT_HORIZON_S. Every method is called with
the producer's lock held; the waiting is the producer's.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from .contract import batch_slots, ipc
from .contract.batch_slots import ControlArea

# A grant is what this process used in the last _GRANT_HORIZON_S (at least _MIN_GRANT, at most
# 1/_MAX_GRANT_SHARE of the pool), and the next one is asked for when half is left. A spare block is
# memory that nobody else can use, and once written, shared memory that stays resident: no more than
# the process needs.
_MIN_GRANT = 4
_GRANT_HORIZON_S = 0.025
_MAX_GRANT_SHARE = 16

# The Appender's spare_policy(spare, floor, until_ns, wanted_base): the blocks send() took itself since the last call.
SparePolicy = Callable[[list[int] | None, int, int, int], int]


class BlockRequest:
    """A request for blocks the client waits on: a contiguous run for one large record."""

    __slots__ = ("request_id", "contiguous", "blocks", "error")

    def __init__(self, request_id: int, contiguous: bool) -> None:
        self.request_id = request_id
        self.contiguous = contiguous
        self.blocks: list[int] | None = None
        self.error: str | None = None


class BlockGrants:
    """Spare blocks and block requests of the current session (forget() when it is lost)."""

    def __init__(self, post: Callable[[ipc.Message], None]) -> None:
        self._post = post
        self.spare: list[int] = []
        self._requests: dict[int, BlockRequest] = {}
        self._next_request_id = 1
        # The first request of the current session: grants of requests before it are of a lost session.
        self._session_first_request = 1
        self._grant = _MIN_GRANT
        self._blocks_taken = 0  # since _rate_since
        self._rate_since = 0.0  # time.monotonic() when the rate's count began (0: not yet)
        self._spare_asked = 0  # blocks of the request for spare ones in flight (0: none is)
        # Requests for spare blocks the daemon could not grant in time (at once, for a timeout of 0).
        self.refusals = 0
        self.pool_blocks = 0  # the pool's size, once welcomed
        # The session's segment's control area, where ``spare_wanted`` is said (None between sessions).
        self._control: ControlArea | None = None
        # The Appender's spare_policy() in a session: when send() takes spare blocks itself.
        self._spare_policy: SparePolicy | None = None

    def attach(self, control: ControlArea, spare_policy: SparePolicy) -> None:
        """A new session, with its segment: say what spare blocks this client would take, and when the Appender's
        send() may take them itself (``spare_policy``)."""
        self._control = control
        self._spare_policy = spare_policy
        self._say_wanted()

    def take_spare(self, max_block_ms: int) -> int | None:
        """A spare block, if there is one; the next are asked for before they are needed."""
        if self._spare_policy is not None:
            # The blocks send() took itself count for the rate; it takes none until this is done.
            self._blocks_taken += self._spare_policy(None, 0, 0, 0)
        block = self.spare.pop() if self.spare else None
        if block is not None:
            self._blocks_taken += 1
        self._follow_rate(time.monotonic())
        self.top_up(max_block_ms)
        self._say_wanted()
        return block

    def _follow_rate(self, now: float) -> None:
        """A grant's worth follows what this process used lately: at least every _GRANT_HORIZON_S, to the blocks
        it took since (handed back with its reports, spare blocks need no request to come, so the next request
        cannot be where the rate is measured: after a burst, the grant would stay the burst's)."""
        if not self._rate_since:
            self._rate_since = now
            return
        elapsed = now - self._rate_since
        if elapsed < _GRANT_HORIZON_S:
            return
        rate = self._blocks_taken / elapsed
        # Never a large share of a small pool.
        most = max(1, (self.pool_blocks or _MIN_GRANT) // _MAX_GRANT_SHARE)
        self._grant = min(max(math.ceil(rate * _GRANT_HORIZON_S), _MIN_GRANT), most)
        self._blocks_taken = 0
        self._rate_since = now

    def top_up(self, max_block_ms: int) -> None:
        """Ask for spare blocks when half of a grant's worth is left (one request at a time: spare blocks are for
        the next few batches, not a hoard)."""
        if self._spare_asked or len(self.spare) > self._grant // 2:
            return
        self._spare_asked = self._grant
        self.request(self._grant, False, max_block_ms)
        self._say_wanted()

    def request(self, count: int, contiguous: bool, max_block_ms: int) -> BlockRequest:
        """Ask the daemon for ``count`` blocks, waiting up to ``max_block_ms`` there."""
        request = BlockRequest(self._next_request_id, contiguous)
        self._next_request_id += 1
        self._requests[request.request_id] = request
        self._post(ipc.Blocks(request.request_id, count, contiguous, max_block_ms))
        return request

    def finished(self, request: BlockRequest) -> bool:
        """The waiter has what it asked for, or gave up (a late grant then goes back); whether the request
        is still this session's (a lost session's blocks are not the client's any more)."""
        current = self._requests.get(request.request_id) is request
        if request.blocks is None and request.error is None:
            request.error = "abandoned"
        elif current:
            del self._requests[request.request_id]
        return current

    def granted(self, grant: ipc.Grant) -> None:
        """Blocks for a request: spare ones, or the run a waiter asked for."""
        if grant.request_id < self._session_first_request:
            return  # late, from a daemon that is gone: the blocks are not this session's to give back
        request = self._requests.get(grant.request_id)
        if request is None or (request.contiguous and request.error is not None):
            # Not asked for (by this session), or no longer wanted: they go back.
            self._requests.pop(grant.request_id, None)
            self._post(ipc.Release(grant.blocks))
        elif request.contiguous:
            request.blocks = grant.blocks
        else:
            del self._requests[grant.request_id]
            self._spare_asked = 0
            self.spare.extend(grant.blocks)
            self._say_wanted()

    def handed_back(self, blocks: list[int]) -> None:
        """Spare blocks the daemon sent with delivery reports (none are this session's between sessions: the
        blocks of one that is gone go back with it)."""
        if self._control is not None:
            self.spare.extend(blocks)
            self._say_wanted()

    def _say_wanted(self) -> None:
        """Say in the header how many more spare blocks this client would take now: a grant's worth, less what it
        has and has asked for; and let send() take spare blocks itself while take_spare() would do nothing more:
        no request to make (one is in flight, or more than half a grant's worth would be left) and within the
        horizon of the rate being measured."""
        control = self._control
        if control is not None:
            # What is asked for may be more than a grant's worth now (the rate fell since): nothing more is wanted.
            base = max(self._grant - self._spare_asked, 0)
            wanted = max(base - len(self.spare), 0)
            if control.header(batch_slots.SPARE_WANTED) != wanted:
                control.set_header(batch_slots.SPARE_WANTED, wanted)
            floor = 1 if self._spare_asked else self._grant // 2 + 2
            until_ns = int((self._rate_since + _GRANT_HORIZON_S) * 1e9) if self._rate_since else 0
            assert self._spare_policy is not None, "attach() gives both"
            self._blocks_taken += self._spare_policy(self.spare, floor, until_ns, base)

    def refused(self, failed: ipc.GrantFailed) -> None:
        """The daemon could not grant a request in time, or refused it."""
        request = self._requests.get(failed.request_id)
        if request is not None and request.contiguous and request.error is None:
            request.error = failed.reason  # the waiting send() raises it
        elif request is not None:
            del self._requests[failed.request_id]
            if not request.contiguous:
                self._spare_asked = 0
                self.refusals += 1
                self._say_wanted()

    def give_back_spare(self) -> None:
        """The pool is exhausted (SEAL_NOW): spare blocks go back to the daemon."""
        if self.spare:
            self._post(ipc.Release(self.spare))
            self.spare = []
            self._say_wanted()  # the daemon hands back none while the pool is short

    def forget(self) -> None:
        """The session is gone: its blocks and requests with it."""
        self.spare.clear()
        self._requests.clear()
        self._spare_asked = 0
        self._session_first_request = self._next_request_id
        control, self._control = self._control, None
        if self._spare_policy is not None:
            # The blocks send() took count for the rate, as take_spare()'s do.
            self._blocks_taken += self._spare_policy(None, 0, 0, 0)
            self._spare_policy = None
        if control is not None:
            # A segment taken back by the next session must not say what this one wanted.
            with contextlib.suppress(ValueError):  # the segment was let go of already
                control.set_header(batch_slots.SPARE_WANTED, 0)
