"""KIP-405's RemoteLogMetadataManager, in memory: every broker folds the events of `__remote_log_metadata`
into one RemoteLogMetadataCache per partition and answers the RemoteLogManager's questions from it.

Mirrors Kafka's RemoteLogMetadataCache and RemoteLogLeaderEpochState, with two deliberate differences:
- Overlapping copies (a new leader re-copying offsets a deposed one already copied, under another id) are all
  indexed. Kafka keeps one segment per (epoch, start offset) and re-points it on every COPY_SEGMENT_FINISHED,
  so a shorter copy finishing after a longer one hides the longer one's tail from lookups. Here a lookup
  chooses among every copied range that holds the offset.
- `highest_offset_for_epoch` counts only segments that are COPY_SEGMENT_FINISHED now; Kafka's never goes
  down, even once the segment is deleted. The RemoteLogManager deletes local segments up to this offset,
  so it must never claim offsets the remote tier no longer serves.

The store is keyed by TopicIdPartition, not by name: `__remote_log_metadata` keeps the events of a deleted
topic, and a topic created again under the same name must not read its predecessor's segments, nor delete
its own local data believing those offsets are copied.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import zlib
from operator import itemgetter

from tierlog.tiered.segment_metadata import (
    RemoteLogMetadataEvent,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    is_valid_transition,
)

logger = logging.getLogger(__name__)

# The internal topic the events are kept in (Kafka's TopicBasedRemoteLogMetadataManager's).
REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata"

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_COPIED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


class UnknownRemoteSegmentError(KeyError):
    """Kafka's RemoteResourceNotFoundException: no segment with this id (never added, or already deleted)."""

    def __str__(self) -> str:
        # KeyError's own str() shows the repr of its argument, quotes and all.
        return str(self.args[0])


class IllegalStateTransitionError(ValueError):
    """The segment's current state cannot move to the one asked for (RemoteLogSegmentState's rules)."""


