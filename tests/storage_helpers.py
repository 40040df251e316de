"""Builders shared by the tests of logs (storage, tiered, server): real magic-2 batches (aiokafka's C builder) and
logs in tmp dirs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tierlog.common import TopicPartition
from tierlog.records.codec import decode_records
from tierlog.records.record_batch import iter_batches, set_base_offset, set_partition_leader_epoch
from tierlog.storage.file_records import FetchDataInfo
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig

T0 = 1_700_000_000_000
TP = TopicPartition("topic", 0)


def make_batch(
    records: int = 1,
    *,
    value_size: int = 16,
    timestamp: int = T0,
    timestamps: list[int] | None = None,
    base_offset: int = 0,
    epoch: int = -1,
    compression: int = 0,
    values: list[bytes] | None = None,
    keys: list[bytes | None] | None = None,
) -> bytearray:
    """One batch of `records` records (offset deltas 0..n-1, key b"k" unless `keys` says otherwise) as a producer
    (or, with base_offset and epoch, a leader) would send it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i in range(records):
        value = values[i] if values is not None else bytes([i % 256]) * value_size
        ts = timestamps[i] if timestamps is not None else timestamp + i
        builder.append(i, timestamp=ts, key=keys[i] if keys is not None else b"k", value=value, headers=[])
    buffer = bytearray(builder.build())
    set_base_offset(buffer, 0, base_offset)
    set_partition_leader_epoch(buffer, 0, epoch)
    return buffer


def log_config(**overrides: object) -> LogConfig:
    """LogConfig with topic overrides given as keyword arguments: segment_bytes=1024 -> segment.bytes."""
    return LogConfig.from_props({k.replace("_", "."): str(v) for k, v in overrides.items()}, {})


def open_log(
    directory: Path,
    config: LogConfig | None = None,
    *,
    topic_partition: TopicPartition = TP,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    high_watermark: int = 0,
    had_clean_shutdown: bool = True,
    now_ms: int = T0,
    remote_log_enabled: bool = False,
) -> Log:
    """The Log in `directory` (a new one if it is empty), opened as the LogManager opens it."""
    return Log.open(
        directory,
        config or log_config(),
        topic_partition=topic_partition,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
        high_watermark=high_watermark,
        had_clean_shutdown=had_clean_shutdown,
        now_ms=now_ms,
        remote_log_enabled=remote_log_enabled,
    )


def records_of(data: bytes | bytearray) -> list[tuple[int, int, bytes | None]]:
    """(offset, timestamp, value) of every record in a buffer of whole batches."""
    out = []
    for header in iter_batches(data):
        batch = data[header.position : header.position + header.size_in_bytes]
        out.extend((r.offset, r.timestamp, r.value) for r in decode_records(batch, header))
    return out


def fetched(info: FetchDataInfo) -> bytes:
    return b"" if info.records is None else info.records.read_bytes()


def batch_offsets(data: bytes | bytearray) -> list[tuple[int, int]]:
    """(base offset, last offset) of every batch in a buffer."""
    return [(h.base_offset, h.last_offset) for h in iter_batches(data)]


def overrides(**settings: object) -> Mapping[str, str]:
    return {k.replace("_", "."): str(v) for k, v in settings.items()}
