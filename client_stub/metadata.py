"""What the client knows of the topics it produces to, as the daemon tells it."""

from __future__ import annotations

from dataclasses import dataclass

from .contract import ipc
from .errors import KafkaError


@dataclass(slots=True)
class TopicInfo:
    """A topic's partition count (None: not known yet), its partitions with a leader, its last error, and the
    session's number for it (which the batches' slots name it by)."""

    partition_count: int | None = None
    available: tuple[int, ...] = ()
    error: KafkaError | None = None
    index: int = -1


class ProducerMetadata:
    """The topics followed (a Metadata message sent for each, again in each new session), and their state from
    the daemon's Topic messages, as the Java producer's ProducerMetadata.

    Called with the producer's lock held.
    """

    def __init__(self) -> None:
        self.topics: dict[str, TopicInfo] = {}
        # topic -> partition count, for the topics the fast path may take; it only reads this dict.
        self.partition_counts: dict[str, int] = {}
        # topic -> the session's number for it, once the daemon told it: the fast path opens batches of these.
        self.indexes: dict[str, int] = {}

    def new_session(self) -> None:
        """A new session numbers the topics anew: none is known by its number until its TOPIC comes."""
        for info in self.topics.values():
            info.index = -1
        self.indexes.clear()

    def update(self, message: ipc.Topic) -> None:
        """The daemon's word on a topic; the fast path takes it while it has partitions and no final error."""
        info = self.topics.setdefault(message.topic, TopicInfo())
        count = info.partition_count = message.partition_count
        info.available = tuple(message.available_partitions)
        info.error = ipc.error_from_wire(message.error)
        info.index = message.index
        if message.index >= 0:
            self.indexes[message.topic] = message.index
        else:
            self.indexes.pop(message.topic, None)
        if count and (info.error is None or info.error.retriable):
            self.partition_counts[message.topic] = count
        else:
            self.partition_counts.pop(message.topic, None)
