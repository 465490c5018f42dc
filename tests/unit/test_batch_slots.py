"""The control area's reads of the daemon: which of a client's blocks hold a batch open to it with records."""

from __future__ import annotations

import pytest

from client_stub.contract import batch_slots
from client_stub.contract.shared_memory import Layout
from tests.support.fastpath import mapped_segment

BLOCKS = 64


@pytest.mark.parametrize("owned", [[3, 5, 9, 12], list(range(2, 60))], ids=["a-few-blocks", "many-blocks"])
def test_open_slots_are_the_owned_blocks_with_records_published_and_no_claim(owned: list[int]) -> None:
    with mapped_segment(Layout(4096, BLOCKS)) as shared:
        control = shared.daemon
        # A batch with records on the first and the last owned block; one without records yet on the second; one
        # claimed (its block granted again, no batch opened there since) on the third; one on a block not owned.
        for block, records in ((owned[0], 2), (owned[1], 0), (owned[2], 1), (owned[-1], 7), (BLOCKS - 1, 3)):
            control.open(block, batch_id=block, topic_index=0, partition=0, block_count=1, base_timestamp=1,
                         opened_ns=1)
            if records:
                control.publish(block, records, 10 * records, 1, full=block == owned[-1])
        control.claim(owned[2])
        found = dict(control.open_slots(owned))
        assert sorted(found) == sorted({owned[0], owned[-1]})
        assert batch_slots.unpack_published(found[owned[0]]) == (2, 20, False)
        assert batch_slots.unpack_published(found[owned[-1]]) == (7, 70, True)
        assert control.open_slots([]) == []
