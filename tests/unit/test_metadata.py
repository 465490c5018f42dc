"""Metadata: bootstrap, updates from MetadataResponses (leaders, partitions, brokers that come,
go or move), leader epochs, and the refresh policy (max age, requests, backoff, idle topics)."""

from __future__ import annotations

from service.network.metadata import Cluster, Metadata, Node, NodeChanges
from service.protocol import messages as m

NOW = 10_000_000
R = m.MetadataResponse
LEADER_NOT_AVAILABLE = 5
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29


def response(brokers: list[tuple[int, str, int]] | None = None,
             topics: dict[str, list[tuple[int, int, int]]] | None = None,
             topic_errors: dict[str, int] | None = None) -> m.MetadataResponse:
    """``topics``: name -> [(partition, leader, leader_epoch)]."""
    brokers = [(1, "b1", 9092)] if brokers is None else brokers
    out = [R.MetadataResponseTopic(name=name, partitions=[
        R.MetadataResponseTopic.MetadataResponsePartition(partition_index=p, leader_id=leader, leader_epoch=epoch,
                                                          replica_nodes=[leader], isr_nodes=[leader])
        for p, leader, epoch in partitions]) for name, partitions in (topics or {}).items()]
    out += [R.MetadataResponseTopic(name=name, error_code=code) for name, code in (topic_errors or {}).items()]
    return R(brokers=[R.MetadataResponseBroker(node_id=i, host=h, port=p, rack=f"rack-{i}") for i, h, p in brokers],
             cluster_id="cluster", controller_id=brokers[0][0] if brokers else -1, topics=out)


def metadata(**kwargs: int) -> Metadata:
    settings = {"refresh_backoff_ms": 100, "metadata_max_age_ms": 60_000, "metadata_max_idle_ms": 300_000, **kwargs}
    return Metadata(["b1:9092", "[::1]:9093", "10.0.0.3:1"], **settings)


# -- bootstrap and updates -----------------------------------------------------------------------


def test_bootstrap_servers_get_negative_ids() -> None:
    md = metadata()
    assert md.cluster.is_bootstrap
    assert md.cluster.nodes == {-1: Node(-1, "b1", 9092), -2: Node(-2, "::1", 9093), -3: Node(-3, "10.0.0.3", 1)}
    assert md.cluster.nodes[-2].address == ("::1", 9093)
    assert md.update_requested
    assert md.time_to_next_update(NOW) == 0
    assert md.cluster.leader_for("t", 0) is None
    assert md.cluster.partition_count("t") is None


def test_update_gives_brokers_leaders_and_partition_counts() -> None:
    md = metadata()
    md.add_topic("t", NOW)
    changes = md.update(response(brokers=[(1, "b1", 9092), (2, "b2", 9092)],
                                 topics={"t": [(0, 1, 0), (1, 2, 0), (2, 2, 3)], "u": [(0, 1, 0)]}), NOW)
    cluster = md.cluster
    assert not cluster.is_bootstrap
    assert sorted(cluster.nodes) == [1, 2]
    assert cluster.nodes[2] == Node(2, "b2", 9092, "rack-2")
    assert cluster.partition_count("t") == 3 and cluster.partition_count("u") == 1
    assert cluster.leader_for("t", 0).id == 1
    assert cluster.leader_for("t", 2).id == 2
    assert cluster.partitions["t"][2].leader_epoch == 3
    assert cluster.available_partitions("t") == [0, 1, 2]
    assert cluster.cluster_id == "cluster" and cluster.controller_id == 1
    assert cluster.leader_for("t", 3) is None
    # From bootstrap, every broker is new.
    assert changes == NodeChanges(added=(cluster.nodes[1], cluster.nodes[2]))
    assert not md.update_requested
    assert md.update_version == 1


def test_node_changes_added_removed_moved() -> None:
    md = metadata()
    md.update(response(brokers=[(1, "b1", 9092), (2, "b2", 9092), (3, "b3", 9092)]), NOW)
    changes = md.update(response(brokers=[(1, "b1", 9092), (2, "b2-new", 9093), (4, "b4", 9092)]), NOW + 1)
    assert changes.added == (Node(4, "b4", 9092, "rack-4"),)
    assert changes.removed == (Node(3, "b3", 9092, "rack-3"),)
    assert changes.moved == (Node(2, "b2-new", 9093, "rack-2"),)  # with its new address
    assert md.update(response(brokers=[(1, "b1", 9092), (2, "b2-new", 9093), (4, "b4", 9092)]),
                     NOW + 2) == NodeChanges()


