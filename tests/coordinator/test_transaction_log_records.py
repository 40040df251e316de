"""__transaction_state keys and values byte for byte as Kafka's TransactionLogKey.json / TransactionLogValue.json define
them (v0, and the flexible v1 with its tagged fields), and the transactional id -> partition mapping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.records import (
    CorruptRecordError,
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from tierlog.coordinator.transaction.transaction_metadata import (
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
)


def s16(text: str) -> bytes:
    """STRING: int16 length, UTF-8."""
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def compact(text: str) -> bytes:
    """COMPACT_STRING: uvarint length + 1 (every test string is short)."""
    data = text.encode()
    return bytes([len(data) + 1]) + data


ONGOING = TransactionLogValue(
    producer_id=1334,
    producer_epoch=5,
    transaction_timeout_ms=60000,
    transaction_status=1,
    transaction_partitions=(("a", (0, 2)), ("b", (1,))),
    transaction_last_update_timestamp_ms=1_700_000_000_123,
    transaction_start_timestamp_ms=1_700_000_000_100,
)


def test_key_is_version_0_and_a_string() -> None:
    assert encode_key("my-txn") == b"\x00\x00" + s16("my-txn")
    assert decode_key(encode_key("my-txn")) == "my-txn"
    # Kafka skips keys of versions it does not know (testReadTxnRecordKeyCanReadUnknownMessage).
    assert decode_key(struct.pack(">h", 32767)) is None


def test_value_v0_field_by_field() -> None:
    expected = b"".join(
        [
            struct.pack(">h", 0),  # version
            struct.pack(">q", 1334),  # ProducerId
            struct.pack(">h", 5),  # ProducerEpoch
            struct.pack(">i", 60000),  # TransactionTimeoutMs
            struct.pack(">b", 1),  # TransactionStatus
            struct.pack(">i", 2),  # TransactionPartitions: 2 topics
            s16("a") + struct.pack(">iii", 2, 0, 2),  # Topic, PartitionIds
            s16("b") + struct.pack(">ii", 1, 1),
            struct.pack(">q", 1_700_000_000_123),  # TransactionLastUpdateTimestampMs
            struct.pack(">q", 1_700_000_000_100),  # TransactionStartTimestampMs
        ]
    )
    assert encode_value(ONGOING) == expected
    assert decode_value(expected) == ONGOING


def test_value_v1_field_by_field_with_no_tagged_fields_at_their_defaults() -> None:
    expected = b"".join(
        [
            struct.pack(">h", 1),
            struct.pack(">q", 1334),
            struct.pack(">h", 5),
            struct.pack(">i", 60000),
            struct.pack(">b", 1),
            bytes([3]),  # compact array: 2 topics + 1
            compact("a") + bytes([3]) + struct.pack(">ii", 0, 2) + b"\x00",  # ... and the struct's tagged fields
            compact("b") + bytes([2]) + struct.pack(">i", 1) + b"\x00",
            struct.pack(">q", 1_700_000_000_123),
            struct.pack(">q", 1_700_000_000_100),
            b"\x00",  # no tagged fields: PreviousProducerId, NextProducerId, ClientTransactionVersion at defaults
        ]
    )
    assert encode_value(ONGOING, version=1) == expected
    assert decode_value(expected) == ONGOING


def test_value_v1_tagged_fields_in_tag_order() -> None:
    value = TransactionLogValue(
        producer_id=7,
        producer_epoch=0,
        transaction_timeout_ms=1000,
        transaction_status=4,
        transaction_partitions=(),
        transaction_last_update_timestamp_ms=2,
        transaction_start_timestamp_ms=1,
        previous_producer_id=6,
        next_producer_id=8,
        client_transaction_version=2,
    )
    expected = b"".join(
        [
            struct.pack(">hqhib", 1, 7, 0, 1000, 4),
            bytes([1]),  # an empty (not null) compact array
            struct.pack(">qq", 2, 1),
            bytes([3]),
            bytes([0, 8]) + struct.pack(">q", 6),  # tag 0 PreviousProducerId, size 8
            bytes([1, 8]) + struct.pack(">q", 8),  # tag 1 NextProducerId
            bytes([2, 2]) + struct.pack(">h", 2),  # tag 2 ClientTransactionVersion, int16
        ]
    )
    assert encode_value(value, version=1) == expected
    assert decode_value(expected) == value
    # v0 has no tagged fields: they are not written.
    assert decode_value(encode_value(value, version=0)) == TransactionLogValue(7, 0, 1000, 4, (), 2, 1)


def test_empty_has_a_null_partition_array() -> None:
    value = TransactionLogValue(9, 0, 1000, 0, None, 5, -1)
    # After version (2), ProducerId (8), ProducerEpoch (2), TransactionTimeoutMs (4), TransactionStatus (1).
    assert encode_value(value)[17:21] == struct.pack(">i", -1)
    assert encode_value(value, version=1)[17:18] == b"\x00"
    assert decode_value(encode_value(value)) == value
    assert decode_value(encode_value(value, version=1)) == value


# Two tagged fields: 100, a STRING (int16 length) "foo"; 101, an INT32 4000.
FUTURE_TAGS = bytes([2, 100, 5]) + s16("foo") + bytes([101, 4]) + struct.pack(">i", 4000)


def test_unknown_tagged_fields_are_skipped() -> None:
    """Kafka's testDeserializeFutureTransactionLogValue: a future writer's extra tags in the partition struct and the
    value (100: a string, 101: an int32) are read past."""
    data = b"".join(
        [
            struct.pack(">hqhib", 1, 1000, 100, 1000, 4),
            bytes([2]),
            compact("topic") + bytes([2]) + struct.pack(">i", 1),
            FUTURE_TAGS,
            struct.pack(">qq", 2000, 3000),
            FUTURE_TAGS,
        ]
    )
    assert decode_value(data) == TransactionLogValue(1000, 100, 1000, 4, (("topic", (1,)),), 2000, 3000)


def test_unknown_value_version_and_truncation_are_corrupt() -> None:
    with pytest.raises(CorruptRecordError):
        decode_value(struct.pack(">h", 2) + encode_value(ONGOING)[2:])
    with pytest.raises(CorruptRecordError):
        decode_value(encode_value(ONGOING)[:-1])
    with pytest.raises(ValueError):
        encode_value(ONGOING, version=2)


def test_metadata_round_trips_through_the_log_value() -> None:
    """Kafka's shouldReadWriteMessages: every state but Empty keeps its partitions; the last epoch is not stored."""
    partitions = frozenset(TopicPartition(t, p) for t, p in [("topic1", 0), ("topic1", 1), ("topic2", 2)])
    never_written = (TransactionState.DEAD, TransactionState.PREPARE_EPOCH_FENCE)
    for state in [s for s in TransactionState if s not in never_written]:
        transit = TxnTransitMetadata(
            producer_id=23423,
            previous_producer_id=-1,
            producer_epoch=3,
            last_producer_epoch=2,
            txn_timeout_ms=1000,
            txn_state=state,
            topic_partitions=frozenset() if state is TransactionState.EMPTY else partitions,
            txn_start_timestamp=-1 if state is TransactionState.EMPTY else 10,
            txn_last_update_timestamp=20,
        )
        for version in (0, 1):
            value = decode_value(encode_value(transit.to_log_value(), version))
            loaded = TransactionMetadata.from_log_value("id", value)
            assert (loaded.producer_id, loaded.producer_epoch, loaded.last_producer_epoch) == (23423, 3, -1)
            assert (loaded.state, loaded.txn_timeout_ms, loaded.topic_partitions) == (
                state,
                1000,
                set(transit.topic_partitions),
            )
            assert (loaded.txn_start_timestamp, loaded.txn_last_update_timestamp) == (transit.txn_start_timestamp, 20)


