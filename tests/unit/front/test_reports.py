"""Delivery reports: each batch's outcome back to the session that sealed it."""

from __future__ import annotations

from client_stub import errors
from client_stub.contract import batch_slots, ipc
from service.buffer_pool import FREE, OWNED, SEALED
from service.daemon_metrics import process_metrics
from service.front.reports import IDLE_REPORT_INTERVAL_MS, REPORT_INTERVAL_MS, REPORTS_PER_DELIVERY
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


def test_a_process_that_waits_on_no_report_gets_them_a_second_apart_and_at_once_when_it_waits(env: Env) -> None:
    client = env.client()
    client.hello()
    pid = env.session(client.client_id).pid
    blocks = client.blocks(4)

    def finish(batch_id: int) -> None:
        client.publish(notice(batch_id=batch_id, first=blocks[batch_id - 1]))
        env.queued()[-1].done(batch_id, -1, None)
        env.front.serve_due()

    def wants_reports(wanted: int) -> None:
        with client.control() as control:
            control.set_header(batch_slots.REPORTS_WANTED, wanted)

    finish(1)
    assert [report[0] for report in deliveries(client)] == [1]  # the first after a quiet while, at once
    finish(2)
    finish(3)
    assert client.quiet() and env.front.reports.due_in_ms(env.clock()) == [IDLE_REPORT_INTERVAL_MS]
    env.clock.advance(IDLE_REPORT_INTERVAL_MS - 1)
    env.front.serve_due()
    assert client.quiet()
    env.clock.advance(1)
    env.front.serve_due()
    assert [report[0] for report in deliveries(client)] == [2, 3]
    # Its process waits on a report (a callback, a future, a flush): reports go REPORT_INTERVAL_MS apart.
    wants_reports(1)
    finish(4)
    assert client.quiet() and env.front.reports.due_in_ms(env.clock()) == [REPORT_INTERVAL_MS]
    env.clock.advance(REPORT_INTERVAL_MS)
    env.front.serve_due()
    assert [report[0] for report in deliveries(client)] == [4]
    [process] = process_metrics(env.pool, env.front)
    assert (process["pid"], process["delivery-messages-total"]) == (pid, 3)


def test_the_reports_hand_a_client_the_spare_blocks_it_would_take_at_most_one_a_batch_and_none_past_a_waiter(
        env: Env) -> None:
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    blocks = client.blocks(3)

    def finish(*batches: tuple[int, int]) -> tuple[list[int], list[int]]:
        """Publish, finish and report batches (batch id, block): the ids reported, and the blocks handed back."""
        client.publish(*(notice(batch_id=batch_id, first=block) for batch_id, block in batches))
        for batch in env.queued():
            batch.done(1, -1, None)
        env.clock.advance(REPORT_INTERVAL_MS)
        env.front.serve_due()
        message = client.recv()
        assert message[0] == ipc.Delivery.TYPE, message
        return [report[0] for report in message[1]], message[2]

    with client.control() as control:
        control.set_header(batch_slots.REPORTS_WANTED, 1)
    # A client that says nothing of spare blocks (one of an older version) gets none unasked.
    assert finish((1, blocks[0])) == ([1], [])
    with client.control() as control:
        control.set_header(batch_slots.SPARE_WANTED, 5)
    reported, spare = finish((2, blocks[1]), (3, blocks[2]))
    assert reported == [2, 3] and len(spare) == 2  # of the 5 it would take, one a batch reported
    assert [env.state(client_id, block) for block in spare] == [OWNED, OWNED]
    # Another client waits for the pool: what comes back goes to it, none unasked.
    other.blocks(env.pool.free_blocks)
    other.send(ipc.Blocks.TYPE, 99, 1, False, 10_000)
    env.pump()
    assert other.quiet()
    assert finish((4, spare[0])) == ([4], [])
    assert other.recv()[:2] == [ipc.Grant.TYPE, 99]


def test_reports_of_a_process_that_waits_on_none_go_once_a_delivery_is_full(env: Env) -> None:
    client = env.client()
    client.hello()
    [block] = client.blocks(1)
    client.publish(notice(batch_id=1, first=block))
    [batch] = env.queued()
    batch.done(1, -1, None)
    env.front.serve_due()
    deliveries(client)
    session = env.session(client.client_id)
    session.reports.extend([[n, 0, 1, n, -1, None] for n in range(2, 2 + REPORTS_PER_DELIVERY - 1)])
    env.clock.advance(REPORT_INTERVAL_MS)
    env.front.serve_due()
    assert client.quiet()
    session.reports.append([REPORTS_PER_DELIVERY + 1, 0, 1, 0, -1, None])
    env.front.serve_due()
    assert len(deliveries(client)) == REPORTS_PER_DELIVERY


def test_the_reports_held_for_a_client_go_before_blocks_granted_to_it(env: Env) -> None:
    # A batch's blocks may be granted again once it is sent: its client must know it finished before it writes
    # there, however long its reports would be held otherwise.
    client = env.client()
    client.hello()
    blocks = client.blocks(2)
    for batch_id in (1, 2):
        client.publish(notice(batch_id=batch_id, first=blocks[batch_id - 1]))
        env.queued()[-1].done(batch_id, -1, None)
        env.front.serve_due()
    assert [report[0] for report in deliveries(client)] == [1]
    assert client.quiet()  # held: its process waits on none
    client.send(ipc.Blocks.TYPE, 7, 1, False, 1000)
    env.pump()
    assert [report[0] for report in deliveries(client)] == [2]
    assert client.recv()[:2] == [ipc.Grant.TYPE, 7]
