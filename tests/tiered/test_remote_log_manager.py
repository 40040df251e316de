"""The RemoteLogManager's decisions (tiered/remote_log_manager.py) against Kafka's RemoteLogManager and
RemoteLogManagerTest, docs/tiered-storage.md and its story-layout: which local segments a leader copies, the epoch
slice and leader-epoch checkpoint a copy carries, how far the remote tier reaches in this log's lineage,
which remote segments are of the lineage, and which remote segments expire.

Everything runs on real Logs (one-record batches, segment.bytes sized so a segment holds a fixed number of
them) and a real RemoteLogMetadataCache fed with the events the shell would publish.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from storage_helpers import T0, TP, log_config, open_log

from tierlog.records.codec import build_batch
from tierlog.storage.checkpoints import LEADER_EPOCH_CHECKPOINT_FILENAME
from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.log import Log
from tierlog.tiered.remote_log_manager import (
    CopyCandidate,
    ExpirationPlan,
    copy_candidates,
    epoch_checkpoint_bytes,
    epochs_in_range,
    highest_remote_offset,
    is_within_lineage,
    parse_epoch_checkpoint,
    plan_remote_expiration,
)
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataCache
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
COPIED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETING = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

TIP = TopicIdPartition(uuid.UUID(int=0x405), TP)
# docs/tiered-storage.md#story-layout: msg 0-2 in LE-0, 3-4 in LE-1, 5-6 in LE-2, 7-9 in LE-3; remote segments
# 0-2, 3-5, 6-8.
SEED_EPOCHS = [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
SEED_ENTRIES = [EpochEntry(0, 0), EpochEntry(1, 3), EpochEntry(2, 5), EpochEntry(3, 7)]

_ids = itertools.count(1)


def make_batch(*, timestamp: int = T0) -> bytearray:
    """One one-record batch as a producer sends it (the leader stamps offset and epoch on append)."""
    return bytearray(build_batch([(b"k", b"v" * 16, (), timestamp)]))


BATCH = len(make_batch())


def open_remote_log(directory: Path, *, batches_per_segment: int = 1, **overrides: object) -> Log:
    config = log_config(segment_bytes=BATCH * batches_per_segment, **overrides)
    return open_log(directory / "topic-0", config, remote_log_enabled=True)


def append(log: Log, epochs: Sequence[int], timestamps: Sequence[int] | None = None) -> None:
    """One one-record batch per epoch given (as leader of that epoch), then the HW to the LEO."""
    for index, epoch in enumerate(epochs):
        timestamp = timestamps[index] if timestamps is not None else T0
        log.append_as_leader(make_batch(timestamp=timestamp), epoch, T0)
    log.update_high_watermark(log.log_end_offset)


def seed_log(directory: Path, **overrides: object) -> Log:
    """Seed 001's leader: segments [0-2] [3-5] [6-8] and the active [9], epochs LE-0:0 LE-1:3 LE-2:5 LE-3:7."""
    log = open_remote_log(directory, batches_per_segment=3, **overrides)
    append(log, SEED_EPOCHS)
    return log


def ranges(candidates: Iterable[CopyCandidate]) -> list[tuple[int, int]]:
    """(first offset, last offset) of each copy candidate."""
    return [(candidate.segment.base_offset, candidate.end_offset) for candidate in candidates]


def entries_of(log: Log) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.epoch_entries()]


def remote_segment(
    start: int,
    end: int,
    epochs: Sequence[tuple[int, int]],
    *,
    size: int = BATCH,
    max_timestamp: int = T0,
    event_ms: int = 0,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TIP, uuid.UUID(int=next(_ids))),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=max_timestamp,
        broker_id=0,
        event_timestamp_ms=event_ms,
        segment_size_in_bytes=size,
        segment_leader_epochs=tuple(epochs),
    )


def publish_update(
    cache: RemoteLogMetadataCache, metadata: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState
) -> None:
    for state in states:
        cache.update_remote_log_segment_metadata(
            RemoteLogSegmentMetadataUpdate(metadata.segment_id, metadata.event_timestamp_ms + 1, state, 0)
        )


def publish(
    cache: RemoteLogMetadataCache, metadata: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState
) -> RemoteLogSegmentMetadata:
    """Add the segment (COPY_SEGMENT_STARTED) and move it through `states`; returns it as the cache has it."""
    cache.add_copy_in_progress_segment(metadata)
    publish_update(cache, metadata, *states)
    current = cache.segment(metadata.segment_id)
    assert current is not None
    return current


def copy_local_segments(log: Log, cache: RemoteLogMetadataCache, count: int) -> list[RemoteLogSegmentMetadata]:
    """Copy the first `count` local segments as the shell does (metadata from the segment and its epoch
    slice, COPY_SEGMENT_FINISHED) and move the log's highest offset in remote storage."""
    segments = log.segments
    copied = []
    for segment, next_segment in itertools.pairwise(segments[: count + 1]):
        end = next_segment.base_offset - 1
        metadata = remote_segment(
            segment.base_offset,
            end,
            epochs_in_range(log.leader_epoch_cache.epoch_entries(), segment.base_offset, end),
            size=segment.size,
            max_timestamp=segment.max_timestamp_so_far,
        )
        copied.append(publish(cache, metadata, COPIED))
        log.update_highest_offset_in_remote_storage(end)
    assert len(copied) == count
    return copied


