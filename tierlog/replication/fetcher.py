"""Kafka's AbstractFetcherThread without I/O: what a follower fetches from one leader broker, and what it does
with the answer (append, adopt HW, truncate on a diverging epoch, back off on errors).

The shell (server/fetcher_thread.py) only moves bytes: it sends `build_fetch_request()`, hands the response
to `process_fetch_response()`, resolves `offset_lookups()` with ListOffsets, resolves `remote_aux_state_builds()`
with ListOffsets, OffsetForLeaderEpoch and the remote tier (docs/tiered-storage.md#follower-rebuild), and
reports lost connections.

Truncation follows docs/replication.md#truncation (Kafka's truncation on fetch, KIP-595): the follower sends
the epoch of its last fetched batch; a leader on which that epoch ended earlier answers DivergingEpoch (E, off)
instead of records, and the follower truncates to the end of E in its own log, never to its HW unless neither side can
say where the epochs part. Truncation always comes before any HW of that round is adopted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from tierlog.common import TopicPartition
from tierlog.replication.partition import NO_EPOCH, Partition
from tierlog.storage.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

logger = logging.getLogger(__name__)

FetchStateName = Literal["truncating", "fetching", "building_remote_log_aux_state"]
FETCHING: FetchStateName = "fetching"
# Waiting for the leader's log start and end (after OFFSET_OUT_OF_RANGE) before fetching again.
TRUNCATING: FetchStateName = "truncating"
# KIP-405's BuildingRemoteLogAuxState (after OFFSET_MOVED_TO_TIERED_STORAGE): the offsets we need exist
# only in the remote tier, so the epoch history up to the leader's local log start comes from there.
BUILDING_REMOTE_LOG_AUX_STATE: FetchStateName = "building_remote_log_aux_state"

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
class PartitionFetchState:
    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int | None
    state: FetchStateName
    delayed_until_ms: int = 0


@dataclass(frozen=True, slots=True)
class FetchRequestPartition:
    topic_partition: TopicPartition
    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


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


@dataclass(frozen=True, slots=True)
class FetchResponsePartition:
    topic_partition: TopicPartition
    error: str | None
    high_watermark: int
    log_start_offset: int
    diverging_epoch: tuple[int, int] | None
    records: bytes | memoryview | None


class ReplicaFetcher:
    def __init__(
        self,
        source_broker_id: int,
        config: FetcherConfig,
        partition_of: Callable[[TopicPartition], Partition | None],
    ) -> None:
        self.source_broker_id = source_broker_id
        self.config = config
        self._partition_of = partition_of
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        # (fetch offset, leader epoch) each partition was last asked for: a response is applied only if the
        # partition still stands there (it may have been truncated or re-added meanwhile).
        self._requested: dict[TopicPartition, tuple[int, int]] = {}

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

    def build_fetch_request(self, now_ms: int) -> FetchRequestData | None:
        """One Fetch for every partition ready to fetch; None if none is."""
        requests = []
        for tp, state in self.partitions.items():
            if state.state != FETCHING or state.delayed_until_ms > now_ms:
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
        if not requests:
            return None
        config = self.config
        return FetchRequestData(config.replica_id, config.max_wait_ms, config.min_bytes, config.max_bytes, requests)

    def process_fetch_response(self, partitions: Sequence[FetchResponsePartition], now_ms: int) -> None:
        for response in partitions:
            tp = response.topic_partition
            state = self.partitions.get(tp)
            requested = self._requested.pop(tp, None)
            if state is None or requested != (state.fetch_offset, state.current_leader_epoch):
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
            return
        if response.records is not None:
            partition.append_records_to_follower(response.records, now_ms)
        partition.update_follower_high_watermark(response.high_watermark, response.log_start_offset, now_ms)
        state.fetch_offset = partition.log.log_end_offset
        state.last_fetched_epoch = partition.log.latest_epoch

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

    def offset_lookups(self) -> list[TopicPartition]:
        """Partitions whose fetch offset was out of range: the shell asks the leader for its log start and
        end (ListOffsets as a replica) and calls on_leader_offsets."""
        return [tp for tp, state in self.partitions.items() if state.state == TRUNCATING]

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

    def remote_aux_state_builds(self) -> list[TopicPartition]:
        """Partitions whose next offset lives only in the leader's remote tier and that may try now: the shell
        finds the leader's local log start (L, e), the remote segment holding L - 1 and its epoch history,
        and calls on_remote_log_aux_state (or on_remote_log_aux_state_failed)."""
        return [tp for tp, state in self.partitions.items() if state.state == BUILDING_REMOTE_LOG_AUX_STATE]

    def is_delayed(self, tp: TopicPartition, now_ms: int) -> bool:
        state = self.partitions.get(tp)
        return state is not None and state.delayed_until_ms > now_ms

    def on_remote_log_aux_state(
        self,
        tp: TopicPartition,
        next_offset: int,
        leader_log_start_offset: int,
        epochs: Sequence[tuple[int, int]],
        now_ms: int,
        producer_snapshot: bytes | None = None,
    ) -> None:
        """BuildingRemoteLogAuxState (docs/tiered-storage.md#follower-rebuild), completed: restart the local log
        empty at `next_offset` (the end of the remote segment holding the leader's local log start - 1, plus
        one) with the leader's log start, adopt the leader's epoch history up to there, and fetch from
        `next_offset`."""
        state = self.partitions.get(tp)
        partition = self._partition_of(tp)
        if state is None or partition is None or state.state != BUILDING_REMOTE_LOG_AUX_STATE:
            return
        partition.build_remote_log_aux_state(next_offset, leader_log_start_offset, epochs, now_ms, producer_snapshot)
        log = partition.log
        state.fetch_offset = log.log_end_offset
        state.last_fetched_epoch = log.latest_epoch
        state.state = FETCHING

    def on_remote_log_aux_state_failed(self, tp: TopicPartition, reason: str, now_ms: int) -> None:
        """The remote state could not be built yet (metadata not replicated here yet, remote tier down): try
        again after the backoff, still in BuildingRemoteLogAuxState."""
        state = self.partitions.get(tp)
        if state is None:
            return
        logger.info(
            "[ReplicaFetcher leader=%d] %s: cannot build remote log state yet: %s", self.source_broker_id, tp, reason
        )
        state.delayed_until_ms = now_ms + self.config.backoff_ms

    def on_fetch_failed(self, now_ms: int) -> None:
        """The request failed as a whole (connection lost, timeout): back off every partition."""
        self._requested.clear()
        for state in self.partitions.values():
            state.delayed_until_ms = now_ms + self.config.backoff_ms

    def next_wakeup_ms(self) -> int | None:
        """When the earliest backed-off partition may fetch again; None without partitions."""
        return min((state.delayed_until_ms for state in self.partitions.values()), default=None)
