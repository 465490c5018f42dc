"""RecordAccumulator: ready(), drain(), reenqueue, expiry, with and without idempotence."""

from __future__ import annotations

import random

import pytest

from client_stub.errors import KafkaError, KafkaTimeoutError, for_code
from service.producer.accumulator import FOREVER, RecordAccumulator
from service.producer.batch import ProducerBatch, TopicPartition
from service.producer.transaction_manager import TransactionManager
from service.protocol import messages as m
from tests.support.producer_batches import make_batch, make_cluster, queued

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
T2 = TopicPartition("t", 2)
U0 = TopicPartition("u", 0)


def accumulator(tm: TransactionManager | None = None, *, backoff: int = 100, backoff_max: int = 1000,
                delivery_timeout: int = 120_000, coalesce_bytes: int = 0,
                rng: random.Random | None = None) -> RecordAccumulator:
    return RecordAccumulator(retry_backoff_ms=backoff, retry_backoff_max_ms=backoff_max,
                             delivery_timeout_ms=delivery_timeout, coalesce_bytes=coalesce_bytes,
                             transaction_manager=tm, rng=rng)


def ready_tm(producer_id: int = 1000, epoch: int = 0) -> TransactionManager:
    tm = TransactionManager()
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(m.InitProducerIdResponse(error_code=0, producer_id=producer_id,
                                                        producer_epoch=epoch))
    return tm


def append(acc: RecordAccumulator, tp: TopicPartition, n: int = 1, *, count: int = 3,
           created_ms: int = 0) -> list[ProducerBatch]:
    batches = [make_batch(tp, count, created_ms=created_ms) for _ in range(n)]
    for b in batches:
        acc.append(b)
    return batches


def drain_one(acc: RecordAccumulator, cluster, now: int, max_size: int = 1 << 20) -> list[ProducerBatch]:
    """Everything drained for every node, flattened."""
    drained = acc.drain(cluster, cluster.nodes.values(), max_size, now)
    return [b for batches in drained.values() for b in batches]


# -- ready ---------------------------------------------------------------------------------------


def test_ready_unknown_leader_lists_topic() -> None:
    acc = accumulator()
    append(acc, T0)
    append(acc, U0)
    cluster = make_cluster({T0: None, T1: 1})  # u is not in the metadata at all
    result = acc.ready(cluster, 0)
    assert result.ready_nodes == set()
    assert result.unknown_leader_topics == {"t", "u"}
    assert result.next_ready_check_delay_ms == FOREVER
    assert drain_one(acc, cluster, 0) == []


def test_ready_empty_queue_not_listed() -> None:
    acc = accumulator()
    result = acc.ready(make_cluster({T0: None}), 0)
    assert result.unknown_leader_topics == set() and result.ready_nodes == set()


def test_ready_node_counted_once() -> None:
    acc = accumulator()
    for tp in (T0, T1, T2):
        append(acc, tp)
    cluster = make_cluster({T0: 1, T1: 1, T2: 2})
    result = acc.ready(cluster, 0)
    assert result.ready_nodes == {cluster.nodes[1], cluster.nodes[2]}
    assert result.unknown_leader_topics == set()


def test_retry_backoff_is_exponential_with_jitter_and_capped() -> None:
    """As Java's: retry.backoff.ms doubled per attempt, +-20%, never above retry.backoff.max.ms."""
    cluster = make_cluster({T0: 1})
    attempts = 7
    waits: dict[int, list[int]] = {attempt: [] for attempt in range(1, attempts + 1)}
    for seed in range(20):
        acc = accumulator(backoff=100, backoff_max=1000, rng=random.Random(seed))
        [batch] = append(acc, T0)
        assert drain_one(acc, cluster, 0) == [batch]
        now = 0
        for attempt in range(1, attempts + 1):
            now += 5000
            acc.reenqueue(batch, now)
            assert batch.attempts == attempt
            wait = acc.ready(cluster, now).next_ready_check_delay_ms
            waits[attempt].append(wait)
            assert acc.ready(cluster, now + wait - 1).ready_nodes == set()
            assert drain_one(acc, cluster, now + wait - 1) == []
            assert acc.ready(cluster, now + wait).ready_nodes == {cluster.nodes[1]}
            assert drain_one(acc, cluster, now + wait) == [batch]
    for attempt, seen in waits.items():
        term = min(100 * 2 ** (attempt - 1), 1000)  # the doubling stops at the maximum, then the jitter
        assert all(0.8 * term - 1 <= wait <= min(1.2 * term, 1000) for wait in seen), (attempt, seen)
        assert len(set(seen)) > 1  # jittered
    assert max(waits[attempts]) == 1000  # capped after the jitter


