"""Kafka's AbstractFetcherThread without I/O: what a follower fetches from one leader broker, and what it does
with the answer (append, adopt HW, truncate on a diverging epoch, back off on errors).

The fetcher decides every request; the world around it only carries them. It asks `poll(now_ms)` for the next
one (a Fetch, a ListOffsets or OffsetForLeaderEpoch to the leader, a read of the remote tier, or how long to
idle), sends it and hands the answer to the matching `on_...` method (`process_fetch_response` for a Fetch), or
reports that no answer came (`on_fetch_failed`). The asyncio shell (server/fetcher_thread.py) does that over
sockets, the simulator (tierlog/sim/) over its network: one request at a time per leader, as Kafka's fetcher
thread sends them.

Truncation follows docs/replication.md#truncation (Kafka's truncation on fetch, KIP-595): the follower sends
the epoch of its last fetched batch; a leader on which that epoch ended earlier answers DivergingEpoch (E, off)
instead of records, and the follower truncates to the end of E in its own log, never to its HW unless neither side can
say where the epochs part. Truncation always comes before any HW of that round is adopted.

A partition throttled on this follower (docs/replication.md#throttles) is left out of the Fetch while the
follower quota is exceeded, unless it has caught up with the leader's HW: an in-sync replica is never held back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from tierlog.common import Idle, TopicPartition
from tierlog.replication.fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchRequestPartition,
    FetchSessionHandler,
    SessionKey,
)
from tierlog.replication.partition import NO_EPOCH, Partition
from tierlog.replication.replication_quota import ReplicationQuotaManager
from tierlog.storage.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from tierlog.storage.log import EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

logger = logging.getLogger(__name__)

FetchStateName = Literal["truncating", "fetching", "building_remote_log_aux_state"]
FETCHING: FetchStateName = "fetching"
# Waiting for the leader's log start and end (after OFFSET_OUT_OF_RANGE) before fetching again.
TRUNCATING: FetchStateName = "truncating"
# KIP-405's BuildingRemoteLogAuxState (after OFFSET_MOVED_TO_TIERED_STORAGE): the offsets we need exist
# only in the remote tier, so the epoch history up to the leader's local log start comes from there.
BUILDING_REMOTE_LOG_AUX_STATE: FetchStateName = "building_remote_log_aux_state"

# With nothing to fetch, look again this soon: new metadata may hand over a partition meanwhile.
IDLE_POLL_MS = 100

# The partition's leadership moved or is moving: new metadata will re-add it.
_WAIT_FOR_METADATA_ERRORS = frozenset(
    {"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "UNKNOWN_TOPIC_OR_PARTITION"}
)


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    replica_id: int
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 10485760
    partition_max_bytes: int = 1048576
    backoff_ms: int = 1000


@dataclass(slots=True)
class RemoteLogAuxStateBuild:
    """How far one BuildingRemoteLogAuxState round got: the leader's log start, its earliest local offset L and
    L's epoch e (ListOffsets), then the epoch that holds L - 1 (`target_epoch`, from OffsetForLeaderEpoch e - 1)."""

    log_start_offset: int
    local_log_start_offset: int
    local_log_start_epoch: int
    target_epoch: int | None


@dataclass(slots=True)
class PartitionFetchState:
    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int | None
    state: FetchStateName
    delayed_until_ms: int = 0
    remote_build: RemoteLogAuxStateBuild | None = None
    # How far the leader's HW was ahead of our LEO after the last answer (Kafka's PartitionFetchState.lag); None
    # until one came.
    lag: int | None = None

    @property
    def is_replica_in_sync(self) -> bool:
        """Kafka's isReplicaInSync: after the last answer, our LEO had reached the leader's HW."""
        return self.lag is not None and self.lag <= 0


@dataclass(frozen=True, slots=True)
class FetchRequestData:
    """A Fetch request as the leader's ReplicaManager takes it (replication/fetch_request.py): what a follower
    builds, and what the shell decodes a wire request into."""

    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: list[FetchRequestPartition]
    isolation_level: int = 0
    # The fetch session (docs/performance.md#fetch-sessions): none by default (id 0, epoch -1); a session names
    # its partitions by topic id from Fetch v13 on.
    session_id: int = INVALID_SESSION_ID
    session_epoch: int = FINAL_EPOCH
    forgotten: tuple[SessionKey, ...] = ()
    uses_topic_ids: bool = False


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    """ListOffsets to the leader as a replica (so LATEST is its LEO, not its HW): its (offset, leader epoch) at
    each timestamp, answered through `ReplicaFetcher.on_list_offsets`."""

    topic_partition: TopicPartition
    timestamps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EpochEndOffsetRequest:
    """OffsetForLeaderEpoch to the leader: the largest epoch at or below `leader_epoch` it knows and where that
    epoch ends, answered through `ReplicaFetcher.on_epoch_end_offset`."""

    topic_partition: TopicPartition
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RemoteLogAuxStateRequest:
    """A read of this broker's remote log metadata and remote tier: the remote segment holding `offset` in
    `leader_epoch`, its end offset, the epoch history up to there and the producer snapshot taken at its end,
    answered through `ReplicaFetcher.on_remote_log_aux_state`."""

    topic_partition: TopicPartition
    leader_epoch: int
    offset: int


