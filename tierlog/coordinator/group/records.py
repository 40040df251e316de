"""The records of `__consumer_offsets`, byte for byte as Kafka writes them.

Every key starts with an int16 version: 0 and 1 are OffsetCommitKey (group, topic, partition), 2 is
GroupMetadataKey (group); Kafka 4's new group types use 3 and up, which a classic coordinator skips. Values
start with their own int16 version; a null value is a tombstone. Every version of every value is read;
Kafka writes OffsetCommitValue v3 (v1 when the commit carries an explicit expire timestamp) and
GroupMetadataValue v3, and so do we. Sources: group-coordinator/src/main/resources/common/message/
{OffsetCommitKey,OffsetCommitValue,GroupMetadataKey,GroupMetadataValue}.json.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRE = 1
GROUP_METADATA_VALUE_VERSION = 3
# The first flexible (KIP-482: compact strings, tagged fields) version of both values, and their newest.
FIRST_FLEXIBLE_VALUE_VERSION = 4
LATEST_VALUE_VERSION = 4


class CorruptRecordError(ValueError):
    """A __consumer_offsets key or value that does not parse as its version says."""


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """Kafka's OffsetAndMetadata as stored: `expire_timestamp` is -1 unless the commit set a retention."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadataValue, ...] = field(default=())


# Writing


class RecordWriter:
    """Kafka's generated-message encoding of coordinator records (__consumer_offsets, __transaction_state)."""

    def __init__(self, flexible: bool) -> None:
        self.parts: list[bytes] = []
        self.flexible = flexible

    def int8(self, v: int) -> None:
        self.parts.append(struct.pack(">b", v))

    def int16(self, v: int) -> None:
        self.parts.append(struct.pack(">h", v))

    def int32(self, v: int) -> None:
        self.parts.append(struct.pack(">i", v))

    def int64(self, v: int) -> None:
        self.parts.append(struct.pack(">q", v))

    def uvarint(self, v: int) -> None:
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        self.parts.append(bytes(out))

    def length(self, n: int | None) -> None:
        """A string/array length: int16/int32 (-1 for null) in old versions, uvarint n+1 (0 for null) in flexible."""
        if self.flexible:
            self.uvarint(0 if n is None else n + 1)
        else:
            self.int16(-1 if n is None else n)

    def string(self, v: str | None) -> None:
        if v is None:
            self.length(None)
            return
        data = v.encode()
        self.length(len(data))
        self.parts.append(data)

    def bytes_(self, v: bytes) -> None:
        if self.flexible:
            self.uvarint(len(v) + 1)
        else:
            self.int32(len(v))
        self.parts.append(v)

    def array_length(self, n: int | None) -> None:
        """int32 (-1 for null) before flexible versions; uvarint n+1 (0 for null) in them."""
        if self.flexible:
            self.uvarint(0 if n is None else n + 1)
        else:
            self.int32(-1 if n is None else n)

    def no_tagged_fields(self) -> None:
        self.tagged_fields([])

    def tagged_fields(self, fields: list[tuple[int, bytes]]) -> None:
        if self.flexible:
            self.uvarint(len(fields))
            for tag, data in fields:
                self.uvarint(tag)
                self.uvarint(len(data))
                self.parts.append(data)

    def done(self) -> bytes:
        return b"".join(self.parts)


def encode_offset_commit_key(key: OffsetCommitKey) -> bytes:
    w = RecordWriter(flexible=False)
    w.int16(OFFSET_COMMIT_KEY_VERSION)
    w.string(key.group)
    w.string(key.topic)
    w.int32(key.partition)
    return w.done()


def encode_group_metadata_key(key: GroupMetadataKey) -> bytes:
    w = RecordWriter(flexible=False)
    w.int16(GROUP_METADATA_KEY_VERSION)
    w.string(key.group)
    return w.done()


def offset_commit_value_version(value: OffsetAndMetadata) -> int:
    """Kafka's choice: v1, the only version with an expire timestamp, when the commit has one; else v3."""
    return OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRE if value.expire_timestamp >= 0 else OFFSET_COMMIT_VALUE_VERSION