def test_state_ids_and_names_are_kafkas() -> None:
    assert [(s.id, s.state_name) for s in TransactionState] == [
        (0, "Empty"),
        (1, "Ongoing"),
        (2, "PrepareCommit"),
        (3, "PrepareAbort"),
        (4, "CompleteCommit"),
        (5, "CompleteAbort"),
        (6, "Dead"),
        (7, "PrepareEpochFence"),
    ]


def test_partition_for_is_java_hash_code_abs_mod() -> None:
    # "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE, which Kafka's Utils.abs
    # maps to 0 (Math.abs would keep it negative).
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("", 50) == 0
    # A negative hash takes Math.abs, not the low 31 bits: Kafka puts "my-txn" (hashCode -1061187895) in 45.
    assert partition_for("my-txn", 50) == 45


# TransactionLogValue.json's fields, as in Kafka (transaction-coordinator/src/main/resources/common/message/), and a
# writer that follows Kafka's message generator from them: the fields a version has, in order (int16/int32 lengths,
# -1 for null, before flexible versions; compact uvarint length + 1, 0 for null, in them, with each struct's tagged
# fields after its fields, written in tag order only when they differ from their default).
TRANSACTION_LOG_VALUE_JSON = {
    "validVersions": "0-1",
    "flexibleVersions": "1+",
    "fields": [
        {"name": "ProducerId", "type": "int64", "versions": "0+"},
        {"name": "PreviousProducerId", "type": "int64", "taggedVersions": "1+", "tag": 0, "default": -1},
        {"name": "NextProducerId", "type": "int64", "taggedVersions": "1+", "tag": 1, "default": -1},
        {"name": "ProducerEpoch", "type": "int16", "versions": "0+"},
        {"name": "TransactionTimeoutMs", "type": "int32", "versions": "0+"},
        {"name": "TransactionStatus", "type": "int8", "versions": "0+"},
        {
            "name": "TransactionPartitions",
            "type": "[]PartitionsSchema",
            "versions": "0+",
            "nullableVersions": "0+",
            "fields": [
                {"name": "Topic", "type": "string", "versions": "0+"},
                {"name": "PartitionIds", "type": "[]int32", "versions": "0+"},
            ],
        },
        {"name": "TransactionLastUpdateTimestampMs", "type": "int64", "versions": "0+"},
        {"name": "TransactionStartTimestampMs", "type": "int64", "versions": "0+"},
        {"name": "ClientTransactionVersion", "type": "int16", "default": 0, "taggedVersions": "1+", "tag": 2},
    ],
}
INTS = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q"}


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def generated_write(fields: list[dict], data: dict, version: int, flexible: bool) -> bytes:
    def scalar(ftype: str, value: object) -> bytes:
        if ftype in INTS:
            return struct.pack(INTS[ftype], value)
        assert ftype == "string"
        raw = str(value).encode()
        return (uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw

    def array_length(n: int | None) -> bytes:
        if flexible:
            return uvarint(0 if n is None else n + 1)
        return struct.pack(">i", -1 if n is None else n)

    out = b""
    tagged = []
    for f in fields:
        value = data[f["name"]]
        if "taggedVersions" in f:
            if flexible and value != f["default"]:
                tagged.append((f["tag"], scalar(f["type"], value)))
            continue
        assert f["versions"] == "0+"
        ftype = f["type"]
        if ftype.startswith("[]"):
            out += array_length(None if value is None else len(value))
            for item in value or ():
                if "fields" in f:
                    out += generated_write(f["fields"], item, version, flexible)
                else:
                    out += scalar(ftype[2:], item)
        else:
            out += scalar(ftype, value)
    if flexible:
        out += uvarint(len(tagged)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in sorted(tagged))
    return out


@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-128, 127),
    st.none()
    | st.lists(st.tuples(st.text(max_size=300), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=200)), max_size=3),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-1, 0, 5, 2**40]),
    st.sampled_from([-1, 0, 7]),
    st.sampled_from([0, 1, 2]),
    st.sampled_from([0, 1]),
)
def test_value_bytes_are_what_kafkas_generator_writes_from_the_json(  # type: ignore[no-untyped-def]
    pid, epoch, timeout, status, parts, last, start, prev, nxt, ctv, version
) -> None:
    partitions = None if parts is None else tuple((topic, tuple(ids)) for topic, ids in parts)
    value = TransactionLogValue(pid, epoch, timeout, status, partitions, last, start, prev, nxt, ctv)
    data = {
        "ProducerId": pid,
        "PreviousProducerId": prev,
        "NextProducerId": nxt,
        "ProducerEpoch": epoch,
        "TransactionTimeoutMs": timeout,
        "TransactionStatus": status,
        "TransactionPartitions": None
        if partitions is None
        else [{"Topic": topic, "PartitionIds": list(ids)} for topic, ids in partitions],
        "TransactionLastUpdateTimestampMs": last,
        "TransactionStartTimestampMs": start,
        "ClientTransactionVersion": ctv,
    }
    expected = struct.pack(">h", version) + generated_write(
        TRANSACTION_LOG_VALUE_JSON["fields"], data, version, flexible=version >= 1
    )
    assert encode_value(value, version) == expected
    # v0 has no tagged fields: they read back as their defaults.
    untagged = TransactionLogValue(pid, epoch, timeout, status, partitions, last, start)
    assert decode_value(expected) == (value if version == 1 else untagged)
