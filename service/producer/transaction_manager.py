"""TransactionManager: the idempotent producer's state, as the Java client's.

It owns the producer id and epoch (InitProducerId), the sequence numbers of every
partition, and the batches of each partition that carry a sequence and have no
outcome yet. It decides when a sequence error can be retried, when a partition's
sequences are unresolved (a batch expired whose fate the broker never told us)
and when the producer must start over under a new producer id, so that the
partition can begin again at sequence 0 without the broker taking new records
for duplicates (Java bumps the epoch instead; see ``_reset_producer_id``).

Transactions are not supported; only the idempotent producer is.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from client_stub.errors import ERRORS_BY_NAME, KafkaError, for_code

from ..protocol import messages as m
from ..protocol.record_batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE
from .batch import ProducerBatch, TopicPartition

log = logging.getLogger(__name__)

INT_MAX = 2**31 - 1

UNKNOWN_PRODUCER_ID = ERRORS_BY_NAME["UNKNOWN_PRODUCER_ID"].code
# Errors after which the producer cannot go on (as Java's TransactionManager).
_FATAL = {ERRORS_BY_NAME[name].code for name in ("CLUSTER_AUTHORIZATION_FAILED",
                                                 "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "UNSUPPORTED_VERSION",
                                                 "PRODUCER_FENCED")}
OUT_OF_ORDER_SEQUENCE_NUMBER = ERRORS_BY_NAME["OUT_OF_ORDER_SEQUENCE_NUMBER"].code


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int = NO_PRODUCER_ID
    epoch: int = NO_PRODUCER_EPOCH

    @property
    def is_valid(self) -> bool:
        return self.producer_id >= 0


NONE = ProducerIdAndEpoch()


def increment_sequence(sequence: int, increment: int) -> int:
    """Sequences wrap from 2**31-1 to 0, as Kafka's."""
    return (sequence + increment) % (INT_MAX + 1)


def sequence_after(sequence: int, other: int) -> bool:
    """Whether ``sequence`` comes after ``other`` (negative: none yet), across the wrap to 0."""
    return other < 0 or 0 < increment_sequence(sequence, -other) < 2**30


@dataclass(slots=True)
class TxnPartitionEntry:
    """Sequence bookkeeping of one partition."""

    producer_id_and_epoch: ProducerIdAndEpoch = NONE
    next_sequence: int = 0
    last_acked_sequence: int = -1
    last_acked_offset: int = -1
    # Batches with a sequence and no outcome yet, in sequence order (across the wrap to 0: they
    # span far less than half the sequence space).
    in_flight: list[ProducerBatch] = field(default_factory=list)

    def add(self, batch: ProducerBatch) -> None:
        i = len(self.in_flight)
        while i > 0 and sequence_after(self.in_flight[i - 1].base_sequence, batch.base_sequence):
            i -= 1
        self.in_flight.insert(i, batch)

    def remove(self, batch: ProducerBatch) -> None:
        for i, candidate in enumerate(self.in_flight):
            if candidate is batch:
                del self.in_flight[i]
                return

    def reset_sequences(self, producer_id_and_epoch: ProducerIdAndEpoch) -> None:
        """Renumber what is in flight from 0 under a new id or epoch."""
        sequence = 0
        for batch in self.in_flight:
            batch.reset_producer_state(producer_id_and_epoch.producer_id, producer_id_and_epoch.epoch, sequence)
            sequence += batch.record_count
        self.producer_id_and_epoch = producer_id_and_epoch
        self.next_sequence = sequence
        self.last_acked_sequence = -1


