"""Dynamic broker configs as `kafka-configs.sh --entity-type brokers` sets them (Kafka's DynamicBrokerConfig),
through confluent-kafka's admin client and raw requests: per broker and cluster-wide, stored in the metadata
log, described with their source, applied live, and refused with Kafka's INVALID_REQUEST for what cannot
change while the broker runs (docs/configuration.md)."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import BrokerFactory, ClusterFactory, send_request
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kio.schema.errors import ErrorCode

from tierlog.client.requests import request_schema
from tierlog.testing.local_cluster import BrokerProcess

TIMEOUT_S = 30.0
API_DESCRIBE_CONFIGS, API_INCREMENTAL_ALTER_CONFIGS = 32, 44
RESOURCE_BROKER = 4
SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE


def alter(admin: AdminClient, broker: str, *changes: tuple[str, str | None, AlterConfigOpType]) -> None:
    resource = ConfigResource(
        "broker",
        broker,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=op) for name, value, op in changes],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT_S)


def describe(admin: AdminClient, resource_type: str, name: str) -> dict[str, Any]:
    (future,) = admin.describe_configs([ConfigResource(resource_type, name)]).values()
    return dict(future.result(timeout=TIMEOUT_S))


def alter_raw(broker: BrokerProcess, *resources: tuple[str, str, str], validate_only: bool = False) -> list[Any]:
    """IncrementalAlterConfigs SET of (broker resource name, config, value), as kafka-configs.sh sends it (the
    cluster-wide default, resource name "", is beyond confluent-kafka's admin client)."""
    s = request_schema(API_INCREMENTAL_ALTER_CONFIGS, 1)
    request = s.IncrementalAlterConfigsRequest(
        resources=tuple(
            s.AlterConfigsResource(
                resource_type=RESOURCE_BROKER,
                resource_name=name,
                configs=(s.AlterableConfig(name=config, config_operation=0, value=value),),
            )
            for name, config, value in resources
        ),
        validate_only=validate_only,
    )
    return list(send_request(broker.bootstrap, request).responses)


def describe_default(broker: BrokerProcess) -> dict[str, Any]:
    s = request_schema(API_DESCRIBE_CONFIGS, 4)
    request = s.DescribeConfigsRequest(
        resources=(
            s.DescribeConfigsResource(resource_type=RESOURCE_BROKER, resource_name="", configuration_keys=None),
        ),
        include_synonyms=True,
        include_documentation=False,
    )
    (result,) = send_request(broker.bootstrap, request).results
    assert result.error_code == ErrorCode.none, result.error_message
    return {entry.name: entry for entry in result.configs}


def refusal(admin: AdminClient, broker: str, *changes: tuple[str, str, AlterConfigOpType]) -> tuple[str, str]:
    with pytest.raises(KafkaException) as refused:
        alter(admin, broker, *changes)
    error = refused.value.args[0]
    return error.name(), error.str()


def test_a_per_broker_config_takes_effect_is_described_and_survives_a_restart(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"log.retention.hours": "168"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("events", 1, 1)])["events"].result(timeout=TIMEOUT_S)
    alter(admin, "1", ("log.retention.ms", "3600000", SET))
    described = describe(admin, "broker", "1")["log.retention.ms"]
    assert described.value == "3600000"
    assert described.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert not described.is_read_only
    retention = describe(admin, "topic", "events")["retention.ms"]
    assert retention.value == "3600000"
    assert retention.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert "dynamic broker configs now in effect: log.retention.ms" in broker.log_file.read_text()
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert describe(admin, "topic", "events")["retention.ms"].value == "3600000"
    alter(admin, "1", ("log.retention.ms", None, DELETE))
    static = describe(admin, "broker", "1")["log.retention.hours"]
    assert static.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert describe(admin, "topic", "events")["retention.ms"].value == str(168 * 3_600_000)


