"""The coordinator's own actions on its timer: aborting transactions open longer than their timeout (with an epoch bump
that fences the producer, as Kafka's abortTimedOutTransactions) and expiring transactional ids idle for
transactional.id.expiration.ms (a tombstone, as Kafka's removeExpiredTransactionalIds)."""

from __future__ import annotations

from txn_harness import TIMEOUT_MS, TP0, TP1, Harness

from tierlog.coordinator.transaction.transaction_coordinator import InitProducerIdResult
from tierlog.coordinator.transaction.transaction_metadata import TransactionState

S = TransactionState
EXPIRATION_MS = 3_600_000
ABORT_INTERVAL_MS = 10_000
EXPIRY_INTERVAL_MS = 600_000


def harness() -> Harness:
    return Harness(
        transactional_id_expiration_ms=EXPIRATION_MS,
        transaction_abort_timed_out_transaction_cleanup_interval_ms=ABORT_INTERVAL_MS,
        transaction_remove_expired_transaction_cleanup_interval_ms=EXPIRY_INTERVAL_MS,
    )


def test_a_transaction_open_longer_than_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    h = harness()
    pid, epoch = h.begin("tx", TP0, TP1)
    start = h.now
    assert h.coordinator.next_deadline_ms() == start + TIMEOUT_MS + 1
    h.advance(TIMEOUT_MS)
    assert h.metadata("tx").state is S.ONGOING  # Kafka: start + timeout < now
    h.advance(1)
    [request] = h.markers
    assert (request.committed, request.producer_epoch, request.partitions) == (False, epoch + 1, {TP0, TP1})
    assert h.metadata("tx").state is S.PREPARE_ABORT
    h.write_markers()
    assert h.metadata("tx").state is S.COMPLETE_ABORT
    # The producer that let its transaction time out is a zombie now.
    assert h.end("tx", pid, epoch, True) == "PRODUCER_FENCED"
    assert h.add("tx", pid, epoch, TP0) == {TP0: "PRODUCER_FENCED"}
    assert h.init("tx", expected=(pid, epoch)) == InitProducerIdResult(-1, -1, "PRODUCER_FENCED")
    assert h.init("tx") == InitProducerIdResult(pid, epoch + 2, None)


def test_each_transaction_has_its_own_timeout() -> None:
    h = harness()
    short = h.init("short", timeout_ms=1000)
    h.add("short", short.producer_id, short.producer_epoch, TP0)  # type: ignore[union-attr]
    h.begin("long", TP1)
    h.advance(1001)
    assert h.metadata("short").state is S.PREPARE_ABORT
    assert h.metadata("long").state is S.ONGOING


def test_the_timeout_counts_from_the_first_partition_not_the_last() -> None:
    h = harness()
    pid, epoch = h.begin("tx", TP0)
    h.advance(TIMEOUT_MS - 10)
    h.add("tx", pid, epoch, TP1)
    h.advance(11)
    assert h.metadata("tx").state is S.PREPARE_ABORT


def test_transactions_being_written_are_not_timed_out() -> None:
    h = harness()
    pid, epoch = h.begin("tx", TP0)
    h.appends.hold = True
    h.add("tx", pid, epoch, TP1)
    assert h.coordinator.next_deadline_ms() is None
    h.advance(TIMEOUT_MS + 1)
    assert len(h.appends.held) == 1
    h.appends.hold = False
    h.appends.release()
    deadline = h.coordinator.next_deadline_ms()
    assert deadline is not None and deadline <= h.now
    h.advance(0)
    assert h.metadata("tx").state is S.PREPARE_ABORT


def test_a_failed_timeout_abort_is_tried_again_after_the_cleanup_interval() -> None:
    h = harness()
    _, epoch = h.begin("tx", TP0)
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    h.advance(TIMEOUT_MS + 1)
    md = h.metadata("tx")
    assert (md.state, md.producer_epoch, md.has_failed_epoch_fence) == (S.ONGOING, epoch + 1, True)
    assert h.coordinator.next_deadline_ms() == h.now + ABORT_INTERVAL_MS
    h.appends.fail_with = None
    h.advance(ABORT_INTERVAL_MS)
    assert (md.state, md.producer_epoch) == (S.PREPARE_ABORT, epoch + 1)
    assert h.markers[-1].producer_epoch == epoch + 1


def test_an_idle_id_expires_with_a_tombstone() -> None:
    h = harness()
    h.init("tx")
    assert h.coordinator.next_deadline_ms() == h.now + EXPIRATION_MS
    h.advance(EXPIRATION_MS - 1)
    assert h.has("tx")
    h.advance(1)
    assert not h.has("tx")
    assert h.logged("tx")[-1] is None
    assert h.coordinator.describe_transaction("tx").error == "TRANSACTIONAL_ID_NOT_FOUND"
    assert h.coordinator.next_deadline_ms() is None
    # The id starts over with a new producer id.
    result = h.init("tx")
    assert result is not None and result.producer_epoch == 0 and result.producer_id != h.logged("tx")[0].producer_id


