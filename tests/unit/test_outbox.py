"""The producer's Outbox: messages posted by any thread wake the I/O thread, which sends them in order."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator

import pytest
import zmq

from client_stub.contract import ipc
from client_stub.outbox import Outbox

# What a receive waits for at most: a message already sent is there at once; this only bounds a failure.
_RECEIVE_TIMEOUT_MS = 30_000


def woken(fd: int) -> bool:
    """Whether a wake-up waits in the pipe (without taking it)."""
    return bool(select.select([fd], [], [], 0)[0])


def post_from_another_thread(outbox: Outbox, *messages: ipc.Message) -> None:
    thread = threading.Thread(target=lambda: [outbox.post(message) for message in messages])
    thread.start()
    thread.join()


def sent(outbox: Outbox, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> list[bytes]:
    """What the outbox sends now, as the daemon receives it: what was queued, up to a marker posted last."""
    client, daemon = pair
    marker = ipc.encode(ipc.Stats())
    outbox.post(ipc.Stats())
    outbox.send_all(client)
    received = []
    while True:
        assert daemon.poll(_RECEIVE_TIMEOUT_MS)
        data = daemon.recv()
        if data == marker:
            return received
        received.append(data)


def wire(*messages: ipc.Message) -> list[bytes]:
    return [ipc.encode(message) for message in messages]


@pytest.fixture
def outbox() -> Iterator[Outbox]:
    box = Outbox()
    box.open()
    yield box
    box.close()


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    daemon, client = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    daemon.bind("inproc://outbox")
    client.connect("inproc://outbox")
    yield client, daemon
    client.close(0)
    daemon.close(0)
    context.term()


def test_a_post_from_another_thread_wakes_the_io_thread_once_until_it_takes_the_wake_up(
        outbox: Outbox, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    fd = outbox.bind()  # this thread is the I/O thread
    assert not woken(fd)
    post_from_another_thread(outbox, ipc.Heartbeat(), ipc.Metadata("orders"), ipc.Goodbye())
    assert woken(fd)
    outbox.woken()
    # One read took every wake-up: the posts while one was pending wrote no more.
    assert not woken(fd)
    post_from_another_thread(outbox, ipc.Heartbeat())
    assert woken(fd)
    assert sent(outbox, pair) == wire(ipc.Heartbeat(), ipc.Metadata("orders"), ipc.Goodbye(), ipc.Heartbeat())


def test_the_io_threads_own_posts_wake_nothing(outbox: Outbox,
                                               pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    fd = outbox.bind()
    outbox.post(ipc.Metadata("orders"))  # it sends what is queued before it polls again
    assert not woken(fd)
    assert sent(outbox, pair) == wire(ipc.Metadata("orders"))


def test_send_all_sends_what_is_queued_in_order_and_empties_the_outbox(
        outbox: Outbox, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    client, daemon = pair
    messages: list[ipc.Message] = [ipc.Blocks(1, 4, False, 60000), ipc.Metadata("orders"), ipc.Release([3]),
                                   ipc.Goodbye()]
    outbox.bind()
    post_from_another_thread(outbox, *messages)
    outbox.send_all(client)
    received = []
    for _ in messages:
        assert daemon.poll(_RECEIVE_TIMEOUT_MS)
        received.append(ipc.decode(daemon.recv()))
    assert received == messages
    assert sent(outbox, pair) == []  # nothing is sent twice


def test_what_waits_for_a_session_that_is_gone_is_dropped(outbox: Outbox,
                                                          pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    outbox.post(ipc.Wakeup())
    outbox.clear()
    assert sent(outbox, pair) == []


def test_a_wake_up_before_the_pipe_is_open_or_after_it_is_closed_is_harmless(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    outbox = Outbox()
    outbox.post(ipc.Metadata("orders"))  # a producer's message before its I/O thread starts waits for it
    outbox.open()
    fd = outbox.bind()
    outbox.woken()  # nothing to take yet: the flag is cleared all the same
    post_from_another_thread(outbox, ipc.Heartbeat())
    assert woken(fd)
    outbox.close()
    post_from_another_thread(outbox, ipc.Goodbye())  # the I/O thread has ended: queued all the same, waking no one
    assert sent(outbox, pair) == wire(ipc.Metadata("orders"), ipc.Heartbeat(), ipc.Goodbye())
