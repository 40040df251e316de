"""Offsets committed in a transaction (TxnOffsetCommit, KIP-98 and KIP-447): pending per producer until the
transaction's marker, fenced by member and generation, ordered against plain commits by their records, and
rebuilt the same way by a load (docs/transactions.md#offsets)."""

from __future__ import annotations

from group_harness import Harness
from test_group_loading import reload

from tierlog.common import TopicPartition
from tierlog.coordinator.group.group_coordinator import GroupCoordinator, TxnMarker, TxnProducer, TxnRecord
from tierlog.coordinator.group.group_metadata import GroupState
from tierlog.coordinator.group.records import OffsetAndMetadata

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
OTHER = TopicPartition("other", 0)
PID = 1000


def fetch(
    coordinator: GroupCoordinator, group: str, tp: TopicPartition, require_stable: bool
) -> tuple[int, str | None]:
    error, offsets = coordinator.fetch_offsets(group, [tp], require_stable)
    assert error is None
    return offsets[tp].offset, offsets[tp].error


def test_offsets_stay_pending_until_the_commit_marker_and_require_stable_answers_unstable() -> None:
    h = Harness()
    h.commit("g", {TP0: 5})
    assert h.txn_commit("g", PID, {TP0: 9, TP1: 3}) == [{TP0: None, TP1: None}]
    # The previous offset is what a plain fetch sees; a read_committed consumer is told to wait.
    assert fetch(h.coordinator, "g", TP0, require_stable=False) == (5, None)
    assert fetch(h.coordinator, "g", TP0, require_stable=True) == (-1, "UNSTABLE_OFFSET_COMMIT")
    assert fetch(h.coordinator, "g", TP1, require_stable=True) == (-1, "UNSTABLE_OFFSET_COMMIT")
    assert fetch(h.coordinator, "g", OTHER, require_stable=True) == (-1, None)
    h.end_txn("g", PID, committed=True)
    assert fetch(h.coordinator, "g", TP0, require_stable=True) == (9, None)
    assert fetch(h.coordinator, "g", TP1, require_stable=True) == (3, None)
    assert h.coordinator.groups["g"].pending_txn_offsets == {}


def test_an_aborted_transaction_s_offsets_are_dropped() -> None:
    h = Harness()
    h.commit("g", {TP0: 5})
    h.txn_commit("g", PID, {TP0: 9})
    h.end_txn("g", PID, committed=False)
    assert fetch(h.coordinator, "g", TP0, require_stable=True) == (5, None)


def test_the_marker_completes_only_that_producer_and_only_groups_of_that_partition() -> None:
    h = Harness()
    h.txn_commit("g", PID, {TP0: 1})
    h.txn_commit("g", PID + 1, {TP1: 2})
    partition = h.coordinator.partition_for("g")
    h.coordinator.complete_transaction((partition + 1) % h.config.offsets_topic_num_partitions, PID, True)
    assert fetch(h.coordinator, "g", TP0, require_stable=True) == (-1, "UNSTABLE_OFFSET_COMMIT")
    h.end_txn("g", PID, committed=True)
    assert fetch(h.coordinator, "g", TP0, require_stable=True) == (1, None)
    assert fetch(h.coordinator, "g", TP1, require_stable=True) == (-1, "UNSTABLE_OFFSET_COMMIT")


def test_the_later_record_wins_between_a_transaction_and_a_plain_commit() -> None:
    h = Harness()
    # Transactional record first, plain commit after it: the transaction's commit does not move the offset back.
    h.txn_commit("g", PID, {TP0: 10})
    h.commit("g", {TP0: 20})
    h.end_txn("g", PID, committed=True)
    assert h.committed("g", TP0) == 20
    # Plain commit first: the transaction's later record wins.
    h.commit("g", {TP1: 20})
    h.txn_commit("g", PID, {TP1: 10})
    h.end_txn("g", PID, committed=True)
    assert h.committed("g", TP1) == 10
    loaded = reload(h)
    assert fetch(loaded, "g", TP0, True) == (20, None) and fetch(loaded, "g", TP1, True) == (10, None)


