"""What the tiered-storage tests on real clusters share (tests/tiered and the Spark remote-tier tests): broker
settings that turn the remote tier on with short timers, a topic whose closed segments leave the brokers' disks as
soon as they are copied, ListOffsets sent the way a Kafka client sends it, and waits on each broker's own view of
its replicas (/v1/partitions)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from cluster_helpers import ClusterFactory, replica_state, send_request
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tierlog.client.requests import list_offsets_request
from tierlog.common import TopicPartition as TierlogTopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

CLIENT_TIMEOUT_S = 30.0
TIERING_S = 30.0
SEGMENT_BYTES = 16 * 1024

EARLIEST, LATEST, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -4, -5


def record_values(prefix: str, count: int) -> list[bytes]:
    """`count` distinct record values of about 110 bytes, numbered so a misplaced one names itself."""
    return [f"{prefix}-{i:06d}-".encode() + b"v" * 100 for i in range(count)]


def tiered_overrides(rsm_properties: Mapping[str, str], brokers: int = 3) -> dict[str, str]:
    """The remote tier on (`rsm_properties` are the brokers' rsm.config.* settings), every timer short, and a
    small metadata topic on every one of the cluster's `brokers`, so a test cluster starts fast."""
    return {
        "remote.log.storage.system.enable": "true",
        **rsm_properties,
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
        "rlmm.config.remote.log.metadata.topic.replication.factor": str(brokers),
        "broker.session.timeout.ms": "2500",
        "broker.heartbeat.interval.ms": "300",
        "replica.fetch.backoff.ms": "200",
        "replica.lag.time.max.ms": "5000",
    }


def start_tiered_broker(cluster_factory: ClusterFactory, rsm_config: Mapping[str, str]) -> LocalCluster:
    """A one-broker cluster with the remote tier on; `rsm_config` is its rsm.config.* settings without the prefix
    (as the Spark source takes them)."""
    rsm_properties = {f"rsm.config.{key}": value for key, value in rsm_config.items()}
    return cluster_factory(tiered_overrides(rsm_properties, brokers=1), brokers=1)


def tiered_topic_configs(**extra: str) -> dict[str, str]:
    """Closed segments go to the remote tier and leave the local disk at once (local.retention.bytes=1)."""
    return {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": "1",
        **extra,
    }


def create_topic(
    bootstrap: str,
    name: str,
    configs: Mapping[str, str],
    *,
    partitions: int = 1,
    replication_factor: int = 3,
    assignment: list[list[int]] | None = None,
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = (
        NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment, config=dict(configs))
        if assignment is not None
        else NewTopic(name, partitions, replication_factor, config=dict(configs))
    )
    admin.create_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)[name].result(timeout=CLIENT_TIMEOUT_S)