# Whether a partition's fetch offset is out of range: the leader's log start and end.
LEADER_LOG_RANGE = (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP)
# Where the leader's local log starts (offset and epoch) and its whole log starts.
LEADER_LOCAL_LOG_START = (EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP)


@dataclass(frozen=True, slots=True)
class FetchResponsePartition:
    topic_partition: TopicPartition
    error: str | None
    high_watermark: int
    log_start_offset: int
    diverging_epoch: tuple[int, int] | None
    records: bytes | memoryview | None


FetcherAction = FetchRequestData | ListOffsetsRequest | EpochEndOffsetRequest | RemoteLogAuxStateRequest | Idle


class ReplicaFetcher:
    def __init__(
        self,
        source_broker_id: int,
        config: FetcherConfig,
        partition_of: Callable[[TopicPartition], Partition | None],
        quota: ReplicationQuotaManager | None = None,
    ) -> None:
        self.source_broker_id = source_broker_id
        self.config = config
        self._partition_of = partition_of
        # The follower side's replication throttle; None fetches everything.
        self._quota = quota
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        # (fetch offset, leader epoch) each partition was last asked for: a response is applied only if the
        # partition still stands there (it may have been truncated or re-added meanwhile).
        self._requested: dict[TopicPartition, tuple[int, int]] = {}
        # Fetches send only what changed since the last one (docs/performance.md#fetch-sessions).
        self.session = FetchSessionHandler()

    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, current_leader_epoch: int, now_ms: int) -> None:
        """Start fetching `tp` from this leader (docs/replication.md#fetch-start): from the LEO with the latest
        cached epoch, or, with an empty epoch cache (nothing to compare epochs with), from the HW after truncating
        to it."""
        partition = self._partition_of(tp)
        if partition is None:
            return
        log = partition.log
        latest_epoch = log.latest_epoch
        if latest_epoch is None:
            partition.truncate_to(
                log.high_watermark, now_ms, f"no leader epochs cached: truncate to HW {log.high_watermark}"
            )
        self.partitions[tp] = PartitionFetchState(
            topic_id, log.log_end_offset, current_leader_epoch, latest_epoch, FETCHING
        )
        self._requested.pop(tp, None)

    def remove_partition(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self._requested.pop(tp, None)

    def poll(self, now_ms: int) -> FetcherAction:
        """The next request to send to this leader (or to the remote tier), one at a time: the leader's log
        range for a partition out of range, the next step of a remote log state build, then one Fetch for every
        partition ready to fetch; with none of them, how long to idle."""
        # A partition backed off after an error waits out its backoff whatever it waits for.
        ready = [(tp, state) for tp, state in self.partitions.items() if state.delayed_until_ms <= now_ms]
        for tp, state in ready:
            if state.state == TRUNCATING:
                return ListOffsetsRequest(tp, LEADER_LOG_RANGE)
        for tp, state in ready:
            if state.state == BUILDING_REMOTE_LOG_AUX_STATE:
                return self._remote_log_aux_state_step(tp, state)
        request = self.build_fetch_request(now_ms)
        if request is not None:
            return request
        # Nothing to fetch (every partition backed off, or held back by the throttle until its rate falls).
        wake_at = self.next_wakeup_ms(now_ms)
        return Idle(now_ms + (IDLE_POLL_MS if wake_at is None else max(1, min(IDLE_POLL_MS, wake_at - now_ms))))

    def build_fetch_request(self, now_ms: int) -> FetchRequestData | None:
        """One Fetch for every partition ready to fetch and not throttled, as the fetch session sends it (the
        partitions left out since the last fetch are forgotten, a full fetch sends them all); None if there is
        nothing to send."""
        requests = []
        for tp, state in self.partitions.items():
            if state.state != FETCHING or state.delayed_until_ms > now_ms:
                continue
            if self._should_throttle(tp, state, now_ms):
                continue
            partition = self._partition_of(tp)
            if partition is None:
                continue
            requests.append(
                FetchRequestPartition(
                    topic_partition=tp,
                    topic_id=state.topic_id,
                    fetch_offset=state.fetch_offset,
                    current_leader_epoch=state.current_leader_epoch,
                    last_fetched_epoch=NO_EPOCH if state.last_fetched_epoch is None else state.last_fetched_epoch,
                    log_start_offset=partition.log.log_start_offset,
                    partition_max_bytes=self.config.partition_max_bytes,
                )
            )
            self._requested[tp] = (state.fetch_offset, state.current_leader_epoch)
        fetch = self.session.build(requests)
        if fetch is None:
            return None
        config = self.config
        return FetchRequestData(
            config.replica_id,
            config.max_wait_ms,
            config.min_bytes,
            config.max_bytes,
            fetch.partitions,
            session_id=fetch.session_id,
            session_epoch=fetch.session_epoch,
            forgotten=tuple((tp.topic, tp.partition) for tp in fetch.forgotten),
        )

    def _should_throttle(self, tp: TopicPartition, state: PartitionFetchState, now_ms: int) -> bool:
        """Kafka's shouldFollowerThrottle (docs/replication.md#throttles): a throttled replica that has not caught
        up waits while the follower quota is exceeded; one in sync never does, so a throttle cannot push it out of
        the ISR."""
        quota = self._quota
        return (
            quota is not None
            and not state.is_replica_in_sync
            and quota.is_throttled(tp)
            and quota.is_quota_exceeded(now_ms)
        )

    def process_fetch_response(
        self, partitions: Sequence[FetchResponsePartition], now_ms: int, *, session_id: int = INVALID_SESSION_ID
    ) -> None:
        """The leader's answer: `session_id` is the fetch session it created or continued (an incremental answer
        leaves out the partitions with nothing new)."""
        self.session.handle_response(session_id)
        for response in partitions:
            tp = response.topic_partition
            state = self.partitions.get(tp)
            requested = self._requested.pop(tp, None)
            if state is None or requested != (state.fetch_offset, state.current_leader_epoch):
                # The leader's session now takes this answer as delivered: it would not answer the same HW again,
                # so the next fetch is a full one (docs/performance.md#fetch-sessions).
                self.session.handle_error()
                continue
            partition = self._partition_of(tp)
            if partition is None:
                continue
            if response.error is None:
                try:
                    self._process_partition_data(partition, state, response, now_ms)
                except Exception as error:  # one partition's bad data must not stop the others
                    logger.warning(
                        "[ReplicaFetcher leader=%d] %s: failed to process fetched data at offset %d: %s",
                        self.source_broker_id,
                        tp,
                        state.fetch_offset,
                        error,
                    )
                    state.delayed_until_ms = now_ms + self.config.backoff_ms
            elif response.error == "OFFSET_OUT_OF_RANGE":
                state.state = TRUNCATING
            elif response.error == "OFFSET_MOVED_TO_TIERED_STORAGE":
                state.state = BUILDING_REMOTE_LOG_AUX_STATE
            else:
                if response.error not in _WAIT_FOR_METADATA_ERRORS:
                    logger.warning(
                        "[ReplicaFetcher leader=%d] %s: fetch at offset %d failed with %s",
                        self.source_broker_id,
                        tp,
                        state.fetch_offset,
                        response.error,
                    )
                state.delayed_until_ms = now_ms + self.config.backoff_ms

    def _process_partition_data(
        self, partition: Partition, state: PartitionFetchState, response: FetchResponsePartition, now_ms: int
    ) -> None:
        if response.diverging_epoch is not None:
            self._truncate_on_diverging_epoch(partition, state, response.diverging_epoch, now_ms)
            # The answer's HW is not taken, but the leader's session counts it as delivered: fetch in full next
            # (docs/performance.md#fetch-sessions).
            self.session.handle_error()
            return
        records = response.records
        if records is not None:
            partition.append_records_to_follower(records, now_ms)
        partition.update_follower_high_watermark(response.high_watermark, response.log_start_offset, now_ms)
        state.fetch_offset = partition.log.log_end_offset
        state.last_fetched_epoch = partition.log.latest_epoch
        state.lag = max(0, response.high_watermark - state.fetch_offset)
        quota = self._quota
        if records and quota is not None and quota.is_throttled(partition.topic_partition):
            # Both in-sync and lagging replicas count, so the throttled traffic as a whole stays under the quota.
            quota.record(len(records), now_ms)

    def _truncate_on_diverging_epoch(
        self, partition: Partition, state: PartitionFetchState, diverging: tuple[int, int], now_ms: int
    ) -> None:
        """Kafka's getOffsetTruncationState with the leader's (E, off) (docs/replication.md#truncation)."""
        leader_epoch, leader_end_offset = diverging
        log = partition.log
        log_end_offset = log.log_end_offset
        if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
            # The leader cannot say where our epoch ended: the HW is all we know to be committed.
            target = min(log.high_watermark, log_end_offset)
            why = f"leader knows no end of epoch {state.last_fetched_epoch}: truncate to HW {log.high_watermark}"
        else:
            follower_epoch, follower_end_offset = log.leader_epoch_cache.end_offset_for(leader_epoch, log_end_offset)
            if follower_epoch == UNDEFINED_EPOCH:
                # We never saw epochs that old, so the leader's end is the only bound.
                target = min(leader_end_offset, log_end_offset)
                why = f"diverging epoch {leader_epoch} ends at {leader_end_offset}"
            elif follower_epoch != leader_epoch:
                # We do not know the leader's epoch E: cut back to the end of our largest epoch below it and
                # ask again with the epoch that is then our latest.
                target = min(follower_end_offset, log_end_offset)
                why = (
                    f"diverging epoch {leader_epoch} ends at {leader_end_offset}; ours is unknown, "
                    f"epoch {follower_epoch} ends at {follower_end_offset}"
                )
            else:
                target = min(leader_end_offset, follower_end_offset, log_end_offset)
                why = f"diverging epoch {leader_epoch} ends at {leader_end_offset}, ours at {follower_end_offset}"
        partition.truncate_to(target, now_ms, why)
        state.fetch_offset = log.log_end_offset
        state.last_fetched_epoch = log.latest_epoch

    def on_list_offsets(self, tp: TopicPartition, answers: Sequence[tuple[int, int]], now_ms: int) -> None:
        """The leader's (offset, leader epoch) at each timestamp of the ListOffsetsRequest `poll` made for `tp`."""
        state = self.partitions.get(tp)
        if state is None:
            return
        if state.state == TRUNCATING:
            (log_start_offset, _), (log_end_offset, _) = answers
            self.on_leader_offsets(tp, log_start_offset, log_end_offset, now_ms)
        elif state.state == BUILDING_REMOTE_LOG_AUX_STATE and state.remote_build is None:
            (local_start, local_start_epoch), (log_start_offset, _) = answers
            # Only an epoch after the first can have left L - 1 to an earlier one.
            target_epoch = None if local_start_epoch > 0 else local_start_epoch
            state.remote_build = RemoteLogAuxStateBuild(log_start_offset, local_start, local_start_epoch, target_epoch)

    def on_list_offsets_failed(self, tp: TopicPartition, error: str, now_ms: int) -> None:
        """The leader refused the ListOffsets for `tp` (leadership moving, ...): `tp` backs off and asks again.
        As Kafka delays only the partitions in error, the leader's other partitions go on fetching."""
        logger.info("[ReplicaFetcher leader=%d] %s: ListOffsets failed with %s", self.source_broker_id, tp, error)
        state = self.partitions.get(tp)
        if state is not None:
            state.remote_build = None
            state.delayed_until_ms = now_ms + self.config.backoff_ms

    def on_leader_offsets(
        self, tp: TopicPartition, leader_log_start_offset: int, leader_log_end_offset: int, now_ms: int
    ) -> None:
        """Kafka's handleOutOfRangeError: restart fetching where the leader's log and ours overlap."""
        state = self.partitions.get(tp)
        partition = self._partition_of(tp)
        if state is None or partition is None or state.state != TRUNCATING:
            return
        log = partition.log
        log_end_offset = log.log_end_offset
        if leader_log_end_offset < log_end_offset:
            # Only an unclean election leaves the leader shorter than a follower that still fetches from it.
            partition.truncate_to(
                leader_log_end_offset, now_ms, f"leader's LEO {leader_log_end_offset} is below ours {log_end_offset}"
            )
        elif leader_log_start_offset > log_end_offset:
            partition.truncate_fully_and_start_at(leader_log_start_offset, now_ms)
        state.fetch_offset = log.log_end_offset
        state.last_fetched_epoch = log.latest_epoch
        state.state = FETCHING

    def _remote_log_aux_state_step(self, tp: TopicPartition, state: PartitionFetchState) -> FetcherAction:
        """BuildingRemoteLogAuxState (docs/tiered-storage.md#follower-rebuild), one request at a time: the
        leader's earliest local offset L and its epoch e, the epoch of L - 1 (OffsetForLeaderEpoch e - 1 tells
        whether L - 1 still belongs to an earlier epoch), then the remote segment holding L - 1 and its epoch
        history."""
        build = state.remote_build
        if build is None:
            return ListOffsetsRequest(tp, LEADER_LOCAL_LOG_START)
        if build.target_epoch is None:
            return EpochEndOffsetRequest(tp, build.local_log_start_epoch - 1)
        return RemoteLogAuxStateRequest(tp, build.target_epoch, build.local_log_start_offset - 1)

    def on_epoch_end_offset(self, tp: TopicPartition, epoch: int, end_offset: int, now_ms: int) -> None:
        """The leader's answer to the EpochEndOffsetRequest `poll` made for `tp`: its largest epoch at or below
        the one asked for, and where that epoch ends."""
        state = self.partitions.get(tp)
        build = state.remote_build if state is not None else None
        if build is None or build.target_epoch is not None:
            return
        # Epoch e - 1 may have no records (a gap): the answer names the epoch that really holds L - 1.
        previous_offset = build.local_log_start_offset - 1
        build.target_epoch = epoch if end_offset > previous_offset else build.local_log_start_epoch

    def on_epoch_end_offset_failed(self, tp: TopicPartition, error: str, now_ms: int) -> None:
        self.on_remote_log_aux_state_failed(tp, f"OffsetForLeaderEpoch: {error}", now_ms)

    def on_remote_log_aux_state(
        self,
        tp: TopicPartition,
        remote_end_offset: int,
        epochs: Sequence[tuple[int, int]],
        producer_snapshot: bytes | None,
        now_ms: int,
    ) -> None:
        """BuildingRemoteLogAuxState (docs/tiered-storage.md#follower-rebuild), completed with the remote segment
        the RemoteLogAuxStateRequest found: restart the local log empty after its end with the leader's log
        start, adopt the leader's epoch history up to there (and the segment's producer snapshot), and fetch
        from there."""
        state = self.partitions.get(tp)
        partition = self._partition_of(tp)
        build = state.remote_build if state is not None else None
        if state is None or partition is None or build is None or build.target_epoch is None:
            return
        logger.info(
            "[ReplicaFetcher leader=%d] %s: built remote log state up to %d (leader log start %d, local start %d)",
            self.source_broker_id,
            tp,
            remote_end_offset,
            build.log_start_offset,
            build.local_log_start_offset,
        )
        partition.build_remote_log_aux_state(
            remote_end_offset + 1, build.log_start_offset, epochs, now_ms, producer_snapshot
        )
        log = partition.log
        state.fetch_offset = log.log_end_offset
        state.last_fetched_epoch = log.latest_epoch
        state.state = FETCHING
        state.remote_build = None

    def on_remote_log_aux_state_failed(self, tp: TopicPartition, reason: str, now_ms: int) -> None:
        """The remote state could not be built yet (metadata not replicated here yet, remote tier down): start
        over after the backoff, still in BuildingRemoteLogAuxState."""
        state = self.partitions.get(tp)
        if state is None:
            return
        logger.info(
            "[ReplicaFetcher leader=%d] %s: cannot build remote log state yet: %s", self.source_broker_id, tp, reason
        )
        state.remote_build = None
        state.delayed_until_ms = now_ms + self.config.backoff_ms

    def on_fetch_session_error(self, error: str, now_ms: int) -> None:
        """The leader refused the fetch session (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, ...): the
        next fetch is a full one, at once."""
        logger.info("[ReplicaFetcher leader=%d] fetch session error %s: full fetch next", self.source_broker_id, error)
        self.session.handle_session_error(error)

    def on_fetch_failed(self, now_ms: int) -> None:
        """The request failed as a whole (connection lost, timeout): back off every partition; a remote log state
        build starts over, and so does the fetch session."""
        self._requested.clear()
        self.session.handle_error()
        for state in self.partitions.values():
            state.delayed_until_ms = now_ms + self.config.backoff_ms
            state.remote_build = None

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When the earliest partition backed off after an error may fetch again; None if none is backed off (a
        partition that may fetch already is no reason to wake sooner: one the throttle held back would spin)."""
        return min((s.delayed_until_ms for s in self.partitions.values() if s.delayed_until_ms > now_ms), default=None)