def deleted_ids(plan: ExpirationPlan) -> list[uuid.UUID]:
    return [deletion.segment.segment_id.id for deletion in plan.deletions]


def ids(*segments: RemoteLogSegmentMetadata) -> list[uuid.UUID]:
    return [segment.segment_id.id for segment in segments]


# copy_candidates


def test_only_rolled_segments_are_copy_candidates(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    candidates = copy_candidates(log, -1, log.high_watermark)
    assert ranges(candidates) == [(0, 2), (3, 5), (6, 8)]
    assert [c.segment for c in candidates] == log.segments[:-1]  # the active segment [9] never


def test_a_log_with_only_its_active_segment_has_no_candidates(tmp_path: Path) -> None:
    log = open_remote_log(tmp_path, batches_per_segment=10)
    append(log, [0, 0, 0])
    assert copy_candidates(log, -1, log.high_watermark) == []


def test_a_rolled_segment_whose_active_successor_is_empty_is_a_candidate(tmp_path: Path) -> None:
    log = open_remote_log(tmp_path, batches_per_segment=10)
    append(log, [0, 0, 0])
    log.roll(T0)
    assert ranges(copy_candidates(log, -1, log.high_watermark)) == [(0, 2)]


@pytest.mark.parametrize(
    ("last_stable_offset", "expected"),
    [
        (10, [(0, 2), (3, 5), (6, 8)]),
        (9, [(0, 2), (3, 5), (6, 8)]),  # [6-8] ends below the LSO once [9] starts at it
        (8, [(0, 2), (3, 5)]),  # offset 8 is not stable yet
        (6, [(0, 2), (3, 5)]),
        (5, [(0, 2)]),
        (3, [(0, 2)]),
        (2, []),
        (0, []),
    ],
)
def test_a_segment_is_a_candidate_only_once_the_next_segment_starts_at_or_below_the_lso(
    tmp_path: Path, last_stable_offset: int, expected: list[tuple[int, int]]
) -> None:
    log = seed_log(tmp_path)
    assert ranges(copy_candidates(log, -1, last_stable_offset)) == expected


@pytest.mark.parametrize(
    ("copied_offset", "expected"),
    [
        (-1, [(0, 2), (3, 5), (6, 8)]),
        (2, [(3, 5), (6, 8)]),
        (5, [(6, 8)]),
        (8, []),
        (9, []),  # copied past the LSO (a follower's view): nothing
    ],
)
def test_candidates_start_after_the_copied_offset(
    tmp_path: Path, copied_offset: int, expected: list[tuple[int, int]]
) -> None:
    log = seed_log(tmp_path)
    assert ranges(copy_candidates(log, copied_offset, log.high_watermark)) == expected


@pytest.mark.parametrize("copied_offset", [3, 4])
def test_a_segment_holding_the_next_offset_to_copy_in_its_middle_is_copied_again_whole(
    tmp_path: Path, copied_offset: int
) -> None:
    # Another leader's copy ended inside [3-5]: Kafka copies the whole segment again and tolerates the overlap.
    log = seed_log(tmp_path)
    assert ranges(copy_candidates(log, copied_offset, log.high_watermark)) == [(3, 5), (6, 8)]


def test_candidates_start_at_the_local_log_start_above_the_copied_offset(tmp_path: Path) -> None:
    # DeleteRecords moved the log start into [3-5] before anything was copied; [0-2] is still on disk until
    # local retention removes it, but it is below the log start and never copied.
    log = seed_log(tmp_path)
    assert log.maybe_increment_log_start_offset(4)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert ranges(copy_candidates(log, -1, log.high_watermark)) == [(3, 5), (6, 8)]


def test_candidates_start_at_the_local_log_start_once_local_retention_dropped_segments(tmp_path: Path) -> None:
    log = seed_log(tmp_path, local_retention_bytes=1)
    log.update_highest_offset_in_remote_storage(2)
    assert log.delete_old_segments(T0) == 1  # only [0-2] is copied
    assert (log.log_start_offset, log.local_log_start_offset) == (0, 3)
    # A new leader that has not learned the copied offset yet copies from the local log start.
    assert ranges(copy_candidates(log, -1, log.high_watermark)) == [(3, 5), (6, 8)]


def test_empty_rolled_segments_are_skipped(tmp_path: Path) -> None:
    # A follower rolls at the leader's next offset; a gap in the offsets (compaction upstream, or a roll at
    # an expected offset past the LEO) leaves an empty, rolled segment behind.
    log = open_remote_log(tmp_path, batches_per_segment=3)
    append(log, [0, 0, 0])
    log.roll(T0)
    log.roll(T0, expected_next_offset=6)
    log.append_as_follower(build_batch([(b"k", b"v", (), T0)], base_offset=6, partition_leader_epoch=0), T0)
    log.roll(T0)
    log.append_as_follower(build_batch([(b"k", b"v", (), T0)], base_offset=7, partition_leader_epoch=0), T0)
    log.update_high_watermark(log.log_end_offset)
    assert [(s.base_offset, s.size == 0) for s in log.segments] == [(0, False), (3, True), (6, False), (7, False)]
    assert ranges(copy_candidates(log, -1, log.high_watermark)) == [(0, 2), (6, 6)]
    assert ranges(copy_candidates(log, 2, log.high_watermark)) == [(6, 6)]


# epochs_in_range


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # Seed 001's seg-6-8: LE-2 starts at 5, before the segment, and is clamped to its first offset.
        (6, 8, ((2, 6), (3, 7))),
        (3, 5, ((1, 3), (2, 5))),  # seg-3-5: LE-1 starts exactly at the segment start
        (0, 2, ((0, 0),)),  # seg-0-2: LE-1 starting at 3 is past the segment's end
        (7, 8, ((3, 7),)),  # LE-2 ends at 6, before the segment
        (4, 4, ((1, 4),)),  # a single offset in the middle of an epoch
        (9, 11, ((3, 9),)),  # the latest epoch, clamped
        (3, 7, ((1, 3), (2, 5), (3, 7))),  # ends exactly where an epoch starts
        (0, 9, ((0, 0), (1, 3), (2, 5), (3, 7))),
    ],
)
def test_a_segments_epochs_are_its_slice_of_the_history_clamped_to_its_start(
    start: int, end: int, expected: tuple[tuple[int, int], ...]
) -> None:
    assert epochs_in_range(SEED_ENTRIES, start, end) == expected


