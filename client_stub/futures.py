"""Record futures, and their completion from delivery reports.

Kafka's Java producer returns a FutureRecordMetadata per record and completes it
with a RecordMetadata; here the same, as a :class:`concurrent.futures.Future`.
Futures are completed by the fast path's Completer (:mod:`client_stub.fastpath`),
on the producer's I/O thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, RUNNING
from typing import TYPE_CHECKING, NamedTuple

from .errors import KafkaError
from .fastpath import Completer

if TYPE_CHECKING:
    from concurrent.futures._base import _Waiter

# The producer's logger: a failed callback is the producer's to the application.
log = logging.getLogger("client_stub.producer")

# on_delivery(error, metadata): one of the two is None. What it returns is ignored.
DeliveryCallback = Callable[["KafkaError | None", "RecordMetadata | None"], object]


class RecordMetadata(NamedTuple):
    """Where a record landed."""

    topic: str
    partition: int
    offset: int
    """The record's offset in its partition; -1 when the broker does not say (acks=0)."""
    timestamp_ms: int
    """The record's timestamp, or the broker's append time for a topic with LogAppendTime (ms since the epoch)."""
    serialized_key_size: int
    """The key's size in bytes once serialized; -1 for a null key."""
    serialized_value_size: int
    """The value's size in bytes once serialized; -1 for a null value."""


# Guards the first use of a RecordFuture's Condition against its completion.
_CONDITION_LOCK = threading.Lock()


def _nobody_to_tell() -> None:
    pass


# Called when a record future is first waited on or watched (result(), wait(), add_done_callback() ...), from
# whatever thread, the producer's lock held or not: client_stub.producer sets it to have its producers' reports
# sent at once (a process that waits on no report gets them later).
on_watch: Callable[[], None] = _nobody_to_tell


class RecordFuture(Future[RecordMetadata]):
    """The Future of one record, with what its RecordMetadata needs.

    A plain Future makes a threading.Condition and two lists when created: most of
    the cost of a send(), and memory held while the record is in flight. Most record
    futures are never waited on one by one (flush() waits for all of them), so this
    one keeps its state in slots and makes the Condition and lists on first use; a
    future that nobody waits on or watches is completed in place, without them.
    Both paths hold _CONDITION_LOCK, so a waiter arriving during completion either
    finds the Condition to be notified on or the result already set. Record futures
    cannot be cancelled: the record is handed off.

    The fast path of send() makes these without running ``__init__`` (object.__new__,
    then the slots that ``__init__`` sets), and completes them in their slots.
    """

    __slots__ = ("on_delivery", "timestamp_ms", "key_size", "value_size", "_state", "_result", "_exception",
                 "_cond", "_waiter_list", "_callback_list")

    def __init__(self, on_delivery: DeliveryCallback | None, timestamp_ms: int, key_size: int,
                 value_size: int) -> None:
        # Future.__init__ is skipped on purpose: see the class docstring.
        self.on_delivery = on_delivery
        self.timestamp_ms = timestamp_ms
        self.key_size = key_size
        self.value_size = value_size
        self._state = RUNNING
        self._result: RecordMetadata | None = None
        self._exception: BaseException | None = None
        self._cond: threading.Condition | None = None

    # Future's _condition and _waiters are attributes, which these properties make on first use: an override that
    # mypy refuses for an attribute that could be written (Future only reads them).
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _CONDITION_LOCK:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
            on_watch()
        return cond

    @property
    def _waiters(self) -> list[_Waiter]:  # type: ignore[override]
        try:
            return self._waiter_list
        except AttributeError:
            self._waiter_list: list[_Waiter] = []
            return self._waiter_list

    @property
    def _done_callbacks(self) -> list[Callable[[Future[RecordMetadata]], object]]:
        try:
            return self._callback_list
        except AttributeError:
            self._callback_list: list[Callable[[Future[RecordMetadata]], object]] = []
            return self._callback_list

    def completed(self) -> bool:
        """done(), without making the Condition (which counts as waiting on the future: see ``on_watch``)."""
        return self._state == FINISHED

    def _notify(self, result: RecordMetadata | None, error: KafkaError | None) -> None:
        """Complete a watched future (its Condition exists), then run its callback."""
        try:
            # The metadata of a delivered record, or None with the error of one that failed.
            if result is not None:
                self.set_result(result)
            else:
                self.set_exception(error)
        except InvalidStateError:
            return  # completed already: a record completes once
        if self.on_delivery is not None:
            try:
                self.on_delivery(error, result)
            except Exception as exc:
                _callback_failed(exc)


def _callback_failed(exc: BaseException) -> None:
    log.error("error in an on_delivery callback", exc_info=exc)


def reinit_after_fork() -> None:
    """In a forked child: the parent's I/O thread may have held the lock at the fork, and nobody would
    release it."""
    _CONDITION_LOCK._at_fork_reinit()  # type: ignore[attr-defined]  # CPython's lock has it; typeshed omits it


# Completes record futures from delivery reports (the I/O thread).
completer = Completer(RecordFuture, RecordMetadata, _CONDITION_LOCK, _callback_failed)


def fail(futures: list[RecordFuture], error: KafkaError) -> None:
    """Complete ``futures`` with ``error`` (those still pending), and run their callbacks."""
    completer.complete(futures, 0, len(futures), "", -1, -1, -1, error)
