"""What the tiered-storage tests on real clusters share: broker settings that turn the remote tier on with
short timers, a topic whose closed segments leave the brokers' disks as soon as they are copied, ListOffsets
sent the way a Kafka client sends it, and each broker's own view of its replicas (/v1/partitions)."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.client.connection import KafkaConnection
from tierlog.client.requests import list_offsets_request
from tierlog.common import TopicPartition as TierlogTopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until

CLIENT_TIMEOUT_S = 30.0
TIERING_S = 30.0
SEGMENT_BYTES = 16 * 1024

EARLIEST, LATEST, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -4, -5


def record_values(prefix: str, count: int) -> list[bytes]:
    """`count` distinct record values of about 110 bytes, numbered so a misplaced one names itself."""
    return [f"{prefix}-{i:06d}-".encode() + b"v" * 100 for i in range(count)]


def tiered_overrides(rsm_properties: Mapping[str, str]) -> dict[str, str]:
    """The remote tier on, every timer short, and a small metadata topic so a test cluster starts fast."""
    return {
        "remote.log.storage.system.enable": "true",
        **rsm_properties,
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
        "broker.session.timeout.ms": "2500",
        "broker.heartbeat.interval.ms": "300",
        "replica.fetch.backoff.ms": "200",
        "replica.lag.time.max.ms": "5000",
    }


def tiered_topic_configs(**extra: str) -> dict[str, str]:
    """Closed segments go to the remote tier and leave the local disk at once (local.retention.bytes=1)."""
    return {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": "1",
        **extra,
    }


ClusterFactory = Callable[..., LocalCluster]


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

    async def send() -> tuple[int, int, int]:
        host, port = address.rsplit(":", 1)
        connection = await KafkaConnection.open(host, int(port), client_id="test", timeout_s=5)
        try:
            request = list_offsets_request(TierlogTopicPartition(topic, partition), timestamp, version=9)
            response = await connection.send(request, timeout_s=10)
            answer = response.topics[0].partitions[0]
            return int(answer.error_code.value), int(answer.offset), int(answer.leader_epoch)
        finally:
            await connection.close()

    return asyncio.run(send())


def replica_state(cluster: LocalCluster, node_id: int, topic: str, partition: int = 0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{cluster.http_address(node_id)}/v1/partitions", timeout=2) as response:
            document = json.loads(response.read())
    except (OSError, ValueError):
        return None
    for state in document["partitions"]:
        if state["topic"] == topic and state["partition"] == partition:
            return dict(state)
    return None


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


def leader_of(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    def find() -> int | None:
        for node_id in cluster.node_ids:
            state = replica_state(cluster, node_id, topic, partition)
            if state is not None and state["role"] == "leader":
                return node_id
        return None

    return wait_until(find, TIERING_S, f"a leader of {topic}-{partition}")


def wait_tiered(
    cluster: LocalCluster, node_id: int, topic: str, local_start_above: int, partition: int = 0
) -> dict[str, Any]:
    """Broker `node_id`'s state once its local log starts above `local_start_above` (copied, then deleted)."""

    def moved() -> dict[str, Any] | None:
        state = replica_state(cluster, node_id, topic, partition)
        return state if state is not None and state["local_log_start_offset"] > local_start_above else None

    return wait_until(
        moved,
        TIERING_S,
        lambda: (
            f"{topic}-{partition} on broker {node_id} tiered past {local_start_above}: "
            f"{replica_state(cluster, node_id, topic, partition)}"
        ),
    )
