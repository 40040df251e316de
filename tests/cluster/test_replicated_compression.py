"""Recompression happens on the leader only: a follower appends the leader's batches byte for byte, so the
replicas of a topic whose compression.type differs from the producer's codec stay identical."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic

from tierlog.records.record_batch import CompressionType, iter_batches
from tierlog.testing.local_cluster import LocalCluster, wait_until

TIMEOUT_S = 30.0


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(brokers=2)


def segment_bytes(cluster: LocalCluster, node_id: int, topic: str) -> bytes:
    directory = cluster.broker(node_id).log_dir / f"{topic}-0"
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def test_followers_store_the_leaders_recompressed_batches_byte_for_byte(cluster: LocalCluster, kafka: Any) -> None:
    bootstrap = cluster.bootstrap
    topic = kafka.topic_name()
    admin = kafka.admin(bootstrap)
    config = {"compression.type": "zstd", "compression.zstd.level": "9", "min.insync.replicas": "2"}
    admin.create_topics([NewTopic(topic, 1, 2, config=config)])[topic].result(TIMEOUT_S)

    def has_leader() -> bool:
        metadata = admin.list_topics(topic=topic, timeout=TIMEOUT_S).topics.get(topic)
        partition = metadata.partitions.get(0) if metadata is not None else None
        return partition is not None and partition.leader >= 0

    wait_until(has_leader, TIMEOUT_S, f"a leader for {topic}")
    sent = [{"key": b"k%d" % (i % 9), "value": b"replicated %d " % i * 20} for i in range(2000)]
    # acks=all with min.insync.replicas=2: every acknowledged batch is on both replicas.
    kafka.produce(bootstrap, topic, sent, compression_type="lz4", batch_size=16384)

    stored = segment_bytes(cluster, 1, topic)
    wait_until(lambda: segment_bytes(cluster, 2, topic) == stored, TIMEOUT_S, "identical replicas")
    headers = list(iter_batches(stored))
    assert len(headers) > 1 and {h.compression_type for h in headers} == {CompressionType.ZSTD}
    assert [r.value for r in kafka.consume_all(bootstrap, topic)] == [s["value"] for s in sent]
