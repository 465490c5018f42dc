"""Partitioners: which partition a record goes to, as the Java client and librdkafka decide.

- ``murmur2_random`` (the default): keyed records by murmur2 of the key, exactly as
  the Java producer's default partitioner and librdkafka's ``murmur2_random``;
  records without a key stick to one partition of their topic until its batch
  is sealed, then move on (Kafka's sticky partitioning).
- ``consistent_random``: keyed records by CRC-32 of the key (librdkafka's
  ``consistent_random``); records without a key sticky as above.
- ``random``: every record to a random available partition.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

from .fastpath import murmur2

PARTITIONERS = ("murmur2_random", "consistent_random", "random")

__all__ = ["PARTITIONERS", "Partitioner", "crc32_partition", "murmur2", "murmur2_partition"]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """``toPositive(murmur2(key)) % partitions``, the Java producer's choice for a key.

    Producer.send() makes the same choice itself for the common case (Appender.send in client_stub.fastpath).
    """
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent`` choice: CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions


class Partitioner:
    """Chooses partitions for one producer; sticky state is per topic."""

    def __init__(self, name: str = "murmur2_random", rng: random.Random | None = None) -> None:
        if name not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {name!r}; expected one of {', '.join(PARTITIONERS)}")
        self.name = name
        self._rng = rng or random.Random()
        self._keyed: Callable[[bytes, int], int] | None = {
            "murmur2_random": murmur2_partition, "consistent_random": crc32_partition}.get(name)
        # topic -> the partition of its records without a key, until their batch is sealed (shared with
        # the fast path of Producer.send(), client_stub.fastpath's Appender).
        self.sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int, available: Sequence[int]) -> int:
        """The partition for a record of ``topic`` with ``key``.

        ``available`` lists the partitions with a known leader (all of them if empty).
        """
        if key is not None and self._keyed is not None:
            return self._keyed(key, partitions)
        if self.name == "random":
            return self._choose(available, partitions)
        sticky = self.sticky.get(topic)
        if sticky is None or sticky >= partitions:
            sticky = self.sticky[topic] = self._choose(available, partitions)
        return sticky

    def batch_sealed(self, topic: str, partition: int) -> None:
        """A batch of ``topic`` was sealed: records without a key move to another partition."""
        if self.sticky.get(topic) == partition:
            del self.sticky[topic]

    def _choose(self, available: Sequence[int], partitions: int) -> int:
        if available:
            return available[self._rng.randrange(len(available))]
        return self._rng.randrange(partitions)