def test_leaders_move_and_leader_epochs_do_not_go_backwards() -> None:
    md = metadata()
    brokers = [(1, "b1", 9092), (2, "b2", 9092)]
    md.update(response(brokers, topics={"t": [(0, 1, 5)]}), NOW)
    # A lagging broker's older view is ignored for that partition.
    md.update(response(brokers, topics={"t": [(0, 2, 4)]}), NOW + 1)
    assert md.cluster.leader_for("t", 0).id == 1
    assert md.cluster.partitions["t"][0].leader_epoch == 5
    # A newer epoch moves the leader.
    md.update(response(brokers, topics={"t": [(0, 2, 6)]}), NOW + 2)
    assert md.cluster.leader_for("t", 0).id == 2
    # The same epoch is accepted too.
    md.update(response(brokers, topics={"t": [(0, 1, 6)]}), NOW + 3)
    assert md.cluster.leader_for("t", 0).id == 1
    # Brokers that do not know epochs (-1) are believed.
    md.update(response(brokers, topics={"t": [(0, 2, -1)]}), NOW + 4)
    assert md.cluster.leader_for("t", 0).id == 2


def test_a_partition_without_leader_asks_for_another_update() -> None:
    md = metadata()
    md.update(response([(1, "b1", 9092)], topics={"t": [(0, 1, 0), (1, -1, 0), (2, 7, 0)]}), NOW)
    assert md.update_requested
    assert md.cluster.leader_for("t", 1) is None
    assert md.cluster.leader_for("t", 2) is None  # node 7 is not among the brokers
    assert md.cluster.available_partitions("t") == [0]
    assert md.cluster.partition_count("t") == 3


def test_topic_errors_keep_what_was_known() -> None:
    md = metadata()
    md.update(response(topics={"t": [(0, 1, 0), (1, 1, 0)]}), NOW)
    md.update(response(topic_errors={"t": LEADER_NOT_AVAILABLE, "new": UNKNOWN_TOPIC_OR_PARTITION}), NOW + 1)
    assert md.cluster.topic_errors == {"t": LEADER_NOT_AVAILABLE, "new": UNKNOWN_TOPIC_OR_PARTITION}
    assert md.cluster.partition_count("t") == 2  # a transient error does not forget the leaders
    assert md.cluster.leader_for("t", 1).id == 1
    assert md.cluster.partition_count("new") is None
    assert md.update_requested  # both are stale-metadata errors

    md.update(response(topic_errors={"secret": TOPIC_AUTHORIZATION_FAILED}), NOW + 2)
    assert md.cluster.topic_errors == {"secret": TOPIC_AUTHORIZATION_FAILED}
    assert not md.update_requested  # a refresh would not help


def test_bootstrap_cluster_parses_addresses() -> None:
    cluster = Cluster.bootstrap(["localhost:1", "[fe80::1]:2"])
    assert [n.address for n in cluster.nodes.values()] == [("localhost", 1), ("fe80::1", 2)]


# -- refresh policy ------------------------------------------------------------------------------


def test_refresh_on_max_age() -> None:
    md = metadata(metadata_max_age_ms=60_000)
    md.update(response(), NOW)
    assert md.last_successful_refresh_ms == NOW
    assert md.time_to_next_update(NOW) == 60_000
    assert md.time_to_next_update(NOW + 59_999) == 1
    assert md.time_to_next_update(NOW + 60_000) == 0
    assert md.time_to_next_update(NOW + 90_000) == 0


def test_refresh_on_request_after_the_backoff() -> None:
    md = metadata(refresh_backoff_ms=100)
    md.update(response(), NOW)
    version = md.request_update()
    assert version == md.update_version == 1
    assert md.update_requested
    assert md.time_to_next_update(NOW + 30) == 70  # not more often than the refresh backoff
    assert md.time_to_next_update(NOW + 100) == 0
    md.update(response(), NOW + 100)
    assert not md.update_requested
    assert md.update_version == 2