def test_epochs_in_range_of_a_real_logs_segments_match_seed_001(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    entries = log.leader_epoch_cache.epoch_entries()
    assert entries == SEED_ENTRIES
    slices = [epochs_in_range(entries, c.segment.base_offset, c.end_offset) for c in copy_candidates(log, -1, 10)]
    assert slices == [((0, 0),), ((1, 3), (2, 5)), ((2, 6), (3, 7))]


def test_epochs_in_range_of_an_empty_history_is_empty() -> None:
    assert epochs_in_range([], 0, 10) == ()


def test_epochs_in_range_is_a_valid_segment_slice_for_the_cache(tmp_path: Path) -> None:
    # The cache refuses slices that do not start at the segment's start offset; every slice made here must pass.
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    copied = copy_local_segments(log, cache, 3)
    assert [s.segment_leader_epochs[0][1] for s in copied] == [s.start_offset for s in copied]


# epoch_checkpoint_bytes / parse_epoch_checkpoint


@pytest.mark.parametrize(
    ("end_exclusive", "expected"),
    [
        (10, b"0\n4\n0 0\n1 3\n2 5\n3 7\n"),
        (9, b"0\n4\n0 0\n1 3\n2 5\n3 7\n"),  # seg-6-8's checkpoint: the whole history up to its end
        (7, b"0\n3\n0 0\n1 3\n2 5\n"),  # LE-3 starts at 7, not before it
        (6, b"0\n3\n0 0\n1 3\n2 5\n"),  # seg-3-5's
        (3, b"0\n1\n0 0\n"),  # seg-0-2's
        (0, b"0\n0\n"),
    ],
)
def test_the_checkpoint_holds_the_entries_starting_before_the_segments_end_in_kafkas_format(
    end_exclusive: int, expected: bytes
) -> None:
    assert epoch_checkpoint_bytes(SEED_ENTRIES, end_exclusive) == expected


def test_the_checkpoint_is_byte_for_byte_the_local_leader_epoch_checkpoint_file(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    local = (log.dir / LEADER_EPOCH_CHECKPOINT_FILENAME).read_bytes()
    assert epoch_checkpoint_bytes(log.leader_epoch_cache.epoch_entries(), log.log_end_offset) == local


@pytest.mark.parametrize("end_exclusive", range(11))
def test_the_checkpoint_round_trips(end_exclusive: int) -> None:
    data = epoch_checkpoint_bytes(SEED_ENTRIES, end_exclusive)
    expected = [(e.epoch, e.start_offset) for e in SEED_ENTRIES if e.start_offset < end_exclusive]
    assert parse_epoch_checkpoint(data) == expected


def test_an_empty_history_round_trips() -> None:
    assert parse_epoch_checkpoint(epoch_checkpoint_bytes([], 10)) == []


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"0\n",  # no count
        b"1\n0\n",  # an unknown version
        b"x\n0\n",
        b"0\nx\n",
        b"0\n2\n0 0\n",  # fewer entries than counted
        b"0\n1\n0 0\n1 3\n",  # more entries than counted
        b"0\n1\n0\n",  # an entry without its offset
        b"0\n1\n0 0 0\n",
        b"0\n1\nzero 0\n",
        b"0\n1\n0 0\n\n",  # a blank line is not an entry
        b"\xff\xfe",  # not text
    ],
)
def test_a_malformed_checkpoint_raises_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_epoch_checkpoint(data)


# highest_remote_offset


