"""The transaction coordinator's answers, transitions and __transaction_state writes, request by request, as Kafka's
TransactionCoordinator (transaction.version 0/1: EndTxn never bumps the epoch)."""

from __future__ import annotations

from txn_harness import FIRST_PRODUCER_ID, NO_ANSWER, TP0, TP1, TP2, Harness

from tierlog.coordinator.transaction.transaction_coordinator import (
    COMPLETION_RETRY_BACKOFF_MS,
    InitProducerIdResult,
    error_for_version,
)
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


# InitProducerId


def test_init_producer_id_validates_the_request() -> None:
    h = Harness(transaction_max_timeout_ms=900_000)
    assert h.init("") == InitProducerIdResult(-1, -1, "INVALID_REQUEST")
    for bad in (0, -1, 900_001):
        assert h.init("tx", timeout_ms=bad) == InitProducerIdResult(-1, -1, "INVALID_TRANSACTION_TIMEOUT")
    assert h.init("tx", timeout_ms=900_000) == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)
    assert h.metadata("tx").txn_timeout_ms == 900_000
    # A later InitProducerId sets the timeout of the next transactions.
    h.init("tx", timeout_ms=5000)
    assert h.metadata("tx").txn_timeout_ms == 5000


def test_not_coordinator_and_loading() -> None:
    h = Harness()
    partition = h.coordinator.partition_for("tx")
    h.coordinator.on_resignation(partition, h.epoch)
    assert h.init("tx") == InitProducerIdResult(-1, -1, "NOT_COORDINATOR")
    assert h.add("tx", 1, 0, TP0) == {TP0: "NOT_COORDINATOR"}
    assert h.end("tx", 1, 0, True) == "NOT_COORDINATOR"
    assert h.coordinator.on_election(partition, 5)
    assert not h.coordinator.on_election(partition, 5)
    assert h.coordinator.is_loading(partition)
    assert h.init("tx") == InitProducerIdResult(-1, -1, "COORDINATOR_LOAD_IN_PROGRESS")
    assert h.add("tx", 1, 0, TP0) == {TP0: "COORDINATOR_LOAD_IN_PROGRESS"}
    assert h.end("tx", 1, 0, True) == "COORDINATOR_LOAD_IN_PROGRESS"
    h.coordinator.complete_load(partition, 5, [], h.now)
    assert h.init("tx") == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_no_producer_id_block_yet_is_retriable() -> None:
    h = Harness()
    h.producer_ids_available = False
    assert h.init("tx") == InitProducerIdResult(-1, -1, "COORDINATOR_LOAD_IN_PROGRESS")
    assert not h.has("tx")
    h.producer_ids_available = True
    assert h.init("tx") == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_a_failed_write_leaves_the_id_at_epoch_minus_1_and_the_retry_gets_0() -> None:
    h = Harness()
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    assert h.init("tx") == InitProducerIdResult(-1, -1, "COORDINATOR_NOT_AVAILABLE")
    md = h.metadata("tx")
    assert (md.producer_epoch, md.pending_state) == (-1, None)
    h.appends.fail_with = None
    assert h.init("tx") == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_append_errors_are_mapped_as_kafkas() -> None:
    for append_error, answer in [
        ("UNKNOWN_TOPIC_OR_PARTITION", "COORDINATOR_NOT_AVAILABLE"),
        ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", "COORDINATOR_NOT_AVAILABLE"),
        ("REQUEST_TIMED_OUT", "COORDINATOR_NOT_AVAILABLE"),
        ("NOT_LEADER_OR_FOLLOWER", "NOT_COORDINATOR"),
        ("KAFKA_STORAGE_ERROR", "NOT_COORDINATOR"),
        ("MESSAGE_TOO_LARGE", "UNKNOWN_SERVER_ERROR"),
        ("RECORD_LIST_TOO_LARGE", "UNKNOWN_SERVER_ERROR"),
        ("INVALID_REQUIRED_ACKS", "INVALID_REQUIRED_ACKS"),
    ]:
        h = Harness()
        h.appends.fail_with = append_error
        assert h.init("tx") == InitProducerIdResult(-1, -1, answer)


