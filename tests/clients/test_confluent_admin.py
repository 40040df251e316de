"""confluent-kafka's AdminClient against a real broker: topics, partitions, configs, records, offsets."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclOperation,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from tierlog.testing.local_cluster import BrokerProcess, wait_until

BASE_TS = 1_700_000_000_000


def _error_name(exc: BaseException) -> str:
    assert isinstance(exc, KafkaException), exc
    return str(exc.args[0].name())


def _topic_configs(admin: Any, topic: str, timeout: float) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return dict(admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout))


def test_create_topic_then_describe_shows_its_partitions_and_id(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=3)
    description = admin.describe_topics(TopicCollection([topic]), request_timeout=kafka.timeout_s)[topic].result(
        kafka.timeout_s
    )
    assert description.name == topic
    assert description.topic_id is not None and str(description.topic_id) != "AAAAAAAAAAAAAAAAAAAAAA"
    assert [p.id for p in description.partitions] == [0, 1, 2]
    for p in description.partitions:
        assert p.leader is not None and p.leader.id == 1
        assert [r.id for r in p.replicas] == [1] and [r.id for r in p.isr] == [1]
    listed = admin.list_topics(topic=topic, timeout=kafka.timeout_s).topics
    assert sorted(listed[topic].partitions) == [0, 1, 2]


def test_list_topics_without_a_topic_lists_every_topic(shared_broker: BrokerProcess, kafka: Any) -> None:
    # librdkafka asks for all topics with Metadata v12 whose body has 3 bytes after the v12 fields (its
    # 4-byte array-count placeholder stays in place); Kafka ignores bytes after a request body.
    names = [kafka.topic_name() for _ in range(3)]
    for i, name in enumerate(names):
        kafka.create_topic(shared_broker.bootstrap, name, partitions=i + 1)
    listed = kafka.admin(shared_broker.bootstrap).list_topics(timeout=kafka.timeout_s).topics
    assert {name: len(listed[name].partitions) for name in names if name in listed} == {
        name: i + 1 for i, name in enumerate(names)
    }


def test_create_existing_topic_fails_with_topic_already_exists(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    future = admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=kafka.timeout_s)[topic]
    with pytest.raises(KafkaException) as raised:
        future.result(kafka.timeout_s)
    assert _error_name(raised.value) == "TOPIC_ALREADY_EXISTS"
    assert len(admin.list_topics(topic=topic, timeout=kafka.timeout_s).topics[topic].partitions) == 1


@pytest.mark.parametrize(
    ("partitions", "replication", "config", "error"),
    [
        (0, 1, {}, "INVALID_PARTITIONS"),
        (1, 3, {}, "INVALID_REPLICATION_FACTOR"),
        (1, 1, {"retention.ms": "not-a-number"}, "INVALID_CONFIG"),
        (1, 1, {"cleanup.policy": "shred"}, "INVALID_CONFIG"),
    ],
)
def test_create_topic_with_invalid_settings_is_refused_with_kafkas_error(
    shared_broker: BrokerProcess, kafka: Any, partitions: int, replication: int, config: dict[str, str], error: str
) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.topic_name()
    future = admin.create_topics([NewTopic(topic, partitions, replication, config=config)])[topic]
    with pytest.raises(KafkaException) as raised:
        future.result(kafka.timeout_s)
    assert _error_name(raised.value) == error
    assert not kafka.topic_exists(shared_broker.bootstrap, topic)


def test_validate_only_create_creates_nothing(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.topic_name()
    admin.create_topics([NewTopic(topic, 2, 1)], validate_only=True)[topic].result(kafka.timeout_s)
    assert not kafka.topic_exists(shared_broker.bootstrap, topic)


def test_describe_configs_shows_overrides_broker_settings_and_defaults(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap, config={"retention.ms": "3600000"})
    configs = _topic_configs(admin, topic, kafka.timeout_s)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # The test broker runs with log.segment.bytes=1048576: a static broker setting.
    assert configs["segment.bytes"].value == "1048576"
    assert configs["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "1048588"


def test_describe_configs_of_an_unknown_topic_fails(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    resource = ConfigResource(ConfigResource.Type.TOPIC, kafka.topic_name("-missing"))
    with pytest.raises(KafkaException) as raised:
        admin.describe_configs([resource])[resource].result(kafka.timeout_s)
    assert _error_name(raised.value) == "UNKNOWN_TOPIC_OR_PART"


def test_incremental_alter_configs_sets_and_deletes_topic_overrides(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap, config={"retention.ms": "3600000"})

    def alter(*entries: ConfigEntry) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=list(entries))
        admin.incremental_alter_configs([resource])[resource].result(kafka.timeout_s)

    alter(
        ConfigEntry("retention.bytes", "5000000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    )
    configs = _topic_configs(admin, topic, kafka.timeout_s)
    assert configs["retention.bytes"].value == "5000000"
    assert configs["retention.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].value == "604800000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "-7", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as raised:
        admin.incremental_alter_configs([resource])[resource].result(kafka.timeout_s)
    assert _error_name(raised.value) == "INVALID_CONFIG"
    assert _topic_configs(admin, topic, kafka.timeout_s)["retention.bytes"].value == "5000000"


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_replaces_every_topic_override(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap, config={"retention.ms": "3600000"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"max.message.bytes": "20000"})
    admin.alter_configs([resource])[resource].result(kafka.timeout_s)
    configs = _topic_configs(admin, topic, kafka.timeout_s)
    assert configs["max.message.bytes"].value == "20000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_altered_max_message_bytes_takes_effect_on_produce(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"x" * 50_000}])
    entry = ConfigEntry("max.message.bytes", "10000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(kafka.timeout_s)
    assert kafka.delivery_errors(shared_broker.bootstrap, topic, [{"value": b"x" * 50_000}]) == ["MSG_SIZE_TOO_LARGE"]
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (0, 1)


def test_create_partitions_grows_the_topic_and_new_partitions_take_records(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(kafka.timeout_s)
    assert sorted(admin.list_topics(topic=topic, timeout=kafka.timeout_s).topics[topic].partitions) == [0, 1, 2, 3]
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"p3", "partition": 3}])
    assert [(r.partition, r.value) for r in kafka.consume_all(shared_broker.bootstrap, topic, range(4))] == [(3, b"p3")]
    with pytest.raises(KafkaException) as raised:
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(kafka.timeout_s)
    assert _error_name(raised.value) == "INVALID_PARTITIONS"


def test_delete_topic_removes_it_and_its_data(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"old"}] * 10)
    partition_dir = shared_broker.log_dir / f"{topic}-0"
    assert partition_dir.is_dir()
    admin.delete_topics([topic])[topic].result(kafka.timeout_s)
    assert not kafka.topic_exists(shared_broker.bootstrap, topic)
    wait_until(lambda: not partition_dir.exists(), 10, f"{partition_dir} to go")
    # A topic created again under the same name starts empty.
    kafka.create_topic(shared_broker.bootstrap, topic)
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (0, 0)
    with pytest.raises(KafkaException) as raised:
        admin.delete_topics([topic + "-never"])[topic + "-never"].result(kafka.timeout_s)
    assert _error_name(raised.value) == "UNKNOWN_TOPIC_OR_PART"


def test_delete_records_moves_the_log_start_offset(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    kafka.produce(shared_broker.bootstrap, topic, [{"value": b"v%d" % i} for i in range(100)])

    [result] = admin.delete_records([TopicPartition(topic, 0, 40)]).values()
    assert result.result(kafka.timeout_s).low_watermark == 40
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (40, 100)
    got = kafka.consume_all(shared_broker.bootstrap, topic)
    assert [r.offset for r in got] == list(range(40, 100))

    # Deleting below the current start changes nothing; beyond the high watermark is out of range.
    [result] = admin.delete_records([TopicPartition(topic, 0, 10)]).values()
    assert result.result(kafka.timeout_s).low_watermark == 40
    [result] = admin.delete_records([TopicPartition(topic, 0, 101)]).values()
    with pytest.raises(KafkaException) as raised:
        result.result(kafka.timeout_s)
    assert _error_name(raised.value) == "OFFSET_OUT_OF_RANGE"
    # Of the negative offsets only -1 has a meaning; librdkafka passes the others (here OFFSET_INVALID) on.
    [result] = admin.delete_records([TopicPartition(topic, 0, -1001)]).values()
    with pytest.raises(KafkaException) as raised:
        result.result(kafka.timeout_s)
    assert _error_name(raised.value) == "OFFSET_OUT_OF_RANGE"
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (40, 100)
    # -1 means "up to the high watermark".
    [result] = admin.delete_records([TopicPartition(topic, 0, -1)]).values()
    assert result.result(kafka.timeout_s).low_watermark == 100
    assert kafka.watermarks(shared_broker.bootstrap, topic) == (100, 100)


def test_describe_cluster_reports_this_broker(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    cluster = admin.describe_cluster(request_timeout=kafka.timeout_s).result(kafka.timeout_s)
    assert cluster.cluster_id and len(cluster.cluster_id) == 22
    assert cluster.controller is not None and cluster.controller.id == 1
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(1, "127.0.0.1", shared_broker.port)]


def test_authorized_operations_are_every_operation_of_the_resource_without_an_authorizer(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    timeout = {"request_timeout": kafka.timeout_s}
    cluster = admin.describe_cluster(include_authorized_operations=True, **timeout).result(kafka.timeout_s)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    }
    [described] = admin.describe_topics(
        TopicCollection([topic]), include_authorized_operations=True, **timeout
    ).values()
    assert set(described.result(kafka.timeout_s).authorized_operations) == {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    [group] = admin.describe_consumer_groups(["no-such-group"], include_authorized_operations=True, **timeout).values()
    assert set(group.result(kafka.timeout_s).authorized_operations) == {
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
    }
    # Not asked for, they are not reported.
    assert admin.describe_cluster(**timeout).result(kafka.timeout_s).authorized_operations is None
    [described] = admin.describe_topics(TopicCollection([topic]), **timeout).values()
    assert described.result(kafka.timeout_s).authorized_operations is None


def test_list_offsets_earliest_latest_by_timestamp_and_max_timestamp(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = kafka.admin(shared_broker.bootstrap)
    topic = kafka.new_topic(shared_broker.bootstrap)
    timestamps = [10, 20, 30, 90, 40, 50]  # the largest timestamp is at offset 3
    kafka.produce(
        shared_broker.bootstrap,
        topic,
        [{"value": b"v", "timestamp": BASE_TS + t} for t in timestamps],
        linger_ms=0,
        batch_num_messages=1,
    )
    tp = TopicPartition(topic, 0)

    def offset(spec: OffsetSpec) -> tuple[int, int]:
        info = admin.list_offsets({tp: spec}, request_timeout=kafka.timeout_s)[tp].result(kafka.timeout_s)
        return info.offset, info.timestamp

    assert offset(OffsetSpec.earliest())[0] == 0
    assert offset(OffsetSpec.latest())[0] == 6
    assert offset(OffsetSpec.for_timestamp(BASE_TS + 35)) == (3, BASE_TS + 90)
    assert offset(OffsetSpec.for_timestamp(BASE_TS + 40)) == (3, BASE_TS + 90)
    assert offset(OffsetSpec.for_timestamp(BASE_TS + 20)) == (1, BASE_TS + 20)
    assert offset(OffsetSpec.max_timestamp()) == (3, BASE_TS + 90)