def test_highest_remote_offset_without_a_cache_is_minus_one(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    assert highest_remote_offset(log.leader_epoch_cache.epoch_entries(), log.log_end_offset, None) == -1


def test_highest_remote_offset_without_copied_segments_is_minus_one(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    entries = log.leader_epoch_cache.epoch_entries()
    assert highest_remote_offset(entries, log.log_end_offset, cache) == -1
    publish(cache, remote_segment(0, 2, [(0, 0)]))  # a copy that has only started serves nothing
    assert highest_remote_offset(entries, log.log_end_offset, cache) == -1
    assert highest_remote_offset([], log.log_end_offset, cache) == -1


@pytest.mark.parametrize(("copied", "expected"), [(1, 2), (2, 5), (3, 8)])
def test_highest_remote_offset_is_the_end_of_the_latest_epoch_with_copies(
    tmp_path: Path, copied: int, expected: int
) -> None:
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, copied)
    assert highest_remote_offset(log.leader_epoch_cache.epoch_entries(), log.log_end_offset, cache) == expected


def test_highest_remote_offset_falls_back_to_earlier_epochs_and_drops_with_deletions(tmp_path: Path) -> None:
    # Kafka's testFindHighestRemoteOffset: only epoch 0 is copied, the latest epoch 1 is not.
    log = open_remote_log(tmp_path, batches_per_segment=3)
    append(log, [0, 0, 0, 0, 0, 0, 1, 1])
    cache = RemoteLogMetadataCache()
    _first, second = copy_local_segments(log, cache, 2)
    entries = log.leader_epoch_cache.epoch_entries()
    assert highest_remote_offset(entries, log.log_end_offset, cache) == 5
    publish_update(cache, second, DELETING)
    assert highest_remote_offset(entries, log.log_end_offset, cache) == 2


def test_copies_of_an_epoch_not_in_this_log_are_ignored(tmp_path: Path) -> None:
    # A deposed leader copied [3-6] in an epoch 2 this log never had (its own epoch 1 starts at 3).
    log = open_remote_log(tmp_path, batches_per_segment=3)
    append(log, [0, 0, 0, 1, 1, 1, 1])
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, 1)
    publish(cache, remote_segment(3, 6, [(2, 3)]), COPIED)
    assert entries_of(log) == [(0, 0), (1, 3)]
    assert highest_remote_offset(log.leader_epoch_cache.epoch_entries(), log.log_end_offset, cache) == 2


def test_highest_remote_offset_is_capped_at_the_epochs_end_here(tmp_path: Path) -> None:
    # Kafka's testFindHighestRemoteOffsetWithUncleanLeaderElection: another lineage copied epoch 0 up to 4,
    # but here epoch 0 ends at 2, so only offsets up to 2 are this log's.
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    publish(cache, remote_segment(0, 4, [(0, 0)]), COPIED)
    assert highest_remote_offset(log.leader_epoch_cache.epoch_entries(), log.log_end_offset, cache) == 2


def test_highest_remote_offset_in_the_latest_epoch_is_capped_below_the_log_end(tmp_path: Path) -> None:
    # A follower behind the leader: the leader copied LE-3 up to 12, this log ends at 10.
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    publish(cache, remote_segment(7, 12, [(3, 7)]), COPIED)
    assert highest_remote_offset(log.leader_epoch_cache.epoch_entries(), log.log_end_offset, cache) == 9


# is_within_lineage (Kafka's testRemoteSegmentWithinLeaderEpochs and ...ForOverlappingSegments)

KAFKA_ENTRIES = [EpochEntry(e, o) for e, o in [(0, 0), (1, 10), (2, 20), (3, 30), (4, 40), (5, 50), (7, 70)]]
KAFKA_LOG_END = 90
OVERLAP_ENTRIES = [EpochEntry(7, 51), EpochEntry(9, 100)]
OVERLAP_LOG_END = 210


@pytest.mark.parametrize(
    ("start", "end", "epochs", "expected"),
    [
        pytest.param(15, 35, [(1, 15), (2, 20), (3, 30)], True, id="several epochs, the first starting later"),
        pytest.param(15, 19, [(1, 15)], True, id="one epoch"),
        pytest.param(0, 5, [(0, 0)], True, id="starts where the first epoch starts"),
        pytest.param(70, 75, [(7, 70)], True, id="starts where the latest epoch starts"),
        pytest.param(15, 29, [(1, 15), (2, 20)], True, id="ends where its last epoch ends"),
        pytest.param(70, 89, [(7, 70)], True, id="ends just below the log end"),
        pytest.param(55, 85, [(5, 55), (6, 60), (7, 70)], False, id="an epoch this log never had"),
        pytest.param(15, 45, [(1, 15), (2, 20), (4, 40)], False, id="misses an epoch of this log"),
        pytest.param(15, 35, [(1, 15), (2, 21), (3, 30)], False, id="an epoch starts elsewhere here"),
        pytest.param(70, 95, [(7, 70)], False, id="ends past the log end"),
        pytest.param(70, 90, [(7, 70)], False, id="ends at the log end"),
        pytest.param(5, 25, [(1, 5), (2, 20)], False, id="first epoch starts earlier than here"),
        pytest.param(15, 35, [(1, 15), (2, 20)], False, id="last epoch ends later than here"),
        pytest.param(60, 65, [(6, 60)], False, id="an epoch between two of this log"),
        pytest.param(80, 85, [(8, 80)], False, id="an epoch above this log's latest"),
    ],
)
def test_segment_within_lineage_as_kafka_decides(
    start: int, end: int, epochs: list[tuple[int, int]], expected: bool
) -> None:
    assert is_within_lineage(remote_segment(start, end, epochs), KAFKA_ENTRIES, KAFKA_LOG_END) is expected