def test_init_while_a_write_is_pending_is_concurrent() -> None:
    h = Harness()
    h.appends.hold = True
    assert h.init("tx") is None
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    h.appends.hold = False
    h.appends.release()
    assert h.answers.init[-1] == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_init_fences_an_ongoing_transaction() -> None:
    """A new producer with the same transactional id: the ongoing transaction is aborted with a bumped epoch (never
    returned to a client), the new producer is told CONCURRENT_TRANSACTIONS and its retry bumps again."""
    h = Harness()
    pid, epoch = h.begin("tx", TP0, TP1)
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    [request] = h.markers
    assert (request.committed, request.producer_epoch, request.partitions) == (False, epoch + 1, {TP0, TP1})
    prepare_abort = h.logged("tx")[-1]
    assert (prepare_abort.transaction_status, prepare_abort.producer_epoch) == (S.PREPARE_ABORT.id, epoch + 1)
    # Markers in flight: the new producer keeps retrying; the zombie is fenced.
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    assert h.add("tx", pid, epoch, TP2) == {TP2: "PRODUCER_FENCED"}
    assert h.end("tx", pid, epoch, True) == "PRODUCER_FENCED"
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_ABORT
    assert h.init("tx") == InitProducerIdResult(pid, epoch + 2, None)
    assert h.end("tx", pid, epoch, True) == "PRODUCER_FENCED"


def test_init_during_prepare_is_concurrent() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, True)
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    # Even with no completion write pending (Kafka checks the state too).
    h.metadata("tx").pending_state = None
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")


def test_kip_360_bump_after_an_abortable_error() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    assert h.end("tx", pid, epoch, False) is None
    h.write_markers()
    # The producer names its id and epoch: the epoch is bumped and the last one remembered.
    assert h.init("tx", expected=(pid, epoch)) == InitProducerIdResult(pid, epoch + 1, None)
    assert h.metadata("tx").last_producer_epoch == epoch
    # The same request again (the answer was lost): the same answer, no second bump.
    assert h.init("tx", expected=(pid, epoch)) == InitProducerIdResult(pid, epoch + 1, None)
    # A stale epoch or an unknown producer id is a zombie.
    assert h.init("tx", expected=(pid, epoch - 1)) == InitProducerIdResult(-1, -1, "PRODUCER_FENCED")
    assert h.init("tx", expected=(pid + 7, epoch + 1)) == InitProducerIdResult(-1, -1, "PRODUCER_FENCED")
    # A new producer (no expected epoch) forgets the last epoch: the old one cannot retry any more.
    assert h.init("tx") == InitProducerIdResult(pid, epoch + 2, None)
    assert h.init("tx", expected=(pid, epoch)) == InitProducerIdResult(-1, -1, "PRODUCER_FENCED")


def test_kip_360_with_an_id_that_was_just_created() -> None:
    """A producer recovering from UNKNOWN_PRODUCER_ID after its id expired: the fresh id is safe to hand out."""
    h = Harness()
    h.appends.fail_with = "REQUEST_TIMED_OUT"
    h.init("tx")
    h.appends.fail_with = None
    assert h.init("tx", expected=(77, 3)) == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_epoch_exhaustion_rotates_the_producer_id() -> None:
    h = Harness()
    pid, _ = h.init("tx").producer_id, 0  # type: ignore[union-attr]
    h.metadata("tx").producer_epoch = 32766
    assert h.init("tx") == InitProducerIdResult(pid + 1, 0, None)
    md = h.metadata("tx")
    assert (md.producer_id, md.previous_producer_id, md.last_producer_epoch) == (pid + 1, pid, -1)
    # KIP-360 with the exhausted epoch: rotation, and the retry of it (old id, exhausted epoch) gets the same answer.
    md.producer_epoch = 32766
    assert h.init("tx", expected=(pid + 1, 32766)) == InitProducerIdResult(pid + 2, 0, None)
    assert h.metadata("tx").last_producer_epoch == 32766
    assert h.init("tx", expected=(pid + 1, 32766)) == InitProducerIdResult(pid + 2, 0, None)
    # Rotation needs a producer id.
    h.metadata("tx").producer_epoch = 32766
    h.producer_ids_available = False
    assert h.init("tx") == InitProducerIdResult(-1, -1, "COORDINATOR_LOAD_IN_PROGRESS")
    assert h.metadata("tx").pending_state is None


def test_fencing_the_last_epoch_then_rotating() -> None:
    h = Harness()
    pid, _ = h.begin("tx")
    h.metadata("tx").producer_epoch = 32766
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    assert h.markers[-1].producer_epoch == 32767
    h.write_markers()
    assert h.init("tx") == InitProducerIdResult(pid + 1, 0, None)


