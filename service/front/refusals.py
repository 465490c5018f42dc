"""Refusals: what the daemon refused of its clients, counted and logged at most every few seconds."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

# Errors caused by clients are logged at most this often (a flood must not flood the log).
_LOG_INTERVAL_S = 5.0


class Refusals:
    """Counts each refusal; logs one now and then, with the count so far."""

    def __init__(self) -> None:
        self.messages_refused = 0
        self._logged = float("-inf")

    def count(self, reason: str) -> None:
        """One more refusal, for ``reason``."""
        self.messages_refused += 1
        now = time.monotonic()
        if now - self._logged >= _LOG_INTERVAL_S:
            self._logged = now
            log.warning("refused a client message (%d so far): %s", self.messages_refused, reason)
