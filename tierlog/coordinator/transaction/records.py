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

from tierlog.coordinator.group.records import java_string_hash, kafka_abs
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


class CorruptRecordError(ValueError):
    """A __transaction_state key or value that does not parse as its version says."""


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


class _Writer:
    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.parts: list[bytes] = []

    def pack(self, fmt: str, v: int) -> None:
        self.parts.append(struct.pack(fmt, v))

    def uvarint(self, v: int) -> None:
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        self.parts.append(bytes(out))

    def string(self, v: str) -> None:
        data = v.encode()
        if self.flexible:
            self.uvarint(len(data) + 1)
        else:
            self.pack(">h", len(data))
        self.parts.append(data)

    def array_length(self, n: int | None) -> None:
        """int32 (-1 for null) before flexible versions; uvarint n+1 (0 for null) in them."""
        if self.flexible:
            self.uvarint(0 if n is None else n + 1)
        else:
            self.pack(">i", -1 if n is None else n)

    def tagged_fields(self, fields: list[tuple[int, bytes]]) -> None:
        if self.flexible:
            self.uvarint(len(fields))
            for tag, data in fields:
                self.uvarint(tag)
                self.uvarint(len(data))
                self.parts.append(data)

    def done(self) -> bytes:
        return b"".join(self.parts)


def encode_key(transactional_id: str) -> bytes:
    w = _Writer(flexible=False)
    w.pack(">h", TRANSACTION_LOG_KEY_VERSION)
    w.string(transactional_id)
    return w.done()


def encode_value(value: TransactionLogValue, version: int = TRANSACTION_LOG_VALUE_VERSION) -> bytes:
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise ValueError(f"TransactionLogValue has no version {version}")
    w = _Writer(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    w.pack(">h", version)
    w.pack(">q", value.producer_id)
    w.pack(">h", value.producer_epoch)
    w.pack(">i", value.transaction_timeout_ms)
    w.pack(">b", value.transaction_status)
    partitions = value.transaction_partitions
    w.array_length(None if partitions is None else len(partitions))
    for topic, partition_ids in partitions or ():
        w.string(topic)
        w.array_length(len(partition_ids))
        for partition in partition_ids:
            w.pack(">i", partition)
        w.tagged_fields([])
    w.pack(">q", value.transaction_last_update_timestamp_ms)
    w.pack(">q", value.transaction_start_timestamp_ms)
    tagged: list[tuple[int, bytes]] = []
    if value.previous_producer_id != NO_PRODUCER_ID:
        tagged.append((PREVIOUS_PRODUCER_ID_TAG, struct.pack(">q", value.previous_producer_id)))
    if value.next_producer_id != NO_PRODUCER_ID:
        tagged.append((NEXT_PRODUCER_ID_TAG, struct.pack(">q", value.next_producer_id)))
    if value.client_transaction_version != 0:
        tagged.append((CLIENT_TRANSACTION_VERSION_TAG, struct.pack(">h", value.client_transaction_version)))
    w.tagged_fields(tagged)
    return w.done()


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.flexible = False

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptRecordError(f"needs {n} bytes at position {self.pos} of a {len(self.data)}-byte record")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str) -> int:
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError("varint longer than 5 bytes")

    def string(self) -> str:
        n = self.uvarint() - 1 if self.flexible else self.unpack(">h")
        if n < 0:
            raise CorruptRecordError(f"null in a non-nullable string at position {self.pos}")
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as e:
            raise CorruptRecordError(f"string is not UTF-8: {e}") from None

    def array_length(self) -> int | None:
        n = self.uvarint() - 1 if self.flexible else self.unpack(">i")
        return None if n < 0 else n

    def tagged_fields(self) -> dict[int, bytes]:
        fields: dict[int, bytes] = {}
        if self.flexible:
            for _ in range(self.uvarint()):
                tag = self.uvarint()
                fields[tag] = bytes(self.take(self.uvarint()))
        return fields


def decode_key(data: bytes) -> str | None:
    """The transactional id of a __transaction_state key; None for a key version this code does not know (Kafka
    skips those with a warning: leftovers of an aborted upgrade)."""
    r = _Reader(data)
    if r.unpack(">h") != TRANSACTION_LOG_KEY_VERSION:
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
    r = _Reader(data)
    version = r.unpack(">h")
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise CorruptRecordError(f"unknown TransactionLogValue version {version}")
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    producer_id = r.unpack(">q")
    producer_epoch = r.unpack(">h")
    timeout_ms = r.unpack(">i")
    status = r.unpack(">b")
    partitions: list[tuple[str, tuple[int, ...]]] | None = None
    count = r.array_length()
    if count is not None:
        partitions = []
        for _ in range(count):
            topic = r.string()
            n = r.array_length()
            if n is None:
                raise CorruptRecordError("null in the non-nullable PartitionIds")
            partitions.append((topic, tuple(r.unpack(">i") for _ in range(n))))
            r.tagged_fields()
    last_update_ms = r.unpack(">q")
    start_ms = r.unpack(">q")
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
