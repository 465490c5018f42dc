"""Cluster metadata: brokers, partition leaders, and when to refresh them.

:class:`Metadata` follows the Java producer's ProducerMetadata: it fetches the
topics the producer uses (a topic not used for ``metadata.max.idle.ms`` is
dropped), refreshes every ``metadata.max.age.ms``, sooner when asked (stale
leader, unknown topic, disconnect), and never more often than the refresh
backoff allows. A new topic is fetched at once, past the backoff; as in Java's
Metadata, one added while a refresh is out gets a refresh of its own after that
one's answer (a request built before the topic was added did not ask for it).

Unlike Java's, it creates topics sparingly: many processes share it, and one of
them asking for names by the thousand would create them all on the cluster. A new
topic is first asked for without auto-creation; one the cluster does not have is
asked for with it (when allow.auto.create.topics is on) only as the creation rate
(``auto_create_topics_per_minute``) allows, in the order they were asked for.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from client_stub.errors import ERRORS_BY_NAME, KafkaError, error_code

from ..protocol import messages as m

log = logging.getLogger(__name__)

UNKNOWN_TOPIC_OR_PARTITION = ERRORS_BY_NAME["UNKNOWN_TOPIC_OR_PARTITION"].code


@dataclass(frozen=True, slots=True)
class Node:
    """A broker. Bootstrap servers get negative ids until metadata names the brokers."""

    id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def __str__(self) -> str:
        return f"{self.host}:{self.port} (id: {self.id} rack: {self.rack})"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int  # -1 when no leader is known
    leader_epoch: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    error: int = 0


@dataclass(slots=True)
class Cluster:
    """An immutable-by-convention snapshot of what the last metadata response said."""

    nodes: dict[int, Node] = field(default_factory=dict)
    partitions: dict[str, dict[int, PartitionInfo]] = field(default_factory=dict)
    topic_errors: dict[str, int] = field(default_factory=dict)
    cluster_id: str | None = None
    controller_id: int = -1
    is_bootstrap: bool = False

    @classmethod
    def bootstrap(cls, servers: list[str]) -> Cluster:
        nodes = {}
        for i, server in enumerate(servers):
            host, _, port = server.rpartition(":")
            nodes[-(i + 1)] = Node(-(i + 1), host.strip("[]"), int(port))
        return cls(nodes=nodes, is_bootstrap=True)

    def leader_for(self, topic: str, partition: int) -> Node | None:
        info = self.partitions.get(topic, {}).get(partition)
        if info is None or info.leader < 0:
            return None
        return self.nodes.get(info.leader)

    def partition_count(self, topic: str) -> int | None:
        parts = self.partitions.get(topic)
        return len(parts) if parts else None

    def available_partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic`` whose leader is known."""
        return sorted(p for p, info in self.partitions.get(topic, {}).items()
                      if info.leader >= 0 and info.leader in self.nodes)


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """How the brokers changed in a metadata update."""

    added: tuple[Node, ...] = ()
    removed: tuple[Node, ...] = ()
    moved: tuple[Node, ...] = ()