def test_retry_backoff_is_drawn_once_per_attempt() -> None:
    """ready() and drain() agree on when a retried batch may go: else ready() could name a node for
    a batch that drain() then holds back, and the sender would sleep past its time."""
    acc = accumulator(backoff=100, backoff_max=1000)
    cluster = make_cluster({T0: 1})
    [batch] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [batch]
    acc.reenqueue(batch, 1000)
    ready_at = 1000 + acc.ready(cluster, 1000).next_ready_check_delay_ms
    for now in range(1000, ready_at):  # across the whole jitter window
        assert acc.ready(cluster, now).next_ready_check_delay_ms == ready_at - now
    assert drain_one(acc, cluster, ready_at - 1) == []
    assert acc.ready(cluster, ready_at).ready_nodes == {cluster.nodes[1]}
    assert drain_one(acc, cluster, ready_at) == [batch]


def test_retry_backoff_max_at_the_backoff_is_constant() -> None:
    """retry.backoff.max.ms no greater than retry.backoff.ms: no doubling, no jitter (Java's rule)."""
    acc = accumulator(backoff=100, backoff_max=50)
    cluster = make_cluster({T0: 1})
    [batch] = append(acc, T0)
    for attempt in range(1, 6):
        assert drain_one(acc, cluster, attempt * 1000) == [batch]
        acc.reenqueue(batch, attempt * 1000)
        assert acc.ready(cluster, attempt * 1000).next_ready_check_delay_ms == 100


def test_ready_next_check_delay_is_the_smallest_wait() -> None:
    acc = accumulator(backoff=100, backoff_max=100)  # a constant backoff: no jitter
    cluster = make_cluster({T0: 1, T1: 2})
    [a] = append(acc, T0)
    [b] = append(acc, T1)
    assert len(drain_one(acc, cluster, 0)) == 2
    acc.reenqueue(a, 1000)      # ready at 1100
    acc.reenqueue(b, 1040)      # ready at 1140
    assert acc.ready(cluster, 1010).next_ready_check_delay_ms == 90
    result = acc.ready(cluster, 1100)
    assert result.ready_nodes == {cluster.nodes[1]}
    assert result.next_ready_check_delay_ms == 40


def test_ready_backing_off_partition_does_not_hide_a_ready_one_on_the_same_node() -> None:
    acc = accumulator(backoff=100)
    cluster = make_cluster({T0: 1, T1: 1})
    [a] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [a]
    acc.reenqueue(a, 10)
    [b] = append(acc, T1)
    assert acc.ready(cluster, 20).ready_nodes == {cluster.nodes[1]}
    assert drain_one(acc, cluster, 20) == [b]


def test_muted_partition_skipped() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1, T1: 2})
    append(acc, T0)
    [b] = append(acc, T1)
    acc.mute(T0)
    result = acc.ready(cluster, 0)
    assert result.ready_nodes == {cluster.nodes[2]}
    assert result.next_ready_check_delay_ms == FOREVER
    assert drain_one(acc, cluster, 0) == [b]
    assert acc.drain(cluster, [cluster.nodes[1]], 1 << 20, 0) == {}
    acc.unmute(T0)
    assert acc.ready(cluster, 0).ready_nodes == {cluster.nodes[1]}
    assert len(drain_one(acc, cluster, 0)) == 1


# -- drain ---------------------------------------------------------------------------------------


def test_drain_one_batch_per_partition_per_request() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1, T1: 1})
    queued0 = append(acc, T0, 3)
    queued1 = append(acc, T1, 2)
    drained = acc.drain(cluster, [cluster.nodes[1]], 1 << 20, 0)
    assert list(drained) == [1]
    assert sorted(drained[1], key=lambda b: b.tp) == [queued0[0], queued1[0]]
    assert {b.drained_ms for b in drained[1]} == {0}
    second = drain_one(acc, cluster, 5)
    assert sorted(second, key=lambda b: b.tp) == [queued0[1], queued1[1]]
    assert drain_one(acc, cluster, 6) == [queued0[2]]
    assert drain_one(acc, cluster, 7) == []
    assert acc.queued_batches() == 0


def test_drain_groups_by_leader_and_only_for_the_given_nodes() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1, T1: 2, T2: 2})
    [a] = append(acc, T0)
    [b] = append(acc, T1)
    [c] = append(acc, T2)
    drained = acc.drain(cluster, [cluster.nodes[2]], 1 << 20, 0)
    assert list(drained) == [2] and set(drained[2]) == {b, c}
    assert queued(acc, T0) == [a]


