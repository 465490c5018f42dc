"""TransactionManager of the idempotent producer, in the scenarios of Java's TransactionManagerTest.

Where Java bumps the epoch, this project takes a new producer id (some brokers refuse an
epoch the client bumped itself): "a new id is required" below is Java's "epoch bump required".
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from client_stub.errors import KafkaError, KafkaTimeoutError, for_code
from service.producer.batch import ProducerBatch, TopicPartition
from service.producer.transaction_manager import (
    INT_MAX,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID,
    State,
    TransactionManager,
    increment_sequence,
)
from service.protocol import messages as m
from tests.support.producer_batches import make_batch

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)

NOT_LEADER_OR_FOLLOWER = 6
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_RECORD = 87


@pytest.fixture
def resets(caplog: pytest.LogCaptureFixture) -> Callable[[], int]:
    """``resets()``: how many times the producer id was dropped for a new one, as the log tells an operator."""
    caplog.set_level(logging.INFO, logger="service.producer.transaction_manager")
    return lambda: sum("taking a new producer id" in record.getMessage() for record in caplog.records)


def init_response(producer_id: int, epoch: int = 0, error: int = 0) -> m.InitProducerIdResponse:
    return m.InitProducerIdResponse(error_code=error, producer_id=producer_id, producer_epoch=epoch)


def new_tm(producer_id: int = 1000, epoch: int = 0) -> TransactionManager:
    tm = TransactionManager()
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(init_response(producer_id, epoch))
    assert tm.state is State.READY
    return tm


def send(tm: TransactionManager, tp: TopicPartition = T0, count: int = 3) -> ProducerBatch:
    """A batch drained for the first time: checked against the drain rules, then numbered."""
    batch = make_batch(tp, count)
    assert not tm.should_stop_drain(batch)
    tm.assign_sequence(batch)
    return batch


def renew_producer_id(tm: TransactionManager, producer_id: int, epoch: int = 0) -> None:
    assert tm.needs_producer_id()
    assert not tm.has_producer_id and tm.state is State.INITIALIZING
    assert not tm.needs_producer_id()  # one request at a time
    tm.handle_init_producer_id(init_response(producer_id, epoch))


# -- producer id ---------------------------------------------------------------------------------


def test_needs_producer_id_once_until_answered() -> None:
    tm = TransactionManager()
    assert not tm.has_producer_id and tm.state is State.UNINITIALIZED
    assert tm.needs_producer_id()
    assert tm.state is State.INITIALIZING
    assert not tm.needs_producer_id()
    request = tm.init_producer_id_request()
    assert request.transactional_id is None and request.transaction_timeout_ms == INT_MAX
    tm.handle_init_producer_id(init_response(5, 1))
    assert tm.has_producer_id and tm.producer_id_and_epoch.producer_id == 5
    assert tm.producer_id_and_epoch.epoch == 1
    assert not tm.needs_producer_id()


def test_init_producer_id_retriable_failure_asks_again() -> None:
    tm = TransactionManager()
    assert tm.needs_producer_id()
    tm.init_producer_id_failed(None, retriable=True)  # no answer (disconnect)
    assert tm.state is State.UNINITIALIZED and not tm.has_fatal_error
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(init_response(-1, -1, error=15))  # COORDINATOR_NOT_AVAILABLE
    assert tm.state is State.UNINITIALIZED and not tm.has_fatal_error
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(init_response(77))
    assert tm.state is State.READY


@pytest.mark.parametrize("code", [CLUSTER_AUTHORIZATION_FAILED, 35, -1])
def test_init_producer_id_fatal_failure(code: int) -> None:
    tm = TransactionManager()
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(init_response(-1, -1, error=code))
    assert tm.has_fatal_error and tm.state is State.FATAL_ERROR
    assert tm.fatal_error is not None and tm.fatal_error.code == code
    assert not tm.needs_producer_id()
    assert tm.should_stop_drain(make_batch(T0))


def test_init_producer_id_failed_fatal_keeps_the_error() -> None:
    tm = TransactionManager()
    tm.needs_producer_id()
    error = KafkaError("InitProducerId is not supported")
    tm.init_producer_id_failed(error, retriable=False)
    assert tm.has_fatal_error and tm.fatal_error is error


def test_no_drain_without_producer_id() -> None:
    tm = TransactionManager()
    assert tm.should_stop_drain(make_batch(T0))
    tm.needs_producer_id()
    assert tm.should_stop_drain(make_batch(T0))


# -- sequences -----------------------------------------------------------------------------------


def test_sequences_per_partition() -> None:
    tm = new_tm(producer_id=11, epoch=2)
    a = send(tm, T0, 3)
    b = send(tm, T0, 5)
    c = send(tm, T1, 4)
    d = send(tm, T0, 1)
    assert [a.base_sequence, b.base_sequence, d.base_sequence] == [0, 3, 8]
    assert c.base_sequence == 0
    assert all((x.producer_id, x.producer_epoch) == (11, 2) for x in (a, b, c, d))
    assert tm.sequence_number(T0) == 9 and tm.sequence_number(T1) == 4
    assert tm.first_in_flight_sequence(T0) == 0 and tm.first_in_flight_sequence(T1) == 0
    assert tm.has_in_flight_batches(T0) and not tm.has_in_flight_batches(TopicPartition("t", 9))


def test_sequence_wraps_at_int_max() -> None:
    assert increment_sequence(INT_MAX, 1) == 0
    assert increment_sequence(INT_MAX - 1, 5) == 3
    tm = new_tm()
    tm.increment_sequence(T0, INT_MAX)
    batch = send(tm, T0, 3)
    assert batch.base_sequence == INT_MAX and batch.last_sequence == 1
    assert tm.sequence_number(T0) == 2


def test_handle_completed_batch_updates_last_acked() -> None:
    tm = new_tm()
    a, b, c = send(tm), send(tm), send(tm)
    assert tm.first_in_flight_sequence(T0) == 0
    tm.handle_completed_batch(b, 103)        # responses may come back out of order
    assert tm._entry(T0).last_acked_sequence == 5
    assert tm.first_in_flight_sequence(T0) == 0
    tm.handle_completed_batch(a, 100)
    assert tm._entry(T0).last_acked_sequence == 5  # never moves back
    assert tm.first_in_flight_sequence(T0) == 6
    tm.handle_completed_batch(c, 106)
    entry = tm._entry(T0)
    assert (entry.last_acked_sequence, entry.last_acked_offset) == (8, 108)
    assert not tm.has_in_flight_batches(T0)
    assert tm.first_in_flight_sequence(T0) == -1


def test_last_acked_and_next_sequence_across_the_wrap() -> None:
    tm = new_tm()
    tm.increment_sequence(T0, INT_MAX - 2)
    before, after, expired = send(tm), send(tm), send(tm)   # ..INT_MAX, then 0..2, 3..5
    tm.handle_completed_batch(before, 0)
    assert tm._entry(T0).last_acked_sequence == INT_MAX
    tm.handle_completed_batch(after, 3)
    assert tm._entry(T0).last_acked_sequence == 2
    tm.handle_completed_batch(before, 0)     # a late duplicate answer does not move it back
    assert tm._entry(T0).last_acked_sequence == 2
    # the batch after the last acknowledged one is the next, past the wrap too
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, expired, retriable=False)
    assert tm.needs_producer_id()


def test_in_flight_batches_in_sequence_order_across_the_wrap() -> None:
    tm = new_tm(producer_id=1)
    entry = tm._entry(T0)
    entry.next_sequence, entry.last_acked_sequence = INT_MAX - 2, INT_MAX - 3
    before, after = send(tm, count=5), send(tm)        # INT_MAX-2..1, then 2..4
    assert tm.first_in_flight_sequence(T0) == before.base_sequence
    assert tm.should_stop_drain(after) and not tm.should_stop_drain(before)
    # renumbered under a new id in the order they were sent
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, before, retriable=False)
    renew_producer_id(tm, 2)
    assert [(b.producer_id, b.base_sequence) for b in (before, after)] == [(2, 0), (2, 5)]


def test_unresolved_resolves_across_the_wrap() -> None:
    tm = new_tm()
    tm.increment_sequence(T0, INT_MAX - 2)
    first, second = send(tm), send(tm)
    expire(tm, first)
    tm.handle_completed_batch(second, 0)
    tm.maybe_resolve_sequences()
    assert not tm.has_unresolved_sequence(T0)
    assert not tm.needs_producer_id()


def test_retried_batch_must_be_first_in_flight() -> None:
    tm = new_tm()
    a, b = send(tm), send(tm)
    assert tm.should_stop_drain(b)           # b comes back for a retry while a is in flight
    assert not tm.should_stop_drain(a)
    tm.handle_completed_batch(a, 0)
    assert not tm.should_stop_drain(b)
    assert not tm.should_stop_drain(make_batch(T0))  # a new batch may follow an in-flight one


# -- can_retry: OUT_OF_ORDER_SEQUENCE_NUMBER -----------------------------------------------------


def test_out_of_order_for_batch_that_is_not_next_retries_without_new_id() -> None:
    tm = new_tm()
    first, second = send(tm), send(tm)
    # the first is being retried (e.g. NOT_LEADER); the broker refuses the second as out of order
    assert tm.can_retry(NOT_LEADER_OR_FOLLOWER, -1, first, retriable=True)
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, -1, second, retriable=False)
    assert not tm.needs_producer_id()
    assert tm.has_producer_id


def test_out_of_order_for_the_next_batch_requires_new_id(resets: Callable[[], int]) -> None:
    tm = new_tm(producer_id=1)
    first, second = send(tm), send(tm)
    tm.handle_completed_batch(first, 0)
    # second is right after the last acknowledged sequence: the broker lost something
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, second, retriable=False)
    assert tm.has_producer_id  # dropped only when the sender asks
    assert tm.needs_producer_id()
    assert not tm.has_producer_id
    assert resets() == 1
    assert tm.should_stop_drain(second)


def test_out_of_order_after_sequence_reset_retries_without_new_id() -> None:
    tm = new_tm()
    batch = send(tm)
    batch.reset_producer_state(1000, 0, 0)
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, batch, retriable=False)
    assert not tm.needs_producer_id()


def test_other_errors_follow_the_table() -> None:
    tm = new_tm()
    batch = send(tm)
    assert tm.can_retry(NOT_LEADER_OR_FOLLOWER, -1, batch, retriable=True)
    assert not tm.can_retry(INVALID_RECORD, -1, batch, retriable=False)
    assert not tm.needs_producer_id()


# -- can_retry: UNKNOWN_PRODUCER_ID --------------------------------------------------------------


def test_unknown_producer_id_without_log_start_offset_just_retries() -> None:
    tm = new_tm()
    batch = send(tm)
    assert tm.can_retry(UNKNOWN_PRODUCER_ID, -1, batch, retriable=False)
    assert not tm.needs_producer_id()


def test_unknown_producer_id_with_log_start_offset_requires_new_id() -> None:
    tm = new_tm(producer_id=1)
    done, batch = send(tm), send(tm)
    tm.handle_completed_batch(done, 10)
    assert tm.can_retry(UNKNOWN_PRODUCER_ID, 500, batch, retriable=False)
    renew_producer_id(tm, 2)
    assert (batch.producer_id, batch.base_sequence, batch.sequence_reset) == (2, 0, True)
    # the other in-flight batches come back with the same error: no further new id
    assert tm.can_retry(UNKNOWN_PRODUCER_ID, 500, batch, retriable=False)
    assert not tm.needs_producer_id()


# -- expiry and unresolved sequences -------------------------------------------------------------


def expire(tm: TransactionManager, batch: ProducerBatch) -> None:
    """What the sender does with a batch past delivery.timeout.ms that was sent."""
    batch.done(-1, -1, KafkaTimeoutError("expired"))
    tm.handle_failed_batch(batch, batch.error, adjust_sequences=False)
    tm.mark_sequence_unresolved(batch)


def test_unresolved_resolved_when_later_batches_succeed() -> None:
    tm = new_tm(producer_id=1)
    first, second = send(tm), send(tm)
    expire(tm, first)
    assert tm.has_unresolved_sequence(T0)
    assert tm.should_stop_drain(make_batch(T0))  # no new batch while the partition is unresolved
    tm.maybe_resolve_sequences()
    assert tm.has_unresolved_sequence(T0)        # second still in flight: wait for it
    tm.handle_completed_batch(second, 3)         # the broker had first, since it took second
    tm.maybe_resolve_sequences()
    assert not tm.has_unresolved_sequence(T0)
    assert not tm.needs_producer_id()
    following = send(tm)
    assert (following.producer_id, following.base_sequence) == (1, 6)


def test_unresolved_without_later_success_requires_new_id(resets: Callable[[], int]) -> None:
    tm = new_tm(producer_id=1)
    first, second = send(tm), send(tm)
    other = send(tm, T1)
    expire(tm, first)
    expire(tm, second)
    tm.maybe_resolve_sequences()
    assert not tm.has_unresolved_sequence(T0)
    renew_producer_id(tm, 2)
    assert resets() == 1
    # t-0 has nothing in flight: its next batch starts at 0 under the new id
    fresh = send(tm, T0)
    assert (fresh.producer_id, fresh.base_sequence) == (2, 0)
    # t-1 still has its batch in flight under id 1: new batches wait for it
    waiting = make_batch(T1)
    assert tm.should_stop_drain(waiting)
    assert other.producer_id == 1
    tm.handle_completed_batch(other, 0)
    assert not tm.should_stop_drain(waiting)
    tm.assign_sequence(waiting)
    assert (waiting.producer_id, waiting.base_sequence) == (2, 0)


def test_out_of_order_right_after_unresolved_requires_new_id() -> None:
    tm = new_tm()
    first, second, third = send(tm), send(tm), send(tm)
    expire(tm, first)
    # third is not right after the expired batch: wait and see whether it resolves
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, third, retriable=False)
    assert not tm.needs_producer_id()
    # second is: there really is a gap
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, second, retriable=False)
    assert tm.needs_producer_id()


def test_unresolved_keeps_the_highest_expired_sequence() -> None:
    """As Java's markSequenceUnresolved (max): expiry order must not move the mark backwards."""
    tm = new_tm()
    first, second, third = send(tm), send(tm), send(tm)
    expire(tm, second)
    expire(tm, first)
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, third, retriable=False)
    assert tm.needs_producer_id()


