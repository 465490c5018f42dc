"""ProducerBatch: final state set once, buffer released once, wire pieces, split."""

from __future__ import annotations

import pytest

from client_stub.errors import KafkaError, KafkaTimeoutError, for_code
from client_stub.records import decode_records
from service.producer import batch as batch_module
from service.producer.batch import FinalState, ProducerBatch, TopicPartition
from service.protocol.compression import CompressionType
from service.protocol.record_batch import HEADER_SIZE, NO_SEQUENCE, decode_batch

from .producer_batches import BASE_TS, encode_records, make_batch, record_specs


class Outcomes:
    """Records every on_complete and release call."""

    def __init__(self) -> None:
        self.completed: list[tuple[FinalState | None, KafkaError | None]] = []
        self.released = 0

    def on_complete(self, batch: ProducerBatch) -> None:
        self.completed.append((batch.final_state, batch.error))

    def release(self) -> None:
        self.released += 1


@pytest.fixture
def outcomes() -> Outcomes:
    return Outcomes()


def tracked(outcomes: Outcomes, count: int = 3, **kwargs) -> ProducerBatch:
    return make_batch(count=count, on_complete=outcomes.on_complete, release=outcomes.release, **kwargs)


def decode(pieces: list) -> object:
    data = b"".join(bytes(p) for p in pieces)
    batch, end = decode_batch(data)
    assert end == len(data)
    return batch


# -- final state ---------------------------------------------------------------------------------


def test_done_twice_reports_once(outcomes: Outcomes) -> None:
    batch = tracked(outcomes)
    assert batch.done(42, -1, None) is True
    assert batch.done(99, -1, None) is False
    assert outcomes.completed == [(FinalState.SUCCEEDED, None)]
    assert batch.base_offset == 42
    assert batch.is_done


def test_abort_after_done_is_ignored(outcomes: Outcomes) -> None:
    batch = tracked(outcomes)
    assert batch.done(0, 123, None)
    assert batch.abort(KafkaError("closing")) is False
    assert batch.final_state is FinalState.SUCCEEDED
    assert batch.error is None
    assert batch.log_append_time_ms == 123
    assert outcomes.completed == [(FinalState.SUCCEEDED, None)]


def test_success_after_failure_is_not_reported(outcomes: Outcomes, caplog: pytest.LogCaptureFixture) -> None:
    batch = tracked(outcomes)
    expired = KafkaTimeoutError("expired")
    assert batch.done(-1, -1, expired) is True
    with caplog.at_level("INFO", logger=batch_module.__name__):
        assert batch.done(10, -1, None) is False
    assert outcomes.completed == [(FinalState.FAILED, expired)]
    assert batch.final_state is FinalState.FAILED and batch.error is expired and batch.base_offset == -1
    assert "after it had failed" in caplog.text


def test_failure_after_abort_and_abort_twice(outcomes: Outcomes) -> None:
    batch = tracked(outcomes)
    closing = KafkaError("closing")
    assert batch.abort(closing) is True
    assert batch.abort(KafkaError("again")) is False
    assert batch.done(-1, -1, for_code(7)) is False
    assert outcomes.completed == [(FinalState.ABORTED, closing)]


def test_on_complete_raising_does_not_break_the_batch(outcomes: Outcomes) -> None:
    def boom(_: ProducerBatch) -> None:
        raise RuntimeError("callback bug")

    batch = make_batch(on_complete=boom, release=outcomes.release)
    assert batch.done(0, -1, None) is True
    assert outcomes.released == 1


# -- release -------------------------------------------------------------------------------------


def test_release_once_when_final_and_not_in_flight(outcomes: Outcomes) -> None:
    batch = tracked(outcomes)
    batch.maybe_release()
    assert outcomes.released == 0  # not final yet
    assert batch.done(0, -1, None)
    assert outcomes.released == 1
    batch.maybe_release()
    batch.done(1, -1, None)
    batch.abort(KafkaError("x"))
    assert outcomes.released == 1


def test_no_release_while_in_flight(outcomes: Outcomes) -> None:
    batch = tracked(outcomes)
    batch.in_flight = True
    assert batch.done(-1, -1, KafkaTimeoutError("expired while in flight"))
    assert outcomes.completed and outcomes.released == 0
    batch.maybe_release()
    assert outcomes.released == 0
    batch.in_flight = False
    batch.maybe_release()
    assert outcomes.released == 1
    batch.maybe_release()
    batch.maybe_release()
    assert outcomes.released == 1