def test_completed_transactions_expire_ongoing_ones_do_not() -> None:
    h = harness()
    pid, epoch = h.begin("done", TP0)
    h.end("done", pid, epoch, True)
    h.write_markers()
    h.begin("open", TP1)
    h.metadata("open").txn_timeout_ms = 2 * EXPIRATION_MS
    h.advance(EXPIRATION_MS)
    assert not h.has("done")
    assert h.has("open")


def test_activity_postpones_expiry() -> None:
    h = harness()
    h.init("tx")
    h.advance(EXPIRATION_MS - 1)
    h.init("tx")
    h.advance(EXPIRATION_MS - 1)
    assert h.has("tx")
    h.advance(1)
    assert not h.has("tx")


def test_a_failed_tombstone_keeps_the_id_and_is_tried_again_after_the_cleanup_interval() -> None:
    h = harness()
    h.init("tx")
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    h.advance(EXPIRATION_MS)
    assert h.has("tx") and h.metadata("tx").pending_state is None
    assert h.coordinator.next_deadline_ms() == h.now + EXPIRY_INTERVAL_MS
    h.appends.fail_with = None
    h.advance(EXPIRY_INTERVAL_MS)
    assert not h.has("tx")


def test_an_id_used_while_its_tombstone_is_written_is_blocked_until_it_is_gone() -> None:
    h = harness()
    h.init("tx")
    h.appends.hold = True
    h.advance(EXPIRATION_MS)
    assert h.metadata("tx").pending_state is S.DEAD
    assert h.init("tx") == InitProducerIdResult(-1, -1, "CONCURRENT_TRANSACTIONS")
    assert h.coordinator.list_transactions([], []).transactions[0].state == "Empty"
    h.appends.hold = False
    h.appends.release()
    assert not h.has("tx")


def test_expiry_batches_one_append_per_partition() -> None:
    h = harness()
    ids = [f"tx-{i}" for i in range(12)]
    for txn_id in ids:
        h.init(txn_id)
    appends_before = sum(len(records) for records in h.appends.log.values())
    h.appends.hold = True
    h.advance(EXPIRATION_MS)
    partitions = {h.coordinator.partition_for(txn_id) for txn_id in ids}
    assert len(h.appends.held) == len(partitions)
    assert sum(len(records) for _, records, _ in h.appends.held) == len(ids)
    h.appends.hold = False
    h.appends.release()
    assert sum(len(records) for records in h.appends.log.values()) == appends_before + len(ids)
    assert not any(h.has(txn_id) for txn_id in ids)


def test_a_failed_fence_of_the_last_epoch_is_retried_with_it() -> None:
    h = harness()
    pid, _ = h.begin("tx", TP0)
    h.metadata("tx").producer_epoch = 32766
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    h.advance(TIMEOUT_MS + 1)
    assert (h.metadata("tx").producer_epoch, h.metadata("tx").has_failed_epoch_fence) == (32767, True)
    h.appends.fail_with = None
    h.advance(ABORT_INTERVAL_MS)
    assert h.markers[-1].producer_epoch == 32767
    h.write_markers()
    assert h.init("tx") == InitProducerIdResult(pid + 1, 0, None)


def test_the_next_deadline_follows_every_change() -> None:
    h = harness()
    t0 = h.now
    h.begin("slow", TP0)
    h.now += 10
    short = h.init("fast", timeout_ms=1000)
    assert short is not None
    h.add("fast", short.producer_id, short.producer_epoch, TP1)
    assert h.coordinator.next_deadline_ms() == t0 + 10 + 1000 + 1
    h.end("fast", short.producer_id, short.producer_epoch, True)
    assert h.coordinator.next_deadline_ms() == t0 + TIMEOUT_MS + 1  # markers out: "fast" waits for them
    h.write_markers()
    assert h.coordinator.next_deadline_ms() == t0 + TIMEOUT_MS + 1  # "fast" now expires in an hour
    pid, epoch = h.producer_ids_of("slow")
    h.end("slow", pid, epoch, False)
    h.write_markers()
    assert h.coordinator.next_deadline_ms() == t0 + 10 + EXPIRATION_MS
    h.reload()
    assert h.coordinator.next_deadline_ms() == t0 + 10 + EXPIRATION_MS


def test_the_timer_keeps_no_more_than_it_needs() -> None:
    """Each transaction moves its id's deadline (the timeout, then the expiry a week later): the superseded ones are
    not kept until they come up."""
    h = harness()
    for _ in range(300):
        for txn_id in ("a", "b", "c"):
            h.now += 1
            pid, epoch = h.begin(txn_id, TP0)
            h.end(txn_id, pid, epoch, True)
            h.write_markers()
    assert len(h.coordinator._deadlines) <= 2 * 3 + 64 + 1
    assert h.coordinator.next_deadline_ms() == h.now - 2 + EXPIRATION_MS


def test_an_id_whose_first_write_failed_expires_too() -> None:
    """Kafka's testTransactionExpirationShouldNotFailWithUninitializedTransactionMetadata: epoch -1, never written."""
    h = harness()
    h.appends.fail_with = "NOT_ENOUGH_REPLICAS"
    h.init("tx")
    h.appends.fail_with = None
    assert h.metadata("tx").producer_epoch == -1
    h.advance(EXPIRATION_MS)
    assert not h.has("tx")
    assert h.logged("tx") == [None]
