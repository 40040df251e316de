"""Kafka's FileRecords, reduced to what the broker needs from a segment's `.log` file.

Reads never decode records: batch boundaries come from 43-byte header reads (`os.pread`), and what a fetch
gets back is a `FileSlice` of the open file that the server sends with sendfile. Only a timestamp search
(ListOffsets) decodes the records of the one batch that holds the answer, as Kafka's searchForTimestamp does.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from aiokafka.record.default_records import DefaultRecordBatch

from tierlog.records.record_batch import LOG_OVERHEAD

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta, baseTimestamp,
# maxTimestamp: the header prefix that locates a batch and tells its offsets and largest timestamp.
_HEADER_PREFIX = struct.Struct(">qiibIhiqq")
HEADER_PREFIX_SIZE = _HEADER_PREFIX.size
_LENGTH = struct.Struct(">i")
_LENGTH_OFFSET = 8


@dataclass(frozen=True, slots=True)
class FileSlice:
    """`size` bytes of an open segment file from `position`: whole batches, ready for sendfile.

    The file stays open for as long as its segment exists (a deleted segment lingers for
    file.delete.delay.ms), so a slice handed to a response stays readable while it is sent.
    """

    file: BinaryIO
    position: int
    size: int

    def read_bytes(self) -> bytes:
        fd = self.file.fileno()
        data = os.pread(fd, self.size, self.position)
        if len(data) == self.size:
            return data
        # pread may return less than asked for very large reads; a slice never extends past the file end.
        parts = [data]
        done = len(data)
        while done < self.size:
            chunk = os.pread(fd, self.size - done, self.position + done)
            if not chunk:
                raise EOFError(f"slice of {self.size} bytes at {self.position} ends after {done} bytes")
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    """What a read returns: the requested offset and the batches found (None when there are none)."""

    fetch_offset: int
    records: FileSlice | None


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    """Kafka's FileRecords.TimestampAndOffset: a ListOffsets answer."""

    timestamp: int
    offset: int
    leader_epoch: int | None


class BatchPosition(NamedTuple):
    """Where a batch lies in a segment file, and what its header says about offsets and time."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    partition_leader_epoch: int


def scan_batches(fd: int, start: int, end: int) -> Iterator[BatchPosition]:
    """The batches that lie wholly in [start, end) of `fd`, read one header at a time.

    `start` must be a batch boundary. A header or batch that does not fit before `end` ends the scan: within
    a segment's valid size that cannot happen, and callers that scan unvalidated bytes validate separately.
    """
    position = start
    while end - position >= HEADER_PREFIX_SIZE:
        header = os.pread(fd, HEADER_PREFIX_SIZE, position)
        if len(header) < HEADER_PREFIX_SIZE:
            return
        base_offset, length, epoch, _, _, _, last_delta, _, max_timestamp = _HEADER_PREFIX.unpack(header)
        size = length + LOG_OVERHEAD
        if size < HEADER_PREFIX_SIZE or position + size > end:
            return
        yield BatchPosition(position, size, base_offset, base_offset + last_delta, max_timestamp, epoch)
        position += size


def search_for_offset(fd: int, target_offset: int, start: int, end: int) -> BatchPosition | None:
    """Kafka's searchForOffsetWithSize: the first batch from `start` whose last offset is >= target."""
    for batch in scan_batches(fd, start, end):
        if batch.last_offset >= target_offset:
            return batch
    return None


def last_batch_boundary(fd: int, start: int, limit: int) -> int:
    """The furthest batch boundary at or before `limit`, scanning lengths from the boundary `start`."""
    position = start
    while limit - position >= LOG_OVERHEAD:
        size = _LENGTH.unpack(os.pread(fd, 4, position + _LENGTH_OFFSET))[0] + LOG_OVERHEAD
        if position + size > limit:
            break
        position += size
    return position


def largest_timestamp_after(fd: int, start: int, end: int) -> tuple[int, int]:
    """(largest batch max timestamp, that batch's last offset) from `start` on; (-1, -1) when there is none."""
    largest = (-1, -1)
    for batch in scan_batches(fd, start, end):
        if batch.max_timestamp > largest[0]:
            largest = (batch.max_timestamp, batch.last_offset)
    return largest


def search_for_timestamp(
    fd: int, target_timestamp: int, start: int, end: int, starting_offset: int
) -> TimestampAndOffset | None:
    """Kafka's searchForTimestamp: the first record from `start` with timestamp >= target and offset >=
    `starting_offset`. Only batches whose max timestamp reaches the target are decoded."""
    for batch in scan_batches(fd, start, end):
        if batch.max_timestamp < target_timestamp or batch.last_offset < starting_offset:
            continue
        found = search_batch_for_timestamp(
            os.pread(fd, batch.size, batch.position), batch.partition_leader_epoch, target_timestamp, starting_offset
        )
        if found is not None:
            return found
    return None


def search_batch_for_timestamp(
    batch: bytes, partition_leader_epoch: int, target_timestamp: int, starting_offset: int
) -> TimestampAndOffset | None:
    """The record-level step of searchForTimestamp on one whole batch's bytes: its first record with timestamp
    >= target and offset >= `starting_offset`. Separate so remote segments, held as bytes, search alike."""
    for record in DefaultRecordBatch(batch):
        if record.timestamp >= target_timestamp and record.offset >= starting_offset:
            return TimestampAndOffset(record.timestamp, record.offset, _epoch_or_none(partition_leader_epoch))
    return None


def offset_of_timestamp_in_batch(fd: int, batch: BatchPosition, timestamp: int) -> TimestampAndOffset | None:
    """Kafka's RecordBatch.offsetOfMaxTimestamp for ListOffsets MAX_TIMESTAMP: the first record of `batch`
    carrying `timestamp`."""
    for record in DefaultRecordBatch(os.pread(fd, batch.size, batch.position)):
        if record.timestamp == timestamp:
            return TimestampAndOffset(timestamp, record.offset, _epoch_or_none(batch.partition_leader_epoch))
    return None


def _epoch_or_none(epoch: int) -> int | None:
    # Batches written before leader epochs existed carry -1 (NO_PARTITION_LEADER_EPOCH).
    return epoch if epoch >= 0 else None
