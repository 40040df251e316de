"""Kafka's TransactionCoordinator and TransactionStateManager as one deterministic state machine
(docs/transactions.md#coordinator).

Requests come in as method calls with `now_ms` and are answered through callbacks. Writes to `__transaction_state` go
through the injected `append` (the shell appends with acks=all and calls back once the HW passes the record, or with
the error); transaction markers go out through the injected `send_markers`, and the shell calls `on_markers_written`
once every partition of a TxnMarkerRequest has its marker. Deadlines (transaction timeouts, transactional id expiry,
retries of a completion write) are kept here; the shell arms one timer at `next_deadline_ms()` and calls
`on_timer(now_ms)`.

A broker coordinates the transactional ids of the `__transaction_state` partitions it leads: `on_election` marks a
partition loading (requests answer COORDINATOR_LOAD_IN_PROGRESS), `complete_load` replays its records and serves its
ids (sending the markers of transactions found in PrepareCommit/PrepareAbort again), `on_resignation` drops them
(requests answer NOT_COORDINATOR). The leader epoch of the partition is the coordinator epoch the markers carry.
"""

from __future__ import annotations

import enum
import heapq
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.records import (
    TRANSACTION_LOG_VALUE_VERSION,
    CorruptRecordError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from tierlog.coordinator.transaction.transaction_metadata import (
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from tierlog.records.codec import NO_PRODUCER_EPOCH
from tierlog.records.record_batch import NO_PRODUCER_ID

logger = logging.getLogger(__name__)

Record = tuple[bytes, bytes | None]
# on_done(error name or None, the time the append completed).
AppendCallback = Callable[[str | None, int], None]
# (partition of __transaction_state, records, now_ms, on_done).
Append = Callable[[int, list[Record], int, AppendCallback], None]
ErrorCallback = Callable[[str | None], None]

# How long a completion write (CompleteCommit/CompleteAbort) that failed waits before it is tried again; Kafka retries
# it on the marker sender's next round.
COMPLETION_RETRY_BACKOFF_MS = 100


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """The broker settings the coordinator obeys, with Kafka's defaults."""

    transactional_id_expiration_ms: int = 604800000
    transaction_max_timeout_ms: int = 900000
    transaction_state_log_num_partitions: int = 50
    # Kafka scans for timed-out transactions and expired ids at these intervals; here each has an exact deadline,
    # and the intervals are how long a failed abort or tombstone write waits before it is tried again.
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3600000
    # TransactionLogValue version written: 0 while the transaction.version feature is 0 (Kafka 3.x, and 4.x unless
    # upgraded), 1 (flexible, tagged fields) from transaction.version 1.
    log_value_version: int = TRANSACTION_LOG_VALUE_VERSION


class ProducerIdAndEpoch(NamedTuple):
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    producer_id: int
    producer_epoch: int
    error: str | None


def _init_error(error: str) -> InitProducerIdResult:
    return InitProducerIdResult(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, error)


@dataclass(frozen=True, slots=True)
class TxnMarkerRequest:
    """The markers one transaction needs: one WriteTxnMarkers entry per partition leader, built by the shell."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool
    partitions: frozenset[TopicPartition]


SendMarkers = Callable[[TxnMarkerRequest], None]


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResult:
    error: str | None
    unknown_state_filters: tuple[str, ...] = ()
    transactions: tuple[TransactionListing, ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """DescribeTransactions' TransactionState; the fields keep the response's defaults when `error` is set."""

    transactional_id: str
    error: str | None
    state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


# The first version of each API that knows PRODUCER_FENCED; older ones get INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis.
PRODUCER_FENCED_FIRST_VERSION = {"InitProducerId": 4, "AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2, "EndTxn": 2}


def error_for_version(error: str | None, api: str, version: int) -> str | None:
    """The coordinator's error as a client of `version` of `api` understands it."""
    if error == "PRODUCER_FENCED" and version < PRODUCER_FENCED_FIRST_VERSION[api]:
        return "INVALID_PRODUCER_EPOCH"
    return error


def append_error(error: str | None) -> str | None:
    """Kafka's appendTransactionToLog mapping of an append error to what the coordinator's clients see."""
    if error in ("UNKNOWN_TOPIC_OR_PARTITION", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"):
        return "COORDINATOR_NOT_AVAILABLE"
    if error == "REQUEST_TIMED_OUT":
        return "COORDINATOR_NOT_AVAILABLE"
    if error in ("NOT_LEADER_OR_FOLLOWER", "KAFKA_STORAGE_ERROR"):
        return "NOT_COORDINATOR"
    if error in ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        return "UNKNOWN_SERVER_ERROR"
    return error


class _PartitionState(enum.Enum):
    LOADING = enum.auto()
    ONLINE = enum.auto()


@dataclass(slots=True)
class _Completion:
    """A transaction between its PrepareCommit/PrepareAbort and its CompleteCommit/CompleteAbort: markers out, then
    the completion written (again after `retry_at_ms` if a write failed)."""

    request: TxnMarkerRequest
    transit: TxnTransitMetadata
    markers_written: bool = False
    retry_at_ms: int | None = None


@dataclass(slots=True)
class _Partition:
    state: _PartitionState
    coordinator_epoch: int
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)


class TransactionCoordinator:
    def __init__(
        self,
        config: TransactionConfig,
        append: Append,
        send_markers: SendMarkers,
        next_producer_id: Callable[[], int | None],
    ) -> None:
        self.config = config
        self._append = append
        self._send_markers = send_markers
        # None when no producer id block is at hand yet (the shell is fetching one): a retriable
        # COORDINATOR_LOAD_IN_PROGRESS, as Kafka's RPCProducerIdManager.
        self._next_producer_id = next_producer_id
        self._partitions: dict[int, _Partition] = {}
        self._completions: dict[str, _Completion] = {}
        # Transactional ids whose timed-out abort or expiry was tried and failed: not before this time again.
        self._timer_backoff: dict[str, int] = {}
        # When the timer acts on each id (_deadline_of), and a heap of (deadline, id) entries in which those of
        # `_scheduled` are live and the others stale (dropped when they come up, or when they outnumber the live).
        self._scheduled: dict[str, int] = {}
        self._deadlines: list[tuple[int, str]] = []

    # Partitions (loading and unloading)

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.transaction_state_log_num_partitions)

    def owned_partitions(self) -> set[int]:
        return set(self._partitions)

    def is_loading(self, partition: int) -> bool:
        entry = self._partitions.get(partition)
        return entry is not None and entry.state is _PartitionState.LOADING

    def coordinator_epoch(self, partition: int) -> int | None:
        entry = self._partitions.get(partition)
        return None if entry is None else entry.coordinator_epoch

    def on_election(self, partition: int, coordinator_epoch: int) -> bool:
        """This broker leads `partition` at `coordinator_epoch`: its ids answer COORDINATOR_LOAD_IN_PROGRESS until
        `complete_load`. A new epoch reloads (what an older epoch did is dropped); False when the partition is
        already loading or served at this epoch (nothing to do). docs/transactions.md#coordinator-loading"""
        entry = self._partitions.get(partition)
        if entry is not None and entry.coordinator_epoch == coordinator_epoch:
            return False
        self._drop_partition(partition)
        self._partitions[partition] = _Partition(_PartitionState.LOADING, coordinator_epoch)
        return True

    def complete_load(self, partition: int, coordinator_epoch: int, records: Iterable[Record], now_ms: int) -> None:
        """Replay the partition's records in offset order (the latest value of an id wins, a tombstone deletes it)
        and serve its ids; the markers of transactions in PrepareCommit/PrepareAbort go out again. Ignored when the
        partition was resigned (or re-elected at another epoch) while it was read."""
        entry = self._partitions.get(partition)
        if entry is None or entry.state is not _PartitionState.LOADING or entry.coordinator_epoch != coordinator_epoch:
            return
        loaded: dict[str, TransactionMetadata] = {}
        for key_bytes, value_bytes in records:
            try:
                transactional_id = decode_key(key_bytes)
                if transactional_id is None:
                    logger.warning("skipping a __transaction_state-%d record with an unknown key version", partition)
                    continue
                if value_bytes is None:
                    loaded.pop(transactional_id, None)
                    continue
                metadata = TransactionMetadata.from_log_value(transactional_id, decode_value(value_bytes))
                if metadata.state in (TransactionState.DEAD, TransactionState.PREPARE_EPOCH_FENCE):
                    raise CorruptRecordError(f"{metadata.state.state_name} is never written")
                loaded[transactional_id] = metadata
            except ValueError as e:
                # Kafka stops the load at a record it cannot read; skipping one keeps every other id served.
                logger.error("skipping an unreadable __transaction_state-%d record: %s", partition, e)
        entry.state = _PartitionState.ONLINE
        entry.transactions = loaded
        for metadata in loaded.values():
            self._schedule(metadata)
        logger.info(
            "loaded %d transactional ids of __transaction_state-%d at coordinator epoch %d",
            len(loaded),
            partition,
            coordinator_epoch,
        )
        for metadata in loaded.values():
            if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                self._complete_transaction(metadata, coordinator_epoch, now_ms)

    def on_resignation(self, partition: int, coordinator_epoch: int | None) -> None:
        """Another broker leads `partition`: drop its ids (requests answer NOT_COORDINATOR, markers in flight are
        abandoned: the new coordinator sends them again). A resignation of an older epoch than the one this broker
        serves is stale and ignored; None (the partition was deleted) drops whatever is there."""
        entry = self._partitions.get(partition)
        if entry is None or (coordinator_epoch is not None and coordinator_epoch < entry.coordinator_epoch):
            return
        self._drop_partition(partition)

    def _drop_partition(self, partition: int) -> None:
        entry = self._partitions.pop(partition, None)
        if entry is None:
            return
        for transactional_id in entry.transactions:
            self._completions.pop(transactional_id, None)
            self._timer_backoff.pop(transactional_id, None)
            self._scheduled.pop(transactional_id, None)

    def _lookup(self, transactional_id: str) -> tuple[str | None, int, TransactionMetadata | None]:
        """(error, coordinator epoch, metadata or None): Kafka's getTransactionState."""
        entry = self._partitions.get(self.partition_for(transactional_id))
        if entry is None:
            return "NOT_COORDINATOR", -1, None
        if entry.state is _PartitionState.LOADING:
            return "COORDINATOR_LOAD_IN_PROGRESS", entry.coordinator_epoch, None
        return None, entry.coordinator_epoch, entry.transactions.get(transactional_id)

    def _current(self, transactional_id: str, coordinator_epoch: int) -> TransactionMetadata | None:
        """The metadata of an id if this broker still serves it at `coordinator_epoch`."""
        error, epoch, metadata = self._lookup(transactional_id)
        if error is not None or epoch != coordinator_epoch:
            return None
        return metadata

    # Writing to __transaction_state

    def _append_transit(
        self,
        transactional_id: str,
        coordinator_epoch: int,
        transit: TxnTransitMetadata,
        now_ms: int,
        on_done: AppendCallback,
        retry_on_error: Callable[[str], bool] = lambda error: False,
    ) -> None:
        """Kafka's appendTransactionToLog: write the target state; once written, complete the transition if this
        broker still serves the id at the same coordinator epoch (else NOT_COORDINATOR). A failed write drops the
        pending state, unless `retry_on_error` keeps it for a retry."""
        lookup_error, epoch, metadata = self._lookup(transactional_id)
        if lookup_error is not None or metadata is None or epoch != coordinator_epoch:
            # The partition moved since the transition was prepared: never write with an old coordinator epoch.
            on_done(lookup_error or "NOT_COORDINATOR", now_ms)
            return
        records: list[Record] = [
            (encode_key(transactional_id), encode_value(transit.to_log_value(), self.config.log_value_version))
        ]

        def appended(error: str | None, done_ms: int) -> None:
            error = append_error(error)
            lookup_error, epoch, metadata = self._lookup(transactional_id)
            served = metadata if lookup_error is None and epoch == coordinator_epoch else None
            if error is None:
                if served is not None:
                    served.complete_transition_to(transit)
                else:
                    error = lookup_error or "NOT_COORDINATOR"
            elif served is not None and not retry_on_error(error):
                served.pending_state = None
            if served is not None:
                self._schedule(served)
            on_done(error, done_ms)

        self._append(self.partition_for(transactional_id), records, now_ms, appended)

    # InitProducerId

    def handle_init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        expected: ProducerIdAndEpoch | None,
        now_ms: int,
        callback: Callable[[InitProducerIdResult], None],
    ) -> None:
        """docs/transactions.md#coordinator-init"""
        if transactional_id is None:
            # An idempotent producer: a fresh producer id, always.
            producer_id = self._next_producer_id()
            if producer_id is None:
                callback(_init_error("COORDINATOR_LOAD_IN_PROGRESS"))
            else:
                callback(InitProducerIdResult(producer_id, 0, None))
            return
        if not transactional_id:
            callback(_init_error("INVALID_REQUEST"))
            return
        if not 0 < transaction_timeout_ms <= self.config.transaction_max_timeout_ms:
            callback(_init_error("INVALID_TRANSACTION_TIMEOUT"))
            return
        error, coordinator_epoch, metadata = self._lookup(transactional_id)
        if error is not None:
            callback(_init_error(error))
            return
        if metadata is None:
            producer_id = self._next_producer_id()
            if producer_id is None:
                callback(_init_error("COORDINATOR_LOAD_IN_PROGRESS"))
                return
            # Cached before it is written, as Kafka's: a failed write leaves an Empty id at epoch -1 that the retry
            # bumps to 0.
            metadata = TransactionMetadata(
                transactional_id=transactional_id,
                producer_id=producer_id,
                previous_producer_id=NO_PRODUCER_ID,
                producer_epoch=NO_PRODUCER_EPOCH,
                last_producer_epoch=NO_PRODUCER_EPOCH,
                txn_timeout_ms=transaction_timeout_ms,
                state=TransactionState.EMPTY,
                txn_last_update_timestamp=now_ms,
            )
            self._partitions[self.partition_for(transactional_id)].transactions[transactional_id] = metadata
        prepared = self._prepare_init_producer_id(metadata, transaction_timeout_ms, expected, now_ms)
        if isinstance(prepared, str):
            callback(_init_error(prepared))
            return
        transit = prepared
        if transit.txn_state is TransactionState.PREPARE_EPOCH_FENCE:
            # Abort the ongoing transaction with the bumped epoch; the producer retries (CONCURRENT_TRANSACTIONS) and
            # its retry bumps the epoch once more (or rotates the producer id if the fence used the last epoch).
            def fenced(end_error: str | None) -> None:
                callback(_init_error(end_error or "CONCURRENT_TRANSACTIONS"))

            self._end_transaction(
                transactional_id, transit.producer_id, transit.producer_epoch, False, False, now_ms, fenced
            )
            return

        def written(append_err: str | None, done_ms: int) -> None:
            if append_err is None:
                logger.info(
                    "initialized transactional id %s with producer id %d and epoch %d",
                    transactional_id,
                    transit.producer_id,
                    transit.producer_epoch,
                )
                callback(InitProducerIdResult(transit.producer_id, transit.producer_epoch, None))
            else:
                callback(_init_error(append_err))

        self._append_transit(transactional_id, coordinator_epoch, transit, now_ms, written)

    def _prepare_init_producer_id(
        self,
        metadata: TransactionMetadata,
        transaction_timeout_ms: int,
        expected: ProducerIdAndEpoch | None,
        now_ms: int,
    ) -> TxnTransitMetadata | str:
        if metadata.pending_state is not None:
            return "CONCURRENT_TRANSACTIONS"
        if expected is not None and not self._is_valid_expected_producer(metadata, expected):
            return "PRODUCER_FENCED"
        state = metadata.state
        if state in (TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT):
            return "CONCURRENT_TRANSACTIONS"
        if state in (TransactionState.COMPLETE_ABORT, TransactionState.COMPLETE_COMMIT, TransactionState.EMPTY):
            if metadata.is_producer_epoch_exhausted and (expected is None or expected.epoch == metadata.producer_epoch):
                producer_id = self._next_producer_id()
                if producer_id is None:
                    return "COORDINATOR_LOAD_IN_PROGRESS"
                return metadata.prepare_producer_id_rotation(
                    producer_id, transaction_timeout_ms, now_ms, record_last_epoch=expected is not None
                )
            return metadata.prepare_increment_producer_epoch(
                transaction_timeout_ms, None if expected is None else expected.epoch, now_ms
            )
        if state is TransactionState.ONGOING:
            # Never returned to a client: the abort goes out with it, the client retries and bumps again.
            return metadata.prepare_fence_producer_epoch()
        raise AssertionError(f"{metadata.transactional_id} is in state {state.state_name}, never a completed state")

    @staticmethod
    def _is_valid_expected_producer(metadata: TransactionMetadata, expected: ProducerIdAndEpoch) -> bool:
        """KIP-360: a producer that names its id and epoch is fenced unless the id was just created (a producer
        recovering from UNKNOWN_PRODUCER_ID), its producer id is the current one (the epoch is checked by the bump),
        or it is the previous one with an exhausted epoch (a retry of a rotation whose answer was lost)."""
        return (
            metadata.producer_epoch == NO_PRODUCER_EPOCH
            or expected.producer_id == metadata.producer_id
            or (expected.producer_id == metadata.previous_producer_id and is_epoch_exhausted(expected.epoch))
        )

    # AddPartitionsToTxn (and AddOffsetsToTxn: the group's __consumer_offsets partition)

    def handle_add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
        callback: Callable[[dict[TopicPartition, str | None]], None],
    ) -> None:
        """docs/transactions.md#coordinator-add"""
        added = frozenset(partitions)

        def respond(error: str | None) -> None:
            callback(dict.fromkeys(added, error))

        if not transactional_id:
            respond("INVALID_REQUEST")
            return
        error, coordinator_epoch, metadata = self._lookup(transactional_id)
        if error is not None:
            respond(error)
            return
        if metadata is None or metadata.producer_id != producer_id:
            respond("INVALID_PRODUCER_ID_MAPPING")
        elif metadata.producer_epoch != producer_epoch:
            respond("PRODUCER_FENCED")
        elif metadata.pending_state is not None or metadata.state in (
            TransactionState.PREPARE_COMMIT,
            TransactionState.PREPARE_ABORT,
        ):
            respond("CONCURRENT_TRANSACTIONS")
        elif metadata.state is TransactionState.ONGOING and added <= metadata.topic_partitions:
            respond(None)
        else:
            transit = metadata.prepare_add_partitions(added, now_ms)
            self._append_transit(
                transactional_id, coordinator_epoch, transit, now_ms, lambda err, done_ms: respond(err)
            )

    # EndTxn

    def handle_end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
        callback: ErrorCallback,
    ) -> None:
        self._end_transaction(transactional_id, producer_id, producer_epoch, commit, True, now_ms, callback)

    def _end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        from_client: bool,
        now_ms: int,
        callback: ErrorCallback,
    ) -> None:
        """Kafka's endTransaction (transaction.version 0/1): a client must name the current epoch; the coordinator
        itself (a fence, a timeout) aborts with a bumped one. docs/transactions.md#coordinator-end"""
        if not transactional_id:
            callback("INVALID_REQUEST")
            return
        error, coordinator_epoch, metadata = self._lookup(transactional_id)
        if error is not None:
            callback(error)
            return
        if metadata is None or metadata.producer_id != producer_id:
            callback("INVALID_PRODUCER_ID_MAPPING")
            return
        if (from_client and producer_epoch != metadata.producer_epoch) or producer_epoch < metadata.producer_epoch:
            callback("PRODUCER_FENCED")
            return
        fencing = metadata.pending_state is TransactionState.PREPARE_EPOCH_FENCE
        if metadata.pending_state is not None and not fencing:
            callback("CONCURRENT_TRANSACTIONS")
            return
        state = metadata.state
        prepare_state = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
        complete_state = TransactionState.COMPLETE_COMMIT if commit else TransactionState.COMPLETE_ABORT
        if state is not TransactionState.ONGOING:
            if state in (TransactionState.DEAD, TransactionState.PREPARE_EPOCH_FENCE):
                raise AssertionError(f"{transactional_id} is in state {state.state_name}, never a completed state")
            if state is complete_state:
                # A retry of an EndTxn that completed.
                callback(None)
            elif state is prepare_state:
                callback("CONCURRENT_TRANSACTIONS")
            else:
                logger.debug("%s is %s: no %s", transactional_id, state.state_name, "commit" if commit else "abort")
                callback("INVALID_TXN_STATE")
            return
        if fencing:
            # The fence's bumped epoch goes into the PrepareAbort written now.
            metadata.pending_state = None
            metadata.producer_epoch = producer_epoch
            metadata.last_producer_epoch = NO_PRODUCER_EPOCH
        transit = metadata.prepare_abort_or_commit(prepare_state, now_ms)

        def prepared(append_err: str | None, done_ms: int) -> None:
            if append_err is not None:
                current = self._current(transactional_id, coordinator_epoch)
                if fencing and current is not None:
                    # The bumped epoch may or may not be in the log; the next fence reuses it.
                    current.has_failed_epoch_fence = True
                    logger.warning(
                        "the fence of %s at epoch %d failed to be written: %s",
                        transactional_id,
                        producer_epoch,
                        append_err,
                    )
                callback(append_err)
                return
            current = self._current(transactional_id, coordinator_epoch)
            if current is None:
                callback("NOT_COORDINATOR")
            elif current.producer_id != producer_id:
                callback("INVALID_PRODUCER_ID_MAPPING")
            elif current.producer_epoch != producer_epoch:
                callback("PRODUCER_FENCED")
            elif current.pending_state is not None:
                callback("CONCURRENT_TRANSACTIONS")
            elif current.state is not prepare_state:
                callback("INVALID_TXN_STATE")
            else:
                # The decision is in the log: the client has its answer, the markers follow.
                callback(None)
                self._complete_transaction(current, coordinator_epoch, done_ms)

        self._append_transit(transactional_id, coordinator_epoch, transit, now_ms, prepared)

    # Markers and the completion

    def _complete_transaction(self, metadata: TransactionMetadata, coordinator_epoch: int, now_ms: int) -> None:
        """Send the markers of a transaction in PrepareCommit/PrepareAbort; CompleteCommit/CompleteAbort is written
        once every partition has its marker (at once when it has none). docs/transactions.md#coordinator-markers"""
        transit = metadata.prepare_complete(now_ms)
        request = TxnMarkerRequest(
            transactional_id=metadata.transactional_id,
            producer_id=metadata.producer_id,
            producer_epoch=metadata.producer_epoch,
            coordinator_epoch=coordinator_epoch,
            committed=metadata.state is TransactionState.PREPARE_COMMIT,
            partitions=frozenset(metadata.topic_partitions),
        )
        self._completions[metadata.transactional_id] = _Completion(request, transit)
        if request.partitions:
            self._send_markers(request)
        else:
            self._write_completion(metadata.transactional_id, now_ms)

    def is_marker_request_current(self, request: TxnMarkerRequest) -> bool:
        """Whether the coordinator still waits for these markers; the shell stops sending (and retrying) them when
        not, as Kafka's marker channel does when the coordinator epoch changed or the partition moved."""
        completion = self._completions.get(request.transactional_id)
        return completion is not None and completion.request == request and not completion.markers_written

    def on_markers_written(
        self, transactional_id: str, producer_id: int, producer_epoch: int, coordinator_epoch: int, now_ms: int
    ) -> None:
        """Every partition of the transaction's TxnMarkerRequest has its marker: write CompleteCommit/CompleteAbort."""
        completion = self._completions.get(transactional_id)
        if completion is None or completion.markers_written:
            return
        request = completion.request
        if (request.producer_id, request.producer_epoch, request.coordinator_epoch) != (
            producer_id,
            producer_epoch,
            coordinator_epoch,
        ):
            logger.info("markers of %s for an older transaction or coordinator epoch: ignored", transactional_id)
            return
        completion.markers_written = True
        self._write_completion(transactional_id, now_ms)

    def _write_completion(self, transactional_id: str, now_ms: int) -> None:
        completion = self._completions[transactional_id]
        completion.markers_written = True
        completion.retry_at_ms = None
        coordinator_epoch = completion.request.coordinator_epoch

        def written(error: str | None, done_ms: int) -> None:
            if self._completions.get(transactional_id) is not completion:
                return
            if error is None:
                del self._completions[transactional_id]
                logger.debug("completed the transaction of %s", transactional_id)
            elif error in ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"):
                # The next coordinator of the partition loads the transaction in Prepare* and completes it.
                del self._completions[transactional_id]
                logger.info("not completing the transaction of %s here: %s", transactional_id, error)
            else:
                if error != "COORDINATOR_NOT_AVAILABLE":
                    logger.error("writing the completion of %s failed: %s; retrying", transactional_id, error)
                completion.retry_at_ms = done_ms + COMPLETION_RETRY_BACKOFF_MS

        self._append_transit(
            transactional_id,
            coordinator_epoch,
            completion.transit,
            now_ms,
            written,
            retry_on_error=lambda error: error not in ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"),
        )

    # Timers: timed-out transactions, expired transactional ids, completion retries

    def _online(self) -> Iterable[_Partition]:
        return (p for p in self._partitions.values() if p.state is _PartitionState.ONLINE)

    def _deadline_of(self, metadata: TransactionMetadata) -> int | None:
        """When the timer acts on an id with no write pending: an Ongoing transaction is aborted once start + timeout
        is past (Kafka's strict `<`); an id with no open transaction expires transactional.id.expiration.ms after its
        last update. Not before the backoff of a failed attempt."""
        if metadata.pending_state is not None:
            return None
        if metadata.state is TransactionState.ONGOING:
            deadline = metadata.txn_start_timestamp + metadata.txn_timeout_ms + 1
        elif metadata.state.is_expiration_allowed:
            deadline = metadata.txn_last_update_timestamp + self.config.transactional_id_expiration_ms
        else:
            return None
        return max(deadline, self._timer_backoff.get(metadata.transactional_id, deadline))

    def _schedule(self, metadata: TransactionMetadata) -> None:
        """Note the id's deadline after a change of its state."""
        self._set_deadline(metadata.transactional_id, self._deadline_of(metadata))

    def _set_deadline(self, transactional_id: str, deadline: int | None) -> None:
        if deadline is None:
            self._scheduled.pop(transactional_id, None)
            return
        if self._scheduled.get(transactional_id) == deadline:
            return
        self._scheduled[transactional_id] = deadline
        heapq.heappush(self._deadlines, (deadline, transactional_id))
        if len(self._deadlines) > 2 * len(self._scheduled) + 64:
            # Every transaction moves its id's deadline (timeout, then expiry a week on): rebuild rather than keep
            # the stale entries until they come up.
            self._deadlines = [(d, t) for t, d in self._scheduled.items()]
            heapq.heapify(self._deadlines)

    def _current_deadline(self, transactional_id: str) -> tuple[TransactionMetadata | None, int | None]:
        error, _, metadata = self._lookup(transactional_id)
        if error is not None or metadata is None:
            return None, None
        return metadata, self._deadline_of(metadata)

    def next_deadline_ms(self) -> int | None:
        while self._deadlines:
            deadline, transactional_id = self._deadlines[0]
            if self._scheduled.get(transactional_id) == deadline:
                # A write may be pending since (its completion schedules again): check the id itself.
                _, current = self._current_deadline(transactional_id)
                if current == deadline:
                    break
                heapq.heappop(self._deadlines)
                self._scheduled.pop(transactional_id, None)
                self._set_deadline(transactional_id, current)
            else:
                heapq.heappop(self._deadlines)
        deadlines = [c.retry_at_ms for c in self._completions.values() if c.retry_at_ms is not None]
        if self._deadlines:
            deadlines.append(self._deadlines[0][0])
        return min(deadlines, default=None)

    def on_timer(self, now_ms: int) -> None:
        """Everything whose deadline is at or before `now_ms` (docs/transactions.md#coordinator-timers)."""
        for transactional_id, completion in list(self._completions.items()):
            if completion.retry_at_ms is not None and completion.retry_at_ms <= now_ms:
                self._write_completion(transactional_id, now_ms)
        due: dict[str, TransactionMetadata] = {}
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, transactional_id = heapq.heappop(self._deadlines)
            if self._scheduled.get(transactional_id) != deadline:
                continue
            del self._scheduled[transactional_id]
            metadata, current = self._current_deadline(transactional_id)
            if metadata is not None and current is not None and current <= now_ms:
                due[transactional_id] = metadata
            else:
                self._set_deadline(transactional_id, current)
        timed_out = [m for m in due.values() if m.state is TransactionState.ONGOING]
        expired = [m for m in due.values() if m.state is not TransactionState.ONGOING]
        self._abort_timed_out_transactions(timed_out, now_ms)
        self._remove_expired_transactional_ids(expired, now_ms)

    def _abort_timed_out_transactions(self, timed_out: list[TransactionMetadata], now_ms: int) -> None:
        """Kafka's abortTimedOutTransactions: fence the producer (epoch bump) and abort."""
        for metadata in timed_out:
            transactional_id = metadata.transactional_id
            self._timer_backoff[transactional_id] = (
                now_ms + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
            )
            transit = metadata.prepare_fence_producer_epoch()

            def aborted(error: str | None, transactional_id: str = transactional_id) -> None:
                if error is None:
                    self._timer_backoff.pop(transactional_id, None)
                    logger.info("aborted the timed-out transaction of %s", transactional_id)
                elif error in ("INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED", "CONCURRENT_TRANSACTIONS"):
                    logger.debug("the timed-out transaction of %s was not aborted: %s", transactional_id, error)
                else:
                    logger.warning("aborting the timed-out transaction of %s failed: %s", transactional_id, error)

            self._end_transaction(
                transactional_id, transit.producer_id, transit.producer_epoch, False, False, now_ms, aborted
            )

    def _remove_expired_transactional_ids(self, expired: list[TransactionMetadata], now_ms: int) -> None:
        """Kafka's removeExpiredTransactionalIds: a tombstone per expired id, one append per partition; an id leaves
        the cache once its tombstone is written."""
        by_partition: dict[int, list[tuple[TransactionMetadata, TxnTransitMetadata]]] = {}
        for metadata in expired:
            self._timer_backoff[metadata.transactional_id] = (
                now_ms + self.config.transaction_remove_expired_transaction_cleanup_interval_ms
            )
            partition = self.partition_for(metadata.transactional_id)
            by_partition.setdefault(partition, []).append((metadata, metadata.prepare_dead()))
        for partition, tombstones in by_partition.items():
            coordinator_epoch = self._partitions[partition].coordinator_epoch

            def written(
                error: str | None,
                done_ms: int,
                tombstones: list[tuple[TransactionMetadata, TxnTransitMetadata]] = tombstones,
                coordinator_epoch: int = coordinator_epoch,
            ) -> None:
                for metadata, transit in tombstones:
                    transactional_id = metadata.transactional_id
                    if self._current(transactional_id, coordinator_epoch) is not metadata:
                        continue
                    if (
                        error is None
                        and metadata.pending_state is TransactionState.DEAD
                        and metadata.producer_epoch == transit.producer_epoch
                    ):
                        del self._partitions[self.partition_for(transactional_id)].transactions[transactional_id]
                        self._timer_backoff.pop(transactional_id, None)
                        self._scheduled.pop(transactional_id, None)
                        logger.info("transactional id %s expired", transactional_id)
                    else:
                        logger.warning("the tombstone of expired %s failed: %s", transactional_id, error)
                        metadata.pending_state = None
                        self._schedule(metadata)

            self._append(partition, [(encode_key(m.transactional_id), None) for m, _ in tombstones], now_ms, written)

    # ListTransactions and DescribeTransactions (KIP-664)

    def list_transactions(
        self,
        state_filters: Iterable[str],
        producer_id_filters: Iterable[int],
        duration_filter_ms: int = -1,
        now_ms: int | None = None,
    ) -> ListTransactionsResult:
        """The ids this broker coordinates, filtered as ListTransactions asks (an empty filter matches all; a
        duration filter >= 0, KIP-994, keeps transactions running longer than it and needs `now_ms`).
        docs/transactions.md#coordinator-list"""
        if any(p.state is _PartitionState.LOADING for p in self._partitions.values()):
            return ListTransactionsResult("COORDINATOR_LOAD_IN_PROGRESS")
        if duration_filter_ms >= 0 and now_ms is None:
            raise ValueError("a duration filter needs now_ms")
        state_names = list(state_filters)
        states = {s for name in state_names if (s := TransactionState.from_name(name)) is not None}
        unknown = tuple(name for name in state_names if TransactionState.from_name(name) is None)
        producer_ids = set(producer_id_filters)
        listings = []
        for partition in self._online():
            for metadata in partition.transactions.values():
                if metadata.state is TransactionState.DEAD:
                    continue
                if producer_ids and metadata.producer_id not in producer_ids:
                    continue
                if state_names and metadata.state not in states:
                    continue
                running_ms = None if now_ms is None else now_ms - metadata.txn_start_timestamp
                if running_ms is not None and duration_filter_ms >= 0 and running_ms <= duration_filter_ms:
                    continue
                listings.append(
                    TransactionListing(metadata.transactional_id, metadata.producer_id, metadata.state.state_name)
                )
        listings.sort(key=lambda listing: listing.transactional_id)
        return ListTransactionsResult(None, unknown, tuple(listings))

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        if not transactional_id:
            return TransactionDescription(transactional_id, "INVALID_REQUEST")
        error, _, metadata = self._lookup(transactional_id)
        if error is not None:
            return TransactionDescription(transactional_id, error)
        if metadata is None or metadata.state is TransactionState.DEAD:
            return TransactionDescription(transactional_id, "TRANSACTIONAL_ID_NOT_FOUND")
        by_topic: dict[str, list[int]] = {}
        for tp in metadata.topic_partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return TransactionDescription(
            transactional_id=transactional_id,
            error=None,
            state=metadata.state.state_name,
            transaction_timeout_ms=metadata.txn_timeout_ms,
            transaction_start_time_ms=metadata.txn_start_timestamp,
            producer_id=metadata.producer_id,
            producer_epoch=metadata.producer_epoch,
            topics=tuple((topic, tuple(sorted(ids))) for topic, ids in sorted(by_topic.items())),
        )
