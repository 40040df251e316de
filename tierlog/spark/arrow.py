"""Kafka record batches to Arrow, in the column layout of Spark's Kafka source.

A Python data source's read() may yield pyarrow RecordBatches; Spark then takes the columns as they are,
so the batch must carry exactly the declared schema (names, order, types). The layout is that of
KafkaRecordToRowConverter: key, value, topic, partition, offset, timestamp, timestampType, then headers
only when includeHeaders is set.

The records are decoded by compiled loops (tierlog.spark.record_kernels) straight into numpy arrays that
become the Arrow buffers: no Python object is made per record, and per batch only for compressed ones (their
records section is decompressed by the project's codecs, tierlog.records.codec).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from tierlog.records.codec import decode_raw_records, records_section
from tierlog.records.control_batch import ControlRecordType, control_record_type
from tierlog.records.record_batch import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    NO_PRODUCER_ID,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    InvalidRecordError,
    read_header,
)


class AbortedTransaction(Protocol):
    """An entry of a read_committed Fetch answer's aborted_transactions (kio's, or the remote tier's)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...


# Spark's TimestampType travels through Arrow as microseconds in UTC.
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_HEADER_FIELDS = [pa.field("key", pa.string()), pa.field("value", pa.binary())]
HEADERS_TYPE = pa.list_(pa.struct(_HEADER_FIELDS))

_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
]

# The 61-byte batch header (record_batch's layout), to read the fields of every batch of a buffer at once.
_HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
assert _HEADER_DTYPE.itemsize == RECORD_BATCH_OVERHEAD
_HEADER_BYTES = np.arange(RECORD_BATCH_OVERHEAD)
# Arrow's binary and string columns have int32 offsets.
_MAX_COLUMN_BYTES = 2**31 - 1


def schema(include_headers: bool) -> pa.Schema:
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    return pa.schema(fields)


def spark_ddl(include_headers: bool) -> str:
    """The same schema as a Spark DDL string, for DataSource.schema()."""
    ddl = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int"
    if include_headers:
        ddl += ", headers array<struct<key: string, value: binary>>"
    return ddl


def record_batches_to_arrow(
    data: bytes | memoryview,
    topic: str,
    partition: int,
    start_offset: int,
    end_offset: int,
    include_headers: bool,
    aborted_transactions: Sequence[AbortedTransaction] | None = None,
) -> pa.RecordBatch:
    """The records of the v2 batches in `data` whose offsets are in [start_offset, end_offset).

    `data` is what a Fetch response or a segment file holds: whole batches, possibly followed by a
    truncated one (ignored, as a consumer does). Control batches (transaction markers) are not records to
    a reader and are skipped, as Kafka consumers skip them. `aborted_transactions` (read_committed only; None
    reads uncommitted) are the aborted transactions a read_committed Fetch answers for this data: their
    batches are dropped as Kafka's consumer drops them (`committed_batches`). Raises InvalidRecordError, naming
    the batch, if the records of a batch in the range do not decompress or do not parse.
    """
    # numba takes a third of a second to import: only the processes that convert records (Spark's readers)
    # pay for it, not the driver that plans the query, nor a writer.
    from tierlog.spark import record_kernels

    buffer = np.frombuffer(data, np.uint8)
    # Read-only whatever `data` is (bytes, a bytearray's memoryview): numba compiles, and caches, one version
    # of each kernel per array type, and a writable one would cost a second compile.
    buffer.flags.writeable = False
    positions, sizes = record_kernels.batch_spans(buffer)
    if len(sizes) and sizes[-1] < RECORD_BATCH_OVERHEAD:
        raise InvalidRecordError(f"batch at {positions[-1]} declares size {sizes[-1]}, less than its header")
    headers = buffer[positions[:, np.newaxis] + _HEADER_BYTES].view(_HEADER_DTYPE)[:, 0]
    base_offsets = headers["base_offset"].astype(np.int64)
    next_offsets = base_offsets + headers["last_offset_delta"] + 1
    # Whole batches outside the range are not decompressed: a fetch starts at the batch holding the
    # requested offset and a segment spans far more than one split's range.
    visible = committed_batches(data, positions, headers, aborted_transactions)
    wanted = np.flatnonzero(visible & (next_offsets > start_offset) & (base_offsets < end_offset))
    positions, sizes, headers = positions[wanted], sizes[wanted], headers[wanted]
    if np.any(headers["attributes"] & COMPRESSION_CODEC_MASK):
        records, section_starts, section_ends = _decompressed(memoryview(data), positions, sizes)
    else:
        # Uncompressed records are read where they are.
        records, section_starts, section_ends = buffer, positions + RECORD_BATCH_OVERHEAD, positions + sizes
    columns = _decode(records, section_starts, section_ends, headers, start_offset, end_offset, include_headers)
    rows = len(columns[0])
    columns[2:2] = [pa.repeat(pa.scalar(topic, pa.string()), rows), pa.repeat(pa.scalar(partition, pa.int32()), rows)]
    return pa.RecordBatch.from_arrays(columns, schema=schema(include_headers))


