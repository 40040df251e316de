"""Coordinator failover: a new coordinator loads a __transaction_state partition into exactly the state the old one had
written, completes the transactions it finds in PrepareCommit/PrepareAbort (their markers go out again with the new
coordinator epoch), and answers ListTransactions/DescribeTransactions (KIP-664) from what it serves."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txn_harness import FIRST_PRODUCER_ID, TP0, TP1, TP2, Harness

from tierlog.coordinator.transaction.records import encode_key
from tierlog.coordinator.transaction.transaction_coordinator import (
    InitProducerIdResult,
    TransactionDescription,
    TransactionListing,
)
from tierlog.coordinator.transaction.transaction_metadata import TransactionState

S = TransactionState


def snapshot(h: Harness) -> dict[str, tuple]:
    """What a coordinator serves, per id, minus what Kafka does not store (the last epoch, the in-memory start time of
    an Empty id)."""
    result = {}
    for partition in h.coordinator._partitions.values():
        for txn_id, md in partition.transactions.items():
            start = -1 if md.state is S.EMPTY else md.txn_start_timestamp
            result[txn_id] = (
                md.producer_id,
                md.producer_epoch,
                md.state,
                frozenset(md.topic_partitions),
                md.txn_timeout_ms,
                start,
                md.txn_last_update_timestamp,
            )
    return result


def test_load_in_progress_then_served() -> None:
    h = Harness()
    h.begin("tx", TP0)
    partition = h.coordinator.partition_for("tx")
    h.coordinator.on_election(partition, 7)
    assert h.coordinator.is_loading(partition)
    assert h.coordinator.describe_transaction("tx").error == "COORDINATOR_LOAD_IN_PROGRESS"
    assert h.coordinator.list_transactions([], []).error == "COORDINATOR_LOAD_IN_PROGRESS"
    # A load for another epoch (superseded while it read) is ignored.
    h.coordinator.complete_load(partition, 6, h.appends.log[partition], h.now)
    assert h.coordinator.is_loading(partition)
    h.coordinator.complete_load(partition, 7, h.appends.log[partition], h.now)
    assert not h.coordinator.is_loading(partition)
    assert h.coordinator.coordinator_epoch(partition) == 7
    assert h.coordinator.describe_transaction("tx").state == "Ongoing"


def test_a_prepared_commit_is_completed_by_the_next_coordinator() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0, TP2)
    h.end("tx", pid, epoch, True)
    # The old coordinator dies before the markers are written.
    h.reload()
    [request] = h.markers
    assert (request.committed, request.producer_id, request.producer_epoch) == (True, pid, epoch)
    assert (request.coordinator_epoch, request.partitions) == (h.epoch, {TP0, TP2})
    md = h.metadata("tx")
    assert (md.state, md.pending_state) == (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
    assert h.end("tx", pid, epoch, True) == "CONCURRENT_TRANSACTIONS"
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_COMMIT
    assert h.end("tx", pid, epoch, True) is None


def test_a_prepared_abort_is_completed_by_the_next_coordinator() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP1)
    h.end("tx", pid, epoch, False)
    h.reload()
    assert [(r.committed, r.partitions) for r in h.markers] == [(False, {TP1})]
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_ABORT


def test_an_ongoing_transaction_survives_failover_and_still_times_out() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0)
    h.reload()
    assert h.markers == []
    assert h.add("tx", pid, epoch, TP1) == {TP1: None}
    assert h.end("tx", pid, epoch, True) is None
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_COMMIT


def test_loading_replays_latest_values_and_tombstones() -> None:
    h = Harness()
    h.begin("a", TP0)
    h.init("b")
    h.init("b")
    h.init("c")
    partition = h.coordinator.partition_for("c")
    h.appends.log.setdefault(partition, []).append((encode_key("c"), None))
    expected = snapshot(h)
    del expected["c"]
    h.reload()
    assert snapshot(h) == expected
    assert h.metadata("b").producer_epoch == 1


def test_unreadable_records_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.init("tx")
    partition = h.coordinator.partition_for("tx")
    good = h.appends.log[partition][-1]
    h.appends.log[partition] += [
        (b"\x00\x09future-key", b"whatever"),  # a key version from a newer (or aborted) upgrade
        (encode_key("tx"), b"\x00\x00\x00"),  # truncated
        (encode_key("tx"), b"\x00\x05" + good[1][2:]),  # unknown value version
        (encode_key("tx"), good[1][:16] + b"\x06" + good[1][17:]),  # TransactionStatus Dead: never written
    ]
    with caplog.at_level(logging.WARNING):
        h.reload()
    assert h.metadata("tx").producer_epoch == 0
    assert sum("skipping" in r.message for r in caplog.records) == 4


def test_resignation_drops_the_ids_and_a_stale_resignation_is_ignored() -> None:
    h = Harness()
    h.init("tx")
    partition = h.coordinator.partition_for("tx")
    h.coordinator.on_resignation(partition, h.epoch - 1)
    assert h.has("tx")
    h.coordinator.on_resignation(partition, h.epoch)
    assert partition not in h.coordinator.owned_partitions()
    assert h.coordinator.describe_transaction("tx").error == "NOT_COORDINATOR"
    h.coordinator.on_resignation(partition, None)  # nothing left: nothing to do
    h.coordinator.on_election(partition, h.epoch + 1)
    h.coordinator.on_resignation(partition, None)
    assert partition not in h.coordinator.owned_partitions()


def test_a_write_completing_after_the_partition_moved_is_not_applied() -> None:
    h = Harness()
    h.init("tx")
    partition = h.coordinator.partition_for("tx")
    h.appends.hold = True
    h.init("tx")
    h.coordinator.on_resignation(partition, h.epoch)
    h.appends.hold = False
    h.appends.release()
    assert h.answers.init[-1] == InitProducerIdResult(-1, -1, "NOT_COORDINATOR")


def test_a_reelection_at_a_new_epoch_reloads() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0)
    h.end("tx", pid, epoch, True)
    partition = h.coordinator.partition_for("tx")
    old = h.markers[-1]
    assert h.coordinator.on_election(partition, h.epoch + 1)
    assert not h.coordinator.is_marker_request_current(old)
    h.coordinator.complete_load(partition, h.epoch + 1, h.appends.log[partition], h.now)
    assert h.markers[-1].coordinator_epoch == h.epoch + 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["init", "add", "commit", "abort", "markers", "time"]),
            st.sampled_from(["t1", "t2", "t3"]),
            st.sampled_from([TP0, TP1, TP2]),
        ),
        max_size=40,
    )
)
def test_a_reloaded_coordinator_serves_what_the_old_one_wrote(steps: list) -> None:
    h = Harness()
    producers: dict[str, tuple[int, int]] = {}
    for op, txn_id, tp in steps:
        if op == "init":
            result = h.init(txn_id)
            if result is not None and result.error is None:
                producers[txn_id] = (result.producer_id, result.producer_epoch)
        elif op == "time":
            h.advance(30_000)
        elif op == "markers":
            for request in list(h.markers):
                h.write_markers(request)
        elif txn_id in producers:
            pid, epoch = producers[txn_id]
            if op == "add":
                h.add(txn_id, pid, epoch, tp)
            else:
                h.end(txn_id, pid, epoch, op == "commit")
    live = {
        txn_id: state
        for txn_id, state in snapshot(h).items()
        # Written but pending: what the log says is the state before (an id still at epoch -1 was never written).
        if h.metadata(txn_id).pending_state is None and h.metadata(txn_id).producer_epoch >= 0
    }
    h.reload()
    reloaded = snapshot(h)
    for txn_id, state in live.items():
        assert reloaded[txn_id] == state


# ListTransactions and DescribeTransactions


def test_describe() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0, TP1, TP2)
    assert h.coordinator.describe_transaction("tx") == TransactionDescription(
        transactional_id="tx",
        error=None,
        state="Ongoing",
        transaction_timeout_ms=60_000,
        transaction_start_time_ms=h.now,
        producer_id=pid,
        producer_epoch=epoch,
        topics=(("events", (0, 1)), ("other", (0,))),
    )
    assert h.coordinator.describe_transaction("nope") == TransactionDescription("nope", "TRANSACTIONAL_ID_NOT_FOUND")
    assert h.coordinator.describe_transaction("").error == "INVALID_REQUEST"


def test_list_with_filters() -> None:
    h = Harness()
    h.begin("ongoing", TP0)
    h.now += 5000
    h.init("empty")
    pid, epoch = h.begin("committed", TP1)
    h.end("committed", pid, epoch, True)
    h.write_markers()
    every = h.coordinator.list_transactions([], [])
    assert every.error is None and every.unknown_state_filters == ()
    assert [(t.transactional_id, t.state) for t in every.transactions] == [
        ("committed", "CompleteCommit"),
        ("empty", "Empty"),
        ("ongoing", "Ongoing"),
    ]
    by_state = h.coordinator.list_transactions(["Ongoing", "Empty", "Bogus"], [])
    assert [t.transactional_id for t in by_state.transactions] == ["empty", "ongoing"]
    assert by_state.unknown_state_filters == ("Bogus",)
    by_pid = h.coordinator.list_transactions([], [FIRST_PRODUCER_ID])
    assert by_pid.transactions == (TransactionListing("ongoing", FIRST_PRODUCER_ID, "Ongoing"),)
    # KIP-994: running longer than the duration (the ongoing one started 5 s ago; Empty ids have no start).
    long_running = h.coordinator.list_transactions(["Ongoing"], [], duration_filter_ms=4000, now_ms=h.now)
    assert [t.transactional_id for t in long_running.transactions] == ["ongoing"]
    assert h.coordinator.list_transactions(["Ongoing"], [], duration_filter_ms=5000, now_ms=h.now).transactions == ()
    with pytest.raises(ValueError):
        h.coordinator.list_transactions([], [], duration_filter_ms=0)