def alter_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    """Set one config of `topic` (IncrementalAlterConfigs SET), as kafka-configs.sh --alter does."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=CLIENT_TIMEOUT_S)


def produce(
    bootstrap: str, topic: str, values: list[bytes], *, timestamps: list[int] | None = None, partition: int = 0
) -> None:
    """acks=all, every record acknowledged or the test fails."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096, "enable.idempotence": False}
    )
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    for index, value in enumerate(values):
        kwargs: dict[str, Any] = {"partition": partition, "on_delivery": delivered}
        if timestamps is not None:
            kwargs["timestamp"] = timestamps[index]
        while True:
            try:
                producer.produce(topic, value, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(CLIENT_TIMEOUT_S)
    assert remaining == 0 and not failures, f"{remaining} undelivered, failures {failures[:3]}"


def consume_all(bootstrap: str, topic: str, count: int, partition: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of the first `count` records from offset 0 with confluent-kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    records: list[tuple[int, bytes]] = []
    try:

        def more() -> bool:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    raise AssertionError(f"consumer error: {message.error()}")
                records.append((message.offset(), message.value()))
            return len(records) >= count

        wait_until(more, CLIENT_TIMEOUT_S * 2, lambda: f"{count} records of {topic} (have {len(records)})")
    finally:
        consumer.close()
    return records


def list_offsets(address: str, topic: str, timestamp: int, partition: int = 0) -> tuple[int, int, int]:
    """(error code, offset, leader epoch) of ListOffsets v9 (the version with LATEST_TIERED) sent to `address`."""
    request = list_offsets_request(TierlogTopicPartition(topic, partition), timestamp, version=9)
    answer = send_request(address, request, timeout_s=10).topics[0].partitions[0]
    return int(answer.error_code.value), int(answer.offset), int(answer.leader_epoch)


def s3_keys(server: LocalS3Server, bucket: str, prefix: str) -> list[str]:
    """The keys of every object in `bucket` under `prefix`."""
    keys: list[str] = []
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def segment_start(name: str) -> int:
    """The base offset in a remote object's name (`.../00000000000000001234-<uuid>.log`)."""
    return int(name.rsplit("/", 1)[-1].split("-")[0])


def lose_replica_disk(cluster: LocalCluster, node_id: int, topic: str, partition: int = 0) -> None:
    """Kill `node_id` and delete its replica of `topic`-`partition`, as a broker whose disk was replaced: it
    comes back knowing nothing of the partition. Waits first until the broker hosts the replica (right after
    CreateTopics it may not have applied the metadata yet)."""
    wait_until(
        lambda: replica_state(cluster, node_id, topic, partition) is not None,
        TIERING_S,
        lambda: f"broker {node_id} hosting {topic}-{partition}",
    )
    cluster.kill(node_id)
    shutil.rmtree(cluster.base_dir / f"broker-{node_id}" / f"{topic}-{partition}")


def wait_in_sync(cluster: LocalCluster, topic: str, leader: int, follower: int, partition: int = 0) -> dict[str, Any]:
    """The follower's state once it is in the leader's ISR with the leader's LEO and HW."""

    def in_sync() -> dict[str, Any] | None:
        lead = replica_state(cluster, leader, topic, partition)
        follow = replica_state(cluster, follower, topic, partition)
        if lead is None or follow is None or follower not in lead["isr"]:
            return None
        same = (follow["log_end_offset"], follow["high_watermark"]) == (lead["log_end_offset"], lead["high_watermark"])
        return follow if same else None

    return wait_until(
        in_sync,
        TIERING_S,
        lambda: (
            f"broker {follower} in sync with {leader}: {replica_state(cluster, leader, topic, partition)} / "
            f"{replica_state(cluster, follower, topic, partition)}"
        ),
    )


def leader_of(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    def find() -> int | None:
        for node_id in cluster.node_ids:
            state = replica_state(cluster, node_id, topic, partition)
            if state is not None and state["role"] == "leader":
                return node_id
        return None

    return wait_until(find, TIERING_S, f"a leader of {topic}-{partition}")


def wait_tiered(
    cluster: LocalCluster,
    node_id: int,
    topic: str,
    local_start_above: int,
    partition: int = 0,
    *,
    settled: bool = False,
) -> dict[str, Any]:
    """Broker `node_id`'s state once its local log starts above `local_start_above` (copied, then deleted). With
    `settled`, also once every closed segment is copied and deleted locally (the local log is the active segment
    alone, which no longer rolls once the producer is done), so the remote tier's end Ry stays where it is."""

    def moved() -> dict[str, Any] | None:
        state = replica_state(cluster, node_id, topic, partition)
        if state is None or state["local_log_start_offset"] <= local_start_above:
            return None
        if settled and (
            state["local_log_start_offset"] != state["highest_offset_in_remote_storage"] + 1
            or state["local_size_bytes"] >= SEGMENT_BYTES
        ):
            return None
        return state

    return wait_until(
        moved,
        TIERING_S,
        lambda: (
            f"{topic}-{partition} on broker {node_id} tiered past {local_start_above} "
            f"({'and settled' if settled else 'copied'}): {replica_state(cluster, node_id, topic, partition)}"
        ),
    )
