"""The topic's compression.type on the leader, as Kafka's LogValidator applies it: a batch in another codec is
rebuilt in the topic's codec (and compression.<codec>.level) with its offsets, producer fields, timestamps,
keys, values and headers kept and a valid CRC; a batch already in that codec, or any batch of a `producer`
topic, is stored byte for byte as sent; followers store the leader's bytes unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from crc32c import crc32c
from storage_helpers import T0, fetched, log_config, open_log

from tierlog.records.codec import (
    Compression,
    RecordSpec,
    build_batch,
    compress,
    decode_batches,
    decode_raw_records,
    records_section,
)
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    InvalidRecordError,
    RecordBatchHeader,
    TimestampType,
    iter_batches,
    read_header,
    validate_batch,
)
from tierlog.storage.errors import RecordTooLargeError
from tierlog.storage.log import Log

# compression.type -> the codec batches are stored with
TOPIC_CODECS = {
    "uncompressed": CompressionType.NONE,
    "gzip": CompressionType.GZIP,
    "snappy": CompressionType.SNAPPY,
    "lz4": CompressionType.LZ4,
    "zstd": CompressionType.ZSTD,
}
PID = 7000


def varied_records(count: int = 40) -> list[RecordSpec]:
    """Null, empty and binary keys and values, duplicate and null-valued headers, and timestamps out of order
    (the first record is not the oldest, so baseTimestamp and maxTimestamp must both be recomputed)."""
    records: list[RecordSpec] = []
    for i in range(count):
        key = None if i % 7 == 0 else b"" if i % 13 == 0 else b"key-%d" % (i % 5)
        value = None if i % 11 == 0 else bytes(range(i % 256)) * 3 + b"tierlog " * (i % 9)
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("trace", b"%08d" % i), ("dup", b"one"), ("dup", b"two")]
        if i % 5 == 0:
            headers.append(("null-valued", None))
        records.append((key, value, headers, T0 + 500 + i * 10 - (i % 4) * 300))
    return records


RECORDS = varied_records()


def produced(codec: CompressionType, *, base_sequence: int = -1, records: Sequence[RecordSpec] = RECORDS) -> bytearray:
    """A batch as a client sends it: base offset 0, no partition leader epoch."""
    producer = {"producer_id": PID, "producer_epoch": 3, "base_sequence": base_sequence} if base_sequence >= 0 else {}
    return bytearray(build_batch(records, compression=codec, **producer))


def stored_batches(log: Log, start_offset: int = 0) -> tuple[bytes, list[RecordBatchHeader]]:
    data = fetched(log.read(start_offset, 1 << 24, None, True))
    return data, list(iter_batches(data))  # iter_batches checks every CRC


# (offset, timestamp, timestamp type, key, value, headers)
ReadRecord = tuple[int, int, TimestampType, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def as_read(data: bytes) -> list[ReadRecord]:
    """Every record as aiokafka's reader (the C DefaultRecordBatch) returns it."""
    return [
        (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)
        for batch in decode_batches(data)
        for r in batch.records
    ]


def expected(base_offset: int) -> list[ReadRecord]:
    """RECORDS as a consumer should read them from `base_offset` on."""
    return [
        (base_offset + i, ts, TimestampType.CREATE_TIME, key, value, list(headers))
        for i, (key, value, headers, ts) in enumerate(RECORDS)
    ]


