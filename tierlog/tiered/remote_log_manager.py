"""KIP-405's RemoteLogManager, decisions only: which local segments a leader copies next, what a copy
carries, which remote segments expire, and how far the remote tier reaches in a log's lineage
(docs/tiered-storage.md#copy, #remote-deletion, #lineage).

The shell (server/remote_log_tasks.py) runs the copies and deletions through the RemoteStorageManager and
publishes each state change to the remote log metadata; every choice is made here, from the Log, its
leader-epoch history and the partition's RemoteLogMetadataCache, with no clock and no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.log import Log
from tierlog.storage.segment import LogSegment, offset_index_file_path, time_index_file_path
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataCache
from tierlog.tiered.remote_storage_manager import LogSegmentData
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata, RemoteLogSegmentState

CHECKPOINT_VERSION = 0


@dataclass(frozen=True, slots=True)
class CopyCandidate:
    """A rolled local segment to copy: offsets [segment.base_offset, end_offset]."""

    segment: LogSegment
    end_offset: int


def copy_candidates(log: Log, copied_offset: int, last_stable_offset: int) -> list[CopyCandidate]:
    """Kafka's candidateLogSegments: every non-active segment from the one holding max(copied offset + 1,
    local log start) whose last offset is below the LSO (a segment is only whole once the next one starts)."""
    from_offset = max(copied_offset + 1, log.local_log_start_offset)
    segments = log.segments
    candidates = []
    for segment, next_segment in itertools.pairwise(segments):
        end_offset = next_segment.base_offset - 1
        if end_offset < from_offset or segment.size == 0:
            continue
        if next_segment.base_offset > last_stable_offset:
            break
        candidates.append(CopyCandidate(segment, end_offset))
    return candidates


def segment_data(log: Log, candidate: CopyCandidate) -> LogSegmentData:
    """What the copy of a candidate uploads (Kafka's copyLogSegment): the segment's log, indexes and, if it
    has one, transaction index (docs/transactions.md#tiered: an aborted transaction's marker is in it; copied
    below the LSO, it gains no entry afterwards), the producer snapshot taken when the next segment was rolled
    (the producer state as of the segment's end; missing only for segments rolled before snapshots existed) and
    the leader-epoch history up to the segment's end."""
    segment = candidate.segment
    txn_index = segment.txn_index.path
    end_offset_exclusive = candidate.end_offset + 1
    return LogSegmentData(
        log_segment=segment.log_path,
        offset_index=offset_index_file_path(log.dir, segment.base_offset),
        time_index=time_index_file_path(log.dir, segment.base_offset),
        transaction_index=txn_index if txn_index.exists() else None,
        producer_snapshot=log.fetch_producer_snapshot(end_offset_exclusive),
        leader_epoch_checkpoint=epoch_checkpoint_bytes(log.leader_epoch_cache.epoch_entries(), end_offset_exclusive),
    )


def copy_lag_bytes(log: Log) -> int:
    """Kafka's RemoteCopyLagBytes: bytes of the rolled segments the leader copies next (above Ry, below the
    LSO); a segment Ry falls inside counts whole, as it is copied whole."""
    return sum(
        c.segment.size for c in copy_candidates(log, log.highest_offset_in_remote_storage, log.last_stable_offset)
    )


def epochs_in_range(entries: Sequence[EpochEntry], start_offset: int, end_offset: int) -> tuple[tuple[int, int], ...]:
    """The segment's slice of the epoch history, [start_offset, end_offset] inclusive: Kafka's
    epochEntriesInRange, whose first entry is clamped to start at the segment's first offset."""
    result: list[tuple[int, int]] = []
    for index, entry in enumerate(entries):
        next_start = entries[index + 1].start_offset if index + 1 < len(entries) else None
        if entry.start_offset > end_offset:
            break
        if next_start is not None and next_start <= start_offset:
            continue
        result.append((entry.epoch, max(entry.start_offset, start_offset)))
    return tuple(result)


def epoch_checkpoint_bytes(entries: Sequence[EpochEntry], end_offset_exclusive: int) -> bytes:
    """The leader-epoch-checkpoint file as of a segment's end (the whole history up to it), in Kafka's file
    format, so a follower rebuilding its state reads what a local checkpoint would hold."""
    kept = [entry for entry in entries if entry.start_offset < end_offset_exclusive]
    lines = [str(CHECKPOINT_VERSION), str(len(kept))] + [f"{e.epoch} {e.start_offset}" for e in kept]
    return "".join(line + "\n" for line in lines).encode()


def parse_epoch_checkpoint(data: bytes) -> list[tuple[int, int]]:
    """Inverse of epoch_checkpoint_bytes; ValueError on anything else."""
    lines = data.decode().splitlines()
    if len(lines) < 2 or int(lines[0]) != CHECKPOINT_VERSION:
        raise ValueError("not a leader-epoch checkpoint")
    entries = [(int(epoch), int(offset)) for epoch, offset in (line.split() for line in lines[2:])]
    if len(entries) != int(lines[1]):
        raise ValueError("leader-epoch checkpoint entry count does not match")
    return entries


def highest_remote_offset(
    entries: Sequence[EpochEntry], log_end_offset: int, cache: RemoteLogMetadataCache | None
) -> int:
    """Kafka's findHighestRemoteOffset: walking this log's epochs from the latest down, the highest offset
    the remote tier holds for the first epoch it holds any of, within that epoch's range here; -1 if none.
    Copies from another lineage (a deposed leader's) never count."""
    if cache is None:
        return -1
    for index in range(len(entries) - 1, -1, -1):
        epoch = entries[index].epoch
        highest = cache.highest_offset_for_epoch(epoch)
        if highest is None:
            continue
        epoch_end = entries[index + 1].start_offset - 1 if index + 1 < len(entries) else log_end_offset - 1
        return min(highest, epoch_end)
    return -1


def is_within_lineage(segment: RemoteLogSegmentMetadata, entries: Sequence[EpochEntry], log_end_offset: int) -> bool:
    """Kafka's isRemoteSegmentWithinLeaderEpochs: the segment's epochs are epochs of this log starting where
    they start here (its first may start later), and it ends before the next epoch here and below the LEO.

    Epochs older than this log's first are of offsets below the log start and are not compared, and the first
    epoch here may start anywhere in the segment: moving the log start (retention, DeleteRecords) drops the
    older entries and moves the first one up to the log start, while the segment holding the log start
    keeps the history as it was copied."""
    if not entries:
        return False
    first_epoch = entries[0].epoch
    starts = {entry.epoch: entry.start_offset for entry in entries}
    epochs = [(epoch, offset) for epoch, offset in segment.segment_leader_epochs if epoch >= first_epoch]
    last_epoch = segment.segment_leader_epochs[-1][0]
    if last_epoch < first_epoch or last_epoch > entries[-1].epoch:
        return False
    sorted_epochs = [entry.epoch for entry in entries]
    for index, (epoch, offset) in enumerate(epochs):
        start = starts.get(epoch)
        if start is None:
            return False
        if index == 0 and epoch != first_epoch and offset < start:
            return False
        position = sorted_epochs.index(epoch)
        next_here = entries[position + 1] if position + 1 < len(entries) else None
        if epoch == last_epoch:
            if next_here is not None and segment.end_offset > next_here.start_offset - 1:
                return False
        elif next_here is None or (next_here.epoch, next_here.start_offset) != epochs[index + 1]:
            return False
    return segment.end_offset < log_end_offset


@dataclass(frozen=True, slots=True)
class RemoteDeletion:
    segment: RemoteLogSegmentMetadata
    reason: str


@dataclass(frozen=True, slots=True)
class ExpirationPlan:
    deletions: list[RemoteDeletion]
    # The log start once the deletions are done: the highest deleted end + 1 of the lineage's segments.
    new_log_start_offset: int | None


def plan_remote_expiration(
    log: Log, cache: RemoteLogMetadataCache, now_ms: int, in_progress: frozenset[object] = frozenset()
) -> ExpirationPlan:
    """docs/tiered-storage.md#remote-deletion, on the leader. A segment goes if (a) all its epochs are at most the first
    cached epoch and it ends below the log start, (b) it is in the current lineage and breaches retention.ms
    or retention.bytes (oldest first, bytes counted over the remote tier plus local-only data) or ends below
    the log start, or (c) all its epochs are below the earliest cached epoch. Other segments outside the
    lineage wait for (a) or (c). Copies still in progress (`in_progress` segment ids) are left alone."""
    entries = log.leader_epoch_cache.epoch_entries()
    config = log.config
    log_start = log.log_start_offset
    log_end = log.log_end_offset
    earliest_epoch = entries[0].epoch if entries else None
    segments = [s for s in cache.list_remote_log_segments() if s.segment_id.id not in in_progress]

    retention_ms = config.retention_ms if config.delete else -1
    retention_bytes = config.retention_bytes if config.delete else -1
    lineage = [
        s
        for s in segments
        if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED and is_within_lineage(s, entries, log_end)
    ]
    remaining_breach = 0
    if retention_bytes >= 0:
        highest = log.highest_offset_in_remote_storage
        only_local = sum(s.size for s in log.segments if s.base_offset > highest)
        remaining_breach = only_local + sum(s.segment_size_in_bytes for s in lineage) - retention_bytes

    deletions: list[RemoteDeletion] = []
    chosen: set[object] = set()
    new_log_start: int | None = None
    retention_stopped = False
    for segment in lineage:
        reason = None
        if segment.end_offset < log_start:
            reason = f"ends below the log start {log_start}"
        elif not retention_stopped:
            if retention_ms >= 0 and segment.max_timestamp_ms <= now_ms - retention_ms:
                reason = f"breaches retention.ms {retention_ms}"
            elif retention_bytes >= 0 and remaining_breach - segment.segment_size_in_bytes >= 0:
                reason = f"breaches retention.bytes {retention_bytes}"
            else:
                retention_stopped = True  # retention removes the oldest data first: nothing later breaches
        if reason is not None:
            # Whatever the reason, the segment's bytes leave the log: they no longer count against retention.bytes.
            remaining_breach -= segment.segment_size_in_bytes
            deletions.append(RemoteDeletion(segment, reason))
            chosen.add(segment.segment_id.id)
            new_log_start = max(new_log_start or 0, segment.end_offset + 1)

    for segment in segments:
        copied_or_copying = (RemoteLogSegmentState.COPY_SEGMENT_FINISHED, RemoteLogSegmentState.COPY_SEGMENT_STARTED)
        if segment.segment_id.id in chosen or segment.state not in copied_or_copying or earliest_epoch is None:
            continue
        epochs = segment.leader_epochs
        reason = None
        if max(epochs) < earliest_epoch:
            reason = f"all its epochs {epochs} are below the earliest cached epoch {earliest_epoch}"
        elif max(epochs) <= earliest_epoch and segment.end_offset < log_start:
            reason = f"epochs {epochs} at most the first cached epoch and ends below the log start {log_start}"
        elif segment.state == RemoteLogSegmentState.COPY_SEGMENT_STARTED and segment.end_offset < log_start:
            reason = f"an abandoned copy below the log start {log_start}"
        if reason is not None:
            deletions.append(RemoteDeletion(segment, reason))
            chosen.add(segment.segment_id.id)
    # Deletions already started (a broker died half-way) are finished by whoever leads now.
    for segment in segments:
        if segment.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED and segment.segment_id.id not in chosen:
            deletions.append(RemoteDeletion(segment, "a deletion left unfinished"))
    if new_log_start is not None:
        new_log_start = min(new_log_start, log.high_watermark)
        if new_log_start <= log_start:
            new_log_start = None
    return ExpirationPlan(deletions, new_log_start)
