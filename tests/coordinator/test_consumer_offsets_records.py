"""__consumer_offsets keys and values byte for byte as Kafka's message JSON defines them, every version, and
the group -> partition mapping of Java's String.hashCode."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.coordinator.group.records import (
    CorruptRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hash,
    partition_for,
)


def s16(text: str | None) -> bytes:
    """A (nullable) STRING: int16 length, UTF-8."""
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def compact(text: str | None) -> bytes:
    """A (nullable) COMPACT_STRING of a flexible version: uvarint length + 1 (every test string is short)."""
    if text is None:
        return b"\x00"
    data = text.encode()
    return bytes([len(data) + 1]) + data


def test_offset_commit_key_is_version_1_group_topic_partition() -> None:
    key = OffsetCommitKey("g", "events", 3)
    expected = struct.pack(">h", 1) + s16("g") + s16("events") + struct.pack(">i", 3)
    assert encode_offset_commit_key(key) == expected
    assert decode_key(expected) == key
    # Version 0 has the same fields.
    assert decode_key(struct.pack(">h", 0) + expected[2:]) == key


def test_group_metadata_key_is_version_2_group() -> None:
    expected = struct.pack(">h", 2) + s16("my-group")
    assert encode_group_metadata_key(GroupMetadataKey("my-group")) == expected
    assert decode_key(expected) == GroupMetadataKey("my-group")


def test_keys_of_newer_group_types_are_skipped() -> None:
    assert decode_key(struct.pack(">h", 3) + s16("consumer-group-of-kip-848")) is None


OFFSET = OffsetAndMetadata(offset=42, leader_epoch=7, metadata="meta", commit_timestamp=1000, expire_timestamp=-1)


@pytest.mark.parametrize(
    ("version", "body", "decoded"),
    [
        (0, struct.pack(">q", 42) + s16("meta") + struct.pack(">q", 1000), OffsetAndMetadata(42, -1, "meta", 1000)),
        (
            1,
            struct.pack(">q", 42) + s16("meta") + struct.pack(">qq", 1000, 5000),
            OffsetAndMetadata(42, -1, "meta", 1000, 5000),
        ),
        (2, struct.pack(">q", 42) + s16("meta") + struct.pack(">q", 1000), OffsetAndMetadata(42, -1, "meta", 1000)),
        (3, struct.pack(">qi", 42, 7) + s16("meta") + struct.pack(">q", 1000), OFFSET),
        (4, struct.pack(">qi", 42, 7) + compact("meta") + struct.pack(">q", 1000) + b"\x00", OFFSET),
    ],
)
def test_offset_commit_value_every_version(version: int, body: bytes, decoded: OffsetAndMetadata) -> None:
    data = struct.pack(">h", version) + body
    assert decode_offset_commit_value(data) == decoded
    assert encode_offset_commit_value(decoded, version) == data


def test_offset_commit_value_is_written_as_v3_or_v1_with_an_expire_timestamp() -> None:
    assert encode_offset_commit_value(OFFSET)[:2] == struct.pack(">h", 3)
    expiring = OffsetAndMetadata(42, 7, "meta", 1000, 9000)
    assert encode_offset_commit_value(expiring)[:2] == struct.pack(">h", 1)


def test_offset_commit_value_v4_skips_unknown_tagged_fields() -> None:
    # One tagged field (tag 0, 16 bytes: e.g. a topic id a newer Kafka adds) after the known fields.
    data = struct.pack(">hqi", 4, 42, 7) + compact("meta") + struct.pack(">q", 1000) + b"\x01\x00\x10" + bytes(16)
    assert decode_offset_commit_value(data) == OFFSET


MEMBER = MemberMetadataValue("m-1", "inst", "client", "/10.0.0.1", 60000, 45000, b"sub", b"asg")


def member_bytes(version: int) -> bytes:
    if version == 4:
        return (
            compact("m-1")
            + compact("inst")
            + compact("client")
            + compact("/10.0.0.1")
            + struct.pack(">ii", 60000, 45000)
            + b"\x04sub\x04asg\x00"
        )
    parts = s16("m-1") + (s16("inst") if version >= 3 else b"") + s16("client") + s16("/10.0.0.1")
    parts += struct.pack(">i", 60000) if version >= 1 else b""
    return parts + struct.pack(">i", 45000) + struct.pack(">i", 3) + b"sub" + struct.pack(">i", 3) + b"asg"


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_group_metadata_value_every_version(version: int) -> None:
    if version == 4:
        head = compact("consumer") + struct.pack(">i", 5) + compact("range") + compact("m-1")
        data = struct.pack(">h", 4) + head + struct.pack(">q", 1234) + b"\x02" + member_bytes(4) + b"\x00"
    else:
        head = s16("consumer") + struct.pack(">i", 5) + s16("range") + s16("m-1")
        timestamp = struct.pack(">q", 1234) if version >= 2 else b""
        data = struct.pack(">h", version) + head + timestamp + struct.pack(">i", 1) + member_bytes(version)
    member = MemberMetadataValue(
        "m-1",
        "inst" if version >= 3 else None,
        "client",
        "/10.0.0.1",
        60000 if version >= 1 else 45000,
        45000,
        b"sub",
        b"asg",
    )
    value = GroupMetadataValue("consumer", 5, "range", "m-1", 1234 if version >= 2 else -1, (member,))
    assert decode_group_metadata_value(data) == value
    if version >= 1:
        assert encode_group_metadata_value(value, version) == data


def test_an_empty_group_has_null_protocol_and_leader() -> None:
    value = GroupMetadataValue("consumer", 3, None, None, 99, ())
    data = encode_group_metadata_value(value)
    assert data == struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 3) + s16(None) * 2 + struct.pack(
        ">qi", 99, 0
    )
    assert decode_group_metadata_value(data) == value


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", struct.pack(">h", 9) + bytes(20), struct.pack(">hq", 3, 1) + struct.pack(">h", 50) + b"short"],
)
def test_unreadable_values_raise_corrupt_record(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_offset_commit_value(data)


names = st.text(max_size=20)


@given(
    st.builds(
        OffsetAndMetadata,
        st.integers(-1, 2**63 - 1),
        st.integers(-1, 2**31 - 1),
        names,
        st.integers(-1, 2**62),
        st.one_of(st.just(-1), st.integers(0, 2**62)),
    )
)
def test_offset_commit_value_round_trips(value: OffsetAndMetadata) -> None:
    decoded = decode_offset_commit_value(encode_offset_commit_value(value))
    if value.expire_timestamp >= 0:
        # v1, the only version with an expire timestamp, has no leader epoch: Kafka loses it too.
        value = OffsetAndMetadata(value.offset, -1, value.metadata, value.commit_timestamp, value.expire_timestamp)
    assert decoded == value


@given(
    st.builds(
        GroupMetadataValue,
        names,
        st.integers(0, 2**31 - 1),
        st.one_of(st.none(), names),
        st.one_of(st.none(), names),
        st.integers(-1, 2**62),
        st.lists(
            st.builds(
                MemberMetadataValue,
                names,
                st.one_of(st.none(), names),
                names,
                names,
                st.integers(0, 2**31 - 1),
                st.integers(0, 2**31 - 1),
                st.binary(max_size=50),
                st.binary(max_size=50),
            ),
            max_size=4,
        ).map(tuple),
    ),
    st.sampled_from([3, 4]),
)
def test_group_metadata_value_round_trips(value: GroupMetadataValue, version: int) -> None:
    assert decode_group_metadata_value(encode_group_metadata_value(value, version)) == value


def test_java_string_hash_of_known_strings() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("é") == 233
    # Outside the BMP Java hashes the two UTF-16 surrogates: 0xD83D * 31 + 0xDE00.
    assert java_string_hash("😀") == 0xD83D * 31 + 0xDE00


def test_partition_for_takes_kafkas_utils_abs_of_the_hash() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: Math.abs would stay negative, Utils.abs gives 0.
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    # 31 * hash("consumer-group-10") + '0' wraps below zero: -2737012, whose absolute value picks the partition
    # (masking the sign bit instead would give 2144746636 % 50 = 36, not Kafka's 12).
    assert java_string_hash("consumer-group-100") == -2737012
    assert partition_for("consumer-group-100", 50) == 2737012 % 50 == 12