@pytest.mark.parametrize(
    ("start", "end", "epochs", "expected"),
    [
        # Copied before the log start moved to 51, when the history here was (5, 10), (7, 15), (9, 100): its
        # epochs below the first one here are of offsets below the log start and do not count.
        pytest.param(14, 150, [(5, 14), (7, 15), (9, 100)], True, id="starts below the log start"),
        pytest.param(2, 7, [(2, 5), (3, 6)], False, id="all its epochs below this log's first"),
        pytest.param(15, 250, [(7, 15), (9, 100), (10, 200)], False, id="an epoch above this log's latest"),
        pytest.param(75, 100, [(8, 75)], False, id="an epoch this log never had"),
        pytest.param(15, 150, [(7, 15), (9, 101)], False, id="its next epoch starts elsewhere"),
        pytest.param(99, 150, [(9, 99)], False, id="its first epoch starts earlier than here"),
    ],
)
def test_overlapping_segments_within_lineage_as_kafka_decides(
    start: int, end: int, epochs: list[tuple[int, int]], expected: bool
) -> None:
    assert is_within_lineage(remote_segment(start, end, epochs), OVERLAP_ENTRIES, OVERLAP_LOG_END) is expected


def test_no_segment_is_within_an_empty_history() -> None:
    assert not is_within_lineage(remote_segment(0, 5, [(0, 0)]), [], 10)


def test_the_segment_holding_the_log_start_stays_within_the_lineage_after_delete_records(tmp_path: Path) -> None:
    # DeleteRecords to 4 moves the first epoch entry up to the new log start: LE-1 now "starts" at 4, but
    # seg-3-5 (LE-1 from 3) still holds offsets 4 and 5 of this log.
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    first, second, third = copy_local_segments(log, cache, 3)
    log.maybe_increment_log_start_offset(4)
    entries = log.leader_epoch_cache.epoch_entries()
    assert entries_of(log) == [(1, 4), (2, 5), (3, 7)]
    assert is_within_lineage(second, entries, log.log_end_offset)
    assert is_within_lineage(third, entries, log.log_end_offset)
    assert not is_within_lineage(first, entries, log.log_end_offset)  # its LE-0 is gone from the history


def test_seed_001_segments_are_within_the_leaders_lineage(tmp_path: Path) -> None:
    log = seed_log(tmp_path)
    cache = RemoteLogMetadataCache()
    copied = copy_local_segments(log, cache, 3)
    entries = log.leader_epoch_cache.epoch_entries()
    assert all(is_within_lineage(segment, entries, log.log_end_offset) for segment in copied)
    # The same offsets copied by a leader whose LE-2 started at 6 are another lineage.
    assert not is_within_lineage(remote_segment(3, 5, [(1, 3)]), entries, log.log_end_offset)
    assert not is_within_lineage(remote_segment(6, 8, [(2, 6), (3, 8)]), entries, log.log_end_offset)


# plan_remote_expiration


def test_nothing_expires_without_remote_segments(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=0, retention_bytes=0)
    assert plan_remote_expiration(log, RemoteLogMetadataCache(), T0 + 10) == ExpirationPlan([], None)


def test_nothing_expires_within_retention(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=1000, retention_bytes=1 << 20)
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, 3)
    assert plan_remote_expiration(log, cache, T0 + 999) == ExpirationPlan([], None)


def test_retention_ms_deletes_the_oldest_segments_and_stops_at_the_first_that_does_not_breach(
    tmp_path: Path,
) -> None:
    log = open_remote_log(tmp_path, retention_ms=2000)
    # Segment max timestamps; [3] holds an old timestamp but comes after a segment within retention.
    append(log, [0] * 5, timestamps=[T0, T0 + 1000, T0 + 5000, T0, T0 + 6000])
    cache = RemoteLogMetadataCache()
    s0, s1, s2, s3 = copy_local_segments(log, cache, 4)
    plan = plan_remote_expiration(log, cache, T0 + 3000)  # breached: max timestamp <= T0 + 1000
    assert deleted_ids(plan) == ids(s0, s1)
    assert not set(ids(s2, s3)) & set(deleted_ids(plan))  # [3] is as old as [0], but newer data precedes it
    assert all("retention.ms" in d.reason for d in plan.deletions)
    assert plan.new_log_start_offset == 2


def test_retention_ms_breach_is_inclusive_of_the_cutoff(tmp_path: Path) -> None:
    log = open_remote_log(tmp_path, retention_ms=2000)
    append(log, [0, 0], timestamps=[T0, T0])
    cache = RemoteLogMetadataCache()
    (s0,) = copy_local_segments(log, cache, 1)
    assert deleted_ids(plan_remote_expiration(log, cache, T0 + 1999)) == []
    assert deleted_ids(plan_remote_expiration(log, cache, T0 + 2000)) == ids(s0)