@pytest.mark.parametrize("source", list(CompressionType), ids=lambda c: c.name.lower())
@pytest.mark.parametrize("topic_codec", list(TOPIC_CODECS))
def test_a_batch_is_stored_in_the_topics_codec_with_every_record_and_field_kept(
    tmp_path: Path, source: CompressionType, topic_codec: str
) -> None:
    log = open_log(tmp_path, log_config(compression_type=topic_codec))
    log.append_as_leader(produced(CompressionType.NONE, records=RECORDS[:3]), 4, T0)
    sent = produced(source, base_sequence=0)
    sent_header = read_header(sent)
    info = log.append_as_leader(sent, 5, T0)

    data, headers = stored_batches(log, 3)
    assert len(headers) == 1
    header = headers[0]
    target = TOPIC_CODECS[topic_codec]
    assert header.compression_type == target
    # Offsets continue from the log end, the leader epoch is stamped, the producer's fields stay.
    assert (info.first_offset, info.last_offset, info.records_count) == (3, 3 + len(RECORDS) - 1, len(RECORDS))
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (3, len(RECORDS) - 1, len(RECORDS))
    assert header.partition_leader_epoch == 5
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, 3, 0)
    assert header.timestamp_type == TimestampType.CREATE_TIME and not header.is_transactional
    # MemoryRecordsBuilder's header: baseTimestamp is the first record's, maxTimestamp the largest.
    assert header.base_timestamp == RECORDS[0][3]
    assert header.max_timestamp == max(ts for *_, ts in RECORDS) == info.max_timestamp
    assert as_read(data) == expected(3)
    assert [r.offset_delta for r in decode_raw_records(data, header)] == list(range(len(RECORDS)))
    if source == target:
        # Zero copy: the bytes are the producer's but for the stamped base offset and leader epoch.
        assert data[CRC_OFFSET:] == sent[CRC_OFFSET:]
        assert header.crc == sent_header.crc
    assert info.valid_bytes == header.size_in_bytes


@pytest.mark.parametrize("source", list(CompressionType), ids=lambda c: c.name.lower())
def test_a_producer_topic_stores_every_batch_as_sent(tmp_path: Path, source: CompressionType) -> None:
    log = open_log(tmp_path, log_config(compression_type="producer"))
    sent = produced(source)
    log.append_as_leader(sent, 0, T0)
    data, (header,) = stored_batches(log)
    assert header.compression_type == source
    assert data[CRC_OFFSET:] == sent[CRC_OFFSET:]


def test_a_retry_of_a_recompressed_batch_is_answered_with_its_first_offsets_and_not_written(tmp_path: Path) -> None:
    log = open_log(tmp_path, log_config(compression_type="zstd"))
    log.append_as_leader(produced(CompressionType.LZ4, base_sequence=0, records=RECORDS[:2]), 0, T0)
    first = log.append_as_leader(produced(CompressionType.LZ4, base_sequence=2), 0, T0)
    retry = log.append_as_leader(produced(CompressionType.LZ4, base_sequence=2), 0, T0)
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset) == (2, 41)
    assert (retry.records_count, retry.valid_bytes) == (0, 0)
    assert log.log_end_offset == 42
    following = log.append_as_leader(produced(CompressionType.LZ4, base_sequence=42, records=RECORDS[:1]), 0, T0)
    assert following.first_offset == 42
    _, headers = stored_batches(log)
    assert [(h.base_offset, h.base_sequence, h.compression_type) for h in headers] == [
        (0, 0, CompressionType.ZSTD),
        (2, 2, CompressionType.ZSTD),
        (42, 42, CompressionType.ZSTD),
    ]


def test_a_log_append_time_topic_stamps_the_recompressed_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, log_config(compression_type="gzip", message_timestamp_type="LogAppendTime"))
    now = T0 + 86_400_000
    info = log.append_as_leader(produced(CompressionType.SNAPPY), 0, now)
    data, (header,) = stored_batches(log)
    assert header.compression_type == CompressionType.GZIP
    assert (header.timestamp_type, header.max_timestamp) == (TimestampType.LOG_APPEND_TIME, now)
    assert (info.log_append_time, info.max_timestamp) == (now, now)
    assert as_read(data) == [(o, now, TimestampType.LOG_APPEND_TIME, k, v, h) for o, _, _, k, v, h in expected(0)]


