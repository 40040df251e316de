"""Moving a partition's replicas between real brokers (KIP-455) with kafka-python's KafkaAdminClient while an
acks=all producer keeps writing, and decommissioning a stopped broker with UnregisterBroker (KIP-500), on a local
cluster of four brokers (node 1 also the controller; docs/reassignment.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    ClusterFactory,
    describe_partitions,
    metadata_partition,
    partition_states,
    quorum_leader,
    send_request,
)
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka import errors as Errors
from kio.schema.errors import ErrorCode

from tierlog.client.requests import list_partition_reassignments_request, unregister_broker_request
from tierlog.testing.local_cluster import LocalCluster, wait_until

TIMEOUT_S = 60.0
OVERRIDES = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "5000",
    "min.insync.replicas": "2",
    # The removed replica's `-delete` directory goes at the next retention check, within the test.
    "log.retention.check.interval.ms": "500",
    "log.segment.delete.delay.ms": "0",
}
SOURCE, TARGET = [1, 2, 3], [2, 3, 4]


class AckedProducer:
    """An acks=all producer writing to partition 0 from a thread of its own until `finish`, remembering where
    each acknowledged record went."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": int(TIMEOUT_S * 1000)}
        )
        self.acked: dict[int, bytes] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="acked-producer", daemon=True)
        self.sent = 0

    def _run(self) -> None:
        while not self.stopping.is_set():
            if len(self.producer) < 500:
                for _ in range(50):
                    self.producer.produce(
                        self.topic, f"record-{self.sent}".encode(), partition=0, on_delivery=self._report
                    )
                    self.sent += 1
            self.producer.poll(0.02)

    def _report(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked[message.offset()] = message.value()

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stopping.set()
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive(), "the producer thread did not stop"
        assert self.producer.flush(TIMEOUT_S) == 0, "records still unacknowledged"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return module_cluster_factory(OVERRIDES, brokers=4)


def partition_dirs(cluster: LocalCluster, node_id: int, topic: str) -> list[Path]:
    """Every directory of `topic`-0 in broker `node_id`'s log dir, whatever its suffix (-delete, -stray)."""
    return sorted(cluster.broker(node_id).log_dir.glob(f"{topic}-0*"))


def replicas_in_step(cluster: LocalCluster, topic: str, replicas: list[int]) -> int | None:
    """The log end offset once the leader lists exactly `replicas` as ISR and each of them has the same log
    end offset, equal to the high watermark; None meanwhile."""
    views = {node: (partition_states(cluster, node, topic) or {}).get(0) for node in replicas}
    if any(view is None for view in views.values()):
        return None
    ends = {view["log_end_offset"] for view in views.values() if view is not None}
    leaders = [view for view in views.values() if view is not None and view["role"] == "leader"]
    if len(ends) != 1 or len(leaders) != 1 or sorted(leaders[0]["isr"]) != replicas:
        return None
    return ends.pop() if leaders[0]["high_watermark"] == leaders[0]["log_end_offset"] else None


def test_a_partition_moves_to_new_brokers_under_acks_all_writes_without_losing_a_record(
    cluster: LocalCluster, kafka: Any
) -> None:
    topic = kafka.topic_name()
    creator = AdminClient({"bootstrap.servers": cluster.bootstrap})
    creator.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[SOURCE])])[topic].result(TIMEOUT_S)
    wait_until(
        lambda: replicas_in_step(cluster, topic, SOURCE) is not None, TIMEOUT_S, lambda: "a leader with ISR 1,2,3"
    )
    producer = AckedProducer(cluster.bootstrap, topic)
    producer.start()
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        wait_until(lambda: len(producer.acked) >= 2000, TIMEOUT_S, lambda: "2000 records acknowledged")
        tp = KafkaTopicPartition(topic, 0)
        assert admin.alter_partition_reassignments({tp: TARGET}) == {tp: None}
        in_progress = admin.list_partition_reassignments([tp])
        # Broker 4 may have caught up already: then the reassignment is done and nothing is listed.
        assert in_progress in ({}, {tp: {"replicas": [*TARGET, 1], "adding_replicas": [4], "removing_replicas": [1]}})

        def completed() -> bool:
            named = metadata_partition(cluster.bootstrap, topic, 0, timeout_s=5)
            return named is not None and list(named.replicas) == TARGET and not admin.list_partition_reassignments()

        wait_until(completed, TIMEOUT_S, lambda: f"the reassignment completed ({describe_partitions(cluster, topic)})")
        # Each partition gets its own answer, with Kafka's error codes.
        missing = KafkaTopicPartition(topic, 5)
        assert admin.alter_partition_reassignments({tp: None, missing: [1]}) == {
            tp: Errors.NoReassignmentInProgressError,
            missing: Errors.UnknownTopicOrPartitionError,
        }
        acked_during = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= acked_during + 1000, TIMEOUT_S, lambda: "writes after the move")
    finally:
        producer.finish()
        admin.close()
    assert not producer.errors, producer.errors[:5]

    end = wait_until(
        lambda: replicas_in_step(cluster, topic, TARGET),
        TIMEOUT_S,
        lambda: f"2, 3 and 4 in step ({describe_partitions(cluster, topic)})",
    )
    assert end >= len(producer.acked)
    stored = {r.offset: r.value for r in kafka.consume_all(cluster.bootstrap, topic)}
    lost = {offset: value for offset, value in producer.acked.items() if stored.get(offset) != value}
    assert not lost, f"{len(lost)} of {len(producer.acked)} acknowledged records lost"
    # Broker 1 stopped hosting the partition and its log directory is deleted, not kept aside.
    assert (partition_states(cluster, 1, topic) or {}).get(0) is None
    wait_until(lambda: not partition_dirs(cluster, 1, topic), TIMEOUT_S, lambda: f"{partition_dirs(cluster, 1, topic)}")
    assert all(partition_dirs(cluster, node, topic) for node in TARGET)