@pytest.mark.parametrize(
    ("retention_batches", "deleted"),
    [
        (6, 0),  # 4 remote + 2 local-only = 6 batches: within retention
        (5, 1),
        (4, 2),
        (3, 3),
        (0, 4),  # everything remote goes; the local-only data stays
    ],
)
def test_retention_bytes_counts_remote_and_local_only_bytes(
    tmp_path: Path, retention_batches: int, deleted: int
) -> None:
    # Six one-batch segments, [0]..[3] copied and still on disk too: they count once, as remote data.
    log = open_remote_log(tmp_path, retention_ms=-1, retention_bytes=retention_batches * BATCH)
    append(log, [0] * 6)
    cache = RemoteLogMetadataCache()
    copied = copy_local_segments(log, cache, 4)
    plan = plan_remote_expiration(log, cache, T0)
    assert deleted_ids(plan) == ids(*copied[:deleted])
    assert all("retention.bytes" in d.reason for d in plan.deletions)
    assert plan.new_log_start_offset == (deleted or None)


def test_retention_bytes_deletes_only_whole_segments_within_the_excess(tmp_path: Path) -> None:
    log = open_remote_log(tmp_path, retention_ms=-1, retention_bytes=5 * BATCH + 1)  # 1 byte short of a batch
    append(log, [0] * 6)
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, 4)
    assert plan_remote_expiration(log, cache, T0) == ExpirationPlan([], None)


def test_segments_deleted_for_retention_ms_count_against_the_retention_bytes_excess(tmp_path: Path) -> None:
    # 6 batches against retention.bytes of 5: one batch too many. [0] goes for its age and that is enough;
    # Kafka's isSegmentBreachedByRetentionTime lowers the remaining excess too.
    log = open_remote_log(tmp_path, retention_ms=2000, retention_bytes=5 * BATCH)
    append(log, [0] * 6, timestamps=[T0, T0 + 5000, T0 + 5000, T0 + 5000, T0 + 5000, T0 + 5000])
    cache = RemoteLogMetadataCache()
    s0, *_ = copy_local_segments(log, cache, 4)
    plan = plan_remote_expiration(log, cache, T0 + 3000)
    assert deleted_ids(plan) == ids(s0)
    assert plan.new_log_start_offset == 1


def test_segments_below_the_log_start_count_against_the_retention_bytes_excess(tmp_path: Path) -> None:
    # DeleteRecords to 1: [0] goes for the log start, and with it the one batch over retention.bytes.
    log = open_remote_log(tmp_path, retention_ms=-1, retention_bytes=5 * BATCH)
    append(log, [0] * 6)
    cache = RemoteLogMetadataCache()
    s0, *_ = copy_local_segments(log, cache, 4)
    log.maybe_increment_log_start_offset(1)
    plan = plan_remote_expiration(log, cache, T0)
    assert deleted_ids(plan) == ids(s0)
    assert plan.new_log_start_offset is None


def test_segments_ending_below_the_log_start_are_deleted(tmp_path: Path) -> None:
    # Seed 001 after DeleteRecords to 6: the history is LE-2:6, LE-3:7. seg-0-2 holds only LE-0, below the
    # earliest epoch; seg-3-5's epochs are at most LE-2 and it ends below 6. seg-6-8 holds 6, it stays.
    log = seed_log(tmp_path, retention_ms=-1)
    cache = RemoteLogMetadataCache()
    first, second, _third = copy_local_segments(log, cache, 3)
    log.maybe_increment_log_start_offset(6)
    assert entries_of(log) == [(2, 6), (3, 7)]
    plan = plan_remote_expiration(log, cache, T0)
    assert sorted(deleted_ids(plan)) == sorted(ids(first, second))
    assert plan.new_log_start_offset is None  # the log start is already past them


def test_a_lineage_segment_ending_below_the_log_start_is_deleted_without_retention(tmp_path: Path) -> None:
    log = open_remote_log(tmp_path, retention_ms=-1)
    append(log, [0] * 4)
    cache = RemoteLogMetadataCache()
    s0, s1, _s2 = copy_local_segments(log, cache, 3)
    log.maybe_increment_log_start_offset(2)
    plan = plan_remote_expiration(log, cache, T0)
    assert deleted_ids(plan) == ids(s0, s1)
    assert all("log start" in d.reason for d in plan.deletions)


def test_retention_after_delete_records_deletes_the_segment_holding_the_log_start_first(tmp_path: Path) -> None:
    # DeleteRecords to 4 leaves seg-3-5 straddling the log start. Retention must still reach it, oldest first;
    # skipped as "not in the lineage" it would never go (its epochs are above the earliest cached one).
    log = seed_log(tmp_path, retention_ms=1000)
    cache = RemoteLogMetadataCache()
    first, second, third = copy_local_segments(log, cache, 3)
    log.maybe_increment_log_start_offset(4)
    plan = plan_remote_expiration(log, cache, T0 + 1000)
    assert sorted(deleted_ids(plan)) == sorted(ids(first, second, third))
    assert plan.new_log_start_offset == 9


def test_retention_bytes_counts_the_segment_holding_the_log_start(tmp_path: Path) -> None:
    # Seed 001 after DeleteRecords to 4: seg-3-5 and seg-6-8 remote (2 x 3 batches), [9] local-only (1).
    # retention.bytes of 4 batches: 3 over, so seg-3-5 goes, oldest first.
    log = seed_log(tmp_path, retention_ms=-1, retention_bytes=4 * BATCH)
    cache = RemoteLogMetadataCache()
    _first, second, third = copy_local_segments(log, cache, 3)
    log.maybe_increment_log_start_offset(4)
    plan = plan_remote_expiration(log, cache, T0)
    assert ids(second) == [d.segment.segment_id.id for d in plan.deletions if "retention.bytes" in d.reason]
    assert ids(third)[0] not in deleted_ids(plan)
    assert plan.new_log_start_offset == 6


