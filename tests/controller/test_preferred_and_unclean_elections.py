"""ElectLeaders (KIP-460) and the controller's leader balancing (auto.leader.rebalance.enable), decided as Kafka's
ReplicationControlManager decides them: a preferred election hands a partition back to its first replica when
that one is in the ISR and live; an unclean one gives a leaderless partition any live replica; balancing passes
run a check interval after a change leaves a partition off its preferred replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from controller_helpers import fence, heartbeat, new_controller, offline_after_fencing_both, restart, state

from tierlog.controller import controller as controller_module
from tierlog.controller.controller import (
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    Controller,
    PartitionElectionResult,
)
from tierlog.controller.errors import InvalidRequestError
from tierlog.metadata.records import PartitionRecord

INTERVAL_MS = 300_000
NOT_NEEDED = PartitionElectionResult(0, "ELECTION_NOT_NEEDED", "Leader election not needed for topic partition.")


def rejoin(controller: Controller, node: int, now_ms: int = 0) -> None:
    """`node` unfenced again and, as its leader would propose once it caught up, back in events-0's ISR."""
    heartbeat(controller, node, now_ms)
    topic = controller.topic("events")
    assert topic is not None
    current = topic.partitions[0]
    leader = controller.metadata.brokers[current.leader]
    controller.alter_partition(
        current.leader,
        leader.broker_epoch,
        topic.topic_id,
        0,
        current.leader_epoch,
        current.partition_epoch,
        [*current.isr, node],
    )


def led_by_2_after_a_restart_of_1(tmp_path: Path, **config: Any) -> Controller:
    """events-0 on [1, 2, 3]: broker 1 is fenced (2 takes over in epoch 1) and comes back into the ISR."""
    controller = new_controller(tmp_path, nodes=(1, 2, 3), **config)
    controller.create_topic("events", 1, 3, {})
    fence(controller, 1)
    rejoin(controller, 1)
    assert state(controller) == (2, [2, 3, 1], 1, 2)
    return controller


def test_a_preferred_election_gives_the_partition_back_to_its_first_replica_with_a_new_epoch(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    before = controller.metadata.offset
    results = controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]})
    assert results == {"events": [PartitionElectionResult(0)]}
    assert state(controller) == (1, [2, 3, 1], 2, 3)
    topic_id = controller.metadata.topics["events"].topic_id
    assert [r for _, r in controller.metadata_log.records_from(before + 1)] == [
        PartitionRecord(topic_id, 0, (1, 2, 3), (2, 3, 1), 1, 2, 3)
    ]


def test_a_second_preferred_election_is_not_needed_and_changes_nothing(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]})
    offset = controller.metadata.offset
    assert controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]}) == {"events": [NOT_NEEDED]}
    assert controller.metadata.offset == offset


def test_a_preferred_replica_outside_the_isr_is_not_available(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 1, 3, {})
    fence(controller, 1)
    heartbeat(controller, 1, 0)  # unfenced, but not caught up: still outside the ISR
    assert controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]}) == {
        "events": [
            PartitionElectionResult(0, "PREFERRED_LEADER_NOT_AVAILABLE", "The preferred leader was not available.")
        ]
    }
    assert state(controller) == (2, [2, 3], 1, 1)


def test_a_fenced_preferred_replica_is_not_available_even_in_the_isr(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1,))
    controller.create_topic("events", 1, 1, {})
    fence(controller, 1)
    assert state(controller) == (-1, [1], 1, 1)
    [result] = controller.elect_leaders(PREFERRED_ELECTION, {"events": [0]})["events"]
    assert result.error == "PREFERRED_LEADER_NOT_AVAILABLE"


