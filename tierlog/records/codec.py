"""Record-level encoding and decoding of RecordBatch v2 for tools and tests, never for the broker path.

The broker moves batches as opaque bytes (`record_batch.py`); only dump-log, the demo clients and tests need
the records inside. Records are encoded and decoded by aiokafka's C extension (its DefaultRecordBatch
reader and DefaultRecordBatchBuilder), which also decompresses gzip/snappy/lz4/zstd through cramjam.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from aiokafka.codec import lz4_encode, snappy_encode, zstd_encode
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c

from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    CURRENT_MAGIC,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    InvalidRecordError,
    RecordBatchHeader,
    TimestampType,
    batch_size_at,
    set_base_offset,
    set_partition_leader_epoch,
    validate_batch,
)

NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

Header = tuple[str, bytes | None]
# (key, value, headers, timestamp_ms): what build_batch takes per record. The timestamp is required, so
# nothing here reads the clock.
RecordSpec = tuple[bytes | None, bytes | None, Sequence[Header], int]


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    header: RecordBatchHeader
    records: list[Record]


def _gzip_encode(data: bytes) -> bytes:
    # mtime=0 as Java's GZIPOutputStream writes, so the same records always build the same bytes.
    return gzip.compress(data, compresslevel=9, mtime=0)


# The compressed form of the records section that a Kafka client would send for each codec.
_ENCODERS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: _gzip_encode,
    CompressionType.SNAPPY: snappy_encode,
    CompressionType.LZ4: lz4_encode,
    CompressionType.ZSTD: zstd_encode,
}


def decode_batch(buffer: bytes | bytearray | memoryview, position: int = 0) -> DecodedBatch:
    """Validate the complete batch at `position` (header and CRC32C) and decode its records."""
    header = validate_batch(buffer, position)
    return DecodedBatch(header, decode_records(buffer[position : position + header.size_in_bytes], header))


def decode_records(batch: bytes | bytearray | memoryview, header: RecordBatchHeader) -> list[Record]:
    """Decode the records of `batch`, which holds exactly the batch `header` describes.

    The CRC is not checked, so dump-log can still show the records of a batch whose checksum is wrong, as
    Kafka's DumpLogSegments does; raises InvalidRecordError if the records themselves do not parse.
    """
    timestamp_type = header.timestamp_type
    try:
        return [
            Record(r.offset, r.timestamp, timestamp_type, r.key, r.value, list(r.headers))
            for r in DefaultRecordBatch(bytes(batch))
        ]
    except Exception as e:
        # Records that do not parse, or a stream that does not decompress: the C reader and each codec
        # library raise their own exception types, and to a tool all mean a corrupt batch.
        raise InvalidRecordError(f"batch at {header.position} has undecodable records: {e!r}") from e


def decode_batches(buffer: bytes | bytearray | memoryview) -> Iterator[DecodedBatch]:
    """Decode every complete batch; a partial batch at the end ends the walk, as a consumer treats the
    truncated last batch of a fetch response. A complete but invalid batch raises InvalidRecordError."""
    position = 0
    while True:
        size = batch_size_at(buffer, position)
        if size is None or size > len(buffer) - position:
            return
        batch = decode_batch(buffer, position)
        yield batch
        position += batch.header.size_in_bytes


def build_batch(
    records: Sequence[RecordSpec],
    *,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One RecordBatch v2 as a producer would send it, with the given offsets and epoch already stamped.

    Unlike aiokafka's producer, the requested codec is always applied, even when it does not shrink the
    records, so tests of compressed batches get compressed batches.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    builder = DefaultRecordBatchBuilder(
        CURRENT_MAGIC,
        CompressionType.NONE,
        0,
        producer_id,
        producer_epoch,
        base_sequence,
        # No size limit: the caller decides what goes into the batch.
        2**31 - 1,
    )
    for offset_delta, (key, value, headers, timestamp_ms) in enumerate(records):
        builder.append(offset_delta, timestamp_ms, key, value, list(headers))
    buffer = builder.build()
    if compression != CompressionType.NONE:
        buffer = _compress(buffer, compression)
    set_base_offset(buffer, 0, base_offset)
    set_partition_leader_epoch(buffer, 0, partition_leader_epoch)
    return bytes(buffer)


def _compress(batch: bytearray, compression: CompressionType) -> bytearray:
    """Replace the records section of an uncompressed batch by its compressed form and fix the header
    fields that change with it: batchLength, the codec bits of attributes, and the CRC over both."""
    compressed = bytearray(batch[:RECORD_BATCH_OVERHEAD])
    compressed += _ENCODERS[compression](bytes(batch[RECORD_BATCH_OVERHEAD:]))
    compressed[LENGTH_OFFSET : LENGTH_OFFSET + 4] = (len(compressed) - LOG_OVERHEAD).to_bytes(4, "big")
    attributes = int.from_bytes(compressed[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2], "big")
    compressed[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = (attributes | compression).to_bytes(2, "big")
    crc = crc32c(compressed[ATTRIBUTES_OFFSET:])
    compressed[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return compressed
