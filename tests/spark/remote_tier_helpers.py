"""A one-broker tiered cluster for the Spark remote-tier tests. The settings follow tests/tiered/tiered_helpers.py
(which is not importable from here: pytest puts only each test file's own folder on sys.path)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.client.connection import KafkaConnection
from tierlog.client.requests import list_offsets_request
from tierlog.common import TopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until

CLIENT_TIMEOUT_S = 30.0
# The bucket conftest's `s3_server` creates; each test works under a prefix of its own.
S3_BUCKET = "tierlog-spark-test"
S3_START_TIMEOUT_S = 60.0
CLUSTER_START_S = 60.0
TIERING_S = 30.0
SEGMENT_BYTES = 16 * 1024
LATEST_TIERED = -5


def start_tiered_broker(base_dir: Path, rsm_config: dict[str, str]) -> LocalCluster:
    """One broker with the remote tier on, every timer short; the caller stops it."""
    overrides = {
        "remote.log.storage.system.enable": "true",
        **{f"rsm.config.{key}": value for key, value in rsm_config.items()},
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
    }
    cluster = LocalCluster(base_dir, brokers=1, overrides=overrides)
    cluster.start(CLUSTER_START_S)
    return cluster


def running_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    try:
        yield cluster
    finally:
        try:
            cluster.stop(timeout_s=10)
        finally:
            for node_id in cluster.node_ids:
                broker = cluster.broker(node_id)
                print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(60)}")


def create_tiered_topic(bootstrap: str, name: str) -> None:
    """Closed segments go to the remote tier and leave the local disk at once (local.retention.bytes=1), and
    stay there: no retention.ms, as the tests' records carry fixed timestamps older than the default 7 days."""
    configs = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": "1",
        "retention.ms": "-1",
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, 1, 1, config=configs)
    admin.create_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)[name].result(timeout=CLIENT_TIMEOUT_S)


def wait_tiered(cluster: LocalCluster, topic: str, local_start_above: int) -> None:
    """Until partition 0 has settled: its local log starts above `local_start_above`, every closed segment is
    copied and deleted locally (the local log is the active segment alone, which no longer rolls once the
    producer is done), so the remote tier's end Ry stays where it is for the rest of the test."""
    node_id = cluster.node_ids[0]

    def state() -> dict[str, Any] | None:
        url = f"http://{cluster.http_address(node_id)}/v1/partitions"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                document = json.loads(response.read())
        except (OSError, ValueError):
            return None
        for partition in document["partitions"]:
            if partition["topic"] == topic and partition["partition"] == 0:
                return dict(partition)
        return None

    def settled() -> bool:
        current = state()
        return (
            current is not None
            and current["local_log_start_offset"] > local_start_above
            and current["local_log_start_offset"] == current["highest_offset_in_remote_storage"] + 1
            and current["local_size_bytes"] < SEGMENT_BYTES
        )

    wait_until(settled, TIERING_S, lambda: f"{topic}-0 tiered past {local_start_above} and settled: {state()}")


def highest_tiered_offset(bootstrap: str, topic: str) -> int:
    """ListOffsets v9 LATEST_TIERED (Ry), sent the way a Kafka client sends it."""

    async def send() -> int:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        connection = await KafkaConnection.open(host, int(port), client_id="test", timeout_s=5)
        try:
            request = list_offsets_request(TopicPartition(topic, 0), LATEST_TIERED, version=9)
            answer = (await connection.send(request, timeout_s=10)).topics[0].partitions[0]
            assert int(answer.error_code.value) == 0, answer
            return int(answer.offset)
        finally:
            await connection.close()

    return asyncio.run(send())
