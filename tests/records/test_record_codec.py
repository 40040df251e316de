"""build_batch / decode_batches: round trips per codec, and agreement with an independent client library."""

from __future__ import annotations

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from tierlog.records.codec import (
    Compression,
    Record,
    RecordSpec,
    build_batch,
    decode_batch,
    decode_batches,
    decode_raw_records,
    encode_raw_batch,
    recompress_batch,
    records_section,
)
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    CompressionType,
    InvalidRecordError,
    TimestampType,
    set_log_append_time,
    validate_batch,
)

T0 = 1_700_000_000_000

RECORDS: list[RecordSpec] = [
    (b"k", b"hello", [], T0),
    (None, b"no key " * 40, [("trace", b"abc"), ("empty", b""), ("null", None)], T0 + 5),
    (b"tombstone", None, [], T0 + 3),
    (b"", b"", [("h\u00e9", b"\x00\xff")], T0 + 9),
]


def expected_records(base_offset: int) -> list[Record]:
    return [
        Record(base_offset + i, ts, TimestampType.CREATE_TIME, key, value, list(headers))
        for i, (key, value, headers, ts) in enumerate(RECORDS)
    ]


@pytest.mark.parametrize("compression", list(CompressionType))
def test_round_trip_with_each_codec(compression: CompressionType) -> None:
    data = build_batch(RECORDS, base_offset=42, compression=compression, partition_leader_epoch=7)
    [batch] = list(decode_batches(data))
    header = batch.header
    assert header.compression_type == compression
    assert header.base_offset == 42
    assert header.last_offset == 45
    assert header.records_count == 4
    assert header.partition_leader_epoch == 7
    assert header.base_timestamp == T0
    assert header.max_timestamp == T0 + 9
    assert header.size_in_bytes == len(data)
    assert batch.records == expected_records(42)


@pytest.mark.parametrize("compression", list(CompressionType))
def test_codec_is_applied_even_when_it_does_not_shrink_the_records(compression: CompressionType) -> None:
    data = build_batch([(None, b"x", [], T0)], compression=compression)
    header = validate_batch(data)
    assert header.compression_type == compression
    assert decode_batch(data).records[0].value == b"x"


@pytest.mark.parametrize("compression", list(CompressionType))
def test_build_is_deterministic(compression: CompressionType) -> None:
    assert build_batch(RECORDS, compression=compression) == build_batch(RECORDS, compression=compression)


@pytest.mark.parametrize("compression", list(CompressionType))
def test_kafka_python_reads_our_batches(compression: CompressionType) -> None:
    data = build_batch(RECORDS, base_offset=100, compression=compression)
    batch = KafkaPythonBatch(data)
    assert batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in expected_records(100)]


@pytest.mark.parametrize("compression", list(CompressionType))
def test_we_read_kafka_python_batches(compression: CompressionType) -> None:
    builder = KafkaPythonBuilder(2, int(compression), 0, 1234, 5, 17, 2**20)
    for i, (key, value, headers, ts) in enumerate(RECORDS):
        builder.append(i, ts, key, value, list(headers))
    [batch] = list(decode_batches(bytes(builder.build())))
    assert batch.records == expected_records(0)
    assert (batch.header.producer_id, batch.header.producer_epoch, batch.header.base_sequence) == (1234, 5, 17)


def test_producer_fields_are_written() -> None:
    header = validate_batch(build_batch(RECORDS, producer_id=99, producer_epoch=2, base_sequence=10))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 2, 10)
    defaults = validate_batch(build_batch(RECORDS))
    assert (defaults.producer_id, defaults.producer_epoch, defaults.base_sequence) == (-1, -1, -1)
    assert defaults.partition_leader_epoch == -1
    assert not defaults.is_transactional
    assert not defaults.is_control


def test_build_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError):
        build_batch([])


def test_decode_several_batches_and_stop_at_a_partial_tail() -> None:
    first = build_batch(RECORDS[:2], base_offset=0)
    second = build_batch(RECORDS[2:], base_offset=2, compression=CompressionType.ZSTD)
    whole = first + second
    assert [b.header.base_offset for b in decode_batches(whole)] == [0, 2]
    for cut in (1, 11, 12, 61, len(second) - 1):
        assert [b.header.base_offset for b in decode_batches(whole[: len(first) + cut])] == [0]
    assert list(decode_batches(b"")) == []
    assert list(decode_batches(memoryview(whole))) == list(decode_batches(whole))


