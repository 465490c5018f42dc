"""confluent-kafka's metadata classes (confluent_kafka.admin's), as Producer.list_topics() returns them."""

from __future__ import annotations

from typing import Any

from .errors import KafkaError

__all__ = ["ClusterMetadata", "PartitionMetadata", "TopicMetadata"]


class PartitionMetadata:
    """confluent_kafka.admin.PartitionMetadata: a partition's id (its leader and replicas are the daemon's to
    know: -1 and empty here)."""

    def __init__(self, id: int, leader: int = -1, replicas: list[int] | None = None, isrs: list[int] | None = None,
                 error: KafkaError | None = None) -> None:
        self.id = id
        self.leader = leader
        self.replicas = replicas or []
        self.isrs = isrs or []
        self.error = error


class TopicMetadata:
    """confluent_kafka.admin.TopicMetadata: a topic's partitions by id, or the cluster's error on it."""

    def __init__(self, topic: str, partitions: dict[int, PartitionMetadata], error: KafkaError | None = None) -> None:
        self.topic = topic
        self.partitions = partitions
        self.error = error


class ClusterMetadata:
    """confluent_kafka.admin.ClusterMetadata: here, the topics asked about (the brokers are the daemon's)."""

    def __init__(self, topics: dict[str, TopicMetadata]) -> None:
        self.cluster_id: str | None = None
        self.controller_id = -1
        self.brokers: dict[int, Any] = {}
        self.topics = topics
        self.orig_broker_id = -1
        self.orig_broker_name: str | None = None
