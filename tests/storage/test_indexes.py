"""OffsetIndex and TimeIndex: Kafka's byte formats, lookups, truncation, fullness and sanity checks."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tierlog.storage.errors import CorruptIndexError, InvalidOffsetError
from tierlog.storage.offset_index import OffsetIndex, OffsetPosition
from tierlog.storage.time_index import TimeIndex, TimestampOffset

BASE = 1000


def test_offset_index_file_holds_exactly_big_endian_relative_offset_and_position(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", BASE, 10_485_760)
    index.append(1005, 4100)
    index.append(1010, 8300)
    index.close()
    data = (tmp_path / "x.index").read_bytes()
    assert data == struct.pack(">ii", 5, 4100) + struct.pack(">ii", 10, 8300)


def test_offset_index_lookup_returns_largest_entry_at_or_below_target(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", BASE, 1024)
    for relative, position in ((5, 100), (10, 200), (20, 300)):
        index.append(BASE + relative, position)
    assert index.lookup(BASE) == OffsetPosition(BASE, 0)
    assert index.lookup(BASE + 4) == OffsetPosition(BASE, 0)
    assert index.lookup(BASE + 5) == OffsetPosition(BASE + 5, 100)
    assert index.lookup(BASE + 15) == OffsetPosition(BASE + 10, 200)
    assert index.lookup(BASE + 10_000) == OffsetPosition(BASE + 20, 300)
    assert index.lookup(5) == OffsetPosition(BASE, 0)
    assert index.floor_position(250) == 200
    assert index.floor_position(50) == 0


def test_offset_index_rejects_non_increasing_offsets(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", BASE, 1024)
    index.append(BASE + 3, 10)
    with pytest.raises(InvalidOffsetError):
        index.append(BASE + 3, 20)


def test_offset_index_is_full_at_segment_index_bytes(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", BASE, 20)  # rounds down to 2 entries of 8 bytes
    assert index.max_entries == 2
    index.append(BASE + 1, 10)
    assert not index.is_full
    index.append(BASE + 2, 20)
    assert index.is_full
    with pytest.raises(ValueError, match="full"):
        index.append(BASE + 3, 30)


def test_offset_index_truncate_to_drops_entries_at_and_above_offset(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE, 1024)
    for relative in (2, 4, 6, 8):
        index.append(BASE + relative, relative * 10)
    index.truncate_to(BASE + 6)
    assert index.entries == 2
    assert index.last_offset == BASE + 4
    assert path.stat().st_size == 16
    index.append(BASE + 5, 50)
    index.close()
    reloaded = OffsetIndex(path, BASE, 1024)
    assert [reloaded.lookup(BASE + r) for r in (4, 5)] == [OffsetPosition(BASE + 4, 40), OffsetPosition(BASE + 5, 50)]


def test_offset_index_reloads_from_file(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE, 1024)
    index.append(BASE + 7, 70)
    index.flush()
    reloaded = OffsetIndex(path, BASE, 1024)
    reloaded.sanity_check()
    assert reloaded.entries == 1
    assert reloaded.lookup(BASE + 8) == OffsetPosition(BASE + 7, 70)


@pytest.mark.parametrize(
    "content",
    [
        struct.pack(">ii", 1, 10) + b"\x00\x00\x00",  # torn trailing entry
        struct.pack(">ii", -1, 10),  # offset below the base
        struct.pack(">ii", 5, 10) + struct.pack(">ii", 3, 20),  # offsets going backwards
        struct.pack(">ii", 3, 20) + struct.pack(">ii", 5, 10),  # positions going backwards
    ],
)
def test_offset_index_sanity_check_finds_corruption(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(content)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, BASE, 1024).sanity_check()


def test_time_index_file_holds_exactly_big_endian_timestamp_and_relative_offset(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE, 10_485_760)
    index.maybe_append(1_700_000_000_000, BASE + 3)
    index.close()
    assert (tmp_path / "x.timeindex").read_bytes() == struct.pack(">qi", 1_700_000_000_000, 3)


def test_time_index_appends_only_when_the_timestamp_grows(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE, 1200)
    assert index.last_entry == TimestampOffset(-1, BASE)
    index.maybe_append(100, BASE + 1)
    index.maybe_append(100, BASE + 2)
    index.maybe_append(150, BASE + 3)
    assert index.entries == 2
    with pytest.raises(InvalidOffsetError):
        index.maybe_append(90, BASE + 4)
    with pytest.raises(InvalidOffsetError):
        index.maybe_append(200, BASE + 2)
    assert index.last_entry == TimestampOffset(150, BASE + 3)


def test_time_index_lookup(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE, 1200)
    index.maybe_append(100, BASE + 1)
    index.maybe_append(200, BASE + 5)
    assert index.lookup(50) == TimestampOffset(-1, BASE)
    assert index.lookup(100) == TimestampOffset(100, BASE + 1)
    assert index.lookup(199) == TimestampOffset(100, BASE + 1)
    assert index.lookup(10_000) == TimestampOffset(200, BASE + 5)


def test_time_index_keeps_its_last_slot_for_the_roll_entry(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE, 36)  # 3 entries
    index.maybe_append(1, BASE + 1)
    assert not index.is_full
    index.maybe_append(2, BASE + 2)
    assert index.is_full
    with pytest.raises(ValueError, match="full"):
        index.maybe_append(3, BASE + 3)
    index.maybe_append(3, BASE + 3, skip_full_check=True)
    assert index.entries == 3


def test_time_index_truncate_to(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE, 1200)
    for relative in (1, 3, 5):
        index.maybe_append(relative * 10, BASE + relative)
    index.truncate_to(BASE + 3)
    assert index.last_entry == TimestampOffset(10, BASE + 1)
    assert (tmp_path / "x.timeindex").stat().st_size == 12


def test_time_index_sanity_check_finds_timestamps_going_backwards(tmp_path: Path) -> None:
    path = tmp_path / "x.timeindex"
    path.write_bytes(struct.pack(">qi", 200, 1) + struct.pack(">qi", 100, 2))
    with pytest.raises(CorruptIndexError):
        TimeIndex(path, BASE, 1200).sanity_check()
