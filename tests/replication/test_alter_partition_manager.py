"""The AlterPartition sender as a state machine: the ISR changes leaders propose go to the controller together,
every pending one in one request, one request at a time, and every answer, or the lack of one, goes back to the
partition."""

from __future__ import annotations

import uuid
from pathlib import Path

from replication_helpers import TP, Cluster

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.alter_partition_manager import (
    AlterPartitionAnswer,
    AlterPartitionManager,
    AlterPartitionRequest,
)
from tierlog.replication.partition import AlterPartitionProposal
from tierlog.replication.replica_manager import ReplicaManager

NOW = 1_700_000_000_000


class ProposingReplicaManager:
    """The two ReplicaManager calls the sender makes: proposals to take, answers to hand back."""

    def __init__(self, proposals: list[AlterPartitionProposal]) -> None:
        self.proposals = proposals
        self.answers: list[tuple[TopicPartition, PartitionRegistration | None, str | None]] = []

    def take_alter_partition_proposals(self) -> list[AlterPartitionProposal]:
        taken, self.proposals = self.proposals, []
        return taken

    def on_alter_partition_response(
        self, tp: TopicPartition, registration: PartitionRegistration | None, error: str | None, now_ms: int
    ) -> None:
        self.answers.append((tp, registration, error))


def proposal(partition: int) -> AlterPartitionProposal:
    return AlterPartitionProposal(TopicPartition("t", partition), uuid.UUID(int=1), 3, 5, [1, 2])


def sender(replica_manager: ProposingReplicaManager) -> AlterPartitionManager:
    return AlterPartitionManager(1, replica_manager)  # type: ignore[arg-type]


def proposal_of(partition: int, partition_epoch: int) -> AlterPartitionProposal:
    return AlterPartitionProposal(TopicPartition("t", partition), uuid.UUID(int=1), 3, partition_epoch, [1, 2])


def test_every_pending_isr_change_goes_in_one_request_and_one_request_at_a_time() -> None:
    replica_manager = ProposingReplicaManager([proposal(0), proposal(1)])
    manager = sender(replica_manager)
    assert manager.poll(10) == AlterPartitionRequest(1, 10, (proposal(0), proposal(1)))
    replica_manager.proposals = [proposal(2)]
    assert manager.poll(10) is None
    committed = PartitionRegistration([1, 2], [1, 2], 1, 3, 6)
    manager.on_response(
        {
            TopicPartition("t", 0): AlterPartitionAnswer(committed, None),
            TopicPartition("t", 1): AlterPartitionAnswer(None, "INVALID_UPDATE_VERSION"),
        },
        NOW,
    )
    assert replica_manager.answers == [
        (TopicPartition("t", 0), committed, None),
        (TopicPartition("t", 1), None, "INVALID_UPDATE_VERSION"),
    ]
    assert manager.poll(10) == AlterPartitionRequest(1, 10, (proposal(2),))


def test_a_partitions_newer_change_waits_for_the_answer_to_its_older_one() -> None:
    """New metadata may clear a partition's change while it is in flight and the partition propose another: a
    request holds one change per partition, so the answers come back in the order the changes were made."""
    replica_manager = ProposingReplicaManager([proposal_of(0, 5)])
    manager = sender(replica_manager)
    manager.poll(10)
    manager.on_request_failed("no answer", NOW)
    replica_manager.proposals = [proposal_of(0, 6), proposal_of(1, 5)]
    assert manager.poll(10) == AlterPartitionRequest(1, 10, (proposal_of(0, 5), proposal_of(1, 5)))
    manager.on_response(
        {
            TopicPartition("t", 0): AlterPartitionAnswer(None, "INVALID_UPDATE_VERSION"),
            TopicPartition("t", 1): AlterPartitionAnswer(None, "INVALID_UPDATE_VERSION"),
        },
        NOW,
    )
    assert manager.poll(10) == AlterPartitionRequest(1, 10, (proposal_of(0, 6),))


def test_a_request_without_an_answer_is_sent_again_before_anything_else() -> None:
    """Its outcome is unknown (the controller may have committed it): the partitions hear nothing and keep the
    changes in flight, and the same proposals go again, with the broker's current epoch, ahead of newer ones."""
    replica_manager = ProposingReplicaManager([proposal(0), proposal(1)])
    manager = sender(replica_manager)
    manager.poll(10)
    replica_manager.proposals = [proposal(2)]
    manager.on_request_failed("no answer", NOW)
    assert replica_manager.answers == []
    assert manager.poll(11) == AlterPartitionRequest(1, 11, (proposal(0), proposal(1), proposal(2)))


def test_a_partition_the_response_left_out_is_sent_again() -> None:
    """As Kafka's AlterPartitionManager: its outcome is unknown, so its partition hears nothing yet."""
    replica_manager = ProposingReplicaManager([proposal(0), proposal(1)])
    manager = sender(replica_manager)
    manager.poll(10)
    committed = PartitionRegistration([1, 2], [1, 2], 1, 3, 6)
    manager.on_response({TopicPartition("t", 1): AlterPartitionAnswer(committed, None)}, NOW)
    assert replica_manager.answers == [(TopicPartition("t", 1), committed, None)]
    assert manager.poll(10) == AlterPartitionRequest(1, 10, (proposal(0),))


def test_a_follower_that_caught_up_joins_the_isr_through_the_sender(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    leader: ReplicaManager = cluster.managers[1]
    manager = AlterPartitionManager(1, leader)
    request = manager.poll(0)
    assert request is not None and [p.new_isr for p in request.proposals] == [[1, 2]]
    r = cluster.registration
    cluster.registration = PartitionRegistration(r.replicas, [1, 2], 1, r.leader_epoch, r.partition_epoch + 1)
    manager.on_response({TP: AlterPartitionAnswer(cluster.registration, None)}, cluster.now)
    assert leader.get_partition(TP).isr == [1, 2]
    assert leader.isr_expands == 1
