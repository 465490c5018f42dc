"""ClusterConnectionStates and ExponentialBackoff: the life cycle of a node's connection and
reconnect.backoff.ms / reconnect.backoff.max.ms with jitter."""

from __future__ import annotations

import random

import pytest

from service.network.connection_states import ClusterConnectionStates, ConnectionState, ExponentialBackoff

NODE = 1
NOW = 1_000_000


def states(backoff_ms: int = 50, backoff_max_ms: int = 1000, setup_timeout_ms: int = 10_000,
           seed: int = 3) -> ClusterConnectionStates:
    return ClusterConnectionStates(backoff_ms, backoff_max_ms, setup_timeout_ms, random.Random(seed))


def test_a_node_never_seen_is_disconnected_and_may_connect() -> None:
    s = states()
    assert s.state(NODE) is ConnectionState.DISCONNECTED
    assert s.can_connect(NODE, NOW)
    assert s.connection_delay(NODE, NOW) == 0
    s.disconnected(NODE, NOW)  # nothing to do for an unknown node: no backoff starts
    assert s.can_connect(NODE, NOW) and s.connection_delay(NODE, NOW) == 0


def test_life_cycle_to_ready() -> None:
    s = states()
    s.connecting(NODE, NOW)
    assert s.state(NODE) is ConnectionState.CONNECTING
    assert s.connecting_nodes() == [NODE]
    assert not s.can_connect(NODE, NOW + 10**9)  # connecting already
    assert s.connection_delay(NODE, NOW) == 2**31 - 1

    s.authenticating(NODE)
    assert s.state(NODE) is ConnectionState.AUTHENTICATING and not s.state(NODE).is_disconnected
    s.checking_api_versions(NODE)
    assert s.state(NODE) is ConnectionState.CHECKING_API_VERSIONS
    assert not s.state(NODE).is_disconnected and not s.is_ready(NODE) and s.connecting_nodes() == []
    s.ready(NODE)
    assert s.is_ready(NODE) and not s.state(NODE).is_disconnected
    assert not s.can_connect(NODE, NOW)
    assert s.connection_delay(NODE, NOW) == 2**31 - 1

    # Removed, the node is one never seen: it may connect at once.
    s.remove(NODE)
    assert s.state(NODE) is ConnectionState.DISCONNECTED
    assert s.can_connect(NODE, NOW) and s.connection_delay(NODE, NOW) == 0


def test_disconnect_backs_off_then_allows_a_reconnect() -> None:
    s = states(backoff_ms=100, backoff_max_ms=100)  # no growth, no jitter
    s.connecting(NODE, NOW)
    s.disconnected(NODE, NOW + 5)
    assert s.state(NODE) is ConnectionState.DISCONNECTED
    assert not s.can_connect(NODE, NOW + 5)
    assert not s.can_connect(NODE, NOW + 104)
    assert s.connection_delay(NODE, NOW + 5) == 100
    assert s.connection_delay(NODE, NOW + 55) == 50
    assert s.can_connect(NODE, NOW + 105)
    assert s.connection_delay(NODE, NOW + 500) == 0


def test_backoff_doubles_up_to_the_maximum_with_jitter() -> None:
    s = states(backoff_ms=50, backoff_max_ms=1000)
    delays = []
    now = NOW
    for _ in range(10):
        s.connecting(NODE, now)
        s.disconnected(NODE, now)
        delays.append(s.connection_delay(NODE, now))
        now += delays[-1]
    for attempt, delay in enumerate(delays):
        expected = min(50 * 2**attempt, 1000)
        assert 0.8 * expected <= delay <= min(1.2 * expected, 1000), (attempt, delays)
    assert len(set(delays[-4:])) > 1  # jitter spreads the capped ones, below the maximum


def test_ready_resets_the_backoff() -> None:
    s = states(backoff_ms=50, backoff_max_ms=10_000)
    for _ in range(6):
        s.connecting(NODE, NOW)
        s.disconnected(NODE, NOW)
    assert s.connection_delay(NODE, NOW) > 1000
    s.connecting(NODE, NOW)
    s.checking_api_versions(NODE)
    s.ready(NODE)
    s.disconnected(NODE, NOW)
    assert 40 <= s.connection_delay(NODE, NOW) <= 60


def test_authentication_failure_backs_off_like_a_disconnect() -> None:
    s = states(backoff_ms=100, backoff_max_ms=100)
    s.connecting(NODE, NOW)
    s.authenticating(NODE)
    s.disconnected(NODE, NOW)
    s.authentication_failed(NODE)
    assert s.state(NODE) is ConnectionState.AUTHENTICATION_FAILED
    assert s.state(NODE).is_disconnected
    assert not s.can_connect(NODE, NOW + 99)
    assert s.can_connect(NODE, NOW + 100)


def test_connection_setup_timeout_applies_while_connecting() -> None:
    s = states(setup_timeout_ms=500)
    s.connecting(NODE, NOW)
    assert not s.connection_setup_expired(NODE, NOW + 500)
    assert s.connection_setup_expired(NODE, NOW + 501)
    s.checking_api_versions(NODE)
    assert not s.connection_setup_expired(NODE, NOW + 10_000)
    assert not s.connection_setup_expired(2, NOW + 10_000)


@pytest.mark.parametrize("seed", range(5))
def test_exponential_backoff(seed: int) -> None:
    backoff = ExponentialBackoff(100, 2, 5000, 0.2, random.Random(seed))
    for attempts in range(12):
        expected = min(100 * 2**attempts, 5000)
        assert 0.8 * expected <= backoff.backoff(attempts) <= min(1.2 * expected, 5000)
    assert 0.8 * 5000 <= backoff.backoff(10_000) <= 5000  # huge attempt counts are fine


def test_jitter_never_takes_the_backoff_above_the_maximum() -> None:
    # As Java's ExponentialBackoff: the jitter applies first, then the cap.
    backoff = ExponentialBackoff(50, 2, 1000, 0.2, random.Random(11))
    capped = [backoff.backoff(attempts) for attempts in range(5, 10) for _ in range(200)]
    assert max(capped) == 1000  # the jitter above the maximum is cut off ...
    assert min(capped) >= 800 and len(set(capped)) > 100  # ... the jitter below it spreads the attempts
    # Below the cap, +-20% around the doubled term: 50 * 2**3 = 400.
    assert {320 <= backoff.backoff(3) <= 480 for _ in range(200)} == {True}


def test_exponential_backoff_without_jitter_or_room_to_grow() -> None:
    assert [ExponentialBackoff(50, 2, 1000, 0).backoff(a) for a in range(7)] == [50, 100, 200, 400, 800, 1000, 1000]
    assert {ExponentialBackoff(50, 2, 50, 0.2).backoff(a) for a in range(5)} == {50}
    assert ExponentialBackoff(50, 2, 10, 0.2).backoff(3) == 50  # a maximum below the initial is the initial