def test_a_fence_whose_write_failed_is_not_bumped_again() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    assert h.init("tx") == InitProducerIdResult(-1, -1, "COORDINATOR_NOT_AVAILABLE")
    md = h.metadata("tx")
    # The bumped epoch stays in memory (the zombie is fenced already), and the next fence reuses it.
    assert (md.state, md.pending_state, md.producer_epoch, md.has_failed_epoch_fence) == (
        S.ONGOING,
        None,
        epoch + 1,
        True,
    )
    assert h.end("tx", pid, epoch, True) == "PRODUCER_FENCED"
    h.appends.fail_with = None
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    assert h.markers[-1].producer_epoch == epoch + 1
    h.write_markers()
    assert not h.metadata("tx").has_failed_epoch_fence
    assert h.init("tx") == InitProducerIdResult(pid, epoch + 2, None)


# AddPartitionsToTxn


def test_add_partitions_errors() -> None:
    h = Harness()
    assert h.add("", 1, 0, TP0) == {TP0: "INVALID_REQUEST"}
    assert h.add("unknown", 1, 0, TP0, TP1) == {TP0: "INVALID_PRODUCER_ID_MAPPING", TP1: "INVALID_PRODUCER_ID_MAPPING"}
    pid = h.init("tx").producer_id  # type: ignore[union-attr]
    assert h.add("tx", pid + 1, 0, TP0) == {TP0: "INVALID_PRODUCER_ID_MAPPING"}
    assert h.add("tx", pid, 1, TP0) == {TP0: "PRODUCER_FENCED"}
    h.appends.hold = True
    assert h.add("tx", pid, 0, TP0) is None
    assert h.add("tx", pid, 0, TP1) == {TP1: "CONCURRENT_TRANSACTIONS"}
    h.appends.hold = False
    h.appends.release()
    assert h.answers.add[-1] == {TP0: None}
    h.end("tx", pid, 0, True)
    assert h.add("tx", pid, 0, TP1) == {TP1: "CONCURRENT_TRANSACTIONS"}
    h.metadata("tx").pending_state = None
    assert h.add("tx", pid, 0, TP1) == {TP1: "CONCURRENT_TRANSACTIONS"}


def test_add_partitions_extends_the_transaction_and_skips_known_ones() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0)
    start = h.metadata("tx").txn_start_timestamp
    writes = len(h.logged("tx"))
    h.now += 10
    assert h.add("tx", pid, epoch, TP0) == {TP0: None}
    assert len(h.logged("tx")) == writes  # nothing new: answered at once
    assert h.add("tx", pid, epoch, TP0, TP2) == {TP0: None, TP2: None}
    md = h.metadata("tx")
    assert (md.topic_partitions, md.txn_start_timestamp, md.txn_last_update_timestamp) == ({TP0, TP2}, start, h.now)
    value = h.logged("tx")[-1]
    assert value.transaction_partitions == (("events", (0,)), ("other", (0,)))


def test_the_next_transaction_starts_with_its_first_partition() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0)
    h.end("tx", pid, epoch, True)
    h.write_markers()
    h.now += 1000
    assert h.add("tx", pid, epoch, TP1) == {TP1: None}
    md = h.metadata("tx")
    assert (md.state, md.topic_partitions, md.txn_start_timestamp) == (S.ONGOING, {TP1}, h.now)


def test_a_failed_add_leaves_the_transaction_as_it_was() -> None:
    h = Harness()
    pid, epoch = h.begin("tx", TP0)
    h.appends.fail_with = "NOT_LEADER_OR_FOLLOWER"
    assert h.add("tx", pid, epoch, TP1) == {TP1: "NOT_COORDINATOR"}
    md = h.metadata("tx")
    assert (md.state, md.pending_state, md.topic_partitions) == (S.ONGOING, None, {TP0})


def test_producer_fenced_for_old_request_versions() -> None:
    assert error_for_version("PRODUCER_FENCED", "InitProducerId", 3) == "INVALID_PRODUCER_EPOCH"
    assert error_for_version("PRODUCER_FENCED", "InitProducerId", 4) == "PRODUCER_FENCED"
    for api in ("AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn"):
        assert error_for_version("PRODUCER_FENCED", api, 1) == "INVALID_PRODUCER_EPOCH"
        assert error_for_version("PRODUCER_FENCED", api, 2) == "PRODUCER_FENCED"
        assert error_for_version("CONCURRENT_TRANSACTIONS", api, 0) == "CONCURRENT_TRANSACTIONS"
        assert error_for_version(None, api, 0) is None


# EndTxn