class Metadata:
    """The producer's view of the cluster and the refresh policy."""

    def __init__(self, bootstrap_servers: list[str], *, refresh_backoff_ms: int = 100,
                 metadata_max_age_ms: int = 300000, metadata_max_idle_ms: int = 300000,
                 allow_auto_topic_creation: bool = True, auto_create_topics_per_minute: int = 60) -> None:
        self.cluster = Cluster.bootstrap(bootstrap_servers)
        self.refresh_backoff_ms = refresh_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.metadata_max_idle_ms = metadata_max_idle_ms
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.auto_create_topics_per_minute = auto_create_topics_per_minute
        # Whether the daemon ever asks the cluster to create a topic.
        self._creating = allow_auto_topic_creation and auto_create_topics_per_minute > 0
        # Topics never asked for without creation; those the cluster did not have, waiting for a creation
        # (left out of requests meanwhile); when each creation of the last minute was asked for.
        self._unprobed: set[str] = set()
        self._absent: dict[str, None] = {}
        self._creations: deque[int] = deque()
        # The topics the request out asks for without creation (None: it may create); whether the last did.
        self._probing: set[str] | None = None
        self._probed_last = False
        self.last_refresh_ms = 0
        self.last_successful_refresh_ms = 0
        # Why the brokers refuse the daemon (its credentials or certificate), until a refresh gets through:
        # what clients waiting for a topic's metadata are told.
        self.authentication_error: KafkaError | None = None
        self.update_version = 0
        # Java's requestVersion: goes up with every new topic. An answer clears _need_new_topics only
        # if its request was built at the latest version, i.e. after the last topic was added.
        self.request_version = 0
        self._need_update = True
        self._need_new_topics = False
        # topic -> when it is dropped if not used again
        self._topics: dict[str, int] = {}

    # -- the topics as the cluster has them ------------------------------------------------------

    def partition_count(self, topic: str) -> int | None:
        """The topic's partitions in the current metadata, None if the cluster does not have it (yet)."""
        return self.cluster.partition_count(topic)

    def available_partitions(self, topic: str) -> list[int]:
        """The partitions of the topic whose leader is known."""
        return self.cluster.available_partitions(topic)

    def topic_error(self, topic: str) -> int | None:
        """The error code the last metadata response gave for the topic, if it gave one."""
        return self.cluster.topic_errors.get(topic)

    # -- topics of interest ----------------------------------------------------------------------

    def add_topic(self, topic: str, now: int) -> None:
        """Keep ``topic`` in the refreshes; a topic not seen before gets one at once (no refresh backoff)."""
        if topic not in self._topics:
            self._request_update_for_new_topics()
            if self._creating and self.cluster.partition_count(topic) is None:
                self._unprobed.add(topic)
        self._topics[topic] = now + self.metadata_max_idle_ms

    def remove_topic(self, topic: str) -> None:
        """No producer wants ``topic`` any more (one the cluster does not have, say): it is not fetched, nor
        created."""
        self._topics.pop(topic, None)
        self._unprobed.discard(topic)
        self._absent.pop(topic, None)

    def awaiting_creation(self) -> list[str]:
        """The topics the cluster did not have that wait for the creation rate, oldest first."""
        return list(self._absent)

    def topics(self) -> list[str]:
        return list(self._topics)

    def _expire_topics(self, now: int) -> None:
        for topic, expiry in list(self._topics.items()):
            if expiry <= now:
                del self._topics[topic]
                self._unprobed.discard(topic)
                self._absent.pop(topic, None)
                log.debug("topic %s not used for metadata.max.idle.ms, no longer fetched", topic)

    # -- refresh policy --------------------------------------------------------------------------

    def request_update(self) -> int:
        """Ask for a refresh as soon as the backoff allows; returns the current version.

        As in Java, the answer to a refresh already out satisfies this request.
        """
        self._need_update = True
        return self.update_version

    def _request_update_for_new_topics(self) -> None:
        # As Java's requestUpdateForNewTopics: a producer waits for this topic, so no refresh backoff.
        self.last_refresh_ms = 0
        self._need_new_topics = True
        self.request_version += 1

    @property
    def update_requested(self) -> bool:
        return self._need_update or self._need_new_topics

    def time_to_next_update(self, now: int) -> int:
        """Milliseconds until a refresh is due (0: now)."""
        if self.update_requested:
            expire = 0
        else:
            expire = max(self.last_successful_refresh_ms + self.metadata_max_age_ms - now, 0)
            if self._absent:
                # A creation waits: the refresh that asks for it is due when the rate allows one.
                expire = min(expire, self._next_creation_ms(now) - now)
        backoff = max(self.last_refresh_ms + self.refresh_backoff_ms - now, 0)
        return max(expire, backoff)

    def _next_creation_ms(self, now: int) -> int:
        """When the creation rate next allows a creation."""
        while self._creations and self._creations[0] <= now - 60_000:
            self._creations.popleft()
        if len(self._creations) < self.auto_create_topics_per_minute:
            return now
        return self._creations[0] + 60_000

    def build_request(self, now: int) -> m.MetadataRequest:
        """A request for every topic in use; pass :attr:`request_version`, read now, to :meth:`update`.

        Without creation while new topics are to be asked for so; else with it (if allowed), for the topics
        the cluster does not have that the creation rate admits now, and not the others.
        """
        self._expire_topics(now)
        # Probes and creations take turns while both wait: names that keep coming hold back no creation.
        self._probed_last = bool(self._unprobed) and not (
            self._probed_last and self._absent and self._next_creation_ms(now) <= now)
        if self._probed_last:
            self._probing = set(self._unprobed)
            allow = False
        else:
            self._probing = None
            allow = self._creating
            while self._absent and self._next_creation_ms(now) <= now:
                topic = next(iter(self._absent))
                del self._absent[topic]
                self._creations.append(now)
                log.info("asking the cluster to create topic %s", topic)
        # With creation, only the topics the cluster had or those the rate admits: not one waiting for a
        # creation, nor a new one not asked for without creation yet.
        left_out = self._absent if self._probing is not None else self._absent.keys() | self._unprobed
        names = sorted(t for t in self._topics if t not in left_out)
        topics = [m.MetadataRequest.MetadataRequestTopic(name=t) for t in names]
        return m.MetadataRequest(topics=topics, allow_auto_topic_creation=allow)

    def failed_update(self, now: int) -> None:
        self.last_refresh_ms = now
        self._probing = None

    def update(self, response: m.MetadataResponse, now: int, request_version: int | None = None) -> NodeChanges:
        """Apply a metadata response; returns how the brokers changed.

        ``request_version`` is the :attr:`request_version` the request was built at (None: the
        latest). A topic added since then is not in the response, so a refresh stays requested.
        """
        self.last_refresh_ms = now
        self.last_successful_refresh_ms = now
        self.authentication_error = None
        self._need_update = False
        probed, self._probing = self._probing or set(), None
        self._unprobed -= probed
        self._need_new_topics = request_version is not None and request_version < self.request_version
        self.update_version += 1
        old = self.cluster
        nodes = {b.node_id: Node(b.node_id, b.host, b.port, b.rack) for b in response.brokers}
        partitions: dict[str, dict[int, PartitionInfo]] = {}
        topic_errors: dict[str, int] = {}
        for topic in response.topics:
            if topic.name is None:
                continue
            if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION and topic.name in probed \
                    and topic.name in self._topics:
                # Asked for again, with creation, when the rate allows (see time_to_next_update).
                self._absent[topic.name] = None
                topic_errors[topic.name] = topic.error_code
                continue
            if topic.error_code:
                topic_errors[topic.name] = topic.error_code
                if error_code(topic.error_code).invalid_metadata:
                    self._need_update = True
                # Keep what was known: a transient error should not forget the leaders.
                if topic.name in old.partitions:
                    partitions[topic.name] = old.partitions[topic.name]
                continue
            parts: dict[int, PartitionInfo] = {}
            known = old.partitions.get(topic.name, {})
            for p in topic.partitions:
                info = PartitionInfo(topic.name, p.partition_index, p.leader_id, p.leader_epoch,
                                     tuple(p.replica_nodes), tuple(p.isr_nodes), p.error_code)
                previous = known.get(p.partition_index)
                # A response from a broker that lags behind must not move a leader backwards.
                if previous is not None and 0 <= info.leader_epoch < previous.leader_epoch:
                    info = previous
                parts[p.partition_index] = info
                if p.leader_id < 0:
                    self._need_update = True
            partitions[topic.name] = parts
        if self._absent and self._next_creation_ms(now) <= now:
            self._need_update = True
        self.cluster = Cluster(nodes, partitions, topic_errors, response.cluster_id,
                               response.controller_id)
        if old.is_bootstrap:
            return NodeChanges(added=tuple(nodes.values()))
        return NodeChanges(
            added=tuple(n for i, n in nodes.items() if i not in old.nodes),
            removed=tuple(n for i, n in old.nodes.items() if i not in nodes),
            moved=tuple(n for i, n in nodes.items() if i in old.nodes and old.nodes[i].address != n.address),
        )