def test_only_the_batches_in_another_codec_are_rebuilt(tmp_path: Path) -> None:
    log = open_log(tmp_path, log_config(compression_type="lz4"))
    kept, rebuilt = produced(CompressionType.LZ4), produced(CompressionType.GZIP, records=RECORDS[:5])
    log.append_as_leader(kept + rebuilt, 1, T0)
    data, headers = stored_batches(log)
    assert [(h.base_offset, h.compression_type) for h in headers] == [
        (0, CompressionType.LZ4),
        (40, CompressionType.LZ4),
    ]
    assert data[CRC_OFFSET : headers[0].size_in_bytes] == kept[CRC_OFFSET:]
    assert [r[4] for r in as_read(data)] == [v for _, v, _, _ in RECORDS + RECORDS[:5]]


@pytest.mark.parametrize(
    ("topic_codec", "setting", "lowest", "highest"),
    [
        ("gzip", "compression.gzip.level", 1, 9),
        ("lz4", "compression.lz4.level", 1, 17),
        ("zstd", "compression.zstd.level", 1, 19),
    ],
)
def test_the_codecs_level_is_applied(tmp_path: Path, topic_codec: str, setting: str, lowest: int, highest: int) -> None:
    records = [
        (b"k", b"%d tierlog event with some repetition %d" % (i, i * 7919 % 1000) * 20, [], T0 + i) for i in range(300)
    ]
    sizes = {}
    for level in (lowest, highest):
        log = open_log(
            tmp_path / f"{topic_codec}-{level}",
            log_config(**{"compression_type": topic_codec, setting.replace(".", "_"): level}),
        )
        log.append_as_leader(produced(CompressionType.NONE, records=records), 0, T0)
        data, (header,) = stored_batches(log)
        assert [r[4] for r in as_read(data)] == [v for _, v, _, _ in records]
        # The payload is exactly the encoder's output at that level.
        section = records_section(data, header)
        assert data[RECORD_BATCH_OVERHEAD:] == compress(section, Compression(TOPIC_CODECS[topic_codec], level))
        sizes[level] = header.size_in_bytes
    assert sizes[highest] < sizes[lowest]


def test_a_batch_too_large_once_recompressed_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    records = [(None, b"a" * 1000, [], T0)] * 10
    sent = produced(CompressionType.ZSTD, records=records)
    log = open_log(tmp_path, log_config(compression_type="uncompressed", max_message_bytes=len(sent) + 100))
    with pytest.raises(RecordTooLargeError, match=r"Message batch size is \d+ bytes in append to partition topic-0"):
        log.append_as_leader(sent, 0, T0)
    assert log.log_end_offset == 0 and log.size_in_bytes == 0


def test_a_batch_whose_records_do_not_decompress_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    sent = produced(CompressionType.LZ4)
    sent[RECORD_BATCH_OVERHEAD + 10 :] = b"\xff" * (len(sent) - RECORD_BATCH_OVERHEAD - 10)
    header = read_header(sent)
    sent[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(sent[ATTRIBUTES_OFFSET:]).to_bytes(4, "big")
    validate_batch(sent)  # the CRC is right: only the records inside are broken
    log = open_log(tmp_path, log_config(compression_type="zstd"))
    with pytest.raises(InvalidRecordError, match="undecodable records"):
        log.append_as_leader(sent, 0, T0)
    assert header.compression_type == CompressionType.LZ4 and log.log_end_offset == 0


def test_a_follower_stores_the_leaders_bytes_whatever_its_compression_type(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", log_config(compression_type="zstd"))
    leader.append_as_leader(produced(CompressionType.LZ4), 2, T0)
    leader.append_as_leader(produced(CompressionType.ZSTD), 2, T0)
    leader_bytes, _ = stored_batches(leader)
    # A follower whose config says otherwise (a change the leader applies to later batches only) still
    # appends the leader's batches as they are, so the replicas stay byte-identical.
    follower = open_log(tmp_path / "follower", log_config(compression_type="gzip"))
    follower.append_as_follower(bytearray(leader_bytes), T0)
    follower_bytes, headers = stored_batches(follower)
    assert follower_bytes == leader_bytes
    assert {h.compression_type for h in headers} == {CompressionType.ZSTD}
