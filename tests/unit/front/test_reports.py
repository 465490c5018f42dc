"""Delivery reports: each batch's outcome back to the session that sealed it."""

from __future__ import annotations

from client_stub import errors
from client_stub.contract import ipc
from service.buffer_pool import FREE, SEALED
from tests.support.front import (
    BLOCKS,
    Env,
    deliveries,
    notice,
)

# -- delivery -------------------------------------------------------------------------------------


def test_finished_batch_is_reported_after_the_iteration_and_its_blocks_come_back(env: Env) -> None:
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    run = client.blocks(2, contiguous=True)
    client.publish(notice(batch_id=9, first=run[0], count=2, records=4, length=5000))
    [batch] = env.queued()
    batch.in_flight = True  # a request still holds the bytes
    assert batch.done(42, -1, None)
    assert client.quiet()  # reports go out after the loop iteration, batched
    env.front.serve_due()
    assert deliveries(client) == [[9, 0, 4, 42, -1, None]]
    assert other.quiet()
    # The blocks stay sealed while a request may still write them to a socket.
    assert env.state(client_id, run[0]) == SEALED
    batch.in_flight = False
    batch.maybe_release()
    assert [env.state(client_id, b) for b in run] == [FREE, FREE]
    assert env.pool.free_blocks == BLOCKS


def test_reports_are_batched_per_client_and_carry_errors(env: Env) -> None:
    a, b = env.client(), env.client()
    a.hello()
    b.hello()
    a.blocks(2, contiguous=True)
    b_blocks = b.blocks(1)
    a.publish(notice(batch_id=1, first=0), notice(batch_id=2, first=1, partition=1, records=2))
    b.publish(notice(batch_id=1, first=b_blocks[0], partition=2))
    env.queued("t", 0)[0].done(100, 1_700_000_000_123, None)
    env.queued("t", 1)[0].done(-1, -1, errors.for_code(10, "batch too large"))
    env.front.serve_due()
    reports = deliveries(a)
    assert reports[0] == [1, 0, 1, 100, 1_700_000_000_123, None]
    batch_id, first, count, base_offset, _, error = reports[1]
    assert (batch_id, first, count, base_offset) == (2, 0, 2, -1)
    failure = ipc.error_from_wire(error)
    assert isinstance(failure, errors.RecordTooLargeError) and failure.code == 10
    assert b.quiet()
    env.front.serve_due()
    assert a.quiet()  # each report goes once
    assert env.pool.free_blocks == BLOCKS - 1  # b's batch is still queued
