"""Kafka record batches become Arrow batches in the Kafka source's layout (no Spark needed)."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from tierlog.records.codec import build_batch
from tierlog.records.record_batch import ATTRIBUTES_OFFSET, CONTROL_FLAG_MASK, CompressionType, set_log_append_time
from tierlog.spark.arrow import record_batches_to_arrow, schema


def _batch(base_offset: int, count: int, timestamp: int = 1_700_000_000_000, **kwargs: object) -> bytes:
    records = [
        (f"k{base_offset + i}".encode(), f"v{base_offset + i}".encode(), [("h", f"{i}".encode())], timestamp + i)
        for i in range(count)
    ]
    return build_batch(records, base_offset=base_offset, **kwargs)  # type: ignore[arg-type]


def test_columns_follow_the_kafka_source_layout_and_headers_only_when_asked() -> None:
    assert schema(False).names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert schema(True).names[-1] == "headers"
    assert schema(True).field("headers").type == pa.list_(
        pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    )


@pytest.mark.parametrize("codec", list(CompressionType))
def test_every_record_of_every_codec_is_decoded_with_its_offset_timestamp_and_headers(codec: CompressionType) -> None:
    data = _batch(0, 3, compression=codec) + _batch(3, 2, compression=codec)
    out = record_batches_to_arrow(data, "t", 4, 0, 5, include_headers=True)
    assert out.schema == schema(True)
    rows = out.to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["key"] for r in rows] == [b"k0", b"k1", b"k2", b"k3", b"k4"]
    assert [r["value"] for r in rows] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {4}
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [
        1_700_000_000_000,
        1_700_000_000_001,
        1_700_000_000_002,
        1_700_000_000_000,
        1_700_000_000_001,
    ]
    assert {r["timestampType"] for r in rows} == {0}
    assert rows[1]["headers"] == [{"key": "h", "value": b"1"}]


def test_only_offsets_in_the_half_open_range_are_kept() -> None:
    data = _batch(0, 4) + _batch(4, 4) + _batch(8, 4)
    out = record_batches_to_arrow(data, "t", 0, 2, 9, include_headers=False)
    assert out.column("offset").to_pylist() == [2, 3, 4, 5, 6, 7, 8]
    assert out.schema == schema(False)


def test_a_truncated_last_batch_is_ignored_as_a_consumer_ignores_it() -> None:
    data = _batch(0, 2) + _batch(2, 2)[:-5]
    assert record_batches_to_arrow(data, "t", 0, 0, 100, False).column("offset").to_pylist() == [0, 1]


def test_control_batches_are_not_records() -> None:
    marker = bytearray(_batch(2, 1))
    attributes = struct.unpack_from(">h", marker, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", marker, ATTRIBUTES_OFFSET, attributes | CONTROL_FLAG_MASK)
    data = _batch(0, 2) + bytes(marker) + _batch(3, 1)
    assert record_batches_to_arrow(data, "t", 0, 0, 10, False).column("offset").to_pylist() == [0, 1, 3]


def test_log_append_time_gives_every_record_the_brokers_time_and_type_1() -> None:
    batch = bytearray(_batch(0, 3, timestamp=1000))
    set_log_append_time(batch, 0, 1_800_000_000_000)
    out = record_batches_to_arrow(bytes(batch), "t", 0, 0, 3, False).to_pylist()
    assert {int(r["timestamp"].timestamp() * 1000) for r in out} == {1_800_000_000_000}
    assert {r["timestampType"] for r in out} == {1}


def test_no_records_in_range_gives_an_empty_batch_of_the_same_schema() -> None:
    out = record_batches_to_arrow(_batch(0, 3), "t", 0, 10, 20, True)
    assert out.num_rows == 0 and out.schema == schema(True)
