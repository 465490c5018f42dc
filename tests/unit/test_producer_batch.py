"""ProducerBatch: final state set once, buffer released once, wire pieces, split."""

from __future__ import annotations

import pytest

from client_stub.contract.records import BATCH_HEADER_SIZE, decode_records
from client_stub.errors import InvalidRecordError, KafkaError, KafkaTimeoutError, for_code
from service.producer import batch as batch_module
from service.producer.batch import FinalState, ProducerBatch, TopicPartition
from service.protocol.compression import CompressionType
from service.protocol.record_batch import NO_SEQUENCE
from tests.support.batches import encode_records
from tests.support.producer_batches import BASE_TS, T0, make_batch, record_specs
from tests.support.record_batches import decode_batch


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


def test_wire_pieces_uncompressed_is_one_copy_of_the_buffer() -> None:
    specs = record_specs(5)
    batch = make_batch(specs=specs, created_ms=5)
    shared = batch.records
    batch.set_producer_state(1234, 3, 40)
    header, payload = batch.wire_pieces(CompressionType.NONE, None)
    assert isinstance(payload, bytes) and payload == bytes(shared) and payload is batch.records
    assert len(header) == BATCH_HEADER_SIZE
    assert batch.size_in_bytes == BATCH_HEADER_SIZE + len(payload)
    # The client rewrites its memory after the CRC: what goes (now and on a retry) is what the CRC covers.
    shared[:] = bytes(len(shared))
    assert batch.wire_pieces(CompressionType.NONE, None)[1] is payload
    batch.set_producer_state(1234, 3, 45)
    header, again = batch.wire_pieces(CompressionType.NONE, None)
    assert again is payload and decode([header, again]).crc_valid
    batch.set_producer_state(1234, 3, 40)
    header, payload = batch.wire_pieces(CompressionType.NONE, None)

    decoded = decode([header, payload])
    assert decoded.crc_valid
    assert decoded.compression is CompressionType.NONE
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (1234, 3, 40)
    assert decoded.record_count == 5 and decoded.last_offset_delta == 4
    assert decoded.base_timestamp == BASE_TS
    assert decoded.max_timestamp == BASE_TS + specs[-1][0]
    assert decoded.batch_length == BATCH_HEADER_SIZE - 12 + len(payload)
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


def test_compression_reads_the_checked_copy() -> None:
    batch = make_batch(count=5)
    shared = batch.records
    batch.read_records()
    shared[:] = bytes(len(shared))  # rewritten by its client after the daemon read it
    decoded = decode(batch.wire_pieces(CompressionType.LZ4, None))
    assert decoded.crc_valid and decoded.record_count == len(decoded.records) == 5


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


# Three records, as a client seals them, that are not three well-formed records.
MALFORMED = [
    pytest.param(bytes(range(200)), id="garbage"),
    pytest.param(encode_records(record_specs(3), into_memoryview=False)[:-1], id="cut-short"),
    pytest.param(encode_records(record_specs(3), into_memoryview=False) + b"\0", id="trailing-byte"),
    pytest.param(encode_records(record_specs(2), into_memoryview=False), id="fewer-than-sealed"),
    pytest.param(encode_records(record_specs(4), into_memoryview=False), id="more-than-sealed"),
]


@pytest.mark.parametrize("records", [
    *MALFORMED,
    # A timestamp delta no header's maxTimestamp can hold, from a base timestamp near the end of int64.
    pytest.param(encode_records([(2**62, None, b"v", []), (0, None, b"w", [])], into_memoryview=False),
                 id="timestamp-out-of-range"),
])
def test_split_of_records_that_do_not_parse_fails_with_corrupt_message(records: bytes) -> None:
    batch = ProducerBatch(T0, memoryview(bytearray(records)), 3, base_timestamp=2**62, max_timestamp=2**62,
                          created_ms=0)
    with pytest.raises(InvalidRecordError) as raised:
        batch.split(1)
    error = raised.value
    assert (error.code, error.name, error.retriable) == (2, "CORRUPT_MESSAGE", False)
    assert str(batch) in error.message
    # Nothing changed: the batch can still fail through its normal path.
    assert batch.records_size == len(records) and batch.final_state is None


