"""ClusterConnectionStates: the state of the connection to every node, and reconnect backoff."""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass


class ConnectionState(enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    AUTHENTICATING = "AUTHENTICATING"
    CHECKING_API_VERSIONS = "CHECKING_API_VERSIONS"
    READY = "READY"
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"

    @property
    def is_disconnected(self) -> bool:
        return self in (ConnectionState.DISCONNECTED, ConnectionState.AUTHENTICATION_FAILED)



class ExponentialBackoff:
    """``initial * multiplier**attempts`` spread by +-jitter and capped at ``maximum``, as Kafka's.

    As Java's ExponentialBackoff, the exponent stops growing once the term reaches the maximum,
    and the cap applies after the jitter: a backoff never exceeds ``maximum``.
    """

    def __init__(self, initial_ms: int, multiplier: float, maximum_ms: int, jitter: float,
                 rng: random.Random | None = None) -> None:
        self.initial_ms = initial_ms
        self.multiplier = multiplier
        self.maximum_ms = maximum_ms
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._max_exponent = (math.log(maximum_ms / max(initial_ms, 1)) / math.log(multiplier)
                              if maximum_ms > initial_ms else 0.0)

    def backoff(self, attempts: int) -> int:
        if self._max_exponent == 0:
            return self.initial_ms
        term = self.initial_ms * self.multiplier ** min(attempts, self._max_exponent)
        spread = self._rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return min(int(term * spread), self.maximum_ms)


@dataclass(slots=True)
class NodeConnectionState:
    state: ConnectionState
    last_connect_attempt_ms: int
    failed_attempts: int = 0
    reconnect_backoff_ms: int = 0
    connection_setup_timeout_ms: int = 0


class ClusterConnectionStates:
    """Per node: DISCONNECTED -> CONNECTING -> CHECKING_API_VERSIONS -> [AUTHENTICATING] -> READY (and READY ->
    AUTHENTICATING -> READY when a SASL session is renewed).

    A node that disconnected may be tried again once its reconnect backoff has
    passed: ``reconnect.backoff.ms`` doubled with every failed attempt, with 20%
    jitter, and never more than ``reconnect.backoff.max.ms``.
    """

    def __init__(self, reconnect_backoff_ms: int, reconnect_backoff_max_ms: int,
                 connection_setup_timeout_ms: int, rng: random.Random | None = None) -> None:
        self._backoff = ExponentialBackoff(reconnect_backoff_ms, 2, reconnect_backoff_max_ms, 0.2, rng)
        self._setup_timeout_ms = connection_setup_timeout_ms
        self._nodes: dict[int, NodeConnectionState] = {}

    def state(self, node_id: int) -> ConnectionState:
        entry = self._nodes.get(node_id)
        return ConnectionState.DISCONNECTED if entry is None else entry.state

    def can_connect(self, node_id: int, now: int) -> bool:
        entry = self._nodes.get(node_id)
        if entry is None:
            return True
        return entry.state.is_disconnected and now - entry.last_connect_attempt_ms >= entry.reconnect_backoff_ms

    def connection_delay(self, node_id: int, now: int) -> int:
        """Milliseconds until a connection attempt is allowed (0 if now); large if connected."""
        entry = self._nodes.get(node_id)
        if entry is None:
            return 0
        if entry.state.is_disconnected:
            return max(entry.reconnect_backoff_ms - (now - entry.last_connect_attempt_ms), 0)
        return 2**31 - 1

    def connecting(self, node_id: int, now: int) -> None:
        entry = self._nodes.get(node_id)
        if entry is None:
            entry = self._nodes[node_id] = NodeConnectionState(ConnectionState.CONNECTING, now)
        entry.state = ConnectionState.CONNECTING
        entry.last_connect_attempt_ms = now
        entry.connection_setup_timeout_ms = self._setup_timeout_ms

    def connection_setup_expired(self, node_id: int, now: int) -> bool:
        entry = self._nodes.get(node_id)
        return (entry is not None and entry.state is ConnectionState.CONNECTING
                and now - entry.last_connect_attempt_ms > entry.connection_setup_timeout_ms)

    def connecting_nodes(self) -> list[int]:
        return [n for n, e in self._nodes.items() if e.state is ConnectionState.CONNECTING]

    def authenticating(self, node_id: int) -> None:
        self._nodes[node_id].state = ConnectionState.AUTHENTICATING

    def checking_api_versions(self, node_id: int) -> None:
        self._nodes[node_id].state = ConnectionState.CHECKING_API_VERSIONS

    def ready(self, node_id: int) -> None:
        entry = self._nodes[node_id]
        entry.state = ConnectionState.READY
        entry.failed_attempts = 0
        entry.reconnect_backoff_ms = 0

    def is_ready(self, node_id: int) -> bool:
        return self.state(node_id) is ConnectionState.READY

    def disconnected(self, node_id: int, now: int) -> None:
        entry = self._nodes.get(node_id)
        if entry is None:
            return
        entry.state = ConnectionState.DISCONNECTED
        entry.reconnect_backoff_ms = self._backoff.backoff(entry.failed_attempts)
        entry.failed_attempts += 1
        entry.last_connect_attempt_ms = now

    def authentication_failed(self, node_id: int) -> None:
        """A node that disconnected (:meth:`disconnected`) because it refused the client's credentials."""
        entry = self._nodes.get(node_id)
        if entry is not None:
            entry.state = ConnectionState.AUTHENTICATION_FAILED

    def remove(self, node_id: int) -> None:
        self._nodes.pop(node_id, None)