def metadata_partition_for(topic_id_partition: TopicIdPartition, num_partitions: int) -> int:
    """The `__remote_log_metadata` partition that carries a user partition's events. Every broker must agree
    on it across restarts, so it is a fixed hash (crc32), not Python's salted hash()."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, not {num_partitions}")
    key = f"{topic_id_partition.topic_id}:{topic_id_partition.topic_partition.partition}"
    return zlib.crc32(key.encode()) % num_partitions


def _epoch_ranges(metadata: RemoteLogSegmentMetadata) -> list[tuple[int, int, int]]:
    """(epoch, first offset, last offset) of each epoch within the segment."""
    epochs = metadata.segment_leader_epochs
    ends = [start - 1 for _, start in epochs[1:]] + [metadata.end_offset]
    return [(epoch, start, end) for (epoch, start), end in zip(epochs, ends, strict=True)]


def _check_leader_epochs(metadata: RemoteLogSegmentMetadata) -> None:
    """The epoch slice must be a slice of a leader-epoch history: the lookups trust each epoch's range to lie
    inside the segment, and a range reaching below its start would hand out a segment without the offset."""
    epochs = metadata.segment_leader_epochs
    ascending = all(e1 < e2 and o1 < o2 for (e1, o1), (e2, o2) in itertools.pairwise(epochs))
    if not ascending or epochs[0][1] != metadata.start_offset or epochs[-1][1] > metadata.end_offset:
        raise ValueError(
            f"Remote segment {metadata.segment_id.id} [{metadata.start_offset}, {metadata.end_offset}] has leader "
            f"epochs {list(epochs)}: they must ascend, in epoch and offset, from the segment's start offset"
        )


class _CopiedRanges:
    """One leader epoch's ranges within COPY_SEGMENT_FINISHED segments, sorted by (start, end, id).

    `_reach[i]` is the highest end among the first i + 1 ranges. A lookup walks back from the last range that
    starts at or below the offset and stops once no earlier range reaches it, so disjoint segments cost one
    step and overlapping copies cost only their overlap."""

    __slots__ = ("_ids", "_keys", "_reach")

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, int]] = []
        self._ids: list[RemoteLogSegmentId] = []
        self._reach: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._keys)

    @property
    def highest_offset(self) -> int:
        return self._reach[-1]

    def add(self, start: int, end: int, segment_id: RemoteLogSegmentId) -> None:
        key = (start, end, segment_id.id.int)
        index = bisect.bisect_left(self._keys, key)
        self._keys.insert(index, key)
        self._ids.insert(index, segment_id)
        self._reach.insert(index, end)
        self._recompute_reach(index)

    def remove(self, start: int, end: int, segment_id: RemoteLogSegmentId) -> None:
        index = bisect.bisect_left(self._keys, (start, end, segment_id.id.int))
        del self._keys[index], self._ids[index], self._reach[index]
        self._recompute_reach(index)

    def find(self, offset: int) -> RemoteLogSegmentId | None:
        """The range holding `offset` with the greatest start; of equal starts, the one reaching furthest."""
        index = bisect.bisect_right(self._keys, offset, key=itemgetter(0)) - 1
        while index >= 0 and self._reach[index] >= offset:
            if self._keys[index][1] >= offset:
                return self._ids[index]
            index -= 1
        return None

    def _recompute_reach(self, index: int) -> None:
        reach = self._reach[index - 1] if index > 0 else -1
        for position in range(index, len(self._keys)):
            reach = max(reach, self._keys[position][1])
            self._reach[position] = reach


class RemoteLogMetadataCache:
    """The remote segments of one partition that have not reached DELETE_SEGMENT_FINISHED.

    Which states each query sees (Kafka's table): lookups by (epoch, offset) and `highest_offset_for_epoch`
    only COPY_SEGMENT_FINISHED, a segment a reader can fetch; the listings every state, so that copies left
    half-way and deletions stuck half-way are found and cleaned up."""

    def __init__(self) -> None:
        self._topic_id_partition: TopicIdPartition | None = None
        self._segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self._ids_by_epoch: dict[int, set[RemoteLogSegmentId]] = {}
        self._copied: dict[int, _CopiedRanges] = {}
        self._remote_size_in_bytes = 0

    def add_copy_in_progress_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Track a segment whose copy has started. It is listed at once (a copy that never finishes must still
        be deleted) but served only once COPY_SEGMENT_FINISHED."""
        if metadata.state != _STARTED:
            raise ValueError(f"A new remote segment must be in state {_STARTED.name}, not {metadata.state.name}")
        segment_id = metadata.segment_id
        existing = self._segments.get(segment_id)
        if existing is not None:
            raise IllegalStateTransitionError(
                f"Remote segment {segment_id.id} is already known, in state {existing.state.name}"
            )
        if self._topic_id_partition is None:
            self._topic_id_partition = segment_id.topic_id_partition
        elif segment_id.topic_id_partition != self._topic_id_partition:
            raise ValueError(f"Remote segment of {segment_id.topic_id_partition} added to {self._topic_id_partition}")
        _check_leader_epochs(metadata)
        self._segments[segment_id] = metadata
        for epoch in metadata.leader_epochs:
            self._ids_by_epoch.setdefault(epoch, set()).add(segment_id)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        """Move a segment to `update.state`; at DELETE_SEGMENT_FINISHED it is forgotten."""
        segment_id = update.segment_id
        existing = self._segments.get(segment_id)
        if existing is None:
            raise UnknownRemoteSegmentError(f"No remote log segment metadata found for {segment_id}")
        if not is_valid_transition(existing.state, update.state):
            raise IllegalStateTransitionError(
                f"Remote segment {segment_id.id} cannot move from {existing.state.name} to {update.state.name}"
            )
        updated = existing.with_update(update)
        if existing.state == _COPIED:
            self._unindex_copied(existing)
        if updated.state == _COPIED:
            self._index_copied(updated)
        if updated.state == _DELETED:
            del self._segments[segment_id]
            for epoch in existing.leader_epochs:
                ids = self._ids_by_epoch[epoch]
                ids.discard(segment_id)
                if not ids:
                    del self._ids_by_epoch[epoch]
        else:
            self._segments[segment_id] = updated

    def remote_log_segment_metadata(self, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The copied segment holding `offset` within its range of `leader_epoch`, if any: of several (overlapping
        copies), the one whose range of the epoch starts last, then the one whose range ends last."""
        ranges = self._copied.get(leader_epoch)
        segment_id = ranges.find(offset) if ranges is not None else None
        return self._segments[segment_id] if segment_id is not None else None

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        """The last offset of `leader_epoch` held by a copied segment, or None if none holds any of it."""
        ranges = self._copied.get(leader_epoch)
        return ranges.highest_offset if ranges is not None else None

    def list_remote_log_segments(self) -> list[RemoteLogSegmentMetadata]:
        """Every segment in any state but DELETE_SEGMENT_FINISHED, by start offset, then event time."""
        return sorted(
            self._segments.values(), key=lambda m: (m.start_offset, m.event_timestamp_ms, m.segment_id.id.int)
        )

    def list_remote_log_segments_for_epoch(self, leader_epoch: int) -> list[RemoteLogSegmentMetadata]:
        """Every segment in any state but DELETE_SEGMENT_FINISHED holding `leader_epoch`, by where that epoch
        starts in it."""
        segments = [self._segments[segment_id] for segment_id in self._ids_by_epoch.get(leader_epoch, ())]
        return sorted(
            segments,
            key=lambda m: (
                dict(m.segment_leader_epochs)[leader_epoch],
                m.start_offset,
                m.event_timestamp_ms,
                m.segment_id.id.int,
            ),
        )

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self._segments.get(segment_id)

    @property
    def remote_size_in_bytes(self) -> int:
        """Bytes of the COPY_SEGMENT_FINISHED segments; overlapping copies each count, as each is an object of
        its own in the remote tier."""
        return self._remote_size_in_bytes

    def _index_copied(self, metadata: RemoteLogSegmentMetadata) -> None:
        for epoch, start, end in _epoch_ranges(metadata):
            self._copied.setdefault(epoch, _CopiedRanges()).add(start, end, metadata.segment_id)
        self._remote_size_in_bytes += metadata.segment_size_in_bytes

    def _unindex_copied(self, metadata: RemoteLogSegmentMetadata) -> None:
        for epoch, start, end in _epoch_ranges(metadata):
            ranges = self._copied[epoch]
            ranges.remove(start, end, metadata.segment_id)
            if not ranges:
                del self._copied[epoch]
        self._remote_size_in_bytes -= metadata.segment_size_in_bytes


class RemoteLogMetadataStore:
    """One broker's remote log metadata for every partition, built by replaying `__remote_log_metadata`."""

    def __init__(self) -> None:
        self._caches: dict[TopicIdPartition, RemoteLogMetadataCache] = {}
        # Events dropped as invalid; they are expected now and then (see apply), so they are counted, not raised.
        self.ignored_events = 0

    def apply(self, event: RemoteLogMetadataEvent) -> None:
        """Fold one event in. An invalid one (a duplicate add, an update of an unknown or deleted segment, an
        illegal transition, a malformed epoch slice) is dropped: the topic is replayed from the start, it may
        hold the tail of a copy or a deletion a dead leader left half-way and a successor redid, and one bad
        record must never stop a broker from loading the rest."""
        topic_id_partition = event.segment_id.topic_id_partition
        cache = self._caches.get(topic_id_partition)
        try:
            if isinstance(event, RemoteLogSegmentMetadata):
                if cache is None:
                    cache = RemoteLogMetadataCache()
                cache.add_copy_in_progress_segment(event)
                self._caches[topic_id_partition] = cache
            elif cache is None:
                raise UnknownRemoteSegmentError(f"No remote log metadata for partition {topic_id_partition}")
            else:
                cache.update_remote_log_segment_metadata(event)
        except (UnknownRemoteSegmentError, ValueError) as e:
            self.ignored_events += 1
            logger.info("[RemoteLogMetadataStore] ignoring %s of %s: %s", event.state.name, topic_id_partition, e)

    def cache(self, topic_id_partition: TopicIdPartition) -> RemoteLogMetadataCache | None:
        return self._caches.get(topic_id_partition)

    def remove_partition(self, topic_id_partition: TopicIdPartition) -> None:
        self._caches.pop(topic_id_partition, None)

    def partitions(self) -> list[TopicIdPartition]:
        return sorted(self._caches, key=lambda tip: (tip.topic_partition, tip.topic_id.int))
