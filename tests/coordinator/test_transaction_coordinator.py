"""The transaction coordinator's answers, transitions and __transaction_state writes, request by request, as Kafka's
TransactionCoordinator (transaction.version 0/1: EndTxn never bumps the epoch)."""

from __future__ import annotations

from txn_harness import FIRST_PRODUCER_ID, TP0, TP2, Harness

from tierlog.coordinator.transaction.transaction_coordinator import InitProducerIdResult
from tierlog.coordinator.transaction.transaction_metadata import TransactionState

S = TransactionState


def test_commit_writes_prepare_then_markers_then_complete() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0, TP2)
    assert (pid, epoch) == (FIRST_PRODUCER_ID, 0)
    assert h.end("tx", pid, epoch, commit=True) is None
    # The client is answered once PrepareCommit is in the log; the markers follow.
    [request] = h.markers
    assert request.committed and request.partitions == {TP0, TP2}
    assert (request.producer_id, request.producer_epoch, request.coordinator_epoch) == (pid, 0, 0)
    assert h.metadata("tx").state is S.PREPARE_COMMIT
    assert h.metadata("tx").pending_state is S.COMPLETE_COMMIT
    assert h.coordinator.is_marker_request_current(request)
    h.write_markers()
    assert not h.coordinator.is_marker_request_current(request)
    md = h.metadata("tx")
    assert (md.state, md.pending_state, md.topic_partitions) == (S.COMPLETE_COMMIT, None, set())
    states = [v.transaction_status for v in h.logged("tx")]
    assert states == [S.EMPTY.id, S.ONGOING.id, S.PREPARE_COMMIT.id, S.COMPLETE_COMMIT.id]


def test_idempotent_init_producer_id_gets_a_fresh_id_each_time() -> None:
    h = Harness()
    assert h.init(None) == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)
    assert h.init(None) == InitProducerIdResult(FIRST_PRODUCER_ID + 1, 0, None)
    assert h.appends.log == {}
    h.producer_ids_available = False
    assert h.init(None) == InitProducerIdResult(-1, -1, "COORDINATOR_LOAD_IN_PROGRESS")


def test_init_producer_id_bumps_the_epoch_of_an_existing_id() -> None:
    h = Harness()
    first = h.init("tx")
    second = h.init("tx")
    assert first == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)
    assert second == InitProducerIdResult(FIRST_PRODUCER_ID, 1, None)
    assert h.metadata("tx").last_producer_epoch == -1
    assert h.end("tx", FIRST_PRODUCER_ID, 0, commit=True) == "PRODUCER_FENCED"


def test_abort_without_partitions_completes_without_markers() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.metadata("tx").topic_partitions.clear()
    assert h.end("tx", pid, epoch, commit=False) is None
    assert h.markers == []
    assert h.metadata("tx").state is S.COMPLETE_ABORT


def test_end_txn_errors() -> None:
    h = Harness()
    assert h.end("", 1, 0, True) == "INVALID_REQUEST"
    assert h.end("unknown", 1, 0, True) == "INVALID_PRODUCER_ID_MAPPING"
    pid, epoch = h.init("tx").producer_id, 0  # type: ignore[union-attr]
    assert h.end("tx", pid, epoch, True) == "INVALID_TXN_STATE"  # Empty: nothing to end
    assert h.end("tx", pid + 1, epoch, True) == "INVALID_PRODUCER_ID_MAPPING"
    assert h.end("tx", pid, epoch + 1, True) == "PRODUCER_FENCED"
    assert h.add("tx", pid, epoch, TP0) == {TP0: None}
    assert h.end("tx", pid, epoch, True) is None
    # Markers in flight: CompleteCommit pending.
    assert h.end("tx", pid, epoch, True) == "CONCURRENT_TRANSACTIONS"
    assert h.end("tx", pid, epoch, False) == "CONCURRENT_TRANSACTIONS"
    h.write_markers()
    # A retry of the commit that completed is answered as the commit was; an abort now is a state error.
    assert h.end("tx", pid, epoch, True) is None
    assert h.end("tx", pid, epoch, False) == "INVALID_TXN_STATE"
