"""FetchResponse v4-v16 encoded by hand into chunks, so record bytes are never copied or read.

kio's serialiser needs `len()` of a records value and writes it into a stream, which would read every
segment slice into memory. Fetch is the hot path, so this encoder walks the kio `FetchResponse` entity
of the request's version itself and emits a list of chunks: `bytes` for the fields, and each partition's
records as its own chunk (`bytes`/`memoryview` as given, or a file slice the shell sends with
`sendfile`). The length prefix of a records field is written at the end of the preceding bytes chunk:
uvarint(size + 1) in flexible versions (compact nullable bytes), int32 size otherwise.

Layout (Kafka's FetchResponse.json; flexible from v12):
    [size int32] [correlation id int32] [header tags, v12+]
    throttle_time_ms int32 | error_code int16 (v7+) | session_id int32 (v7+) |
    responses: [topic name (v4-12) or topic id uuid (v13+) |
        partitions: [partition_index int32 | error_code int16 | high_watermark int64 |
            last_stable_offset int64 | log_start_offset int64 (v5+) |
            aborted_transactions: nullable [producer_id int64 | first_offset int64 | tags] |
            preferred_read_replica int32 (v11+) | records nullable bytes |
            tags: DivergingEpoch(0), CurrentLeader(1), SnapshotId(2) (v12+)] | tags] |
    tags: NodeEndpoints(0) (v16+)
A tagged field is written only when it differs from its default, as Kafka's generated code does.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO, Protocol, TypeAlias

from tierlog.protocol.api_versions import SUPPORTED_APIS

FETCH_KEY = 1
FIRST_FLEXIBLE_VERSION = SUPPORTED_APIS[FETCH_KEY].first_flexible_version


class SupportsFileSlice(Protocol):
    """The shape of storage's `FileSlice`: `size` bytes of `file` from `position`, sent by sendfile."""

    @property
    def file(self) -> BinaryIO: ...

    @property
    def position(self) -> int: ...

    @property
    def size(self) -> int: ...


ResponseChunk: TypeAlias = bytes | memoryview | SupportsFileSlice

# A records value below this size is copied into the surrounding field bytes: one chunk (one write)
# instead of three costs less than the copy.
INLINE_RECORDS_MAX = 4096

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_TOP_V4 = struct.Struct(">i")  # throttle_time_ms
_TOP_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_V4 = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log_start_offset
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
# Tagged struct values: their fields, then their own (empty) tag section.
_EPOCH_END_OFFSET = struct.Struct(">iqB")  # epoch, end_offset
_LEADER_ID_AND_EPOCH = struct.Struct(">iiB")  # leader_id, leader_epoch
_SNAPSHOT_ID = struct.Struct(">qiB")  # end_offset, epoch
_NULL_LEGACY = _INT32.pack(-1)
_NULL_COMPACT = b"\x00"
_NO_TAGS = b"\x00"
_ZERO_UUID = bytes(16)
_SMALL_UVARINTS = [bytes((value,)) for value in range(0x80)]


def uvarint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Chunks:
    """Accumulates field bytes in `buffer`; records that are large or file slices become chunks of their own.

    The first `reserved` bytes of the first buffer are left for the size prefix and response header.
    """

    __slots__ = ("_parts", "buffer")

    def __init__(self, reserved: int) -> None:
        self.buffer = bytearray(reserved)
        self._parts: list[bytearray | bytes | memoryview | SupportsFileSlice] = [self.buffer]

    def blob(self, data: bytes | bytearray | memoryview, size: int) -> bytearray:
        """Append a records value; return the buffer to continue writing into."""
        if size <= INLINE_RECORDS_MAX:
            self.buffer += data
            return self.buffer
        # A bytearray would stay mutable while the response waits to be sent: freeze a view of it.
        self._parts.append(memoryview(data).toreadonly() if isinstance(data, bytearray) else data)
        return self._start_buffer()

    def file_slice(self, file_slice: SupportsFileSlice) -> bytearray:
        # An empty slice sends nothing; dropping it also spares the shell a sendfile whose count of 0
        # would mean "to the end of the file".
        if file_slice.size == 0:
            return self.buffer
        self._parts.append(file_slice)
        return self._start_buffer()

    def _start_buffer(self) -> bytearray:
        self.buffer = bytearray()
        self._parts.append(self.buffer)
        return self.buffer

    def finish(self) -> list[ResponseChunk]:
        """Fill in the size prefix (everything after it) and return the chunks."""
        total = 0
        for part in self._parts:
            if isinstance(part, bytes | bytearray):
                total += len(part)
            elif isinstance(part, memoryview):
                total += part.nbytes
            else:
                total += part.size
        first = self._parts[0]
        assert isinstance(first, bytearray)
        _INT32.pack_into(first, 0, total - _INT32.size)
        chunks: list[ResponseChunk] = []
        for part in self._parts:
            if isinstance(part, bytearray):
                if part:
                    chunks.append(bytes(part))
            else:
                chunks.append(part)
        return chunks


def _array_length(count: int, flexible: bool) -> bytes:
    return uvarint(count + 1) if flexible else _INT32.pack(count)


