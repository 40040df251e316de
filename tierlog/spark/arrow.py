"""Kafka record batches to Arrow, in the column layout of Spark's Kafka source.

A Python data source's read() may yield pyarrow RecordBatches; Spark then takes the columns as they are,
so the batch must carry exactly the declared schema (names, order, types). The layout is that of
KafkaRecordToRowConverter: key, value, topic, partition, offset, timestamp, timestampType, then headers
only when includeHeaders is set.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.record.default_records import DefaultRecordBatch

from tierlog.records.record_batch import InvalidRecordError, TimestampType, complete_batches, read_header

# Spark's TimestampType travels through Arrow as microseconds in UTC.
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
]


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
) -> pa.RecordBatch:
    """The records of the v2 batches in `data` whose offsets are in [start_offset, end_offset).

    `data` is what a Fetch response or a segment file holds: whole batches, possibly followed by a
    truncated one (ignored, as a consumer does). Control batches (transaction markers) are not records to
    a reader and are skipped, as Kafka consumers skip them.
    """
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    timestamps: list[int] = []  # milliseconds
    timestamp_types: list[int] = []
    headers: list[list[dict[str, str | bytes | None]]] = []
    view = memoryview(data)
    for position, size in complete_batches(view):
        header = read_header(view, position)
        batch = view[position : position + size]
        # Whole batches outside the range are not decompressed: a fetch starts at the batch holding the
        # requested offset and a segment spans far more than one split's range.
        if header.is_control or header.next_offset <= start_offset or header.base_offset >= end_offset:
            continue
        first = len(offsets)
        try:
            # aiokafka's C reader, its records used as they come: this loop runs once per row, so it builds
            # no object of its own per record.
            for record in DefaultRecordBatch(bytes(batch)):
                offset = record.offset
                if offset < start_offset or offset >= end_offset:
                    continue
                keys.append(record.key)
                values.append(record.value)
                offsets.append(offset)
                timestamps.append(record.timestamp)
                if include_headers:
                    headers.append([{"key": k, "value": v} for k, v in record.headers])
        except Exception as e:
            # The C reader and each codec raise their own types; to a reader all mean a corrupt batch.
            raise InvalidRecordError(f"batch at offset {header.base_offset} has undecodable records: {e!r}") from e
        taken = len(offsets) - first
        if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
            # The broker stamps the batch's max timestamp and leaves the records' deltas as the producer
            # wrote them; the batch's time is every record's time.
            timestamps[first:] = [header.max_timestamp] * taken
        timestamp_types.extend([int(header.timestamp_type)] * taken)
    count = len(offsets)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array(offsets, pa.int64()),
        # Milliseconds to Spark's microseconds in one vectorised step.
        pc.multiply(pa.array(timestamps, pa.int64()), 1000).cast(TIMESTAMP_TYPE),
        pa.array(timestamp_types, pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array(headers, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=schema(include_headers))