def committed_batches(
    data: bytes | memoryview,
    positions: np.ndarray,
    headers: np.ndarray,
    aborted_transactions: Sequence[AbortedTransaction] | None,
) -> np.ndarray:
    """Which batches hold records a reader sees: never a control batch; with read_committed
    (`aborted_transactions` not None), not a transactional batch of an aborted transaction either.

    Kafka's consumer (CompletedFetch.nextFetchedRecord), batch by batch in offset order: every aborted
    transaction whose first offset is at or below the last offset of a batch with a producer id makes that
    producer "aborted"; its transactional batches are then dropped until its ABORT marker, which ends the
    aborted transaction (docs/transactions.md#spark-source)."""
    attributes = headers["attributes"]
    visible = attributes & CONTROL_FLAG_MASK == 0
    if not aborted_transactions:
        return visible
    pending = sorted(aborted_transactions, key=lambda txn: txn.first_offset)
    next_pending = 0
    aborted_producers: set[int] = set()
    producer_ids = headers["producer_id"]
    last_offsets = headers["base_offset"].astype(np.int64) + headers["last_offset_delta"]
    view = memoryview(data)
    for index in np.flatnonzero(producer_ids != NO_PRODUCER_ID).tolist():
        last_offset = int(last_offsets[index])
        while next_pending < len(pending) and pending[next_pending].first_offset <= last_offset:
            aborted_producers.add(pending[next_pending].producer_id)
            next_pending += 1
        producer_id = int(producer_ids[index])
        if not visible[index]:
            if _is_abort_marker(view, int(positions[index])):
                aborted_producers.discard(producer_id)
        elif attributes[index] & TRANSACTIONAL_FLAG_MASK and producer_id in aborted_producers:
            visible[index] = False
    return visible


def _is_abort_marker(data: memoryview, position: int) -> bool:
    """Whether the control batch at `position` holds an ABORT marker (Kafka reads its first record's key)."""
    header = read_header(data, position)
    records = decode_raw_records(data[position : position + header.size_in_bytes], header)
    return bool(records) and control_record_type(records[0].key) == ControlRecordType.ABORT


