"""Sealed batches for the daemon core, built as applications build them, and their outcomes.

Records are encoded with the client stub's one-record encoder into a buffer of
their own, the way a client writes them into its shared-memory block; every
record's value names its partition and position so that a verifier can check
delivery once, in order.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from client_stub.contract.records import Header
from client_stub.fastpath import encode_record, encode_record_into, record_size
from service.network.client import monotonic_ms
from service.producer.batch import FinalState, ProducerBatch, TopicPartition


def _first(*values: int | None) -> int:
    return next(v for v in values if v is not None)


def encode_records(specs: Sequence[tuple[int, bytes | None, bytes | None, Sequence[Header]]],
                   *, into_memoryview: bool = True) -> memoryview | bytes:
    """The records as a client writes them, offset deltas 0..n-1: into a memoryview (as shared memory)
    with encode_record_into, or joined from encode_record."""
    if not into_memoryview:
        return b"".join(encode_record(i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(specs))
    size = sum(record_size(i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(specs))
    block = memoryview(bytearray(size + 32))  # a block larger than its records, as a pool block
    pos = 0
    for i, (ts, k, v, h) in enumerate(specs):
        pos = encode_record_into(block, pos, i, ts, k, v, h)
    assert pos == size
    return block[:size]


@dataclass(frozen=True, slots=True)
class SentRecord:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


@dataclass
class Deliveries:
    """Builds batches and records what happened to each: reports and buffer releases."""

    topic: str
    # The creation time given to new batches, on the loop's clock; None: the real clock's now.
    created_ms: int | None = None
    reports: list[ProducerBatch] = field(default_factory=list)
    releases: Counter[int] = field(default_factory=Counter)
    sent: dict[int, list[tuple[ProducerBatch, list[SentRecord]]]] = field(default_factory=dict)
    _next_origin: int = 0
    _numbered: Counter[int] = field(default_factory=Counter)

    def batch(self, partition: int, records: list[SentRecord], *, created_ms: int | None = None,
              as_memoryview: bool = True) -> ProducerBatch:
        """A sealed batch of ``records`` for ``partition``; its buffer release is counted."""
        base_ts = records[0].timestamp_ms
        encoded = encode_records([(r.timestamp_ms - base_ts, r.key, r.value, [(k.encode(), v) for k, v in r.headers])
                                  for r in records], into_memoryview=as_memoryview)
        origin = self._next_origin
        self._next_origin += 1
        batch = ProducerBatch(TopicPartition(self.topic, partition), encoded,
                              len(records), base_timestamp=base_ts,
                              max_timestamp=max(r.timestamp_ms for r in records),
                              created_ms=_first(created_ms, self.created_ms, monotonic_ms()),
                              on_complete=self.reports.append, release=lambda: self.releases.update([origin]),
                              origin=origin)
        self.sent.setdefault(partition, []).append((batch, records))
        return batch

    def numbered(self, partitions: int, batches_per_partition: int, records_per_batch: int,
                 value_size: int = 40) -> list[ProducerBatch]:
        """Batches whose values are ``p<partition>-<n>``, padded: unique and ordered per partition."""
        now = int(time.time() * 1000)
        out = []
        counters = self._numbered
        for _ in range(batches_per_partition):
            for p in range(partitions):
                records = []
                for _ in range(records_per_batch):
                    n = counters[p]
                    counters[p] += 1
                    value = f"p{p}-{n:08d}-".encode().ljust(value_size, b"x")
                    records.append(SentRecord(p, f"k{n % 1000}".encode(), value, (), now + n % 7))
                out.append(self.batch(p, records))
        return out

    def records_of(self, partition: int) -> list[SentRecord]:
        return [r for _, records in self.sent.get(partition, []) for r in records]

    def all_records(self) -> list[SentRecord]:
        return [r for p in sorted(self.sent) for r in self.records_of(p)]

    def origins_reported(self) -> Counter[int]:
        return Counter(b.origin for b in self.reports)

    def succeeded(self) -> list[ProducerBatch]:
        return [b for b in self.reports if b.final_state is FinalState.SUCCEEDED]

    def failed(self) -> list[ProducerBatch]:
        return [b for b in self.reports if b.final_state is not FinalState.SUCCEEDED]
