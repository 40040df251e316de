"""Admin requests sent to a broker that is not the controller: the broker forwards them (Kafka's
ForwardingManager) and answers once its own metadata shows the result, so the next request sees it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from tierlog.testing.local_cluster import LocalCluster

TIMEOUT_S = 15.0


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory({"auto.create.topics.enable": "true"}, brokers=2)


def test_admin_requests_on_a_non_controller_broker_are_forwarded(cluster: LocalCluster) -> None:
    broker_2 = cluster.broker(2).bootstrap  # node 1 runs the controller; talk to node 2 only
    admin = AdminClient({"bootstrap.servers": broker_2})

    admin.create_topics([NewTopic("forwarded", num_partitions=2, replication_factor=2)])["forwarded"].result(TIMEOUT_S)
    topic = admin.list_topics(topic="forwarded", timeout=TIMEOUT_S).topics["forwarded"]
    assert topic.error is None and sorted(topic.partitions) == [0, 1]
    assert all(sorted(p.replicas) == [1, 2] for p in topic.partitions.values())

    entry = ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "forwarded", incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "forwarded")])
    configs = next(iter(described.values())).result(TIMEOUT_S)
    assert configs["retention.ms"].value == "3600000"

    admin.create_partitions([NewPartitions("forwarded", 3)])["forwarded"].result(TIMEOUT_S)
    assert len(admin.list_topics(topic="forwarded", timeout=TIMEOUT_S).topics["forwarded"].partitions) == 3

    admin.delete_topics(["forwarded"])["forwarded"].result(TIMEOUT_S)
    assert "forwarded" not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_auto_creation_on_a_non_controller_broker(cluster: LocalCluster) -> None:
    producer = Producer({"bootstrap.servers": cluster.broker(2).bootstrap, "message.timeout.ms": 15000})
    delivered: list[int] = []
    producer.produce(
        "auto-created", b"hello", on_delivery=lambda err, msg: delivered.append(-1 if err else msg.offset())
    )
    assert producer.flush(TIMEOUT_S) == 0, "the auto-created topic took no record in time"
    assert delivered == [0]