def test_a_failed_prepare_write_can_be_retried() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.appends.fail_with = "REQUEST_TIMED_OUT"
    assert h.end("tx", pid, epoch, True) == "COORDINATOR_NOT_AVAILABLE"
    assert (h.metadata("tx").state, h.metadata("tx").pending_state) == (S.ONGOING, None)
    assert h.markers == []
    h.appends.fail_with = None
    assert h.end("tx", pid, epoch, True) is None
    assert len(h.markers) == 1


def test_prepare_state_without_a_pending_completion() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, False)
    h.metadata("tx").pending_state = None
    assert h.end("tx", pid, epoch, False) == "CONCURRENT_TRANSACTIONS"
    assert h.end("tx", pid, epoch, True) == "INVALID_TXN_STATE"


def test_a_coordinator_change_during_the_prepare_write_is_not_coordinator() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    partition = h.coordinator.partition_for("tx")
    h.appends.hold = True
    assert h.end("tx", pid, epoch, True) is NO_ANSWER
    h.coordinator.on_resignation(partition, h.epoch)
    h.coordinator.on_election(partition, h.epoch + 1)
    h.coordinator.complete_load(partition, h.epoch + 1, h.appends.log[partition], h.now)
    h.appends.hold = False
    h.appends.release()
    assert h.answers.end == ["NOT_COORDINATOR"]
    assert h.markers == []


def test_markers_for_another_producer_epoch_or_coordinator_epoch_are_ignored() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, True)
    request = h.markers[-1]
    h.coordinator.on_markers_written("tx", pid, epoch + 1, request.coordinator_epoch, h.now)
    h.coordinator.on_markers_written("tx", pid, epoch, request.coordinator_epoch + 1, h.now)
    h.coordinator.on_markers_written("other", pid, epoch, request.coordinator_epoch, h.now)
    assert h.metadata("tx").state is S.PREPARE_COMMIT
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_COMMIT
    # Twice is once.
    h.write_markers()
    assert [v.transaction_status for v in h.logged("tx")].count(S.COMPLETE_COMMIT.id) == 1


def test_a_failed_completion_write_is_retried_after_a_backoff() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, True)
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    h.write_markers()
    md = h.metadata("tx")
    assert (md.state, md.pending_state) == (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
    assert h.coordinator.next_deadline_ms() == h.now + COMPLETION_RETRY_BACKOFF_MS
    # The client keeps being told to wait.
    assert h.end("tx", pid, epoch, True) == "CONCURRENT_TRANSACTIONS"
    h.advance(COMPLETION_RETRY_BACKOFF_MS)
    assert h.metadata("tx").state is S.PREPARE_COMMIT
    h.appends.fail_with = None
    h.advance(COMPLETION_RETRY_BACKOFF_MS)
    assert (md.state, md.pending_state) == (S.COMPLETE_COMMIT, None)
    assert h.end("tx", pid, epoch, True) is None


def test_a_completion_write_refused_as_not_coordinator_is_left_to_the_next_coordinator() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, True)
    h.appends.fail_with = "NOT_LEADER_OR_FOLLOWER"
    h.write_markers()
    assert h.coordinator.next_deadline_ms() is None  # nothing to retry here
    h.appends.fail_with = None
    h.reload()
    [request] = h.markers
    assert request.committed and request.coordinator_epoch == h.epoch
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_COMMIT


def test_markers_are_abandoned_when_the_partition_moves() -> None:
    h = Harness()
    pid, epoch = h.begin("tx")
    h.end("tx", pid, epoch, True)
    request = h.markers[-1]
    h.coordinator.on_resignation(h.coordinator.partition_for("tx"), h.epoch)
    assert not h.coordinator.is_marker_request_current(request)
    h.write_markers(request)
    assert h.logged("tx")[-1].transaction_status == S.PREPARE_COMMIT.id


def test_kip_360_for_an_unknown_id_gets_a_new_producer_id() -> None:
    """Kafka's shouldGenerateNewProducerIdIfNoStateAndProducerIdAndEpochProvided: the id expired meanwhile."""
    h = Harness()
    assert h.init("tx", expected=(5, 3)) == InitProducerIdResult(FIRST_PRODUCER_ID, 0, None)


def test_after_a_rotation_the_old_id_with_a_stale_epoch_is_fenced() -> None:
    """Kafka's testInitProducerIdWithInvalidEpochAfterProducerIdRotation."""
    h = Harness()
    pid = h.init("tx").producer_id  # type: ignore[union-attr]
    h.metadata("tx").producer_epoch = 32766
    assert h.init("tx", expected=(pid, 32766)) == InitProducerIdResult(pid + 1, 0, None)
    assert h.init("tx", expected=(pid, 32765)) == InitProducerIdResult(-1, -1, "PRODUCER_FENCED")
