"""What the daemon tells systemd when it runs as a Type=notify service (sd_notify(3)).

READY=1 once it serves (its endpoint bound, the cluster's first metadata in), WATCHDOG=1
from its event loop at half the unit's WatchdogSec (so that systemd restarts a loop
that hangs), STATUS= with its clients and records a second, STOPPING=1 when it shuts
down. Without $NOTIFY_SOCKET (not under systemd) it says nothing. The notification
protocol is sdnotify's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import sdnotify

# How often STATUS= is refreshed.
STATUS_INTERVAL_S = 5.0


class ServiceManager:
    """The daemon's side of systemd's notification socket."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self.clock = clock
        self.ready = False
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        # systemd sets WATCHDOG_USEC (and WATCHDOG_PID, the process it watches) for a unit with WatchdogSec=.
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        watched = os.environ.get("WATCHDOG_PID", str(os.getpid())) == str(os.getpid())
        self.watchdog_interval_s = usec / 2e6 if self.enabled and usec > 0 and watched else None
        self._next_watchdog = 0.0
        self._next_status = 0.0
        self._records = 0
        self._records_at = clock()

    def tick(self, serving: bool, clients: int, records_sent: int) -> None:
        """Called once a loop iteration: READY=1 when first ``serving``, then the watchdog and the status."""
        if not self.enabled:
            return
        now = self.clock()
        lines = []
        if serving and not self.ready:
            self.ready = True
            lines.append("READY=1")
        if self.watchdog_interval_s is not None and now >= self._next_watchdog:
            self._next_watchdog = now + self.watchdog_interval_s
            lines.append("WATCHDOG=1")
        if self.ready and now >= self._next_status:
            rate = (records_sent - self._records) / max(now - self._records_at, 1e-9)
            self._records, self._records_at = records_sent, now
            self._next_status = now + STATUS_INTERVAL_S
            lines.append(f"STATUS={clients} clients, {rate:.0f} records/s")
        if lines:
            self._send("\n".join(lines))

    def next_timer_s(self) -> float | None:
        """How long the loop may sleep before the next watchdog is due (None: no watchdog)."""
        if self.watchdog_interval_s is None:
            return None
        return max(self._next_watchdog - self.clock(), 0.0)

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def _send(self, state: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(state)
