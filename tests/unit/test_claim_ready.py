"""claim_ready and seal_claimed: the daemon's claims of the batches a client publishes in its segment's control
area, and the seal of each batch claimed.

Every test runs against both twins (``fastpath``), the C extension ``service._fastpath`` and its pure-Python
twin ``service._fastpath_py``; the last ones give both the same segments, whatever a client wrote in them, and
check that they claim and seal the same batches, answer the same and leave the same words behind, and that a
batch is sealed exactly when the notice made of it passes the checks of one a client hands back.
"""

from __future__ import annotations

from array import array
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_stub.contract import batch_slots
from client_stub.contract.shared_memory import Layout
from service import _fastpath_py
from service.client_error import ClientError
from service.fastpath import UNSEEN
from service.front.checks import check_notice
from tests.support.fastpath import DAEMON, c_extension, mapped_segment

BLOCKS = 16
OWNED, FREE, SEALED = 1, 0, 2
LINGER_MS = 5
NOW_MS = 1_000_000


@pytest.fixture(params=DAEMON)
def fastpath(request: pytest.FixtureRequest) -> ModuleType:
    module: ModuleType = request.param
    return module


def unseen() -> array[int]:
    return array("q", [UNSEEN]) * BLOCKS


def open_batch(control: batch_slots.ControlArea, block: int, records: int, *, batch_id: int, opened_ms: int,
               full: bool = False, partition: int = 0, topic_index: int = 0, block_count: int = 1) -> None:
    """A client's batch on ``block`` with ``records`` published (100 bytes each)."""
    control.open(block, batch_id=batch_id, topic_index=topic_index, partition=partition, block_count=block_count,
                 base_timestamp=1_700_000_000_000, opened_ns=opened_ms * 1_000_000)
    if records:
        control.publish(block, records, 100 * records, 1_700_000_000_000 + records, full=full)


def test_claims_what_is_due_full_or_lingered_in_batch_id_order_and_leaves_the_rest(fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        control.set_header(batch_slots.LINGER_NS, LINGER_MS * 1_000_000)
        state = bytearray([OWNED] * BLOCKS)
        state[9] = FREE
        open_batch(control, 2, 3, batch_id=12, opened_ms=NOW_MS - LINGER_MS, partition=1, topic_index=1)  # lingered
        open_batch(control, 4, 1, batch_id=11, opened_ms=NOW_MS, full=True, block_count=2)  # full
        open_batch(control, 6, 2, batch_id=13, opened_ms=NOW_MS - 1)  # due in 4 ms
        open_batch(control, 7, 0, batch_id=14, opened_ms=NOW_MS - 100)  # no record yet: not a batch
        open_batch(control, 9, 5, batch_id=15, opened_ms=NOW_MS - 100)  # on a block not the client's
        seen = unseen()
        claimed, next_due, still_open, found_full, found_due = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS,
                                                                                    False, 0)
        assert claimed == [
            (4, 1, 100, 1_700_000_000_000, 1_700_000_000_001, 11, 0, 0, 2, NOW_MS * 1_000_000),
            (2, 3, 300, 1_700_000_000_000, 1_700_000_000_003, 12, 1, 1, 1, (NOW_MS - LINGER_MS) * 1_000_000),
        ]
        assert (next_due, still_open, found_full, found_due) == (NOW_MS + LINGER_MS - 1, True, True, True)
        assert control.claim_word(2) == batch_slots.CLAIMED | 3 and control.claim_word(4) == batch_slots.CLAIMED | 1
        assert control.claim_word(6) == control.claim_word(9) == 0
        # The batch left open was seen now; the others are not watched.
        assert seen[6] == NOW_MS and [block for block in range(BLOCKS) if seen[block] != UNSEEN] == [6]
        # Claimed once: a second look finds only the batch left open, claimed when due, and nothing after.
        assert fastpath.claim_ready(control, state, OWNED, seen, NOW_MS + 3, False, 0) == ([], NOW_MS + 4, True, False,
                                                                                          False)
        claimed, next_due, still_open, _, found_due = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS + 4,
                                                                           False, 0)
        assert [batch[0] for batch in claimed] == [6] and (next_due, still_open, found_due) == (None, False, True)
        assert seen[6] == UNSEEN
        assert fastpath.claim_ready(control, state, OWNED, seen, NOW_MS + 4, False, 0) == ([], None, False, False,
                                                                                          False)


