"""The records of `__transaction_state`, byte for byte as Kafka writes them (docs/transactions.md#coordinator-records).

The key is TransactionLogKey: int16 version 0, then the transactional id as a string (int16 length). The value is
TransactionLogValue with its own int16 version: v0 (what Kafka writes while the transaction.version feature is 0) or
v1, the flexible version (compact strings and arrays, tagged fields) written from transaction.version 1 on. A null value
is a tombstone: the transactional id expired. Sources: transaction-coordinator/src/main/resources/common/message/
{TransactionLogKey,TransactionLogValue}.json and kafka.coordinator.transaction.TransactionLog.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tierlog.coordinator.group.records import (
    CorruptRecordError,
    RecordReader,
    RecordWriter,
    java_string_hash,
    kafka_abs,
)
from tierlog.records.record_batch import NO_PRODUCER_ID

TRANSACTION_LOG_KEY_VERSION = 0
# The value version Kafka writes for transaction.version 0 (the only non-flexible version) and the newest.
TRANSACTION_LOG_VALUE_VERSION = 0
FIRST_FLEXIBLE_VALUE_VERSION = 1
LATEST_VALUE_VERSION = 1

# The tags of TransactionLogValue's tagged fields (v1+), written only when they differ from their default, in tag order.
PREVIOUS_PRODUCER_ID_TAG = 0
NEXT_PRODUCER_ID_TAG = 1
CLIENT_TRANSACTION_VERSION_TAG = 2


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    """TransactionLogValue as stored. `transaction_partitions` is None for a transaction in state Empty (Kafka writes a
    null array then), else (topic, partition ids) pairs; `transaction_status` is the TransactionState id."""

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int
    transaction_partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    transaction_last_update_timestamp_ms: int
    transaction_start_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0


def encode_key(transactional_id: str) -> bytes:
    w = RecordWriter(flexible=False)
    w.int16(TRANSACTION_LOG_KEY_VERSION)
    w.string(transactional_id)
    return w.done()


def encode_value(value: TransactionLogValue, version: int = TRANSACTION_LOG_VALUE_VERSION) -> bytes:
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise ValueError(f"TransactionLogValue has no version {version}")
    w = RecordWriter(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    w.int16(version)
    w.int64(value.producer_id)
    w.int16(value.producer_epoch)
    w.int32(value.transaction_timeout_ms)
    w.int8(value.transaction_status)
    partitions = value.transaction_partitions
    w.array_length(None if partitions is None else len(partitions))
    for topic, partition_ids in partitions or ():
        w.string(topic)
        w.array_length(len(partition_ids))
        for partition in partition_ids:
            w.int32(partition)
        w.tagged_fields([])
    w.int64(value.transaction_last_update_timestamp_ms)
    w.int64(value.transaction_start_timestamp_ms)
    tagged: list[tuple[int, bytes]] = []
    if value.previous_producer_id != NO_PRODUCER_ID:
        tagged.append((PREVIOUS_PRODUCER_ID_TAG, struct.pack(">q", value.previous_producer_id)))
    if value.next_producer_id != NO_PRODUCER_ID:
        tagged.append((NEXT_PRODUCER_ID_TAG, struct.pack(">q", value.next_producer_id)))
    if value.client_transaction_version != 0:
        tagged.append((CLIENT_TRANSACTION_VERSION_TAG, struct.pack(">h", value.client_transaction_version)))
    w.tagged_fields(tagged)
    return w.done()


def decode_key(data: bytes) -> str | None:
    """The transactional id of a __transaction_state key; None for a key version this code does not know (Kafka
    skips those with a warning: leftovers of an aborted upgrade)."""
    r = RecordReader(data)
    if r.int16() != TRANSACTION_LOG_KEY_VERSION:
        return None
    return r.string()


def _tagged_int(fields: dict[int, bytes], tag: int, fmt: str, default: int) -> int:
    data = fields.get(tag)
    if data is None:
        return default
    if len(data) != struct.calcsize(fmt):
        raise CorruptRecordError(f"tagged field {tag} has {len(data)} bytes")
    return int(struct.unpack(fmt, data)[0])


def decode_value(data: bytes) -> TransactionLogValue:
    """Every version of TransactionLogValue; tagged fields this version does not know are skipped, as Kafka's."""
    r = RecordReader(data)
    version = r.int16()
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise CorruptRecordError(f"unknown TransactionLogValue version {version}")
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    producer_id = r.int64()
    producer_epoch = r.int16()
    timeout_ms = r.int32()
    status = r.int8()
    partitions: list[tuple[str, tuple[int, ...]]] | None = None
    count = r.nullable_array_length()
    if count is not None:
        partitions = []
        for _ in range(count):
            topic = r.string()
            n = r.array_length()
            partitions.append((topic, tuple(r.int32() for _ in range(n))))
            r.tagged_fields()
    last_update_ms = r.int64()
    start_ms = r.int64()
    tagged = r.tagged_fields()
    return TransactionLogValue(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transaction_timeout_ms=timeout_ms,
        transaction_status=status,
        transaction_partitions=None if partitions is None else tuple(partitions),
        transaction_last_update_timestamp_ms=last_update_ms,
        transaction_start_timestamp_ms=start_ms,
        previous_producer_id=_tagged_int(tagged, PREVIOUS_PRODUCER_ID_TAG, ">q", NO_PRODUCER_ID),
        next_producer_id=_tagged_int(tagged, NEXT_PRODUCER_ID_TAG, ">q", NO_PRODUCER_ID),
        client_transaction_version=_tagged_int(tagged, CLIENT_TRANSACTION_VERSION_TAG, ">h", 0),
    )


def partition_for(transactional_id: str, num_partitions: int) -> int:
    """The __transaction_state partition of a transactional id: Utils.abs(transactionalId.hashCode) % partitions,
    with Java's String.hashCode, as for groups."""
    return kafka_abs(java_string_hash(transactional_id)) % num_partitions