def test_drain_respects_max_size() -> None:
    acc = accumulator()
    tps = [TopicPartition("t", p) for p in range(5)]
    cluster = make_cluster({tp: 1 for tp in tps})
    for tp in tps:
        append(acc, tp)
    size = queued(acc, tps[0])[0].size_in_bytes
    assert all(queued(acc, tp)[0].size_in_bytes == size for tp in tps)
    drained = drain_one(acc, cluster, 0, max_size=2 * size + size // 2)
    assert len(drained) == 2
    assert sum(b.size_in_bytes for b in drained) <= 2 * size + size // 2
    drained = drain_one(acc, cluster, 0, max_size=3 * size)  # exactly three fit
    assert len(drained) == 3


def test_oversized_batch_goes_alone() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1, T1: 1})
    [big] = append(acc, T0, count=50)
    [small] = append(acc, T1, count=1)
    drained = drain_one(acc, cluster, 0, max_size=big.size_in_bytes // 2)
    assert len(drained) == 1
    # whichever went first, the other waits for the next request
    rest = drain_one(acc, cluster, 0, max_size=big.size_in_bytes // 2)
    assert {drained[0], *rest} == {big, small} and len(rest) == 1


def test_drain_rotation_serves_every_partition() -> None:
    """With room for 2 of 7 partitions per request, every partition goes within ceil(7/2) drains,
    and over several rounds all partitions are served equally often."""
    acc = accumulator()
    tps = [TopicPartition("t", p) for p in range(7)]
    cluster = make_cluster({tp: 1 for tp in tps})
    for tp in tps:
        append(acc, tp, 40, count=2)
    size = queued(acc, tps[0])[0].size_in_bytes
    served: dict[TopicPartition, int] = dict.fromkeys(tps, 0)
    first_round: set[TopicPartition] = set()
    for i in range(4):
        drained = drain_one(acc, cluster, i, max_size=2 * size)
        assert len(drained) == 2
        first_round |= {b.tp for b in drained}
    assert first_round == set(tps)
    for i in range(4, 7 * 4):
        drain_one(acc, cluster, i, max_size=2 * size)
    served = {tp: 40 - len(queued(acc, tp)) for tp in tps}
    assert set(served.values()) == {8}  # 28 drains x 2 batches over 7 partitions


def test_drain_rotation_survives_partitions_running_empty() -> None:
    """Partitions that empty out must not make the rotation skip the ones after them."""
    acc = accumulator()
    tps = [TopicPartition("t", p) for p in range(6)]
    cluster = make_cluster({tp: 1 for tp in tps})
    for tp in tps[:3]:
        append(acc, tp, 1, count=2)   # one batch each: they empty after being drained
    for tp in tps[3:]:
        append(acc, tp, 10, count=2)
    size = queued(acc, tps[0])[0].size_in_bytes
    order = []
    for i in range(6):
        order.append(sorted(b.tp.partition for b in drain_one(acc, cluster, i, max_size=2 * size)))
    assert order[0] == [0, 1]
    assert order[1] == [2, 3]
    assert order[2] == [4, 5]
    # with only 3, 4 and 5 left, they keep taking turns
    counts = {p: 10 - len(queued(acc, TopicPartition("t", p))) for p in (3, 4, 5)}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_drain_skips_backing_off_and_muted_partitions_without_stopping() -> None:
    acc = accumulator(backoff=100)
    cluster = make_cluster({T0: 1, T1: 1, T2: 1})
    [a] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [a]
    acc.reenqueue(a, 0)
    acc.mute(T1)
    append(acc, T1)
    [c] = append(acc, T2)
    assert drain_one(acc, cluster, 50) == [c]


# -- reenqueue -----------------------------------------------------------------------------------


def test_reenqueue_puts_batch_at_head() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1})
    first, second = append(acc, T0, 2)
    assert drain_one(acc, cluster, 0) == [first]
    acc.reenqueue(first, 10)
    assert queued(acc, T0) == [first, second]
    assert (first.attempts, first.last_attempt_ms, first.in_retry) == (1, 10, True)


