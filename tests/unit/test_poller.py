"""The daemon's one poller: ZeroMQ sockets and plain ones, each served by the handler its owner registered."""

from __future__ import annotations

import socket
import threading
import time

import zmq

from service.poller import POLLIN, Poller


def test_a_zmq_message_wakes_the_poll_and_its_handler_serves_it(
        zmq_pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    inside, outside = zmq_pair
    poller = Poller()
    served: list[tuple[bytes, int]] = []
    poller.register(inside, POLLIN, lambda events: served.append((inside.recv(zmq.NOBLOCK), events)))
    sender = threading.Timer(0.1, outside.send, args=(b"seal",))
    sender.start()
    started = time.monotonic()
    try:
        poller.poll(30_000)
        # Woken by the message, not by the timeout (the margin is generous).
        assert time.monotonic() - started < 15
        assert served == [(b"seal", POLLIN)]
    finally:
        sender.join()


def test_a_plain_socket_is_served_by_its_handler_until_unregistered() -> None:
    a, b = socket.socketpair()
    poller = Poller()
    served: list[bytes] = []
    with a, b:
        poller.register(a, POLLIN, lambda events: served.append(a.recv(16)))
        poller.poll(0)
        assert served == []
        b.sendall(b"wake")
        poller.poll(5_000)
        assert served == [b"wake"]
        poller.unregister(a)
        poller.unregister(a)  # nothing the second time
        b.sendall(b"again")
        poller.poll(50)
        assert served == [b"wake"]


def test_registered_again_only_its_handler_changes() -> None:
    a, b = socket.socketpair()
    poller = Poller()
    served: list[str] = []
    with a, b:
        poller.register(a, POLLIN, lambda events: served.append("first"))
        poller.register(a, POLLIN, lambda events: served.append("second"))
        b.sendall(b"x")
        poller.poll(5_000)
        assert served == ["second"]


def test_a_handler_unregistered_by_another_in_the_same_poll_is_not_called() -> None:
    (a, a_peer), (b, b_peer) = socket.socketpair(), socket.socketpair()
    poller = Poller()
    served: list[str] = []

    def first(events: int) -> None:
        served.append("a" if not served else "late")
        poller.unregister(b)
        poller.unregister(a)

    def second(events: int) -> None:
        served.append("b")
        poller.unregister(a)
        poller.unregister(b)

    with a, a_peer, b, b_peer:
        poller.register(a, POLLIN, first)
        poller.register(b, POLLIN, second)
        a_peer.sendall(b"x")
        b_peer.sendall(b"x")
        poller.poll(5_000)
        assert served in (["a"], ["b"])  # whichever came first unregistered the other


def test_a_handler_registered_later_is_served_by_serve_ready_not_by_the_poll() -> None:
    # The clients' sockets are served after the producer's turn: their work is not counted as the brokers'.
    (a, a_peer), (b, b_peer) = socket.socketpair(), socket.socketpair()
    poller = Poller()
    served: list[str] = []
    with a, a_peer, b, b_peer:
        poller.register(a, POLLIN, lambda events: served.append("client " + a.recv(16).decode()), later=True)
        poller.register(b, POLLIN, lambda events: served.append("broker " + b.recv(16).decode()))
        a_peer.sendall(b"seal")
        b_peer.sendall(b"ack")
        deadline = time.monotonic() + 10
        while not served and time.monotonic() < deadline:
            poller.poll(100)
        assert served == ["broker ack"]
        started = time.monotonic()
        poller.poll(60_000)  # a client's socket ready and not served yet: the poll does not wait
        assert time.monotonic() - started < 30
        poller.serve_ready()
        assert served == ["broker ack", "client seal"]
        poller.serve_ready()  # served once
        assert served == ["broker ack", "client seal"]


def test_a_socket_unregistered_before_it_is_served_later_is_not_served() -> None:
    a, a_peer = socket.socketpair()
    poller = Poller()
    served: list[int] = []
    with a, a_peer:
        poller.register(a, POLLIN, served.append, later=True)
        a_peer.sendall(b"x")
        poller.poll(5_000)
        poller.unregister(a)
        poller.serve_ready()
        assert served == []


def test_wakeup_from_another_thread_ends_a_long_poll() -> None:
    poller = Poller()
    waker = threading.Timer(0.2, poller.wakeup)
    waker.start()
    started = time.monotonic()
    poller.poll(60_000)
    waker.join()
    assert time.monotonic() - started < 30, "poll() waited out its timeout"


def test_wakeups_before_a_poll_end_only_that_poll() -> None:
    poller = Poller()
    for _ in range(70_000):  # more than the pipe holds (64 KiB): the extra wake-ups are dropped, not blocking
        poller.wakeup()
    poller.poll(60_000)
    started = time.monotonic()
    poller.poll(50)
    assert time.monotonic() - started >= 0.04, "a wake-up was left for the next poll"