def test_a_failed_refresh_backs_off() -> None:
    md = metadata(refresh_backoff_ms=100)
    md.update(response(), NOW)
    md.request_update()
    md.failed_update(NOW + 500)
    assert md.update_requested
    assert md.last_successful_refresh_ms == NOW
    assert md.time_to_next_update(NOW + 500) == 100
    assert md.time_to_next_update(NOW + 600) == 0


def test_a_new_topic_asks_for_a_refresh_a_known_one_does_not() -> None:
    md = metadata()
    md.add_topic("t", NOW)
    md.update(response(topics={"t": [(0, 1, 0)]}), NOW)
    md.add_topic("t", NOW + 1)
    assert not md.update_requested
    md.add_topic("u", NOW + 2)
    assert md.update_requested
    assert md.topics() == ["t", "u"]


def test_topics_not_used_for_max_idle_are_dropped() -> None:
    md = metadata(metadata_max_idle_ms=1000)
    md.add_topic("b", NOW)
    md.add_topic("a", NOW + 500)
    request = md.build_request(NOW + 999)
    assert [t.name for t in request.topics] == ["a", "b"]
    assert not request.allow_auto_topic_creation  # new topics are asked for without creation first
    assert [t.name for t in md.build_request(NOW + 1000).topics] == ["a"]
    assert md.topics() == ["a"]
    md.add_topic("a", NOW + 1400)  # used again: kept longer
    assert [t.name for t in md.build_request(NOW + 2000).topics] == ["a"]
    assert md.build_request(NOW + 2400).topics == []


def test_a_topic_added_while_a_refresh_is_out_is_refreshed_again_at_once() -> None:
    md = metadata(refresh_backoff_ms=100)
    md.add_topic("t", NOW)
    md.update(response(topics={"t": [(0, 1, 0)]}), NOW, md.request_version)
    assert not md.update_requested

    # A refresh is built, then a new topic comes while it is out.
    version = md.request_version
    assert [t.name for t in md.build_request(NOW + 10).topics] == ["t"]
    md.request_update()
    md.add_topic("u", NOW + 20)
    md.update(response(topics={"t": [(0, 1, 0)]}), NOW + 30, version)
    # The answer says nothing of "u": another refresh is due after the refresh backoff, not at max age.
    assert md.update_requested
    assert md.time_to_next_update(NOW + 30) == 100
    version = md.request_version
    assert [t.name for t in md.build_request(NOW + 130).topics] == ["t", "u"]
    md.update(response(topics={"t": [(0, 1, 0)], "u": [(0, 1, 0)]}), NOW + 140, version)
    assert not md.update_requested
    assert md.time_to_next_update(NOW + 140) == 60_000


def test_a_new_topic_is_not_held_by_the_refresh_backoff() -> None:
    md = metadata(refresh_backoff_ms=100)
    md.update(response(), NOW, md.request_version)
    md.request_update()
    assert md.time_to_next_update(NOW + 10) == 90
    md.add_topic("t", NOW + 10)  # as Java's: a producer is waiting for this one
    assert md.time_to_next_update(NOW + 10) == 0


def test_a_refresh_requested_while_one_is_out_is_answered_by_it() -> None:
    """As Java's Metadata: only new topics need a request built after them."""
    md = metadata()
    md.update(response(), NOW)
    version = md.request_version
    md.build_request(NOW + 10)
    md.request_update()  # a stale leader, a disconnect ...
    md.update(response(), NOW + 20, version)
    assert not md.update_requested


# -- creating topics -----------------------------------------------------------------------------


def test_a_new_topic_is_first_asked_for_without_creation_and_created_as_the_rate_allows() -> None:
    md = metadata(auto_create_topics_per_minute=2)
    for topic in ("exists", "a", "b", "c"):
        md.add_topic(topic, NOW)
    probe = md.build_request(NOW)
    assert not probe.allow_auto_topic_creation and [t.name for t in probe.topics] == ["a", "b", "c", "exists"]
    md.update(response(topics={"exists": [(0, 1, 0)]}, topic_errors=dict.fromkeys("abc", UNKNOWN_TOPIC_OR_PARTITION)),
              NOW)
    assert md.awaiting_creation() == ["a", "b", "c"]
    assert md.cluster.topic_errors == dict.fromkeys("abc", UNKNOWN_TOPIC_OR_PARTITION)
    # Two creations a minute: the first two missing topics, asked for in the order they came.
    assert md.time_to_next_update(NOW + 100) == 0
    create = md.build_request(NOW + 100)
    assert create.allow_auto_topic_creation and [t.name for t in create.topics] == ["a", "b", "exists"]
    assert md.awaiting_creation() == ["c"]
    md.update(response(topics={"exists": [(0, 1, 0)], "a": [(0, 1, 0)], "b": [(0, 1, 0)]}), NOW + 150)
    assert md.cluster.partition_count("a") == 1 and not md.update_requested
    # The third when the first creation is a minute old.
    assert md.time_to_next_update(NOW + 150) == 60_000 - 50
    later = md.build_request(NOW + 60_100)
    assert later.allow_auto_topic_creation and "c" in [t.name for t in later.topics]
    assert md.awaiting_creation() == []


