"""A transactional id's state, as Kafka's TransactionMetadata (docs/transactions.md#coordinator-states).

Every change goes in two steps, as Kafka's: `prepare_*` checks the transition and returns the target as a
TxnTransitMetadata, setting `pending_state` (which blocks any other transition meanwhile); the coordinator writes the
target to `__transaction_state` and, once written, `complete_transition_to` applies it (or, on an error, the pending
state is dropped). Transactions here follow Kafka's transaction.version 0/1 rules: the producer epoch is bumped only by
InitProducerId and by fencing, never by EndTxn (KIP-890 part 2 is not implemented).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NoReturn

from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.records import TransactionLogValue
from tierlog.records.codec import NO_PRODUCER_EPOCH

MAX_PRODUCER_EPOCH = 2**15 - 1


class IllegalTransitionError(RuntimeError):
    """A transition Kafka's coordinator treats as a bug (IllegalStateException): it never happens unless the state
    machine itself is wrong."""


class TransactionState(enum.Enum):
    """Kafka's TransactionState: the id written in TransactionLogValue.TransactionStatus and the name
    DescribeTransactions and ListTransactions use."""

    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    def __init__(self, state_id: int, state_name: str) -> None:
        self.id = state_id
        self.state_name = state_name

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        for state in cls:
            if state.id == state_id:
                return state
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        for state in cls:
            if state.state_name == name:
                return state
        return None

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        return _VALID_PREVIOUS_STATES[self]

    @property
    def is_expiration_allowed(self) -> bool:
        """A transactional id may expire only while no transaction is open."""
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


_S = TransactionState
_VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """A client never gets epoch Short.MaxValue, so the coordinator can always fence it with one more bump."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnTransitMetadata:
    """The target of a transition, as written to the log (Kafka's TxnTransitMetadata)."""

    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    txn_state: TransactionState
    topic_partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int

    def to_log_value(self) -> TransactionLogValue:
        """Kafka's TransactionLog.valueToBytes: no partitions (a null array) in Empty; topics and partitions sorted
        (Kafka's order is a hash map's, which no reader depends on)."""
        if self.txn_state is TransactionState.EMPTY:
            if self.topic_partitions:
                raise IllegalTransitionError(f"a transaction in state Empty has partitions: {self}")
            partitions = None
        else:
            by_topic: dict[str, list[int]] = {}
            for tp in self.topic_partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            partitions = tuple((topic, tuple(sorted(ids))) for topic, ids in sorted(by_topic.items()))
        return TransactionLogValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.txn_timeout_ms,
            transaction_status=self.txn_state.id,
            transaction_partitions=partitions,
            transaction_last_update_timestamp_ms=self.txn_last_update_timestamp,
            transaction_start_timestamp_ms=self.txn_start_timestamp,
        )


