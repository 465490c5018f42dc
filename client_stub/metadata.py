"""What the client knows of the topics it produces to, as the daemon tells it."""

from __future__ import annotations

from dataclasses import dataclass

from .contract import ipc
from .errors import KafkaError


@dataclass(slots=True)
class TopicInfo:
    partition_count: int | None = None
    available: tuple[int, ...] = ()
    error: KafkaError | None = None


class Metadata:
    """The topics followed in this session (Metadata messages sent), and their state from Topic messages.

    Called with the producer's lock held.
    """

    def __init__(self) -> None:
        self.topics: dict[str, TopicInfo] = {}
        # topic -> partition count, for the topics the fast path may take; it only reads this dict.
        self.partition_counts: dict[str, int] = {}

    def update(self, message: ipc.Topic) -> None:
        info = self.topics.setdefault(message.topic, TopicInfo())
        count = info.partition_count = message.partition_count
        info.available = tuple(message.available_partitions)
        info.error = ipc.error_from_wire(message.error)
        if count and (info.error is None or info.error.retriable):
            self.partition_counts[message.topic] = count
        else:
            self.partition_counts.pop(message.topic, None)