def test_a_topic_the_cluster_has_is_not_counted_as_a_creation() -> None:
    md = metadata(auto_create_topics_per_minute=1)
    md.add_topic("exists", NOW)
    md.build_request(NOW)
    md.update(response(topics={"exists": [(0, 1, 0)]}), NOW)
    request = md.build_request(NOW + 100)
    assert request.allow_auto_topic_creation and [t.name for t in request.topics] == ["exists"]
    # The minute's one creation is still there for a topic the cluster does not have.
    md.add_topic("missing", NOW + 200)
    md.build_request(NOW + 200)
    md.update(response(topics={"exists": [(0, 1, 0)]}, topic_errors={"missing": UNKNOWN_TOPIC_OR_PARTITION}),
              NOW + 200)
    assert "missing" in [t.name for t in md.build_request(NOW + 300).topics] and md.awaiting_creation() == []


def test_a_rate_of_zero_creates_nothing() -> None:
    md = metadata(auto_create_topics_per_minute=0)
    md.add_topic("missing", NOW)
    for at in (NOW, NOW + 100):
        request = md.build_request(at)
        assert not request.allow_auto_topic_creation and [t.name for t in request.topics] == ["missing"]
        md.update(response(topic_errors={"missing": UNKNOWN_TOPIC_OR_PARTITION}), at)
        assert md.awaiting_creation() == []
        assert md.time_to_next_update(at) > 0  # the next refresh after the backoff, no creation due


def test_probes_and_creations_take_turns_while_new_names_keep_coming() -> None:
    md = metadata(auto_create_topics_per_minute=100)
    md.add_topic("a", NOW)
    md.build_request(NOW)
    md.update(response(topic_errors={"a": UNKNOWN_TOPIC_OR_PARTITION}), NOW)
    md.add_topic("b", NOW + 10)  # a new name before the creation of a
    creation = md.build_request(NOW + 100)
    assert creation.allow_auto_topic_creation and [t.name for t in creation.topics] == ["a"]  # not b: unprobed
    md.update(response(topics={"a": [(0, 1, 0)]}), NOW + 100)
    assert not md.build_request(NOW + 200).allow_auto_topic_creation  # then b's probe


def test_a_topic_nobody_wants_is_neither_fetched_nor_created() -> None:
    md = metadata()
    md.add_topic("a", NOW)
    md.build_request(NOW)
    md.update(response(topic_errors={"a": UNKNOWN_TOPIC_OR_PARTITION}), NOW)
    md.remove_topic("a")
    assert md.awaiting_creation() == [] and md.topics() == []


def test_without_auto_creation_nothing_waits_for_the_rate() -> None:
    md = metadata(allow_auto_topic_creation=False)
    md.add_topic("a", NOW)
    md.build_request(NOW)
    md.update(response(topic_errors={"a": UNKNOWN_TOPIC_OR_PARTITION}), NOW)
    assert md.awaiting_creation() == []
    request = md.build_request(NOW + 100)
    assert not request.allow_auto_topic_creation and [t.name for t in request.topics] == ["a"]


def test_a_failed_probe_is_made_again() -> None:
    md = metadata()
    md.add_topic("a", NOW)
    assert not md.build_request(NOW).allow_auto_topic_creation
    md.failed_update(NOW)
    assert not md.build_request(NOW + 100).allow_auto_topic_creation
    md.update(response(topic_errors={"a": UNKNOWN_TOPIC_OR_PARTITION}), NOW + 150)
    assert md.awaiting_creation() == ["a"]
