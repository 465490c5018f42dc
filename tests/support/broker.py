"""The embedded Tansu broker for the tests: the package's EmbeddedBroker, plus waiting for leaders."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from service.tools.embedded import EmbeddedBroker
from tests.support.waiting import HANG_S


class TansuBroker(EmbeddedBroker):
    """An EmbeddedBroker whose create_topic returns only once every partition has a leader."""

    def create_topic(self, name: str, partitions: int, *, timeout: float = HANG_S) -> None:
        """Create the topic and wait for its leaders, however long Tansu's CLI and the broker take on a busy
        machine: ``timeout`` bounds a hang only."""
        super().create_topic(name, partitions, timeout=timeout)
        # Tansu auto-creates (with 4 partitions) any unknown topic named in a Metadata
        # request that allows it, and librdkafka's AdminClient allows it by default: turn it
        # off so that polling too early cannot create a topic of the wrong shape.
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": False})
        deadline = time.monotonic() + timeout
        while True:
            problem = _leader_problem(admin, name, partitions, deadline)
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {name} not ready after {timeout}s: {problem}")
            time.sleep(0.1)


def _leader_problem(admin: AdminClient, name: str, partitions: int, deadline: float) -> str | None:
    """What keeps topic ``name`` from having ``partitions`` partitions with leaders, or None."""
    try:
        cluster = admin.list_topics(name, timeout=max(deadline - time.monotonic(), 0.1))
    except KafkaException as exc:
        return str(exc)
    metadata = cluster.topics.get(name)
    if metadata is None:
        return "not in metadata"
    if metadata.error is not None:
        return str(metadata.error)
    leaders = {partition: m.leader for partition, m in metadata.partitions.items()}
    if len(leaders) != partitions or any(leader < 0 for leader in leaders.values()):
        return f"partition leaders {leaders}"
    return None
