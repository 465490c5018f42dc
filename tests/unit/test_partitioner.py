"""Partitioners: murmur2 as Kafka's Java client computes it, CRC-32 as librdkafka's consistent
partitioner, sticky partitioning of records without a key, and the random partitioner.

murmur2 is the client's fast path: its tests run against both twins (``fastpath``), the C extension
and its pure-Python twin; client_stub.partitioner uses the one in use.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_stub import fastpath as chosen
from client_stub.partitioner import PARTITIONERS, Partitioner, crc32_partition, murmur2, murmur2_partition
from tests.support.fastpath import CLIENT

# Kafka's UtilsTest.testMurmur2 (signed 32-bit values, as Java's int).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


# -- a reference: Java's Utils.murmur2, line by line, with Java int arithmetic ------------------


def _int(value: int) -> int:
    """Wrap to a signed 32-bit Java int."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _ushr(value: int, bits: int) -> int:
    """Java's ``>>>`` on an int."""
    return (value & 0xFFFFFFFF) >> bits


def java_murmur2(data: bytes) -> int:
    length = len(data)
    seed = _int(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _int(seed ^ length)
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = _int((data[i4 + 0] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + ((data[i4 + 2] & 0xFF) << 16)
                 + ((data[i4 + 3] & 0xFF) << 24))
        k = _int(k * m)
        k = _int(k ^ _ushr(k, r))
        k = _int(k * m)
        h = _int(h * m)
        h = _int(h ^ k)
    # Java's switch falls through from case 3 to case 1.
    rest = length % 4
    if rest == 3:
        h = _int(h ^ ((data[(length & ~3) + 2] & 0xFF) << 16))
    if rest >= 2:
        h = _int(h ^ ((data[(length & ~3) + 1] & 0xFF) << 8))
    if rest >= 1:
        h = _int(h ^ (data[length & ~3] & 0xFF))
        h = _int(h * m)
    h = _int(h ^ _ushr(h, 13))
    h = _int(h * m)
    h = _int(h ^ _ushr(h, 15))
    return h


def java_partition(key: bytes, partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: Utils.toPositive(Utils.murmur2(key)) % numPartitions."""
    return (java_murmur2(key) & 0x7FFFFFFF) % partitions


# -- murmur2 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fastpath", CLIENT)
@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items(), ids=[k.decode()[:12] for k in KAFKA_VECTORS])
def test_murmur2_matches_kafkas_test_vectors(fastpath: ModuleType, data: bytes, expected: int) -> None:
    assert fastpath.murmur2(data) == expected % 2**32
    assert 0 <= fastpath.murmur2(data) < 2**32
    # The reference agrees with the same vectors, so that it can be trusted below.
    assert java_murmur2(data) == expected


def test_murmur2_partition_of_the_vectors() -> None:
    for data, expected in KAFKA_VECTORS.items():
        for partitions in (1, 3, 12, 50, 1000):
            assert murmur2_partition(data, partitions) == (expected & 0x7FFFFFFF) % partitions
    # toPositive, not abs(): a negative hash keeps its low 31 bits.
    assert murmur2_partition(b"foobar", 50) == 16


@pytest.mark.parametrize("fastpath", CLIENT)
@given(st.binary(max_size=300))
def test_murmur2_equals_a_transcription_of_javas(fastpath: ModuleType, data: bytes) -> None:
    assert fastpath.murmur2(data) == java_murmur2(data) % 2**32


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_murmur2_partition_equals_javas(key: bytes, partitions: int) -> None:
    assert murmur2_partition(key, partitions) == java_partition(key, partitions)


@pytest.mark.parametrize("fastpath", CLIENT)
def test_murmur2_every_tail_length(fastpath: ModuleType) -> None:
    # Lengths 0..8 go through every branch of the tail (0 to 3 bytes left over).
    for length in range(9):
        data = bytes(range(200, 200 + length))
        assert fastpath.murmur2(data) == java_murmur2(data) % 2**32


@pytest.mark.parametrize("fastpath", CLIENT)
def test_murmur2_takes_any_bytes_like_key_and_nothing_else(fastpath: ModuleType) -> None:
    key = b"some-key-17"
    expected = java_murmur2(key) % 2**32
    assert fastpath.murmur2(bytearray(key)) == fastpath.murmur2(memoryview(key)) == expected
    with pytest.raises(TypeError, match="bytes-like object is required"):
        fastpath.murmur2("some-key-17")


def test_murmur2_partition_takes_any_bytes_like_key() -> None:
    key = b"some-key-17"
    expected = java_partition(key, 7)
    assert murmur2_partition(bytearray(key), 7) == expected
    assert murmur2_partition(memoryview(key), 7) == expected
    assert murmur2 is chosen.murmur2  # the partitioner's is the fast path's in use


# -- crc32 ----------------------------------------------------------------------------------------


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_crc32_partition_is_zlib_crc32_modulo_the_count(key: bytes, partitions: int) -> None:
    assert crc32_partition(key, partitions) == zlib.crc32(key) % partitions


def test_crc32_partition_known_value() -> None:
    # CRC-32 (IEEE) of "123456789" is 0xCBF43926, the standard check value.
    assert crc32_partition(b"123456789", 1000) == 0xCBF43926 % 1000


# -- Partitioner ----------------------------------------------------------------------------------


class ScriptedRandom(random.Random):
    """randrange returns the scripted indexes in order, and counts the draws."""

    def __init__(self, *indexes: int) -> None:
        super().__init__(0)
        self.indexes = list(indexes)
        self.draws = 0

    def randrange(self, stop: int, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        self.draws += 1
        index = self.indexes.pop(0)
        assert 0 <= index < stop
        return index


ALL6 = [0, 1, 2, 3, 4, 5]


def test_unknown_partitioner_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown partitioner 'murmur3'"):
        Partitioner("murmur3")
    for name in PARTITIONERS:
        assert Partitioner(name).name == name


def test_keyed_records_by_murmur2_by_default() -> None:
    partitioner = Partitioner()
    for key in (b"", b"a", b"user-1", b"foobar", bytes(range(256))):
        assert partitioner.partition("t", key, 12, ALL6) == java_partition(key, 12)


def test_keyed_records_by_crc32_with_consistent_random() -> None:
    partitioner = Partitioner("consistent_random")
    for key in (b"", b"a", b"user-1", b"foobar"):
        assert partitioner.partition("t", key, 12, ALL6) == zlib.crc32(key) % 12


@pytest.mark.parametrize("name", ["murmur2_random", "consistent_random"])
def test_keyed_records_ignore_availability(name: str) -> None:
    # As the Java producer: a key's partition does not depend on which leaders are known.
    partitioner = Partitioner(name)
    keyed = murmur2_partition if name == "murmur2_random" else crc32_partition
    key = next(k for k in (f"key-{i}".encode() for i in range(100)) if keyed(k, 6) == 5)
    assert partitioner.partition("t", key, 6, [0, 1]) == 5
    assert partitioner.partition("t", key, 6, []) == 5


@pytest.mark.parametrize("name", ["murmur2_random", "consistent_random"])
def test_null_keys_stick_until_their_batch_is_sealed(name: str) -> None:
    rng = ScriptedRandom(2, 4)
    partitioner = Partitioner(name, rng=rng)
    assert {partitioner.partition("t", None, 6, ALL6) for _ in range(100)} == {2}
    assert rng.draws == 1
    # A batch of another partition (keyed records) does not move the sticky partition.
    partitioner.batch_sealed("t", 3)
    assert partitioner.partition("t", None, 6, ALL6) == 2
    partitioner.batch_sealed("t", 2)
    assert {partitioner.partition("t", None, 6, ALL6) for _ in range(100)} == {4}
    assert rng.draws == 2


def test_sticky_partition_is_per_topic() -> None:
    rng = ScriptedRandom(1, 3, 0)
    partitioner = Partitioner(rng=rng)
    assert partitioner.partition("a", None, 6, ALL6) == 1
    assert partitioner.partition("b", None, 6, ALL6) == 3
    partitioner.batch_sealed("b", 3)
    assert partitioner.partition("a", None, 6, ALL6) == 1
    assert partitioner.partition("b", None, 6, ALL6) == 0
    partitioner.batch_sealed("unknown-topic", 0)  # nothing to move


def test_sticky_partitions_spread_over_many_batches() -> None:
    partitioner = Partitioner(rng=random.Random(7))
    used = []
    for _ in range(200):
        partition = partitioner.partition("t", None, 6, ALL6)
        used.append(partition)
        partitioner.batch_sealed("t", partition)
    assert set(used) == set(ALL6)


@pytest.mark.parametrize("name", PARTITIONERS)
def test_null_keys_go_to_available_partitions_only(name: str) -> None:
    partitioner = Partitioner(name, rng=random.Random(3))
    available: Sequence[int] = [1, 4]
    used = set()
    for _ in range(200):
        partition = partitioner.partition("t", None, 6, available)
        used.add(partition)
        partitioner.batch_sealed("t", partition)
    assert used == {1, 4}


def test_no_available_partition_means_any_partition() -> None:
    partitioner = Partitioner(rng=random.Random(5))
    used = set()
    for _ in range(300):
        partition = partitioner.partition("t", None, 6, [])
        used.add(partition)
        partitioner.batch_sealed("t", partition)
    assert used == set(ALL6)


def test_sticky_partition_chosen_again_when_the_topic_shrinks_below_it() -> None:
    rng = ScriptedRandom(5, 1)
    partitioner = Partitioner(rng=rng)
    assert partitioner.partition("t", None, 6, ALL6) == 5
    assert partitioner.partition("t", None, 3, [0, 1, 2]) == 1


def test_random_partitioner_does_not_stick_and_ignores_keys() -> None:
    rng = ScriptedRandom(0, 1, 1, 0)
    partitioner = Partitioner("random", rng=rng)
    available = [2, 5]
    assert [partitioner.partition("t", None, 6, available) for _ in range(2)] == [2, 5]
    assert [partitioner.partition("t", b"key", 6, available) for _ in range(2)] == [5, 2]
    assert rng.draws == 4