def _string(value: str, flexible: bool) -> bytes:
    encoded = value.encode()
    if flexible:
        return uvarint(len(encoded) + 1) + encoded
    return _INT16.pack(len(encoded)) + encoded


def _nullable_compact_string(value: str | None) -> bytes:
    return _NULL_COMPACT if value is None else _string(value, flexible=True)


def _partition_tags(partition: Any) -> bytes:
    tags: list[bytes] = []
    diverging = partition.diverging_epoch
    if diverging.epoch != -1 or diverging.end_offset != -1:
        tags.append(b"\x00" + uvarint(_EPOCH_END_OFFSET.size))
        tags.append(_EPOCH_END_OFFSET.pack(diverging.epoch, diverging.end_offset, 0))
    leader = partition.current_leader
    if leader.leader_id != -1 or leader.leader_epoch != -1:
        tags.append(b"\x01" + uvarint(_LEADER_ID_AND_EPOCH.size))
        tags.append(_LEADER_ID_AND_EPOCH.pack(leader.leader_id, leader.leader_epoch, 0))
    snapshot = partition.snapshot_id
    if snapshot.end_offset != -1 or snapshot.epoch != -1:
        tags.append(b"\x02" + uvarint(_SNAPSHOT_ID.size))
        tags.append(_SNAPSHOT_ID.pack(snapshot.end_offset, snapshot.epoch, 0))
    if not tags:
        return _NO_TAGS
    return uvarint(len(tags) // 2) + b"".join(tags)


def _response_tags(response: Any, version: int) -> bytes:
    endpoints = response.node_endpoints if version >= 16 else ()
    if not endpoints:
        return _NO_TAGS
    value = bytearray(uvarint(len(endpoints) + 1))
    for endpoint in endpoints:
        value += _INT32.pack(endpoint.node_id)
        value += _string(endpoint.host, flexible=True)
        value += _INT32.pack(endpoint.port)
        value += _nullable_compact_string(endpoint.rack)
        value += _NO_TAGS
    return b"\x01\x00" + uvarint(len(value)) + value


def encode_fetch_response(correlation_id: int, version: int, response: Any) -> list[ResponseChunk]:
    """Chunks of a whole response frame (size prefix, header, body) for a kio `FetchResponse` of
    `version`, whose `records` fields hold `bytes`, `bytearray`, `memoryview`, a file slice or None.

    `response` is typed Any because kio has one FetchResponse class per version.
    """
    flexible = version >= FIRST_FLEXIBLE_VERSION
    # Size prefix, correlation id, and in flexible versions (response header v1) an empty tag section.
    header_size = 8 + (1 if flexible else 0)
    chunks = _Chunks(header_size)
    buffer = chunks.buffer
    _INT32.pack_into(buffer, 4, correlation_id)

    # Same rounding as kio's timedelta_i32 writer.
    throttle_time_ms = round(response.throttle_time.total_seconds() * 1000)
    if version >= 7:
        buffer += _TOP_V7.pack(throttle_time_ms, response.error_code, response.session_id)
    else:
        buffer += _TOP_V4.pack(throttle_time_ms)
    null_marker = _NULL_COMPACT if flexible else _NULL_LEGACY

    topics = response.responses
    buffer += _array_length(len(topics), flexible)
    for topic in topics:
        if version >= 13:
            buffer += _ZERO_UUID if topic.topic_id is None else topic.topic_id.bytes
        else:
            buffer += _string(topic.topic, flexible)
        partitions = topic.partitions
        buffer += _array_length(len(partitions), flexible)
        for partition in partitions:
            if version >= 5:
                buffer += _PARTITION_V5.pack(
                    partition.partition_index,
                    partition.error_code,
                    partition.high_watermark,
                    partition.last_stable_offset,
                    partition.log_start_offset,
                )
            else:
                buffer += _PARTITION_V4.pack(
                    partition.partition_index,
                    partition.error_code,
                    partition.high_watermark,
                    partition.last_stable_offset,
                )
            aborted = partition.aborted_transactions
            if aborted is None:
                buffer += null_marker
            else:
                buffer += _array_length(len(aborted), flexible)
                for transaction in aborted:
                    buffer += _ABORTED.pack(transaction.producer_id, transaction.first_offset)
                    if flexible:
                        buffer += _NO_TAGS
            if version >= 11:
                buffer += _INT32.pack(partition.preferred_read_replica)

            records = partition.records
            if records is None:
                buffer += null_marker
            elif isinstance(records, bytes | bytearray | memoryview):
                size = records.nbytes if isinstance(records, memoryview) else len(records)
                buffer += uvarint(size + 1) if flexible else _INT32.pack(size)
                buffer = chunks.blob(records, size)
            else:
                size = records.size
                buffer += uvarint(size + 1) if flexible else _INT32.pack(size)
                buffer = chunks.file_slice(records)

            if flexible:
                buffer += _partition_tags(partition)
        if flexible:
            buffer += _NO_TAGS
    if flexible:
        buffer += _response_tags(response, version)
    return chunks.finish()