def test_a_failed_append_drops_the_pending_offsets_and_maps_the_error() -> None:
    h = Harness()
    h.appends.hold = True
    answers = h.txn_commit("g", PID, {TP0: 9})
    assert answers == [] and fetch(h.coordinator, "g", TP0, True) == (-1, "UNSTABLE_OFFSET_COMMIT")
    h.appends.release("NOT_LEADER_OR_FOLLOWER")
    assert answers == [{TP0: "NOT_COORDINATOR"}]
    assert fetch(h.coordinator, "g", TP0, True) == (-1, None)
    h.appends.hold = True
    answers = h.txn_commit("g", PID, {TP0: 9})
    h.appends.release("INVALID_PRODUCER_EPOCH")  # the log fenced the producer: passed on as it is
    assert answers == [{TP0: "INVALID_PRODUCER_EPOCH"}]
    h.end_txn("g", PID, committed=True)
    assert h.committed("g", TP0) == -1


def test_metadata_too_large_invalid_group_and_coordinator_states() -> None:
    h = Harness()
    assert h.txn_commit("", PID, {TP0: 1}) == [{TP0: "INVALID_GROUP_ID"}]
    coordinator = h.coordinator
    partition = coordinator.partition_for("g")
    coordinator.on_resignation(partition, h.now)
    assert h.txn_commit("g", PID, {TP0: 1}) == [{TP0: "NOT_COORDINATOR"}]
    coordinator.on_election(partition, 1)
    assert h.txn_commit("g", PID, {TP0: 1}) == [{TP0: "COORDINATOR_LOAD_IN_PROGRESS"}]
    coordinator.complete_load(partition, 1, [], h.now)
    results: list[dict[TopicPartition, str | None]] = []
    h.coordinator.commit_transactional_offsets(
        "g",
        TxnProducer(PID, 0),
        "",
        None,
        -1,
        {TP0: OffsetAndMetadata(1, -1, "x" * 5000, h.now), TP1: OffsetAndMetadata(2, -1, "", h.now)},
        h.now,
        results.append,
    )
    assert results == [{TP0: "OFFSET_METADATA_TOO_LARGE", TP1: None}]


def test_kip_447_fencing_by_member_generation_and_instance() -> None:
    h = Harness()
    (a, b), generation = h.stable_group("g", 2, instances=["i-a", "i-b"])
    assert h.txn_commit("g", PID, {TP0: 1}, a, generation, "i-a") == [{TP0: None}]
    assert h.txn_commit("g", PID, {TP0: 1}, a, generation - 1, "i-a") == [{TP0: "ILLEGAL_GENERATION"}]
    assert h.txn_commit("g", PID, {TP0: 1}, "zombie", generation) == [{TP0: "UNKNOWN_MEMBER_ID"}]
    assert h.txn_commit("g", PID, {TP0: 1}, b, generation, "i-a") == [{TP0: "FENCED_INSTANCE_ID"}]
    assert h.txn_commit("g", PID, {TP0: 1}, a, generation, "i-unknown") == [{TP0: "UNKNOWN_MEMBER_ID"}]
    # No member and no generation (TxnOffsetCommit v0-v2): accepted whatever the group's state.
    assert h.coordinator.groups["g"].state is GroupState.STABLE
    assert h.txn_commit("g", PID, {TP1: 1}) == [{TP1: None}]
    # A rebalance does not refuse the current generation (unlike OffsetCommit in CompletingRebalance).
    h.join("g", a, instance="i-a")
    assert h.coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert h.txn_commit("g", PID, {TP0: 2}, a, generation, "i-a") == [{TP0: None}]


def test_an_empty_group_accepts_a_commit_with_a_member_id_but_no_generation() -> None:
    h = Harness()
    assert h.txn_commit("new", PID, {TP0: 1}, "someone", -1) == [{TP0: None}]
    assert h.coordinator.groups["new"].state is GroupState.EMPTY