def test_a_cluster_wide_default_set_on_a_follower_broker_applies_on_every_broker(
    cluster_factory: ClusterFactory,
) -> None:
    """message.max.bytes raised cluster-wide (sent to broker 2, which forwards it to the controller on node 1)
    lets both brokers accept a batch they refused before."""
    # Segments must hold the 1.5 MB batches (the tests' default is 1 MiB; Kafka refuses a batch larger than one).
    cluster = cluster_factory({"log.segment.bytes": str(8 * 1024 * 1024)}, brokers=2)
    admin = AdminClient({"bootstrap.servers": cluster.broker(2).bootstrap})
    admin.create_topics([NewTopic("big", 2, 1)])["big"].result(timeout=TIMEOUT_S)
    producer_config = {
        "bootstrap.servers": cluster.bootstrap,
        "message.max.bytes": 4_000_000,
        "compression.type": "none",
        "linger.ms": 0,
    }

    def produce_big() -> list[str | None]:
        outcomes: list[str | None] = []
        producer = Producer(producer_config)
        for partition in (0, 1):
            producer.produce(
                "big",
                b"x" * 1_500_000,
                partition=partition,
                on_delivery=lambda err, _msg: outcomes.append(err.name() if err else None),
            )
        assert producer.flush(TIMEOUT_S) == 0
        return outcomes

    assert produce_big() == ["MSG_SIZE_TOO_LARGE"] * 2
    (answer,) = alter_raw(cluster.broker(2), ("", "message.max.bytes", "2000000"))
    assert answer.error_code == ErrorCode.none, answer.error_message
    default = describe_default(cluster.broker(2))
    assert list(default) == ["message.max.bytes"]
    assert default["message.max.bytes"].config_source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    for node_id in (1, 2):
        node_admin = AdminClient({"bootstrap.servers": cluster.broker(node_id).bootstrap})
        described = describe(node_admin, "broker", str(node_id))["message.max.bytes"]
        assert (described.value, described.source) == ("2000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert produce_big() == [None, None]


def test_configs_tierlog_cannot_change_while_running_are_refused_as_kafka_does(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert refusal(admin, "1", ("num.partitions", "3", SET)) == (
        "INVALID_REQUEST",
        "Cannot update these configs dynamically: Set(num.partitions)",
    )
    (listeners,) = alter_raw(broker, ("", "listeners", "PLAINTEXT://127.0.0.1:1"))
    assert listeners.error_code == ErrorCode.invalid_request
    assert listeners.error_message == "Cannot update these configs dynamically: Set(listeners)"
    assert refusal(admin, "1", ("log.segment.bytes", "-5", SET)) == (
        "INVALID_REQUEST",
        "Invalid value -5 for configuration log.segment.bytes: Value must be at least 14",
    )
    assert refusal(admin, "1", ("log.retention.ms", "1", AlterConfigOpType.APPEND)) == (
        "INVALID_CONFIG",
        "Config value append is not allowed for config key: log.retention.ms",
    )
    read_only = describe(admin, "broker", "1")["num.partitions"]
    assert read_only.is_read_only and read_only.source == ConfigSource.DEFAULT_CONFIG.value


def test_a_per_broker_config_must_be_sent_to_that_broker(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    wrong, default = alter_raw(
        broker, ("2", "log.retention.ms", "1000"), ("", "log.retention.ms", "1000"), validate_only=True
    )
    assert wrong.error_code == ErrorCode.invalid_request
    assert wrong.error_message == "Unexpected broker id, expected 1, but received 2"
    assert default.error_code == ErrorCode.none
    assert describe_default(broker) == {}, "validate_only changes nothing"


def test_replication_throttle_rates_are_dynamic_only_described_where_set_and_validated(
    broker_factory: BrokerFactory,
) -> None:
    """leader/follower.replication.throttled.rate (docs/replication.md#throttles): Kafka's DynamicConfig.Broker
    quota configs, absent from a broker's DescribeConfigs until set, per broker or cluster-wide."""
    broker = broker_factory()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = describe(admin, "broker", "1")
    assert "follower.replication.throttled.rate" not in described
    assert "leader.replication.throttled.rate" not in described
    assert described["replication.quota.window.num"].value == "11"
    assert described["replication.quota.window.size.seconds"].value == "1"
    alter(admin, "1", ("follower.replication.throttled.rate", "200000", SET))
    (answer,) = alter_raw(broker, ("", "leader.replication.throttled.rate", "300000"))
    assert answer.error_code == ErrorCode.none, answer.error_message
    described = describe(admin, "broker", "1")
    follower, leader = described["follower.replication.throttled.rate"], described["leader.replication.throttled.rate"]
    assert (follower.value, follower.source) == ("200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert (leader.value, leader.source) == ("300000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert not follower.is_read_only
    assert list(describe_default(broker)) == ["leader.replication.throttled.rate"]
    assert "dynamic broker configs now in effect: follower.replication.throttled.rate" in broker.log_file.read_text()
    assert refusal(admin, "1", ("leader.replication.throttled.rate", "-1", SET)) == (
        "INVALID_REQUEST",
        "Invalid value -1 for configuration leader.replication.throttled.rate: Value must be at least 0",
    )
    assert refusal(admin, "1", ("replication.quota.window.num", "5", SET)) == (
        "INVALID_REQUEST",
        "Cannot update these configs dynamically: Set(replication.quota.window.num)",
    )
    alter(admin, "1", ("follower.replication.throttled.rate", None, DELETE))
    assert "follower.replication.throttled.rate" not in describe(admin, "broker", "1")
