"""Partition reassignment (KIP-455) and broker decommissioning (KIP-500) in the controller, by Kafka's KRaft rules
(docs/reassignment.md): a reassignment starts with the target and the replicas to remove side by side, completes
as soon as the ISR holds every target replica, can be cancelled or replaced, and is metadata-log records only,
so a rebuilt controller carries it on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from controller_helpers import (
    endpoints,
    fence,
    heartbeat,
    incarnation,
    new_controller,
    partition,
    restart,
)

from tierlog.common import TopicPartition
from tierlog.controller.controller import PREFERRED_ELECTION, UNCLEAN_ELECTION, Controller, ControllerConfig
from tierlog.controller.errors import (
    BrokerIdNotRegisteredError,
    ControllerError,
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicError,
)
from tierlog.controller.metadata_log import MetadataSnapshot
from tierlog.metadata.image import ClusterMetadata, PartitionRegistration
from tierlog.metadata.records import PartitionRecord, UnregisterBrokerRecord

TP = TopicPartition("events", 0)


def setup(tmp_path: Path, replicas: Sequence[int] = (1, 2, 3), nodes: tuple[int, ...] = (1, 2, 3, 4, 5)) -> Controller:
    controller = new_controller(tmp_path, nodes=nodes)
    controller.create_topic("events", 1, len(replicas), {}, assignments=[list(replicas)])
    return controller


def reassign(controller: Controller, target: Sequence[int] | None, tp: TopicPartition = TP) -> None:
    assert controller.alter_partition_reassignments({tp: target}) == {tp: None}


def alter_isr(controller: Controller, new_isr: Sequence[int]) -> PartitionRegistration:
    """The leader's AlterPartition against the registration it has."""
    current = partition(controller)
    broker = controller.metadata.brokers[current.leader]
    topic = controller.topic("events")
    assert topic is not None
    return controller.alter_partition(
        current.leader,
        broker.broker_epoch,
        topic.topic_id,
        0,
        current.leader_epoch,
        current.partition_epoch,
        new_isr,
    )


def assignment(controller: Controller) -> tuple[list[int], list[int], list[int], list[int], int]:
    """(replicas, adding, removing, ISR, leader)."""
    p = partition(controller)
    return p.replicas, p.adding_replicas, p.removing_replicas, p.isr, p.leader


def test_a_reassignment_starts_with_the_target_then_the_replicas_to_remove(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    before = partition(controller)
    reassign(controller, [2, 3, 4])
    assert assignment(controller) == ([2, 3, 4, 1], [4], [1], [1, 2, 3], 1)
    after = partition(controller)
    # No replica left the assignment yet: the leader keeps its epoch; the partition epoch bumps.
    assert (after.leader_epoch, after.partition_epoch) == (before.leader_epoch, before.partition_epoch + 1)
    assert controller.list_partition_reassignments(None) == {TP: after}
    assert controller.list_partition_reassignments([TP, TopicPartition("events", 7), TopicPartition("x", 0)]) == {
        TP: after
    }


def test_the_isr_taking_in_every_target_completes_it_and_moves_the_leader_off_a_removed_replica(
    tmp_path: Path,
) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    epoch = partition(controller).leader_epoch
    answered = alter_isr(controller, [1, 2, 3, 4])
    # The first target replica in the ISR leads: the leader that asked learns it lost the leadership.
    assert assignment(controller) == ([2, 3, 4], [], [], [2, 3, 4], 2)
    assert answered.leader == 2
    assert partition(controller).leader_epoch == epoch + 1
    assert controller.list_partition_reassignments(None) == {}


def test_a_leader_among_the_targets_keeps_leading_with_a_new_epoch_when_a_replica_leaves(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [1, 2, 4])
    epoch = partition(controller).leader_epoch
    alter_isr(controller, [1, 2, 3, 4])
    assert assignment(controller) == ([1, 2, 4], [], [], [1, 2, 4], 1)
    # The removed replica must stop following: the leader epoch bumps although the leader stays.
    assert partition(controller).leader_epoch == epoch + 1


def test_an_isr_short_of_a_target_leaves_it_in_progress(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 4, 5])
    alter_isr(controller, [1, 2, 3, 4])
    assert assignment(controller) == ([2, 4, 5, 1, 3], [4, 5], [1, 3], [1, 2, 3, 4], 1)


