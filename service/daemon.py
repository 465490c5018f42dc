"""SidecarDaemon: the sender daemon's one event loop.

One thread waits on one poller, where the network's selector registers the
brokers' sockets and the front its clients' (the ZeroMQ socket, the memory
socket and its connections): the sender drains and sends and the network client
handles what the brokers answered; then each client socket that is ready is
served by its part, and the front serves what is due (grants, reports, timers).

Signals: SIGTERM and SIGINT shut it down (a second one cuts the drain short);
SIGHUP reopens its log file and reloads its settings, taking those that can
change while it runs and naming those that need a restart.
"""

from __future__ import annotations

import gc
import logging
import resource
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from client_stub.errors import ConfigError

from . import log_format
from .buffer_pool import BufferPool, client_block_limit
from .config import KEYS, ProducerConfig, shown
from .daemon_metrics import daemon_metrics, stats_report
from .front import FrontSettings, SidecarFront
from .poller import Poller
from .producer.core import ProducerCore, security
from .prometheus import PUBLISH_INTERVAL_MS, PrometheusExporter
from .service_manager import ServiceManager

log = logging.getLogger(__name__)

# The loop wakes at least this often even when nothing happens (timers are checked then).
_MAX_SLEEP_MS = 1000
# An error that recurs at every iteration is logged with its traceback at most this often.
_ERROR_LOG_INTERVAL_S = 5.0


