"""Leaders back on their preferred replicas after a broker restart left them elsewhere, on three real brokers:
asked for with ElectLeaders (confluent-kafka's AdminClient.elect_leaders, KIP-460), and done by the controller
itself with auto.leader.rebalance.enable. No acknowledged record is lost on the way."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import describe_partitions, partition_views, send_request
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.elect_leaders.v1 import request as elect_leaders_v1
from kio.schema.errors import ErrorCode

from tierlog.testing.local_cluster import LocalCluster, wait_until

# The `tierlog` console script of the environment running the tests.
TIERLOG = str(Path(sys.executable).with_name("tierlog"))
PARTITIONS = (0, 1, 2)
# Replicas are placed round-robin from broker 1: partition p prefers broker p + 1.
PREFERRED = {0: 1, 1: 2, 2: 3}
RESTARTED = 2
OVERRIDES = {
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "5000",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}
TIMEOUT_S = 30.0
RECORDS_PER_ROUND = 300


# partition -> (leader, leader epoch)
Leaders = dict[int, tuple[int, int]]


def leaders(cluster: LocalCluster, topic: str) -> Leaders | None:
    """Each partition's leader and epoch once it has one leader, as that broker reports, with every broker in
    its ISR and at its HW; None meanwhile."""
    views = [v for v in partition_views(cluster, topic).values() if v is not None]
    found: Leaders = {}
    for partition in PARTITIONS:
        states = [v[partition] for v in views if partition in v]
        leading = [s for s in states if s["role"] == "leader"]
        if len(states) != len(cluster.node_ids) or len(leading) != 1:
            return None
        leader = leading[0]
        if sorted(leader["isr"]) != cluster.node_ids or leader["high_watermark"] != leader["log_end_offset"]:
            return None
        found[partition] = (int(leader["leader"]), int(leader["leader_epoch"]))
    return found


def wait_leaders(cluster: LocalCluster, topic: str, expected: Callable[[Leaders], bool], what: str) -> Leaders:
    """`leaders`, waited for until `expected` holds of them."""

    def settled() -> Leaders | None:
        found = leaders(cluster, topic)
        return found if found is not None and expected(found) else None

    return wait_until(settled, TIMEOUT_S, lambda: f"{what} ({describe_partitions(cluster, topic)})")


class AckedRecords:
    """An acks=all producer that remembers where each acknowledged record went."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": int(TIMEOUT_S * 1000)}
        )
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.sent = 0

    def send(self, count: int) -> None:
        for _ in range(count):
            value = f"record-{self.sent}".encode()
            self.producer.produce(self.topic, value, partition=self.sent % len(PARTITIONS), on_delivery=self._report)
            self.sent += 1
            self.producer.poll(0)

    def _report(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked[(message.partition(), message.offset())] = message.value()

    def flush(self) -> None:
        assert self.producer.flush(TIMEOUT_S) == 0, "records still unacknowledged"


def read_all(kafka: Any, bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    return {(r.partition, r.offset): r.value for r in kafka.consume_all(bootstrap, topic, PARTITIONS)}


def imbalanced_by_a_restart(cluster: LocalCluster, producer: AckedRecords) -> Leaders:
    """Every partition on its preferred replica, then broker 2 restarted (a controlled shutdown moves partition 1
    to broker 3) while records keep coming; returns the leaders once broker 2 is back in every ISR."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(producer.topic, num_partitions=len(PARTITIONS))])[producer.topic].result(TIMEOUT_S)
    before = wait_leaders(
        cluster, producer.topic, lambda found: all(found[p][0] == PREFERRED[p] for p in PARTITIONS), "leaders"
    )
    producer.send(RECORDS_PER_ROUND)
    producer.flush()
    cluster.restart(RESTARTED, timeout_s=TIMEOUT_S)
    producer.send(RECORDS_PER_ROUND)
    producer.flush()
    after = wait_leaders(
        cluster, producer.topic, lambda found: found[1][0] != RESTARTED, "broker 2 back in every ISR, not leading"
    )
    assert after[1][1] > before[1][1]
    return after


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory({**OVERRIDES, "auto.leader.rebalance.enable": "false"})


def test_elect_leaders_moves_leaders_back_to_their_preferred_replicas(cluster: LocalCluster, kafka: Any) -> None:
    topic = kafka.topic_name()
    producer = AckedRecords(cluster.bootstrap, topic)
    imbalanced = imbalanced_by_a_restart(cluster, producer)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    producer.send(RECORDS_PER_ROUND)  # in flight while leadership moves
    every = admin.elect_leaders(ElectionType.PREFERRED, None).result(TIMEOUT_S)
    producer.send(RECORDS_PER_ROUND)
    producer.flush()
    # Every partition was asked about; only the one that moved is in the answer, as Kafka answers.
    assert {(tp.topic, tp.partition): error for tp, error in every.items()} == {(topic, 1): None}
    moved = wait_leaders(
        cluster, topic, lambda found: all(found[p][0] == PREFERRED[p] for p in PARTITIONS), "preferred leaders"
    )
    assert moved[1][1] == imbalanced[1][1] + 1 and moved[0] == imbalanced[0] and moved[2] == imbalanced[2]

    again = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, p) for p in PARTITIONS])
    # confluent-kafka hands each partition's error over as a KafkaError (its docstring says KafkaException).
    codes = {(tp.topic, tp.partition): error.code() for tp, error in again.result(TIMEOUT_S).items()}
    assert codes == {(topic, p): KafkaError.ELECTION_NOT_NEEDED for p in PARTITIONS}

    assert not producer.errors, producer.errors[:5]
    stored = read_all(kafka, cluster.bootstrap, topic)
    lost = {at: value for at, value in producer.acked.items() if stored.get(at) != value}
    assert not lost and len(producer.acked) == 4 * RECORDS_PER_ROUND, f"{len(lost)} acknowledged records lost"


def test_a_broker_that_is_not_the_controller_forwards_elect_leaders_and_the_cli_elects(
    cluster: LocalCluster, kafka: Any
) -> None:
    topic = kafka.topic_name()
    imbalanced_by_a_restart(cluster, AckedRecords(cluster.bootstrap, topic))
    request = elect_leaders_v1.ElectLeadersRequest(
        election_type=1,
        topic_partitions=(
            elect_leaders_v1.TopicPartitions(topic=topic, partitions=PARTITIONS),
            elect_leaders_v1.TopicPartitions(topic="no-such-topic", partitions=(0,)),
        ),
    )
    response = send_request(cluster.broker(3).bootstrap, request)  # node 1 runs the controller
    assert response.error_code == ErrorCode.none
    assert {
        r.topic: [(p.partition_id, p.error_code) for p in r.partition_result] for r in response.replica_election_results
    } == {
        topic: [(p, ErrorCode.election_not_needed) for p in PARTITIONS],  # unclean: every partition has a leader
        "no-such-topic": [(0, ErrorCode.unknown_topic_or_partition)],
    }

    ran = subprocess.run(
        [TIERLOG, "cluster", "elect-leaders", "--topic", topic, "-b", cluster.broker(3).bootstrap, "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == [
        f"Successfully completed leader election (PREFERRED) for partitions {topic}-1",
        f"Valid replica already elected for partitions {topic}-0, {topic}-2",
    ]
    wait_leaders(cluster, topic, lambda found: found[1][0] == PREFERRED[1], "broker 2 leading partition 1 again")


def test_the_controller_moves_leaders_back_by_itself(cluster_factory: Callable[..., LocalCluster], kafka: Any) -> None:
    cluster = cluster_factory({**OVERRIDES, "leader.imbalance.check.interval.seconds": "1"})
    topic = kafka.topic_name()
    producer = AckedRecords(cluster.bootstrap, topic)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=len(PARTITIONS))])[topic].result(TIMEOUT_S)
    before = wait_leaders(
        cluster, topic, lambda found: all(found[p][0] == PREFERRED[p] for p in PARTITIONS), "preferred leaders"
    )
    producer.send(RECORDS_PER_ROUND)
    producer.flush()
    cluster.restart(RESTARTED, timeout_s=TIMEOUT_S)
    producer.send(RECORDS_PER_ROUND)
    # Partition 1 went to broker 3 for the restart (epoch + 1) and came back (epoch + 2), nobody asking.
    after = wait_leaders(
        cluster,
        topic,
        lambda found: all(found[p][0] == PREFERRED[p] for p in PARTITIONS) and found[1][1] > before[1][1],
        "partition 1 back on broker 2",
    )
    producer.flush()
    assert after[1][1] >= before[1][1] + 2 and after[0] == before[0] and after[2] == before[2]
    assert not producer.errors, producer.errors[:5]
    stored = read_all(kafka, cluster.bootstrap, topic)
    assert all(stored.get(at) == value for at, value in producer.acked.items())
    assert len(producer.acked) == 2 * RECORDS_PER_ROUND