@pytest.mark.parametrize("expiry_order", [(0, 1), (1, 0)])
def test_unresolved_mark_past_the_sequence_wrap(expiry_order: tuple[int, int]) -> None:
    tm = new_tm()
    tm.increment_sequence(T0, INT_MAX - 3)
    batches = [send(tm), send(tm)]       # INT_MAX-3..INT_MAX-1, then INT_MAX, 0, 1
    third = send(tm)
    assert [b.base_sequence for b in (*batches, third)] == [INT_MAX - 3, INT_MAX, 2]
    for i in expiry_order:
        expire(tm, batches[i])
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, third, retriable=False)
    assert tm.needs_producer_id()


# -- new producer id: renumbering ---------------------------------------------------------------


def test_new_id_renumbers_in_flight_batches_of_the_affected_partition() -> None:
    tm = new_tm(producer_id=1)
    acked = send(tm, T0, 2)
    a, b, c = send(tm, T0, 3), send(tm, T0, 4), send(tm, T0, 5)
    idle_t1 = send(tm, T1, 2)
    busy = send(tm, T1, 2)
    tm.handle_completed_batch(acked, 0)
    tm.handle_completed_batch(idle_t1, 0)
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 2, a, retriable=False)  # a is next: gap
    renew_producer_id(tm, 2, epoch=0)
    assert [(x.producer_id, x.base_sequence, x.sequence_reset) for x in (a, b, c)] == [
        (2, 0, True), (2, 3, True), (2, 7, True)]
    assert tm.sequence_number(T0) == 12
    assert tm.first_in_flight_sequence(T0) == 0
    assert tm._entry(T0).last_acked_sequence == -1
    following = send(tm, T0)
    assert (following.producer_id, following.base_sequence) == (2, 12)
    # t-1 was not affected: its in-flight batch keeps id 1 and sequence 2
    assert (busy.producer_id, busy.base_sequence, busy.sequence_reset) == (1, 2, False)
    assert tm.has_stale_producer_id_and_epoch(T1)


