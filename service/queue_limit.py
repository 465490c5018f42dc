"""QueueLimit: how many blocks of the pool may be sealed and not finished (sidecar.buffer.queue.ms).

While batches flow, the pool limits the blocks sealed and not finished (queued in the daemon or in
flight) to what the daemon finishes in ``queue_ms``, never below a floor of two requests' worth: past
that no block is granted until some come back, so a producer faster than the brokers waits in send()
rather than its records waiting in the pool (at full speed a full pool is buffer.memory of records
ahead of each new one). When nothing finishes (a broker away), the whole pool buffers, as Java's.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil

# How often the limit follows the rate at which sealed blocks finish; how much the last interval's rate weighs
# in the smoothed one.
QUEUE_INTERVAL_MS = 100
_RATE_WEIGHT = 0.3


class QueueLimit:
    """The blocks sealed and not finished, counted as they change, and the limit that follows the rate at which
    they finish."""

    def __init__(self, block_count: int) -> None:
        self._block_count = block_count
        self._queue_ms = 0
        self._floor = block_count
        # The limit, in blocks: the whole pool until batches flow under a queue time.
        self.blocks = block_count
        self._sealed = 0
        self._finished_total = 0
        self._finished_before = 0
        self._rate_per_ms: float | None = None
        self._checked_ms: int | None = None

    @property
    def full(self) -> bool:
        """As many blocks are sealed and not finished as the limit allows."""
        return bool(self._queue_ms) and self._sealed >= self.blocks

    def limit(self, queue_ms: int, floor_blocks: int) -> None:
        """Limit the blocks sealed and not finished to what finishes in ``queue_ms`` (0: no limit), and at least
        ``floor_blocks``."""
        self._queue_ms = queue_ms
        self._floor = min(max(floor_blocks, 1), self._block_count)
        if not queue_ms:
            self.blocks = self._block_count

    def sealed(self, count: int) -> None:
        """``count`` blocks were sealed."""
        self._sealed += count

    def unsealed(self, count: int) -> None:
        """``count`` blocks sealed are the client's unsealed again, unsent: not finished."""
        self._sealed -= count

    def finished(self, count: int) -> None:
        """``count`` sealed blocks came back to the pool."""
        self._sealed -= count
        self._finished_total += count

    def follow(self, now_ms: int, count_sealed: Callable[[], int]) -> None:
        """Once every QUEUE_INTERVAL_MS: set the limit from the rate at which sealed blocks finish, and take the
        count of blocks sealed and not finished afresh from ``count_sealed``."""
        if not self._queue_ms:
            return
        if self._checked_ms is None:
            self._checked_ms = now_ms
            return
        elapsed = now_ms - self._checked_ms
        if elapsed < QUEUE_INTERVAL_MS:
            return
        self._checked_ms = now_ms
        finished = self._finished_total - self._finished_before
        self._finished_before = self._finished_total
        self._sealed = count_sealed()
        if not finished:
            # Nothing finishes: the brokers are away or nothing is sent. The pool buffers whole, as Java's.
            self._rate_per_ms = None
            self.blocks = self._block_count
            return
        rate = finished / elapsed
        self._rate_per_ms = rate if self._rate_per_ms is None else \
            _RATE_WEIGHT * rate + (1 - _RATE_WEIGHT) * self._rate_per_ms
        self.blocks = min(max(self._floor, ceil(self._rate_per_ms * self._queue_ms)), self._block_count)
