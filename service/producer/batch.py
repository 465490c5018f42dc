"""ProducerBatch: one sealed batch of one partition, from hand-off to its final state.

The records are already in Kafka's v2 record format, written by the
application into its shared memory; the daemon reads them once, into a checked
copy that it checksums and sends (see ProducerBatch for why). The batch
adds what only the sender knows: producer id, epoch and sequence, attempts,
compression, and the final outcome, which is set exactly once.

Small batches of one partition from several clients are coalesced at drain
time into one batch that holds copies of their records (a broker takes one
batch per partition per request): its outcome becomes theirs.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from client_stub.contract.records import BATCH_HEADER_SIZE, Buffer, decode_records
from client_stub.errors import ERRORS_BY_NAME, InvalidRecordError, KafkaError
from client_stub.fastpath import encode_record

from ..fastpath import copy_records, rebase_records
from ..protocol.compression import CompressionType, compress
from ..protocol.record_batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, encode_batch_header

log = logging.getLogger(__name__)

CORRUPT_MESSAGE = ERRORS_BY_NAME["CORRUPT_MESSAGE"]
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class FinalState(enum.Enum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"


class ProducerBatch:
    """A batch of ``record_count`` records for ``tp``.

    ``on_complete(batch)`` runs once, when the final state is set.
    ``release()`` gives the record buffer back; it runs once, when the batch is
    final and no request can still be writing its bytes. ``origin`` and
    ``origin_index`` tie the batch to what its producer handed off (after a
    split, each half knows where its records started). A coalesced batch has
    ``parts``: the batches whose records it holds, in order.

    ``records`` is a view of its client's shared memory, which that client can
    still write (carelessly or to harm) while the daemon holds the batch. The
    rule for every read of it: read once, into a private copy, and use the copy.
    Coalescing reads it with rebase_records; a batch that goes as it is, with
    :meth:`read_records`, before its first send: ``records`` becomes the copy,
    checked to be ``record_count`` well-formed records, which the CRC covers and
    the socket sends, on every attempt. Records that do not parse fail this batch
    alone, with CORRUPT_MESSAGE (InvalidRecordError) to its client, never another
    batch or the loop; checked before the batch has a sequence, they are never sent.
    """

    __slots__ = ("tp", "records", "record_count", "base_timestamp", "max_timestamp", "created_ms",
                 "on_complete", "release", "origin", "origin_index", "attempts", "last_attempt_ms",
                 "drained_ms", "producer_id", "producer_epoch", "base_sequence", "sequence_reset",
                 "final_state", "base_offset", "log_append_time_ms", "error", "in_flight",
                 "_released", "_payload", "_header", "_header_key", "in_retry", "parts", "coalescible",
                 "records_read")

    def __init__(self, tp: TopicPartition, records: Buffer, record_count: int, *, base_timestamp: int,
                 max_timestamp: int, created_ms: int,
                 on_complete: Callable[[ProducerBatch], None] | None = None,
                 release: Callable[[], None] | None = None, origin: Any = None, origin_index: int = 0) -> None:
        if record_count <= 0:
            raise ValueError("a batch holds at least one record")
        self.tp = tp
        self.records = records
        self.record_count = record_count
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.created_ms = created_ms
        self.on_complete = on_complete
        self.release = release
        self.origin = origin
        self.origin_index = origin_index
        self.attempts = 0
        self.last_attempt_ms = created_ms
        self.drained_ms = created_ms
        self.in_retry = False
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE
        self.sequence_reset = False
        self.final_state: FinalState | None = None
        self.base_offset = -1
        self.log_append_time_ms = -1
        self.error: KafkaError | None = None
        self.in_flight = False
        self._released = False
        self._payload: tuple[CompressionType, Buffer] | None = None
        self._header: bytearray | None = None
        self._header_key: tuple | None = None
        self.parts: list[ProducerBatch] = []
        # Until it is first sent, a batch may be coalesced with the next ones of its partition.
        self.coalescible = True
        # Whether ``records`` is the daemon's own, checked copy (see read_records).
        self.records_read = False

    @classmethod
    def coalesce(cls, batches: Iterable[ProducerBatch], max_records_bytes: int) -> tuple[ProducerBatch | None, int]:
        """One batch holding the records of the first of ``batches`` that fit in ``max_records_bytes``.

        Returns it (None if fewer than two fit) and how many batches it took. The records
        are re-encoded with offset deltas running on across the parts and timestamp deltas
        from the earliest base timestamp of the parts. A batch whose records do not parse is
        not taken, nor any after it (order is kept), and is marked to go alone: the broker
        refuses it, not its neighbours.
        """
        # Those that fit as the clients wrote them: a full batch at the head goes as it is, unparsed.
        candidates: list[ProducerBatch] = []
        size = 0
        for batch in batches:
            size += batch.records_size
            if not batch.coalescible or size > max_records_bytes:
                break
            candidates.append(batch)
        if len(candidates) < 2:
            return None, 0
        base_timestamp = min(b.base_timestamp for b in candidates)
        pieces: list[bytes] = []
        parts: list[ProducerBatch] = []
        size = offset = 0
        for batch in candidates:
            try:
                piece = rebase_records(batch.records, batch.record_count, offset,
                                       batch.base_timestamp - base_timestamp)
            except ValueError as exc:
                log.warning("%s is not coalesced: %s", batch, exc)
                batch.coalescible = False
                break
            # Re-encoded, a record may take more bytes (offset deltas from 64 on, shifted timestamps).
            if size + len(piece) > max_records_bytes:
                break
            pieces.append(piece)
            parts.append(batch)
            size += len(piece)
            offset += batch.record_count
        if len(parts) < 2:
            return None, 0
        if len(parts) < len(candidates) and min(b.base_timestamp for b in parts) != base_timestamp:
            # The earliest timestamp was that of a batch left out: the base must be one of the parts'.
            return cls.coalesce(parts, max_records_bytes)
        combined = cls(parts[0].tp, b"".join(pieces), offset, base_timestamp=base_timestamp,
                       max_timestamp=max(b.max_timestamp for b in parts),
                       created_ms=min(b.created_ms for b in parts), on_complete=_complete_parts)
        combined.parts = parts
        combined.coalescible = False
        combined.records_read = True  # rebase_records wrote them
        return combined, len(parts)

    def __repr__(self) -> str:
        return (f"ProducerBatch({self.tp}, records={self.record_count}, bytes={self.size_in_bytes}, "
                f"seq={self.base_sequence}, attempts={self.attempts}, state={self.final_state})")

    @property
    def records_size(self) -> int:
        records = self.records
        return records.nbytes if isinstance(records, memoryview) else len(records)

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the uncompressed batch on the wire, header included."""
        return BATCH_HEADER_SIZE + self.records_size

    # -- idempotence -----------------------------------------------------------------------------

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.record_count - 1) & 0x7FFFFFFF

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence

    def reset_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """New id/epoch/sequence after an epoch bump: the broker must see these records as new."""
        self.sequence_reset = True
        self.set_producer_state(producer_id, producer_epoch, base_sequence)

    # -- sending ---------------------------------------------------------------------------------

    def read_records(self) -> None:
        """Make ``records`` a private copy of the client's, once, checked to be ``record_count``
        well-formed records; raises InvalidRecordError (CORRUPT_MESSAGE) if they are not.

        The drain calls it before the batch takes a sequence, so that a malformed batch fails
        alone, unsent, and leaves no gap in its partition's sequences. Why a copy: the client may
        rewrite its memory after the CRC is computed, and a broker would refuse (or, not checking
        CRCs, keep) a batch whose bytes are not those its CRC covers. Why checked: a broker refuses
        a malformed batch, which would cost its partition the sequences of every batch in flight
        there (a new producer id, the other clients' batches renumbered and sent again), and one
        that keeps it stops every CRC-checking reader of the partition there.
        """
        if self.records_read:
            return
        try:
            self.records = copy_records(self.records, self.record_count)
        except ValueError as exc:
            raise corrupt_records(self, str(exc)) from None
        self.records_read = True

    def has_payload(self, compression: CompressionType) -> bool:
        """Whether the payload for ``compression`` is made (:meth:`use_payload`, or a send before)."""
        return self._payload is not None and self._payload[0] is compression

    def use_payload(self, compression: CompressionType, payload: Buffer) -> None:
        """Send ``payload``, the records (once read) compressed with ``compression`` elsewhere."""
        self._payload = (compression, payload)
        self._header = None

    def wire_pieces(self, compression: CompressionType, level: int | None) -> list[Buffer]:
        """The batch as ``[header, payload]`` for a ProduceRequest.

        The payload is the records once read (:meth:`read_records`), compressed
        once if compression is on, and kept for retries. The header is rebuilt
        only when the producer state changes. A released batch has none: its
        buffer may hold other records by now.
        """
        if self._released:
            raise RuntimeError(f"{self} was released: it cannot be sent")
        if not self.has_payload(compression):
            self.read_records()
            self.use_payload(compression, self.records if compression is CompressionType.NONE else
                             compress(compression, self.records, level))
        payload = self._payload[1]
        key = (self.producer_id, self.producer_epoch, self.base_sequence)
        if self._header is None or self._header_key != key:
            self._header = encode_batch_header(
                payload, compression=compression, record_count=self.record_count,
                last_offset_delta=self.record_count - 1, base_timestamp=self.base_timestamp,
                max_timestamp=self.max_timestamp, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, base_sequence=self.base_sequence)
            self._header_key = key
        return [self._header, payload]

    def reenqueued(self, now: int) -> None:
        self.attempts += 1
        self.last_attempt_ms = now
        self.in_retry = True

    def has_reached_delivery_timeout(self, delivery_timeout_ms: int, now: int) -> bool:
        return delivery_timeout_ms <= now - self.created_ms

    def split(self, max_records_bytes: int) -> list[ProducerBatch]:
        """Split into batches of at most ``max_records_bytes`` of records each (at least one record).

        Offset deltas restart at 0 in every new batch, so the records are
        re-encoded; the new batches own copies, so this batch's buffer can go.
        A coalesced batch splits into its parts, which take its sequences in turn.
        Raises InvalidRecordError (CORRUPT_MESSAGE) if the records do not parse,
        before anything is changed.
        """
        if self.parts:
            return self._uncoalesce()
        self.read_records()  # done before its first send: the checked copy is what is split
        try:
            records = decode_records(self.records, self.record_count)
        except ValueError as exc:
            raise corrupt_records(self, str(exc)) from None
        pieces: list[list[bytes]] = [[]]
        # Each part's maxTimestamp is that of its own records, as the header says.
        max_deltas: list[int] = []
        size = 0
        for record in records:
            encoded = encode_record(len(pieces[-1]), record.timestamp_delta, record.key, record.value,
                                    [(k.encode(), v) for k, v in record.headers])
            if pieces[-1] and size + len(encoded) > max_records_bytes:
                pieces.append([])
                size = 0
                encoded = encode_record(0, record.timestamp_delta, record.key, record.value,
                                        [(k.encode(), v) for k, v in record.headers])
            if not pieces[-1]:
                max_deltas.append(record.timestamp_delta)
            max_deltas[-1] = max(max_deltas[-1], record.timestamp_delta)
            pieces[-1].append(encoded)
            size += len(encoded)
        if not all(_INT64_MIN <= self.base_timestamp + d <= _INT64_MAX for d in max_deltas):
            # A header could not hold the part's maxTimestamp.
            raise corrupt_records(self, "a record's timestamp delta is out of range")
        batches = []
        index = self.origin_index
        sequence = self.base_sequence
        for chunk, max_delta in zip(pieces, max_deltas, strict=True):
            batch = ProducerBatch(self.tp, b"".join(chunk), len(chunk), base_timestamp=self.base_timestamp,
                                  max_timestamp=self.base_timestamp + max_delta, created_ms=self.created_ms,
                                  on_complete=self.on_complete, origin=self.origin, origin_index=index)
            if self.has_sequence:
                batch.set_producer_state(self.producer_id, self.producer_epoch, sequence)
                sequence = (sequence + len(chunk)) & 0x7FFFFFFF
            batch.attempts = self.attempts
            batch.last_attempt_ms = self.last_attempt_ms
            batch.coalescible = False  # or the parts would be put together again, as large as before
            batch.records_read = True  # encoded here
            batches.append(batch)
            index += len(chunk)
        return batches

    def _uncoalesce(self) -> list[ProducerBatch]:
        sequence = self.base_sequence
        for part in self.parts:
            if self.has_sequence:
                part.set_producer_state(self.producer_id, self.producer_epoch, sequence)
                sequence = (sequence + part.record_count) & 0x7FFFFFFF
            part.attempts = self.attempts
            part.last_attempt_ms = self.last_attempt_ms
            part.coalescible = False
        return self.parts

    # -- completion ------------------------------------------------------------------------------

    @property
    def is_done(self) -> bool:
        return self.final_state is not None

    def done(self, base_offset: int, log_append_time_ms: int, error: KafkaError | None) -> bool:
        """Set the final state; False (and nothing reported) if it was already set."""
        state = FinalState.SUCCEEDED if error is None else FinalState.FAILED
        if self.final_state is not None:
            if state is FinalState.SUCCEEDED and self.final_state is FinalState.FAILED:
                log.info("%s succeeded at offset %s after it had failed with %s: not reported again",
                         self, base_offset, self.error)
            elif self.final_state is not state or error is not self.error:
                log.debug("%s already %s, ignoring %s", self, self.final_state.value, state.value)
            return False
        self.final_state = state
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.error = error
        self._report()
        return True

    def abort(self, error: KafkaError) -> bool:
        """Final state ABORTED: the producer is closing or gave up on the batch without sending it."""
        if self.final_state is not None:
            return False
        self.final_state = FinalState.ABORTED
        self.error = error
        self._report()
        return True

    def _report(self) -> None:
        if self.on_complete is not None:
            try:
                self.on_complete(self)
            except Exception:
                log.exception("error reporting the outcome of %s", self)
        self.maybe_release()

    def maybe_release(self) -> None:
        """Give the buffer back if the batch is final and no request holds it; once only."""
        if self._released or self.final_state is None or self.in_flight:
            return
        self._released = True
        self._payload = None
        self.records = b""
        if self.release is not None:
            self.release()

    def release_after_split(self) -> None:
        """The halves own copies of the records: the original buffer can go back now."""
        if not self._released:
            self._released = True
            self.records = b""
            if self.release is not None:
                self.release()


def corrupt_records(batch: ProducerBatch, reason: str) -> InvalidRecordError:
    """The error of a batch whose records the daemon could not parse: Kafka's CORRUPT_MESSAGE, not
    retriable (the same bytes would fail again)."""
    return InvalidRecordError(f"the records of {batch} do not parse: {reason}", code=CORRUPT_MESSAGE.code,
                              name=CORRUPT_MESSAGE.name, retriable=False)


def _complete_parts(batch: ProducerBatch) -> None:
    """A coalesced batch is final: so is each of its parts, at its place in the batch."""
    offset = 0
    for part in batch.parts:
        if batch.final_state is FinalState.ABORTED:
            part.abort(batch.error)  # type: ignore[arg-type]
        else:
            part.done(batch.base_offset + offset if batch.base_offset >= 0 else -1, batch.log_append_time_ms,
                      batch.error)
        offset += part.record_count
