"""InFlightRequests: the requests sent to each node and not yet answered, oldest first."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class _InFlight(Protocol):
    destination: int
    send_ms: int
    request_timeout_ms: int


R = TypeVar("R", bound=_InFlight)


class InFlightRequests(Generic[R]):
    """A deque per node. Kafka answers a connection's requests in order, so a
    response always belongs to the oldest request of its node."""

    def __init__(self, max_in_flight_per_connection: int) -> None:
        self.max_per_connection = max_in_flight_per_connection
        self._requests: dict[int, deque[R]] = {}
        self._total = 0

    def add(self, request: R) -> None:
        self._requests.setdefault(request.destination, deque()).append(request)
        self._total += 1

    def oldest(self, node_id: int) -> R | None:
        queue = self._requests.get(node_id)
        return queue[0] if queue else None

    def complete_next(self, node_id: int) -> R:
        """Remove and return the oldest request of ``node_id`` (its response arrived)."""
        request = self._requests[node_id].popleft()
        self._total -= 1
        return request

    def complete_last(self, node_id: int) -> R:
        """Remove and return the newest request (one that expects no response)."""
        request = self._requests[node_id].pop()
        self._total -= 1
        return request

    def can_send_more(self, node_id: int) -> bool:
        queue = self._requests.get(node_id)
        return not queue or len(queue) < self.max_per_connection

    def count(self, node_id: int | None = None) -> int:
        if node_id is None:
            return self._total
        queue = self._requests.get(node_id)
        return len(queue) if queue else 0

    def clear_all(self, node_id: int) -> list[R]:
        """Remove every request of ``node_id`` (its connection is gone), oldest first."""
        queue = self._requests.pop(node_id, None)
        if not queue:
            return []
        self._total -= len(queue)
        return list(queue)

    def nodes_with_timed_out_requests(self, now: int) -> list[int]:
        """Nodes with a request that has waited longer than its request timeout.

        Every request is checked, not just the oldest: a later one may have a shorter timeout.
        """
        return [node for node, queue in self._requests.items()
                if any(now - r.send_ms > r.request_timeout_ms for r in queue)]

    def __iter__(self) -> Iterator[R]:
        for queue in self._requests.values():
            yield from queue
