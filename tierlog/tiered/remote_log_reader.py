"""Reads from the remote tier (KIP-405): Kafka's RemoteLogManager.read and findOffsetByTimestamp.

A fetch below the local log start is served from a remote segment: the cached remote offset index gives the
position of a batch boundary at or before the fetch offset, one ranged read of the remote `.log` brings the
bytes from there, and batch headers (never records) decide where the answer starts and ends. A timestamp
search decodes only the records of batches whose max timestamp reaches the target.

Sequential consumers read a remote segment front to back, one fetch after another, and each remote read is
an object-store round trip. So the reader remembers where the previous read of a segment ended (the next
fetch offset maps to that position without an index lookup) and keeps a few chunks of bytes it has already
fetched: the unread tail of its last window, and the chunk the shell prefetches from a worker thread with
`prefetch_next(metadata, result.next_position)` while the consumer handles the previous answer. This class
never starts a thread itself; the RemoteStorageManager's blocking calls happen in whichever worker thread
calls it, outside the lock that guards the caches and counters.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tierlog.records.record_batch import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    InvalidRecordError,
    RecordBatchHeader,
    batch_size_at,
    read_header,
)
from tierlog.storage.file_records import TimestampAndOffset, search_batch_for_timestamp
from tierlog.tiered.remote_index_cache import RemoteIndexCache
from tierlog.tiered.remote_storage_manager import RemoteStorageManager
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

DEFAULT_CHUNK_BYTES = 1024 * 1024
DEFAULT_PREFETCH_CHUNKS = 4
# Where each recently read segment's reader stands: one small entry per (segment, next offset).
_MAX_RESUME_POSITIONS = 1024


@dataclass(frozen=True, slots=True)
class RemoteReadResult:
    """Whole record batches, and the position right after the last of them: where the next sequential read
    of this segment starts, for the shell to prefetch. None at the segment's end, or when nothing came back."""

    records: bytes
    next_position: int | None


class _Window:
    """Bytes [start, end) of one remote segment, extended on demand by fetches of at least `min_fetch`
    bytes, never past `limit` (the segment's size, lowered if the remote object turns out shorter)."""

    def __init__(self, fetch: Callable[[int, int], bytes], start: int, limit: int, min_fetch: int) -> None:
        self._fetch = fetch
        self.start = start
        self.limit = limit
        self._min_fetch = min_fetch
        self._data = bytearray()
        self._keep_from = start

    @property
    def end(self) -> int:
        return self.start + len(self._data)

    def ensure(self, end: int) -> bool:
        """Hold every byte before `end`; False if the segment ends before it."""
        if end <= self.end:
            return True
        if end > self.limit:
            return False
        if self._keep_from > self.start:
            del self._data[: self._keep_from - self.start]
            self.start = self._keep_from
        fetch_end = min(max(end, self.end + self._min_fetch), self.limit)
        self._data += self._fetch(self.end, fetch_end)
        if self.end < fetch_end:
            self.limit = self.end
        return end <= self.end

    def release_before(self, position: int) -> None:
        """Bytes before `position` are no longer needed: the next extension drops them rather than grow."""
        self._keep_from = max(self._keep_from, position)

    def header(self, position: int) -> RecordBatchHeader:
        return read_header(self._data, position - self.start)

    def batch_size(self, position: int) -> int:
        size = batch_size_at(self._data, position - self.start)
        if size is None or size < RECORD_BATCH_OVERHEAD:
            raise InvalidRecordError(f"Remote segment batch at position {position} declares size {size}")
        return size

    def bytes(self, start: int, end: int) -> bytes:
        return bytes(self._data[start - self.start : end - self.start])


def _batches(window: _Window, position: int) -> Iterator[tuple[int, RecordBatchHeader]]:
    """(position, header) of each batch from the boundary `position` on, until the segment ends."""
    while window.ensure(position + RECORD_BATCH_OVERHEAD):
        header = window.header(position)
        if header.size_in_bytes < RECORD_BATCH_OVERHEAD:
            raise InvalidRecordError(
                f"Remote segment batch at position {position} declares size {header.size_in_bytes}"
            )
        yield position, header
        position += header.size_in_bytes
        window.release_before(position)


