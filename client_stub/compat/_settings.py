"""What the drop-in producers share: the settings the daemon owns, read as Kafka names them and checked against
the daemon's; closing the client's producer from any thread."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ..contract.ipc import WelcomeSettings
from ..producer import Producer

__all__ = ["DAEMON_SETTINGS", "DaemonSettingWarning", "SettingsCheck", "close_producer"]

_INT_MAX = 2**31 - 1
_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class DaemonSettingWarning(UserWarning):
    """A setting the daemon owns was given a value other than the daemon's, which is the one that applies."""


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("an integer, not a boolean")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return _INT_MAX  # kafka-python's retries=float('inf'): as many as Kafka counts
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"an integer, not {value}")
    # As librdkafka reads an integer property: a fraction is cut off.
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        return int(float(value))
    raise ValueError(f"an integer, not {type(value).__name__}")


def _acks(value: Any) -> int:
    if isinstance(value, str) and value.strip().lower() == "all":
        return -1
    acks = _integer(value)
    if not -1 <= acks <= 1000:
        raise ValueError("all, -1, 0 or a number of replicas")
    return acks


def _boolean(value: Any) -> bool:
    # As librdkafka reads a boolean: true or false in any case, or 1 or 0 (a number or a string).
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError("true or false")


def whole_ms(value: Any) -> int:
    """A number of milliseconds as the client takes them, whole: a fraction (librdkafka's linger.ms is a double,
    kafka-python's may be a float) rounds up, so that a wait asked for is never none. ValueError if no number."""
    if isinstance(value, bool):
        raise ValueError("a number of milliseconds, not a boolean")
    return math.ceil(float(value))


def _compression(value: Any) -> str:
    codec = "none" if value is None else str(value).strip().lower()
    if codec not in _CODECS:
        raise ValueError(f"one of {', '.join(_CODECS)}")
    return codec


# The daemon's settings a client may name, by their Kafka names, each with the reader of a value given for it.
# Each is a field of the daemon's WelcomeSettings (its Kafka name with "_" for ".").
DAEMON_SETTINGS: dict[str, Callable[[Any], object]] = {
    "acks": _acks,
    "compression.type": _compression,
    "enable.idempotence": _boolean,
    "retries": _integer,
    "delivery.timeout.ms": _integer,
    "request.timeout.ms": _integer,
    "batch.size": _integer,
    "max.request.size": _integer,
    "max.in.flight.requests.per.connection": _integer,
    "retry.backoff.ms": _integer,
    "allow.auto.create.topics": _boolean,
}

# What this process has warned of: (the application's name for the setting, its value, the daemon's value).
_warned: set[tuple[str, object, object]] = set()


class SettingsCheck:
    """The daemon's settings an application gave values for, checked once the daemon has said its own.

    ``given`` maps each Kafka name to the application's name for the setting and the value it gave;
    ValueError names the first value that cannot be read. :meth:`check` warns of each that differs from the
    daemon's (:class:`DaemonSettingWarning`), once per process.
    """

    def __init__(self, given: Mapping[str, tuple[str, Any]]) -> None:
        self.given: dict[str, tuple[str, object]] = {}
        for kafka_name, (own_name, value) in given.items():
            try:
                self.given[kafka_name] = (own_name, DAEMON_SETTINGS[kafka_name](value))
            except (TypeError, ValueError) as exc:
                raise ValueError(f'Invalid value {value!r} for configuration property "{own_name}": '
                                 f"expected {exc}") from None
        self.done = not self.given

    def check(self, settings: WelcomeSettings | None) -> None:
        """Warn of the given values that differ from the daemon's ``settings`` (once they are known)."""
        if self.done or settings is None:
            return
        self.done = True
        for kafka_name, (own_name, wanted) in self.given.items():
            actual = getattr(settings, kafka_name.replace(".", "_"))
            if actual is None or actual == wanted or (own_name, wanted, actual) in _warned:
                continue  # a daemon of an earlier release does not say this one
            _warned.add((own_name, wanted, actual))
            # stacklevel: the application's call of the producer method that checks.
            warnings.warn(f"{own_name}={wanted!r} is not what the kafka-sidecar daemon does: its {kafka_name} is "
                          f"{actual!r}, which applies to every record; set it in the daemon's configuration",
                          DaemonSettingWarning, stacklevel=3)


def close_producer(producer: Producer, timeout: float | None) -> None:
    """Close the client's ``producer``, waiting up to ``timeout`` seconds for its records; on its own I/O thread (a
    delivery callback, or a finalizer run there) with timeout 0, from a thread of its own: close() there would
    wait for the I/O thread itself."""
    if producer._io.is_current():
        threading.Thread(target=producer.close, args=(0,), name="kafka-sidecar-close").start()
    else:
        producer.close(timeout)
