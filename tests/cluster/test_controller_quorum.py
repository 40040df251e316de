"""Three combined nodes whose controller.quorum.voters lists all three, and a broker-only node, form ONE cluster
on one Raft quorum (docs/quorum.md): every node reports the same cluster id and a topic created through any node
is seen by every node. kill -9 of the active controller's node: another voter becomes the active controller
within seconds, topics are created and ISR changes accepted again, and the broker-only node follows along."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import ClusterFactory, quorum_leader, send_request
from confluent_kafka.admin import AdminClient

from tierlog.client.requests import create_topics_request, metadata_request
from tierlog.protocol.errors import error_code
from tierlog.testing.local_cluster import LocalCluster, wait_until

VOTERS = (1, 2, 3)
BROKER_ONLY = 4
# Bounds, each well above what the step takes on a quiet machine (an election is about a second).
FAILOVER_TIMEOUT_S = 15.0
PROPAGATION_TIMEOUT_S = 15.0
ISR_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> LocalCluster:
    # A lag time well below the session timeout: the leader's AlterPartition shrinks the ISR after the kill,
    # before the controller would fence the killed broker.
    return cluster_factory({"replica.lag.time.max.ms": "3000"}, brokers=4, controllers=3, combined=True)


def cluster_id_of(cluster: LocalCluster, node_id: int) -> str | None:
    admin = AdminClient({"bootstrap.servers": cluster.broker(node_id).bootstrap})
    described: Any = admin.describe_cluster(request_timeout=REQUEST_TIMEOUT_S).result(timeout=REQUEST_TIMEOUT_S)
    return described.cluster_id


def create_topic(cluster: LocalCluster, node_id: int, name: str, replication_factor: int) -> int:
    """CreateTopics sent to `node_id` itself; the topic's error code."""
    request = create_topics_request(name, 1, replication_factor, {}, timeout_ms=int(REQUEST_TIMEOUT_S * 1000))
    response = send_request(cluster.broker(node_id).bootstrap, request, timeout_s=REQUEST_TIMEOUT_S * 2)
    return int(response.topics[0].error_code)


def partition_of(cluster: LocalCluster, node_id: int, topic: str) -> Any | None:
    """Partition 0 of `topic` in node `node_id`'s own Metadata answer; None if it does not know the topic."""
    try:
        response = send_request(cluster.broker(node_id).bootstrap, metadata_request([topic]), timeout_s=2)
    except Exception:
        return None
    found = response.topics[0]
    return found.partitions[0] if found.error_code == 0 and found.partitions else None


def seen_by_all(cluster: LocalCluster, nodes: list[int], topics: list[str]) -> bool:
    return all(partition_of(cluster, node, topic) is not None for node in nodes for topic in topics)


def isr_views(cluster: LocalCluster, nodes: list[int]) -> dict[int, tuple[int, list[int]] | None]:
    """node -> (leader, ISR) of isr-0 in its own Metadata answer."""
    views: dict[int, tuple[int, list[int]] | None] = {}
    for node in nodes:
        partition = partition_of(cluster, node, "isr")
        views[node] = None if partition is None else (partition.leader_id, sorted(partition.isr_nodes))
    return views


def test_three_voters_form_one_cluster_and_survive_the_active_controllers_crash(cluster: LocalCluster) -> None:
    everyone = [*VOTERS, BROKER_ONLY]
    cluster_ids = {node: cluster_id_of(cluster, node) for node in everyone}
    assert len(set(cluster_ids.values())) == 1 and cluster_ids[1], cluster_ids

    created = [f"created-via-{node}" for node in everyone]
    for node, topic in zip(everyone, created, strict=True):
        assert create_topic(cluster, node, topic, 3) == 0, topic
    assert create_topic(cluster, 2, "isr", 4) == 0
    wait_until(
        lambda: seen_by_all(cluster, everyone, [*created, "isr"]),
        PROPAGATION_TIMEOUT_S,
        "every node to see every topic",
    )

    active, _ = wait_until(lambda: quorum_leader(cluster, VOTERS), FAILOVER_TIMEOUT_S, "a quorum leader")
    # What reaches another voter's controller listener is not decided there, nor sent on: NOT_CONTROLLER.
    follower = next(node for node in VOTERS if node != active)
    request = create_topics_request("refused", 1, 1, {}, timeout_ms=int(REQUEST_TIMEOUT_S * 1000))
    refused = send_request(f"127.0.0.1:{cluster.controller_ports[follower]}", request, timeout_s=REQUEST_TIMEOUT_S)
    assert refused.topics[0].error_code == error_code("NOT_CONTROLLER")
    cluster.kill(active)
    survivors = [node for node in everyone if node != active]
    surviving_voters = tuple(node for node in VOTERS if node != active)

    new_active, _ = wait_until(
        lambda: quorum_leader(cluster, surviving_voters), FAILOVER_TIMEOUT_S, "a new leader among the survivors"
    )
    assert new_active in surviving_voters
    after = [f"after-failover-via-{node}" for node in survivors]
    for node, topic in zip(survivors, after, strict=True):
        assert create_topic(cluster, node, topic, 3) == 0, topic
    wait_until(lambda: seen_by_all(cluster, survivors, after), PROPAGATION_TIMEOUT_S, "every survivor to see them")

    # The ISR change the survivors' leader asks for (AlterPartition) reaches the new active controller.
    wait_until(
        lambda: all(
            view is not None and view[0] in survivors and view[1] == sorted(survivors)
            for view in isr_views(cluster, survivors).values()
        ),
        ISR_TIMEOUT_S,
        lambda: f"isr-0 led by a survivor with ISR {survivors} everywhere: {isr_views(cluster, survivors)}",
    )
    assert cluster_id_of(cluster, BROKER_ONLY) == cluster_ids[1]
