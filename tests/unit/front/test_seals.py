"""Batches claimed from a client's slots, made batches over its shared memory: each checked on its own."""

from __future__ import annotations

from typing import Any

import pytest

from client_stub import errors
from client_stub.contract import ipc
from service.buffer_pool import FREE, OWNED, SEALED
from service.producer.batch import TopicPartition
from tests.support.front import (
    BLOCK,
    BLOCKS,
    MAX_REQUEST_SIZE,
    T0,
    Client,
    Env,
    deliveries,
    metadata_response,
    notice,
)

# -- seal -----------------------------------------------------------------------------------------


def test_valid_seal_queues_a_batch_over_the_shared_memory(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    run = client.blocks(2, contiguous=True)
    segment = client.segment
    assert segment is not None
    written = bytes(range(251)) * 20  # 5020 bytes, across the block boundary
    segment.blocks(run[0], 2)[:len(written)] = written
    env.clock.advance(7)
    client.publish(notice(batch_id=41, first=run[0], count=2, topic="orders", partition=3, records=4,
                       length=len(written), base_ts=1_700_000_000_000, max_ts=1_700_000_000_009, ago=25))
    assert client.quiet()  # a claim is not answered; its DELIVERY comes when the batch is finished
    [batch] = env.queued("orders", 3)
    assert batch.tp == TopicPartition("orders", 3)
    assert (batch.record_count, batch.base_timestamp, batch.max_timestamp) == (4, 1_700_000_000_000,
                                                                               1_700_000_000_009)
    assert batch.created_ms == T0 + 7 - 25
    assert batch.origin == (client_id, 41)
    assert isinstance(batch.records, memoryview) and bytes(batch.records) == written
    # Zero-copy: the batch's records are the client's segment, not a copy of it.
    segment.blocks(run[0])[0:3] = b"NEW"
    assert bytes(batch.records[0:3]) == b"NEW"
    assert [env.state(client_id, b) for b in run] == [SEALED, SEALED]
    assert "orders" in env.core.metadata.topics()


def test_a_slot_of_a_block_not_granted_to_its_client_is_never_read(env: Env) -> None:
    owner, thief = env.client(), env.client()
    owner_id = owner.hello()
    thief_id = thief.hello()
    blocks = owner.blocks(2, contiguous=True)
    # The same block numbers, in the thief's own segment: the daemon reads the slots of blocks granted to it only.
    thief.publish(notice(batch_id=7, first=blocks[0], count=2, length=200))
    env.front.serve_due()
    assert thief.quiet() and owner.quiet()
    assert env.core.accumulator.queued_batches() == 0
    assert [env.state(owner_id, b) for b in blocks] == [OWNED, OWNED]
    assert env.pool.held_by(thief_id) == 0
    # The owner's batch there is its own.
    owner.publish(notice(batch_id=1, first=blocks[0], count=2, length=200))
    assert [b.origin for b in env.queued()] == [(owner_id, 1)]


GOOD = notice(batch_id=5, first=0, count=2, length=5000, records=3)


def _int64(word: int) -> int:
    return word - 2**64 if word >= 2**63 else word


def _with(**changes: Any) -> list[Any]:
    fields = dict(zip(ipc.SealNotice._fields, GOOD, strict=True))
    fields.update(changes)
    return [fields[name] for name in ipc.SealNotice._fields]


# Whatever a client writes in its slot is a word of 64 bits: each field as the daemon reads it.
@pytest.mark.parametrize(("bad", "reason"), [
    (_with(block_count=0), "block_count"),
    (_with(block_count=3), "block 2 is not granted"),
    (_with(block_count=BLOCKS + 1), "block_count"),
    (_with(block_count=2**64 - 1), "block_count"),
    (_with(topic="bad topic"), "no topic is number"),
    (_with(partition=2**31), "partition"),
    (_with(partition=2**32 - 1), "partition"),
    (_with(record_count=5001), "record_count"),
    (_with(length=0), "length"),
    (_with(length=2 * BLOCK + 1), "length"),
    (_with(length=MAX_REQUEST_SIZE + 1), "larger than max.request.size"),
    (_with(base_timestamp=-2), "base_timestamp"),
    (_with(max_timestamp=2**64 - 5), "max_timestamp"),
    (_with(batch_id=2**63), "batch_id"),
], ids=lambda value: str(value)[:40] if isinstance(value, str) else None)
def test_a_batch_whose_slot_says_what_cannot_be_is_refused(env: Env, bad: list[Any], reason: str) -> None:
    client = env.client()
    client_id = client.hello()
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.publish(bad)
    text = client.error()
    if "invalid topic name" in text:
        text = client.error()  # the daemon would not follow the topic: the slot names one it never numbered
    assert text.startswith("batch refused") and reason in text
    assert env.core.accumulator.queued_batches() == 0
    assert all(env.state(client_id, b) != SEALED for b in range(BLOCKS))
    env.front.serve_due()
    [report] = deliveries(client)
    assert report[0] == _int64(bad[0]) and report[3] == -1
    assert isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    # The client counts the batch as failed and will never use or release these blocks again:
    # those it holds went back to the pool.
    named = range(0, min(_int64(bad[2]), BLOCKS))
    assert not any(env.state(client_id, b) == OWNED for b in named)
    assert env.pool.held_by(client_id) == 2 - len(set(named) & {0, 1})


def test_a_slot_rewritten_to_no_records_sends_nothing_and_keeps_its_blocks(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    assert client.blocks(1) == [0]
    client.publish(notice(batch_id=1, first=0, records=0, length=0))
    assert client.quiet()
    assert env.core.accumulator.queued_batches() == 0
    assert env.state(client_id, 0) == OWNED


@pytest.mark.parametrize("message", [[ipc.Wakeup.TYPE, "extra"], [ipc.LastSeal.TYPE, []]],
                         ids=["wakeup-with-a-field", "lastseal-with-a-field"])
def test_malformed_wakeup_is_refused(env: Env, message: list[Any]) -> None:
    client = env.client()
    client.hello()
    client.blocks(1)
    client.send(*message)
    env.pump()
    client.error()
    assert env.core.accumulator.queued_batches() == 0


def test_one_bad_batch_does_not_spoil_the_others(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.blocks(3, contiguous=True) == [0, 1, 2]
    client.publish(notice(batch_id=1, first=0), notice(batch_id=2, first=1, topic="no/slash"),
                   notice(batch_id=3, first=2, partition=1))
    assert "invalid topic name" in client.error()  # the daemon would not follow it
    assert "no topic is number" in client.error()
    assert [b.origin[1] for b in env.queued("t", 0)] == [1]
    assert [b.origin[1] for b in env.queued("t", 1)] == [3]
    env.front.serve_due()
    assert [report[0] for report in deliveries(client)] == [2]


def test_a_claimed_block_is_not_read_again_until_it_is_granted_again(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(1, contiguous=True)
    client.publish(notice(batch_id=1))
    client.publish(notice(batch_id=2))
    assert client.quiet()
    assert [b.origin[1] for b in env.queued()] == [1]
    assert env.state(client_id, 0) == SEALED  # the first batch holds it


def follow_three_partitions(env: Env, client: Client) -> list[Any]:
    """The client follows topic t, which the daemon's metadata says has partitions 0..2; the TOPIC it is told."""
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    env.core.metadata.update(metadata_response({"t": [1, 1, 1]}), env.clock())
    env.front.serve_due()
    return client.recv()


def test_a_batch_refused_once_sealed_is_not_one_finished_while_the_brokers_take_nothing(env: Env) -> None:
    # Sealed by its claim, then refused for its partition: its blocks were never sent. Were they counted finished,
    # a pool whose brokers are away would think batches flow and limit its queue to their rate, not buffer whole.
    env.pool.limit_queue(50, 1)
    env.pool.follow_queue(env.clock())
    client = env.client()
    client_id = client.hello()
    follow_three_partitions(env, client)
    assert client.blocks(1) == [0]
    client.publish(notice(batch_id=1, first=0, partition=3))
    assert "partition 3 of topic t does not exist" in client.error()
    assert env.state(client_id, 0) == FREE
    env.clock.advance(100)
    env.pool.follow_queue(env.clock())
    assert env.pool.queue_limit == BLOCKS


def test_seal_of_a_partition_the_topic_does_not_have_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    assert follow_three_partitions(env, client) == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None, 0]
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.publish(notice(batch_id=1, first=0, partition=3), notice(batch_id=2, first=1, partition=2))
    assert "partition 3 of topic t does not exist: it has 3" in client.error()
    assert env.queued("t", 3) == [] and [b.origin[1] for b in env.queued("t", 2)] == [2]
    env.front.serve_due()
    [report] = deliveries(client)
    assert report[0] == 1 and isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    assert env.state(client_id, 0) == FREE
