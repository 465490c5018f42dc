"""What the front needs of the rest of the daemon, and no more: a way to hand a batch over, and a view of the
topics the cluster has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from client_stub.errors import KafkaError

from ..producer.batch import ProducerBatch

# Hands a sealed batch to the producer (ProducerCore.append); its outcome comes back through its on_complete.
AppendBatch = Callable[[ProducerBatch], None]


class TopicView(Protocol):
    """The topics of the cluster as the daemon's metadata knows them, and the topics it is asked to follow
    (:class:`~service.network.metadata.Metadata` is one)."""

    # Grows each time new metadata comes in.
    update_version: int
    # Why the brokers refuse the daemon, while they do.
    authentication_error: KafkaError | None

    def partition_count(self, topic: str) -> int | None:
        """The topic's partitions, None if the cluster does not have it (yet)."""

    def available_partitions(self, topic: str) -> list[int]:
        """The partitions of the topic that have a leader."""

    def topic_error(self, topic: str) -> int | None:
        """The error code the cluster last answered for the topic, if any."""

    def add_topic(self, topic: str, now: int) -> None:
        """Follow the topic: it is in the metadata requests from now on."""

    def remove_topic(self, topic: str) -> None:
        """Follow the topic no more."""

    def request_update(self) -> int:
        """Ask for new metadata soon."""
