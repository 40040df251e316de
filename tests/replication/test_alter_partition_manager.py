"""The AlterPartition sender as a state machine: the ISR changes leaders propose go to the controller one request
at a time, and every answer, or the lack of one, goes back to the partition."""

from __future__ import annotations

import uuid
from pathlib import Path

from replication_helpers import TP, Cluster

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.alter_partition_manager import AlterPartitionManager, AlterPartitionRequest
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


def test_isr_changes_go_to_the_controller_one_request_at_a_time() -> None:
    replica_manager = ProposingReplicaManager([proposal(0), proposal(1)])
    manager = sender(replica_manager)
    assert manager.poll(10) == AlterPartitionRequest(1, 10, proposal(0))
    assert manager.poll(10) is None
    committed = PartitionRegistration([1, 2], [1, 2], 1, 3, 6)
    manager.on_response(committed, None, NOW)
    assert replica_manager.answers == [(TopicPartition("t", 0), committed, None)]
    assert manager.poll(10) == AlterPartitionRequest(1, 10, proposal(1))


def test_a_request_without_an_answer_is_sent_again_before_anything_else() -> None:
    """Its outcome is unknown (the controller may have committed it): the partition hears nothing and keeps the
    change in flight, and the same proposal goes again, with the broker's current epoch."""
    replica_manager = ProposingReplicaManager([proposal(0), proposal(1)])
    manager = sender(replica_manager)
    manager.poll(10)
    manager.on_request_failed("no answer", NOW)
    assert replica_manager.answers == []
    assert manager.poll(11) == AlterPartitionRequest(1, 11, proposal(0))


def test_a_follower_that_caught_up_joins_the_isr_through_the_sender(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1])
    cluster.publish()
    cluster.produce(1, b"a", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    leader: ReplicaManager = cluster.managers[1]
    manager = AlterPartitionManager(1, leader)
    request = manager.poll(0)
    assert request is not None and request.proposal.new_isr == [1, 2]
    r = cluster.registration
    cluster.registration = PartitionRegistration(r.replicas, [1, 2], 1, r.leader_epoch, r.partition_epoch + 1)
    manager.on_response(cluster.registration, None, cluster.now)
    assert leader.get_partition(TP).isr == [1, 2]
    assert leader.isr_expands == 1
