"""RecordBatch v2 (magic 2): a zero-copy view of the 61-byte batch header.

The broker treats a batch as opaque bytes once its header is valid: it checks magic, lengths, the CRC32C
and the record count, and stamps the base offset and partition leader epoch in place. Neither stamped
field is covered by the CRC (which starts at `attributes`), so stamping never recomputes it. Records are
decoded only in `tierlog.records.codec`: for tools and the log cleaner, and on the produce path only for the
record checks and the recompression a topic's configs call for; never on the fetch path.

Layout (Kafka's DefaultRecordBatch):
    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records...
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from crc32c import crc32c

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORD_BATCH_OVERHEAD = 61

# Bytes of a batch that precede the part counted by batchLength (baseOffset + batchLength).
LOG_OVERHEAD = 12
CURRENT_MAGIC = 2
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
# KIP-534: the log cleaner sets this bit when it first keeps a tombstone; baseTimestamp then holds the time
# after which the cleaner may remove the batch's tombstones (the delete horizon).
DELETE_HORIZON_FLAG_MASK = 0x40


class CompressionType(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class InvalidRecordError(ValueError):
    """A batch that fails validation. `corrupt` distinguishes CORRUPT_MESSAGE from INVALID_RECORD."""

    def __init__(self, message: str, *, corrupt: bool = True) -> None:
        super().__init__(message)
        self.corrupt = corrupt


@dataclass(frozen=True, slots=True)
class RecordBatchHeader:
    """The decoded header of one batch; `position` is where the batch starts in its buffer."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression_type(self) -> CompressionType:
        return CompressionType(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG_MASK else None


def read_header(buffer: memoryview | bytes | bytearray, position: int = 0) -> RecordBatchHeader:
    """Decode the header at `position`; the caller guarantees RECORD_BATCH_OVERHEAD bytes are there."""
    return RecordBatchHeader(position, *_HEADER.unpack_from(buffer, position))


def batch_size_at(buffer: memoryview | bytes | bytearray, position: int) -> int | None:
    """Size of the batch starting at `position`, or None if not even its length field is in the buffer."""
    if len(buffer) - position < LOG_OVERHEAD:
        return None
    return _INT32.unpack_from(buffer, position + LENGTH_OFFSET)[0] + LOG_OVERHEAD


def validate_batch(buffer: memoryview | bytes | bytearray, position: int = 0) -> RecordBatchHeader:
    """Check one complete batch at `position` and return its header.

    Raises InvalidRecordError for a wrong magic, an impossible length, a CRC32C mismatch or a record count
    that disagrees with lastOffsetDelta (Kafka's DefaultRecordBatch.ensureValid plus the broker's checks).
    """
    available = len(buffer) - position
    if available < RECORD_BATCH_OVERHEAD:
        raise InvalidRecordError(f"batch at {position} has {available} bytes, less than a header")
    header = read_header(buffer, position)
    if header.magic != CURRENT_MAGIC:
        raise InvalidRecordError(f"batch at {position} has magic {header.magic}; only magic 2 is supported")
    if header.size_in_bytes < RECORD_BATCH_OVERHEAD:
        raise InvalidRecordError(f"batch at {position} declares size {header.size_in_bytes}")
    if header.size_in_bytes > available:
        raise InvalidRecordError(
            f"batch at {position} declares {header.size_in_bytes} bytes but only {available} follow"
        )
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    computed = crc32c(view[position + ATTRIBUTES_OFFSET : position + header.size_in_bytes])
    if computed != header.crc:
        raise InvalidRecordError(f"batch at {position} has CRC {header.crc:#010x}, computed {computed:#010x}")
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec > CompressionType.ZSTD:
        raise InvalidRecordError(f"batch at {position} has unknown compression codec {codec}", corrupt=False)
    # A producer's batch holds lastOffsetDelta + 1 records; compaction may leave gaps (fewer records than
    # the delta implies, or none: the cleaner keeps a producer's last batch empty to keep its sequence) but
    # never more records than offsets. Clients may not send empty batches (Log._validate_client_batch).
    if header.last_offset_delta < 0 or not 0 <= header.records_count <= header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"batch at {position} has {header.records_count} records but lastOffsetDelta {header.last_offset_delta}",
            corrupt=False,
        )
    return header


def iter_batches(buffer: memoryview | bytes | bytearray) -> Iterator[RecordBatchHeader]:
    """Validate and yield every batch of a buffer that must hold whole batches only (a produce request)."""
    position = 0
    end = len(buffer)
    if end == 0:
        raise InvalidRecordError("empty record set", corrupt=False)
    while position < end:
        header = validate_batch(buffer, position)
        yield header
        position += header.size_in_bytes


def complete_batches(buffer: memoryview | bytes | bytearray) -> Iterator[tuple[int, int]]:
    """The position and size of every complete batch of a buffer read from a log (a fetch response, a segment);
    a partial batch at the end ends the walk, as a consumer treats the truncated last batch of a fetch response.
    Nothing is validated."""
    position = 0
    while True:
        size = batch_size_at(buffer, position)
        if size is None or size > len(buffer) - position:
            return
        yield position, size
        position += size


def set_base_offset(buffer: bytearray | memoryview, position: int, base_offset: int) -> None:
    _INT64.pack_into(buffer, position + BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(buffer: bytearray | memoryview, position: int, epoch: int) -> None:
    _INT32.pack_into(buffer, position + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buffer: bytearray | memoryview, position: int, timestamp_ms: int) -> None:
    """Turn a batch into LogAppendTime: set the attribute bit and maxTimestamp, then recompute the CRC
    (both fields are covered by it), as Kafka's LogValidator does for message.timestamp.type=LogAppendTime."""
    attributes = struct.unpack_from(">h", buffer, position + ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", buffer, position + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buffer, position + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    size = _INT32.unpack_from(buffer, position + LENGTH_OFFSET)[0] + LOG_OVERHEAD
    view = memoryview(buffer)
    crc = crc32c(view[position + ATTRIBUTES_OFFSET : position + size])
    struct.pack_into(">I", buffer, position + CRC_OFFSET, crc)
