"""Control batches: the COMMIT and ABORT markers that end a transaction in each partition it wrote.

Kafka's EndTransactionMarker, byte for byte (docs/transactions.md#markers): a batch with the transactional
and control attributes, the producer's id and epoch, base sequence -1 and one record whose
- key is the control record key: version int16 (0) | type int16 (0 = ABORT, 1 = COMMIT);
- value is version int16 (0) | coordinator epoch int32.
The coordinator epoch lets a partition refuse a marker from a coordinator older than the last one it heard
from about that producer (a zombie coordinator after a failover).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from tierlog.records.codec import build_batch, decode_raw_records
from tierlog.records.record_batch import InvalidRecordError, RecordBatchHeader, read_header

CONTROL_RECORD_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    control_type: ControlRecordType
    coordinator_epoch: int

    @property
    def committed(self) -> bool:
        return self.control_type == ControlRecordType.COMMIT


def build_end_txn_marker_batch(
    producer_id: int, producer_epoch: int, marker: EndTxnMarker, timestamp_ms: int
) -> bytearray:
    """A marker batch as the transaction coordinator has a partition leader append it (offsets and the
    partition leader epoch are stamped by the append)."""
    key = _KEY.pack(CONTROL_RECORD_KEY_VERSION, marker.control_type)
    value = _VALUE.pack(END_TXN_MARKER_VERSION, marker.coordinator_epoch)
    return bytearray(
        build_batch(
            [(key, value, (), timestamp_ms)],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            control=True,
            transactional=True,
        )
    )


def control_record_type(key: bytes | None) -> int:
    """The type of a control record from its key (Kafka's ControlRecordType.parseTypeId); unknown types are
    returned as they are, since a newer writer may add some (KIP-890's markers are still COMMIT/ABORT)."""
    if key is None or len(key) < _KEY.size:
        raise InvalidRecordError(f"control record key of {0 if key is None else len(key)} bytes")
    version, type_id = _KEY.unpack_from(key)
    if version < 0:
        raise InvalidRecordError(f"control record key version {version}")
    return type_id


def read_end_txn_marker(batch: bytes | bytearray | memoryview, header: RecordBatchHeader | None = None) -> EndTxnMarker:
    """The marker of a control batch holding a COMMIT or ABORT record; InvalidRecordError otherwise."""
    header = header or read_header(batch)
    if not header.is_control:
        raise InvalidRecordError(f"batch at offset {header.base_offset} is not a control batch")
    records = decode_raw_records(batch, header)
    if len(records) != 1:
        raise InvalidRecordError(f"control batch at offset {header.base_offset} has {len(records)} records")
    type_id = control_record_type(records[0].key)
    if type_id not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise InvalidRecordError(f"control batch at offset {header.base_offset} is not an end-transaction marker")
    value = records[0].value
    if value is None or len(value) < _VALUE.size:
        raise InvalidRecordError(f"end-transaction marker at offset {header.base_offset} has no coordinator epoch")
    version, coordinator_epoch = _VALUE.unpack_from(value)
    if version < 0:
        raise InvalidRecordError(f"end-transaction marker version {version}")
    return EndTxnMarker(ControlRecordType(type_id), coordinator_epoch)
