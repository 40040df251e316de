"""Transaction markers are Kafka's EndTransactionMarker control batches (docs/transactions.md#markers)."""

import struct

import pytest

from tierlog.records.codec import build_batch, decode_raw_records
from tierlog.records.control_batch import (
    ControlRecordType,
    EndTxnMarker,
    build_end_txn_marker_batch,
    read_end_txn_marker,
)
from tierlog.records.record_batch import InvalidRecordError, read_header, validate_batch


@pytest.mark.parametrize("control_type", list(ControlRecordType))
def test_a_marker_batch_has_kafkas_layout_and_reads_back(control_type: ControlRecordType) -> None:
    batch = build_end_txn_marker_batch(4711, 3, EndTxnMarker(control_type, 17), 1_700_000_000_000)
    header = validate_batch(batch)
    assert (header.is_control, header.is_transactional) == (True, True)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4711, 3, -1)
    assert header.records_count == 1
    (record,) = decode_raw_records(batch, header)
    assert record.key == struct.pack(">hh", 0, control_type)
    assert record.value == struct.pack(">hi", 0, 17)
    assert read_end_txn_marker(batch) == EndTxnMarker(control_type, 17)


def test_a_batch_that_is_not_a_marker_is_refused() -> None:
    data = build_batch([(b"k", b"v", (), 0)], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
    assert read_header(data).is_transactional and not read_header(data).is_control
    with pytest.raises(InvalidRecordError, match="not a control batch"):
        read_end_txn_marker(data)
    other_control = build_batch([(struct.pack(">hh", 0, 7), b"", (), 0)], control=True)
    with pytest.raises(InvalidRecordError, match="not an end-transaction marker"):
        read_end_txn_marker(other_control)
