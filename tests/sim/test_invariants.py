"""The invariant checks themselves: each one reports the breach it exists for (a check that cannot fail proves
nothing), on hand-made histories and real logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.sim.invariants import ClusterChecker, History
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig

TP = TopicPartition("sim", 0)


@dataclass
class Replica:
    """What the checks read of a Partition."""

    topic_partition: TopicPartition
    log: Log
    local_broker_id: int
    is_leader: bool = False
    leader_epoch: int = 0


def rules(history: History) -> list[str]:
    return [v.rule for v in history.violations]


def replica_with(tmp_path: Path, broker_id: int, values: list[str], epoch: int = 0) -> Replica:
    log = Log.open(
        tmp_path / f"broker-{broker_id}" / str(TP),
        LogConfig.from_props({}, {}),
        topic_partition=TP,
        recovery_point=0,
        log_start_offset=0,
        high_watermark=0,
        had_clean_shutdown=True,
        now_ms=0,
    )
    for value in values:
        log.append_as_leader(bytearray(build_batch([(None, value.encode(), [], 0)])), epoch, 0)
    log.update_high_watermark(log.log_end_offset)
    return Replica(TP, log, broker_id)


def test_a_clean_history_has_no_violation() -> None:
    history = History()
    history.acknowledged(TP, 0, "a", 0)
    history.read("c", TP, 0, "a", high_watermark=1, expected=0)
    history.read("c", TP, 1, "b", high_watermark=2, expected=1)
    assert history.violations == []


def test_a_consumer_skipping_an_offset_is_a_poll_skip() -> None:
    history = History()
    history.read("c", TP, 2, "x", high_watermark=5, expected=1)
    assert rules(history) == ["poll skip"]


def test_a_record_read_at_or_above_the_hw_is_reported() -> None:
    history = History()
    history.read("c", TP, 3, "x", high_watermark=3, expected=3)
    assert rules(history) == ["read above the HW"]


def test_two_values_read_at_one_offset_are_inconsistent_reads() -> None:
    history = History()
    history.read("c1", TP, 0, "x", high_watermark=1, expected=0)
    history.read("c2", TP, 0, "y", high_watermark=1, expected=0)
    assert rules(history) == ["inconsistent reads"]


def test_two_acknowledgements_for_one_offset_mean_a_lost_write() -> None:
    history = History()
    history.acknowledged(TP, 4, "x", 0)
    history.acknowledged(TP, 4, "y", 0)
    assert rules(history) == ["acknowledged write lost"]


def test_replicas_holding_different_batches_below_the_hw_are_reported(tmp_path: Path) -> None:
    checker = ClusterChecker(History())
    checker.check_committed(1, 1, replica_with(tmp_path, 1, ["a", "b"]))  # type: ignore[arg-type]
    checker.check_committed(2, 1, replica_with(tmp_path, 2, ["a", "B"]))  # type: ignore[arg-type]
    assert rules(checker.history) == ["replicas disagree below the HW"]


def test_identical_replicas_below_the_hw_agree(tmp_path: Path) -> None:
    checker = ClusterChecker(History())
    for broker_id in (1, 2, 3):
        checker.check_committed(broker_id, 1, replica_with(tmp_path, broker_id, ["a", "b", "c"]))  # type: ignore[arg-type]
    assert checker.history.violations == []


def leader_seen_at_hw_3(checker: ClusterChecker, tmp_path: Path) -> Replica:
    """Broker 1 leading "a", "b", "c" in leader epoch 0 (HW 3), once the checker has seen it in a step."""
    leader = replica_with(tmp_path, 1, ["a", "b", "c"])
    leader.is_leader = True
    checker.check_partition_step(1, 1, leader)  # type: ignore[arg-type]
    return leader


def test_a_leader_hw_moving_backwards_within_its_epoch_is_reported(tmp_path: Path) -> None:
    checker = ClusterChecker(History())
    leader = leader_seen_at_hw_3(checker, tmp_path)
    leader.log.truncate_to(1)
    checker.check_partition_step(1, 1, leader)  # type: ignore[arg-type]
    assert "leader HW moved backwards" in rules(checker.history)


def test_a_new_leader_epoch_may_start_from_a_lower_hw(tmp_path: Path) -> None:
    checker = ClusterChecker(History())
    leader = leader_seen_at_hw_3(checker, tmp_path)
    leader.log.update_high_watermark(1)
    leader.leader_epoch = 1
    checker.check_partition_step(1, 1, leader)  # type: ignore[arg-type]
    assert checker.history.violations == []


def test_controller_epochs_going_backwards_or_a_leader_change_without_a_new_epoch_are_reported() -> None:
    checker = ClusterChecker(History())
    checker.check_controller_step(TP, leader=1, leader_epoch=3)
    checker.check_controller_step(TP, leader=2, leader_epoch=3)
    checker.check_controller_step(TP, leader=2, leader_epoch=2)
    assert rules(checker.history) == ["leader changed without a new epoch", "leader epoch went backwards"]


def test_after_convergence_a_lost_acknowledged_write_and_a_vanished_read_are_reported(tmp_path: Path) -> None:
    history = History()
    history.acknowledged(TP, 1, "b", 0)
    history.acknowledged(TP, 2, "c", 0)
    history.read("c", TP, 2, "c", high_watermark=3, expected=2)
    leader = replica_with(tmp_path, 1, ["a", "b"])
    follower = replica_with(tmp_path, 2, ["a", "b"])
    ClusterChecker(history).check_converged(TP, leader, [follower])  # type: ignore[arg-type]
    assert rules(history) == ["acknowledged write lost", "a record read is gone"]


def test_after_convergence_a_follower_differing_from_the_leader_is_reported(tmp_path: Path) -> None:
    history = History()
    leader = replica_with(tmp_path, 1, ["a", "b"])
    follower = replica_with(tmp_path, 2, ["a", "x"], epoch=1)
    ClusterChecker(history).check_converged(TP, leader, [follower])  # type: ignore[arg-type]
    assert rules(history) == ["replicas differ after convergence", "leader-epoch caches differ"]
