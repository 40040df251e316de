"""LogSegment: file names, append/read of whole batches, index density, recovery, truncation, rolling."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from storage_helpers import T0, log_config, make_batch, records_of

from tierlog.records.record_batch import iter_batches
from tierlog.storage.errors import LogSegmentOffsetOverflowError
from tierlog.storage.file_records import TimestampAndOffset
from tierlog.storage.segment import DELETED_FILE_SUFFIX, LogSegment
from tierlog.storage.time_index import TimestampOffset


def new_segment(directory: Path, base_offset: int = 0, **overrides: object) -> LogSegment:
    return LogSegment.open(directory, base_offset, log_config(**overrides), T0)


def append_batch(segment: LogSegment, base_offset: int, records: int = 1, **kwargs: object) -> bytearray:
    batch = make_batch(records, base_offset=base_offset, **kwargs)  # type: ignore[arg-type]
    header = next(iter_batches(batch))
    segment.append(header.last_offset, header.max_timestamp, header.last_offset, batch)
    return batch


def test_segment_files_are_named_by_twenty_digit_base_offset(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, 42)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "00000000000000000042.index",
        "00000000000000000042.log",
        "00000000000000000042.timeindex",
    ]
    segment.close()


def test_appended_bytes_are_the_log_file_byte_for_byte(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batches = [append_batch(segment, offset * 3, 3) for offset in range(4)]
    segment.close()
    assert (tmp_path / "00000000000000000000.log").read_bytes() == b"".join(batches)


def test_read_returns_whole_batches_from_the_one_holding_the_start_offset(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batches = [append_batch(segment, i * 5, 5) for i in range(10)]
    info = segment.read(12, max_size=10_000)
    assert info is not None and info.records is not None
    assert info.fetch_offset == 12
    assert info.records.read_bytes() == b"".join(batches[2:])
    assert segment.read(50, 10_000) is None


def test_read_stops_at_max_size_on_a_batch_boundary(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batches = [append_batch(segment, i * 5, 5) for i in range(10)]
    size = len(batches[0])
    info = segment.read(0, max_size=3 * size - 1)
    assert info is not None and info.records is not None
    assert info.records.read_bytes() == b"".join(batches[:2])
    assert segment.read(0, max_size=size - 1).records is None  # type: ignore[union-attr]
    one = segment.read(0, max_size=1, min_one_message=True)
    assert one is not None and one.records is not None
    assert one.records.read_bytes() == bytes(batches[0])


def test_read_never_passes_max_position(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batches = [append_batch(segment, i * 5, 5) for i in range(4)]
    info = segment.read(0, 100_000, max_position=2 * len(batches[0]))
    assert info is not None and info.records is not None
    assert info.records.read_bytes() == b"".join(batches[:2])


def test_an_index_entry_follows_every_index_interval_bytes(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, index_interval_bytes=250)
    positions = []
    position = 0
    for i in range(12):
        batch = append_batch(segment, i * 2, 2)
        positions.append(position)
        position += len(batch)
    size = len(make_batch(2))
    # Kafka's rule: an append gets an entry when more than index.interval.bytes were appended since the last.
    expected = []
    since = 0
    for i, pos in enumerate(positions):
        if since > 250:
            expected.append((i * 2 + 1, pos))
            since = 0
        since += size
    assert expected
    segment.close()
    data = (tmp_path / "00000000000000000000.index").read_bytes()
    assert [struct.unpack_from(">ii", data, i) for i in range(0, len(data), 8)] == expected


def test_index_lookups_find_the_batch_of_every_offset(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, index_interval_bytes=100)
    batches = [append_batch(segment, i * 4, 4) for i in range(30)]
    assert segment.offset_index.entries > 5
    for offset in range(120):
        info = segment.read(offset, len(batches[0]))
        assert info is not None and info.records is not None
        assert info.records.read_bytes() == bytes(batches[offset // 4])


def test_recover_truncates_garbage_and_rebuilds_identical_indexes(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, index_interval_bytes=200)
    for i in range(20):
        append_batch(segment, i * 3, 3, timestamp=T0 + i * 10)
    segment.close()
    index_bytes = (tmp_path / "00000000000000000000.index").read_bytes()
    log_path = tmp_path / "00000000000000000000.log"
    good_size = log_path.stat().st_size
    with open(log_path, "ab") as f:
        f.write(b"\x00garbage that is not a batch" * 3)
    (tmp_path / "00000000000000000000.index").unlink()
    segment = LogSegment.open(tmp_path, 0, log_config(index_interval_bytes=200), T0, file_already_exists=True)
    assert segment.recover() == 84
    assert segment.size == good_size == log_path.stat().st_size
    assert (tmp_path / "00000000000000000000.index").read_bytes() == index_bytes
    assert segment.read_next_offset() == 60
    assert segment.max_timestamp_and_offset_so_far == TimestampOffset(T0 + 190 + 2, 59)


def test_recover_truncates_a_torn_last_batch(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    first = append_batch(segment, 0, 2)
    append_batch(segment, 2, 2)
    segment.close()
    log_path = tmp_path / "00000000000000000000.log"
    os.truncate(log_path, log_path.stat().st_size - 5)
    segment = LogSegment.open(tmp_path, 0, log_config(), T0, file_already_exists=True)
    assert segment.recover() == len(first) - 5
    assert log_path.read_bytes() == bytes(first)


def test_recover_stops_at_a_flipped_byte(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batches = [append_batch(segment, i, 1) for i in range(5)]
    segment.close()
    log_path = tmp_path / "00000000000000000000.log"
    data = bytearray(log_path.read_bytes())
    data[len(batches[0]) * 2 + 70] ^= 0xFF  # inside the third batch's records: its CRC fails
    log_path.write_bytes(data)
    segment = LogSegment.open(tmp_path, 0, log_config(), T0, file_already_exists=True)
    assert segment.recover() == 3 * len(batches[0])
    assert segment.read_next_offset() == 2


def test_truncate_to_removes_the_batch_holding_the_offset_and_later_ones(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, index_interval_bytes=50)
    batches = [append_batch(segment, i * 3, 3, timestamp=T0 + i) for i in range(10)]
    removed = segment.truncate_to(13)
    assert removed == 6 * len(batches[0])
    assert segment.size == 4 * len(batches[0])
    assert segment.read_next_offset() == 12
    assert segment.offset_index.last_offset < 12
    assert segment.max_timestamp_so_far == T0 + 3 + 2
    append_batch(segment, 12, 3)
    info = segment.read(0, 100_000)
    assert info is not None and info.records is not None
    assert [r[0] for r in records_of(info.records.read_bytes())] == list(range(15))


def test_find_offset_by_timestamp_returns_first_record_at_or_after_target(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, index_interval_bytes=10)
    for i in range(10):
        append_batch(segment, i * 2, 2, epoch=3, timestamps=[T0 + i * 100, T0 + i * 100 + 50])
    assert segment.find_offset_by_timestamp(T0 + 420, 0) == TimestampAndOffset(T0 + 450, 9, 3)
    assert segment.find_offset_by_timestamp(T0 + 400, 0) == TimestampAndOffset(T0 + 400, 8, 3)
    assert segment.find_offset_by_timestamp(T0, 5) == TimestampAndOffset(T0 + 250, 5, 3)
    assert segment.find_offset_by_timestamp(T0 + 10_000, 0) is None


def test_should_roll_on_size_time_full_index_and_offset_overflow(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, segment_index_bytes=48, index_interval_bytes=0)
    params = {
        "max_segment_bytes": 10_000,
        "max_segment_ms": 1000,
        "max_timestamp_in_messages": T0,
        "max_offset_in_messages": 1,
        "messages_size": 100,
        "now_ms": T0,
    }
    assert not segment.should_roll(**params)  # type: ignore[arg-type]
    batch = append_batch(segment, 0, 1, timestamp=T0)
    assert segment.should_roll(**{**params, "messages_size": 10_001 - len(batch)})  # type: ignore[arg-type]
    assert not segment.should_roll(**{**params, "max_timestamp_in_messages": T0 + 1000})  # type: ignore[arg-type]
    assert segment.should_roll(**{**params, "max_timestamp_in_messages": T0 + 1001})  # type: ignore[arg-type]
    assert segment.should_roll(**{**params, "max_offset_in_messages": 2**31})  # type: ignore[arg-type]
    for offset in range(1, 7):
        assert not segment.should_roll(**params)  # type: ignore[arg-type]
        append_batch(segment, offset, 1, timestamp=T0)
    assert segment.offset_index.is_full and not segment.time_index.is_full
    assert segment.should_roll(**params)  # type: ignore[arg-type]


def test_should_roll_when_the_time_index_is_full(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, segment_index_bytes=36, index_interval_bytes=0)
    for offset in range(3):
        append_batch(segment, offset, 1, timestamp=T0 + offset)
    assert segment.time_index.is_full and not segment.offset_index.is_full
    assert segment.should_roll(
        max_segment_bytes=10_000,
        max_segment_ms=1000,
        max_timestamp_in_messages=T0,
        max_offset_in_messages=3,
        messages_size=100,
        now_ms=T0,
    )


def test_append_refuses_offsets_beyond_the_int32_relative_range(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    with pytest.raises(LogSegmentOffsetOverflowError):
        append_batch(segment, 2**31, 1)


def test_renamed_segment_keeps_serving_reads(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    batch = append_batch(segment, 0, 3)
    info = segment.read(0, 10_000)
    segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000000.index.deleted",
        "00000000000000000000.log.deleted",
        "00000000000000000000.timeindex.deleted",
    ]
    assert info is not None and info.records is not None
    assert info.records.read_bytes() == bytes(batch)
    segment.delete()
    assert list(tmp_path.iterdir()) == []