def _decompressed(
    data: memoryview, positions: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records sections of the batches at `positions`, decompressed, one after the other in one buffer,
    with where each starts and ends in it."""
    sections = []
    for position, size in zip(positions.tolist(), sizes.tolist(), strict=True):
        header = read_header(data, position)
        try:
            sections.append(records_section(data[position : position + size], header))
        except Exception as e:
            # Each codec library raises its own types; to a reader all mean a corrupt batch.
            raise InvalidRecordError(f"batch at offset {header.base_offset} has undecodable records: {e!r}") from e
    ends = np.cumsum(np.fromiter(map(len, sections), np.int64, len(sections)))
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    return np.frombuffer(b"".join(sections), np.uint8), starts, ends


def _decode(
    records: np.ndarray,
    section_starts: np.ndarray,
    section_ends: np.ndarray,
    headers: np.ndarray,
    start_offset: int,
    end_offset: int,
    include_headers: bool,
) -> list[pa.Array]:
    """The key, value, offset, timestamp, timestampType (and headers) columns of the records in the sections."""
    from tierlog.spark import record_kernels

    section_lengths = section_ends - section_starts
    total_bytes = int(section_lengths.sum())
    if total_bytes > _MAX_COLUMN_BYTES:
        raise ValueError(f"{total_bytes} bytes of records in one Arrow batch; Arrow's binary columns hold 2 GiB")
    records_counts = headers["records_count"].astype(np.int64)
    # Room for every record and byte the sections can hold; numpy leaves the pages never written unallocated.
    capacity = int(np.minimum(np.maximum(records_counts, 0), section_lengths // record_kernels.MIN_RECORD_BYTES).sum())
    header_capacity = total_bytes // record_kernels.MIN_HEADER_BYTES if include_headers else 0
    header_bytes = total_bytes if include_headers else 0
    offsets = np.empty(capacity, np.int64)
    timestamps = np.empty(capacity, np.int64)
    timestamp_types = np.empty(capacity, np.int32)
    key_valid, key_offsets, key_data = _binary_buffers(capacity, total_bytes)
    value_valid, value_offsets, value_data = _binary_buffers(capacity, total_bytes)
    header_offsets = np.empty(capacity + 1, np.int32)
    _, header_key_offsets, header_key_data = _binary_buffers(header_capacity, header_bytes)
    header_value_valid, header_value_offsets, header_value_data = _binary_buffers(header_capacity, header_bytes)
    status, section, index, rows = record_kernels.decode_sections(
        records,
        section_starts,
        section_ends,
        headers["base_offset"].astype(np.int64),
        headers["base_timestamp"].astype(np.int64),
        headers["attributes"] & TIMESTAMP_TYPE_MASK != 0,
        headers["max_timestamp"].astype(np.int64),
        records_counts,
        start_offset,
        end_offset,
        include_headers,
        offsets,
        timestamps,
        timestamp_types,
        key_valid,
        key_offsets,
        key_data,
        value_valid,
        value_offsets,
        value_data,
        header_offsets,
        header_key_offsets,
        header_key_data,
        header_value_valid,
        header_value_offsets,
        header_value_data,
    )
    if status != record_kernels.OK:
        problem = record_kernels.PROBLEMS[status].format(index=index)
        raise InvalidRecordError(
            f"batch at offset {headers['base_offset'][section]} has undecodable records: {problem}"
        )
    # Milliseconds to Spark's microseconds in one vectorised step, in place (rows only: the pages past them
    # were never written, and stay unallocated).
    timestamps = timestamps[:rows]
    timestamps *= 1000
    columns = [
        _binary_array(pa.binary(), rows, key_valid, key_offsets, key_data),
        _binary_array(pa.binary(), rows, value_valid, value_offsets, value_data),
        pa.array(offsets[:rows], pa.int64()),
        pa.Array.from_buffers(TIMESTAMP_TYPE, rows, [None, pa.py_buffer(timestamps)]),
        pa.array(timestamp_types[:rows], pa.int32()),
    ]
    if include_headers:
        count = int(header_offsets[rows])
        keys = _binary_array(pa.string(), count, None, header_key_offsets, header_key_data)
        values = _binary_array(pa.binary(), count, header_value_valid, header_value_offsets, header_value_data)
        entries = pa.StructArray.from_arrays([keys, values], fields=_HEADER_FIELDS)
        list_offsets = pa.py_buffer(header_offsets[: rows + 1])
        columns.append(pa.Array.from_buffers(HEADERS_TYPE, rows, [None, list_offsets], children=[entries]))
    return columns


def _binary_buffers(capacity: int, data_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Valid flags, Arrow offsets and data for up to `capacity` values of `data_bytes` in all."""
    return np.empty(capacity, np.bool_), np.empty(capacity + 1, np.int32), np.empty(data_bytes, np.uint8)


def _validity(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap of `valid` (None when nothing is null) and the null count."""
    null_count = len(valid) - int(np.count_nonzero(valid))
    return (pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None), null_count


def _binary_array(
    type: pa.DataType, count: int, valid: np.ndarray | None, offsets: np.ndarray, data: np.ndarray
) -> pa.Array:
    """A binary or string array over the first `count` values of the kernel's buffers, without copying them."""
    bitmap, null_count = _validity(valid[:count]) if valid is not None else (None, 0)
    buffers = [bitmap, pa.py_buffer(offsets[: count + 1]), pa.py_buffer(data[: offsets[count]])]
    return pa.Array.from_buffers(type, count, buffers, null_count=null_count)
