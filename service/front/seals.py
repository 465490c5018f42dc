"""Seals: the batches of a client made ProducerBatches, over the records in its blocks.

A batch comes as a seal notice: one the daemon read from the batch's slot as it claimed it
(:meth:`Seals.claim`, from :func:`service.fastpath.claim_ready`), or one of those a client hands
back with the session of a daemon that is gone (:meth:`Seals.seal`). Each is checked on its own
(a bad one, or one past the client's limits, fails its batch only, with a report, and the blocks
it named that the client still held go back to the pool); the batch's view is of the client's own
segment, which the daemon reads once when it sends the batch. A batch claimed is checked and sealed
in one call of the fast path (:func:`service.fastpath.seal_claimed`), the daemon's work for each of
them; one that fails it, and each handed back, is checked field by field (:func:`check_notice`),
which says why it is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from client_stub.contract import ipc
from client_stub.contract.records import BATCH_HEADER_SIZE
from client_stub.errors import InvalidRequestError, KafkaError

from ..buffer_pool import BufferPool
from ..client_error import ClientError
from ..producer.batch import ProducerBatch, TopicPartition
from .checks import check_notice, clip, is_int, notice_fields
from .ports import AppendBatch, TopicView
from .quotas import ProcessQuotas
from .reports import DeliveryReports
from .sessions import ClientSession, SessionTable
from .settings import FrontSettings

log = logging.getLogger(__name__)


class Seals:
    """Batches sealed by clients, handed to the producer."""

    def __init__(self, pool: BufferPool, sessions: SessionTable, topics: TopicView, quotas: ProcessQuotas,
                 reports: DeliveryReports, append: AppendBatch, settings: FrontSettings,
                 refuse: Callable[[ClientSession, ClientError], None]) -> None:
        """``refuse`` answers the client with why one of its notices was refused."""
        self.pool = pool
        self.sessions = sessions
        self.topics = topics
        self.quotas = quotas
        self.reports = reports
        self.append = append
        self.settings = settings
        self._refuse = refuse
        # Records of the batches clients sealed (handed off).
        self.records_sealed = 0

    def seal(self, session: ClientSession, notices: list[Any], now: int) -> None:
        """Hand over the batches of a session taken back, each on its own."""
        control = self.pool.control(session.client_id)
        for notice in notices:
            if not self.sessions.is_live(session):
                return  # ended by a reply it did not take: the notices left are offered again when it comes back
            self._hand_over(session, notice, now)
            first = notice_fields(notice).get("first_block")
            if control is not None and is_int(first) and 0 <= first < self.pool.block_count:
                # Its slot may say it is open (the client closed it unclaimed when the last daemon went): when the
                # block is granted again, it must not look like a batch until the client opens one there.
                control.mark_claimed(first)

    def claim(self, session: ClientSession, claimed: tuple[int, ...], now: int) -> None:
        """Hand over a batch the daemon claimed (as :func:`service.fastpath.claim_ready` returns it): its records
        and length as the claim read them, the rest as its slot says, sealed in one check of its fields and blocks
        (:meth:`BufferPool.seal_claimed`); one that fails it is checked as a notice, which says why."""
        (block, record_count, length, base_timestamp, max_timestamp, batch_id, topic_index, partition, block_count,
         opened_ns) = claimed
        names = session.topic_names
        if topic_index >= len(names):
            self._refused(session, [batch_id, block, block_count, None, partition, record_count, length,
                                    base_timestamp, max_timestamp, 0],
                          ClientError(f"no topic is number {topic_index} of this session: it follows {len(names)}"))
            return
        notice = ipc.SealNotice(batch_id, block, block_count, names[topic_index], partition, record_count, length,
                                base_timestamp, max_timestamp, min(max(now - opened_ns // 1_000_000, 0), 2**40))
        records = self.pool.seal_claimed(session.client_id, claimed)
        if records is None:
            self._hand_over(session, list(notice), now)  # checked as a notice, which says why it is refused
            return
        try:
            self._admit(session, notice)
        except ClientError as exc:
            self.pool.unseal(session.client_id, block, block_count)  # then freed as a refused batch's blocks are
            self._refused(session, list(notice), exc)
            return
        self._to_producer(self._producer_batch(session, notice, records, now))

    def _hand_over(self, session: ClientSession, notice: Any, now: int) -> None:
        """The batch of one notice to the producer, or failed (the client's fault: refused, with a report)."""
        try:
            batch = self._batch(session, notice, now)
        except ClientError as exc:
            self._refused(session, notice, exc)
            return
        self._to_producer(batch)

    def _to_producer(self, batch: ProducerBatch) -> None:
        """Queue a batch in the producer's accumulator."""
        try:
            self.append(batch)
        except Exception as exc:
            # A bug, not the client's fault: fail this batch, free its blocks, go on with the rest.
            log.exception("could not queue a sealed batch")
            batch.abort(KafkaError(f"the daemon could not queue the batch: {exc}"))

    def _refused(self, session: ClientSession, notice: Any, exc: ClientError) -> None:
        """Refuse a batch: the client hears why, and its report fails it."""
        self._refuse(session, ClientError(f"batch refused: {exc}", exc.code))
        self._fail_notice(session, notice, InvalidRequestError(clip(f"the daemon refused the batch: {exc}")))

    def _fail_notice(self, session: ClientSession, notice: Any, error: InvalidRequestError) -> None:
        """A failed report for the notice's batch, and the blocks it named that the client holds unsealed freed:
        the client counts a failed batch as finished, and neither writes to nor releases its blocks again."""
        fields = notice_fields(notice)
        batch_id, first, count = (fields.get(name) for name in ("batch_id", "first_block", "block_count"))
        if not is_int(batch_id):
            return
        session.reports.append(ipc.DeliveryReport.failed(batch_id, error))
        if is_int(first) and is_int(count):
            self.pool.free_unsealed(session.client_id, first, count)

    def _batch(self, session: ClientSession, raw: Any, now: int) -> ProducerBatch:
        notice = check_notice(raw, self.pool.block_count, self.pool.block_size)
        self._admit(session, notice)
        view = self.pool.seal(session.client_id, notice.first_block, notice.block_count, notice.length)
        return self._producer_batch(session, notice, view, now)

    def _admit(self, session: ClientSession, notice: ipc.SealNotice) -> None:
        """ClientError unless the session may produce to the notice's topic, its partition exists (as far as the
        daemon knows) and its batch is within max.request.size."""
        topic, partition, length = notice.topic, notice.partition, notice.length
        self.quotas.admit_topic(session, topic)
        partitions = self.topics.partition_count(topic)
        if partitions is not None and partition >= partitions:
            raise ClientError(f"partition {partition} of topic {topic} does not exist: it has {partitions}")
        if length + BATCH_HEADER_SIZE > self.settings.max_request_size:
            raise ClientError(f"a batch of {length} bytes (and its header) is larger than max.request.size")

    def _producer_batch(self, session: ClientSession, notice: ipc.SealNotice, records: memoryview,
                        now: int) -> ProducerBatch:
        """The batch of a notice whose blocks are sealed, ``records`` the view of them."""
        session.unreported[notice.batch_id] = notice.record_count
        self.records_sealed += notice.record_count
        client_id, blocks = session.client_id, range(notice.first_block, notice.first_block + notice.block_count)
        return ProducerBatch(TopicPartition(notice.topic, notice.partition), records, notice.record_count,
                             base_timestamp=notice.base_timestamp, max_timestamp=notice.max_timestamp,
                             created_ms=now - notice.created_ms_ago, on_complete=self.reports.batch_done,
                             release=lambda: self.pool.free(client_id, blocks),
                             origin=(client_id, notice.batch_id))
