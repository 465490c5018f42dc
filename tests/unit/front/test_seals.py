"""Seal notices made batches over the client's shared memory: each checked on its own."""

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
    client.seal(notice(batch_id=41, first=run[0], count=2, topic="orders", partition=3, records=4,
                       length=len(written), base_ts=1_700_000_000_000, max_ts=1_700_000_000_009, ago=25))
    assert client.quiet()  # a seal is not answered; its DELIVERY comes when the batch is finished
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


def test_seal_of_blocks_granted_to_another_client_is_refused(env: Env) -> None:
    owner, thief = env.client(), env.client()
    owner_id = owner.hello()
    thief_id = thief.hello()
    blocks = owner.blocks(2, contiguous=True)
    thief.seal(notice(batch_id=7, first=blocks[0], count=2, length=200))
    assert "seal refused" in thief.error()
    assert env.core.accumulator.queued_batches() == 0
    # The owner's blocks are untouched, and the owner hears nothing; the thief was granted nothing.
    assert [env.state(owner_id, b) for b in blocks] == [OWNED, OWNED]
    assert env.pool.held_by(thief_id) == 0
    env.front.serve_due()
    [[batch_id, first, count, base_offset, log_append_time, error]] = deliveries(thief)
    assert (batch_id, first, base_offset, log_append_time) == (7, 0, -1, -1)
    assert count >= 1  # every record of the batch
    failure = ipc.error_from_wire(error)
    assert isinstance(failure, errors.InvalidRequestError) and "not granted" in str(failure)
    assert owner.quiet()
    # The owner can still seal them.
    owner.seal(notice(batch_id=1, first=blocks[0], count=2, length=200))
    assert len(env.queued()) == 1


GOOD = notice(batch_id=5, first=0, count=2, length=5000, records=3)


def _with(**changes: Any) -> list[Any]:
    fields = dict(zip(ipc.SealNotice._fields, GOOD, strict=True))
    fields.update(changes)
    return [fields[name] for name in ipc.SealNotice._fields]


@pytest.mark.parametrize(("bad", "reason"), [
    (GOOD[:9], "a seal notice has the fields"),
    ([*GOOD, 0], "a seal notice has the fields"),
    (_with(first_block=-1), "first_block"),
    (_with(first_block=BLOCKS), "first_block"),
    (_with(block_count=0), "block_count"),
    (_with(block_count=3), "block 2 is not granted"),
    (_with(block_count=BLOCKS + 1), "block_count"),
    (_with(topic="bad topic"), "invalid topic name"),
    (_with(topic=""), "invalid topic name"),
    (_with(topic=".."), "invalid topic name"),
    (_with(topic=5), "invalid topic name"),
    (_with(topic="x" * 250), "invalid topic name"),
    (_with(partition=-1), "partition"),
    (_with(partition="0"), "partition"),
    (_with(partition=True), "partition"),
    (_with(partition=2**31), "partition"),
    (_with(record_count=0), "record_count"),
    (_with(record_count=1.0), "record_count"),
    (_with(record_count=5001), "record_count"),
    (_with(length=0), "length"),
    (_with(length=-5), "length"),
    (_with(length=None), "length"),
    (_with(length=2 * BLOCK + 1), "length"),
    (_with(length=MAX_REQUEST_SIZE + 1), "larger than max.request.size"),
    (_with(base_timestamp=-2), "base_timestamp"),
    (_with(max_timestamp="now"), "max_timestamp"),
    (_with(created_ms_ago=-1), "created_ms_ago"),
    (_with(created_ms_ago=2**41), "created_ms_ago"),
], ids=lambda value: str(value)[:40] if isinstance(value, str) else None)
def test_seal_with_bad_fields_is_refused(env: Env, bad: list[Any], reason: str) -> None:
    client = env.client()
    client_id = client.hello()
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.seal(bad)
    text = client.error()
    assert text.startswith("seal refused") and reason in text
    assert env.core.accumulator.queued_batches() == 0
    assert all(env.state(client_id, b) != SEALED for b in range(BLOCKS))
    env.front.serve_due()
    [report] = deliveries(client)
    assert report[0] == 5 and report[3] == -1
    assert isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    # The client counts the batch as failed and will never use or release these blocks again:
    # those it holds went back to the pool.
    named = range(max(bad[1], 0), min(bad[1] + bad[2], BLOCKS))
    assert not any(env.state(client_id, b) == OWNED for b in named)
    assert env.pool.held_by(client_id) == 2 - len(set(named) & {0, 1})


@pytest.mark.parametrize("bad", [{"batch_id": 5}, 5, None, [], ["5", *GOOD[1:]], [True, *GOOD[1:]]],
                         ids=["map", "int", "nil", "empty", "text-id", "bool-id"])
def test_seal_notice_without_a_batch_id_is_refused_without_report(env: Env, bad: Any) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(2, contiguous=True)
    client.seal(bad)
    assert client.error().startswith("seal refused")
    env.front.serve_due()
    assert client.quiet()
    assert env.core.accumulator.queued_batches() == 0
    # Nothing says which batch failed, so the client may still use its blocks.
    assert [env.state(client_id, 0), env.state(client_id, 1)] == [OWNED, OWNED]


@pytest.mark.parametrize("message", [[ipc.Seal.TYPE, {"1": notice()}], [ipc.Seal.TYPE, [notice()], "extra"],
                                     [ipc.Seal.TYPE]],
                         ids=["not-a-list", "extra-field", "no-notices"])
def test_malformed_seal_message_is_refused(env: Env, message: list[Any]) -> None:
    client = env.client()
    client.hello()
    client.blocks(1)
    client.send(*message)
    env.pump()
    client.error()
    assert env.core.accumulator.queued_batches() == 0


def test_one_bad_notice_does_not_spoil_the_others(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.blocks(3, contiguous=True) == [0, 1, 2]
    client.seal(notice(batch_id=1, first=0), notice(batch_id=2, first=1, topic="no/slash"),
                notice(batch_id=3, first=2, partition=1))
    assert "invalid topic name" in client.error()
    assert [b.origin[1] for b in env.queued("t", 0)] == [1]
    assert [b.origin[1] for b in env.queued("t", 1)] == [3]
    env.front.serve_due()
    assert [report[0] for report in deliveries(client)] == [2]


def test_the_same_blocks_cannot_be_sealed_twice(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.blocks(1, contiguous=True)
    client.seal(notice(batch_id=1))
    client.seal(notice(batch_id=2))
    assert "not granted" in client.error()
    assert len(env.queued()) == 1
    assert env.state(client_id, 0) == SEALED  # the first batch still holds it


def test_seal_of_a_partition_the_topic_does_not_have_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello()
    client.send(ipc.Metadata.TYPE, "t")
    env.pump()
    env.core.metadata.update(metadata_response({"t": [1, 1, 1]}), env.clock())
    env.front.serve_due()
    assert client.recv() == [ipc.Topic.TYPE, "t", 3, [0, 1, 2], None]
    assert client.blocks(2, contiguous=True) == [0, 1]
    client.seal(notice(batch_id=1, first=0, partition=3), notice(batch_id=2, first=1, partition=2))
    assert "partition 3 of topic t does not exist: it has 3" in client.error()
    assert env.queued("t", 3) == [] and [b.origin[1] for b in env.queued("t", 2)] == [2]
    env.front.serve_due()
    [report] = deliveries(client)
    assert report[0] == 1 and isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
    assert env.state(client_id, 0) == FREE
