"""The simulated clients keep leaders as Kafka's clients do since KIP-320: with their leader epochs, never from
metadata older than what they have seen, and a consumer fetches with its leader epoch and validates its
position after a leader change. Seed 70147 showed why: a consumer without that followed a deposed leader's
stale metadata back to its shorter log and was told OFFSET_OUT_OF_RANGE."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_helpers import run_until, started_cluster

from tierlog.common import TopicPartition
from tierlog.replication.fetcher import FetchRequestData, FetchRequestPartition
from tierlog.replication.partition import Partition
from tierlog.sim.broker_node import FetchReply, PartitionLeader, SimBroker
from tierlog.sim.clients import SimClient
from tierlog.sim.run import TOPIC, Cluster, SimConfig
from tierlog.sim.world import Network, Respond, Simulation

TP = TopicPartition(TOPIC, 0)
OTHER = TopicPartition(TOPIC, 1)
NO_TOPIC_ID = uuid.UUID(int=0)


def test_metadata_from_a_broker_behind_on_leader_epochs_is_ignored() -> None:
    sim = Simulation(seed=1, start_ms=0)
    client = SimClient(sim, Network(sim), "client", {})
    client.update_leaders({TP: PartitionLeader(2, 5), OTHER: PartitionLeader(1, 0)})
    # A deposed leader that never heard of epochs 1..5 still names itself; the newer leader stays.
    client.update_leaders({TP: PartitionLeader(1, 0), OTHER: PartitionLeader(1, 0)})
    assert client.leaders == {TP: PartitionLeader(2, 5), OTHER: PartitionLeader(1, 0)}
    # The same epoch or a newer one is taken, an offline partition (leader -1) included.
    client.update_leaders({TP: PartitionLeader(-1, 6), OTHER: PartitionLeader(3, 1)})
    assert client.leaders == {TP: PartitionLeader(-1, 6), OTHER: PartitionLeader(3, 1)}
    # A broker that knows nothing of a partition leaves it without a leader, yet its newest epoch is remembered.
    client.update_leaders({OTHER: PartitionLeader(3, 1)})
    assert TP not in client.leaders
    client.update_leaders({TP: PartitionLeader(1, 0)})
    assert TP not in client.leaders and client.last_seen_epochs[TP] == 6


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three brokers and the clients, without scheduled faults, a few seconds into the workload."""
    with started_cluster(5, SimConfig(), tmp_path, {"min.insync.replicas": "2", "segment.bytes": "2048"}) as cluster:
        for client in [*cluster.producers, *cluster.consumers]:
            client.start()
        cluster.sim.run_until(cluster.sim.now + 3000, cluster.after_step)
        yield cluster


def controller_leader(cluster: Cluster) -> PartitionLeader:
    assert cluster.controller is not None
    registration = cluster.controller.metadata.topics[TOPIC].partitions[TP.partition]
    return PartitionLeader(registration.leader, registration.leader_epoch)


def partition_on(broker: SimBroker) -> Partition:
    assert broker.replica_manager is not None
    return broker.replica_manager.partitions[TP]


def depose_leader_silently(cluster: Cluster) -> tuple[SimBroker, SimBroker]:
    """Seed 70147's situation: the leader of sim-0 is cut off from the controller, which fences it and elects
    another; it never hears, still leads the old epoch, and its log stops growing. Every client is then told
    the new leader by a broker that knows it, and the consumer reads past the deposed leader's log end.
    Returns (deposed, new leader)."""
    deposed = cluster.brokers[controller_leader(cluster).leader_id]
    voters = [v.name for v in cluster.controllers.values()]
    links = [(deposed.name, v) for v in voters] + [(v, deposed.name) for v in voters]
    cluster.network.cut_links(links)
    run_until(cluster, lambda: controller_leader(cluster).leader_id not in (deposed.broker_id, -1), 30_000)
    successor = cluster.brokers[controller_leader(cluster).leader_id]
    run_until(cluster, lambda: partition_on(successor).is_leader, 5000)
    for client in [*cluster.producers, *cluster.consumers]:
        successor.handle_metadata(client.update_leaders)
    consumer = cluster.consumers[0]
    run_until(cluster, lambda: consumer.positions[TP].offset > partition_on(deposed).log.log_end_offset, 30_000)
    assert (
        partition_on(deposed).is_leader and partition_on(deposed).leader_epoch < controller_leader(cluster).leader_epoch
    )
    return deposed, successor