def test_reenqueue_in_sequence_order_with_idempotence() -> None:
    tm = ready_tm()
    acc = accumulator(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    retried = []
    for _ in range(5):
        append(acc, T0)
        [batch] = acc.drain(cluster, [cluster.nodes[1]], 1 << 20, 0)[1]
        retried.append(batch)
    assert [b.base_sequence for b in retried] == [0, 3, 6, 9, 12]
    rng = random.Random(7)
    for _ in range(5):
        # a queue of new batches (no sequence yet) gets the retried ones back in any order
        queue = accumulator(tm)
        fresh = append(queue, T0, 2)
        shuffled = retried[:]
        rng.shuffle(shuffled)
        for b in shuffled:
            queue.reenqueue(b, 100)
        assert queued(queue, T0) == retried + fresh


def test_reenqueue_in_sequence_order_across_the_wrap() -> None:
    """Sequences wrap from 2**31-1 to 0: the batch before the wrap goes first, else the one after
    it is refused as out of order again and again while the first never goes."""
    tm = ready_tm()
    entry = tm._entry(T0)
    entry.next_sequence, entry.last_acked_sequence = 2**31 - 3, 2**31 - 4
    acc = accumulator(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    before, after = append(acc, T0, 2, count=5)
    assert drain_one(acc, cluster, 0) == [before]
    assert drain_one(acc, cluster, 0) == [after]
    assert (before.base_sequence, after.base_sequence) == (2**31 - 3, 2)
    assert tm.first_in_flight_sequence(T0) == before.base_sequence
    acc.reenqueue(after, 1)
    acc.reenqueue(before, 1)
    assert queued(acc, T0) == [before, after]
    assert drain_one(acc, cluster, 2) == [before]
    assert drain_one(acc, cluster, 2) == []  # a retried batch goes when it is the first in flight
    tm.handle_completed_batch(before, 0)
    assert drain_one(acc, cluster, 3) == [after]


def test_reenqueue_without_sequence_goes_to_head_even_with_idempotence() -> None:
    tm = ready_tm()
    acc = accumulator(tm)
    first = make_batch(T0)
    [second] = append(acc, T0)
    acc.reenqueue(first, 0)
    assert queued(acc, T0) == [first, second]


def test_split_and_reenqueue_in_place_of_the_batch() -> None:
    tm = ready_tm()
    released = []
    acc = accumulator(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    big = make_batch(T0, 8, release=lambda: released.append(1))
    acc.append(big)
    later = append(acc, T0)
    [sent] = drain_one(acc, cluster, 0)
    assert sent is big and big.base_sequence == 0
    tm.handle_failed_batch(big, for_code(10), adjust_sequences=False)
    count = acc.split_and_reenqueue(big, big.records_size // 2, 50)
    assert count >= 2
    parts = queued(acc, T0)[:count]
    assert queued(acc, T0)[count:] == later
    assert [p.base_sequence for p in parts] == [0, *[sum(q.record_count for q in parts[:i]) for i in range(1, count)]]
    assert all(p.last_attempt_ms == 50 for p in parts)
    assert big not in acc.incomplete and set(parts) <= acc.incomplete
    assert released == [1]
    assert tm.first_in_flight_sequence(T0) == 0
    # the parts go one per request, in sequence order
    for part in parts:
        assert tm.first_in_flight_sequence(T0) == part.base_sequence
        assert drain_one(acc, cluster, 60) == [part]
        tm.handle_completed_batch(part, 0)
    assert not tm.has_in_flight_batches(T0)
    assert drain_one(acc, cluster, 61) == later
    assert later[0].base_sequence == 8


def test_split_and_reenqueue_without_idempotence() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1})
    [big] = append(acc, T0, count=6)
    [later] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [big]
    count = acc.split_and_reenqueue(big, 1, 20)
    assert count == 6
    parts = queued(acc, T0)
    assert len(parts) == 7 and parts[-1] is later
    assert [p.origin_index for p in parts[:-1]] == list(range(6))
    assert not any(p.has_sequence for p in parts)
    assert acc.queued_batches() == 7


# -- expiry --------------------------------------------------------------------------------------


def test_expired_batches_removed_in_order() -> None:
    acc = accumulator(delivery_timeout=100)
    a = make_batch(T0, created_ms=0)
    b = make_batch(T0, created_ms=10)
    c = make_batch(T0, created_ms=20)
    d = make_batch(T1, created_ms=5)
    e = make_batch(T1, created_ms=50)
    for batch in (a, b, c, d, e):
        acc.append(batch)
    assert acc.next_batch_expiry_ms == 100
    assert acc.expired_batches(99) == []
    assert acc.next_batch_expiry_ms == 100
    expired = acc.expired_batches(112)
    assert expired == [a, b, d]
    assert queued(acc, T0) == [c] and queued(acc, T1) == [e]
    assert acc.next_batch_expiry_ms == 120
    assert acc.expired_batches(200) == [c, e]
    assert acc.next_batch_expiry_ms == FOREVER
    assert acc.queued_batches() == 0
    assert acc.incomplete == {a, b, c, d, e}  # the sender completes them


def test_expiry_looks_past_a_younger_head() -> None:
    """Batches of one partition come from several clients, each with its own age: a queue is not in
    creation order, and an old batch behind a young one must expire on time."""
    acc = accumulator(delivery_timeout=100)
    young = make_batch(T0, created_ms=50)
    old = make_batch(T0, created_ms=0)
    newest = make_batch(T0, created_ms=60)
    for batch in (young, old, newest):
        acc.append(batch)
    assert acc.next_batch_expiry_ms == 100
    assert acc.expired_batches(100) == [old]
    assert queued(acc, T0) == [young, newest]
    assert acc.next_batch_expiry_ms == 150
    assert acc.expired_batches(160) == [young, newest]


def test_expiry_bound_follows_batches_put_back() -> None:
    """The next-expiry bound lets most iterations skip the scan; a batch back from flight must lower it."""
    acc = accumulator(delivery_timeout=100, backoff=0)
    cluster = make_cluster({T0: 1})
    old = make_batch(T0, created_ms=0)
    acc.append(old)
    assert drain_one(acc, cluster, 10) == [old]
    [young] = append(acc, T0, created_ms=40)
    assert acc.expired_batches(100) == []
    assert acc.next_batch_expiry_ms == 140
    acc.reenqueue(old, 110)
    assert acc.next_batch_expiry_ms == 100
    assert acc.expired_batches(110) == [old]
    parent = make_batch(T0, count=4, created_ms=5)
    acc.append(parent)
    assert drain_one(acc, cluster, 111) == [young]
    assert drain_one(acc, cluster, 111) == [parent]
    assert acc.expired_batches(112) == []
    assert acc.next_batch_expiry_ms == FOREVER
    assert acc.split_and_reenqueue(parent, parent.records_size // 2, 112) > 1
    parts = queued(acc, T0)
    assert acc.next_batch_expiry_ms == 105
    assert acc.expired_batches(105) == parts


def test_queued_by_leader() -> None:
    acc = accumulator()
    append(acc, T0, 2)
    append(acc, T1, 3)
    append(acc, T2)
    append(acc, U0)
    cluster = make_cluster({T0: 1, T1: 2, T2: 1, U0: None})
    assert acc.queued_by_leader(cluster) == {1: 3, 2: 3}
    drain_one(acc, cluster, 0)
    assert acc.queued_by_leader(cluster) == {1: 1, 2: 2}


def test_abort_undrained() -> None:
    acc = accumulator()
    batches = append(acc, T0, 2) + append(acc, T1)
    assert acc.abort_undrained(KafkaError("closing")) == 3
    assert all(b.is_done for b in batches) and not acc.has_incomplete()


def test_completion_bookkeeping() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1})
    [batch] = append(acc, T0)
    assert acc.has_incomplete() and acc.queued_batches() > 0
    assert drain_one(acc, cluster, 0) == [batch]
    assert acc.has_incomplete() and acc.queued_batches() == 0  # in flight is still incomplete
    acc.completed(batch)
    assert not acc.has_incomplete()


def test_closed_accumulator_refuses_batches() -> None:
    acc = accumulator()
    acc.close()
    with pytest.raises(RuntimeError):
        append(acc, T0)


# -- idempotence: sequences and Java's drain rules -----------------------------------------------


def test_drain_assigns_sequences_and_producer_state() -> None:
    tm = ready_tm(producer_id=4242, epoch=3)
    acc = accumulator(tm)
    cluster = make_cluster({T0: 1, T1: 1})
    batches = append(acc, T0, 3, count=4) + append(acc, T1, 1, count=2)
    drained = []
    for now in range(3):
        drained += drain_one(acc, cluster, now)
    t0 = [b for b in drained if b.tp == T0]
    assert t0 == batches[:3]
    assert [b.base_sequence for b in t0] == [0, 4, 8]
    assert all((b.producer_id, b.producer_epoch) == (4242, 3) for b in drained)
    assert batches[3].base_sequence == 0
    assert tm.sequence_number(T0) == 12 and tm.sequence_number(T1) == 2
    assert tm.first_in_flight_sequence(T0) == 0


def test_drain_waits_for_a_producer_id() -> None:
    tm = TransactionManager()
    acc = accumulator(tm)
    cluster = make_cluster({T0: 1})
    [batch] = append(acc, T0)
    assert acc.ready(cluster, 0).ready_nodes == {cluster.nodes[1]}
    assert drain_one(acc, cluster, 0) == []
    assert tm.needs_producer_id()
    assert drain_one(acc, cluster, 0) == []  # still initializing
    tm.handle_init_producer_id(m.InitProducerIdResponse(error_code=0, producer_id=9, producer_epoch=0))
    assert drain_one(acc, cluster, 1) == [batch]
    assert (batch.producer_id, batch.base_sequence) == (9, 0)


def test_drain_stops_for_unresolved_partition_only() -> None:
    tm = ready_tm()
    acc = accumulator(tm)
    cluster = make_cluster({T0: 1, T1: 1})
    [expired] = append(acc, T0)
    [sent] = drain_one(acc, cluster, 0)
    assert sent is expired
    tm.handle_failed_batch(expired, KafkaTimeoutError("expired"),
                           adjust_sequences=False)
    tm.mark_sequence_unresolved(expired)
    [waiting] = append(acc, T0)
    [other] = append(acc, T1)
    assert drain_one(acc, cluster, 1) == [other]
    assert queued(acc, T0) == [waiting]
    assert not waiting.has_sequence


def test_drain_stops_new_batches_while_stale_id_in_flight() -> None:
    tm = ready_tm(producer_id=1)
    acc = accumulator(tm)
    cluster = make_cluster({T0: 1, T1: 1})
    [old] = append(acc, T1)
    assert drain_one(acc, cluster, 0) == [old]
    # another partition loses its sequences: a new producer id is taken
    [gap] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [gap]
    tm.handle_failed_batch(gap, for_code(87), adjust_sequences=True)
    assert tm.needs_producer_id()
    tm.handle_init_producer_id(m.InitProducerIdResponse(error_code=0, producer_id=2, producer_epoch=0))
    [new_t1] = append(acc, T1)
    [new_t0] = append(acc, T0)
    # t-1 still has a batch in flight under producer id 1: its new batch waits; t-0 starts over under 2
    assert drain_one(acc, cluster, 1) == [new_t0]
    assert (new_t0.producer_id, new_t0.base_sequence) == (2, 0)
    tm.handle_completed_batch(old, 0)
    assert drain_one(acc, cluster, 2) == [new_t1]
    assert (new_t1.producer_id, new_t1.base_sequence) == (2, 0)


def test_retried_batch_goes_only_when_first_in_flight() -> None:
    tm = ready_tm()
    acc = accumulator(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    batches = append(acc, T0, 3)
    sent = []
    for now in range(3):
        sent += drain_one(acc, cluster, now)
    assert sent == batches and [b.base_sequence for b in sent] == [0, 3, 6]
    # the second failed and comes back first; the first is still in flight
    acc.reenqueue(batches[1], 10)
    [fresh] = append(acc, T0)
    assert drain_one(acc, cluster, 10) == []
    assert queued(acc, T0) == [batches[1], fresh]
    tm.handle_completed_batch(batches[0], 0)
    assert drain_one(acc, cluster, 11) == [batches[1]]
    # the new batch waits behind it (one per partition per request), then takes the next sequence
    tm.handle_completed_batch(batches[1], 3)
    tm.handle_completed_batch(batches[2], 6)
    assert drain_one(acc, cluster, 12) == [fresh]
    assert fresh.base_sequence == 9


# -- coalescing: the small batches of a partition drained as one -----------------------------------

BATCH_SIZE = 16384


def coalescing(tm: TransactionManager | None = None, **kwargs) -> RecordAccumulator:
    return accumulator(tm, coalesce_bytes=BATCH_SIZE, **kwargs)


def settle(acc: RecordAccumulator, batch: ProducerBatch, base_offset: int,
           tm: TransactionManager | None = None) -> None:
    """What the sender does with a success."""
    if tm is not None:
        tm.handle_completed_batch(batch, base_offset)
    acc.completed(batch)
    assert batch.done(base_offset, -1, None)


def test_small_batches_of_a_partition_are_drained_as_one() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1})
    small = append(acc, T0, 5, count=2)
    [sent] = drain_one(acc, cluster, 0)
    assert sent.parts == small and sent.record_count == 10
    assert acc.queued_batches() == 0
    assert acc.incomplete == {sent}
    settle(acc, sent, 40)
    assert not acc.has_incomplete()
    assert [b.base_offset for b in small] == [40, 42, 44, 46, 48]


