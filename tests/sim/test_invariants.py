"""The invariant checks themselves: each one reports the breach it exists for (a check that cannot fail proves
nothing), on hand-made histories and real logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import ClusterIdRecord, ProducerIdsRecord
from tierlog.raft.messages import OffsetAndEpoch, RaftFetchResponse
from tierlog.raft.raft_log import RaftLog
from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.sim.invariants import ClusterChecker, History, QuorumChecker, raft_log_batches
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig
from tierlog.storage.producer_state import AppendOrigin

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


# The controller quorum's rules


def voter_log(tmp_path: Path, voter_id: int, values: list[str], epoch: int = 1) -> RaftLog:
    """A voter's Raft log: its epoch's LeaderChangeMessage, then one batch per value."""
    log = RaftLog(tmp_path / f"voter-{voter_id}", 0)
    log.append_leader_change(1, [1, 2, 3], [1, 2], epoch, 0)
    for value in values:
        log.append_values([value.encode()], epoch, 0)
    return log


def quorum_checker() -> QuorumChecker:
    return QuorumChecker(History(), liveness_bound_ms=10_000)


def test_two_leaders_in_one_epoch_are_reported_whenever_they_lead() -> None:
    checker = quorum_checker()
    checker.check_voter_step(1, 1, epoch=3, is_leader=True, high_watermark=None)
    checker.check_voter_step(1, 2, epoch=4, is_leader=True, high_watermark=None)
    assert checker.history.violations == []
    checker.check_voter_step(2, 1, epoch=3, is_leader=True, high_watermark=None)
    assert rules(checker.history) == ["two leaders in one epoch"]


def test_a_voters_high_watermark_moving_back_within_an_incarnation_is_reported() -> None:
    checker = quorum_checker()
    checker.check_voter_step(1, 1, epoch=3, is_leader=False, high_watermark=5)
    checker.check_voter_step(1, 2, epoch=3, is_leader=False, high_watermark=2)  # restarted: learns it again
    assert checker.history.violations == []
    checker.check_voter_step(1, 2, epoch=3, is_leader=False, high_watermark=1)
    assert rules(checker.history) == ["quorum HW moved backwards"]


def test_voters_holding_different_batches_below_their_high_watermarks_are_reported(tmp_path: Path) -> None:
    checker = quorum_checker()
    checker.check_voter_log(1, 1, voter_log(tmp_path, 1, ["a", "b"]), high_watermark=3)
    # Voter 2's second batch differs, but only its first is committed in its view: not yet a breach.
    changed = voter_log(tmp_path, 2, ["a", "B"])
    checker.check_voter_log(2, 1, changed, high_watermark=2)
    assert checker.history.violations == []
    checker.check_voter_log(2, 1, changed, high_watermark=3)
    assert rules(checker.history) == ["committed metadata changed"]


def observer_fetch(log: RaftLog, start: int, high_watermark: int, **changes: object) -> RaftFetchResponse:
    data = log.read(start, 1 << 20)
    return RaftFetchResponse(None, 1, 1, high_watermark=high_watermark, records=data, **changes)  # type: ignore[arg-type]


def headers_of(response: RaftFetchResponse) -> list:  # type: ignore[type-arg]
    return [read_header(response.records, position) for position, _ in complete_batches(response.records)]


def test_a_broker_sent_uncommitted_or_gapped_metadata_or_told_to_truncate_is_reported(tmp_path: Path) -> None:
    log = voter_log(tmp_path, 1, ["a", "b"])
    checker = quorum_checker()
    committed = observer_fetch(log, 0, high_watermark=3)
    checker.check_observer_fetch("broker-1", 0, committed, headers_of(committed))
    assert checker.history.violations == []
    uncommitted = observer_fetch(log, 0, high_watermark=2)
    checker.check_observer_fetch("broker-1", 0, uncommitted, headers_of(uncommitted))
    assert rules(checker.history) == ["broker got uncommitted metadata"]
    gapped = observer_fetch(log, 2, high_watermark=3)
    checker.check_observer_fetch("broker-2", 1, gapped, headers_of(gapped))
    truncate = observer_fetch(log, 3, high_watermark=3, diverging_epoch=OffsetAndEpoch(1, 1))
    checker.check_observer_fetch("broker-3", 3, truncate, headers_of(truncate))
    assert rules(checker.history)[1:] == ["broker metadata has a gap", "broker told to truncate its metadata"]


def test_metadata_a_broker_was_sent_must_be_what_the_voters_commit(tmp_path: Path) -> None:
    """A leader that commits on a minority sends a broker records the majority never had."""
    checker = quorum_checker()
    minority = voter_log(tmp_path, 1, ["a", "b"])
    sent = observer_fetch(minority, 0, high_watermark=3)
    checker.check_observer_fetch("broker-1", 0, sent, headers_of(sent))
    checker.check_voter_log(2, 1, voter_log(tmp_path, 2, ["a", "c"], epoch=1), high_watermark=3)
    assert rules(checker.history) == ["committed metadata changed"]


def test_a_connected_majority_without_an_active_leader_beyond_the_bound_is_reported() -> None:
    checker = quorum_checker()
    checker.check_liveness(0, majority_connected=True, active_leader=False)
    checker.check_liveness(10_000, majority_connected=True, active_leader=False)
    checker.check_liveness(11_000, majority_connected=False, active_leader=False)  # a fault: the clock restarts
    checker.check_liveness(12_000, majority_connected=True, active_leader=False)
    checker.check_liveness(22_000, majority_connected=True, active_leader=True)
    assert checker.history.violations == []
    checker.check_liveness(23_000, majority_connected=True, active_leader=False)
    checker.check_liveness(33_001, majority_connected=True, active_leader=False)
    assert rules(checker.history) == ["no active controller"]


def test_after_convergence_differing_voters_and_lost_committed_metadata_are_reported(tmp_path: Path) -> None:
    checker = quorum_checker()
    old = voter_log(tmp_path, 9, ["a", "b"])
    checker.check_voter_log(9, 1, old, high_watermark=3)
    logs = {1: voter_log(tmp_path, 1, ["a"]), 2: voter_log(tmp_path, 2, ["a"]), 3: voter_log(tmp_path, 3, ["a", "x"])}
    checker.check_converged(1, logs)
    assert rules(checker.history) == ["voters' logs differ after convergence", "committed metadata lost"]
    assert [h.base_offset for h in raft_log_batches(logs[3], 0, logs[3].end_offset)] == [0, 1, 2]


def test_an_image_that_is_not_the_committed_records_replayed_is_reported() -> None:
    committed = [(1, ClusterIdRecord("c")), (2, ProducerIdsRecord(1, 1000)), (4, ProducerIdsRecord(2, 2000))]
    checker = quorum_checker()
    prefix = ClusterMetadata()
    for offset, record in committed[:2]:
        prefix.apply(offset, record)
    checker.check_final_image("broker-1", prefix, ClusterMetadata(), committed)
    assert checker.history.violations == []
    other = ClusterMetadata()
    other.apply(1, ClusterIdRecord("c"))
    other.apply(2, ProducerIdsRecord(1, 5000))
    checker.check_final_image("broker-2", other, ClusterMetadata(), committed)
    assert rules(checker.history) == ["metadata is not the committed log's"]


def test_an_image_loaded_from_a_snapshot_is_judged_from_the_snapshot_on() -> None:
    # The log starts at offset 3, after a snapshot of a cluster id and a first producer id block.
    base = ClusterMetadata.from_snapshot([ClusterIdRecord("c"), ProducerIdsRecord(1, 1000)], 3)
    after = [(4, ProducerIdsRecord(2, 2000))]
    checker = quorum_checker()
    loaded = ClusterMetadata.from_snapshot(base.snapshot_records(), 3)
    loaded.apply(4, ProducerIdsRecord(2, 2000))
    checker.check_final_image("broker-1", loaded, base, after)
    assert checker.history.violations == []
    # Replayed, with a LeaderChangeMessage (no metadata record) at offset 2 after its last record: whole.
    replayed = ClusterMetadata()
    replayed.apply(0, ClusterIdRecord("c"))
    replayed.apply(1, ProducerIdsRecord(1, 1000))
    checker.check_final_image("voter 3", replayed, base, after)
    assert checker.history.violations == []
    behind = ClusterMetadata()
    behind.apply(1, ClusterIdRecord("c"))
    checker.check_final_image("broker-2", behind, base, after)
    assert rules(checker.history) == ["metadata behind the log start"]


def test_two_snapshots_ending_at_one_offset_must_hold_the_same_records() -> None:
    checker = quorum_checker()
    checker.check_snapshot("voter 1", 10, [ClusterIdRecord("c")])
    checker.check_snapshot("broker-1", 10, [ClusterIdRecord("c")])
    assert checker.history.violations == []
    checker.check_snapshot("voter 2", 10, [ClusterIdRecord("d")])
    assert rules(checker.history) == ["snapshots at one offset differ"]


# Transactions


def test_read_committed_records_of_aborted_or_undecided_transactions_or_past_the_lso_are_reported() -> None:
    history = History()
    history.txn_written("t1", TP, ["a"])
    history.txn_written("t2", TP, ["b"])
    history.txn_written("t3", TP, ["c"])
    history.txn_decided("t1", True)
    history.txn_decided("t2", False)
    history.read_committed("rc", TP, 0, "a", last_stable_offset=5, high_watermark=5)
    assert rules(history) == []
    history.read_committed("rc", TP, 1, "b", last_stable_offset=5, high_watermark=5)
    history.read_committed("rc", TP, 2, "c", last_stable_offset=5, high_watermark=5)
    history.read_committed("rc", TP, 3, "plain", last_stable_offset=3, high_watermark=5)
    assert rules(history) == [
        "read_committed saw an aborted transaction",
        "read_committed saw an undecided transaction",
        "read_committed beyond the LSO",
    ]


def transactional_log(tmp_path: Path, broker_id: int, *, abort: bool, open_txn: bool) -> Replica:
    """Producer 7 commits a transaction of "a", "b" (offsets 0, 1; marker 2), then writes "c" (3) and, with
    `abort`, aborts it (marker 4); with `open_txn` producer 8 leaves "d" in an open transaction."""
    replica = replica_with(tmp_path, broker_id, [])
    log = replica.log

    def write(producer_id: int, sequence: int, value: str) -> None:
        batch = build_batch(
            [(None, value.encode(), [], 0)],
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=sequence,
            transactional=True,
        )
        log.append_as_leader(bytearray(batch), 0, 0)

    def end(producer_id: int, control_type: ControlRecordType) -> None:
        marker = build_end_txn_marker_batch(producer_id, 0, EndTxnMarker(control_type, 0), 0)
        log.append_as_leader(marker, 0, 0, origin=AppendOrigin.COORDINATOR)

    write(7, 0, "a")
    write(7, 1, "b")
    end(7, ControlRecordType.COMMIT)
    write(7, 2, "c")
    if abort:
        end(7, ControlRecordType.ABORT)
    if open_txn:
        write(8, 0, "d")
    log.update_high_watermark(log.log_end_offset)
    return replica


def test_after_convergence_transactions_lost_reordered_aborted_or_left_open_are_reported(tmp_path: Path) -> None:
    history = History()
    history.txn_written("t1", TP, ["a", "b"])
    history.txn_decided("t1", True)
    history.txn_marker_acknowledged("t1", TP, 2)
    history.txn_written("t2", TP, ["c"])
    history.txn_decided("t2", False)
    history.txn_marker_acknowledged("t2", TP, 4)
    leader = transactional_log(tmp_path, 1, abort=True, open_txn=False)
    follower = transactional_log(tmp_path, 2, abort=True, open_txn=False)
    checker = ClusterChecker(history)
    checker.check_transactions_converged(TP, leader, [follower], [(0, "a"), (1, "b")], {2: True, 4: False})  # type: ignore[arg-type]
    assert rules(history) == []
    # The records of t1 swapped, "c" of the aborted t2 visible, the ABORT marker not at its offset.
    checker.check_transactions_converged(TP, leader, [follower], [(0, "b"), (1, "a"), (3, "c")], {2: True})  # type: ignore[arg-type]
    assert rules(history) == [
        "read_committed saw an aborted transaction",
        "committed transaction out of order",
        "acknowledged marker lost",
    ]
    history.violations.clear()
    # t1 missing from the read; a follower without t2's ABORT (no index entry); producer 8's transaction open.
    other = tmp_path / "other"
    leader = transactional_log(other, 1, abort=True, open_txn=True)
    follower = transactional_log(other, 2, abort=False, open_txn=False)
    checker.check_transactions_converged(TP, leader, [follower], [], {2: True, 4: False})  # type: ignore[arg-type]
    assert rules(history) == [
        "aborted transaction indexes differ",
        "transaction left open",
        "committed transaction lost",
    ]