@pytest.mark.parametrize("records", MALFORMED)
@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.ZSTD])
def test_records_that_do_not_parse_are_never_in_wire_pieces(records: bytes, compression: CompressionType) -> None:
    batch = ProducerBatch(T0, memoryview(bytearray(records)), 3, base_timestamp=BASE_TS, max_timestamp=BASE_TS,
                          created_ms=0)
    for read in (batch.read_records, lambda: batch.wire_pieces(compression, None)):
        with pytest.raises(InvalidRecordError) as raised:
            read()
        error = raised.value
        assert (error.code, error.name, error.retriable) == (2, "CORRUPT_MESSAGE", False)
        assert str(batch) in error.message and "well-formed" in error.message
        assert not batch.records_read and batch.final_state is None


def test_records_are_read_once() -> None:
    batch = make_batch(count=3)
    batch.read_records()
    copy = batch.records
    assert isinstance(copy, bytes) and batch.records_read
    batch.read_records()
    assert batch.records is copy


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


# -- coalesce ------------------------------------------------------------------------------------


def absolute(batch: ProducerBatch) -> list[tuple[int, bytes | None, bytes | None, list]]:
    """(timestamp, key, value, headers) of each record, as a consumer reads them from the batch on the wire."""
    decoded = decode(batch.wire_pieces(CompressionType.NONE, None))
    assert decoded.crc_valid
    assert [r.offset_delta for r in decoded.records] == list(range(batch.record_count))
    return [(decoded.base_timestamp + r.timestamp_delta, r.key, r.value, r.headers) for r in decoded.records]


def one_record(value: bytes, *, base_timestamp: int = BASE_TS, **kwargs) -> ProducerBatch:
    return make_batch(specs=[(0, None, value, [])], base_timestamp=base_timestamp, **kwargs)


def test_coalesced_batch_holds_the_parts_records_in_order() -> None:
    # Parts from different clients: their own base timestamps, not in order; a record earlier than its
    # batch's base (a timestamp given to send()); a buffer of bytes as well as shared-memory views.
    parts = [
        make_batch(specs=record_specs(4, prefix="a"), base_timestamp=BASE_TS + 50, created_ms=30),
        make_batch(specs=[(-30, b"early", b"v", [(b"h", None)]), *record_specs(2, prefix="b")],
                   base_timestamp=BASE_TS + 40, created_ms=10),
        ProducerBatch(T0, encode_records(record_specs(3, prefix="c"), into_memoryview=False), 3,
                      base_timestamp=BASE_TS + 90, max_timestamp=BASE_TS + 104, created_ms=20),
    ]
    expected = [record for part in parts for record in absolute(part)]
    combined, taken = ProducerBatch.coalesce(parts, 10**6)
    assert taken == 3 and combined is not None
    assert combined.parts == parts and combined.tp == T0
    assert combined.record_count == 10
    assert absolute(combined) == expected
    assert combined.base_timestamp == BASE_TS + 40  # the earliest of the parts' bases
    assert combined.max_timestamp == BASE_TS + 104 == max(ts for ts, *_ in expected)
    assert combined.created_ms == 10
    assert not combined.has_sequence and combined.attempts == 0
    assert not combined.coalescible


