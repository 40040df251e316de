"""The compiled Arrow converter gives exactly the table that decoding each record with aiokafka's reader gives.

The oracle below is the converter as it was before it was compiled: aiokafka's DefaultRecordBatch per batch,
one record object per row. It exists only here, to check the new decoder against.
"""

from __future__ import annotations

import datetime
import struct
import subprocess
import sys

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given, settings
from hypothesis import strategies as st

from tierlog.records.codec import build_batch, encode_raw_batch
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    CompressionType,
    InvalidRecordError,
    TimestampType,
    complete_batches,
    read_header,
    set_log_append_time,
)
from tierlog.spark import record_kernels
from tierlog.spark.arrow import HEADERS_TYPE, TIMESTAMP_TYPE, record_batches_to_arrow, schema


def aiokafka_to_arrow(
    data: bytes, topic: str, partition: int, start_offset: int, end_offset: int, include_headers: bool
) -> pa.RecordBatch:
    keys, values, offsets, timestamps, timestamp_types, headers = [], [], [], [], [], []
    view = memoryview(data)
    for position, size in complete_batches(view):
        header = read_header(view, position)
        if header.is_control or header.next_offset <= start_offset or header.base_offset >= end_offset:
            continue
        first = len(offsets)
        try:
            for record in DefaultRecordBatch(bytes(view[position : position + size])):
                if not start_offset <= record.offset < end_offset:
                    continue
                keys.append(record.key)
                values.append(record.value)
                offsets.append(record.offset)
                timestamps.append(record.timestamp)
                headers.append([{"key": k, "value": v} for k, v in record.headers])
        except Exception as e:
            raise InvalidRecordError(f"batch at offset {header.base_offset} has undecodable records: {e!r}") from e
        taken = len(offsets) - first
        if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
            timestamps[first:] = [header.max_timestamp] * taken
        timestamp_types.extend([int(header.timestamp_type)] * taken)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * len(offsets), pa.string()),
        pa.array([partition] * len(offsets), pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array([None if t is None else t * 1000 for t in timestamps], pa.int64()).cast(TIMESTAMP_TYPE),
        pa.array(timestamp_types, pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array(headers, HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=schema(include_headers))


def _with_records_section(batch: bytes, section: bytes, records_count: int | None = None) -> bytes:
    """`batch` with its records section replaced by `section` (the length fixed, the CRC left stale: neither
    reader checks it)."""
    out = bytearray(batch[:RECORD_BATCH_OVERHEAD]) + section
    struct.pack_into(">i", out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    if records_count is not None:
        struct.pack_into(">i", out, RECORDS_COUNT_OFFSET, records_count)
    return bytes(out)


def _as_control(batch: bytes) -> bytes:
    out = bytearray(batch)
    attributes = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes | CONTROL_FLAG_MASK)
    return bytes(out)


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _record(body: bytes) -> bytes:
    return _varint(len(body)) + body


def _assert_same(data: bytes, start: int, end: int, include_headers: bool) -> None:
    expected = aiokafka_to_arrow(data, "topic", 3, start, end, include_headers)
    actual = record_batches_to_arrow(data, "topic", 3, start, end, include_headers)
    assert actual.schema == expected.schema
    actual.validate(full=True)
    assert actual.to_pylist() == expected.to_pylist()
    assert actual.equals(expected)


record_specs = st.tuples(
    st.none() | st.binary(max_size=12),
    st.none() | st.binary(max_size=40),
    st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=8)), max_size=3),
    # -1 is Kafka's NO_TIMESTAMP, which Spark's Kafka source shows as 1969-12-31 23:59:59.999 too.
    st.just(-1) | st.integers(0, 2**42),
)
batch_specs = st.tuples(
    st.lists(record_specs, min_size=1, max_size=8),
    st.sampled_from(list(CompressionType)),
    st.sampled_from(["plain", "log_append_time", "control", "emptied by the cleaner"]),
    st.integers(0, 3),  # offsets skipped before the batch (compaction, aborted transactions)
)


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(batch_specs, min_size=0, max_size=6),
    range_cut=st.tuples(st.integers(0, 60), st.integers(0, 60)),
    truncate_tail=st.integers(0, 200),
    include_headers=st.booleans(),
)
def test_the_same_table_as_aiokafkas_reader_for_any_batches_range_and_truncated_tail(
    batches: list, range_cut: tuple[int, int], truncate_tail: int, include_headers: bool
) -> None:
    data = b""
    offset = 0
    for records, codec, kind, gap in batches:
        offset += gap
        batch = build_batch(records, base_offset=offset, compression=codec)
        if kind == "log_append_time":
            batch = bytearray(batch)
            set_log_append_time(batch, 0, 1_800_000_000_000 + offset)
            batch = bytes(batch)
        elif kind == "control":
            batch = _as_control(batch)
        elif kind == "emptied by the cleaner":
            batch = encode_raw_batch(read_header(batch), [], delete_horizon_ms=None)
        data += batch
        offset += len(records)
    if truncate_tail and data:
        data = data[: -min(truncate_tail, len(data) - 1)]
    _assert_same(data, min(range_cut), max(range_cut), include_headers)


