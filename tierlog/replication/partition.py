"""One partition replica on this broker: its log, its role, the HW rule and ISR membership
(docs/replication.md#leader-hw, #follower-hw, #isr-shrink, #isr-expand).

Leader side (Kafka's Partition + Replica): per follower a `ReplicaState` (its remote LEO, the fetch offset
of its latest FETCH, and when it was last caught up). After every append, follower fetch, ISR change or
leadership change the leader applies
    HW = max(HW, min(leader LEO, LEO of every maximal-ISR member, LEO of caught-up eligible replicas))
and never while the committed ISR is smaller than min(min.insync.replicas, replica count) (Kafka 3.7+), so an
acknowledged acks=all write is never exposed before it is on enough replicas. ISR changes are proposed to
the controller one at a time (`AlterPartitionProposal`): an expansion counts for the HW at once (the maximal
ISR), a shrink only once the controller commits it.

Follower side: fetched batches are appended as the leader wrote them, then HW = min(leader HW, own LEO) and
the log start follows the leader's. Where to truncate is the fetcher's decision (replication/fetcher.py).

Every change of LEO, HW, remote LEO, ISR, leader epoch and log start is a TraceEvent for the sink.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.metadata.image import IsrChange, PartitionRegistration
from tierlog.replication import trace
from tierlog.replication.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)
from tierlog.replication.trace import TraceEvent, TraceSink, ignore_trace
from tierlog.storage.errors import (
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    UnexpectedAppendOffsetError,
)
from tierlog.storage.file_records import FileSlice
from tierlog.storage.log import LATEST_TIMESTAMP, MAX_TIMESTAMP, Log, LogAppendInfo
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.transaction_index import AbortedTxn

NO_EPOCH = -1
# Kafka's UnifiedLog.UnknownOffset: a new leader knows no follower's LEO until that follower fetches.
UNKNOWN_OFFSET = -1
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000

# AlterPartition errors after which the controller holds a newer partition state: the proposal stays in
# flight (blocking further proposals) until that state reaches us as metadata, as in Kafka.
# NEW_LEADER_ELECTED: the ISR change was committed and completed a reassignment that moved the leadership away
# (docs/reassignment.md#completion); the metadata makes this replica a follower, or removes it.
_WAIT_FOR_METADATA_ERRORS = frozenset(
    {"FENCED_LEADER_EPOCH", "INVALID_UPDATE_VERSION", "UNKNOWN_TOPIC_OR_PARTITION", "NEW_LEADER_ELECTED"}
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LogReadResult:
    records: FileSlice | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    log_end_offset: int
    # (epoch, end offset) when a follower's last fetched epoch ended earlier on the leader (KIP-595's
    # DivergingEpoch): the follower must truncate before it may fetch.
    diverging_epoch: tuple[int, int] | None = None
    # Set instead of records when a consumer's offset lives only in the remote tier: the ReplicaManager has
    # it read from there (Kafka's RemoteStorageFetchInfo).
    remote_fetch: RemoteFetchInfo | None = None
    # A read_committed read's aborted transactions that overlap the records (docs/transactions.md#fetch); None
    # for any other read, as Kafka's FetchDataInfo.abortedTransactions.
    aborted_transactions: tuple[AbortedTxn, ...] | None = None

    @property
    def size(self) -> int:
        return self.records.size if self.records is not None else 0


@dataclass(frozen=True, slots=True)
class RemoteFetchInfo:
    """What a consumer's fetch reads from the remote tier (Kafka's RemoteStorageFetchInfo)."""

    topic_id: uuid.UUID
    fetch_offset: int
    max_bytes: int
    min_one_message: bool
    # The epoch of the fetch offset in this leader's history: remote segments are looked up by (epoch,
    # offset), so a copy from another lineage is never served.
    leader_epoch: int | None
    # A read_committed consumer's: its answer carries the aborted transactions (docs/transactions.md#tiered).
    read_committed: bool = False


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(slots=True)
class ReplicaState:
    """The leader's view of one follower (Kafka's ReplicaState)."""

    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0

    def is_caught_up(self, leader_end_offset: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
        return (
            self.log_end_offset == leader_end_offset or now_ms - self.last_caught_up_time_ms <= replica_lag_time_max_ms
        )


@dataclass(frozen=True, slots=True)
class AlterPartitionProposal:
    """An ISR change the leader asks the controller to commit, compare-and-set against partition_epoch."""

    topic_partition: TopicPartition
    topic_id: uuid.UUID
    leader_epoch: int
    partition_epoch: int
    new_isr: list[int]

    def isr_change(self) -> IsrChange:
        """The change as the controller decides it."""
        return IsrChange(
            self.topic_id, self.topic_partition.partition, self.leader_epoch, self.partition_epoch, self.new_isr
        )


class Partition:
    def __init__(
        self,
        topic_partition: TopicPartition,
        topic_id: uuid.UUID,
        log: Log,
        local_broker_id: int,
        *,
        is_replica_eligible: Callable[[int], bool],
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        trace: TraceSink = ignore_trace,
    ) -> None:
        self.topic_partition = topic_partition
        self.topic_id = topic_id
        self.log = log
        self.local_broker_id = local_broker_id
        self.is_replica_eligible = is_replica_eligible
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self._trace = trace
        self.leader_id = -1
        self.leader_epoch = NO_EPOCH
        self.partition_epoch = NO_EPOCH
        self.replicas: list[int] = []
        self.isr: list[int] = []
        self.remote_replicas: dict[int, ReplicaState] = {}
        self._proposal: AlterPartitionProposal | None = None
        self._proposal_sent = False
        # The LEO when this leader epoch began: a follower below it cannot join the ISR (it may still
        # hold a diverging tail of an older epoch).
        self._leader_epoch_start_offset = UNKNOWN_OFFSET

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def maximal_isr(self) -> list[int]:
        """The committed ISR plus the members of an expansion in flight (a shrink in flight removes nobody)."""
        if self._proposal is None:
            return list(self.isr)
        return self.isr + [b for b in self._proposal.new_isr if b not in self.isr]

    @property
    def alter_partition_in_flight(self) -> bool:
        return self._proposal is not None

    def _emit(
        self, attribute: str, phase: str, old: int | list[int], new: int | list[int], why: str, now_ms: int
    ) -> None:
        if old != new:
            self._trace(TraceEvent(self.topic_partition, self.local_broker_id, attribute, phase, old, new, why, now_ms))

    # Role changes

    def make_leader(self, registration: PartitionRegistration, now_ms: int) -> bool:
        """Adopt a registration naming this broker leader; True if leadership or the leader epoch is new.

        A new epoch starts at our LEO (docs/replication.md#leader-epoch) and forgets every follower's LEO. The
        same epoch with a newer partition epoch is an ISR or assignment change the controller committed."""
        if registration.leader_epoch < self.leader_epoch:
            return False
        was_leader = self.is_leader
        if was_leader and registration.leader_epoch == self.leader_epoch:
            if registration.partition_epoch <= self.partition_epoch:
                return False
            why = f"controller committed partition epoch {registration.partition_epoch}"
            self._adopt_assignment(registration, trace.ALTER_PARTITION, why, now_ms)
            self._clear_proposal()
            self._reset_remote_replicas(keep=self.remote_replicas, now_ms=now_ms)
            self.maybe_increment_leader_hw(now_ms, trace.ALTER_PARTITION)
            return False
        log = self.log
        leo = log.log_end_offset
        old_epoch = self.leader_epoch
        self.leader_id = registration.leader
        self.leader_epoch = registration.leader_epoch
        self._emit(
            trace.LEADER_EPOCH, trace.BECOME_LEADER, old_epoch, self.leader_epoch, f"starts at LEO {leo}", now_ms
        )
        self._adopt_assignment(registration, trace.BECOME_LEADER, f"leader epoch {self.leader_epoch}", now_ms)
        log.leader_epoch_cache.assign(self.leader_epoch, leo)
        self._leader_epoch_start_offset = leo
        self._clear_proposal()
        previous = self.remote_replicas if was_leader else {}
        self._reset_remote_replicas(keep={}, now_ms=now_ms)
        for broker_id in self.remote_replicas:
            old = previous.get(broker_id)
            if old is not None:
                self._emit(
                    trace.remote_leo(broker_id),
                    trace.BECOME_LEADER,
                    old.log_end_offset,
                    UNKNOWN_OFFSET,
                    f"unknown in leader epoch {self.leader_epoch} until broker {broker_id} fetches",
                    now_ms,
                )
        self.maybe_increment_leader_hw(now_ms, trace.BECOME_LEADER)
        return True

    def _reset_remote_replicas(self, keep: dict[int, ReplicaState], now_ms: int) -> None:
        """One state per follower, kept from `keep` or new (Kafka's resetReplicaState): LEO unknown until it
        fetches; caught up now if in the ISR (none is shrunk at once), else never (so a follower that does not
        fetch is not waited for by the HW rule, where its unknown LEO would stop the HW)."""
        self.remote_replicas = {
            b: keep.get(b) or ReplicaState(last_caught_up_time_ms=now_ms if b in self.isr else 0)
            for b in self.replicas
            if b != self.local_broker_id
        }

    def make_follower(self, registration: PartitionRegistration, now_ms: int) -> bool:
        """Adopt a registration naming another broker (or nobody) leader. True when the fetcher must
        (re)start this partition: the leader or leader epoch changed, or this broker led it."""
        if registration.leader_epoch < self.leader_epoch:
            return False
        changed = (
            self.is_leader or registration.leader != self.leader_id or registration.leader_epoch != self.leader_epoch
        )
        if not changed and registration.partition_epoch <= self.partition_epoch:
            return False
        old_epoch = self.leader_epoch
        self.leader_id = registration.leader
        self.leader_epoch = registration.leader_epoch
        self._emit(
            trace.LEADER_EPOCH,
            trace.BECOME_FOLLOWER,
            old_epoch,
            self.leader_epoch,
            f"leader is broker {self.leader_id}",
            now_ms,
        )
        self._adopt_assignment(registration, trace.BECOME_FOLLOWER, f"leader epoch {self.leader_epoch}", now_ms)
        self.remote_replicas = {}
        self._clear_proposal()
        self._leader_epoch_start_offset = UNKNOWN_OFFSET
        return changed

    def _adopt_assignment(self, registration: PartitionRegistration, phase: str, why: str, now_ms: int) -> None:
        self.replicas = list(registration.replicas)
        self._adopt_isr(registration, phase, why, now_ms)

    def _adopt_isr(self, registration: PartitionRegistration, phase: str, why: str, now_ms: int) -> None:
        old_isr = self.isr
        self.isr = list(registration.isr)
        self.partition_epoch = registration.partition_epoch
        self._emit(trace.ISR, phase, old_isr, self.isr, why, now_ms)

    def _clear_proposal(self) -> None:
        self._proposal = None
        self._proposal_sent = False

    # High watermark

    def maybe_increment_leader_hw(self, now_ms: int, phase: str) -> bool:
        """Apply the HW rule; returns whether HW moved (delayed fetches and produces may then complete)."""
        if not self.is_leader:
            return False
        log = self.log
        if len(self.isr) < min(log.config.min_insync_replicas, len(self.replicas)):
            return False
        leader_end_offset = log.log_end_offset
        maximal_isr = self.maximal_isr
        # A caught-up replica about to join the ISR is waited for too, so it never joins behind the HW.
        counted = [
            (broker_id, state.log_end_offset)
            for broker_id, state in self.remote_replicas.items()
            if broker_id in maximal_isr
            or (
                state.is_caught_up(leader_end_offset, now_ms, self.replica_lag_time_max_ms)
                and self.is_replica_eligible(broker_id)
            )
        ]
        new_hw = min([leader_end_offset, *(leo for _, leo in counted)])
        old_hw = log.high_watermark
        if new_hw <= old_hw:
            return False
        log.update_high_watermark(new_hw)
        # Runs on every append and follower fetch: the explanation is formatted only when the HW moved.
        terms = ", ".join(
            [f"{trace.LEADER_LEO}={leader_end_offset}", *(f"{trace.remote_leo(b)}={o}" for b, o in counted)]
        )
        self._emit(trace.LEADER_HW, phase, old_hw, new_hw, f"min({terms})={new_hw}", now_ms)
        return True

    def check_enough_replicas_reached(self, required_offset: int) -> tuple[bool, str | None]:
        """Kafka's checkEnoughReplicasReachOffset for a waiting acks=all produce: (done, error). The maximal ISR
        is judged here, the committed one only gates the append and the HW (docs/replication.md#acks-all)."""
        if not self.is_leader:
            return True, "NOT_LEADER_OR_FOLLOWER"
        if self.log.high_watermark < required_offset:
            return False, None
        if len(self.maximal_isr) < self.log.config.min_insync_replicas:
            return True, "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
        return True, None

    # Leader: produce and fetch

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """KIP-320: a client that knows a newer epoch than ours is ahead of us; an older one is fenced."""
        if current_leader_epoch == NO_EPOCH:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic_partition}: request epoch {current_leader_epoch} is older than {self.leader_epoch}"
            )
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{self.topic_partition}: request epoch {current_leader_epoch} is newer than {self.leader_epoch}"
            )

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderOrFollowerError(f"this broker is not the leader of {self.topic_partition}")

    def _require_leader_of(self, current_leader_epoch: int) -> None:
        """Kafka's Partition.getLocalLog for a request only the leader serves: the requester's epoch is judged
        first, so a replica that has not heard of the requester's epoch yet says UNKNOWN_LEADER_EPOCH (retry,
        it will) and one that knows a newer epoch says FENCED_LEADER_EPOCH (refresh metadata); only a replica
        at the requester's epoch, or a request without one, is told NOT_LEADER_OR_FOLLOWER."""
        self.check_leader_epoch(current_leader_epoch)
        self._require_leader()

    def append_records_to_leader(
        self, records: bytearray, required_acks: int, now_ms: int, origin: AppendOrigin = AppendOrigin.CLIENT
    ) -> LogAppendInfo:
        """Append as leader: a client's batches, or a coordinator's (transaction markers, group and transaction
        state: docs/transactions.md#write-txn-markers)."""
        self._require_leader()
        log = self.log
        min_isr = log.config.min_insync_replicas
        if required_acks == -1 and len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {len(self.isr)} is insufficient to satisfy the min.isr "
                f"requirement of {min_isr} for partition {self.topic_partition}"
            )
        old_leo = log.log_end_offset
        info = log.append_as_leader(records, self.leader_epoch, now_ms, origin=origin)
        self._emit(
            trace.LEADER_LEO,
            trace.PRODUCE,
            old_leo,
            log.log_end_offset,
            f"appended {info.records_count} record(s) at offsets {info.first_offset}..{info.last_offset}",
            now_ms,
        )
        self.maybe_increment_leader_hw(now_ms, trace.PRODUCE)
        return info

    def read_records(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        isolation_level: int,
        min_one_message: bool,
        current_leader_epoch: int,
        replica_id: int = -1,
        last_fetched_epoch: int = NO_EPOCH,
    ) -> LogReadResult:
        """A fetch on the leader: followers (replica_id >= 0) read up to the LEO, read_uncommitted consumers up to
        the HW, read_committed ones up to the LSO with the aborted transactions of what they read
        (docs/transactions.md#fetch).

        A fetcher whose last fetched epoch ended earlier here, or ended before its fetch offset, gets the
        epoch's end instead of records (Kafka's Partition.readRecords; consumers sending LastFetchedEpoch
        too): its log, or what it read, has diverged from ours."""
        self._require_leader_of(current_leader_epoch)
        if replica_id >= 0 and replica_id not in self.remote_replicas:
            # Kafka answers a non-replica with empty records; an error makes the misrouting visible and sends
            # the fetcher to wait for metadata.
            raise NotLeaderOrFollowerError(
                f"broker {replica_id} is not a follower of {self.topic_partition} (replicas {self.replicas})"
            )
        log = self.log
        high_watermark = log.high_watermark
        last_stable_offset = log.last_stable_offset
        if last_fetched_epoch >= 0:
            epoch, end_offset = log.leader_epoch_cache.end_offset_for(last_fetched_epoch, log.log_end_offset)
            if epoch < last_fetched_epoch or end_offset < fetch_offset:
                return self._read_result(None, high_watermark, last_stable_offset, diverging_epoch=(epoch, end_offset))
        read_committed = replica_id < 0 and isolation_level == READ_COMMITTED
        max_offset: int | None = None
        if replica_id < 0:
            max_offset = last_stable_offset if read_committed else high_watermark
        try:
            data = log.read(fetch_offset, max_bytes, max_offset, min_one_message)
        except OffsetMovedToTieredStorageError:
            if replica_id >= 0:
                # Followers replicate only local data and rebuild the rest (docs/tiered-storage.md#follower-rebuild).
                raise
            return self._read_result(
                None,
                high_watermark,
                last_stable_offset,
                remote_fetch=RemoteFetchInfo(
                    self.topic_id,
                    fetch_offset,
                    max_bytes,
                    min_one_message,
                    log.leader_epoch_cache.epoch_for_offset(fetch_offset),
                    read_committed,
                ),
            )
        aborted: tuple[AbortedTxn, ...] | None = None
        if read_committed:
            aborted = ()
            if data.records is not None:
                upper_bound = log.fetch_upper_bound_offset(fetch_offset, data.records)
                aborted = tuple(log.collect_aborted_transactions(fetch_offset, upper_bound))
        return self._read_result(data.records, high_watermark, last_stable_offset, aborted_transactions=aborted)

    def _read_result(
        self,
        records: FileSlice | None,
        high_watermark: int,
        last_stable_offset: int,
        *,
        diverging_epoch: tuple[int, int] | None = None,
        remote_fetch: RemoteFetchInfo | None = None,
        aborted_transactions: tuple[AbortedTxn, ...] | None = None,
    ) -> LogReadResult:
        """A read's answer with the log's offsets; the HW and LSO are the ones the read was bounded by."""
        log = self.log
        return LogReadResult(
            records=records,
            high_watermark=high_watermark,
            last_stable_offset=last_stable_offset,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            diverging_epoch=diverging_epoch,
            remote_fetch=remote_fetch,
            aborted_transactions=aborted_transactions,
        )

    def update_follower_fetch_state(
        self,
        replica_id: int,
        fetch_offset: int,
        follower_log_start_offset: int,
        fetch_time_ms: int,
        leader_end_offset: int,
    ) -> bool:
        """Record a follower's FETCH (its fetch offset is its LEO), maybe propose it into the ISR, then apply
        the HW rule; True if the HW moved. `leader_end_offset` is our LEO when the fetch was read."""
        state = self.remote_replicas.get(replica_id)
        if state is None or not self.is_leader:
            return False
        # Kafka's ReplicaState.updateFetchState (docs/replication.md#isr-shrink): caught up now if it asked for
        # everything we had, or as of its previous fetch if it now has everything we had back then.
        if fetch_offset >= leader_end_offset:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= state.last_fetch_leader_log_end_offset:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, state.last_fetch_time_ms)
        state.last_fetch_leader_log_end_offset = max(leader_end_offset, state.last_fetch_leader_log_end_offset)
        state.last_fetch_time_ms = fetch_time_ms
        state.log_start_offset = follower_log_start_offset
        old_leo, state.log_end_offset = state.log_end_offset, fetch_offset
        phase = trace.fetch_from(replica_id)
        if fetch_offset != old_leo:  # an idle follower refetches the same offset: no event to format
            self._emit(
                trace.remote_leo(replica_id),
                phase,
                old_leo,
                fetch_offset,
                f"fetch offset {fetch_offset}",
                fetch_time_ms,
            )
        self._maybe_expand_isr(replica_id, state)
        return self.maybe_increment_leader_hw(fetch_time_ms, phase)

    def _maybe_expand_isr(self, replica_id: int, state: ReplicaState) -> None:
        """A follower at or past both the HW and the start of this leader epoch may rejoin
        (docs/replication.md#isr-expand)."""
        if self._proposal is not None or replica_id in self.isr or not self.is_replica_eligible(replica_id):
            return
        if state.log_end_offset >= self.log.high_watermark and state.log_end_offset >= self._leader_epoch_start_offset:
            self._propose([*self.isr, replica_id])

    def maybe_shrink_isr(self, now_ms: int) -> bool:
        """Propose dropping ISR followers that are behind and not caught up within replica.lag.time.max.ms;
        True if a proposal was made. The shrink takes effect only when the controller commits it."""
        if not self.is_leader or self._proposal is not None:
            return False
        leader_end_offset = self.log.log_end_offset
        out_of_sync = []
        for broker_id in self.isr:
            if broker_id == self.local_broker_id:
                continue
            state = self.remote_replicas.get(broker_id)
            if state is None or not state.is_caught_up(leader_end_offset, now_ms, self.replica_lag_time_max_ms):
                out_of_sync.append(broker_id)
        if not out_of_sync:
            return False
        logger.info(
            "[Partition %s broker=%d] Shrinking ISR from %s: out of sync %s (leader LEO %d, HW %d, %s)",
            self.topic_partition,
            self.local_broker_id,
            self.isr,
            out_of_sync,
            leader_end_offset,
            self.log.high_watermark,
            {b: self.remote_replicas[b] for b in out_of_sync if b in self.remote_replicas},
        )
        self._propose([b for b in self.isr if b not in out_of_sync])
        return True

    def _propose(self, new_isr: list[int]) -> None:
        self._proposal = AlterPartitionProposal(
            self.topic_partition, self.topic_id, self.leader_epoch, self.partition_epoch, new_isr
        )
        self._proposal_sent = False

    def take_alter_partition_proposal(self) -> AlterPartitionProposal | None:
        """The proposal to send to the controller, handed out once."""
        if self._proposal is None or self._proposal_sent:
            return None
        self._proposal_sent = True
        return self._proposal

    def on_alter_partition_response(
        self, registration: PartitionRegistration | None, error: str | None, now_ms: int
    ) -> bool:
        """The controller's answer to the proposal in flight; True if the HW moved.

        Committed: adopt the new ISR and partition epoch, nothing else (its wire response carries no replica
        set; an ISR change that completes a reassignment removing replicas also bumps the leader epoch, so that
        answer is left to the metadata, the change staying in flight until then: docs/reassignment.md#completion).
        Refused: the ISR stays as committed
        and the change is proposed again when still due, except after errors saying the controller has a newer
        state, which wait for that state to arrive as metadata."""
        if not self.is_leader:
            return False
        if self._proposal is not None and self._proposal_sent:
            if error in _WAIT_FOR_METADATA_ERRORS:
                return False
            if error is None and registration is not None and registration.leader_epoch > self.leader_epoch:
                # Committed in a newer leader epoch (it completed a reassignment that removed a replica,
                # docs/reassignment.md#completion): taken up with that epoch's metadata. Until then the change
                # stays in flight, so the HW keeps waiting for a replica it adds, as Kafka's pending ISR state.
                return False
            self._clear_proposal()
        if error is not None or registration is None:
            logger.info(
                "[Partition %s broker=%d] AlterPartition failed: %s", self.topic_partition, self.local_broker_id, error
            )
            return self.maybe_increment_leader_hw(now_ms, trace.ALTER_PARTITION)
        if registration.leader_epoch != self.leader_epoch or registration.partition_epoch <= self.partition_epoch:
            return False
        old, new = set(self.isr), set(registration.isr)
        phase = trace.ISR_SHRINK if new < old else trace.ISR_EXPAND if new > old else trace.ALTER_PARTITION
        self._adopt_isr(
            registration, phase, f"controller committed partition epoch {registration.partition_epoch}", now_ms
        )
        # An unsent proposal was computed against the old partition epoch; it is recomputed when still due.
        self._clear_proposal()
        return self.maybe_increment_leader_hw(now_ms, phase)

    def fetch_offset_for_timestamp(
        self, timestamp: int, *, isolation_level: int, current_leader_epoch: int, from_consumer: bool
    ) -> OffsetAndEpoch | None:
        """ListOffsets on the leader. Consumers never see offsets at or above the HW, read_committed ones at or above
        the LSO (docs/transactions.md#list-offsets); replicas see up to the LEO."""
        self._require_leader_of(current_leader_epoch)
        log = self.log
        if not from_consumer:
            upper = log.log_end_offset
        elif isolation_level == READ_COMMITTED:
            upper = log.last_stable_offset
        else:
            upper = log.high_watermark
        if timestamp == LATEST_TIMESTAMP:
            return OffsetAndEpoch(upper, -1, self.leader_epoch)
        found = self.log.fetch_offset_by_timestamp(timestamp)
        # A timestamp lookup may land on records consumers cannot see yet; the log start never does.
        searched = timestamp >= 0 or timestamp == MAX_TIMESTAMP
        if found is None or (searched and found.offset >= upper):
            return None
        epoch = NO_EPOCH if found.leader_epoch is None else found.leader_epoch
        return OffsetAndEpoch(found.offset, found.timestamp, epoch)

    def last_offset_for_leader_epoch(self, current_leader_epoch: int, leader_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch on the leader (Kafka's lastOffsetForLeaderEpoch): the largest epoch <=
        `leader_epoch` in our history and the offset it ends at, (-1, -1) if we know none. A consumer validating
        its position after a leader change (KIP-320) and a follower rebuilding from the remote tier both need
        the leader's history: another replica's may be shorter or diverge."""
        self._require_leader_of(current_leader_epoch)
        return self.log.leader_epoch_cache.end_offset_for(leader_epoch, self.log.log_end_offset)

    def delete_records_on_leader(self, offset: int, now_ms: int) -> int:
        """DeleteRecords: move the log start up to `offset` (-1 means the HW); returns the new low watermark."""
        self._require_leader()
        log = self.log
        if not log.config.delete:
            raise PolicyViolationError(
                f"Records of partition {self.topic_partition} can not be deleted due to the configured policy"
            )
        target = log.high_watermark if offset == -1 else offset
        if target < 0:
            # Kafka's Partition.deleteRecordsOnLeader: only -1 stands for the HW.
            raise OffsetOutOfRangeError(f"The offset {target} for partition {self.topic_partition} is not valid")
        self.increment_log_start_offset(target, trace.DELETE_RECORDS, f"delete before {target}", now_ms)
        return log.log_start_offset

    def increment_log_start_offset(self, offset: int, phase: str, why: str, now_ms: int) -> bool:
        """Move the log start up (DeleteRecords, remote retention); True if it moved."""
        log = self.log
        old_start = log.log_start_offset
        moved = log.maybe_increment_log_start_offset(offset)
        self._emit(trace.LOG_START, phase, old_start, log.log_start_offset, why, now_ms)
        return moved

    def update_remote_log_end(self, offset: int, why: str, now_ms: int) -> None:
        """Ry moves up to `offset` (a copy finished here, or the remote log metadata says the leader's did),
        but stays below our HW (Ly >= Ry: a follower's HW may trail the leader's)."""
        log = self.log
        old = log.highest_offset_in_remote_storage
        new = min(offset, log.high_watermark - 1)
        if new > old:
            log.update_highest_offset_in_remote_storage(new)
            self._emit(trace.REMOTE_END, trace.REMOTE_COPY, old, new, why, now_ms)

    # Follower

    def append_records_to_follower(self, records: bytes | bytearray | memoryview, now_ms: int) -> LogAppendInfo | None:
        """Append batches fetched from the leader, offsets and epochs as the leader assigned them."""
        if len(records) == 0:
            return None
        log = self.log
        old_leo = log.log_end_offset
        try:
            info = log.append_as_follower(records, now_ms)
        except UnexpectedAppendOffsetError as error:
            # Kafka's appendRecordsToFollowerOrFutureReplica: DeleteRecords may put the leader's log start
            # inside a batch; an empty log fetching from there restarts at that batch's base offset.
            leo = log.log_end_offset
            if not (leo == log.log_start_offset and error.first_offset < leo <= error.last_offset):
                raise
            self.truncate_fully_and_start_at(error.first_offset, now_ms)
            info = log.append_as_follower(records, now_ms)
        self._emit(
            trace.FOLLOWER_LEO,
            trace.FETCH_RESPONSE,
            old_leo,
            log.log_end_offset,
            f"appended {info.records_count} record(s) at offsets {info.first_offset}..{info.last_offset}",
            now_ms,
        )
        return info

    def update_follower_high_watermark(
        self, leader_high_watermark: int, leader_log_start_offset: int, now_ms: int
    ) -> None:
        """HW = min(leader HW, own LEO) (it may go down), log start = max(own, leader's)
        (docs/replication.md#follower-hw)."""
        log = self.log
        old_hw = log.high_watermark
        leo = log.log_end_offset
        candidate = min(leader_high_watermark, leo)
        new_hw = log.update_high_watermark(candidate)
        # Runs on every fetch response: explanations are formatted only for values that changed.
        if new_hw != old_hw:
            why = f"min({trace.LEADER_HW}={leader_high_watermark}, {trace.FOLLOWER_LEO}={leo})={candidate}"
            if new_hw != candidate:
                why += f", at least {trace.LOG_START}={log.log_start_offset}"
            self._emit(trace.FOLLOWER_HW, trace.FETCH_RESPONSE, old_hw, new_hw, why, now_ms)
        old_start = log.log_start_offset
        # The leader's log start never exceeds what we fetched from it; the bound keeps the log's own rule
        # (log start <= HW) should a response ever say otherwise.
        if log.maybe_increment_log_start_offset(min(leader_log_start_offset, new_hw)):
            why = f"leader's log start {leader_log_start_offset}"
            self._emit(trace.LOG_START, trace.FETCH_RESPONSE, old_start, log.log_start_offset, why, now_ms)

    def truncate_to(self, offset: int, now_ms: int, why: str) -> None:
        """Remove every offset >= `offset` (the fetcher decided where, docs/replication.md#truncation)."""
        log = self.log
        before = (log.log_end_offset, log.high_watermark, log.log_start_offset)
        log.truncate_to(offset)
        self._trace_truncation(before, why, now_ms)

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Drop the whole log and restart it, empty, at `offset` (the leader's log start is past our LEO)."""
        log = self.log
        before = (log.log_end_offset, log.high_watermark, log.log_start_offset)
        log.truncate_fully_and_start_at(offset)
        self._trace_truncation(before, f"leader's log start {offset} is past our LEO {before[0]}", now_ms)

    def build_remote_log_aux_state(
        self,
        next_offset: int,
        leader_log_start_offset: int,
        epochs: Sequence[tuple[int, int]],
        now_ms: int,
        producer_snapshot: bytes | None = None,
    ) -> None:
        """BuildingRemoteLogAuxState (docs/tiered-storage.md#follower-rebuild): the offsets below `next_offset`
        exist only in the leader's remote tier, so restart our log empty there, starting (as the leader's does)
        at its log start, with the leader's epoch history as of `next_offset` taken from the remote segment's
        checkpoint, and the producer state of the snapshot copied with that segment (so a retry of an
        idempotent batch below `next_offset` is still recognised should we become leader)."""
        log = self.log
        before = (log.log_end_offset, log.high_watermark, log.log_start_offset)
        log.truncate_fully_and_start_at(next_offset, log_start_offset=leader_log_start_offset)
        cache = log.leader_epoch_cache
        for epoch, start_offset in epochs:
            if start_offset < next_offset:
                cache.assign(epoch, start_offset)
        cache.truncate_from_start(log.log_start_offset)
        if producer_snapshot is not None:
            log.load_producer_snapshot(producer_snapshot)
        why = f"offsets below {next_offset} are only in the remote tier"
        self._trace_truncation(before, why, now_ms, phase=trace.BUILD_REMOTE_AUX_STATE)
        self.update_remote_log_end(next_offset - 1, why, now_ms)

    def _trace_truncation(
        self, before: tuple[int, int, int], why: str, now_ms: int, phase: str = trace.TRUNCATE
    ) -> None:
        log = self.log
        old_leo, old_hw, old_start = before
        self._emit(trace.FOLLOWER_LEO, phase, old_leo, log.log_end_offset, why, now_ms)
        self._emit(trace.FOLLOWER_HW, phase, old_hw, log.high_watermark, why, now_ms)
        self._emit(trace.LOG_START, phase, old_start, log.log_start_offset, why, now_ms)

    # Status

    def describe(self) -> dict[str, object]:
        log = self.log
        status: dict[str, object] = {
            "topic": self.topic_partition.topic,
            "partition": self.topic_partition.partition,
            "role": "leader" if self.is_leader else "follower",
            "leader": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "maximal_isr": self.maximal_isr,
            "high_watermark": log.high_watermark,
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            "local_log_start_offset": log.local_log_start_offset,
            "highest_offset_in_remote_storage": log.highest_offset_in_remote_storage,
            "local_size_bytes": log.size_in_bytes,
        }
        if self.is_leader:
            status["remote_replicas"] = {
                str(broker_id): {
                    "log_end_offset": state.log_end_offset,
                    "last_caught_up_time_ms": state.last_caught_up_time_ms,
                }
                for broker_id, state in self.remote_replicas.items()
            }
        return status