def test_a_target_the_isr_already_holds_completes_at_once(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    end = controller.metadata_log.end_offset
    reassign(controller, [3, 2])
    assert assignment(controller) == ([3, 2], [], [], [2, 3], 3)
    # One record: the reassignment started and completed in the same change.
    assert len(controller.metadata_log.records_from(end)) == 1
    assert controller.list_partition_reassignments(None) == {}


def test_reordering_the_replicas_changes_the_preferred_leader_only(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    epoch = partition(controller).leader_epoch
    reassign(controller, [3, 1, 2])
    assert assignment(controller) == ([3, 1, 2], [], [], [1, 2, 3], 1)
    assert partition(controller).leader_epoch == epoch
    assert controller.partition_leaders_imbalanced()


def test_the_same_replicas_again_change_nothing(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    end = controller.metadata_log.end_offset
    reassign(controller, [1, 2, 3])
    assert controller.metadata_log.end_offset == end


def test_cancelling_reverts_to_the_replicas_before_it_without_those_being_added(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    alter_isr(controller, [1, 2, 3])  # no change: 4 not caught up
    reassign(controller, None)
    # PartitionReassignmentRevert: the replicas without the adding ones, in the order they are listed.
    assert assignment(controller) == ([2, 3, 1], [], [], [1, 2, 3], 1)
    assert controller.list_partition_reassignments(None) == {}


def test_cancelling_takes_an_added_replica_out_of_the_isr(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 4, 5])
    alter_isr(controller, [1, 2, 3, 4])
    reassign(controller, None)
    assert assignment(controller) == ([2, 1, 3], [], [], [1, 2, 3], 1)
    assert partition(controller).leader_epoch == 1, "replicas 4 and 5 left the assignment"


def _isr_of_added_replicas_only(tmp_path: Path) -> Controller:
    """events-0 moving from [1, 2] to [3, 4], with only 3 (an added replica) left in the ISR."""
    controller = setup(tmp_path, replicas=(1, 2))
    reassign(controller, [3, 4])
    alter_isr(controller, [1, 2, 3])
    fence(controller, 1)
    fence(controller, 2)
    assert assignment(controller) == ([3, 4, 1, 2], [3, 4], [1, 2], [3], 3)
    heartbeat(controller, 1, 0)  # back, but out of the ISR
    return controller


def test_cancelling_refuses_a_revert_that_needs_an_unclean_election(tmp_path: Path) -> None:
    controller = _isr_of_added_replicas_only(tmp_path)
    results = controller.alter_partition_reassignments({TP: None})
    assert isinstance(results[TP], InvalidReplicaAssignmentError)
    assert "unclean leader election" in str(results[TP])
    assert assignment(controller)[1:3] == ([3, 4], [1, 2])


def test_cancelling_with_unclean_election_enabled_makes_the_first_original_replica_the_isr(tmp_path: Path) -> None:
    controller = _isr_of_added_replicas_only(tmp_path)
    controller.alter_topic_configs("events", {"unclean.leader.election.enable": "true"})
    reassign(controller, None)
    assert assignment(controller) == ([1, 2], [], [], [1], 1)


def test_a_new_target_replaces_the_reassignment_in_progress(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    # Computed against every replica listed now, so 4, added by the first, is removed by the second.
    reassign(controller, [3, 5, 1])
    assert assignment(controller) == ([3, 5, 1, 2, 4], [5], [2, 4], [1, 2, 3], 1)
    alter_isr(controller, [1, 2, 3, 5])
    assert assignment(controller) == ([3, 5, 1], [], [], [1, 3, 5], 1)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([], "empty replica list"),
        ([2, 3, 2], "includes the broker 2 more than once"),
        ([2, 9], "includes broker 9, but no such broker is registered"),
    ],
)
def test_an_invalid_target_is_refused_with_invalid_replica_assignment(
    tmp_path: Path, target: list[int], message: str
) -> None:
    controller = setup(tmp_path)
    end = controller.metadata_log.end_offset
    results = controller.alter_partition_reassignments({TP: target})
    assert isinstance(results[TP], InvalidReplicaAssignmentError)
    assert message in str(results[TP])
    assert controller.metadata_log.end_offset == end


def test_a_fenced_broker_may_be_a_target(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    fence(controller, 4)
    reassign(controller, [1, 2, 4])
    assert assignment(controller)[:3] == ([1, 2, 4, 3], [4], [3])


def test_each_partition_gets_its_own_answer_and_the_accepted_ones_commit(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    unknown_topic, unknown_partition = TopicPartition("nope", 0), TopicPartition("events", 1)
    results = controller.alter_partition_reassignments({TP: [2, 3, 4], unknown_topic: [1], unknown_partition: [1]})
    assert results[TP] is None
    assert isinstance(results[unknown_topic], UnknownTopicError)
    assert isinstance(results[unknown_partition], UnknownTopicError)
    assert all(e is None or e.error_name == "UNKNOWN_TOPIC_OR_PARTITION" for e in results.values())
    assert assignment(controller)[:3] == ([2, 3, 4, 1], [4], [1])


def test_cancelling_where_nothing_is_in_progress_is_no_reassignment_in_progress(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    results = controller.alter_partition_reassignments({TP: None})
    error = results[TP]
    assert isinstance(error, NoReassignmentInProgressError)
    assert isinstance(error, ControllerError) and error.error_name == "NO_REASSIGNMENT_IN_PROGRESS"


# Elections during a reassignment (docs/reassignment.md#elections)


def test_a_fenced_leader_is_replaced_by_a_target_replica_before_a_removed_one(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [4, 3, 2])
    fence(controller, 1)
    assert assignment(controller) == ([4, 3, 2, 1], [4], [1], [2, 3], 3)


def test_a_replica_being_removed_may_lead_while_no_target_is_in_the_isr(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [4, 5])
    fence(controller, 1)
    assert assignment(controller) == ([4, 5, 1, 2, 3], [4, 5], [1, 2, 3], [2, 3], 2)


def test_the_preferred_leader_is_the_first_target_replica(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [4, 5])
    results = controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]})
    assert results["events"][0].error == "PREFERRED_LEADER_NOT_AVAILABLE"
    assert controller.balance_partition_leaders(0) == 0
    reassign(controller, [2, 1, 3])
    assert assignment(controller) == ([2, 1, 3], [], [], [1, 2, 3], 1)
    assert controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]})["events"][0].error is None
    assert assignment(controller)[4] == 2


