"""Config changes on a cluster whose controllers are dedicated nodes (process.roles=controller): brokers forward
topic and broker config changes to the active controller, which decides them
(docs/configuration.md#dedicated-controllers).
Without the config APIs on the controllers every such change timed out; `kafka-configs.sh`, `tierlog topic
alter-config` and the reassignment tools' throttles all send them."""

from __future__ import annotations

from typing import Any

from cluster_helpers import ClusterFactory
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tierlog.testing.local_cluster import wait_until

TIMEOUT_S = 30.0


def described(admin: AdminClient, resource_type: str, name: str) -> dict[str, Any]:
    (future,) = admin.describe_configs([ConfigResource(resource_type, name)]).values()
    return {entry.name: entry.value for entry in future.result(timeout=TIMEOUT_S).values()}


def test_topic_and_broker_configs_change_through_brokers_forwarding_to_dedicated_controllers(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory({}, brokers=2, controllers=3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("configs", 1, 2)])["configs"].result(timeout=TIMEOUT_S)
    topic = ConfigResource(
        "topic",
        "configs",
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("follower.replication.throttled.replicas", "*", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    broker = ConfigResource(
        "broker",
        "2",
        incremental_configs=[
            ConfigEntry("follower.replication.throttled.rate", "1000000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([topic, broker]).values():
        future.result(timeout=TIMEOUT_S)
    wait_until(
        lambda: described(admin, "topic", "configs").get("retention.ms") == "3600000",
        TIMEOUT_S,
        "the topic's new retention.ms described by the brokers",
    )
    assert described(admin, "topic", "configs")["follower.replication.throttled.replicas"] == "*"
    assert described(admin, "broker", "2")["follower.replication.throttled.rate"] == "1000000"