def test_a_consumer_never_follows_a_deposed_leader_back_to_its_shorter_log(cluster: Cluster) -> None:
    consumer = cluster.consumers[0]
    epochs_sent: list[int] = []
    deposed, successor = depose_leader_silently(cluster)
    handle_fetch = successor.handle_fetch

    def recording_fetch(request: FetchRequestData, respond: Respond) -> None:
        if request.replica_id < 0 and request.partitions[0].topic_partition == TP:
            epochs_sent.append(request.partitions[0].current_leader_epoch)
        handle_fetch(request, respond)

    successor.handle_fetch = recording_fetch  # type: ignore[method-assign]
    new_leader = controller_leader(cluster)
    assert consumer.leaders[TP] == new_leader
    # The deposed leader's metadata names itself in the old epoch: the consumer keeps the leader it knows.
    deposed.handle_metadata(consumer.update_leaders)
    assert consumer.leaders[TP] == new_leader
    # Asked at the consumer's position and epoch, the deposed leader says it has not heard of that epoch,
    # where an epoch-less fetch hears OFFSET_OUT_OF_RANGE from its shorter log.
    position = consumer.positions[TP].offset
    answers: list[FetchReply] = []
    for epoch in (new_leader.leader_epoch, -1):
        request = FetchRequestData(
            -1, 0, 1, 1 << 20, [FetchRequestPartition(TP, NO_TOPIC_ID, position, epoch, -1, -1, 1)]
        )
        deposed.handle_fetch(request, answers.append)
    assert [reply.partitions[0].error for reply in answers] == ["UNKNOWN_LEADER_EPOCH", "OFFSET_OUT_OF_RANGE"]
    cluster.sim.run_until(cluster.sim.now + 5000, cluster.after_step)
    assert consumer.positions[TP].offset > position
    assert epochs_sent and set(epochs_sent) == {new_leader.leader_epoch}
    assert cluster.history.violations == []


def test_a_consumer_validates_its_position_with_the_new_leader(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    validations: list[tuple[int, int]] = []
    handle = SimBroker.handle_offsets_for_leader_epoch

    def recording(self: SimBroker, tp: TopicPartition, current: int, epoch: int, respond: Respond) -> None:
        validations.append((current, epoch))
        handle(self, tp, current, epoch, respond)

    monkeypatch.setattr(SimBroker, "handle_offsets_for_leader_epoch", recording)
    deposed, _ = depose_leader_silently(cluster)
    # The consumer had read records of the deposed leader's epoch: the new leader is asked where it ends.
    assert (controller_leader(cluster).leader_epoch, partition_on(deposed).leader_epoch) in validations
    assert cluster.history.violations == []


def test_a_new_leader_missing_records_the_consumer_read_is_reported(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validation can fail: a leader whose history ends the consumer's epoch before its position."""
    last_offset = Partition.last_offset_for_leader_epoch
    consumer = cluster.consumers[0]

    def short_of_the_consumer(self: Partition, current_leader_epoch: int, leader_epoch: int) -> tuple[int, int]:
        # One short of what the consumer read, not of the leader's own end: a new leader may hold records of the
        # epoch past the consumer's position (replicated, not yet below the HW), and then "one short of its end"
        # misses nothing the consumer read.
        epoch, end_offset = last_offset(self, current_leader_epoch, leader_epoch)
        return epoch, min(end_offset, consumer.positions[TP].offset) - 1

    monkeypatch.setattr(Partition, "last_offset_for_leader_epoch", short_of_the_consumer)
    depose_leader_silently(cluster)
    rules = {v.rule for v in cluster.history.violations}
    assert rules == {"consumer position beyond the log"}, cluster.history.violations