@dataclass(eq=False)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    txn_last_update_timestamp: int
    topic_partitions: set[TopicPartition] = field(default_factory=set)
    txn_start_timestamp: int = -1
    # The state this transaction is being written into; blocks every other transition until the write completes.
    pending_state: TransactionState | None = None
    # A fence whose bumped epoch may not have reached the log: the next fence does not bump again (the bumped epoch
    # was never returned to a client, so reusing it is safe).
    has_failed_epoch_fence: bool = False

    @classmethod
    def from_log_value(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        """Kafka's TransactionLog.readTxnRecordValue: the last epoch is not stored, and Empty has no partitions."""
        state = TransactionState.from_id(value.transaction_status)
        partitions: set[TopicPartition] = set()
        if state is not TransactionState.EMPTY:
            for topic, ids in value.transaction_partitions or ():
                partitions.update(TopicPartition(topic, p) for p in ids)
        return cls(
            transactional_id=transactional_id,
            producer_id=value.producer_id,
            previous_producer_id=value.previous_producer_id,
            producer_epoch=value.producer_epoch,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            txn_timeout_ms=value.transaction_timeout_ms,
            state=state,
            topic_partitions=partitions,
            txn_start_timestamp=value.transaction_start_timestamp_ms,
            txn_last_update_timestamp=value.transaction_last_update_timestamp_ms,
        )

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        return self.state in (TransactionState.ONGOING, TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT)

    # Preparing transitions

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        """Bump the epoch of an ongoing transaction to abort it (a new producer's InitProducerId, or the timeout)."""
        # Checked only when bumping (Kafka checks first, and so throws when a failed fence of epoch 32766 is retried).
        if not self.has_failed_epoch_fence and self.producer_epoch == MAX_PRODUCER_EPOCH:
            raise IllegalTransitionError(f"cannot fence producer {self.producer_id} at epoch {MAX_PRODUCER_EPOCH}")
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(
            TransactionState.PREPARE_EPOCH_FENCE,
            self.producer_id,
            bumped,
            NO_PRODUCER_EPOCH,
            self.txn_timeout_ms,
            frozenset(self.topic_partitions),
            self.txn_start_timestamp,
            self.txn_last_update_timestamp,
        )

    def prepare_increment_producer_epoch(
        self, new_txn_timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransitMetadata | str:
        """InitProducerId on an existing id: the epoch bump, or PRODUCER_FENCED for a stale expected epoch (KIP-360)."""
        if expected_epoch is None:
            # A new producer: bump, forget the last epoch. A just-created id (epoch -1) gets epoch 0.
            epoch, last_epoch = self.producer_epoch + 1, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            # The current producer recovering from an abortable error (or a new id): bump, remember the last epoch.
            epoch, last_epoch = self.producer_epoch + 1, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            # A retry of a bump that succeeded: the same answer again. A newer producer's InitProducerId would have
            # cleared the last epoch, so this producer was not fenced meanwhile.
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return "PRODUCER_FENCED"
        if epoch > self.producer_epoch and is_epoch_exhausted(self.producer_epoch):
            raise IllegalTransitionError(f"cannot allocate any more epochs for producer id {self.producer_id}")
        return self._prepare(
            TransactionState.EMPTY, self.producer_id, epoch, last_epoch, new_txn_timeout_ms, frozenset(), -1, now_ms
        )

    def prepare_producer_id_rotation(
        self, new_producer_id: int, new_txn_timeout_ms: int, now_ms: int, record_last_epoch: bool
    ) -> TxnTransitMetadata:
        """The epochs of the producer id are exhausted: a new producer id at epoch 0."""
        if self.has_pending_transaction:
            raise IllegalTransitionError("cannot rotate producer ids while a transaction is still pending")
        last_epoch = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._prepare(
            TransactionState.EMPTY, new_producer_id, 0, last_epoch, new_txn_timeout_ms, frozenset(), -1, now_ms
        )

    def prepare_add_partitions(self, added: frozenset[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        """The first partition starts the transaction (its start time is now)."""
        starting = self.state in (_S.EMPTY, _S.COMPLETE_ABORT, _S.COMPLETE_COMMIT)
        return self._prepare(
            TransactionState.ONGOING,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(self.topic_partitions) | added,
            now_ms if starting else self.txn_start_timestamp,
            now_ms,
        )

    def prepare_abort_or_commit(self, new_state: TransactionState, now_ms: int) -> TxnTransitMetadata:
        return self._prepare(
            new_state,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(self.topic_partitions),
            self.txn_start_timestamp,
            now_ms,
        )

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """CompleteCommit/CompleteAbort once every partition has its marker. The write succeeded, so a failed fence
        is behind us."""
        new_state = (
            TransactionState.COMPLETE_COMMIT
            if self.state is TransactionState.PREPARE_COMMIT
            else TransactionState.COMPLETE_ABORT
        )
        self.has_failed_epoch_fence = False
        return self._prepare(
            new_state,
            self.producer_id,
            self.producer_epoch,
            self.producer_epoch,
            self.txn_timeout_ms,
            frozenset(),
            self.txn_start_timestamp,
            now_ms,
        )

    def prepare_dead(self) -> TxnTransitMetadata:
        """The transactional id expires (the log gets a tombstone, the cache drops it)."""
        return self._prepare(
            TransactionState.DEAD,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            frozenset(),
            self.txn_start_timestamp,
            self.txn_last_update_timestamp,
        )

    def _prepare(
        self,
        state: TransactionState,
        producer_id: int,
        epoch: int,
        last_epoch: int,
        txn_timeout_ms: int,
        partitions: frozenset[TopicPartition],
        start_timestamp: int,
        update_timestamp: int,
    ) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: transition to {state.state_name} while {self.pending_state.state_name} "
                "is pending"
            )
        if producer_id < 0:
            raise IllegalTransitionError(f"{self.transactional_id}: illegal producer id {producer_id}")
        # A just-created id has epoch -1 and may keep it until it expires (Dead).
        if state is not TransactionState.DEAD and epoch < 0:
            raise IllegalTransitionError(f"{self.transactional_id}: illegal producer epoch {epoch}")
        if self.state not in state.valid_previous_states:
            raise IllegalTransitionError(
                f"{self.transactional_id}: no transition from {self.state.state_name} to {state.state_name}"
            )
        self.pending_state = state
        return TxnTransitMetadata(
            producer_id=producer_id,
            previous_producer_id=self.producer_id,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            txn_timeout_ms=txn_timeout_ms,
            txn_state=state,
            topic_partitions=partitions,
            txn_start_timestamp=start_timestamp,
            txn_last_update_timestamp=update_timestamp,
        )

    # Completing them

    def complete_transition_to(self, transit: TxnTransitMetadata) -> None:
        """Apply a transition whose record is in the log, after Kafka's sanity checks."""
        to_state = self.pending_state
        if to_state is None:
            raise IllegalTransitionError(f"{self.transactional_id}: completing a transition that is not pending")
        if to_state is not transit.txn_state:
            self._transition_failure(transit)
        if to_state is TransactionState.EMPTY:
            # From InitProducerId: the same epoch (a retry), one more, or 0 with a new producer id.
            bumped = transit.producer_epoch == self.producer_epoch + 1 or (
                transit.producer_epoch == 0 and transit.producer_id != self.producer_id
            )
            if (
                (self.producer_epoch != transit.producer_epoch and not bumped)
                or transit.topic_partitions
                or transit.txn_start_timestamp != -1
            ):
                self._transition_failure(transit)
            self.txn_timeout_ms = transit.txn_timeout_ms
            self.producer_epoch = transit.producer_epoch
            self.last_producer_epoch = transit.last_producer_epoch
            self.producer_id = transit.producer_id
            self.previous_producer_id = transit.previous_producer_id
        elif to_state is TransactionState.ONGOING:
            if (
                not self._same_producer(transit)
                or not self.topic_partitions <= transit.topic_partitions
                or self.txn_timeout_ms != transit.txn_timeout_ms
            ):
                self._transition_failure(transit)
            self.txn_start_timestamp = transit.txn_start_timestamp
            self.topic_partitions |= transit.topic_partitions
        elif to_state in (TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT):
            if (
                not self._same_producer(transit)
                or self.topic_partitions != transit.topic_partitions
                or self.txn_timeout_ms != transit.txn_timeout_ms
                or self.txn_start_timestamp != transit.txn_start_timestamp
            ):
                self._transition_failure(transit)
        elif to_state in (TransactionState.COMPLETE_ABORT, TransactionState.COMPLETE_COMMIT):
            if (
                not self._same_producer(transit)
                or self.txn_timeout_ms != transit.txn_timeout_ms
                or transit.txn_start_timestamp == -1
            ):
                self._transition_failure(transit)
            self.txn_start_timestamp = transit.txn_start_timestamp
            self.topic_partitions.clear()
        else:
            # PrepareEpochFence is replaced by PrepareAbort before anything is written, and Dead ends in removal
            # from the cache, never in a completed transition.
            self._transition_failure(transit)
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.pending_state = None
        self.state = to_state

    def _same_producer(self, transit: TxnTransitMetadata) -> bool:
        return transit.producer_epoch == self.producer_epoch and transit.producer_id == self.producer_id

    def _transition_failure(self, transit: TxnTransitMetadata) -> NoReturn:
        raise IllegalTransitionError(f"{self.transactional_id}: failed transition from {self} to {transit}")