def _value_writer(name: str, version: int) -> RecordWriter:
    """A writer of value `name` in `version`, which it has written first."""
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise ValueError(f"{name} has no version {version}")
    w = RecordWriter(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    w.int16(version)
    return w


def encode_offset_commit_value(value: OffsetAndMetadata, version: int | None = None) -> bytes:
    version = offset_commit_value_version(value) if version is None else version
    w = _value_writer("OffsetCommitValue", version)
    w.int64(value.offset)
    if version >= 3:
        w.int32(value.leader_epoch)
    w.string(value.metadata)
    w.int64(value.commit_timestamp)
    if version == 1:
        w.int64(value.expire_timestamp)
    w.no_tagged_fields()
    return w.done()


def encode_group_metadata_value(value: GroupMetadataValue, version: int = GROUP_METADATA_VALUE_VERSION) -> bytes:
    w = _value_writer("GroupMetadataValue", version)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    if version >= 2:
        w.int64(value.current_state_timestamp)
    w.array_length(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        if version >= 3:
            w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        if version >= 1:
            w.int32(m.rebalance_timeout)
        w.int32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
        w.no_tagged_fields()
    w.no_tagged_fields()
    return w.done()


# Reading


class RecordReader:
    """Reads what RecordWriter writes; every malformation is a CorruptRecordError."""

    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptRecordError(f"needs {n} bytes at position {self.pos} of a {len(self.data)}-byte record")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError("varint longer than 5 bytes")

    def nullable_string(self) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            return None
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError as e:
            raise CorruptRecordError(f"string is not UTF-8: {e}") from None

    def string(self) -> str:
        v = self.nullable_string()
        if v is None:
            raise CorruptRecordError(f"null in a non-nullable string at position {self.pos}")
        return v

    def bytes_(self) -> bytes:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise CorruptRecordError("null in a non-nullable bytes field")
        return bytes(self._take(n))

    def nullable_array_length(self) -> int | None:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        return None if n < 0 else n

    def array_length(self) -> int:
        n = self.nullable_array_length()
        if n is None:
            raise CorruptRecordError("null in a non-nullable array")
        return n

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged fields, by tag (none before flexible versions)."""
        fields: dict[int, bytes] = {}
        if self.flexible:
            for _ in range(self.uvarint()):
                tag = self.uvarint()
                fields[tag] = bytes(self._take(self.uvarint()))
        return fields

    def skip_tagged_fields(self) -> None:
        """Tagged fields unknown to this version of the code (Kafka adds fields only as tags since KIP-915)."""
        self.tagged_fields()


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key of a __consumer_offsets record; None for record types a classic coordinator does not know."""
    r = RecordReader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(r.string())
    return None


def _value_reader(name: str, data: bytes) -> tuple[RecordReader, int]:
    """A reader of value `name` past its version, which it returns."""
    r = RecordReader(data)
    version = r.int16()
    if not 0 <= version <= LATEST_VALUE_VERSION:
        raise CorruptRecordError(f"unknown {name} version {version}")
    r.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    return r, version


def decode_offset_commit_value(data: bytes) -> OffsetAndMetadata:
    r, version = _value_reader("OffsetCommitValue", data)
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else -1
    r.skip_tagged_fields()
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    r, version = _value_reader("GroupMetadataValue", data)
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length()):
        member_id = r.string()
        group_instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        # Before v1 there was one timeout for both (Kafka reads the session timeout into both).
        if version == 0:
            rebalance_timeout = session_timeout
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.skip_tagged_fields()
        members.append(
            MemberMetadataValue(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.skip_tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, current_state_timestamp, tuple(members))


def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, in 32-bit two's complement."""
    h = 0
    units = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_abs(n: int) -> int:
    """Kafka's Utils.abs: Math.abs, except that Integer.MIN_VALUE (whose Math.abs is itself) gives 0."""
    return 0 if n == -(2**31) else abs(n)


def partition_for(group_id: str, num_partitions: int) -> int:
    """The __consumer_offsets partition of a group: Utils.abs(groupId.hashCode) % partitions, so a group's offsets
    land in the partition Kafka puts them in."""
    return kafka_abs(java_string_hash(group_id)) % num_partitions