def test_renumbered_batches_complete_under_the_new_id() -> None:
    tm = new_tm(producer_id=1)
    a, b = send(tm), send(tm)
    assert tm.can_retry(OUT_OF_ORDER_SEQUENCE_NUMBER, 0, a, retriable=False)
    renew_producer_id(tm, 2)
    tm.handle_completed_batch(a, 50)
    tm.handle_completed_batch(b, 53)
    assert tm._entry(T0).last_acked_sequence == 5
    assert send(tm).base_sequence == 6


def test_completion_under_a_replaced_id_does_not_move_last_acked() -> None:
    tm = new_tm(producer_id=1)
    old = send(tm, T1)
    gap = send(tm, T0)
    tm.handle_failed_batch(gap, for_code(INVALID_RECORD), adjust_sequences=True)
    renew_producer_id(tm, 2)
    tm.handle_completed_batch(old, 0)
    fresh = send(tm, T1)
    assert (fresh.producer_id, fresh.base_sequence) == (2, 0)
    assert tm._entry(T1).last_acked_sequence == -1


def test_resets_asked_while_a_new_id_is_on_its_way_take_one_new_id(resets: Callable[[], int]) -> None:
    """A partition that breaks while InitProducerId is in flight was sent under the old id too:
    the id on its way serves it; a second InitProducerId would cost a round trip and stall every partition."""
    tm = new_tm(producer_id=1)
    first, second = send(tm, T0), send(tm, T1)
    tm.handle_failed_batch(first, for_code(INVALID_RECORD), adjust_sequences=True)
    assert tm.needs_producer_id()
    tm.handle_failed_batch(second, for_code(INVALID_RECORD), adjust_sequences=True)
    assert not tm.needs_producer_id()
    assert tm.state is State.INITIALIZING
    tm.handle_init_producer_id(init_response(2))
    assert not tm.needs_producer_id()
    assert resets() == 1 and tm.producer_id_and_epoch.producer_id == 2
    assert [(b.producer_id, b.base_sequence) for b in (send(tm, T0), send(tm, T1))] == [(2, 0), (2, 0)]


