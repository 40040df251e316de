"""record_batch.py: header view, validation (CORRUPT_MESSAGE vs INVALID_RECORD), iteration and stamping."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from tierlog.records.codec import RecordSpec, build_batch, decode_batch
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    CompressionType,
    InvalidRecordError,
    TimestampType,
    batch_size_at,
    iter_batches,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)

T0 = 1_700_000_000_000
THREE: list[RecordSpec] = [(b"k", b"v0", [], T0), (b"k", b"v1", [], T0 + 2), (None, b"v2", [], T0 + 1)]


def batch(base_offset: int = 0, partition_leader_epoch: int = -1) -> bytearray:
    return bytearray(
        build_batch(THREE, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch)
    )


def fix_crc(data: bytearray, position: int = 0) -> None:
    size = struct.unpack_from(">i", data, position + LENGTH_OFFSET)[0] + 12
    crc = crc32c(bytes(data[position + ATTRIBUTES_OFFSET : position + size]))
    struct.pack_into(">I", data, position + CRC_OFFSET, crc)


def crc_is_valid(data: bytes | bytearray) -> bool:
    return crc32c(bytes(data[ATTRIBUTES_OFFSET:])) == read_header(data).crc


# --- header view ----------------------------------------------------------------------------------


def test_header_fields() -> None:
    data = batch(base_offset=10, partition_leader_epoch=4)
    header = validate_batch(data)
    assert header.position == 0
    assert header.base_offset == 10
    assert header.last_offset_delta == 2
    assert header.last_offset == 12
    assert header.next_offset == 13
    assert header.records_count == 3
    assert header.size_in_bytes == len(data)
    assert header.magic == 2
    assert header.partition_leader_epoch == 4
    assert header.base_timestamp == T0
    assert header.max_timestamp == T0 + 2
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert header.compression_type == CompressionType.NONE


def test_batch_size_at() -> None:
    data = batch()
    assert batch_size_at(data, 0) == len(data)
    assert batch_size_at(data[:12], 0) == len(data)
    assert batch_size_at(data[:11], 0) is None
    assert batch_size_at(data + data, len(data)) == len(data)


# --- validate_batch -------------------------------------------------------------------------------


def test_valid_batch_at_a_position() -> None:
    first, second = batch(), batch(base_offset=3)
    header = validate_batch(first + second, len(first))
    assert header.position == len(first)
    assert header.base_offset == 3


@pytest.mark.parametrize("index", [ATTRIBUTES_OFFSET, RECORDS_COUNT_OFFSET + 3, RECORD_BATCH_OVERHEAD + 2, -1])
def test_crc_mismatch_is_corrupt(index: int) -> None:
    data = batch()
    data[index] ^= 0x01
    with pytest.raises(InvalidRecordError, match="CRC") as info:
        validate_batch(data)
    assert info.value.corrupt


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_bad_magic_is_corrupt(magic: int) -> None:
    data = batch()
    struct.pack_into(">b", data, MAGIC_OFFSET, magic)
    with pytest.raises(InvalidRecordError, match="magic") as info:
        validate_batch(data)
    assert info.value.corrupt


def test_length_past_the_buffer_is_corrupt() -> None:
    data = batch()
    with pytest.raises(InvalidRecordError, match="only") as info:
        validate_batch(data[:-1])
    assert info.value.corrupt
    struct.pack_into(">i", data, LENGTH_OFFSET, len(data))
    with pytest.raises(InvalidRecordError, match="declares"):
        validate_batch(data)


@pytest.mark.parametrize("length", [0, RECORD_BATCH_OVERHEAD - 13, -5])
def test_length_shorter_than_a_header_is_corrupt(length: int) -> None:
    data = batch()
    struct.pack_into(">i", data, LENGTH_OFFSET, length)
    with pytest.raises(InvalidRecordError, match="declares size") as info:
        validate_batch(data)
    assert info.value.corrupt


def test_buffer_shorter_than_a_header_is_corrupt() -> None:
    with pytest.raises(InvalidRecordError, match="less than a header"):
        validate_batch(batch()[:RECORD_BATCH_OVERHEAD - 1])


@pytest.mark.parametrize(("count", "last_offset_delta"), [(4, 2), (-1, 2), (3, 1), (0, -1)])
def test_count_disagreeing_with_last_offset_delta_is_invalid_record(count: int, last_offset_delta: int) -> None:
    data = batch()
    struct.pack_into(">i", data, RECORDS_COUNT_OFFSET, count)
    struct.pack_into(">i", data, LAST_OFFSET_DELTA_OFFSET, last_offset_delta)
    fix_crc(data)
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta") as info:
        validate_batch(data)
    assert not info.value.corrupt


def test_fewer_records_than_offsets_is_allowed_after_compaction() -> None:
    data = batch()
    struct.pack_into(">i", data, LAST_OFFSET_DELTA_OFFSET, 5)
    fix_crc(data)
    assert validate_batch(data).last_offset_delta == 5


def test_an_empty_batch_is_allowed_as_the_log_cleaner_keeps_a_producers_last_batch() -> None:
    data = batch()
    struct.pack_into(">i", data, RECORDS_COUNT_OFFSET, 0)
    fix_crc(data)
    assert validate_batch(data).records_count == 0


def test_unknown_codec_is_invalid_record() -> None:
    data = batch()
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | 0x05)
    fix_crc(data)
    with pytest.raises(InvalidRecordError, match="codec") as info:
        validate_batch(data)
    assert not info.value.corrupt


# --- iter_batches ---------------------------------------------------------------------------------


def test_iter_batches_yields_each_batch() -> None:
    data = batch() + batch(base_offset=3) + bytearray(build_batch(THREE, compression=CompressionType.LZ4))
    headers = list(iter_batches(data))
    assert [h.position for h in headers] == [0, headers[0].size_in_bytes, 2 * headers[0].size_in_bytes]
    assert [h.compression_type for h in headers] == [CompressionType.NONE] * 2 + [CompressionType.LZ4]


def test_iter_batches_rejects_empty_and_partial_record_sets() -> None:
    with pytest.raises(InvalidRecordError, match="empty") as info:
        list(iter_batches(b""))
    assert not info.value.corrupt
    data = batch() + batch()
    with pytest.raises(InvalidRecordError):
        list(iter_batches(data[:-1]))
    with pytest.raises(InvalidRecordError):
        list(iter_batches(data + b"\x00" * 5))


def test_iter_batches_stops_at_the_first_bad_batch() -> None:
    first, second = batch(), batch()
    second[-1] ^= 0xFF
    seen = []
    with pytest.raises(InvalidRecordError, match=f"batch at {len(first)}"):
        for header in iter_batches(first + second):
            seen.append(header.position)
    assert seen == [0]


# --- stamping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(CompressionType))
def test_stamping_base_offset_and_epoch_leaves_the_crc_valid(compression: CompressionType) -> None:
    data = bytearray(build_batch(THREE, compression=compression))
    crc_before = read_header(data).crc
    set_base_offset(data, 0, 1_000_000)
    set_partition_leader_epoch(data, 0, 17)
    header = validate_batch(data)
    assert (header.base_offset, header.partition_leader_epoch, header.crc) == (1_000_000, 17, crc_before)
    assert [r.offset for r in decode_batch(data).records] == [1_000_000, 1_000_001, 1_000_002]


def test_stamping_at_a_position_only_touches_that_batch() -> None:
    first, second = batch(), batch()
    data = first + second
    set_base_offset(data, len(first), 3)
    set_partition_leader_epoch(memoryview(data), len(first), 2)
    assert [(h.base_offset, h.partition_leader_epoch) for h in iter_batches(data)] == [(0, -1), (3, 2)]


@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.SNAPPY])
def test_set_log_append_time_recomputes_the_crc(compression: CompressionType) -> None:
    data = bytearray(build_batch(THREE, compression=compression))
    set_log_append_time(data, 0, T0 + 500)
    assert crc_is_valid(data)
    header = validate_batch(data)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.compression_type == compression
    assert header.max_timestamp == T0 + 500
    assert header.base_timestamp == T0


def test_set_log_append_time_at_a_position() -> None:
    first, second = batch(), batch()
    data = first + second
    set_log_append_time(data, len(first), T0 + 9)
    first_header, second_header = iter_batches(data)
    assert first_header.timestamp_type == TimestampType.CREATE_TIME
    assert second_header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert struct.unpack_from(">q", data, len(first) + MAX_TIMESTAMP_OFFSET)[0] == T0 + 9