def test_a_stopped_broker_is_unregistered_through_any_broker(cluster: LocalCluster) -> None:
    cluster.broker(4).stop()
    try:
        # Node 3 is not the controller: it forwards the request to the active controller.
        response = send_request(cluster.broker(3).bootstrap, unregister_broker_request(4))
        assert response.error_code == ErrorCode.none
        again = send_request(cluster.broker(3).bootstrap, unregister_broker_request(4))
        assert again.error_code == ErrorCode.broker_id_not_registered
        unknown = send_request(cluster.broker(2).bootstrap, unregister_broker_request(99))
        assert unknown.error_code == ErrorCode.broker_id_not_registered
    finally:
        # A decommissioned broker that starts again registers anew, as a new broker would.
        cluster.broker(4).start()
        cluster.broker(4).wait_registered(TIMEOUT_S)


def test_a_running_broker_that_is_unregistered_registers_again(cluster: LocalCluster) -> None:
    """docs/reassignment.md#unregister: its next heartbeat is refused BROKER_ID_NOT_REGISTERED, and a tierlog
    broker then registers again, with a new broker epoch."""
    log_file = cluster.base_dir / "broker-2.log"
    registrations = log_file.read_text().count("[Broker id=2] registered with broker epoch")
    response = send_request(cluster.broker(3).bootstrap, unregister_broker_request(2))
    assert response.error_code == ErrorCode.none
    wait_until(
        lambda: log_file.read_text().count("[Broker id=2] registered with broker epoch") > registrations,
        TIMEOUT_S,
        "broker 2 registered again",
    )
    assert "refused the heartbeat: BROKER_ID_NOT_REGISTERED: registering again" in log_file.read_text()
    cluster.broker(2).wait_registered(TIMEOUT_S)


def test_a_reassignment_in_progress_survives_the_active_controllers_crash(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    """docs/reassignment.md#failover on real processes: three combined controllers; the target's new broker is
    down, so the reassignment waits; the active controller is killed; once both are back, the new active
    controller completes it from the records alone."""
    voters = (1, 2, 3)
    cluster = cluster_factory(OVERRIDES, brokers=4, controllers=3, combined=True)
    topic = kafka.topic_name()
    creator = AdminClient({"bootstrap.servers": cluster.bootstrap})
    creator.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[SOURCE])])[topic].result(TIMEOUT_S)
    wait_until(lambda: replicas_in_step(cluster, topic, SOURCE) is not None, TIMEOUT_S, lambda: "ISR 1, 2, 3")
    producer = AckedProducer(cluster.bootstrap, topic)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 1000, TIMEOUT_S, lambda: "1000 records acknowledged")

    cluster.broker(4).stop()
    cluster.wait_for_brokers(3, timeout_s=TIMEOUT_S)  # broker 4 fenced
    tp = KafkaTopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.broker(2).bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        assert admin.alter_partition_reassignments({tp: TARGET}) == {tp: None}
        assert admin.list_partition_reassignments([tp]) == {
            tp: {"replicas": [*TARGET, 1], "adding_replicas": [4], "removing_replicas": [1]}
        }
    finally:
        admin.close()

    active, epoch = wait_until(lambda: quorum_leader(cluster, voters), TIMEOUT_S, "a quorum leader")
    cluster.kill(active)
    survivors = tuple(node for node in voters if node != active)
    wait_until(
        lambda: (found := quorum_leader(cluster, survivors)) is not None and found[1] > epoch,
        TIMEOUT_S,
        "a new active controller",
    )
    cluster.broker(active).start()
    cluster.broker(4).start()
    cluster.wait_for_brokers(4, timeout_s=TIMEOUT_S)

    def completed() -> bool:
        named = metadata_partition(cluster.bootstrap, topic, 0, timeout_s=5)
        return named is not None and list(named.replicas) == TARGET

    wait_until(completed, TIMEOUT_S, lambda: f"the reassignment completed ({describe_partitions(cluster, topic)})")
    producer.finish()
    assert not producer.errors, producer.errors[:5]
    wait_until(
        lambda: replicas_in_step(cluster, topic, TARGET),
        TIMEOUT_S,
        lambda: f"2, 3 and 4 in step ({describe_partitions(cluster, topic)})",
    )
    stored = {r.offset: r.value for r in kafka.consume_all(cluster.bootstrap, topic)}
    lost = {offset: value for offset, value in producer.acked.items() if stored.get(offset) != value}
    assert not lost, f"{len(lost)} of {len(producer.acked)} acknowledged records lost"
    listed = send_request(cluster.broker(4).bootstrap, list_partition_reassignments_request(None, timeout_ms=30_000))
    assert listed.error_code == ErrorCode.none and listed.topics == ()