def test_decode_rejects_a_complete_corrupt_batch() -> None:
    data = bytearray(build_batch(RECORDS))
    data[-1] ^= 0xFF
    with pytest.raises(InvalidRecordError, match="CRC") as info:
        list(decode_batches(bytes(data)))
    assert info.value.corrupt


def with_valid_crc(data: bytearray) -> bytes:
    data[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(bytes(data[ATTRIBUTES_OFFSET:])).to_bytes(4, "big")
    return bytes(data)


def test_decode_reports_a_broken_codec_stream_under_a_valid_crc() -> None:
    data = bytearray(build_batch(RECORDS, compression=CompressionType.GZIP))
    data[-3] ^= 0xFF  # the gzip trailer's CRC32/size
    with pytest.raises(InvalidRecordError, match="undecodable"):
        decode_batch(with_valid_crc(data))


def test_decode_reports_broken_record_framing_under_a_valid_crc() -> None:
    data = bytearray(build_batch(RECORDS))
    data[RECORD_BATCH_OVERHEAD] = 0x7E  # first record's length varint: 63 bytes, which is wrong
    with pytest.raises(InvalidRecordError, match="undecodable"):
        decode_batch(with_valid_crc(data))


def test_log_append_time_batches_give_every_record_the_batch_timestamp() -> None:
    data = bytearray(build_batch(RECORDS))
    set_log_append_time(data, 0, T0 + 1000)
    batch = decode_batch(bytes(data))
    assert {r.timestamp for r in batch.records} == {T0 + 1000}
    assert {r.timestamp_type for r in batch.records} == {TimestampType.LOG_APPEND_TIME}


# Raw records: what the log cleaner reads and rewrites.


@pytest.mark.parametrize("compression", list(CompressionType))
def test_raw_records_rebuild_a_batch_byte_for_byte_when_all_are_kept(compression: CompressionType) -> None:
    original = build_batch(
        RECORDS, base_offset=40, producer_id=5, producer_epoch=1, base_sequence=9, compression=compression
    )
    header = validate_batch(original)
    rebuilt = encode_raw_batch(header, decode_raw_records(original, header), delete_horizon_ms=None)
    if compression == CompressionType.NONE:
        assert rebuilt == original
    assert decode_batch(rebuilt).records == decode_batch(original).records


def test_a_rebuilt_batch_keeps_offsets_timestamps_headers_and_the_delete_horizon() -> None:
    original = build_batch(RECORDS, base_offset=40, partition_leader_epoch=3, compression=CompressionType.ZSTD)
    header = validate_batch(original)
    kept = decode_raw_records(original, header)[1:3]
    rebuilt = validate_batch(encode_raw_batch(header, kept, delete_horizon_ms=T0 + 86_400_000))
    assert (rebuilt.base_offset, rebuilt.last_offset, rebuilt.records_count) == (40, 43, 2)
    assert (rebuilt.partition_leader_epoch, rebuilt.compression_type) == (3, CompressionType.ZSTD)
    assert rebuilt.delete_horizon_ms == T0 + 86_400_000
    assert rebuilt.max_timestamp == T0 + 5
    records = decode_batch(encode_raw_batch(header, kept, delete_horizon_ms=T0 + 86_400_000)).records
    assert [(r.offset, r.timestamp, r.key, r.headers) for r in records] == [
        (41, T0 + 5, None, [("trace", b"abc"), ("empty", b""), ("null", None)]),
        (42, T0 + 3, b"tombstone", []),
    ]


def test_an_empty_rebuilt_batch_is_kafkas_empty_batch() -> None:
    original = build_batch(RECORDS, base_offset=7, producer_id=5, producer_epoch=1, base_sequence=9)
    header = validate_batch(original)
    empty = validate_batch(encode_raw_batch(header, [], delete_horizon_ms=None))
    assert (empty.base_offset, empty.last_offset, empty.records_count, empty.base_timestamp) == (7, 10, 0, -1)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (5, 1, 9)
    assert empty.max_timestamp == header.max_timestamp and empty.size_in_bytes == RECORD_BATCH_OVERHEAD


def test_raw_records_of_a_compressed_batch_keep_null_keys_and_broken_records_are_invalid() -> None:
    batch = build_batch(RECORDS, compression=CompressionType.LZ4)
    assert [r.key for r in decode_raw_records(batch, validate_batch(batch))] == [r[0] for r in RECORDS]
    truncated = bytearray(build_batch(RECORDS))
    header = validate_batch(truncated)
    with pytest.raises(InvalidRecordError, match="undecodable records"):
        decode_raw_records(truncated[: header.size_in_bytes - 5], header)


# Recompression: what a leader stores when a batch's codec is not its topic's compression.type.


def test_a_recompressed_batch_follows_memory_records_builder() -> None:
    # A source batch Kafka's builder would not write: baseTimestamp is not the first record's (a delete
    # horizon, with its attribute bit), the transactional bit is set, and the first record has attributes.
    plain = build_batch(RECORDS, producer_id=5, producer_epoch=1, base_sequence=9)
    plain_header = validate_batch(plain)
    source = bytearray(
        encode_raw_batch(plain_header, decode_raw_records(plain, plain_header), delete_horizon_ms=T0 - 1000)
    )
    attributes = int.from_bytes(source[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2], "big") | TRANSACTIONAL_FLAG_MASK
    source[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big")
    source[RECORD_BATCH_OVERHEAD + 1] = 0x01  # the first record's attributes, after its 1-byte length
    source[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(source[ATTRIBUTES_OFFSET:]).to_bytes(4, "big")
    header = validate_batch(source)
    assert (header.base_timestamp, header.delete_horizon_ms) == (T0 - 1000, T0 - 1000)
    assert records_section(source, header)[1] == 0x01

    rebuilt = recompress_batch(source, header, Compression(CompressionType.ZSTD, 7))
    result = validate_batch(rebuilt)
    assert result.compression_type == CompressionType.ZSTD
    assert result.is_transactional and result.delete_horizon_ms is None
    assert (result.base_timestamp, result.max_timestamp) == (T0, T0 + 9)
    assert (result.producer_id, result.producer_epoch, result.base_sequence) == (5, 1, 9)
    assert (result.last_offset_delta, result.records_count) == (3, 4)
    assert records_section(rebuilt, result)[1] == 0  # record attributes are written as 0
    assert decode_batch(rebuilt).records == decode_batch(source).records


@pytest.mark.parametrize("as_a_client_builds_it", [True, False])
def test_a_recompressed_batch_is_the_batch_the_cleaners_builder_writes(as_a_client_builds_it: bool) -> None:
    # Two ways to one result: the records of a client's batch are reused as they are, the others rewritten;
    # either way they are what encode_raw_batch (MemoryRecordsBuilder's rules) writes for the same records.
    source = build_batch(RECORDS, producer_id=5, producer_epoch=1, base_sequence=9)
    header = validate_batch(source)
    if not as_a_client_builds_it:
        source = encode_raw_batch(header, decode_raw_records(source, header), delete_horizon_ms=T0 - 1000)
        header = validate_batch(source)
    expected = encode_raw_batch(header, decode_raw_records(source, header), delete_horizon_ms=None)
    assert recompress_batch(source, header, Compression(CompressionType.NONE)) == expected
    assert (recompress_batch(source, header, Compression(CompressionType.NONE)) == source) is as_a_client_builds_it


def test_recompressing_a_batch_whose_records_do_not_parse_is_an_invalid_record_error() -> None:
    batch = bytearray(build_batch(RECORDS))
    batch[RECORD_BATCH_OVERHEAD] = 0x7E  # the first record's length, now past the end of the records
    batch[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(batch[ATTRIBUTES_OFFSET:]).to_bytes(4, "big")
    with pytest.raises(InvalidRecordError, match="undecodable records"):
        recompress_batch(batch, validate_batch(batch), Compression(CompressionType.ZSTD))
