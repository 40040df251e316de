"""Leader election when brokers are fenced and unfenced: the ISR first, in assignment order; outside the ISR
only with unclean.leader.election.enable; otherwise offline (leader -1) with the last ISR member on record."""

from __future__ import annotations

from pathlib import Path

from controller_helpers import fence, heartbeat, new_controller, offline_after_fencing_both, state


def test_the_first_live_isr_member_in_assignment_order_takes_over(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    topic = controller.create_topic("events", 1, 3, {})
    broker_epoch = controller.metadata.brokers[1].broker_epoch
    # The ISR in another order than the replicas [1, 2, 3]: the election must follow the replicas.
    controller.alter_partition(1, broker_epoch, topic.topic_id, 0, 0, 0, [1, 3])
    controller.alter_partition(1, broker_epoch, topic.topic_id, 0, 0, 1, [1, 3, 2])
    fence(controller, 1)
    assert state(controller) == (2, [3, 2], 1, 3)


def test_a_replica_outside_the_isr_is_passed_over(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    topic = controller.create_topic("events", 1, 3, {})
    broker_epoch = controller.metadata.brokers[1].broker_epoch
    controller.alter_partition(1, broker_epoch, topic.topic_id, 0, 0, 0, [1, 3])
    fence(controller, 1)
    assert state(controller) == (3, [3], 1, 2)


def test_fencing_a_follower_shrinks_the_isr_without_a_new_leader_epoch(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 1, 3, {})
    controller.create_topic("elsewhere", 1, 1, {})
    fence(controller, 2)
    assert state(controller, "events") == (1, [1, 3], 0, 1)
    assert state(controller, "elsewhere") == (1, [1], 0, 0)


def test_the_last_isr_member_fenced_leaves_the_partition_offline_with_its_isr(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller)
    assert state(controller) == (-1, [1], 1, 2)


def test_unfencing_the_last_isr_member_elects_it_again(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller)
    heartbeat(controller, 1, 0)
    assert state(controller) == (1, [1], 2, 3)


def test_unclean_election_by_the_controller_default(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2), unclean_leader_election_enable=True)
    offline_after_fencing_both(controller)
    assert state(controller) == (2, [2], 1, 2)


def test_unclean_election_by_topic_override(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller, {"unclean.leader.election.enable": "true"})
    assert state(controller) == (2, [2], 1, 2)


def test_a_topic_override_can_refuse_unclean_election(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2), unclean_leader_election_enable=True)
    offline_after_fencing_both(controller, {"unclean.leader.election.enable": "false"})
    assert state(controller) == (-1, [1], 1, 2)


def test_an_unclean_replica_unfenced_later_is_elected_only_when_enabled(tmp_path: Path) -> None:
    for unclean, expected in ((False, (-1, [2], 2, 2)), (True, (1, [1], 3, 3))):
        directory = tmp_path / str(unclean)
        controller = new_controller(directory, nodes=(1, 2), unclean_leader_election_enable=unclean)
        controller.create_topic("events", 1, 2, {})
        fence(controller, 1)
        fence(controller, 2)
        assert state(controller) == (-1, [2], 2, 2)
        heartbeat(controller, 1, 0)
        assert state(controller) == expected


def test_enabling_unclean_election_on_an_offline_topic_elects_at_once(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller)
    controller.alter_topic_configs("events", {"unclean.leader.election.enable": "true"})
    assert state(controller) == (2, [2], 2, 3)


def test_unclean_election_by_the_cluster_wide_dynamic_default_elects_at_once(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller)
    controller.alter_broker_configs("", {"unclean.leader.election.enable": "true"})
    assert state(controller) == (2, [2], 2, 3)
    assert controller.metadata.broker_configs == {"": {"unclean.leader.election.enable": "true"}}


def test_a_per_broker_dynamic_config_is_kept_under_its_broker_and_removed_by_its_absence(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    controller.alter_broker_configs("2", {"log.retention.ms": "1000", "message.max.bytes": "2000"})
    controller.alter_broker_configs("2", {"log.retention.ms": "1000"})
    assert controller.metadata.dynamic_broker_configs(2) == ({}, {"log.retention.ms": "1000"})
    controller.alter_broker_configs("2", {})
    assert controller.metadata.broker_configs == {}
