"""A partition's leader dies between the driver's plan and the executor's read: the read finds the new leader."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.spark.offsets import current_leader
from tierlog.spark.options import parse_batch_options
from tierlog.spark.source import RangePartition, TierlogBatchReader
from tierlog.testing.local_cluster import LocalCluster, wait_until

TOPIC = "moving"
RECORDS = 400
TIMEOUT_S = 60.0
# A killed broker is fenced (and its partitions' leadership moved) after the session timeout: short here.
OVERRIDES = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(OVERRIDES, brokers=3)


def test_a_read_planned_on_a_leader_that_then_dies_continues_on_the_new_leader(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # Node 2 leads (node 1 runs the controller, which must survive for an election to happen).
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[2, 3, 1]], config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "batch.size": 2000})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=f"v{i}".encode())
    assert producer.flush(TIMEOUT_S) == 0

    old_leader = cluster.broker(2).bootstrap
    wait_until(lambda: current_leader(cluster.bootstrap, TOPIC, 0) == old_leader, TIMEOUT_S, "node 2 leading")
    reader = TierlogBatchReader(parse_batch_options({"bootstrap.servers": cluster.bootstrap, "subscribe": TOPIC}))
    (planned,) = reader.partitions()
    assert isinstance(planned, RangePartition) and planned.range.leader == old_leader

    cluster.kill(2)
    rows = [row for batch in reader.read(planned) for row in batch.to_pylist()]

    assert [r["offset"] for r in rows] == list(range(RECORDS))
    assert [r["value"] for r in rows] == [f"v{i}".encode() for i in range(RECORDS)]
    assert current_leader(cluster.bootstrap, TOPIC, 0) != old_leader