def test_a_copy_reaching_below_the_log_start_from_an_older_epoch_is_still_expired(tmp_path: Path) -> None:
    # Kafka's overlapping-segments case on a real log: history LE-5:0, LE-7:2, LE-9:6. One leader copied
    # [0-3]; after a leader change another copied [1-7] (its segments were cut elsewhere). Retention deletes
    # [0-3] and the log start moves to 4, so the history becomes LE-7:4, LE-9:6. [1-7] still holds 4..7 of
    # this log: it stays in the lineage, and retention reaches it. Were it left out, no rule would ever
    # delete it (its epochs are above the earliest cached one and it ends above the log start).
    log = open_remote_log(tmp_path, batches_per_segment=4, retention_ms=1000)
    append(log, [5, 5, 7, 7, 7, 7, 9, 9, 9, 9])
    cache = RemoteLogMetadataCache()
    first = publish(cache, remote_segment(0, 3, [(5, 0), (7, 2)], max_timestamp=T0 - 1000), COPIED)
    second = publish(cache, remote_segment(1, 7, [(5, 1), (7, 2), (9, 6)], max_timestamp=T0), COPIED)
    log.update_highest_offset_in_remote_storage(7)

    plan = plan_remote_expiration(log, cache, T0 + 500)
    assert deleted_ids(plan) == ids(first)
    assert plan.new_log_start_offset == 4
    assert log.maybe_increment_log_start_offset(4)
    publish_update(cache, first, DELETING, DELETED)
    assert entries_of(log) == [(7, 4), (9, 6)]
    assert is_within_lineage(second, log.leader_epoch_cache.epoch_entries(), log.log_end_offset)

    plan = plan_remote_expiration(log, cache, T0 + 1000)
    assert deleted_ids(plan) == ids(second)
    assert "retention.ms" in plan.deletions[0].reason
    assert plan.new_log_start_offset == 8


def test_segments_of_an_older_lineage_are_deleted(tmp_path: Path) -> None:
    # This log's history begins at LE-2 (an unclean election wiped what came before). Remote segments all of
    # whose epochs are below LE-2 belong to no one's lineage any more and go, copied or abandoned, whatever
    # their offsets; one that also holds LE-2 is left alone.
    log = open_remote_log(tmp_path, batches_per_segment=3, retention_ms=-1)
    append(log, [2, 2, 2, 3, 3, 3, 3])
    cache = RemoteLogMetadataCache()
    ours = copy_local_segments(log, cache, 2)
    old_copied = publish(cache, remote_segment(0, 4, [(0, 0), (1, 2)]), COPIED)
    old_abandoned = publish(cache, remote_segment(5, 9, [(1, 5)]))
    mixed = publish(cache, remote_segment(0, 3, [(1, 0), (2, 1)]), COPIED)
    plan = plan_remote_expiration(log, cache, T0)
    assert sorted(deleted_ids(plan)) == sorted(ids(old_copied, old_abandoned))
    assert all("below the earliest cached epoch" in d.reason for d in plan.deletions)
    assert ids(mixed)[0] not in deleted_ids(plan)
    assert not set(ids(*ours)) & set(deleted_ids(plan))
    assert plan.new_log_start_offset is None  # not this log's offsets


def test_a_copy_in_progress_is_never_chosen(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=0, retention_bytes=0)
    cache = RemoteLogMetadataCache()
    first, second = copy_local_segments(log, cache, 2)
    copying = publish(cache, remote_segment(6, 8, [(2, 6), (3, 7)]))
    in_progress = frozenset({copying.segment_id.id})
    assert deleted_ids(plan_remote_expiration(log, cache, T0 + 10, in_progress)) == ids(first, second)
    # Even once it ends below the log start (and all its epochs are at most the first cached one).
    log.maybe_increment_log_start_offset(9)
    assert copying.segment_id.id not in deleted_ids(plan_remote_expiration(log, cache, T0 + 10, in_progress))
    assert copying.segment_id.id in deleted_ids(plan_remote_expiration(log, cache, T0 + 10))


def test_a_copy_not_finished_is_not_counted_for_retention_bytes(tmp_path: Path) -> None:
    # 3 copied segments of 3 batches + [9] local-only = 10 batches; retention.bytes 7: [0-2] goes. The copy
    # of [9..] in progress would add bytes; it must not make more go.
    log = seed_log(tmp_path, retention_ms=-1, retention_bytes=7 * BATCH)
    cache = RemoteLogMetadataCache()
    first, *_ = copy_local_segments(log, cache, 3)
    copying = publish(cache, remote_segment(9, 9, [(3, 9)], size=BATCH * 100))
    plan = plan_remote_expiration(log, cache, T0, frozenset({copying.segment_id.id}))
    assert deleted_ids(plan) == ids(first)