def test_without_coalesce_bytes_each_batch_goes_alone() -> None:
    acc = accumulator()
    cluster = make_cluster({T0: 1})
    small = append(acc, T0, 3, count=2)
    assert [drain_one(acc, cluster, now) for now in range(4)] == [[small[0]], [small[1]], [small[2]], []]


def test_a_full_batch_goes_as_it_is() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1})
    [a, b] = append(acc, T0, 2, count=1)
    full = make_batch(T0, specs=[(0, None, b"x" * (BATCH_SIZE - 20), [])])
    assert BATCH_SIZE - 20 < full.records_size <= BATCH_SIZE
    acc.append(full)
    [c, d] = append(acc, T0, 2, count=1)
    drained = [drain_one(acc, cluster, now) for now in range(4)]
    assert [batch.parts for [batch] in drained[:3]] == [[a, b], [], [c, d]]
    assert drained[1] == [full] and drained[3] == []


def test_coalesced_batches_hold_at_most_coalesce_bytes_of_records() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1})
    small = append(acc, T0, 200, count=4)
    drained = []
    while acc.queued_batches():
        drained += drain_one(acc, cluster, 0)
    assert all(b.records_size <= BATCH_SIZE for b in drained)
    assert [p for b in drained for p in b.parts] == small
    assert len(drained) == -(-sum(b.records_size for b in drained) // BATCH_SIZE)  # as few as fit


def test_coalesced_batches_fit_in_a_request() -> None:
    """batch.size may be larger than max.request.size: a coalesced batch must still fit in a request."""
    acc = accumulator(coalesce_bytes=1 << 20)
    cluster = make_cluster({T0: 1})
    small = append(acc, T0, 100, count=2)
    max_size = 10 * small[0].size_in_bytes
    drained = []
    while acc.queued_batches():
        [batch] = drain_one(acc, cluster, 0, max_size=max_size)
        assert batch.size_in_bytes <= max_size
        drained.append(batch)
    assert [p for b in drained for p in b.parts] == small


def test_one_batch_per_partition_per_request_still_holds() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1, T1: 1, T2: 1})
    t0 = append(acc, T0, 5)
    t1 = append(acc, T1, 3)
    [t2] = append(acc, T2)
    drained = acc.drain(cluster, [cluster.nodes[1]], 1 << 20, 0)[1]
    assert sorted(b.tp for b in drained) == [T0, T1, T2]
    by_tp = {b.tp: b for b in drained}
    assert by_tp[T0].parts == t0 and by_tp[T1].parts == t1 and by_tp[T2] is t2
    assert acc.queued_batches() == 0