def test_coalesce_stops_before_the_part_that_would_not_fit() -> None:
    parts = [make_batch(count=2) for _ in range(6)]
    size = parts[0].records_size
    for limit in (2 * size, 3 * size - 1, 3 * size, 6 * size, 10**6):
        combined, taken = ProducerBatch.coalesce(parts, limit)
        assert taken == min(limit // size, 6)
        assert combined.parts == parts[:taken]
        assert combined.records_size <= limit


def test_coalesce_limit_counts_the_records_as_re_encoded() -> None:
    """Offset deltas from 64 on take two bytes where the clients wrote one: the limit holds for what
    is sent, not for what the clients wrote."""
    parts = [one_record(b"v%03d" % n) for n in range(100)]
    written = sum(p.records_size for p in parts)
    for limit in range(written - 40, written + 1):
        combined, taken = ProducerBatch.coalesce(parts, limit)
        assert combined.records_size <= limit, limit
        # and it stops only when the next part would not fit
        more, _ = ProducerBatch.coalesce(parts[:taken + 1], 10**6)
        assert taken == 100 or more.records_size > limit
        assert absolute(combined) == [r for p in parts[:taken] for r in absolute(p)]


def test_fewer_than_two_parts_is_no_coalesced_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    small = make_batch(count=2)
    full = make_batch(count=10)
    assert ProducerBatch.coalesce([small], 10**6) == (None, 0)
    assert ProducerBatch.coalesce([small, make_batch(count=2)], 2 * small.records_size - 1) == (None, 0)
    # A full batch goes as it is: not even parsed.
    calls = []
    monkeypatch.setattr(batch_module, "rebase_records", lambda *args: calls.append(args))
    assert ProducerBatch.coalesce([full, small, small], full.records_size) == (None, 0)
    assert calls == []
    sent = make_batch(count=2)
    sent.coalescible = False  # it has been sent before
    assert ProducerBatch.coalesce([sent, small], 10**6) == (None, 0)
    assert calls == []


def test_a_part_that_was_sent_ends_the_coalesced_batch() -> None:
    parts = [make_batch(count=2) for _ in range(4)]
    parts[2].coalescible = False
    combined, taken = ProducerBatch.coalesce(parts, 10**6)
    assert taken == 2 and combined.parts == parts[:2]


def malformed_batch() -> ProducerBatch:
    """A batch whose last record is cut short: a broker would refuse it (CORRUPT_MESSAGE)."""
    records = encode_records(record_specs(3), into_memoryview=False)
    return ProducerBatch(T0, records[:-1], 3, base_timestamp=BASE_TS, max_timestamp=BASE_TS, created_ms=0)


def test_a_malformed_part_is_left_out_with_every_part_after_it(caplog: pytest.LogCaptureFixture) -> None:
    good = [make_batch(count=2) for _ in range(4)]
    bad = malformed_batch()
    queue = [good[0], good[1], bad, good[2], good[3]]
    with caplog.at_level("WARNING", logger=batch_module.__name__):
        combined, taken = ProducerBatch.coalesce(queue, 10**6)
    assert taken == 2 and combined.parts == good[:2]
    assert "is not coalesced" in caplog.text
    # It goes alone, and those after it are coalesced without it.
    assert not bad.coalescible
    assert ProducerBatch.coalesce(queue[2:], 10**6) == (None, 0)
    combined, taken = ProducerBatch.coalesce(queue[3:], 10**6)
    assert taken == 2 and combined.parts == good[2:]
    # At the head, with nothing coalescible before it: no coalesced batch either.
    assert ProducerBatch.coalesce([malformed_batch(), *good], 10**6) == (None, 0)


def test_the_base_timestamp_is_a_parts_even_when_an_earlier_one_is_left_out() -> None:
    first = one_record(b"a", base_timestamp=BASE_TS + 100)
    second = one_record(b"b", base_timestamp=BASE_TS + 101)
    earliest_but_too_large = make_batch(count=3, base_timestamp=BASE_TS)
    limit = first.records_size + second.records_size + 2
    combined, taken = ProducerBatch.coalesce([first, second, earliest_but_too_large], limit)
    assert taken == 2
    assert combined.base_timestamp == BASE_TS + 100
    assert combined.max_timestamp == BASE_TS + 101
    assert absolute(combined) == absolute(first) + absolute(second)
    # Left out as malformed, the same.
    late = malformed_batch()
    late.base_timestamp = BASE_TS
    combined, taken = ProducerBatch.coalesce([first, second, late], 10**6)
    assert taken == 2 and combined.base_timestamp == BASE_TS + 100


# -- the outcome of a coalesced batch is its parts' -------------------------------------------------


class PartOutcomes:
    """on_complete and release of each part, by its origin."""

    def __init__(self) -> None:
        self.completed: list[tuple[object, FinalState | None, int, int, KafkaError | None]] = []
        self.released: list[object] = []

    def part(self, origin: object, count: int) -> ProducerBatch:
        return make_batch(count=count, origin=origin, on_complete=self.on_complete,
                          release=lambda: self.released.append(origin))

    def on_complete(self, batch: ProducerBatch) -> None:
        self.completed.append((batch.origin, batch.final_state, batch.base_offset, batch.log_append_time_ms,
                               batch.error))


def coalesced(outcomes: PartOutcomes, counts: tuple[int, ...] = (2, 3, 1)) -> ProducerBatch:
    combined, taken = ProducerBatch.coalesce([outcomes.part(f"p{i}", n) for i, n in enumerate(counts)], 10**6)
    assert taken == len(counts)
    return combined


def test_success_gives_each_part_its_own_base_offset() -> None:
    outcomes = PartOutcomes()
    combined = coalesced(outcomes)
    assert outcomes.released == []  # the parts' buffers are held until the outcome
    assert combined.done(100, 1234, None)
    assert outcomes.completed == [("p0", FinalState.SUCCEEDED, 100, 1234, None),
                                  ("p1", FinalState.SUCCEEDED, 102, 1234, None),
                                  ("p2", FinalState.SUCCEEDED, 105, 1234, None)]
    assert outcomes.released == ["p0", "p1", "p2"]
    # Nothing twice: not on a late answer, nor on an abort.
    assert not combined.done(200, -1, None)
    assert not combined.abort(KafkaError("closing"))
    combined.maybe_release()
    assert len(outcomes.completed) == 3 and len(outcomes.released) == 3


def test_success_without_offsets_gives_none_to_the_parts() -> None:
    outcomes = PartOutcomes()
    assert coalesced(outcomes).done(-1, -1, None)  # acks=0
    assert [offset for _, _, offset, _, _ in outcomes.completed] == [-1, -1, -1]


def test_an_error_fails_every_part_once() -> None:
    outcomes = PartOutcomes()
    combined = coalesced(outcomes)
    error = for_code(87)  # INVALID_RECORD
    assert combined.done(-1, -1, error)
    assert combined.done(-1, -1, KafkaTimeoutError("expired")) is False
    assert outcomes.completed == [(f"p{i}", FinalState.FAILED, -1, -1, error) for i in range(3)]
    assert outcomes.released == ["p0", "p1", "p2"]


def test_an_abort_aborts_every_part_once() -> None:
    outcomes = PartOutcomes()
    combined = coalesced(outcomes)
    closing = KafkaError("closing")
    assert combined.abort(closing)
    assert not combined.done(0, -1, None)
    assert outcomes.completed == [(f"p{i}", FinalState.ABORTED, -1, -1, closing) for i in range(3)]
    assert outcomes.released == ["p0", "p1", "p2"]


def test_parts_are_released_once_final_even_while_the_copy_is_on_the_wire() -> None:
    """The coalesced batch owns copies of the records: the parts' shared memory is not on the wire."""
    outcomes = PartOutcomes()
    combined = coalesced(outcomes)
    combined.wire_pieces(CompressionType.NONE, None)
    combined.in_flight = True
    assert combined.done(-1, -1, KafkaTimeoutError("expired in flight"))
    assert outcomes.released == ["p0", "p1", "p2"]
    combined.in_flight = False
    combined.maybe_release()
    assert outcomes.released == ["p0", "p1", "p2"]


# -- a coalesced batch split back into its parts ---------------------------------------------------


def test_split_of_a_coalesced_batch_gives_back_its_parts_with_its_sequences() -> None:
    outcomes = PartOutcomes()
    combined = coalesced(outcomes, (2, 3, 1, 4))
    combined.set_producer_state(555, 2, 1000)
    combined.attempts = 1
    combined.last_attempt_ms = 4321
    parts = combined.split(combined.records_size // 2)
    assert parts == combined.parts
    assert [p.origin for p in parts] == ["p0", "p1", "p2", "p3"]
    assert [(p.producer_id, p.producer_epoch, p.base_sequence) for p in parts] == [
        (555, 2, 1000), (555, 2, 1002), (555, 2, 1005), (555, 2, 1006)]
    assert parts[-1].last_sequence == combined.last_sequence
    assert all(p.attempts == 1 and p.last_attempt_ms == 4321 for p in parts)
    for part in parts:
        # Each goes as the client wrote it: its own records, offset deltas from 0, its own sequence.
        assert part.wire_pieces(CompressionType.NONE, None)[1] == bytes(part.records)
        assert decode(part.wire_pieces(CompressionType.NONE, None)).base_sequence == part.base_sequence
        assert absolute(part) == [(BASE_TS + ts, k, v, [(hk.decode(), hv) for hk, hv in h])
                                  for ts, k, v, h in record_specs(part.record_count)]
    # never coalesced again: they would be as large as before
    assert ProducerBatch.coalesce(parts, 10**6) == (None, 0)
    assert outcomes.completed == [] and outcomes.released == []


def test_split_of_a_coalesced_batch_without_sequence() -> None:
    combined = coalesced(PartOutcomes())
    parts = combined.split(1)
    assert [p.record_count for p in parts] == [2, 3, 1]
    assert not any(p.has_sequence for p in parts)
    assert ProducerBatch.coalesce(parts, 10**6) == (None, 0)
