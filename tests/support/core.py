"""Driving a ProducerCore in the tests: its clock, its construction, its loop, and what arrived."""

from __future__ import annotations

import time
from collections.abc import Callable

from service.config import ProducerConfig
from service.network.client import monotonic_ms
from service.producer.core import ProducerCore
from service.tools.readback import ConsumedRecord
from tests.support.batches import Deliveries
from tests.support.waiting import HANG_S


class JumpingClock:
    """The loop's clock: real time, plus the jumps the test makes, so timeouts need no waiting."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return monotonic_ms() + self.offset

    @property
    def now(self) -> int:
        return self()

    def advance(self, ms: int) -> None:
        self.offset += ms


def make_core(bootstrap: str, clock: Callable[[], int] | None = None, **settings: object) -> ProducerCore:
    """A core for ``bootstrap`` with ``settings`` (``_`` for ``.`` in their names)."""
    config = ProducerConfig({"bootstrap.servers": bootstrap, **{k.replace("_", "."): v for k, v in settings.items()}})
    return ProducerCore(config) if clock is None else ProducerCore(config, clock=clock)


def run_until(core: ProducerCore, condition: Callable[[], bool], timeout: float = HANG_S) -> None:
    """Turn the loop until ``condition()``, failing after ``timeout`` seconds (a hang's bound)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the sender loop did not get there in time"
        core.run_once(20)


def assert_delivered_once_in_order(deliveries: Deliveries, consumed: list[ConsumedRecord],
                                   check_offsets: bool = True) -> None:
    """Every record sent arrived once, in order per partition, intact, at the offset its batch reported."""
    by_partition: dict[int, list[ConsumedRecord]] = {}
    for record in consumed:
        by_partition.setdefault(record.partition, []).append(record)
    for partition in deliveries.sent:
        expected = deliveries.records_of(partition)
        got = by_partition.pop(partition, [])
        assert [r.value for r in got] == [r.value for r in expected], f"partition {partition}"
        assert [r.key for r in got] == [r.key for r in expected]
        assert [r.timestamp_ms for r in got] == [r.timestamp_ms for r in expected]
        assert [tuple(r.headers) for r in got] == [r.headers for r in expected]
        if check_offsets:
            offsets = {r.value: r.offset for r in got}
            for batch, records in deliveries.sent[partition]:
                assert [offsets[r.value] for r in records] == \
                    list(range(batch.base_offset, batch.base_offset + len(records)))
    assert not by_partition, f"records in partitions nothing was sent to: {list(by_partition)}"


def assert_each_reported_and_released_once(deliveries: Deliveries, batches: list) -> None:
    assert sorted(deliveries.origins_reported().values()) == [1] * len(batches)
    assert sorted(deliveries.releases.values()) == [1] * len(batches)