class State(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    FATAL_ERROR = "FATAL_ERROR"


class TransactionManager:
    """Producer id, epoch and per-partition sequences of an idempotent producer."""

    def __init__(self) -> None:
        self.producer_id_and_epoch = NONE
        self.state = State.UNINITIALIZED
        self.fatal_error: KafkaError | None = None
        self._partitions: dict[TopicPartition, TxnPartitionEntry] = {}
        # Partition -> the sequence right after its latest expired batch.
        self._unresolved: dict[TopicPartition, int] = {}
        self._to_rewrite: set[TopicPartition] = set()
        self._new_producer_id_required = False

    def _entry(self, tp: TopicPartition) -> TxnPartitionEntry:
        entry = self._partitions.get(tp)
        if entry is None:
            entry = self._partitions[tp] = TxnPartitionEntry(self.producer_id_and_epoch)
        return entry

    # -- producer id -----------------------------------------------------------------------------

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id_and_epoch.is_valid

    @property
    def has_fatal_error(self) -> bool:
        return self.state is State.FATAL_ERROR

    def needs_producer_id(self) -> bool:
        """Whether an InitProducerId request should go out now (drops the id first if one must be replaced)."""
        if self._new_producer_id_required:
            self._reset_producer_id()
        if self.state is State.FATAL_ERROR or self.state is State.INITIALIZING:
            return False
        if not self.has_producer_id:
            self.state = State.INITIALIZING
            return True
        return False

    def init_producer_id_request(self) -> m.InitProducerIdRequest:
        return m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=INT_MAX)

    def init_producer_id_failed(self, error: KafkaError | None, retriable: bool) -> None:
        """The request got no answer (retriable) or an error; fatal errors fail the producer."""
        if retriable:
            self.state = State.UNINITIALIZED
            return
        self.state = State.FATAL_ERROR
        self.fatal_error = error
        log.error("the idempotent producer cannot start: %s", error)

    def handle_init_producer_id(self, response: m.InitProducerIdResponse) -> None:
        if response.error_code == 0:
            self.producer_id_and_epoch = ProducerIdAndEpoch(response.producer_id, response.producer_epoch)
            self.state = State.READY
            # Resets asked for while this id was on its way concern batches sent under the old one
            # (nothing is drained without an id): this id serves them too.
            self._new_producer_id_required = False
            log.info("producer id %s, epoch %s", response.producer_id, response.producer_epoch)
            # What was in flight on the partitions that lost their sequences is renumbered now;
            # the other partitions move to the new id once their batches are done.
            for tp in self._to_rewrite:
                if tp in self._partitions:
                    self._partitions[tp].reset_sequences(self.producer_id_and_epoch)
                self._unresolved.pop(tp, None)
            self._to_rewrite.clear()
            return
        error = for_code(response.error_code, "InitProducerId failed")
        self.init_producer_id_failed(error, error.retriable)

    def _reset_producer_id(self) -> None:
        # Java's idempotent producer bumps the epoch locally here (bumpIdempotentProducerEpoch,
        # KIP-360), with no round trip. Brokers before Kafka 2.5 refuse an epoch they did not hand
        # out, and so does Tansu: 0.6.0 answers a batch of a locally bumped epoch with
        # PRODUCER_FENCED (90), even on a partition that never saw the producer, and an
        # InitProducerId naming the current id and epoch (v3+, the broker-side bump) with
        # UNKNOWN_SERVER_ERROR. A new producer id works everywhere: the partitions start over at
        # sequence 0 under it. Resets asked for until it arrives share it.
        self._new_producer_id_required = False
        if not self.has_producer_id:
            return
        log.info("sequences of %s cannot be resolved: taking a new producer id",
                 ", ".join(sorted(map(str, self._to_rewrite))))
        self.producer_id_and_epoch = NONE
        self.state = State.UNINITIALIZED

    def _request_new_producer_id(self, tp: TopicPartition) -> None:
        self._new_producer_id_required = True
        self._to_rewrite.add(tp)

    # -- drain -----------------------------------------------------------------------------------

    def maybe_update_producer_id_and_epoch(self, tp: TopicPartition) -> None:
        """A partition whose batches all completed under an old epoch starts over at sequence 0."""
        entry = self._entry(tp)
        if entry.producer_id_and_epoch != self.producer_id_and_epoch and not entry.in_flight:
            entry.reset_sequences(self.producer_id_and_epoch)

    def sequence_number(self, tp: TopicPartition) -> int:
        return self._entry(tp).next_sequence

    def increment_sequence(self, tp: TopicPartition, count: int) -> None:
        entry = self._entry(tp)
        entry.next_sequence = increment_sequence(entry.next_sequence, count)

    def add_in_flight_batch(self, batch: ProducerBatch) -> None:
        self._entry(batch.tp).add(batch)

    def has_in_flight_batches(self, tp: TopicPartition) -> bool:
        entry = self._partitions.get(tp)
        return bool(entry and entry.in_flight)

    def has_stale_producer_id_and_epoch(self, tp: TopicPartition) -> bool:
        return self._entry(tp).producer_id_and_epoch != self.producer_id_and_epoch

    def has_unresolved_sequence(self, tp: TopicPartition) -> bool:
        return tp in self._unresolved

    def first_in_flight_sequence(self, tp: TopicPartition) -> int:
        entry = self._partitions.get(tp)
        return entry.in_flight[0].base_sequence if entry and entry.in_flight else NO_SEQUENCE

    def should_stop_drain(self, batch: ProducerBatch) -> bool:
        """Whether ``batch`` (the head of its partition's queue) must wait, as Java's drain decides."""
        if self.state is not State.READY or not self.has_producer_id:
            return True
        tp = batch.tp
        if not batch.has_sequence:
            # No new batch while older ones run under an old epoch, or while
            # sequences are unknown: a gap would be read as lost data.
            if self.has_in_flight_batches(tp) and self.has_stale_producer_id_and_epoch(tp):
                return True
            if self.has_unresolved_sequence(tp):
                return True
        first = self.first_in_flight_sequence(tp)
        # A retried batch goes only when it is the oldest outstanding one: in sequence order.
        return first != NO_SEQUENCE and batch.has_sequence and batch.base_sequence != first

    def assign_sequence(self, batch: ProducerBatch) -> None:
        """Give a batch drained for the first time its producer state and sequence."""
        tp = batch.tp
        self.maybe_update_producer_id_and_epoch(tp)
        pe = self.producer_id_and_epoch
        batch.set_producer_state(pe.producer_id, pe.epoch, self.sequence_number(tp))
        self.increment_sequence(tp, batch.record_count)
        self.add_in_flight_batch(batch)

    # -- outcomes --------------------------------------------------------------------------------

    def handle_completed_batch(self, batch: ProducerBatch, base_offset: int) -> None:
        entry = self._entry(batch.tp)
        # A batch sent under an id or epoch since replaced says nothing about the new sequences.
        same_producer = (batch.producer_id, batch.producer_epoch) == (
            entry.producer_id_and_epoch.producer_id, entry.producer_id_and_epoch.epoch)
        if same_producer and sequence_after(batch.last_sequence, entry.last_acked_sequence):
            entry.last_acked_sequence = batch.last_sequence
        if base_offset >= 0:
            entry.last_acked_offset = max(entry.last_acked_offset, base_offset + batch.record_count - 1)
        entry.remove(batch)

    def handle_failed_batch(self, batch: ProducerBatch, error: KafkaError, adjust_sequences: bool) -> None:
        entry = self._partitions.get(batch.tp)
        if entry is not None:
            entry.remove(batch)
        if error.code in _FATAL:
            self.state = State.FATAL_ERROR
            self.fatal_error = error
            return
        if batch.has_sequence and (adjust_sequences or error.code in (OUT_OF_ORDER_SEQUENCE_NUMBER,
                                                                      UNKNOWN_PRODUCER_ID)):
            # A batch the broker refused for good leaves a gap, and a sequence error left for good
            # means the broker's sequences are not ours: start the partition over.
            self._request_new_producer_id(batch.tp)

    def mark_sequence_unresolved(self, batch: ProducerBatch) -> None:
        """An expired batch may or may not have been written: hold the partition until we know."""
        next_sequence = increment_sequence(batch.last_sequence, 1)
        # The sequence after the latest expired batch, whatever order they expired in.
        if sequence_after(next_sequence, self._unresolved.get(batch.tp, -1)):
            self._unresolved[batch.tp] = next_sequence
        log.debug("marking %s unresolved (next sequence %s)", batch.tp, self._unresolved[batch.tp])

    def maybe_resolve_sequences(self) -> None:
        for tp in list(self._unresolved):
            if self.has_in_flight_batches(tp):
                continue
            entry = self._entry(tp)
            if self._is_next_sequence(tp, entry.next_sequence):
                # Later batches succeeded: the broker has every sequence up to here.
                del self._unresolved[tp]
            else:
                self._request_new_producer_id(tp)
                del self._unresolved[tp]

    def _is_next_sequence(self, tp: TopicPartition, sequence: int) -> bool:
        return increment_sequence(self._entry(tp).last_acked_sequence, 1) == sequence

    def can_retry(self, error: int, log_start_offset: int, batch: ProducerBatch, retriable: bool) -> bool:
        """Whether a batch that failed with ``error`` may be sent again (Java's TransactionManager.canRetry)."""
        tp = batch.tp
        if error == UNKNOWN_PRODUCER_ID:
            if log_start_offset == -1 or batch.sequence_reset:
                return True
            # The broker lost the producer's state (log truncated, or it expired): restart the
            # partition under a new epoch rather than reuse (sequence, epoch) pairs.
            self._request_new_producer_id(tp)
            return True
        if error == OUT_OF_ORDER_SEQUENCE_NUMBER:
            if not self.has_unresolved_sequence(tp) and (
                    batch.sequence_reset or not self._is_next_sequence(tp, batch.base_sequence)):
                # Not the batch right after the last acknowledged one: an earlier batch is being
                # retried, and this one will be accepted after it.
                return True
            if not self.has_unresolved_sequence(tp) or \
                    self._is_next_sequence_for_unresolved(tp, batch.base_sequence):
                self._request_new_producer_id(tp)
            return True
        return retriable

    def _is_next_sequence_for_unresolved(self, tp: TopicPartition, sequence: int) -> bool:
        return self._unresolved.get(tp) == sequence