def test_release_after_split_once(outcomes: Outcomes) -> None:
    batch = tracked(outcomes, count=4)
    batch.release_after_split()
    batch.release_after_split()
    assert outcomes.released == 1
    batch.abort(KafkaError("late"))
    batch.maybe_release()
    assert outcomes.released == 1



@pytest.mark.parametrize("release", ["final", "split"])
def test_released_batch_gives_no_wire_pieces(outcomes: Outcomes, release: str) -> None:
    """Its buffer may hold another batch's records by now: sending it would put those on the wire."""
    batch = tracked(outcomes, count=4)
    batch.wire_pieces(CompressionType.NONE, None)
    if release == "final":
        batch.done(-1, -1, KafkaTimeoutError("expired"))
    else:
        batch.release_after_split()
    assert outcomes.released == 1
    with pytest.raises(RuntimeError, match="released"):
        batch.wire_pieces(CompressionType.NONE, None)


# -- wire pieces ---------------------------------------------------------------------------------


def test_wire_pieces_uncompressed_is_the_buffer_itself() -> None:
    specs = record_specs(5)
    batch = make_batch(specs=specs, created_ms=5)
    batch.set_producer_state(1234, 3, 40)
    header, payload = batch.wire_pieces(CompressionType.NONE, None)
    assert payload is batch.records
    assert isinstance(payload, memoryview)
    assert len(header) == HEADER_SIZE
    assert batch.size_in_bytes == HEADER_SIZE + payload.nbytes

    decoded = decode([header, payload])
    assert decoded.crc_valid
    assert decoded.compression is CompressionType.NONE
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (1234, 3, 40)
    assert decoded.record_count == 5 and decoded.last_offset_delta == 4
    assert decoded.base_timestamp == BASE_TS
    assert decoded.max_timestamp == BASE_TS + specs[-1][0]
    assert decoded.batch_length == HEADER_SIZE - 12 + payload.nbytes
    assert [(r.offset_delta, r.timestamp_delta, r.key, r.value) for r in decoded.records] == [
        (i, ts, k, v) for i, (ts, k, v, _) in enumerate(specs)]


def test_wire_pieces_without_producer_state() -> None:
    decoded = decode(make_batch().wire_pieces(CompressionType.NONE, None))
    assert decoded.crc_valid
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (-1, -1, NO_SEQUENCE)


def test_header_cached_until_producer_state_changes() -> None:
    batch = make_batch()
    batch.set_producer_state(7, 0, 0)
    first = batch.wire_pieces(CompressionType.NONE, None)
    again = batch.wire_pieces(CompressionType.NONE, None)
    assert again[0] is first[0]

    batch.set_producer_state(7, 0, 9)
    moved = batch.wire_pieces(CompressionType.NONE, None)
    assert moved[0] is not first[0]
    decoded = decode(moved)
    assert decoded.crc_valid and decoded.base_sequence == 9

    batch.reset_producer_state(8, 0, 0)
    assert batch.sequence_reset
    reset = batch.wire_pieces(CompressionType.NONE, None)
    assert reset[0] is not moved[0]
    decoded = decode(reset)
    assert decoded.crc_valid
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (8, 0, 0)


