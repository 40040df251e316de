"""Log: appends as leader and follower, reads, rolls, truncation, log start offset, retention, ListOffsets."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from storage_helpers import T0, batch_offsets, fetched, log_config, make_batch, open_log, records_of

from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    InvalidRecordError,
    TimestampType,
    iter_batches,
    set_log_append_time,
    validate_batch,
)
from tierlog.records.validation import RecordValidationError
from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.errors import (
    InvalidTimestampError,
    OffsetOutOfRangeError,
    OffsetsOutOfOrderError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from tierlog.storage.file_records import TimestampAndOffset
from tierlog.storage.log import Log


def segment_names(directory: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(suffix))


def fill(log: Log, batches: int, records: int = 5, epoch: int = 0, now_ms: int = T0, **kwargs: object) -> None:
    for _ in range(batches):
        log.append_as_leader(make_batch(records, **kwargs), epoch, now_ms)  # type: ignore[arg-type]


def test_append_then_read_round_trips_records_and_assigns_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    first = log.append_as_leader(make_batch(3, values=[b"a", b"b", b"c"]), 0, T0)
    second = log.append_as_leader(make_batch(2, values=[b"d", b"e"]), 0, T0)
    assert (first.first_offset, first.last_offset, first.records_count) == (0, 2, 3)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    data = fetched(log.read(0, 1 << 20, None, False))
    assert [(offset, value) for offset, _, value in records_of(data)] == [
        (0, b"a"),
        (1, b"b"),
        (2, b"c"),
        (3, b"d"),
        (4, b"e"),
    ]


def test_leader_append_stamps_offsets_and_epoch_in_place_with_the_crc_still_valid(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 2, records=4)
    records = make_batch(3) + make_batch(2)
    crcs_before = [h.crc for h in iter_batches(records)]
    info = log.append_as_leader(records, 7, T0)
    headers = list(iter_batches(records))
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(8, 7), (11, 7)]
    assert [h.crc for h in headers] == crcs_before
    assert (info.first_offset, info.last_offset, info.records_count, info.valid_bytes) == (8, 12, 5, len(records))
    stored = fetched(log.read(8, 1 << 20, None, False))
    assert stored == bytes(records)
    for header in iter_batches(stored):
        validate_batch(stored, header.position)
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(0, 0), EpochEntry(7, 8)]
    assert log.latest_epoch == 7


def test_log_append_time_replaces_timestamps_and_keeps_batches_valid(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(message_timestamp_type="LogAppendTime"))
    now = T0 + 123_456
    info = log.append_as_leader(make_batch(3, timestamp=T0 - 999_999), 0, now)
    assert (info.log_append_time, info.max_timestamp, info.offset_of_max_timestamp) == (now, now, 2)
    stored = fetched(log.read(0, 1 << 20, None, False))
    header = next(iter_batches(stored))
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == now
    assert [timestamp for _, timestamp, _ in records_of(stored)] == [now, now, now]


def test_create_time_append_reports_max_timestamp_and_its_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    records = make_batch(2, timestamps=[T0 + 5, T0 + 9]) + make_batch(2, timestamps=[T0 + 1, T0 + 2])
    info = log.append_as_leader(records, 0, T0)
    assert (info.max_timestamp, info.offset_of_max_timestamp, info.log_append_time) == (T0 + 9, 1, -1)


def test_an_invalid_batch_anywhere_means_nothing_is_appended(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 1)
    bad = make_batch(2)
    bad[-1] ^= 0x01  # the CRC no longer matches
    records = make_batch(2) + bad
    before = bytes(records)
    with pytest.raises(InvalidRecordError) as error:
        log.append_as_leader(records, 0, T0)
    assert error.value.corrupt
    assert bytes(records) == before
    assert log.log_end_offset == 5
    assert log.size_in_bytes == len(make_batch(5))


def test_a_batch_above_max_message_bytes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(max_message_bytes=200))
    with pytest.raises(RecordTooLargeError) as error:
        log.append_as_leader(make_batch(1) + make_batch(10, value_size=50), 0, T0)
    assert error.value.error_name == "MESSAGE_TOO_LARGE"
    assert log.log_end_offset == 0 and log.size_in_bytes == 0


def test_an_append_above_segment_bytes_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=300))
    with pytest.raises(RecordBatchTooLargeError) as error:
        log.append_as_leader(make_batch(10, value_size=50), 0, T0)
    assert error.value.error_name == "RECORD_LIST_TOO_LARGE"
    assert log.log_end_offset == 0


def test_control_batches_and_timestamps_out_of_bounds_are_refused_from_clients(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(message_timestamp_before_max_ms=1000))
    with pytest.raises(RecordValidationError) as refused:
        log.append_as_leader(make_batch(1, timestamp=T0 - 5000), 0, T0)
    assert refused.value.error_name == "INVALID_TIMESTAMP"
    assert [e.batch_index for e in refused.value.record_errors] == [0]
    log_append_time = make_batch(1)
    set_log_append_time(log_append_time, 0, T0)
    with pytest.raises(InvalidTimestampError, match="producers may not set LogAppendTime"):
        log.append_as_leader(log_append_time, 0, T0)
    control = make_batch(1)
    attributes = struct.unpack_from(">h", control, ATTRIBUTES_OFFSET)[0] | CONTROL_FLAG_MASK
    struct.pack_into(">h", control, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", control, CRC_OFFSET, crc32c(bytes(control[ATTRIBUTES_OFFSET:])))
    with pytest.raises(InvalidRecordError, match="control records"):
        log.append_as_leader(control, 0, T0)
    assert log.log_end_offset == 0


def test_a_record_older_than_the_first_of_its_batch_is_refused_for_its_timestamp(tmp_path: Path) -> None:
    # The header's first and largest timestamps are in range; only the records show the old one.
    log = open_log(tmp_path / "topic-0", log_config(message_timestamp_before_max_ms=1000))
    with pytest.raises(RecordValidationError) as refused:
        log.append_as_leader(make_batch(3, timestamps=[T0, T0 - 5000, T0]), 0, T0)
    assert [(e.error_name, e.batch_index) for e in refused.value.record_errors] == [("INVALID_TIMESTAMP", 1)]
    assert log.log_end_offset == 0


def test_read_never_returns_a_batch_at_or_beyond_max_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 10)
    log.update_high_watermark(23)
    assert log.high_watermark == 23
    data = fetched(log.read(0, 1 << 20, log.high_watermark, False))
    assert batch_offsets(data)[-1] == (15, 19)  # the batch 20-24 holds offset 23: it is not committed
    data = fetched(log.read(0, 1 << 20, 25, False))
    assert batch_offsets(data)[-1] == (20, 24)
    assert log.read(20, 1 << 20, 20, False).records is None
    assert log.read(22, 1 << 20, 20, False).records is None


def test_read_honours_max_bytes_in_whole_batches_and_min_one_message(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 10)
    size = len(make_batch(5))
    assert batch_offsets(fetched(log.read(5, 3 * size - 1, None, False))) == [(5, 9), (10, 14)]
    assert log.read(5, size - 1, None, False).records is None
    assert batch_offsets(fetched(log.read(5, 1, None, True))) == [(5, 9)]


def test_read_from_inside_a_batch_returns_that_batch_whole(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 3)
    assert batch_offsets(fetched(log.read(7, 1 << 20, None, False))) == [(5, 9), (10, 14)]


def test_read_at_log_end_is_empty_and_outside_the_log_is_out_of_range(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 2)
    info = log.read(10, 1 << 20, None, True)
    assert (info.fetch_offset, info.records) == (10, None)
    with pytest.raises(OffsetOutOfRangeError) as error:
        log.read(11, 100, None, False)
    assert error.value.error_name == "OFFSET_OUT_OF_RANGE"
    log.update_high_watermark(10)
    log.maybe_increment_log_start_offset(5)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(4, 100, None, False)


def test_read_skips_an_offset_gap_into_the_next_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    log.append_as_follower(make_batch(5, base_offset=0, epoch=1), T0)
    log.roll(T0, 10)
    log.append_as_follower(make_batch(5, base_offset=10, epoch=1), T0)
    assert [s.base_offset for s in log.segments] == [0, 10]
    assert batch_offsets(fetched(log.read(7, 1 << 20, None, False))) == [(10, 14)]


def test_segments_roll_at_segment_bytes_and_are_named_by_their_first_offset(tmp_path: Path) -> None:
    size = len(make_batch(5))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=3 * size))
    fill(log, 10)
    assert [s.base_offset for s in log.segments] == [0, 15, 30, 45]
    assert segment_names(log.dir) == [f"{offset:020d}.log" for offset in (0, 15, 30, 45)]
    assert all(s.size <= 3 * size for s in log.segments)
    offsets = []
    position = 0
    while position < log.log_end_offset:
        data = fetched(log.read(position, 1 << 20, None, False))
        offsets.extend(offset for offset, _, _ in records_of(data))
        position = offsets[-1] + 1
    assert offsets == list(range(50))


def test_segments_roll_when_segment_ms_passes_since_the_first_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(segment_ms=1000))
    log.append_as_leader(make_batch(1, timestamp=T0), 0, T0)
    log.append_as_leader(make_batch(1, timestamp=T0 + 1000), 0, T0 + 1000)
    assert len(log.segments) == 1
    log.append_as_leader(make_batch(1, timestamp=T0 + 1001), 0, T0 + 1001)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_segments_roll_when_the_offset_index_is_full(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(segment_index_bytes=48, index_interval_bytes=0))
    fill(log, 8, records=1, timestamp=T0)
    assert [s.base_offset for s in log.segments] == [0, 7]
    assert log.segments[0].offset_index.entries == 6


def two_epoch_log(tmp_path: Path) -> Log:
    """Segments [0-9] [10-19] [20-29] of five-record batches, epoch 1 from offset 0 and epoch 2 from 15."""
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=2 * len(make_batch(5))))
    fill(log, 3, epoch=1)
    fill(log, 3, epoch=2)
    return log


def test_truncate_to_drops_later_segments_and_fixes_offsets(tmp_path: Path) -> None:
    log = two_epoch_log(tmp_path)
    log.update_high_watermark(30)
    log.flush()
    assert [s.base_offset for s in log.segments] == [0, 10, 20]
    assert log.truncate_to(15)
    assert log.log_end_offset == 15
    assert log.high_watermark == 15
    assert log.recovery_point == 15
    assert [s.base_offset for s in log.segments] == [0, 10]
    assert segment_names(log.dir, ".deleted") == [
        "00000000000000000020.index.deleted",
        "00000000000000000020.log.deleted",
        "00000000000000000020.timeindex.deleted",
    ]
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0)]
    info = log.append_as_leader(make_batch(2), 3, T0)
    assert info.first_offset == 15
    assert not log.truncate_to(100)


def test_truncate_to_below_the_first_segment_starts_the_log_over(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_start_offset=100)
    log.truncate_fully_and_start_at(100)
    fill(log, 2)
    assert log.truncate_to(50)
    assert (log.log_start_offset, log.log_end_offset) == (50, 50)
    assert [s.base_offset for s in log.segments] == [50]


def test_truncate_fully_and_start_at_empties_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 4, epoch=3)
    log.update_high_watermark(20)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (1000, 1000, 1000)
    assert log.leader_epoch_cache.epoch_entries() == []
    assert segment_names(log.dir) == ["00000000000000001000.log"]
    info = log.append_as_follower(make_batch(2, base_offset=1000, epoch=4), T0)
    assert info.first_offset == 1000
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(4, 1000)]


def test_delete_records_moves_the_log_start_up_to_the_high_watermark_only(tmp_path: Path) -> None:
    log = two_epoch_log(tmp_path)
    log.update_high_watermark(22)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(23)
    assert log.maybe_increment_log_start_offset(12)
    assert not log.maybe_increment_log_start_offset(11)
    assert log.log_start_offset == 12
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 12), EpochEntry(2, 15)]
    assert batch_offsets(fetched(log.read(12, 1 << 20, None, False)))[0] == (10, 14)
    # The segment wholly below the new log start goes with the next retention run.
    assert log.delete_old_segments(T0) == 1
    assert [s.base_offset for s in log.segments] == [10, 20]


def test_retention_ms_renames_expired_segments_and_removes_them_after_the_delay(tmp_path: Path) -> None:
    size = len(make_batch(5))
    config = log_config(segment_bytes=size, retention_ms=10_000, file_delete_delay_ms=500)
    log = open_log(tmp_path / "topic-0", config)
    for i in range(4):
        log.append_as_leader(make_batch(5, timestamp=T0 + i * 5_000), 0, T0 + i * 5_000)
    log.update_high_watermark(log.log_end_offset)
    held = log.read(0, 1 << 20, None, False).records
    # Segments end at T0+4, T0+5004, T0+10004, T0+15004: at T0+15_005 the first two are older than 10 s.
    assert log.delete_old_segments(T0 + 15_005) == 2
    assert [s.base_offset for s in log.segments] == [10, 15]
    assert log.log_start_offset == 10
    assert len(segment_names(log.dir, ".log.deleted")) == 2
    assert held is not None and len(held.read_bytes()) == size  # a slice handed out stays readable
    assert log.remove_deleted_segments(T0 + 15_504) == 0
    assert log.remove_deleted_segments(T0 + 15_505) == 2
    assert segment_names(log.dir, ".deleted") == []


def test_retention_bytes_deletes_the_oldest_whole_segments(tmp_path: Path) -> None:
    size = len(make_batch(5))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=size, retention_bytes=2 * size + 1))
    fill(log, 5)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(T0) == 2
    assert [s.base_offset for s in log.segments] == [10, 15, 20]
    assert log.size_in_bytes == 3 * size


def test_retention_never_deletes_at_or_above_the_high_watermark(tmp_path: Path) -> None:
    size = len(make_batch(5))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=size, retention_ms=1))
    fill(log, 4)
    log.update_high_watermark(12)
    assert log.delete_old_segments(T0 + 10_000) == 2
    assert [s.base_offset for s in log.segments] == [10, 15]
    assert log.log_start_offset == 10


def test_an_expired_active_segment_is_rolled_and_deleted(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(retention_ms=1000))
    fill(log, 2)
    log.update_high_watermark(10)
    assert log.delete_old_segments(T0 + 5000) == 1
    assert [(s.base_offset, s.size) for s in log.segments] == [(10, 0)]
    assert (log.log_start_offset, log.log_end_offset) == (10, 10)
    assert log.delete_old_segments(T0 + 9000) == 0


def test_compact_only_topics_keep_expired_segments(tmp_path: Path) -> None:
    size = len(make_batch(5))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=size, retention_ms=1, cleanup_policy="compact"))
    fill(log, 3)
    log.update_high_watermark(15)
    assert log.delete_old_segments(T0 + 10_000) == 0


def test_fetch_offset_by_timestamp_and_the_special_targets(tmp_path: Path) -> None:
    size = len(make_batch(2))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=2 * size))
    for i in range(6):
        log.append_as_leader(make_batch(2, timestamps=[T0 + i * 100, T0 + i * 100 + 10]), 1 + i // 3, T0)
    log.append_as_leader(make_batch(1, timestamp=T0 + 50), 2, T0)  # an older timestamp after the max
    assert log.fetch_offset_by_timestamp(T0 + 205) == TimestampAndOffset(T0 + 210, 5, 1)
    assert log.fetch_offset_by_timestamp(T0 + 300) == TimestampAndOffset(T0 + 300, 6, 2)
    assert log.fetch_offset_by_timestamp(T0 - 1) == TimestampAndOffset(T0, 0, 1)
    assert log.fetch_offset_by_timestamp(T0 + 10_000) is None
    assert log.fetch_offset_by_timestamp(-1) == TimestampAndOffset(-1, 13, 2)
    assert log.fetch_offset_by_timestamp(-2) == TimestampAndOffset(-1, 0, 1)
    assert log.fetch_offset_by_timestamp(-3) == TimestampAndOffset(T0 + 510, 11, 2)
    log.update_high_watermark(13)
    log.maybe_increment_log_start_offset(7)
    assert log.fetch_offset_by_timestamp(-2) == TimestampAndOffset(-1, 7, 2)
    assert log.fetch_offset_by_timestamp(T0) == TimestampAndOffset(T0 + 310, 7, 2)


def test_follower_append_keeps_leader_offsets_and_learns_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    records = make_batch(3, base_offset=0, epoch=1) + make_batch(2, base_offset=3, epoch=4)
    info = log.append_as_follower(bytes(records), T0)
    assert (info.first_offset, info.last_offset, info.records_count) == (0, 4, 5)
    assert fetched(log.read(0, 1 << 20, None, False)) == bytes(records)
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(4, 3)]
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(bytes(make_batch(1, base_offset=4, epoch=4)), T0)
    with pytest.raises(OffsetsOutOfOrderError):
        log.append_as_follower(bytes(make_batch(2, base_offset=9) + make_batch(2, base_offset=5)), T0)
    assert log.log_end_offset == 5


def test_flush_advances_the_recovery_point_and_a_roll_schedules_a_flush(tmp_path: Path) -> None:
    size = len(make_batch(5))
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=size))
    fill(log, 3)
    assert log.recovery_point == 0
    log.flush_if_due(T0)
    assert log.recovery_point == 10  # the segments rolled away from; the active one waits
    log.flush()
    assert log.recovery_point == 15


def test_flush_ms_flushes_the_whole_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(flush_ms=1000))
    fill(log, 2)
    log.flush_if_due(T0 + 999)
    assert log.recovery_point == 0
    log.flush_if_due(T0 + 1000)
    assert log.recovery_point == 10


def test_flush_messages_flushes_on_append(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(flush_messages=8))
    fill(log, 1)
    assert log.recovery_point == 0
    fill(log, 1)
    assert log.recovery_point == 10


def test_delete_removes_the_partition_directory(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0")
    fill(log, 2)
    log.delete()
    assert not (tmp_path / "topic-0").exists()
