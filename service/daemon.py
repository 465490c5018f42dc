"""SidecarDaemon: the sender daemon's one event loop.

One thread polls the brokers' sockets and the ZeroMQ socket together
(ProducerCore's selector waits on both), hands sealed batches from the front to
the accumulator, lets the sender drain and send, and sends the outcomes back.
"""

from __future__ import annotations

import gc
import logging
import resource
import signal
import threading
import time
from types import FrameType

from .buffer_pool import BufferPool, client_block_limit
from .config import ProducerConfig
from .front import SidecarFront
from .producer.core import ProducerCore
from .service_manager import ServiceManager

log = logging.getLogger(__name__)

# The loop wakes at least this often even when nothing happens (timers are checked then).
_MAX_SLEEP_MS = 1000
# An error that recurs at every iteration is logged with its traceback at most this often.
_ERROR_LOG_INTERVAL_S = 5.0


class SidecarDaemon:
    """Owns the BufferPool, the ProducerCore and the front; :meth:`run` until stopped."""

    def __init__(self, config: ProducerConfig, endpoint: str) -> None:
        _raise_file_limit()
        self.config = config
        self.endpoint = endpoint
        self.core = ProducerCore(config)
        memory, block_size = config["buffer.memory"], config["batch.size"]
        mode, group = config["sidecar.socket.mode"], config["sidecar.socket.group"]
        self.pool = BufferPool(memory, block_size, max_blocks_per_process=client_block_limit(
            memory, block_size, config["max.request.size"]))
        try:
            self.front = SidecarFront(self.core, self.pool, endpoint,
                                      client_timeout_ms=config["sidecar.client.timeout.ms"],
                                      reply_buffer_bytes=config["sidecar.client.reply.buffer.bytes"], socket_mode=mode,
                                      socket_group=group)
        except BaseException:
            self.pool.close()
            raise
        self._stop = threading.Event()
        self.service_manager = ServiceManager()
        self.iteration_errors = 0
        self._error_logged = float("-inf")

    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self) -> None:
        """Serve until :meth:`stop`, then deliver what is queued within close.timeout.ms and exit; raise what
        broke the loop, if anything did."""
        log.info("kafka-sidecar serving %s for %s (BufferPool: %d blocks of %d bytes, at most %d per process)",
                 self.endpoint, ",".join(self.config["bootstrap.servers"]), self.pool.block_count,
                 self.pool.block_size, self.pool.max_blocks_per_process)
        # The loop makes short-lived objects by the thousand (batches, requests, reports) and
        # keeps few: a full collection over everything alive would stall every client's
        # deliveries. Start-up objects are frozen out of the collections; young ones are
        # collected less often.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        try:
            while not self._stop.is_set():
                self.run_once()
        except BaseException:
            # The loop itself is broken (what one client or one batch causes is caught inside it): exit
            # at once, without sending or failing anything. Each client sees the daemon go and hands what it
            # held to the next one (systemd restarts it), where a drain through a broken loop could fail
            # records that the next daemon would have delivered.
            log.critical("the event loop failed: exiting without a drain, the clients keep what they "
                         "handed off for the next daemon", exc_info=True)
            raise
        self.shutdown()

    def run_once(self) -> None:
        """One iteration: network I/O and sending, client messages, then timers and reports."""
        timeout_ms = min(self.front.next_timer_ms(), _MAX_SLEEP_MS)
        watchdog_s = self.service_manager.next_timer_s()
        if watchdog_s is not None:
            timeout_ms = min(timeout_ms, int(watchdog_s * 1000) + 1)
        self.core.run_once(timeout_ms)
        # Serving once the endpoint is bound (at construction) and the cluster's first metadata is in.
        self.service_manager.tick(self.core.metadata.update_version > 0, len(self.front.sessions),
                                  self.core.metrics.records_sent)
        try:
            if self.core.selector.external_ready:
                self.front.handle_ready(self.core.selector.external_ready)
            self.front.after_iteration()
        except Exception:
            # A bug met while serving one client's request must not stop the daemon for all of them.
            self.iteration_errors += 1
            now = time.monotonic()
            if now - self._error_logged >= _ERROR_LOG_INTERVAL_S:
                self._error_logged = now
                log.exception("error in a loop iteration (%d so far)", self.iteration_errors)

    def shutdown(self) -> None:
        """Send what is queued (up to sidecar.close.timeout.ms), report outcomes, release everything."""
        self.service_manager.stopping()
        self.core.close(self.config["sidecar.close.timeout.ms"])
        self.front.after_iteration()
        self.front.close()
        self.pool.close()
        log.info("kafka-sidecar stopped")


def _raise_file_limit() -> None:
    """Allow as many open files as the hard limit does: each client session holds two (its segment's
    mapping and its memory socket's connection), and the default soft limit of 1024 is a few hundred."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