def test_unknown_topics_and_partitions_are_named_per_partition(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    results = controller.elect_leaders(PREFERRED_ELECTION, {"nope": [0], "events": [7, 0]})
    assert results == {
        "nope": [PartitionElectionResult(0, "UNKNOWN_TOPIC_OR_PARTITION", "No such topic as nope")],
        "events": [
            PartitionElectionResult(7, "UNKNOWN_TOPIC_OR_PARTITION", "No such partition as events-7"),
            PartitionElectionResult(0),
        ],
    }
    assert state(controller)[0] == 1


def test_every_partition_when_none_are_named_and_only_elections_are_reported(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 3, 3, {})
    controller.create_topic("quiet", 1, 1, {})
    fence(controller, 1)
    heartbeat(controller, 1, 0)
    topic = controller.topic("events")
    assert topic is not None
    # Partition 0 (preferred 1) was led by 1: give 1 back its ISR place there only.
    current = topic.partitions[0]
    epoch = controller.metadata.brokers[current.leader].broker_epoch
    controller.alter_partition(
        current.leader, epoch, topic.topic_id, 0, current.leader_epoch, current.partition_epoch, [*current.isr, 1]
    )
    results = controller.elect_leaders(PREFERRED_ELECTION, None)
    # events-1 and -2 never left their preferred replicas (2 and 3), nor did quiet-0: left out, as Kafka does.
    assert results == {"events": [PartitionElectionResult(0)], "quiet": []}
    assert [p.leader for p in topic.partitions] == [1, 2, 3]


def test_an_empty_request_elects_nothing(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    assert controller.elect_leaders(PREFERRED_ELECTION, {}) == {}
    assert state(controller)[0] == 2


def test_an_unclean_election_brings_an_offline_partition_back_whatever_the_topic_says(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    offline_after_fencing_both(controller, {"unclean.leader.election.enable": "false"})
    assert state(controller) == (-1, [1], 1, 2)
    assert controller.elect_leaders(UNCLEAN_ELECTION, {"events": [0]}) == {"events": [PartitionElectionResult(0)]}
    assert state(controller) == (2, [2], 2, 3)


def test_an_unclean_election_of_a_led_partition_is_not_needed(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    assert controller.elect_leaders(UNCLEAN_ELECTION, {"events": [0]}) == {"events": [NOT_NEEDED]}
    assert state(controller)[0] == 2


def test_an_unclean_election_without_a_live_replica_has_no_eligible_leader(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1,))
    controller.create_topic("events", 1, 1, {})
    fence(controller, 1)
    assert controller.elect_leaders(UNCLEAN_ELECTION, {"events": [0]}) == {
        "events": [
            PartitionElectionResult(
                0, "ELIGIBLE_LEADERS_NOT_AVAILABLE", "Eligible topic partition leaders are not available."
            )
        ]
    }


def test_an_unknown_election_type_is_an_invalid_request(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path)
    with pytest.raises(InvalidRequestError, match="Unknown election type 2"):
        controller.elect_leaders(2, {"events": [0]})


# Leader balancing (auto.leader.rebalance.enable)


def test_a_balancing_pass_is_due_a_check_interval_after_the_change_that_left_leaders_imbalanced(
    tmp_path: Path,
) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3), leader_imbalance_check_interval_ms=INTERVAL_MS)
    controller.create_topic("events", 1, 3, {})
    assert controller.next_leader_balance_ms() is None
    fence(controller, 1, now_ms=1000)
    assert controller.next_leader_balance_ms() == 1000 + INTERVAL_MS
    # Later changes leave the pass where it is.
    rejoin(controller, 1, now_ms=5000)
    assert controller.next_leader_balance_ms() == 1000 + INTERVAL_MS
    assert controller.balance_partition_leaders(1000 + INTERVAL_MS) == 1
    assert state(controller) == (1, [2, 3, 1], 2, 3)
    assert controller.next_leader_balance_ms() is None


def test_a_pass_that_cannot_move_a_leader_yet_is_due_again_an_interval_later(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3), leader_imbalance_check_interval_ms=INTERVAL_MS)
    controller.create_topic("events", 1, 3, {})
    fence(controller, 1)
    heartbeat(controller, 1, 0)  # back, but not in the ISR yet
    assert controller.balance_partition_leaders(INTERVAL_MS) == 0
    assert state(controller)[0] == 2
    assert controller.next_leader_balance_ms() == 2 * INTERVAL_MS


def test_auto_leader_rebalance_disabled_never_schedules_a_pass(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path, leader_imbalance_check_interval_ms=None)
    assert controller.next_leader_balance_ms() is None


def test_a_restarted_controller_finds_the_imbalance_its_predecessor_left(tmp_path: Path) -> None:
    controller = led_by_2_after_a_restart_of_1(tmp_path, leader_imbalance_check_interval_ms=INTERVAL_MS)
    controller = restart(controller, tmp_path, now_ms=50_000, leader_imbalance_check_interval_ms=INTERVAL_MS)
    assert controller.next_leader_balance_ms() == 50_000 + INTERVAL_MS


def test_a_pass_moves_at_most_its_cap_and_the_next_one_follows_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_module, "MAX_ELECTIONS_PER_IMBALANCE", 2)
    controller = new_controller(tmp_path, nodes=(1, 2), leader_imbalance_check_interval_ms=INTERVAL_MS)
    # Preferred leaders 1, 2, 1, 2, 1, 2: fencing 1 moves three leaderships to 2 and drops 1 from every ISR.
    topic = controller.create_topic("many", 6, 2, {})
    fence(controller, 1)
    heartbeat(controller, 1, 0)
    epoch = controller.metadata.brokers[2].broker_epoch
    for index, p in enumerate(topic.partitions):
        controller.alter_partition(2, epoch, topic.topic_id, index, p.leader_epoch, p.partition_epoch, [2, 1])
    assert [p.leader for p in topic.partitions] == [2] * 6
    assert controller.balance_partition_leaders(INTERVAL_MS) == 2
    assert controller.next_leader_balance_ms() == INTERVAL_MS + 10
    assert controller.balance_partition_leaders(INTERVAL_MS + 10) == 1
    assert [p.leader for p in topic.partitions] == [1, 2] * 3
    assert controller.next_leader_balance_ms() is None


def test_a_pass_that_hit_its_cap_and_left_leaders_balanced_does_not_hurry_a_later_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_module, "MAX_ELECTIONS_PER_IMBALANCE", 1)
    controller = led_by_2_after_a_restart_of_1(tmp_path, leader_imbalance_check_interval_ms=INTERVAL_MS)
    assert controller.balance_partition_leaders(INTERVAL_MS) == 1
    assert controller.next_leader_balance_ms() is None
    # A later imbalance gets the whole check interval, not the hurried follow-up of a capped pass.
    fence(controller, 1, now_ms=2 * INTERVAL_MS)
    assert controller.next_leader_balance_ms() == 3 * INTERVAL_MS
