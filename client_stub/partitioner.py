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
import struct
import zlib
from collections.abc import Callable, Sequence

PARTITIONERS = ("murmur2_random", "consistent_random", "random")

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Utils.murmur2) of ``data`` as an unsigned 32-bit value."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & ~3
    extra = length - tail
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


# Keys repeat (user ids, device ids): the partitions of short ones are remembered, per partition
# count. A dict of small ints costs a slot per key, a quarter of what an lru_cache entry costs: it
# is every producing process that pays.
_partitions_of: dict[int, dict[bytes, int]] = {}
_SHORT_KEY = 64
_REMEMBERED_KEYS = 16384


def murmur2_partition(key: bytes, partitions: int) -> int:
    """``toPositive(murmur2(key)) % partitions``, the Java producer's choice for a key."""
    key = bytes(key)
    known = _partitions_of.get(partitions)
    if known is None:
        known = _partitions_of[partitions] = {}
    partition = known.get(key)
    if partition is None:
        partition = (murmur2(key) & 0x7FFFFFFF) % partitions
        if len(key) <= _SHORT_KEY:
            if len(known) >= _REMEMBERED_KEYS:
                known.clear()
            known[key] = partition
    return partition


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
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int, available: Sequence[int]) -> int:
        """The partition for a record of ``topic`` with ``key``.

        ``available`` lists the partitions with a known leader (all of them if empty).
        """
        if key is not None and self._keyed is not None:
            return self._keyed(key, partitions)
        if self.name == "random":
            return self._choose(available, partitions)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= partitions:
            sticky = self._sticky[topic] = self._choose(available, partitions)
        return sticky

    def batch_sealed(self, topic: str, partition: int) -> None:
        """A batch of ``topic`` was sealed: records without a key move to another partition."""
        if self._sticky.get(topic) == partition:
            del self._sticky[topic]

    def _choose(self, available: Sequence[int], partitions: int) -> int:
        if available:
            return available[self._rng.randrange(len(available))]
        return self._rng.randrange(partitions)