def test_loading_holds_a_transaction_pending_until_its_marker() -> None:
    h = Harness()
    h.commit("g", {TP0: 5})
    h.txn_commit("g", PID, {TP0: 9})
    h.txn_commit("g", PID + 1, {TP1: 7})
    h.end_txn("g", PID + 1, committed=False)
    loaded = reload(h)
    assert fetch(loaded, "g", TP0, True) == (-1, "UNSTABLE_OFFSET_COMMIT")
    assert fetch(loaded, "g", TP0, False) == (5, None)
    assert fetch(loaded, "g", TP1, True) == (-1, None)
    # The marker written after the failover completes the transaction on the new coordinator.
    loaded.complete_transaction(loaded.partition_for("g"), PID, True)
    assert fetch(loaded, "g", TP0, True) == (9, None)
    h.end_txn("g", PID, committed=True)
    assert fetch(reload(h), "g", TP0, True) == (9, None)


def test_a_group_known_only_from_a_pending_transaction_is_loaded() -> None:
    h = Harness()
    h.txn_commit("g", PID, {TP0: 9})
    loaded = reload(h)
    assert loaded.groups["g"].state is GroupState.EMPTY
    assert fetch(loaded, "g", TP0, True) == (-1, "UNSTABLE_OFFSET_COMMIT")


def test_a_tombstone_in_the_log_deletes_a_pending_offset_at_load() -> None:
    h = Harness()
    partition = h.coordinator.partition_for("g")
    h.txn_commit("g", PID, {TP0: 9})
    h.coordinator.delete_offsets("g", [TP0], h.now)
    h.end_txn("g", PID, committed=True)
    assert h.committed("g", TP0) == -1
    assert fetch(reload(h), "g", TP0, True) == (-1, None)
    log = h.appends.log[partition]
    assert isinstance(log[0], TxnRecord) and log[0].producer_id == PID
    assert not isinstance(log[1], TxnRecord) and log[1][1] is None  # the tombstone, outside the transaction
    assert log[-1] == TxnMarker(PID, True)


def test_deleting_offsets_writes_a_tombstone_for_a_pending_one_and_the_marker_does_not_bring_it_back() -> None:
    h = Harness()
    h.commit("g", {TP0: 5})
    h.txn_commit("g", PID, {TP0: 9, TP1: 4})
    assert h.coordinator.delete_offsets("g", [TP0, TP1], h.now) == (None, {TP0: None, TP1: None})
    h.end_txn("g", PID, committed=True)
    assert h.committed("g", TP0) == -1 and h.committed("g", TP1) == -1
    loaded = reload(h)
    assert fetch(loaded, "g", TP0, True) == (-1, None) and fetch(loaded, "g", TP1, True) == (-1, None)


def test_deleting_a_group_removes_its_pending_offsets_too() -> None:
    h = Harness()
    h.txn_commit("g", PID, {TP0: 9})
    assert h.coordinator.delete_groups(["g"], h.now) == {"g": None}
    h.end_txn("g", PID, committed=True)
    assert "g" not in h.coordinator.groups
    assert "g" not in reload(h).groups


def test_an_offset_with_a_pending_transaction_does_not_expire_nor_does_its_group() -> None:
    h = Harness(offsets_retention_ms=60_000)
    h.commit("g", {TP0: 5})
    h.txn_commit("g", PID, {TP0: 9})
    h.txn_commit("h", PID + 1, {TP0: 1})
    h.advance(120_000)
    assert h.coordinator.cleanup_group_metadata(h.now) == 0
    assert {"g", "h"} <= h.coordinator.groups.keys()
    h.end_txn("g", PID, committed=False)
    h.end_txn("h", PID + 1, committed=False)
    assert h.coordinator.cleanup_group_metadata(h.now) == 1
    assert "g" not in h.coordinator.groups and "h" not in h.coordinator.groups


def test_a_marker_after_resignation_is_ignored_and_the_next_load_completes_it() -> None:
    h = Harness()
    h.txn_commit("g", PID, {TP0: 9})
    partition = h.coordinator.partition_for("g")
    h.coordinator.on_resignation(partition, h.now)
    h.end_txn("g", PID, committed=True)
    assert "g" not in h.coordinator.groups
    h.coordinator.on_election(partition, 1)
    h.coordinator.complete_load(partition, 1, h.appends.log[partition], h.now)
    assert fetch(h.coordinator, "g", TP0, True) == (9, None)