def left_for_the_next_request(acc: RecordAccumulator, cluster) -> tuple[list[ProducerBatch], int]:
    """Small batches of t-0 coalesced, then left queued: the request was full with t-1's large batch.
    Returns them and the max_size of the drains."""
    [big] = append(acc, T1, count=50)
    max_size = big.size_in_bytes + 10
    assert drain_one(acc, cluster, 0, max_size=max_size) == [big]  # the next drain starts at t-1
    append(acc, T1, count=50)
    small = append(acc, T0, 3)
    assert [b.tp for b in drain_one(acc, cluster, 0, max_size=max_size)] == [T1]
    [coalesced] = queued(acc, T0)
    assert coalesced.parts == small
    return small, max_size


def test_a_coalesced_batch_left_for_the_next_request_takes_no_more_parts() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1, T1: 1})
    small, max_size = left_for_the_next_request(acc, cluster)
    later = append(acc, T0, 2)
    assert [b.parts for b in drain_one(acc, cluster, 1, max_size=max_size)] == [small]
    assert [b.parts for b in drain_one(acc, cluster, 1, max_size=max_size)] == [later]
    assert acc.queued_batches() == 0


def test_queued_coalesced_batch_is_aborted_with_its_parts() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1, T1: 1})
    small, _ = left_for_the_next_request(acc, cluster)
    [coalesced] = queued(acc, T0)
    assert acc.abort_undrained(KafkaError("closing")) == 1
    assert coalesced.is_done
    assert all(b.is_done and str(b.error) == "closing" for b in small)
    assert coalesced not in acc.incomplete and not set(small) & acc.incomplete


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_retried_batch_is_never_coalesced(idempotent: bool) -> None:
    tm = ready_tm() if idempotent else None
    acc = coalescing(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    [first] = append(acc, T0)
    assert drain_one(acc, cluster, 0) == [first]
    acc.reenqueue(first, 10)
    fresh = append(acc, T0, 3)
    assert drain_one(acc, cluster, 10) == [first]
    [sent] = drain_one(acc, cluster, 11)
    assert sent.parts == fresh
    if idempotent:
        assert (first.base_sequence, sent.base_sequence) == (0, 3)


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("coalesce", [True, False])
def test_a_malformed_batch_leaves_its_queue_unsent_and_spends_no_sequence(idempotent: bool, coalesce: bool) -> None:
    tm = ready_tm() if idempotent else None
    acc = coalescing(tm) if coalesce else accumulator(tm)
    cluster = make_cluster({T0: 1})
    good = append(acc, T0, 2)
    records = make_batch(T0).records
    bad = ProducerBatch(T0, records[:-1], 3, base_timestamp=0, max_timestamp=0, created_ms=0)
    acc.append(bad)
    later = append(acc, T0, 2)
    drains: list[list[ProducerBatch]] = []
    corrupt = []
    while acc.queued_batches():
        drains.append(drain_one(acc, cluster, 0))
        corrupt += acc.corrupt_batches
    # Not coalesced with its neighbours, and, its records read before it takes a sequence, not drained: the
    # next batch takes its place in the same drain.
    assert all(len(batches) == 1 for batches in drains)
    sent = [b for [b] in drains]
    assert [b.parts or [b] for b in sent] == ([good, later] if coalesce else [[b] for b in good + later])
    [(batch, error)] = corrupt
    assert batch is bad and not bad.has_sequence and not bad.is_done  # the sender fails it
    assert (error.name, error.retriable) == ("CORRUPT_MESSAGE", False) and str(bad) in error.message
    if idempotent:
        assert [b.base_sequence for b in sent] == ([0, 6] if coalesce else [0, 3, 6, 9])



def test_a_coalesced_batch_takes_the_sequences_of_its_records() -> None:
    tm = ready_tm(producer_id=77, epoch=1)
    acc = coalescing(tm)
    cluster = make_cluster({T0: 1})
    first = append(acc, T0, 4)
    [a] = drain_one(acc, cluster, 0)
    second = append(acc, T0, 2, count=5)
    [b] = drain_one(acc, cluster, 1)  # with idempotence, up to five in flight
    assert (a.parts, b.parts) == (first, second)
    assert [(x.producer_id, x.producer_epoch, x.base_sequence) for x in (a, b)] == [(77, 1, 0), (77, 1, 12)]
    assert not any(p.has_sequence for p in first + second)
    assert tm.sequence_number(T0) == 22 and tm.first_in_flight_sequence(T0) == 0
    settle(acc, a, 0, tm)
    settle(acc, b, 12, tm)
    assert not tm.has_in_flight_batches(T0) and not acc.has_incomplete()
    assert [p.base_offset for p in first + second] == [0, 3, 6, 9, 12, 17]


def test_parts_of_a_split_coalesced_batch_keep_its_sequences_and_go_alone_in_order() -> None:
    """MESSAGE_TOO_LARGE for a coalesced batch: its parts go one by one under its sequences, never
    coalesced again, and only then the batches queued after them."""
    tm = ready_tm()
    acc = coalescing(tm, backoff=0)
    cluster = make_cluster({T0: 1})
    parts = [make_batch(T0, n) for n in (2, 3, 1, 4)]
    for part in parts:
        acc.append(part)
    [combined] = drain_one(acc, cluster, 0)
    assert combined.parts == parts and combined.base_sequence == 0
    later = append(acc, T0, 2)
    # what the sender does on MESSAGE_TOO_LARGE
    tm.handle_failed_batch(combined, for_code(10), adjust_sequences=False)
    assert acc.split_and_reenqueue(combined, combined.records_size // 2, 50) == 4
    assert queued(acc, T0) == parts + later
    assert [p.base_sequence for p in parts] == [0, 2, 5, 6]
    assert combined not in acc.incomplete and set(parts) | set(later) == acc.incomplete
    offset = 100
    for part in parts[:-1]:
        assert drain_one(acc, cluster, 60) == [part]
        assert drain_one(acc, cluster, 60) == []  # the next part waits for this one's outcome
        settle(acc, part, offset, tm)
        offset += part.record_count
    assert drain_one(acc, cluster, 60) == [parts[-1]]
    # New batches need not wait: their sequences come after the parts'.
    [rest] = drain_one(acc, cluster, 61)
    assert rest.parts == later and rest.base_sequence == 10
    settle(acc, parts[-1], offset, tm)
    settle(acc, rest, offset + parts[-1].record_count, tm)
    assert not acc.has_incomplete()
    assert [p.base_offset for p in parts + later] == [100, 102, 105, 106, 110, 113]


def test_parts_of_a_split_coalesced_batch_go_alone_without_idempotence() -> None:
    acc = coalescing()
    cluster = make_cluster({T0: 1})
    parts = append(acc, T0, 3)
    [combined] = drain_one(acc, cluster, 0)
    later = append(acc, T0, 2)
    assert acc.split_and_reenqueue(combined, combined.records_size // 2, 50) == 3
    assert queued(acc, T0) == parts + later
    assert [drain_one(acc, cluster, 60) for _ in parts] == [[p] for p in parts]
    [rest] = drain_one(acc, cluster, 60)
    assert rest.parts == later


def test_a_batch_at_its_delivery_timeout_is_not_coalesced_with_younger_ones() -> None:
    """The sender drains, then expires what is past delivery.timeout.ms, in flight too: a batch that
    reaches its timeout as it is drained would take the younger batches coalesced with it along."""
    acc = coalescing(delivery_timeout=100)
    cluster = make_cluster({T0: 1})
    [old] = append(acc, T0, created_ms=0)
    young = append(acc, T0, 2, created_ms=90)
    [later_old] = append(acc, T0, created_ms=0)
    assert drain_one(acc, cluster, 100) == [old]
    [sent] = drain_one(acc, cluster, 100)
    assert sent.parts == young and sent.created_ms == 90
    assert drain_one(acc, cluster, 100) == [later_old]
