"""InFlightRequests: per-node deques, oldest first, with the in-flight limit and timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from service.network.in_flight import InFlightRequests


@dataclass(eq=False)
class Request:
    destination: int
    send_ms: int = 0
    request_timeout_ms: int = 1000


def test_empty() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    assert in_flight.count() == 0 and in_flight.count(1) == 0
    assert in_flight.oldest(1) is None
    assert in_flight.can_send_more(1)
    assert in_flight.clear_all(1) == []
    assert in_flight.nodes_with_timed_out_requests(10**9) == []
    assert list(in_flight) == []


def test_responses_complete_the_oldest_request_of_their_node() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    a1, a2, b1, a3 = Request(1), Request(1), Request(2), Request(1)
    for request in (a1, a2, b1, a3):
        in_flight.add(request)
    assert in_flight.count() == 4 and in_flight.count(1) == 3 and in_flight.count(2) == 1
    assert in_flight.oldest(1) is a1
    assert in_flight.complete_next(1) is a1
    assert in_flight.oldest(1) is a2
    assert in_flight.complete_next(2) is b1
    assert in_flight.count() == 2 and in_flight.count(2) == 0
    assert list(in_flight) == [a2, a3]


def test_a_request_without_response_is_completed_from_the_newest_end() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    waiting, acks0 = Request(1), Request(1)
    in_flight.add(waiting)
    in_flight.add(acks0)
    assert in_flight.complete_last(1) is acks0
    assert in_flight.oldest(1) is waiting and in_flight.count() == 1


def test_the_limit_is_per_connection() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(2)
    in_flight.add(Request(1))
    assert in_flight.can_send_more(1)
    in_flight.add(Request(1))
    assert not in_flight.can_send_more(1)
    assert in_flight.can_send_more(2)
    in_flight.complete_next(1)
    assert in_flight.can_send_more(1)


def test_clear_all_returns_the_requests_of_a_node_oldest_first() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    first, second, other = Request(1), Request(1), Request(2)
    for request in (first, second, other):
        in_flight.add(request)
    assert in_flight.clear_all(1) == [first, second]
    assert in_flight.count() == 1 and in_flight.count(1) == 0
    assert in_flight.can_send_more(1)
    assert list(in_flight) == [other]


def test_nodes_with_timed_out_requests() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    in_flight.add(Request(1, send_ms=1000, request_timeout_ms=500))
    in_flight.add(Request(2, send_ms=1000, request_timeout_ms=2000))
    assert in_flight.nodes_with_timed_out_requests(1500) == []  # exactly at the timeout: not yet
    assert in_flight.nodes_with_timed_out_requests(1501) == [1]
    assert sorted(in_flight.nodes_with_timed_out_requests(3001)) == [1, 2]
    in_flight.clear_all(1)
    assert in_flight.nodes_with_timed_out_requests(2000) == []


def test_a_later_request_with_a_shorter_timeout_times_out_first() -> None:
    in_flight: InFlightRequests[Request] = InFlightRequests(5)
    in_flight.add(Request(1, send_ms=1000, request_timeout_ms=30_000))
    in_flight.add(Request(1, send_ms=1100, request_timeout_ms=100))
    assert in_flight.nodes_with_timed_out_requests(1200) == []
    assert in_flight.nodes_with_timed_out_requests(1201) == [1]