def test_a_reset_asked_while_waiting_to_send_init_producer_id_is_the_same_reset(
        resets: Callable[[], int]) -> None:
    tm = new_tm(producer_id=1)
    first, second = send(tm, T0), send(tm, T1)
    tm.handle_failed_batch(first, for_code(INVALID_RECORD), adjust_sequences=True)
    assert tm.needs_producer_id()
    tm.init_producer_id_failed(None, retriable=True)  # no broker answered: asked again later
    tm.handle_failed_batch(second, for_code(INVALID_RECORD), adjust_sequences=True)
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(init_response(2))
    assert not tm.needs_producer_id()
    assert resets() == 1


# -- failed batches ------------------------------------------------------------------------------


def test_failed_batch_with_adjust_sequences_requires_new_id() -> None:
    tm = new_tm(producer_id=1)
    failed, after = send(tm), send(tm)
    tm.handle_failed_batch(failed, for_code(INVALID_RECORD), adjust_sequences=True)
    assert tm.first_in_flight_sequence(T0) == 3
    renew_producer_id(tm, 2)
    assert (after.producer_id, after.base_sequence) == (2, 0)


def test_failed_batch_without_adjust_sequences_keeps_the_id() -> None:
    tm = new_tm()
    failed = send(tm)
    tm.handle_failed_batch(failed, KafkaTimeoutError("expired"), adjust_sequences=False)
    assert not tm.has_in_flight_batches(T0)
    assert not tm.needs_producer_id()


@pytest.mark.parametrize("code", [OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID])
def test_final_sequence_error_requires_new_id(code: int) -> None:
    """Java's handleFailedBatch: a batch failed for good with a sequence error leaves the partition's
    sequences broken, whatever adjust_sequences says (retries exhausted)."""
    tm = new_tm(producer_id=1)
    failed, after = send(tm), send(tm)
    tm.handle_failed_batch(failed, for_code(code), adjust_sequences=False)
    renew_producer_id(tm, 2)
    assert (after.producer_id, after.base_sequence) == (2, 0)


def test_cluster_authorization_failed_is_fatal() -> None:
    tm = new_tm()
    batch = send(tm)
    tm.handle_failed_batch(batch, for_code(CLUSTER_AUTHORIZATION_FAILED), adjust_sequences=True)
    assert tm.has_fatal_error and tm.fatal_error.code == CLUSTER_AUTHORIZATION_FAILED
    assert not tm.has_in_flight_batches(T0)
    assert not tm.needs_producer_id()
    assert tm.should_stop_drain(make_batch(T0))