def test_a_batch_claimed_is_sealed_if_in_range_on_the_clients_blocks_and_left_as_it_was_if_not(
        fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        state = bytearray([OWNED] * BLOCKS)
        state[3] = FREE
        open_batch(control, 1, 2, batch_id=1, opened_ms=NOW_MS)
        open_batch(control, 2, 1, batch_id=2, opened_ms=NOW_MS, block_count=2)  # over a block not the client's
        open_batch(control, 5, 1, batch_id=3, opened_ms=NOW_MS)
        control.publish(5, 1, 4097, 1_700_000_000_001)  # longer than its one block
        open_batch(control, 7, 1, batch_id=4, opened_ms=NOW_MS, block_count=BLOCKS - 6)  # past the pool's end
        open_batch(control, 10, 1, batch_id=5, opened_ms=NOW_MS, block_count=2)  # the first to name block 11
        open_batch(control, 11, 1, batch_id=6, opened_ms=NOW_MS)
        open_batch(control, 13, 1, batch_id=7, opened_ms=NOW_MS, block_count=0)
        open_batch(control, 14, 1, batch_id=8, opened_ms=NOW_MS, partition=2**31 - 1, topic_index=2**32 - 1)
        claimed, *_ = fastpath.claim_ready(control, state, OWNED, unseen(), NOW_MS, True, 0)
        sealed = [fastpath.seal_claimed(state, OWNED, SEALED, 4096, batch) for batch in claimed]
        assert [batch[0] for batch in claimed] == [1, 2, 5, 7, 10, 11, 13, 14]
        assert sealed == [True, False, False, False, True, False, False, True]
        assert [block for block in range(BLOCKS) if state[block] == SEALED] == [1, 10, 11, 14]
        # Sealed once: the same batch again finds its blocks sealed.
        assert fastpath.seal_claimed(state, OWNED, SEALED, 4096, claimed[0]) is False


def test_seal_claimed_refuses_what_claim_ready_never_returns(fastpath: ModuleType) -> None:
    state = bytearray([OWNED] * BLOCKS)
    batch = (0, 1, 100, -1, -1, 0, 0, 0, 1, 0)
    with pytest.raises(TypeError):
        fastpath.seal_claimed(state, OWNED, SEALED, 4096, list(batch))
    with pytest.raises(TypeError):
        fastpath.seal_claimed(state, OWNED, SEALED, 4096, batch[:9])
    with pytest.raises(OverflowError):
        fastpath.seal_claimed(state, OWNED, SEALED, 4096, (2**63, *batch[1:]))
    with pytest.raises(OverflowError):
        fastpath.seal_claimed(state, 256, SEALED, 4096, batch)
    with pytest.raises(ValueError, match="block_size must be positive"):
        fastpath.seal_claimed(state, OWNED, SEALED, 0, batch)
    for refused in (batch, (BLOCKS, *batch[1:])):  # a read-only state, whether the batch would be sealed or not
        with pytest.raises(TypeError):
            fastpath.seal_claimed(bytes(state), OWNED, SEALED, 4096, refused)
    assert state == bytearray([OWNED] * BLOCKS)


# A batch of record_count 1, length 100, timestamps -1 on blocks 0..0: each field at its bounds.
ONE = (0, 1, 100, -1, -1, 0, 0, 0, 1, 0)


def _field(index: int, value: int) -> tuple[int, ...]:
    return (*ONE[:index], value, *ONE[index + 1:])


@pytest.mark.parametrize(("claimed", "sealed"), [
    (ONE, True),
    (_field(0, -1), False), (_field(0, BLOCKS - 1), True), (_field(0, BLOCKS), False),  # block
    (_field(1, 0), False), ((0, 100, 100, *ONE[3:]), True), ((0, 101, 100, *ONE[3:]), False),  # record_count
    (_field(2, 4096), True), (_field(2, 4097), False),  # length: one block's
    ((0, 1, 2 * 4096, *ONE[3:8], 2, 0), True), ((0, 1, 2 * 4096 + 1, *ONE[3:8], 2, 0), False),
    (_field(3, -2), False), (_field(4, -2), False), (_field(3, 2**63 - 1), True),  # timestamps
    (_field(5, -1), False), (_field(5, 2**63 - 1), True),  # batch_id
    (_field(7, -1), False), (_field(7, 2**31 - 1), True), (_field(7, 2**31), False),  # partition
    (_field(8, 0), False), (_field(8, BLOCKS), True), (_field(8, BLOCKS + 1), False),  # block_count
    ((BLOCKS - 1, *ONE[1:8], 2, 0), False), (_field(8, 2**63 - 1), False), (_field(8, -(2**63)), False),
    (_field(6, -1), True), (_field(9, 2**63 - 1), True),  # topic_index and opened_ns are not the seal's
])
def test_seal_claimed_checks_each_field_at_its_bounds(fastpath: ModuleType, claimed: tuple[int, ...],
                                                       sealed: bool) -> None:
    state = bytearray([OWNED] * BLOCKS)
    assert fastpath.seal_claimed(state, OWNED, SEALED, 4096, claimed) is sealed
    expected = bytearray([OWNED] * BLOCKS)
    if sealed:
        expected[claimed[0]:claimed[0] + claimed[8]] = bytes([SEALED]) * claimed[8]
    assert state == expected


ANY_INT = st.one_of(st.integers(-3, BLOCKS + 3), st.integers(-(2**64), 2**64))
STATE = st.lists(st.sampled_from([FREE, OWNED, SEALED]), min_size=BLOCKS, max_size=BLOCKS)


@pytest.mark.skipif(c_extension("service._fastpath") is None, reason="service._fastpath is not built")
@settings(max_examples=300, deadline=None)
@given(claimed=st.lists(ANY_INT, min_size=9, max_size=11).map(tuple), state=STATE,
       owned=st.integers(-1, 256), block_size=st.one_of(st.integers(-1, 8192), st.integers(-(2**64), 2**64)))
def test_both_twins_seal_the_same_whatever_they_are_given(claimed: tuple[int, ...], state: list[int], owned: int,
                                                          block_size: int) -> None:
    results = []
    for module in (c_extension("service._fastpath"), _fastpath_py):
        assert module is not None
        blocks = bytearray(state)
        try:
            answer: object = module.seal_claimed(blocks, owned, SEALED, block_size, claimed)
        except (TypeError, ValueError, OverflowError) as exc:
            answer = type(exc)
        results.append((answer, blocks))
    assert results[0] == results[1]


def test_a_client_that_says_its_batch_opened_later_waits_no_longer_than_linger_ms_from_first_seen(
        fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        control.set_header(batch_slots.LINGER_NS, LINGER_MS * 1_000_000)
        state = bytearray([OWNED] * BLOCKS)
        open_batch(control, 0, 1, batch_id=1, opened_ms=NOW_MS + 10**9)
        seen = unseen()
        assert fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 0) == ([], NOW_MS + LINGER_MS, True,
                                                                                      False, False)
        claimed, *_ = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS + LINGER_MS, False, 0)
        assert [batch[0] for batch in claimed] == [0]


