"""Record-level encoding and decoding of RecordBatch v2.

The broker's produce and fetch paths move batches as opaque bytes (`record_batch.py`). The records inside
are needed by dump-log, the demo clients and tests (through aiokafka's C extension: its DefaultRecordBatch
reader and DefaultRecordBatchBuilder, which also decompress gzip/snappy/lz4/zstd through cramjam), and by
three broker paths that must see them exactly as stored: the log cleaner, which rewrites batches keeping each
record's offset delta, timestamp and headers byte for byte (`decode_raw_records`, `encode_raw_batch`), the
leader's record checks (`tierlog.records.validation`), and the leader's recompression of a batch to its
topic's `compression.type` (`recompress_batch`).
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from aiokafka.codec import gzip_decode, lz4_decode, lz4_encode, snappy_decode, snappy_encode, zstd_decode, zstd_encode
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c

from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    CURRENT_MAGIC,
    DELETE_HORIZON_FLAG_MASK,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    CompressionType,
    InvalidRecordError,
    RecordBatchHeader,
    TimestampType,
    complete_batches,
    read_header,
    set_base_offset,
    set_partition_leader_epoch,
    validate_batch,
)

NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
# Kafka's DefaultRecordBatch header, as record_batch reads it.
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")

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


# Kafka's compression levels (KIP-390: CompressionType.minLevel, maxLevel, defaultLevel) of the codecs that
# have them; snappy has none. gzip's default -1 is zlib's own default (Java's Deflater.DEFAULT_COMPRESSION).
GZIP_MIN_LEVEL, GZIP_MAX_LEVEL, GZIP_DEFAULT_LEVEL = 1, 9, -1
LZ4_MIN_LEVEL, LZ4_MAX_LEVEL, LZ4_DEFAULT_LEVEL = 1, 17, 9
ZSTD_MIN_LEVEL, ZSTD_MAX_LEVEL, ZSTD_DEFAULT_LEVEL = -131072, 22, 3
_DEFAULT_LEVELS = {
    CompressionType.GZIP: GZIP_DEFAULT_LEVEL,
    CompressionType.LZ4: LZ4_DEFAULT_LEVEL,
    CompressionType.ZSTD: ZSTD_DEFAULT_LEVEL,
}


@dataclass(frozen=True, slots=True)
class Compression:
    """Kafka's Compression: a codec and, for gzip, lz4 and zstd, its level (None: Kafka's default level)."""

    type: CompressionType
    level: int | None = None


def compress(data: bytes, compression: Compression) -> bytes:
    """A records section compressed as a Kafka client or broker writes it with `compression`."""
    codec = compression.type
    level = compression.level if compression.level is not None else _DEFAULT_LEVELS.get(codec)
    if codec == CompressionType.GZIP:
        # mtime=0 as Java's GZIPOutputStream writes, so the same records always build the same bytes.
        return gzip.compress(data, compresslevel=level, mtime=0)  # type: ignore[arg-type]
    if codec == CompressionType.LZ4:
        # Kafka's Lz4BlockOutputStream (independent blocks, no content checksum) uses lz4's fast compressor at
        # the default level and the high-compression one at the others. In lz4's frame API, which aiokafka
        # calls, level 0 is the fast compressor, 3 to 12 the high one and higher levels compress as 12 (as in
        # lz4-java); 1 and 2 are the fast one too, where lz4-java runs its high one at its lightest settings.
        return lz4_encode(data, level=0 if level == LZ4_DEFAULT_LEVEL else level)  # type: ignore[arg-type]
    if codec == CompressionType.ZSTD:
        return zstd_encode(data, level=level)
    if codec == CompressionType.SNAPPY:
        # xerial's framing, as Kafka's SnappyOutputStream writes it.
        return snappy_encode(data)
    raise ValueError(f"no encoder for {codec!r}")


_DECODERS: dict[CompressionType, Callable[[bytes], bytes]] = {
    CompressionType.GZIP: gzip_decode,
    CompressionType.SNAPPY: snappy_decode,
    CompressionType.LZ4: lz4_decode,
    CompressionType.ZSTD: zstd_decode,
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
    for position, _ in complete_batches(buffer):
        yield decode_batch(buffer, position)


def build_batch(
    records: Sequence[RecordSpec],
    *,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    control: bool = False,
    transactional: bool = False,
) -> bytes:
    """One RecordBatch v2 as a producer would send it, with the given offsets and epoch already stamped;
    with `control`, a control batch (each record's key is then a control record key: version, type); with
    `transactional`, the batch carries the transactional attribute (a transactional producer's batch, or a
    transaction marker).

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
    if control or transactional:
        # aiokafka's builder writes neither flag: set them and sign the batch again.
        flags = (CONTROL_FLAG_MASK if control else 0) | (TRANSACTIONAL_FLAG_MASK if transactional else 0)
        attributes = int.from_bytes(buffer[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2], "big") | flags
        buffer[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big")
        buffer[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(buffer[ATTRIBUTES_OFFSET:]).to_bytes(4, "big")
    if compression != CompressionType.NONE:
        buffer = _compress(buffer, compression)
    set_base_offset(buffer, 0, base_offset)
    set_partition_leader_epoch(buffer, 0, partition_leader_epoch)
    return bytes(buffer)


def _compress(batch: bytearray, compression: CompressionType) -> bytearray:
    """Replace the records section of an uncompressed batch by its compressed form and fix the header
    fields that change with it: batchLength, the codec bits of attributes, and the CRC over both."""
    compressed = bytearray(batch[:RECORD_BATCH_OVERHEAD])
    compressed += compress(bytes(batch[RECORD_BATCH_OVERHEAD:]), Compression(compression))
    compressed[LENGTH_OFFSET : LENGTH_OFFSET + 4] = (len(compressed) - LOG_OVERHEAD).to_bytes(4, "big")
    attributes = int.from_bytes(compressed[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2], "big")
    compressed[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = (attributes | compression).to_bytes(2, "big")
    crc = crc32c(compressed[ATTRIBUTES_OFFSET:])
    compressed[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return compressed


# Raw records: what the log cleaner keeps of a record, exactly as stored.


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record of a batch as stored: its offset delta, absolute timestamp (base timestamp + delta), key,
    value, and its headers section (count and headers) as bytes, copied unchanged when the batch is rewritten."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: bytes


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's ByteUtils.readVarint/readVarlong) at `position`: (value, next position)."""
    shift = result = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at {position}")


def _write_varint(out: bytearray, value: int) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _read_bytes(data: bytes, position: int) -> tuple[bytes | None, int]:
    length, position = _read_varint(data, position)
    if length < 0:
        return None, position
    end = position + length
    if end > len(data):
        raise ValueError(f"field of {length} bytes at {position} runs past the records")
    return data[position:end], end


def _skip_headers(data: bytes, position: int) -> int:
    count, position = _read_varint(data, position)
    if count < 0:
        raise ValueError(f"negative header count {count}")
    for _ in range(count):
        key_length, position = _read_varint(data, position)
        if key_length < 0:
            raise ValueError("header with a null key")
        position += key_length
        _, position = _read_bytes(data, position)
    return position


def _record_spans(data: bytes, records_count: int) -> Iterator[tuple[int, int]]:
    """Where each of the `records_count` records of the records section `data` starts (after its length) and
    ends; raises ValueError if one runs past the section or bytes follow the last one."""
    position = 0
    for _ in range(records_count):
        length, position = _read_varint(data, position)
        end = position + length
        if length < 0 or end > len(data):
            raise ValueError(f"record of {length} bytes at {position} runs past the records")
        yield position, end
        position = end
    if position != len(data):
        raise ValueError(f"{len(data) - position} bytes follow the last of {records_count} records")


def records_section(batch: bytes | bytearray | memoryview, header: RecordBatchHeader) -> bytes:
    """The batch's records, decompressed: what follows the 61-byte header of an uncompressed batch."""
    data = bytes(batch[RECORD_BATCH_OVERHEAD : header.size_in_bytes])
    codec = header.compression_type
    return data if codec == CompressionType.NONE else _DECODERS[codec](data)


def decode_raw_records(batch: bytes | bytearray | memoryview, header: RecordBatchHeader) -> list[RawRecord]:
    """The records of `batch` (exactly the batch `header` describes), without checking the CRC; raises
    InvalidRecordError if they do not parse or do not decompress."""
    try:
        data = records_section(batch, header)
        records = []
        base_timestamp = header.base_timestamp
        for position, end in _record_spans(data, header.records_count):
            # attributes (int8, unused) precede the timestamp delta
            timestamp_delta, cursor = _read_varint(data, position + 1)
            offset_delta, cursor = _read_varint(data, cursor)
            key, cursor = _read_bytes(data, cursor)
            value, cursor = _read_bytes(data, cursor)
            if _skip_headers(data, cursor) != end:
                raise ValueError(f"record at {position - 1} does not end where its length says")
            records.append(RawRecord(offset_delta, base_timestamp + timestamp_delta, key, value, data[cursor:end]))
        return records
    except Exception as e:
        # A truncated varint (IndexError), a bad length (ValueError) or a stream that does not decompress
        # (each codec library has its own exception type): all mean the stored batch is corrupt.
        raise InvalidRecordError(f"batch at offset {header.base_offset} has undecodable records: {e!r}") from e


def encode_raw_batch(
    template: RecordBatchHeader,
    records: Sequence[RawRecord],
    *,
    delete_horizon_ms: int | None,
) -> bytes:
    """Rebuild a batch from `template` (the original header) with only `records`, as Kafka's cleaner does
    (MemoryRecords.buildRetainedRecordsInto): base offset, lastOffsetDelta, producer id/epoch, base sequence,
    partition leader epoch, timestamp type, transactional/control bits and the codec (at its default level)
    are kept; every record keeps its offset delta, timestamp and headers and gets attributes 0. baseTimestamp
    is the delete horizon when one is given (with the delete-horizon attribute bit), else the first record's
    timestamp; maxTimestamp is the records' largest (the original for LogAppendTime). No records gives Kafka's
    empty batch (DefaultRecordBatch.writeEmptyHeader): uncompressed, baseTimestamp -1, the original
    maxTimestamp."""
    attributes = template.attributes & ~(DELETE_HORIZON_FLAG_MASK | COMPRESSION_CODEC_MASK)
    compression = Compression(template.compression_type if records else CompressionType.NONE)
    if not records:
        base_timestamp, max_timestamp = NO_TIMESTAMP, template.max_timestamp
    else:
        if delete_horizon_ms is not None:
            base_timestamp = delete_horizon_ms
            attributes |= DELETE_HORIZON_FLAG_MASK
        else:
            base_timestamp = records[0].timestamp
        if template.timestamp_type == TimestampType.LOG_APPEND_TIME:
            max_timestamp = template.max_timestamp
        else:
            max_timestamp = max(record.timestamp for record in records)
    body = bytearray()
    for record in records:
        encoded = bytearray(b"\x00")  # record attributes: unused, always 0
        _write_varint(encoded, record.timestamp - base_timestamp)
        _write_varint(encoded, record.offset_delta)
        for field in (record.key, record.value):
            if field is None:
                _write_varint(encoded, -1)
            else:
                _write_varint(encoded, len(field))
                encoded += field
        encoded += record.headers
        _write_varint(body, len(encoded))
        body += encoded
    return _pack_batch(template, attributes, base_timestamp, max_timestamp, len(records), bytes(body), compression)


def _pack_batch(
    template: RecordBatchHeader,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    records_count: int,
    body: bytes,
    compression: Compression,
) -> bytes:
    """A batch of `body` (an uncompressed records section) with `template`'s offsets, epoch and producer
    fields, compressed with `compression`, and its CRC."""
    payload = body if compression.type == CompressionType.NONE else compress(body, compression)
    buffer = bytearray(RECORD_BATCH_OVERHEAD)
    _BATCH_HEADER.pack_into(
        buffer,
        0,
        template.base_offset,
        RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload),
        template.partition_leader_epoch,
        CURRENT_MAGIC,
        0,
        attributes | compression.type,
        template.last_offset_delta,
        base_timestamp,
        max_timestamp,
        template.producer_id,
        template.producer_epoch,
        template.base_sequence,
        records_count,
    )
    buffer += payload
    crc = crc32c(buffer[ATTRIBUTES_OFFSET:])
    buffer[CRC_OFFSET : CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    result = bytes(buffer)
    # The header just written must read back as the one intended (field order is easy to get wrong).
    assert read_header(result).last_offset == template.last_offset
    return result


def recompress_batch(
    batch: bytes | bytearray | memoryview, header: RecordBatchHeader, compression: Compression
) -> bytes:
    """`batch` (exactly the batch `header` describes) rebuilt with `compression`, as Kafka's LogValidator
    rebuilds a produced batch whose codec is not its topic's compression.type (MemoryRecordsBuilder): the
    header's fields and every record's offset delta, timestamp, key, value and headers are kept; baseTimestamp
    becomes the first record's timestamp, maxTimestamp the records' largest (kept for LogAppendTime), record
    attributes 0, the delete-horizon bit goes, and the CRC is computed anew. Raises InvalidRecordError if the
    records do not parse or do not decompress.

    A Kafka client writes each record as that builder does, so its records section is normally reused byte for
    byte: the records are walked (and checked as `decode_raw_records` checks them) but not decoded."""
    try:
        body, base_timestamp, max_timestamp = _as_built(records_section(batch, header), header)
    except Exception as e:
        # As in decode_raw_records: a truncated varint, a bad length or a stream that does not decompress.
        raise InvalidRecordError(f"batch at offset {header.base_offset} has undecodable records: {e!r}") from e
    if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
        max_timestamp = header.max_timestamp
    attributes = header.attributes & ~(DELETE_HORIZON_FLAG_MASK | COMPRESSION_CODEC_MASK)
    return _pack_batch(header, attributes, base_timestamp, max_timestamp, header.records_count, body, compression)


def _as_built(data: bytes, header: RecordBatchHeader) -> tuple[bytes, int, int]:
    """The records section `data` as MemoryRecordsBuilder writes it (record attributes 0, timestamp deltas from
    the first record's timestamp), with that first timestamp (the batch's baseTimestamp) and the largest."""
    old_base = header.base_timestamp
    base_timestamp = max_timestamp = NO_TIMESTAMP
    as_built = True
    for index, (position, end) in enumerate(_record_spans(data, header.records_count)):
        timestamp_delta, cursor = _read_varint(data, position + 1)
        timestamp = old_base + timestamp_delta
        if index == 0:
            base_timestamp = timestamp
            as_built = timestamp_delta == 0
        as_built = as_built and data[position] == 0
        max_timestamp = max(max_timestamp, timestamp)
        _, cursor = _read_varint(data, cursor)  # offset delta
        for _field in range(2):  # key, value
            field_length, cursor = _read_varint(data, cursor)
            cursor += max(field_length, 0)
        if _skip_headers(data, cursor) != end:
            raise ValueError(f"record at {position - 1} does not end where its length says")
    if as_built:
        return data, base_timestamp, max_timestamp
    # Rewrite what differs: each record's attributes and timestamp delta; the rest of it is copied.
    rebuilt = bytearray()
    for position, end in _record_spans(data, header.records_count):
        timestamp_delta, cursor = _read_varint(data, position + 1)
        record = bytearray(b"\x00")
        _write_varint(record, old_base + timestamp_delta - base_timestamp)
        record += data[cursor:end]
        _write_varint(rebuilt, len(record))
        rebuilt += record
    return bytes(rebuilt), base_timestamp, max_timestamp
