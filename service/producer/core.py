"""ProducerCore: the daemon's Kafka side wired together, as KafkaProducer wires the Java client.

Configuration in; Metadata, Selector, NetworkClient, RecordAccumulator,
TransactionManager (idempotence) and Sender built from it. The daemon hands
sealed batches to :meth:`ProducerCore.append` and turns the crank with
:meth:`ProducerCore.run_once` in its one event loop; :meth:`flush` and
:meth:`close` run that loop themselves until their work is done.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from client_stub.errors import KafkaError, ProducerClosedError

from ..config import ProducerConfig, sasl_credentials
from ..network.client import NetworkClient, monotonic_ms
from ..network.metadata import Metadata
from ..network.sasl import SaslCredentials
from ..network.selector import Selector, SelectorMetrics
from ..network.tls import TlsTransport, ssl_context
from ..network.transport import PlaintextTransport, TransportFactory
from ..poller import Poller
from .accumulator import FOREVER, RecordAccumulator
from .batch import ProducerBatch
from .metrics import SenderMetrics
from .sender import Sender
from .transaction_manager import TransactionManager

log = logging.getLogger(__name__)

_CLOSE_LINGER_MS = 2000


def security(config: ProducerConfig) -> tuple[TransportFactory, SaslCredentials | None]:
    """What security.protocol and the ssl.* and sasl.* settings make of a connection: its transport (TLS with the
    certificates and keys read now), and the SASL credentials; ConfigError for any that cannot be used."""
    protocol = config["security.protocol"]
    transport: TransportFactory = PlaintextTransport
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl_context(config)

        def transport(sock: socket.socket, host: str) -> TlsTransport:
            return TlsTransport(sock, context, host)

    credentials = None
    if protocol.startswith("SASL_"):
        credentials = SaslCredentials(config["sasl.mechanism"], *sasl_credentials(config))
    return transport, credentials


class ProducerCore:
    """Everything between sealed batches and the brokers, driven by one thread."""

    def __init__(self, config: ProducerConfig, *, clock: Callable[[], int] = monotonic_ms,
                 poller: Poller | None = None) -> None:
        """``poller``: the loop's, which the broker connections are registered with (a new one if None)."""
        self.config = config
        self.clock = clock
        self.metadata = Metadata(config["bootstrap.servers"], refresh_backoff_ms=config["retry.backoff.ms"],
                                 metadata_max_age_ms=config["metadata.max.age.ms"],
                                 metadata_max_idle_ms=config["metadata.max.idle.ms"],
                                 allow_auto_topic_creation=config["allow.auto.create.topics"],
                                 auto_create_topics_per_minute=config["sidecar.auto.create.topics.per.minute"])
        window_ms, samples = config["metrics.sample.window.ms"], config["metrics.num.samples"]
        transport, credentials = security(config)
        self.selector = Selector(max_receive_size=config["receive.message.max.bytes"],
                                 send_buffer_bytes=config["send.buffer.bytes"],
                                 receive_buffer_bytes=config["receive.buffer.bytes"], transport_factory=transport,
                                 metrics=SelectorMetrics(window_ms, samples, clock), poller=poller)
        self.client = NetworkClient(
            self.selector, self.metadata, client_id=config["client.id"],
            max_in_flight_requests_per_connection=config["max.in.flight.requests.per.connection"],
            request_timeout_ms=config["request.timeout.ms"], reconnect_backoff_ms=config["reconnect.backoff.ms"],
            reconnect_backoff_max_ms=config["reconnect.backoff.max.ms"],
            connection_setup_timeout_ms=config["socket.connection.setup.timeout.ms"], sasl=credentials, clock=clock)
        self.transaction_manager = TransactionManager() if config.idempotent else None
        self.accumulator = RecordAccumulator(retry_backoff_ms=config["retry.backoff.ms"],
                                             retry_backoff_max_ms=config["retry.backoff.max.ms"],
                                             delivery_timeout_ms=config["delivery.timeout.ms"],
                                             coalesce_bytes=config["batch.size"] if config["sidecar.coalesce.batches"]
                                             else 0,
                                             transaction_manager=self.transaction_manager)
        self.metrics = SenderMetrics(window_ms, samples)
        self.sender = Sender(self.client, self.metadata, self.accumulator, config, self.transaction_manager,
                             self.metrics, clock)
        self.metrics.gauges = self.sender.gauges
        self.closed = False

    def use_security(self, transport: TransportFactory, credentials: SaslCredentials | None) -> None:
        """New connections from now on with ``transport`` and ``credentials`` (of :func:`security`: a reload)."""
        self.selector.transport_factory = transport
        self.client.sasl = credentials

    def append(self, batch: ProducerBatch) -> None:
        """Hand a sealed batch over; its outcome arrives through ``batch.on_complete``."""
        if self.closed:
            batch.abort(ProducerClosedError("the producer is closed"))
            return
        tm = self.transaction_manager
        if tm is not None and tm.has_fatal_error:
            batch.abort(tm.fatal_error or KafkaError("the idempotent producer failed"))
            return
        self.metadata.add_topic(batch.tp.topic, self.clock())
        self.accumulator.append(batch)

    def run_once(self, max_wait_ms: int = FOREVER) -> None:
        """One iteration of the sender loop; waits at most ``max_wait_ms`` for I/O."""
        self.sender.run_once(max_wait_ms)

    def flush(self, timeout_ms: int | None = None) -> bool:
        """Run the loop until every batch handed over is final; False if ``timeout_ms`` passed first."""
        deadline = None if timeout_ms is None else self.clock() + timeout_ms
        while self.accumulator.has_incomplete():
            now = self.clock()
            if deadline is not None and now >= deadline:
                return False
            self.run_once(100 if deadline is None else max(min(deadline - now, 100), 0))
        return True

    def close(self, timeout_ms: int | None = None) -> None:
        """Take no more batches, send what is queued within ``timeout_ms``, fail the rest."""
        if self.closed:
            return
        self.closed = True
        self.accumulator.close()
        deadline = None if timeout_ms is None else self.clock() + timeout_ms
        if timeout_ms is None or timeout_ms > 0:
            self.flush(timeout_ms)
        if self.accumulator.has_incomplete():
            error = ProducerClosedError(f"the producer closed after {timeout_ms} ms before this batch was delivered")
            aborted = self.sender.abort_incomplete(error)
            log.warning("closing: %d batch(es) failed undelivered", aborted)
        # A short linger lets the brokers read the last acks=0 requests before the sockets go;
        # within what is left of the timeout, as a silent broker would make it last in full.
        linger_ms = min(self.config["request.timeout.ms"], _CLOSE_LINGER_MS)
        if deadline is not None:
            linger_ms = min(linger_ms, max(deadline - self.clock(), 0))
        self.sender.close()
        self.client.close_all(linger_ms=linger_ms)