@pytest.mark.parametrize("codec", list(CompressionType))
def test_null_and_empty_keys_values_and_header_values_keep_their_difference(codec: CompressionType) -> None:
    records = [
        (None, None, [("h", None), ("", b"")], 5),
        (b"", b"", [("ключ", b"\x00")], 6),
        (b"k", None, [], 7),
        (None, b"v", [("h", b"x")], -1),
    ]
    data = build_batch(records, base_offset=10, compression=codec)
    _assert_same(data, 0, 100, include_headers=True)
    rows = record_batches_to_arrow(data, "t", 0, 0, 100, True).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(None, None), (b"", b""), (b"k", None), (None, b"v")]
    assert rows[0]["headers"] == [{"key": "h", "value": None}, {"key": "", "value": b""}]
    assert rows[3]["timestamp"] == datetime.datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=datetime.UTC)


def test_many_records_across_many_batches_of_mixed_codecs() -> None:
    data = b"".join(
        build_batch(
            [(f"k{i}".encode(), bytes(100), [], 1_700_000_000_000 + i) for i in range(b * 500, (b + 1) * 500)],
            base_offset=b * 500,
            compression=list(CompressionType)[b % 5],
        )
        for b in range(10)
    )
    _assert_same(data, 123, 4_567, include_headers=False)
    assert record_batches_to_arrow(data, "t", 0, 0, 5_000, False).num_rows == 5_000


def _one_record_batch(base_offset: int = 7) -> bytes:
    return build_batch([(b"key", b"value", [("h", b"v")], 1000)], base_offset=base_offset)


def _section(batch: bytes) -> bytes:
    return batch[RECORD_BATCH_OVERHEAD:]


# Each a batch at offset 7 whose records are corrupt in one way.
CORRUPT_BATCHES = {
    "a record cut short": _with_records_section(_one_record_batch(), _section(_one_record_batch())[:-3]),
    "bytes after the last record": _with_records_section(_one_record_batch(), _section(_one_record_batch()) + b"\0"),
    "more records counted than present": _with_records_section(
        _one_record_batch(), _section(_one_record_batch()), records_count=2
    ),
    "a record length longer than its fields": _with_records_section(
        _one_record_batch(), _record(_section(_one_record_batch())[1:] + b"\0")
    ),
    "a key longer than the records": _with_records_section(
        _one_record_batch(), _record(b"\0\0\0" + _varint(1000) + b"k")
    ),
    "a negative header count": _with_records_section(
        _one_record_batch(), _record(b"\0\0\0" + _varint(-1) + _varint(-1) + _varint(-1))
    ),
    "a header with a null key": _with_records_section(
        _one_record_batch(), _record(b"\0\0\0" + _varint(-1) + _varint(-1) + _varint(1) + _varint(-1) + _varint(-1))
    ),
    "a header key that is not UTF-8": _with_records_section(
        _one_record_batch(),
        _record(b"\0\0\0" + _varint(-1) + _varint(-1) + _varint(1) + _varint(2) + b"\xc3\x28" + _varint(-1)),
    ),
    "a varint longer than 10 bytes": _with_records_section(_one_record_batch(), b"\xff" * 11 + b"\0" * 8),
    "a compressed stream that does not decompress": _with_records_section(
        build_batch([(b"k", b"v", [], 1)], base_offset=7, compression=CompressionType.GZIP), b"not gzip at all"
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPT_BATCHES))
def test_a_corrupt_batch_in_the_range_is_an_invalid_record_error_naming_it(corruption: str) -> None:
    data = build_batch([(b"a", b"b", [], 1)], base_offset=6) + CORRUPT_BATCHES[corruption]
    with pytest.raises(InvalidRecordError, match=r"^batch at offset 7 has undecodable records: "):
        aiokafka_to_arrow(data, "t", 0, 0, 100, True)
    for include_headers in (False, True):
        with pytest.raises(InvalidRecordError, match=r"^batch at offset 7 has undecodable records: "):
            record_batches_to_arrow(data, "t", 0, 0, 100, include_headers)
    # Outside the range the batch is not decoded, by either.
    _assert_same(data, 6, 7, include_headers=True)


def test_a_batch_declaring_less_than_a_header_is_an_invalid_record_error() -> None:
    batch = bytearray(_one_record_batch(0))
    struct.pack_into(">i", batch, LENGTH_OFFSET, 20)
    with pytest.raises(InvalidRecordError, match=r"^batch at 0 declares size 32, less than its header$"):
        record_batches_to_arrow(bytes(batch), "t", 0, 0, 100, False)


def test_any_buffer_of_batches_is_read_as_bytes_are_by_one_compiled_version_of_each_kernel() -> None:
    data = build_batch([(b"k", b"v", [("h", b"x")], 5)], base_offset=3)
    expected = aiokafka_to_arrow(data, "t", 1, 0, 10, True)
    for wrap in (bytes, bytearray, lambda b: memoryview(bytearray(b))):
        assert record_batches_to_arrow(wrap(data), "t", 1, 0, 10, True).equals(expected)  # type: ignore[operator]
        compressed = build_batch([(b"k", b"v", [("h", b"x")], 5)], base_offset=3, compression=CompressionType.GZIP)
        assert record_batches_to_arrow(wrap(compressed), "t", 1, 0, 10, True).equals(expected)  # type: ignore[operator]
    # A second version (a writable array, say) would be compiled on a Spark worker's first batch: seconds.
    assert len(record_kernels.batch_spans.signatures) == 1
    assert len(record_kernels.decode_sections.signatures) == 1


def test_the_source_imports_numba_only_when_records_are_converted() -> None:
    # The driver plans queries and writers write: neither converts records, so neither pays numba's import.
    code = "import sys, tierlog.spark.source; print('numba' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert imported.stdout.strip() == "False", imported.stderr