def test_an_abandoned_copy_below_the_log_start_is_deleted(tmp_path: Path) -> None:
    # A leader died copying seg-3-5; its COPY_SEGMENT_STARTED stays until the log start passes it.
    log = seed_log(tmp_path, retention_ms=-1)
    cache = RemoteLogMetadataCache()
    abandoned = publish(cache, remote_segment(3, 5, [(1, 3), (2, 5)]))
    assert deleted_ids(plan_remote_expiration(log, cache, T0)) == []
    log.maybe_increment_log_start_offset(6)
    assert deleted_ids(plan_remote_expiration(log, cache, T0)) == ids(abandoned)


def test_an_abandoned_copy_of_another_lineage_below_the_log_start_is_deleted(tmp_path: Path) -> None:
    # Its epoch (LE-4) is above this log's first (LE-2): neither the log-start rule (a) nor the older-lineage
    # rule (c) applies, but an abandoned copy below the log start is garbage. A finished one waits.
    log = seed_log(tmp_path, retention_ms=-1)
    log.maybe_increment_log_start_offset(6)
    cache = RemoteLogMetadataCache()
    abandoned = publish(cache, remote_segment(0, 4, [(4, 0)]))
    finished = publish(cache, remote_segment(0, 4, [(4, 0)]), COPIED)
    plan = plan_remote_expiration(log, cache, T0)
    assert deleted_ids(plan) == ids(abandoned)
    assert "abandoned" in plan.deletions[0].reason
    assert ids(finished)[0] not in deleted_ids(plan)


def test_retention_never_deletes_an_abandoned_copy_above_the_log_start(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=0, retention_bytes=0)
    cache = RemoteLogMetadataCache()
    first, second = copy_local_segments(log, cache, 2)
    abandoned = publish(cache, remote_segment(6, 8, [(2, 6), (3, 7)]))
    plan = plan_remote_expiration(log, cache, T0 + 10)
    assert deleted_ids(plan) == ids(first, second)
    assert ids(abandoned)[0] not in deleted_ids(plan)


def test_a_deletion_left_unfinished_is_retried(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=-1)
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, 3)  # within retention (there is none): they stay
    stuck_copied = publish(cache, remote_segment(6, 8, [(2, 6), (3, 7)]), COPIED, DELETING)
    stuck_abandoned = publish(cache, remote_segment(9, 9, [(3, 9)]), DELETING)
    plan = plan_remote_expiration(log, cache, T0)
    assert sorted(deleted_ids(plan)) == sorted(ids(stuck_copied, stuck_abandoned))
    assert all(d.segment.state == DELETING for d in plan.deletions)
    assert plan.new_log_start_offset is None  # a retried deletion does not move the log start


def test_a_deletion_left_unfinished_is_listed_once_alongside_retention(tmp_path: Path) -> None:
    log = seed_log(tmp_path, retention_ms=0)
    cache = RemoteLogMetadataCache()
    first, second, third = copy_local_segments(log, cache, 3)
    publish_update(cache, second, DELETING)
    plan = plan_remote_expiration(log, cache, T0 + 10)
    assert sorted(deleted_ids(plan)) == sorted(ids(first, second, third))
    assert len(plan.deletions) == 3


def test_the_new_log_start_is_the_highest_deleted_end_plus_one_over_overlapping_copies(tmp_path: Path) -> None:
    # Kafka's testDeletionOnOverlappingRetentionBreachedSegments: two leaders copied [0-0] and [0-2].
    log = open_remote_log(tmp_path, retention_ms=0)
    append(log, [0] * 6)
    cache = RemoteLogMetadataCache()
    longer = publish(cache, remote_segment(0, 2, [(0, 0)], size=3 * BATCH), COPIED)
    shorter = publish(cache, remote_segment(0, 0, [(0, 0)]), COPIED)
    plan = plan_remote_expiration(log, cache, T0 + 10)
    assert sorted(deleted_ids(plan)) == sorted(ids(longer, shorter))
    assert plan.new_log_start_offset == 3


def test_the_new_log_start_never_passes_the_high_watermark(tmp_path: Path) -> None:
    # A new leader whose HW still lags: the old leader's copies reach past it.
    log = seed_log(tmp_path, retention_ms=-1, retention_bytes=0)
    cache = RemoteLogMetadataCache()
    copied = copy_local_segments(log, cache, 3)
    assert log.update_high_watermark(7) == 7
    plan = plan_remote_expiration(log, cache, T0)
    assert deleted_ids(plan) == ids(*copied)
    assert plan.new_log_start_offset == 7


def test_without_the_delete_cleanup_policy_retention_deletes_nothing(tmp_path: Path) -> None:
    log = seed_log(tmp_path, cleanup_policy="compact", retention_ms=0, retention_bytes=0)
    cache = RemoteLogMetadataCache()
    copy_local_segments(log, cache, 3)
    assert plan_remote_expiration(log, cache, T0 + 10) == ExpirationPlan([], None)


def test_compact_and_delete_applies_retention(tmp_path: Path) -> None:
    log = seed_log(tmp_path, cleanup_policy="compact,delete", retention_ms=0)
    cache = RemoteLogMetadataCache()
    copied = copy_local_segments(log, cache, 3)
    plan = plan_remote_expiration(log, cache, T0 + 10)
    assert deleted_ids(plan) == ids(*copied)
    assert plan.new_log_start_offset == 9