class RemoteLogReader:
    def __init__(
        self,
        rsm: RemoteStorageManager,
        index_cache: RemoteIndexCache,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        prefetch: bool = True,
        prefetch_chunks: int = DEFAULT_PREFETCH_CHUNKS,
    ) -> None:
        if chunk_bytes <= 0 or prefetch_chunks <= 0:
            raise ValueError(f"Invalid remote read chunk size {chunk_bytes} or chunk count {prefetch_chunks}")
        self._rsm = rsm
        self._index_cache = index_cache
        self._chunk_bytes = chunk_bytes
        self._prefetch = prefetch
        self._max_cached_bytes = prefetch_chunks * chunk_bytes
        self._lock = threading.Lock()
        # Bytes already fetched, kept for the reads that follow, by (segment id, position of their first
        # byte); least recently used first.
        self._chunks: OrderedDict[tuple[uuid.UUID, int], bytes] = OrderedDict()
        self._cached_bytes = 0
        # (segment id, next offset) -> position where the read that returned the offset before it ended.
        self._resume_positions: OrderedDict[tuple[uuid.UUID, int], int] = OrderedDict()
        # Bytes read from the remote store (by reads and prefetches), and bytes reads took from memory instead.
        self.bytes_fetched = 0
        self.bytes_served_from_prefetch = 0

    def read(
        self, metadata: RemoteLogSegmentMetadata, fetch_offset: int, max_bytes: int, min_one_message: bool
    ) -> RemoteReadResult:
        """Whole batches of the remote segment from the one holding `fetch_offset` (which comes whole even if
        it starts below it; clients skip), at most `max_bytes`, except that with `min_one_message` the first
        batch comes even if larger. Raises RemoteStorageError from the remote store, InvalidRecordError if a
        batch header there declares an impossible size."""
        if max_bytes < 0:
            raise ValueError(f"Invalid max bytes {max_bytes} for a remote read of {metadata.segment_id}")
        nothing = RemoteReadResult(b"", None)
        if fetch_offset > metadata.end_offset:
            return nothing
        segment_id = metadata.segment_id.id
        position = self._index_cache.lookup_offset(metadata, fetch_offset)
        if self._prefetch:
            with self._lock:
                resume = self._resume_positions.get((segment_id, fetch_offset))
            if resume is not None:
                # Every batch before `resume` ended below fetch_offset (the previous read returned them).
                position = max(position, resume)
        window = _Window(
            lambda start, end: self._fetch(metadata, start, end),
            position,
            metadata.segment_size_in_bytes,
            self._chunk_bytes,
        )
        window.ensure(min(position + max(max_bytes, self._chunk_bytes), window.limit))
        first = next(
            ((at, header) for at, header in _batches(window, position) if header.last_offset >= fetch_offset), None
        )
        if first is None:
            return nothing
        first_position, first_header = first
        first_size = first_header.size_in_bytes
        if first_size > max_bytes and not min_one_message:
            return nothing
        limit = min(first_position + max(max_bytes, first_size), window.limit)
        window.ensure(limit)
        end, last_position = self._cut(window, first_position, min(limit, window.end))
        if end == first_position:
            return nothing
        next_position = end if end < window.limit else None
        if self._prefetch and next_position is not None:
            next_offset = window.header(last_position).last_offset + 1
            tail = window.bytes(end, window.end)
            with self._lock:
                self._remember_resume_position(segment_id, next_offset, end)
                if tail:
                    self._store(segment_id, end, tail)
        return RemoteReadResult(window.bytes(first_position, end), next_position)

    def prefetch_next(self, metadata: RemoteLogSegmentMetadata, position: int) -> None:
        """Fetch the chunk at `position` (a RemoteReadResult.next_position) into memory, unless it is there
        already, so the next sequential read of the segment need not wait for the remote store. Meant for a
        worker thread; a RemoteStorageError may be ignored, as the read then fetches for itself."""
        if not self._prefetch:
            return
        segment_id = metadata.segment_id.id
        end = min(position + self._chunk_bytes, metadata.segment_size_in_bytes)
        with self._lock:
            start = position + sum(len(part) for part in self._cached_parts(segment_id, position, end))
        if start >= end:
            return
        data = self._rsm.fetch_log_segment(metadata, start, end)
        with self._lock:
            self.bytes_fetched += len(data)
            if data:
                self._store(segment_id, start, data)

    def find_offset_by_timestamp(
        self, segments: Sequence[RemoteLogSegmentMetadata], timestamp: int, start_offset: int
    ) -> TimestampAndOffset | None:
        """Kafka's RemoteLogManager.findOffsetByTimestamp: the first record at or after `start_offset` whose
        timestamp is >= `timestamp`, with its batch's leader epoch, searched in offset order through the
        segments whose max timestamp reaches the target; None if no segment holds one."""
        for metadata in sorted(segments, key=lambda segment: segment.start_offset):
            if metadata.max_timestamp_ms < timestamp or metadata.end_offset < start_offset:
                continue
            found = self._search_segment(metadata, timestamp, start_offset)
            if found is not None:
                return found
        return None

    def _search_segment(
        self, metadata: RemoteLogSegmentMetadata, timestamp: int, start_offset: int
    ) -> TimestampAndOffset | None:
        # No batch before the time index's floor entry's holds a timestamp >= target, and none before the
        # offset index's floor entry for start_offset holds an offset >= it: start at the later of the two.
        offset = max(self._index_cache.lookup_timestamp(metadata, timestamp), start_offset)
        position = self._index_cache.lookup_offset(metadata, offset)
        window = _Window(
            lambda start, end: self._fetch(metadata, start, end),
            position,
            metadata.segment_size_in_bytes,
            self._chunk_bytes,
        )
        for at, header in _batches(window, position):
            if header.max_timestamp < timestamp or header.last_offset < start_offset:
                continue
            end = at + header.size_in_bytes
            if not window.ensure(end):
                return None
            found = search_batch_for_timestamp(
                window.bytes(at, end), header.partition_leader_epoch, timestamp, start_offset
            )
            if found is not None:
                return found
        return None

    @staticmethod
    def _cut(window: _Window, start: int, limit: int) -> tuple[int, int]:
        """(end, position of the last batch) of the whole batches from the boundary `start` before `limit`;
        end == start when not even the first fits."""
        end = last = start
        while limit - end >= LOG_OVERHEAD:
            size = window.batch_size(end)
            if end + size > limit:
                break
            last, end = end, end + size
        return end, last

    def _fetch(self, metadata: RemoteLogSegmentMetadata, start: int, end: int) -> bytes:
        """Bytes [start, end) of the segment: what the cached chunks hold of its front, the rest remotely."""
        segment_id = metadata.segment_id.id
        if self._prefetch:
            with self._lock:
                cached = b"".join(self._cached_parts(segment_id, start, end))
                self.bytes_served_from_prefetch += len(cached)
        else:
            cached = b""
        if start + len(cached) >= end:
            return cached
        fetched = self._rsm.fetch_log_segment(metadata, start + len(cached), end)
        with self._lock:
            self.bytes_fetched += len(fetched)
        return cached + fetched

    def _cached_parts(self, segment_id: uuid.UUID, start: int, end: int) -> list[bytes]:
        """The longest run of cached bytes from `start` towards `end`, chunk by chunk. Caller holds the lock."""
        parts: list[bytes] = []
        position = start
        while position < end:
            key = next(
                (
                    key
                    for key, data in self._chunks.items()
                    if key[0] == segment_id and key[1] <= position < key[1] + len(data)
                ),
                None,
            )
            if key is None:
                break
            self._chunks.move_to_end(key)
            data = self._chunks[key]
            part = data[position - key[1] : min(end, key[1] + len(data)) - key[1]]
            parts.append(part)
            position += len(part)
        return parts

    def _store(self, segment_id: uuid.UUID, position: int, data: bytes) -> None:
        """Cache bytes fetched at `position` as the most recently used chunk, keeping the cache within its
        bound; of a run too long for the bound the front is kept, which the next read needs first. Caller
        holds the lock."""
        data = data[: self._max_cached_bytes]
        old = self._chunks.pop((segment_id, position), None)
        if old is not None:
            self._cached_bytes -= len(old)
        self._chunks[(segment_id, position)] = data
        self._cached_bytes += len(data)
        while self._cached_bytes > self._max_cached_bytes:
            _, evicted = self._chunks.popitem(last=False)
            self._cached_bytes -= len(evicted)

    def _remember_resume_position(self, segment_id: uuid.UUID, next_offset: int, position: int) -> None:
        """Caller holds the lock."""
        key = (segment_id, next_offset)
        self._resume_positions[key] = position
        self._resume_positions.move_to_end(key)
        if len(self._resume_positions) > _MAX_RESUME_POSITIONS:
            self._resume_positions.popitem(last=False)