def test_claim_all_takes_every_batch_with_records_and_a_linger_of_years_is_a_day(fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        control.set_header(batch_slots.LINGER_NS, 2**64 - 1)
        state = bytearray([OWNED] * BLOCKS)
        for block in (1, 3, 5):
            open_batch(control, block, block, batch_id=10 - block, opened_ms=NOW_MS)
        seen = unseen()
        assert fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 0)[1] == NOW_MS + 86_400_000
        claimed, next_due, still_open, found_full, found_due = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS,
                                                                                    True, 0)
        assert [(batch[0], batch[1]) for batch in claimed] == [(5, 5), (3, 3), (1, 1)]
        assert (next_due, still_open, found_full, found_due) == (None, False, False, False)


def test_early_ms_claims_the_batches_due_within_it_and_none_of_them_counts_as_due(fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        control.set_header(batch_slots.LINGER_NS, 100 * 1_000_000)
        state = bytearray([OWNED] * BLOCKS)
        open_batch(control, 1, 2, batch_id=1, opened_ms=NOW_MS - 95)  # due in 5 ms
        open_batch(control, 2, 1, batch_id=2, opened_ms=NOW_MS - 90)  # due in 10 ms
        open_batch(control, 3, 1, batch_id=3, opened_ms=NOW_MS - 89)  # due in 11 ms
        seen = unseen()
        claimed, next_due, still_open, found_full, found_due = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS,
                                                                                    False, 10)
        assert [batch[0] for batch in claimed] == [1, 2]
        assert (next_due, still_open, found_full, found_due) == (NOW_MS + 11, True, False, False)
        assert control.claim_word(3) == 0
        with pytest.raises(ValueError, match="early_ms must not be negative"):
            fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, -1)
        with pytest.raises(TypeError):
            fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 1.5)
        with pytest.raises(OverflowError):
            fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 2**63)
        # More than a day is a day, as a linger.ms is: every batch is due within it.
        control.set_header(batch_slots.LINGER_NS, 2**64 - 1)
        open_batch(control, 4, 1, batch_id=4, opened_ms=NOW_MS)  # due in a day
        claimed, *_ = fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 2**62)
        assert [batch[0] for batch in claimed] == [3, 4]


