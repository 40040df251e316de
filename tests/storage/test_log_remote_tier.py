"""Log with a remote tier (KIP-405, docs/tiered-storage.md): log start vs local log start, local retention
that waits for copies, OFFSET_MOVED_TO_TIERED_STORAGE, ListOffsets -2/-4/-5, and reloading a log that starts
remotely."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import T0, TP, log_config, make_batch, open_log

from tierlog.storage.errors import KafkaStorageError, OffsetMovedToTieredStorageError, OffsetOutOfRangeError
from tierlog.storage.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    Log,
)
from tierlog.storage.log_config import LogConfig


def _remote_log(directory: Path, config: LogConfig, *, log_start_offset: int = 0) -> Log:
    return open_log(directory, config, log_start_offset=log_start_offset, remote_log_enabled=True)


def _fill(log: Log, batches: int, epoch: int = 0) -> int:
    """Append `batches` one-record batches, one per segment (segment.bytes is one batch), HW to the LEO."""
    for _ in range(batches):
        log.append_as_leader(make_batch(1), epoch, T0)
    log.update_high_watermark(log.log_end_offset)
    return len(make_batch(1))


def _one_batch_per_segment(**overrides: object) -> LogConfig:
    return log_config(segment_bytes=len(make_batch(1)), remote_storage_enable="true", **overrides)


def test_local_retention_waits_until_segments_are_copied(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 5)
    assert log.delete_old_segments(T0) == 0  # nothing copied: every local segment is the only copy
    log.update_highest_offset_in_remote_storage(2)
    assert log.delete_old_segments(T0) == 3
    assert (log.log_start_offset, log.local_log_start_offset) == (0, 3)


def test_local_retention_keeps_the_log_start_and_the_epoch_history(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_ms=1))
    _fill(log, 2, epoch=0)
    _fill(log, 2, epoch=3)
    log.update_highest_offset_in_remote_storage(2)
    log.delete_old_segments(T0 + 10)
    assert log.local_log_start_offset == 3
    assert log.log_start_offset == 0
    assert [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.epoch_entries()] == [(0, 0), (3, 2)]


def test_local_retention_defaults_to_retention_when_minus_two(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(retention_bytes=1))
    _fill(log, 4)
    log.update_highest_offset_in_remote_storage(2)
    assert log.delete_old_segments(T0) == 3


def test_without_remote_storage_local_retention_settings_are_ignored(tmp_path: Path) -> None:
    config = log_config(segment_bytes=len(make_batch(1)), local_retention_bytes=1)
    log = open_log(tmp_path / "topic-0", config)
    _fill(log, 4)
    assert log.delete_old_segments(T0) == 0  # retention.bytes is -1 (unbounded); local.* apply only remotely


def test_read_below_the_local_start_raises_offset_moved_to_tiered_storage(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 4)
    log.update_highest_offset_in_remote_storage(2)
    log.delete_old_segments(T0)
    with pytest.raises(OffsetMovedToTieredStorageError) as moved:
        log.read(1, 1 << 20, None, True)
    assert moved.value.error_name == "OFFSET_MOVED_TO_TIERED_STORAGE"
    assert log.read(3, 1 << 20, None, True).records is not None
    log.maybe_increment_log_start_offset(2)
    with pytest.raises(OffsetOutOfRangeError) as out_of_range:
        log.read(1, 1 << 20, None, True)
    assert out_of_range.value.error_name == "OFFSET_OUT_OF_RANGE"


def test_list_offsets_earliest_earliest_local_and_latest_tiered(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 2, epoch=0)
    _fill(log, 3, epoch=1)
    tiered = log.fetch_offset_by_timestamp(LATEST_TIERED_TIMESTAMP)
    assert tiered is not None and (tiered.offset, tiered.leader_epoch) == (-1, -1)
    log.update_highest_offset_in_remote_storage(2)
    log.delete_old_segments(T0)
    earliest = log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP)
    local = log.fetch_offset_by_timestamp(EARLIEST_LOCAL_TIMESTAMP)
    tiered = log.fetch_offset_by_timestamp(LATEST_TIERED_TIMESTAMP)
    assert earliest is not None and (earliest.offset, earliest.leader_epoch) == (0, 0)
    assert local is not None and (local.offset, local.leader_epoch) == (3, 1)
    assert tiered is not None and (tiered.offset, tiered.leader_epoch) == (2, 1)


def test_highest_offset_in_remote_storage_never_reaches_the_high_watermark(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment())
    _fill(log, 3)
    with pytest.raises(KafkaStorageError):
        log.update_highest_offset_in_remote_storage(3)
    log.update_highest_offset_in_remote_storage(1)
    log.update_highest_offset_in_remote_storage(0)  # never moves back
    assert log.highest_offset_in_remote_storage == 1


def test_delete_records_below_the_local_start_moves_only_the_log_start(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 5)
    log.update_highest_offset_in_remote_storage(2)
    log.delete_old_segments(T0)
    assert log.maybe_increment_log_start_offset(1)
    assert (log.log_start_offset, log.local_log_start_offset) == (1, 3)
    assert log.maybe_increment_log_start_offset(4)  # past the local start: local segments below it go too
    assert log.local_log_start_offset == 4
    log.delete_old_segments(T0)
    assert log.segments[0].base_offset == 4


def test_reopened_log_keeps_a_log_start_below_its_first_segment(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    log = _remote_log(directory, _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 4)
    log.update_highest_offset_in_remote_storage(2)
    log.delete_old_segments(T0)
    log.close()
    reopened = _remote_log(directory, _one_batch_per_segment(), log_start_offset=0)
    assert (reopened.log_start_offset, reopened.local_log_start_offset) == (0, 3)
    local_only = open_log(directory, _one_batch_per_segment(), log_start_offset=0)
    assert local_only.log_start_offset == 3  # without a remote tier the segments bound the log


def test_truncate_fully_with_a_remote_log_start(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment())
    _fill(log, 2)
    log.truncate_fully_and_start_at(9, log_start_offset=0)
    assert (log.log_start_offset, log.local_log_start_offset, log.log_end_offset) == (0, 9, 9)
    with pytest.raises(OffsetMovedToTieredStorageError):
        log.read(4, 1 << 20, None, True)


# --- the offset invariants (issue 4): Rx <= Lx <= Ly <= Lz, and Ry < Ly where Ry is set ---------------------


def _offsets(log: Log) -> tuple[int, int, int, int, int]:
    """(Rx, Ry, Lx, Ly, Lz)"""
    return (
        log.log_start_offset,
        log.highest_offset_in_remote_storage,
        log.local_log_start_offset,
        log.high_watermark,
        log.log_end_offset,
    )


def test_every_offset_change_keeps_the_tier_invariants(tmp_path: Path) -> None:
    # Each of these methods checks the invariants before it returns; the offsets are also checked here.
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 6)
    log.update_highest_offset_in_remote_storage(3)
    log.delete_old_segments(T0)  # local retention: Lx moves, Rx stays
    assert _offsets(log) == (0, 3, 4, 6, 6)
    assert log.maybe_increment_log_start_offset(2)  # remote retention / DeleteRecords: Rx moves
    assert _offsets(log) == (2, 3, 4, 6, 6)
    log.append_as_leader(make_batch(1), 0, T0)
    assert _offsets(log) == (2, 3, 4, 6, 7)
    log.truncate_to(5)  # below the HW: the HW follows the LEO down
    assert _offsets(log) == (2, 3, 4, 5, 5)
    log.truncate_fully_and_start_at(3, log_start_offset=2)  # Ry drops below the new local start
    assert _offsets(log) == (2, 2, 3, 3, 3)


def test_a_broken_offset_chain_is_reported_with_its_offsets(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment(local_retention_bytes=1))
    _fill(log, 4)
    log.update_highest_offset_in_remote_storage(1)
    log.delete_old_segments(T0)
    assert _offsets(log) == (0, 1, 2, 4, 4)
    log._log_start_offset = 3  # a bug elsewhere: the log start passed the local log start
    with pytest.raises(KafkaStorageError) as broken:
        log.update_high_watermark(4)
    message = str(broken.value)
    assert "log start <= local log start <= high watermark <= log end offset" in message
    assert "3, 2, 4, 4" in message and str(TP) in message
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(make_batch(1), 0, T0)


def test_the_highest_remote_offset_is_checked_against_the_high_watermark_where_it_is_set(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment())
    _fill(log, 3)
    with pytest.raises(KafkaStorageError, match=r"would reach the high watermark 3"):
        log.update_highest_offset_in_remote_storage(3)
    log.update_highest_offset_in_remote_storage(2)
    log._high_watermark = 2  # a bug elsewhere (Ry's setters keep Ry < Ly; a follower's HW may drop, below)
    log._check_offsets()  # what the methods a follower runs check: the chain holds
    with pytest.raises(KafkaStorageError, match=r"Highest offset in remote storage 2 .* high watermark 2 \(Ry < Ly\)"):
        log._check_offsets(remote_end=True)  # what update_highest_offset_in_remote_storage checks on return


def test_a_followers_high_watermark_may_go_below_the_highest_remote_offset(tmp_path: Path) -> None:
    # docs/replication.md#follower-hw: a follower adopts a new leader's HW, which may be lower than the one
    # under which it learned Ry from the remote log metadata. That is no error: appends, HW updates and log
    # start moves go on.
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment())
    _fill(log, 5)
    log.update_highest_offset_in_remote_storage(3)
    assert log.update_high_watermark(2) == 2
    log.append_as_follower(make_batch(1, base_offset=5, epoch=1), T0)
    assert log.maybe_increment_log_start_offset(1)
    assert _offsets(log) == (1, 3, 1, 2, 6)
    assert log.update_high_watermark(6) == 6


def test_truncation_below_the_remote_end_forgets_those_copies(tmp_path: Path) -> None:
    log = _remote_log(tmp_path / "topic-0", _one_batch_per_segment())
    _fill(log, 5)
    log.update_highest_offset_in_remote_storage(3)
    log.truncate_to(2)
    assert log.highest_offset_in_remote_storage == 1
