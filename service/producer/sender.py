"""Sender: one loop iteration at a time, turns queued batches into ProduceRequests and outcomes.

This is the Java producer's Sender: :meth:`Sender.run_once` gets a producer id
when idempotence needs one, asks for metadata of topics without a leader,
connects to the leaders that are not ready, drains what is sendable, expires
batches past delivery.timeout.ms (queued or in flight), sends one
ProduceRequest per broker and polls the network. Each response completes its
batches: success, retry (back to the head of the queue), split, or final error.

With compression threads (sidecar.compression.threads), a request's batches are
compressed beside the loop: the request waits, its node drained no further, until
they are done, and the loop serves everything else meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from client_stub.errors import (
    ERRORS_BY_NAME,
    InvalidRecordError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    UnsupportedError,
    error_code,
    for_code,
)

from ..config import ProducerConfig
from ..network.client import ClientRequest, ClientResponse, NetworkClient
from ..network.metadata import Metadata
from ..protocol import messages as m
from ..protocol.compression import CompressionType, compress
from .accumulator import FOREVER, RecordAccumulator
from .batch import ProducerBatch, TopicPartition
from .metrics import Gauges, SenderMetrics
from .transaction_manager import State, TransactionManager

log = logging.getLogger(__name__)

NONE = ERRORS_BY_NAME["NONE"].code
CORRUPT_MESSAGE = ERRORS_BY_NAME["CORRUPT_MESSAGE"].code
MESSAGE_TOO_LARGE = ERRORS_BY_NAME["MESSAGE_TOO_LARGE"].code
NETWORK_EXCEPTION = ERRORS_BY_NAME["NETWORK_EXCEPTION"].code
REQUEST_TIMED_OUT = ERRORS_BY_NAME["REQUEST_TIMED_OUT"].code
DUPLICATE_SEQUENCE_NUMBER = ERRORS_BY_NAME["DUPLICATE_SEQUENCE_NUMBER"].code
UNKNOWN_SERVER_ERROR = ERRORS_BY_NAME["UNKNOWN_SERVER_ERROR"].code

# Batches that fail unsent, their records malformed, are logged at most this often (a client may seal
# garbage as fast as it can).
CORRUPT_LOG_INTERVAL_MS = 5_000

PartitionData = m.ProduceRequest.TopicProduceData.PartitionProduceData
TopicData = m.ProduceRequest.TopicProduceData


@dataclass
class _Compressing:
    """A drained produce request whose batches the compression threads are compressing."""

    batches: list[ProducerBatch]
    payloads: list[tuple[ProducerBatch, Future[bytes]]]
    # Its node's connection closed meanwhile: the request is not sent on the next one (the batches that
    # were in flight there go back to their queues, and this request's go behind them, in sequence order).
    disconnected: bool = False

    def done(self) -> bool:
        return all(future.done() for _, future in self.payloads)


class Sender:
    """Sends the accumulator's batches to the brokers and settles every batch once."""

    def __init__(self, client: NetworkClient, metadata: Metadata, accumulator: RecordAccumulator,
                 config: ProducerConfig, transaction_manager: TransactionManager | None,
                 metrics: SenderMetrics, clock: Callable[[], int]) -> None:
        self.client = client
        self.metadata = metadata
        self.accumulator = accumulator
        self.transaction_manager = transaction_manager
        self.metrics = metrics
        self.clock = clock
        self.acks: int = config["acks"]
        self.retries: int = config["retries"]
        self.retry_backoff_ms: int = config["retry.backoff.ms"]
        self.request_timeout_ms: int = config["request.timeout.ms"]
        self.max_request_size: int = config["max.request.size"]
        self.compression = CompressionType.from_name(config["compression.type"])
        self.compression_level: int | None = {
            CompressionType.GZIP: config["compression.gzip.level"],
            CompressionType.LZ4: config["compression.lz4.level"],
            CompressionType.ZSTD: config["compression.zstd.level"],
        }.get(self.compression)
        threads = config["sidecar.compression.threads"]
        self._compressor = ThreadPoolExecutor(threads, thread_name_prefix="compression") \
            if threads and self.compression is not CompressionType.NONE else None
        # Per node id, its next request while its batches are compressed.
        self._compressing: dict[int, _Compressing] = {}
        # Sequence numbers keep an idempotent producer's partitions in order with several batches in
        # flight. Without them a retry would overtake the batches sent after it: the partition is
        # muted while it has a batch in flight (Java does so only with max.in.flight 1).
        self.guarantee_message_order = (config["max.in.flight.requests.per.connection"] == 1
                                        or not config.idempotent)
        self._in_flight_batches: dict[TopicPartition, list[ProducerBatch]] = {}
        # No batch in flight expires before this (early once batches have completed).
        self._next_in_flight_expiry_ms = FOREVER
        self._init_producer_id_in_flight = False
        self._init_producer_id_retry_ms = 0
        self._next_corrupt_log_ms = 0

    # -- the loop --------------------------------------------------------------------------------

    def run_once(self, max_wait_ms: int = FOREVER) -> None:
        """One iteration: settle producer id state, send what is ready, poll the network."""
        now = self.clock()
        wait = self._maybe_init_producer_id(now)
        poll_timeout = min(self.send_producer_data(now), wait, max_wait_ms)
        self.client.poll(max(poll_timeout, 0), now)
        for node_id in self._compressing.keys() & self.client.disconnect_reasons.keys():
            self._compressing[node_id].disconnected = True

    def _maybe_init_producer_id(self, now: int) -> int:
        tm = self.transaction_manager
        if tm is None:
            return FOREVER
        tm.maybe_resolve_sequences()
        if tm.has_fatal_error:
            error = tm.fatal_error or KafkaError("the idempotent producer failed")
            self.accumulator.abort_undrained(error)
            return FOREVER
        if self._init_producer_id_in_flight:
            return FOREVER
        if tm.state is not State.INITIALIZING and not tm.needs_producer_id():
            return FOREVER
        if now < self._init_producer_id_retry_ms:
            return self._init_producer_id_retry_ms - now
        node = self.client.least_loaded_node(now)
        if node is None or not self.client.ready(node, now):
            return self.retry_backoff_ms if node is None else min(
                self.client.connection_delay(node.id, now), self.retry_backoff_ms)
        request = ClientRequest(node.id, tm.init_producer_id_request(), now,
                                callback=self._handle_init_producer_id, request_timeout_ms=self.request_timeout_ms)
        self._init_producer_id_in_flight = True
        self.client.send(request, now)
        return FOREVER

    def _handle_init_producer_id(self, response: ClientResponse) -> None:
        tm = self.transaction_manager
        assert tm is not None
        self._init_producer_id_in_flight = False
        if response.error is not None and not response.disconnected:
            tm.init_producer_id_failed(UnsupportedError(
                f"idempotence needs the InitProducerId API: {response.error}"), retriable=False)
        elif response.body is None:
            tm.init_producer_id_failed(response.error, retriable=True)
        else:
            tm.handle_init_producer_id(response.body)
        if tm.state is not State.READY:
            self._init_producer_id_retry_ms = response.received_ms + self.retry_backoff_ms

    def send_producer_data(self, now: int) -> int:
        """Drain, expire and send; returns how long the poll may wait."""
        if self._compressing:
            self._send_compressed(now)
        cluster = self.metadata.cluster
        result = self.accumulator.ready(cluster, now)
        if result.unknown_leader_topics:
            for topic in result.unknown_leader_topics:
                self.metadata.add_topic(topic, now)
            log.debug("requesting metadata for topics without a known leader: %s", result.unknown_leader_topics)
            self.metadata.request_update()
        not_ready_timeout = FOREVER
        ready_nodes = set()
        for node in result.ready_nodes:
            if node.id in self._compressing:
                continue  # drained again once its request is sent: the compression threads wake the loop
            if self.client.ready(node, now):
                ready_nodes.add(node)
                continue
            error = self.client.authentication_errors.get(node.id)
            if error is not None:
                # Its broker refuses the daemon's credentials or certificate: a retry would not change that,
                # and the clients learn why now rather than at delivery.timeout.ms (as Java's producer).
                for batch in self.accumulator.take_led_by(cluster, node.id):
                    self._fail_batch(batch, error, adjust_sequences=False)
                    if self.transaction_manager is not None and batch.has_sequence:
                        self.transaction_manager.mark_sequence_unresolved(batch)
            not_ready_timeout = min(not_ready_timeout, self.client.connection_delay(node.id, now))
        drained = self.accumulator.drain(cluster, ready_nodes, self.max_request_size, now)
        self._fail_corrupt(now)
        for batches in drained.values():
            for batch in batches:
                self._in_flight_batches.setdefault(batch.tp, []).append(batch)
                self._next_in_flight_expiry_ms = min(self._next_in_flight_expiry_ms,
                                                     batch.created_ms + self.accumulator.delivery_timeout_ms)
                if self.guarantee_message_order:
                    self.accumulator.mute(batch.tp)
        self._expire(now)
        poll_timeout = min(result.next_ready_check_delay_ms, not_ready_timeout,
                           self.accumulator.next_batch_expiry_ms - now, self._next_in_flight_expiry_ms - now)
        if self.accumulator.drain_left_batches and not self.guarantee_message_order:
            # More may go at once: one batch per partition goes per request, and a request is full at
            # max.request.size; with one request in flight per connection, nothing more goes before its
            # response. (Java polls at once after any drain; here an iteration costs more than the
            # ready check that would find nothing.)
            poll_timeout = 0
        for node_id, batches in drained.items():
            # A batch that expired as it was drained is final and its buffer is gone: it stays home.
            sendable = []
            for batch in batches:
                if not batch.is_done:
                    sendable.append(batch)
                elif self.guarantee_message_order:
                    self.accumulator.unmute(batch.tp)
            if sendable:
                self._send_or_compress(node_id, sendable, now)
        return max(poll_timeout, 0)

    # -- compression beside the loop -------------------------------------------------------------

    def _send_or_compress(self, node_id: int, batches: list[ProducerBatch], now: int) -> None:
        """Send the request now, or once the compression threads have compressed its batches."""
        if self._compressor is not None:
            payloads = [(batch, self._compressor.submit(compress, self.compression, batch.records,
                                                        self.compression_level))
                        for batch in batches if not batch.has_payload(self.compression)]
            if payloads:
                self._compressing[node_id] = _Compressing(batches, payloads)
                for _, future in payloads:
                    future.add_done_callback(self._wake)
                return
        self._send_produce_request(node_id, batches, now)

    def _wake(self, _: Future[bytes]) -> None:
        self.client.wakeup()

    def _send_compressed(self, now: int) -> None:
        """Send the requests whose batches are compressed, in the order they were drained."""
        for node_id, request in list(self._compressing.items()):
            if not request.done() or not (request.disconnected or self.client.is_ready(node_id, now)):
                continue
            del self._compressing[node_id]
            for batch, future in request.payloads:
                try:
                    batch.use_payload(self.compression, future.result())
                except Exception as exc:
                    log.exception("compressing %s failed: it fails", batch)
                    self._settle(batch, self._fail_batch, KafkaError(f"compressing the batch failed: {exc!r}"),
                                 adjust_sequences=True)
            # Expired or failed meanwhile, a batch is final: it stays home.
            sendable = [batch for batch in request.batches if not batch.is_done]
            if sendable and not request.disconnected:
                self._send_produce_request(node_id, sendable, now)
            elif sendable:
                self._request_over(sendable)
                for batch in sendable:
                    self._settle(batch, self._complete_batch, NETWORK_EXCEPTION,
                                 f"disconnected from node {node_id} before the request was sent", now)

    def _fail_corrupt(self, now: int) -> None:
        """Fail the batches the drain found malformed, each alone, with its client's error. Unsent, a batch
        drained for the first time spent no sequence; one with a sequence already (a part of a coalesced
        batch the broker found too large, sent again alone) leaves a gap, as after any final refusal."""
        for batch, error in self.accumulator.corrupt_batches:
            self.metrics.batches_corrupt += 1
            if now >= self._next_corrupt_log_ms:
                self._next_corrupt_log_ms = now + CORRUPT_LOG_INTERVAL_MS
                log.warning("%s fails unsent (%d so far): %s", batch, self.metrics.batches_corrupt, error)
            self._fail_batch(batch, error, adjust_sequences=True)

    # -- expiry ----------------------------------------------------------------------------------

    def _expire(self, now: int) -> None:
        expired = self.accumulator.expired_batches(now)
        if now >= self._next_in_flight_expiry_ms:
            expired += self._expired_in_flight_batches(now)
        for batch in expired:
            # Java's Sender's words, to the character: users search their logs for them.
            message = (f"Expiring {batch.record_count} record(s) for {batch.tp}:"
                       f"{now - batch.created_ms} ms has passed since batch creation")
            self._fail_batch(batch, KafkaTimeoutError(message), adjust_sequences=False)
            if self.transaction_manager is not None and batch.has_sequence:
                # The broker may have it (or, drained and never sent, its sequence is a gap): hold
                # the partition until its sequences are known.
                self.transaction_manager.mark_sequence_unresolved(batch)

    def _expired_in_flight_batches(self, now: int) -> list[ProducerBatch]:
        """In-flight batches past delivery.timeout.ms, taken out of the in-flight lists.

        The lists are not in creation order (batches of a partition come from several clients, each
        with its own age, and retries go to the tail), so every batch is looked at.
        """
        timeout = self.accumulator.delivery_timeout_ms
        expired: list[ProducerBatch] = []
        self._next_in_flight_expiry_ms = FOREVER
        for tp, batches in list(self._in_flight_batches.items()):
            kept: list[ProducerBatch] = []
            for batch in batches:
                if not batch.has_reached_delivery_timeout(timeout, now):
                    kept.append(batch)
                    self._next_in_flight_expiry_ms = min(self._next_in_flight_expiry_ms, batch.created_ms + timeout)
                elif not batch.is_done:
                    expired.append(batch)
            if kept:
                self._in_flight_batches[tp] = kept
            else:
                del self._in_flight_batches[tp]
        return expired

    # -- produce requests ------------------------------------------------------------------------

    def _send_produce_request(self, node_id: int, batches: list[ProducerBatch], now: int) -> None:
        topics: dict[str, list[PartitionData]] = {}
        by_tp: dict[TopicPartition, ProducerBatch] = {}
        records = 0
        for batch in batches:
            header, payload = pieces = batch.wire_pieces(self.compression, self.compression_level)
            topics.setdefault(batch.tp.topic, []).append(PartitionData(index=batch.tp.partition, records=pieces))
            by_tp[batch.tp] = batch
            batch.in_flight = True
            records += batch.record_count
            compressed = len(payload)
            self.metrics.record_batch(batch.tp.topic, batch.record_count, len(header) + compressed,
                                      compressed / max(batch.records_size, 1), now - batch.created_ms, now)
        body = m.ProduceRequest(transactional_id=None, acks=self.acks, timeout_ms=self.request_timeout_ms,
                                topic_data=[TopicData(name=t, partition_data=p) for t, p in topics.items()])
        request = ClientRequest(node_id, body, now, callback=lambda r: self._handle_produce_response(r, by_tp),
                                expect_response=self.acks != 0, request_timeout_ms=self.request_timeout_ms)
        self.client.send(request, now)
        self.metrics.record_request(records, now)

    def _handle_produce_response(self, response: ClientResponse,
                                 batches: dict[TopicPartition, ProducerBatch]) -> None:
        now = response.received_ms
        self._request_over(batches.values())
        if response.disconnected:
            code = REQUEST_TIMED_OUT if response.timed_out else NETWORK_EXCEPTION
            message = response.error.message if response.error else "disconnected"
            for batch in batches.values():
                self._settle(batch, self._complete_batch, code, message, now)
            return
        if response.error is not None:
            for batch in batches.values():
                self._settle(batch, self._fail_batch, response.error, adjust_sequences=False)
            return
        self.metrics.record_response(response.destination, response.latency_ms,
                                     None if response.body is None else response.body.throttle_time_ms, now)
        if response.body is None:
            # acks=0: done once written, offsets unknown.
            for batch in batches.values():
                self._settle(batch, self._complete_batch, NONE, None, now)
            return
        body: m.ProduceResponse = response.body
        answered = set()
        for topic in body.responses:
            for pr in topic.partition_responses:
                tp = TopicPartition(topic.name, pr.index)
                batch = batches.get(tp)
                if batch is None:
                    log.warning("produce response for %s, which the request did not contain", tp)
                    continue
                if tp in answered:
                    # A second answer would retry the batch twice: two copies queued, sent at once.
                    log.warning("produce response names %s twice: the first answer counts", tp)
                    continue
                answered.add(tp)
                self._settle(batch, self._complete_batch, pr.error_code, pr.error_message, now,
                             base_offset=pr.base_offset, log_append_time_ms=pr.log_append_time_ms,
                             log_start_offset=pr.log_start_offset)
        for tp, batch in batches.items():
            if tp not in answered:
                self._settle(batch, self._complete_batch, UNKNOWN_SERVER_ERROR,
                             "the produce response did not mention this partition", now)

    def _request_over(self, batches: Iterable[ProducerBatch]) -> None:
        for batch in batches:
            batch.in_flight = False
            # The request is over, whatever its outcome: the partition may send again.
            if self.guarantee_message_order:
                self.accumulator.unmute(batch.tp)

    def _settle(self, batch: ProducerBatch, settle: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """``settle(batch, *args, **kwargs)`` for one batch of a response. An exception fails that batch
        alone (whether the broker has it is unknown: its sequence is left unresolved, as after an
        expiry), and the response's other batches are still settled."""
        try:
            settle(batch, *args, **kwargs)
        except Exception as exc:
            log.exception("error settling %s: it fails", batch)
            try:
                error = KafkaError(f"the daemon failed settling the batch: {exc!r}")
                if self._fail_batch(batch, error, adjust_sequences=False) and self.transaction_manager is not None \
                        and batch.has_sequence:
                    self.transaction_manager.mark_sequence_unresolved(batch)
            except Exception:
                log.exception("error failing %s", batch)

    def _complete_batch(self, batch: ProducerBatch, error: int, message: str | None, now: int, *,
                        base_offset: int = -1, log_append_time_ms: int = -1, log_start_offset: int = -1) -> None:
        tm = self.transaction_manager
        if error == MESSAGE_TOO_LARGE and batch.record_count > 1 and not batch.is_done:
            log.warning("%s is too large for the broker: splitting it", batch)
            if tm is not None:
                tm.handle_failed_batch(batch, for_code(error), adjust_sequences=False)
            self._remove_in_flight(batch)
            try:
                # Halves: a batch keeps splitting until its parts fit or are single records.
                self.accumulator.split_and_reenqueue(batch, batch.records_size // 2, now)
            except InvalidRecordError as exc:
                # Its client wrote records the daemon cannot re-encode (well-framed, as read_records
                # found them, but with a header key that is not UTF-8 or a timestamp out of range).
                # The broker refused the batch: its sequences are a gap, as after any final refusal.
                log.warning("%s fails: %s", batch, exc)
                self._fail_batch(batch, exc, adjust_sequences=True)
                return
            self.metrics.record_split(now)
        elif error not in (NONE, DUPLICATE_SEQUENCE_NUMBER):
            row = error_code(error)
            if self._can_retry(batch, error, log_start_offset, now):
                log.warning("retrying %s (attempt %d) after %s: %s", batch, batch.attempts + 1, row.name,
                            message or "")
                self._remove_in_flight(batch)
                self.accumulator.reenqueue(batch, now)
                self.metrics.record_retry(batch.tp.topic, batch.record_count, now)
            else:
                exc = for_code(error, message)
                if error == NETWORK_EXCEPTION:
                    exc = NetworkError(message or "", code=error, name=row.name)
                # As Java, sequences are adjusted only while retries are left: after its last attempt
                # the broker may or may not have the batch. Unlike Java, the partition then waits until
                # that is known, as after an expiry; else its next batch fails out of order.
                adjust_sequences = batch.attempts < self.retries
                if self._fail_batch(batch, exc, adjust_sequences) and tm is not None and not adjust_sequences \
                        and batch.has_sequence:
                    tm.mark_sequence_unresolved(batch)
            if row.invalid_metadata:
                self.metadata.request_update()
        else:
            # DUPLICATE_SEQUENCE_NUMBER: the broker has these records already, from an earlier attempt.
            if tm is not None:
                tm.handle_completed_batch(batch, base_offset)
            self._remove_in_flight(batch)
            self.accumulator.completed(batch)
            batch.done(base_offset, log_append_time_ms, None)
            batch.maybe_release()

    def _can_retry(self, batch: ProducerBatch, error: int, log_start_offset: int, now: int) -> bool:
        if batch.is_done or batch.attempts >= self.retries:
            return False
        if batch.has_reached_delivery_timeout(self.accumulator.delivery_timeout_ms, now):
            return False
        retriable = error_code(error).retriable
        if error == CORRUPT_MESSAGE:
            # Worth one more try (the bytes may have been damaged on the way); not more.
            retriable = batch.attempts == 0
        if self.transaction_manager is None:
            return retriable
        return self.transaction_manager.can_retry(error, log_start_offset, batch, retriable)

    def _fail_batch(self, batch: ProducerBatch, error: KafkaError, adjust_sequences: bool) -> bool:
        """Fail ``batch``; False if it was final already."""
        self._remove_in_flight(batch)
        self.accumulator.completed(batch)
        failed = batch.done(-1, -1, error)
        if failed:
            # Only the first outcome counts: a late error for an expired batch changes nothing.
            if self.transaction_manager is not None:
                self.transaction_manager.handle_failed_batch(batch, error, adjust_sequences)
            self.metrics.record_error(batch.tp.topic, batch.record_count, self.clock())
        batch.maybe_release()
        return failed

    def _remove_in_flight(self, batch: ProducerBatch) -> None:
        batches = self._in_flight_batches.get(batch.tp)
        if batches is None:
            return
        for i, candidate in enumerate(batches):
            if candidate is batch:
                del batches[i]
                break
        if not batches:
            del self._in_flight_batches[batch.tp]

    # -- metrics ---------------------------------------------------------------------------------

    def gauges(self) -> Gauges:
        """Requests in flight and batches queued, overall and per broker."""
        client = self.client
        return Gauges(requests_in_flight=client.in_flight_request_count(),
                      batches_queued=self.accumulator.queued_batches(),
                      node_requests_in_flight={n: client.in_flight_request_count(n)
                                               for n in self.metadata.cluster.nodes},
                      node_queue_size=self.accumulator.queued_by_leader(self.metadata.cluster))

    # -- close -----------------------------------------------------------------------------------

    def in_flight_batches(self) -> list[ProducerBatch]:
        return [b for batches in self._in_flight_batches.values() for b in batches]

    def close(self) -> None:
        """Stop the compression threads (what they were compressing is not sent)."""
        if self._compressor is not None:
            self._compressor.shutdown(wait=False, cancel_futures=True)

    def abort_incomplete(self, error: KafkaError) -> int:
        """Fail every batch queued or in flight with ``error`` (a forced close); returns how many."""
        aborted = self.accumulator.abort_undrained(error)
        # Those in flight were sent: they fail (and count as failed), not abort.
        for batch in self.in_flight_batches():
            self._fail_batch(batch, error, adjust_sequences=False)
            aborted += 1
        return aborted