def test_an_unclean_election_takes_the_first_live_target_replica(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [4, 5])
    for node in (1, 2, 3):
        fence(controller, node)
    assert assignment(controller) == ([4, 5, 1, 2, 3], [4, 5], [1, 2, 3], [3], -1)
    assert controller.elect_leaders(UNCLEAN_ELECTION, {"events": [0]})["events"][0].error is None
    # Still in progress: 5 is not in the ISR yet.
    assert assignment(controller) == ([4, 5, 1, 2, 3], [4, 5], [1, 2, 3], [4], 4)


def test_a_removed_replica_leaving_the_isr_does_not_complete_a_reassignment_short_of_a_target(
    tmp_path: Path,
) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    fence(controller, 1)
    assert assignment(controller) == ([2, 3, 4, 1], [4], [1], [2, 3], 2)
    alter_isr(controller, [2, 3, 4])
    assert assignment(controller) == ([2, 3, 4], [], [], [2, 3, 4], 2)


# Failover: a reassignment is records of the metadata log


def test_a_restarted_controller_carries_on_the_reassignment(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    in_progress = partition(controller)
    controller = restart(controller, tmp_path)
    assert controller.list_partition_reassignments(None) == {TP: in_progress}
    for node in (1, 2, 3, 4):
        heartbeat(controller, node, 0)
    alter_isr(controller, [1, 2, 3, 4])
    assert assignment(controller) == ([2, 3, 4], [], [], [2, 3, 4], 2)


def test_a_controller_built_from_a_snapshot_carries_on_the_reassignment(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    image = controller.metadata
    assert ClusterMetadata.from_snapshot(image.snapshot_records(), image.offset + 1) == image
    records = image.snapshot_records()
    topic = controller.topic("events")
    assert topic is not None
    assert PartitionRecord(topic.topic_id, 0, (2, 3, 4, 1), (1, 2, 3), 1, 0, 1, (4,), (1,)) in records

    class _FromSnapshot(type(controller.metadata_log)):  # type: ignore[misc]
        def latest_snapshot(self) -> MetadataSnapshot:
            return MetadataSnapshot(records, image.offset + 1)

    controller.metadata_log.close()
    rebuilt = Controller(_FromSnapshot(tmp_path), ControllerConfig(), 0)
    assert rebuilt.list_partition_reassignments([TP]) == {TP: partition(controller)}
    for node in (1, 2, 3, 4):
        heartbeat(rebuilt, node, 0)
    alter_isr(rebuilt, [1, 2, 3, 4])
    assert assignment(rebuilt) == ([2, 3, 4], [], [], [2, 3, 4], 2)


# UnregisterBroker (docs/reassignment.md#unregister)


def test_unregistering_a_broker_takes_it_out_of_isrs_and_leaderships_but_not_out_of_replicas(
    tmp_path: Path,
) -> None:
    controller = setup(tmp_path, replicas=(3, 1, 2))
    broker_epoch = controller.metadata.brokers[3].broker_epoch
    end = controller.metadata_log.end_offset
    controller.unregister_broker(3)
    assert 3 not in controller.metadata.brokers
    assert assignment(controller) == ([3, 1, 2], [], [], [1, 2], 1)
    assert [record for _, record in controller.metadata_log.records_from(end)][-1] == UnregisterBrokerRecord(
        3, broker_epoch
    )
    # The image, its snapshot and a restarted controller all agree it is gone.
    image = controller.metadata
    assert ClusterMetadata.from_snapshot(image.snapshot_records(), image.offset + 1) == image
    controller = restart(controller, tmp_path)
    assert 3 not in controller.metadata.brokers
    # A reassignment cannot name it any more.
    results = controller.alter_partition_reassignments({TP: [1, 2, 3]})
    assert isinstance(results[TP], InvalidReplicaAssignmentError)


def test_unregistering_an_unknown_broker_is_broker_id_not_registered(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    with pytest.raises(BrokerIdNotRegisteredError, match="Broker ID 9 is not currently registered"):
        controller.unregister_broker(9)
    controller.unregister_broker(5)
    with pytest.raises(BrokerIdNotRegisteredError):
        controller.unregister_broker(5)


def test_a_broker_still_running_when_unregistered_registers_again(tmp_path: Path) -> None:
    controller = setup(tmp_path)
    old_epoch = controller.metadata.brokers[4].broker_epoch
    controller.unregister_broker(4)
    # Its next heartbeat is refused, which makes a tierlog broker register again (tierlog/metadata/lifecycle.py).
    with pytest.raises(BrokerIdNotRegisteredError):
        controller.heartbeat(4, old_epoch, controller.metadata.offset, False, False, 0)
    new_epoch = controller.register_broker(4, incarnation(4), "", endpoints(4), None, 0)
    assert new_epoch > old_epoch
    assert controller.metadata.brokers[4].fenced
    heartbeat(controller, 4, 0)
    assert not controller.metadata.brokers[4].fenced


def test_unregistering_the_last_isr_member_leaves_it_there(tmp_path: Path) -> None:
    controller = setup(tmp_path, replicas=(4,))
    controller.unregister_broker(4)
    assert assignment(controller) == ([4], [], [], [4], -1)


def test_a_new_target_removing_nothing_ends_with_exactly_its_replicas(tmp_path: Path) -> None:
    """docs/reassignment.md#replace: unlike Kafka, which would keep removing 1 here, the lists are always those of
    the new target."""
    controller = setup(tmp_path)
    reassign(controller, [2, 3, 4])
    reassign(controller, [2, 3, 4, 1, 5])
    assert assignment(controller) == ([2, 3, 4, 1, 5], [5], [], [1, 2, 3], 1)
    alter_isr(controller, [1, 2, 3, 4, 5])
    assert assignment(controller) == ([2, 3, 4, 1, 5], [], [], [1, 2, 3, 4, 5], 1)