class SidecarDaemon:
    """Owns the BufferPool, the ProducerCore and the front; :meth:`run` until stopped."""

    def __init__(self, config: ProducerConfig, endpoint: str, *,
                 reload: Callable[[], tuple[ProducerConfig, dict[str, str]]] | None = None) -> None:
        """``reload`` reads the settings again (SIGHUP): the configuration, and the [log] settings."""
        _raise_file_limit()
        self.config = config
        self.endpoint = endpoint
        self.poller = Poller()
        self.core = ProducerCore(config, poller=self.poller)
        memory, block_size = config["buffer.memory"], config["batch.size"]
        mode, group = config["sidecar.socket.mode"], config["sidecar.socket.group"]
        self.pool = BufferPool(memory, block_size, max_blocks_per_process=client_block_limit(
            memory, block_size, config["max.request.size"]))
        # Never below two requests' worth: one in flight and the next ready, however slow the rate.
        self.pool.limit_queue(config["sidecar.buffer.queue.ms"], 2 * -(-config["max.request.size"] // block_size))
        try:
            self.front = SidecarFront(endpoint, self.pool, self._front_settings(), self.poller,
                                      append=self.core.append, topics=self.core.metadata,
                                      stats=lambda: stats_report(self.core, self.pool, self.front),
                                      clock=self.core.clock, socket_mode=mode, socket_group=group)
        except BaseException:
            self.pool.close()
            raise
        port = config["sidecar.metrics.port"]
        try:
            self.exporter = None if port is None else PrometheusExporter(config["sidecar.metrics.host"], port)
        except BaseException:
            self.front.close()
            self.pool.close()
            raise
        self._reload = reload
        self._stop = threading.Event()
        self._stop_reason = "stopped"
        # A second stop while the clients' batches drain ends the drain.
        self._hurry = threading.Event()
        self._reload_requested = threading.Event()
        self._next_publish_ms = 0
        self.service_manager = ServiceManager()
        self.iteration_errors = 0
        self._error_logged = float("-inf")

    def _front_settings(self) -> FrontSettings:
        return FrontSettings.from_config(self.config, self.pool.block_size, self.pool.block_count)

    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to finish (safe from signal handlers and other threads); asked again, to finish now."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop_reason = reason
        self._stop.set()

    def request_reload(self) -> None:
        """Ask the loop to reopen the log file and reload the settings (safe from signal handlers)."""
        self._reload_requested.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self.stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGHUP, lambda signum, frame: self.request_reload())

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
        """One iteration: sending, and the one wait on the brokers' sockets and the clients' (the brokers' served at
        once by the network client); then the clients' sockets that are ready, and what is due of the front
        (grants, reports, timers)."""
        if self._reload_requested.is_set():
            self._reload_requested.clear()
            self.reload()
        timeout_ms = min(self.front.next_timer_ms(), _MAX_SLEEP_MS)
        watchdog_s = self.service_manager.next_timer_s()
        if watchdog_s is not None:
            timeout_ms = min(timeout_ms, int(watchdog_s * 1000) + 1)
        self.core.run_once(timeout_ms)
        # Serving once the endpoint is bound (at construction) and the cluster's first metadata is in.
        self.service_manager.tick(self.core.metadata.update_version > 0, len(self.front.sessions),
                                  self.core.metrics.records_sent)
        try:
            self.poller.serve_ready()
            self.pool.follow_queue(self.core.clock())
            self.front.serve_due()
            if self.exporter is not None and self.core.clock() >= self._next_publish_ms:
                self._next_publish_ms = self.core.clock() + PUBLISH_INTERVAL_MS
                self.exporter.publish(daemon_metrics(self.core, self.pool, self.front))
        except Exception:
            # A bug met while serving one client's request must not stop the daemon for all of them.
            self.iteration_errors += 1
            now = time.monotonic()
            if now - self._error_logged >= _ERROR_LOG_INTERVAL_S:
                self._error_logged = now
                log.exception("error in a loop iteration (%d so far)", self.iteration_errors)

    def shutdown(self) -> None:
        """Take no more records, deliver what the clients handed off within sidecar.close.timeout.ms and report
        it to them, fail and report the rest, then release everything the daemon made."""
        self.service_manager.stopping()
        timeout_ms = self.config["sidecar.close.timeout.ms"]
        log.info("%s: shutting down: delivering what the clients handed off (up to %d ms)", self._stop_reason,
                 timeout_ms)
        deadline = self.core.clock() + timeout_ms
        self.front.begin_shutdown(self._stop_reason)
        # The clients seal what they hold and say so; until then, until every batch is final, and until the
        # clients have taken their reports, serve on.
        while not self._hurry.is_set() and self.core.clock() < deadline and \
                (not self.front.sealed_all() or self.core.accumulator.has_incomplete()
                 or self.front.replies_pending()):
            self.run_once()
        try:
            # The producer's close turns the poll until what it holds is final: the clients are not served meanwhile.
            self.front.stop_serving()
            self.core.close(max(deadline - self.core.clock(), 0) if not self._hurry.is_set() else 0)
            self.front.serve_due()
        finally:
            if self.exporter is not None:
                self.exporter.close()
            self.front.close()
            self.pool.close()
        log.info("kafka-sidecar stopped")

    def reload(self) -> None:
        """Reopen the log file; take the settings that can change live from the configuration read again, and
        name those that changed but need a restart (SIGHUP)."""
        taken: list[str] = []
        restart: list[str] = []
        log_settings = None
        if self._reload is not None:
            try:
                config, log_settings = self._reload()
                # Certificates and keys are read again (for the connections made from now on); a new
                # security.protocol needs a restart.
                same_protocol = config["security.protocol"] == self.config["security.protocol"]
                connections = security(config) if same_protocol else None
                taken, restart = self.config.reload(config)
                if connections is not None:
                    self.core.use_security(*connections)
            except ConfigError as exc:
                log.error("reload: the settings are not taken: %s", exc)
                log_settings = None
        try:
            if log_settings is None:
                log_format.reopen()
            else:
                log_format.configure(log_settings["level"], log_settings["format"], log_settings["file"])
        except OSError as exc:
            # The old file, or standard error, stays: a log that cannot be written must not stop the daemon.
            log.error("reload: cannot open the log file, logging on where it did: %s", exc)
        self.front.use_settings(self._front_settings())
        self.core.metadata.metadata_max_age_ms = self.config["metadata.max.age.ms"]
        if taken:
            log.info("reload: now %s", ", ".join(f"{name}={shown(name, self.config[name])}" for name in taken))
        if restart:
            log.warning("reload: %s changed, which only a restart applies (the settings a reload applies: %s)",
                        ", ".join(restart), ", ".join(name for name, key in KEYS.items() if key.live))
        if not taken and not restart:
            log.info("reload: log file reopened, no setting changed")


def _raise_file_limit() -> None:
    """Allow as many open files as the hard limit does: each client session holds two (its segment's
    mapping and its memory socket's connection), and the default soft limit of 1024 is a few hundred."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