def test_a_batch_whose_claim_finds_no_record_is_not_one_claimed_due(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client rewrote its slot to no records between the daemon's two reads of it (C reads the words itself:
    # the race cannot be made without a second thread; the twin's claim is stood in for).
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        control.set_header(batch_slots.LINGER_NS, LINGER_MS * 1_000_000)
        open_batch(control, 1, 2, batch_id=1, opened_ms=NOW_MS - LINGER_MS)
        monkeypatch.setattr(batch_slots.ControlArea, "claim", lambda self, block: (0, 0))
        assert _fastpath_py.claim_ready(control, bytearray([OWNED] * BLOCKS), OWNED, unseen(), NOW_MS, False, 0) == (
            [], None, False, False, False)


def test_only_the_blocks_first_seen_covers_are_looked_at(fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        state = bytearray([OWNED] * BLOCKS)
        for block in (1, 5):
            open_batch(control, block, 1, batch_id=block, opened_ms=NOW_MS, full=True)
        seen = array("q", [UNSEEN]) * 4
        assert [batch[0] for batch in fastpath.claim_ready(control, state, OWNED, seen, NOW_MS, False, 0)[0]] == [1]
        assert control.claim_word(5) == 0


def test_a_first_seen_larger_than_the_segment_is_refused(fastpath: ModuleType) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        for state, first_seen in ((bytearray(BLOCKS), unseen() + array("q", [UNSEEN])),
                                  (bytearray(BLOCKS - 1), unseen()), (bytearray(BLOCKS), bytearray(8 * BLOCKS - 4))):
            with pytest.raises(ValueError, match="first_seen covers more blocks"):
                fastpath.claim_ready(shared.daemon, state, OWNED, first_seen, 0, False, 0)


WORD = st.integers(0, 2**64 - 1)
SLOT = st.one_of(
    st.lists(WORD, min_size=8, max_size=8),
    # Slots of batches open with records, as clients write them (their batch ids anything, some equal).
    # opened_ns near now, or any word (one far in the past or the future puts due far from now).
    # Their block counts from past the pool to none, some naming the same blocks.
    st.tuples(st.integers(1, 50), st.integers(0, 3 * 4096), st.booleans(), st.integers(-5, 5), WORD,
              st.one_of(st.integers(NOW_MS - 20, NOW_MS + 20).map(lambda ms: ms * 1_000_000), WORD),
              st.integers(-1, 4)).map(
        lambda s: [batch_slots.pack_published(s[0], s[1], s[2]), 0, 1_700_000_000_000, s[4], s[3],
                   s[0] | (s[0] << 32), s[6], s[5]]),
)


@pytest.mark.skipif(c_extension("service._fastpath") is None, reason="service._fastpath is not built")
@settings(max_examples=200, deadline=None)
@given(slots=st.lists(SLOT, min_size=BLOCKS, max_size=BLOCKS), state=STATE, linger=WORD,
       seen=st.lists(st.sampled_from([UNSEEN, NOW_MS - 10, NOW_MS]), max_size=BLOCKS), claim_all=st.booleans(),
       early_ms=st.sampled_from([0, 1, 7, 86_400_000, 2**62, 2**63 - 1]))
def test_both_twins_claim_and_seal_the_same_from_whatever_a_client_wrote(slots: list[list[int]], state: list[int],
                                                                          linger: int, seen: list[int],
                                                                          claim_all: bool, early_ms: int) -> None:
    c_fastpath = c_extension("service._fastpath")
    results = []
    with mapped_segment(Layout(4096, BLOCKS)) as c_shared, mapped_segment(Layout(4096, BLOCKS)) as py_shared:
        for module, control in ((c_fastpath, c_shared.daemon), (_fastpath_py, py_shared.daemon)):
            control.set_header(batch_slots.LINGER_NS, linger)
            for block, words in enumerate(slots):
                for word, value in enumerate(words):
                    control.words[batch_slots.HEADER_SIZE // 8 + block * 8 + word] = value % 2**64
            first_seen = array("q", seen)
            blocks = bytearray(state)
            answer = module.claim_ready(control, blocks, OWNED, first_seen, NOW_MS, claim_all, early_ms)
            sealed = [module.seal_claimed(blocks, OWNED, SEALED, 4096, batch) for batch in answer[0]]
            results.append((answer, sealed, blocks, first_seen.tolist(), control.words.tolist()))
    assert results[0] == results[1]
    # Sealed in batch-id order, each if the notice the daemon makes of it passes the checks of one a client hands
    # back, on blocks the client holds unsealed: of two batches naming the same block, the first takes it.
    (claimed, *_), sealed, blocks, *_ = results[0]
    held = bytearray(state)
    for batch, was_sealed in zip(claimed, sealed, strict=True):
        assert was_sealed is passes_the_checks(batch, held), batch
        if was_sealed:
            held[batch[0]:batch[0] + batch[8]] = bytes([SEALED]) * batch[8]
    assert blocks == held


def passes_the_checks(batch: tuple[int, ...], state: bytearray) -> bool:
    """Whether a batch claimed passes the checks of the notice the daemon makes of it (a client's notice), on
    blocks the client holds unsealed in ``state``."""
    block, record_count, length, base_timestamp, max_timestamp, batch_id, _, partition, block_count, _ = batch
    try:
        check_notice([batch_id, block, block_count, "topic", partition, record_count, length, base_timestamp,
                      max_timestamp, 0], BLOCKS, 4096)
    except ClientError:
        return False
    return block + block_count <= BLOCKS and all(state[b] == OWNED for b in range(block, block + block_count))