@pytest.mark.parametrize("codec", [c for c in CompressionType if c is not CompressionType.NONE])
def test_compressed_payload_computed_once(codec: CompressionType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = batch_module.compress

    def counting(c, data, level=None):
        calls.append(c)
        return real(c, data, level)

    monkeypatch.setattr(batch_module, "compress", counting)
    specs = record_specs(20)
    batch = make_batch(specs=specs)
    batch.set_producer_state(5, 1, 0)
    first = batch.wire_pieces(codec, None)
    batch.set_producer_state(5, 1, 100)  # a retry under a new sequence: new header, same payload
    second = batch.wire_pieces(codec, None)
    assert calls == [codec]
    assert second[1] is first[1]
    assert second[0] is not first[0]
    for pieces, sequence in ((first, 0), (second, 100)):
        decoded = decode(pieces)
        assert decoded.crc_valid and decoded.compression is codec
        assert decoded.base_sequence == sequence and decoded.record_count == 20
        assert [(r.key, r.value, r.headers) for r in decoded.records] == [
            (k, v, [(hk.decode(), hv) for hk, hv in h]) for _, k, v, h in specs]


def test_compression_change_recomputes_payload_and_header() -> None:
    batch = make_batch()
    plain = batch.wire_pieces(CompressionType.NONE, None)
    gz = batch.wire_pieces(CompressionType.GZIP, 6)
    assert gz[1] is not batch.records and gz[0] is not plain[0]
    assert decode(gz).crc_valid and decode(gz).compression is CompressionType.GZIP


# -- split ---------------------------------------------------------------------------------------


def test_split_halves_decode_with_offset_deltas_from_zero() -> None:
    specs = record_specs(10)
    parent = make_batch(specs=specs, origin="handoff-1", origin_index=10, created_ms=77)
    parts = parent.split(parent.records_size // 2)
    assert len(parts) >= 2
    assert sum(p.record_count for p in parts) == 10
    seen = []
    for part in parts:
        decoded = decode(part.wire_pieces(CompressionType.NONE, None))
        assert decoded.crc_valid
        assert [r.offset_delta for r in decoded.records] == list(range(part.record_count))
        assert decoded.last_offset_delta == part.record_count - 1
        assert decoded.base_timestamp == BASE_TS
        seen += [(BASE_TS + r.timestamp_delta, r.key, r.value, r.headers) for r in decoded.records]
        assert part.records_size <= parent.records_size // 2 or part.record_count == 1
    assert seen == [(BASE_TS + ts, k, v, [(hk.decode(), hv) for hk, hv in h]) for ts, k, v, h in specs]


def test_split_max_timestamp_is_each_parts_own() -> None:
    specs = record_specs(8)
    parent = make_batch(specs=specs)
    parts = parent.split(parent.records_size // 2)
    for part in parts:
        records = decode_records(part.records, part.record_count)
        assert part.max_timestamp == BASE_TS + max(r.timestamp_delta for r in records)
        assert decode(part.wire_pieces(CompressionType.NONE, None)).max_timestamp == part.max_timestamp


def test_split_keeps_origin_and_counts_origin_index() -> None:
    parent = make_batch(count=9, origin="handoff-1", origin_index=10, created_ms=77)
    parts = parent.split(parent.records_size // 3)
    assert len(parts) >= 3
    index = 10
    for part in parts:
        assert part.origin == "handoff-1"
        assert part.origin_index == index
        assert part.created_ms == 77
        assert part.on_complete is parent.on_complete
        index += part.record_count
    assert parts[1].origin_index == 10 + parts[0].record_count


def test_split_sequences_continue_and_attempts_kept() -> None:
    parent = make_batch(count=10)
    parent.set_producer_state(555, 2, 1000)
    parent.attempts = 2
    parent.last_attempt_ms = 4321
    parts = parent.split(parent.records_size // 2)
    sequence = 1000
    for part in parts:
        assert (part.producer_id, part.producer_epoch, part.base_sequence) == (555, 2, sequence)
        assert part.attempts == 2 and part.last_attempt_ms == 4321
        decoded = decode(part.wire_pieces(CompressionType.NONE, None))
        assert decoded.base_sequence == sequence and decoded.producer_id == 555
        sequence += part.record_count
    assert parts[-1].last_sequence == parent.last_sequence


def test_split_without_sequence_stays_without() -> None:
    parts = make_batch(count=6).split(1)
    assert [p.record_count for p in parts] == [1] * 6  # at least one record per part
    assert all(not p.has_sequence for p in parts)


def test_split_of_joined_bytes_buffer() -> None:
    specs = record_specs(4)
    parent = ProducerBatch(TopicPartition("t", 1), encode_records(specs, into_memoryview=False), 4,
                           base_timestamp=BASE_TS, max_timestamp=BASE_TS + 21, created_ms=0)
    parts = parent.split(10**6)
    assert len(parts) == 1 and bytes(parts[0].records) == bytes(parent.records)


def test_sequence_wraps() -> None:
    batch = make_batch(count=3)
    batch.set_producer_state(1, 0, 2**31 - 2)
    assert batch.last_sequence == 0
    parts = batch.split(1)
    assert [p.base_sequence for p in parts] == [2**31 - 2, 2**31 - 1, 0]


# -- delivery timeout ----------------------------------------------------------------------------


def test_has_reached_delivery_timeout_boundary() -> None:
    batch = make_batch(created_ms=1000)
    assert not batch.has_reached_delivery_timeout(100, 1099)
    assert batch.has_reached_delivery_timeout(100, 1100)
    assert batch.has_reached_delivery_timeout(100, 5000)


def test_reenqueued_counts_attempts() -> None:
    batch = make_batch(created_ms=0)
    batch.reenqueued(50)
    batch.reenqueued(80)
    assert (batch.attempts, batch.last_attempt_ms, batch.in_retry) == (2, 80, True)


def test_empty_batch_refused() -> None:
    with pytest.raises(ValueError):
        ProducerBatch(TopicPartition("t", 0), b"", 0, base_timestamp=0, max_timestamp=0, created_ms=0)
