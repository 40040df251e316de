"""Reads from the remote tier (KIP-405): Kafka's RemoteLogManager.read and findOffsetByTimestamp.

A fetch below the local log start is served from a remote segment: the cached remote offset index gives the
position of a batch boundary at or before the fetch offset, ranged reads of the remote `.log` bring the bytes
from there, and batch headers (never records) decide where the answer starts and ends. A timestamp search
decodes only the records of batches whose max timestamp reaches the target.

Every remote `.log` byte comes through a chunk cache (docs/performance.md#remote-reads): the segment is cut in
`chunk_bytes`-aligned chunks, each loaded by one ranged read on the loader threads the shell gives it and kept, least
recently used first out, within `cache_bytes` (`rsm.config.fetch.chunk.cache.size`). So

- a read needing several chunks asks for all of them at once (parallel ranged reads for large fetches);
- after a read, the chunks of the next `prefetch_bytes` (`rsm.config.fetch.chunk.cache.prefetch.max.size`) of
  the segment start loading while the answer is written, and the shell asks for the head of the next segment
  when the read is near the end of this one (`prefetch`); a read that needs a chunk still loading waits for that
  load instead of asking the store again;
- a failed load is never kept: a read that finds a read-ahead's failure fetches the chunk itself, so only the
  read's own ranged read can fail it (with the error it always had).

Remote segments never change under one RemoteLogSegmentId (every copy gets a new uuid), so a cached chunk can
only be wrong by belonging to a segment that was deleted; reads reach a segment only through the remote log
metadata, which drops it first, and `forget_segment` frees its chunks when the broker deletes it.

The reader also remembers where the previous read of a segment ended, so the next fetch offset maps to that
position without an index lookup. Answers are memoryviews into the cached chunks when they lie within one, one
join of the slices otherwise: the bytes are copied once at most on their way to the socket.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
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
from tierlog.tiered.remote_storage_manager import RemoteStorageError, RemoteStorageManager
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

# Each ranged read costs a fixed few milliseconds of the broker's CPU (signing, endpoint resolution, the HTTP
# exchange in s3fs) besides its bytes: chunks of 4 MiB keep that a small share (docs/performance.md#remote-reads).
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# rsm.config.fetch.chunk.cache.size and rsm.config.fetch.chunk.cache.prefetch.max.size (docs/configuration.md).
DEFAULT_CHUNK_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_PREFETCH_BYTES = 8 * 1024 * 1024
# Where each recently read segment's reader stands: one small entry per (segment, next offset).
_MAX_RESUME_POSITIONS = 1024

Records = bytes | memoryview


@dataclass(frozen=True, slots=True)
class RemoteReadResult:
    """Whole record batches, and the position right after the last of them: where the next sequential read
    of this segment starts. None at the segment's end, or when nothing came back."""

    records: Records
    next_position: int | None


class ChunkCache:
    """Chunks of remote segments by (segment id, chunk index), each a Future of its bytes (loading or loaded),
    least recently used first out once the bytes they hold or will hold pass `max_bytes`. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._chunks: OrderedDict[tuple[uuid.UUID, int], tuple[Future[bytes], int]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def keys(self) -> list[tuple[uuid.UUID, int]]:
        with self._lock:
            return list(self._chunks)

    def get_or_start(
        self, key: tuple[uuid.UUID, int], size: int, start: Callable[[], Future[bytes]]
    ) -> tuple[Future[bytes], bool]:
        """The chunk's future, and whether this call started it (with `start()`, `size` bytes reserved)."""
        with self._lock:
            found = self._chunks.get(key)
            if found is not None:
                self._chunks.move_to_end(key)
                return found[0], False
            future = start()
            self._chunks[key] = (future, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._chunks.popitem(last=False)
                self._bytes -= evicted
            return future, True

    def discard(self, key: tuple[uuid.UUID, int], future: Future[bytes]) -> None:
        """Drop the chunk if `future` is still what the cache holds for it (a failed load)."""
        with self._lock:
            found = self._chunks.get(key)
            if found is not None and found[0] is future:
                del self._chunks[key]
                self._bytes -= found[1]

    def forget_segment(self, segment_id: uuid.UUID) -> None:
        with self._lock:
            for key in [key for key in self._chunks if key[0] == segment_id]:
                self._bytes -= self._chunks.pop(key)[1]


class _Window:
    """Bytes of one remote segment from `start`, in the chunks `load(index)` gives, up to `limit` (the segment's
    size, lowered if the remote object turns out shorter)."""

    def __init__(self, load: Callable[[list[int]], list[bytes]], chunk_bytes: int, start: int, limit: int) -> None:
        self._load = load
        self._chunk_bytes = chunk_bytes
        self.limit = limit
        self._chunks: dict[int, bytes] = {}
        self.start = start

    @property
    def end(self) -> int:
        """Every byte from `start` before this is held."""
        index = self.start // self._chunk_bytes
        while index in self._chunks:
            index += 1
        return min(index * self._chunk_bytes, self.limit)

    def ensure(self, end: int) -> bool:
        """Hold every byte from `start` before `end`; False if the segment ends before it. The chunks missing are
        loaded together."""
        if end > self.limit:
            return False
        first, last = self.start // self._chunk_bytes, (end - 1) // self._chunk_bytes
        missing = [index for index in range(first, last + 1) if index not in self._chunks]
        for index, data in zip(missing, self._load(missing), strict=True):
            self._chunks[index] = data
            expected = min(self._chunk_bytes, self.limit - index * self._chunk_bytes)
            if len(data) < expected:
                self.limit = index * self._chunk_bytes + len(data)
        return end <= self.limit

    def release_before(self, position: int) -> None:
        """Bytes before `position` are no longer needed: their chunks are let go."""
        for index in range(self.start // self._chunk_bytes, position // self._chunk_bytes):
            self._chunks.pop(index, None)
        self.start = max(self.start, position)

    def view(self, start: int, end: int) -> Records:
        """Bytes [start, end): a memoryview into one chunk, or the slices of several joined."""
        first, last = start // self._chunk_bytes, (end - 1) // self._chunk_bytes
        if first == last:
            base = first * self._chunk_bytes
            return memoryview(self._chunks[first])[start - base : end - base]
        parts = []
        for index in range(first, last + 1):
            base = index * self._chunk_bytes
            parts.append(
                memoryview(self._chunks[index])[max(start, base) - base : min(end, base + self._chunk_bytes) - base]
            )
        return b"".join(parts)

    def header(self, position: int) -> RecordBatchHeader:
        return read_header(self.view(position, position + RECORD_BATCH_OVERHEAD))

    def batch_size(self, position: int) -> int:
        size = batch_size_at(self.view(position, position + LOG_OVERHEAD), 0)
        if size is None or size < RECORD_BATCH_OVERHEAD:
            raise InvalidRecordError(f"Remote segment batch at position {position} declares size {size}")
        return size


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
        cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        *,
        loader: Executor,
    ) -> None:
        """`loader` runs the ranged reads (the shell's threads: the core spawns none); `prefetch_bytes` 0 turns
        read-ahead off."""
        if chunk_bytes <= 0 or cache_bytes < 0 or prefetch_bytes < 0:
            raise ValueError(
                f"Invalid remote read chunk size {chunk_bytes}, chunk cache size {cache_bytes} or prefetch size "
                f"{prefetch_bytes}"
            )
        self._rsm = rsm
        self._index_cache = index_cache
        self.chunk_bytes = chunk_bytes
        self.prefetch_bytes = prefetch_bytes
        self._loader = loader
        self.chunks = ChunkCache(cache_bytes)
        self._lock = threading.Lock()
        # (segment id, next offset) -> position where the read that returned the offset before it ended.
        self._resume_positions: OrderedDict[tuple[uuid.UUID, int], int] = OrderedDict()
        # Bytes read from the remote store (by reads and read-aheads), bytes of read-aheads among them, and bytes
        # reads took from chunks they did not load themselves.
        self.bytes_fetched = 0
        self.bytes_prefetched = 0
        self.bytes_served_from_cache = 0

    def read(
        self, metadata: RemoteLogSegmentMetadata, fetch_offset: int, max_bytes: int, min_one_message: bool
    ) -> RemoteReadResult:
        """Whole batches of the remote segment from the one holding `fetch_offset` (which comes whole even if
        it starts below it; clients skip), at most `max_bytes`, except that with `min_one_message` the first
        batch comes even if larger; then the read-ahead of the bytes after them starts. Raises RemoteStorageError
        from the remote store, InvalidRecordError if a batch header there declares an impossible size."""
        if max_bytes < 0:
            raise ValueError(f"Invalid max bytes {max_bytes} for a remote read of {metadata.segment_id}")
        nothing = RemoteReadResult(b"", None)
        if fetch_offset > metadata.end_offset:
            return nothing
        segment_id = metadata.segment_id.id
        position = self._index_cache.lookup_offset(metadata, fetch_offset)
        with self._lock:
            resume = self._resume_positions.get((segment_id, fetch_offset))
        if resume is not None:
            # Every batch before `resume` ended below fetch_offset (the previous read returned them).
            position = max(position, resume)
        window = self._window(metadata, position)
        window.ensure(min(position + max(max_bytes, RECORD_BATCH_OVERHEAD), window.limit))
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
        if next_position is not None:
            next_offset = window.header(last_position).last_offset + 1
            with self._lock:
                self._remember_resume_position(segment_id, next_offset, end)
            self.prefetch(metadata, end)
        return RemoteReadResult(window.view(first_position, end), next_position)

    def prefetch(self, metadata: RemoteLogSegmentMetadata, position: int, max_bytes: int | None = None) -> None:
        """Start loading the chunks of the segment's next `max_bytes` (default `prefetch_bytes`) from `position`
        that the cache does not hold, without waiting for them. A failed load is dropped: the read that needs the
        chunk fetches it itself."""
        size = metadata.segment_size_in_bytes
        end = min(position + (self.prefetch_bytes if max_bytes is None else max_bytes), size)
        if end <= position:
            return
        for index in range(position // self.chunk_bytes, (end - 1) // self.chunk_bytes + 1):
            self._chunk(metadata, index, prefetch=True)

    def forget_segment(self, segment_id: uuid.UUID) -> None:
        """The segment is deleted: free its chunks and resume positions."""
        self.chunks.forget_segment(segment_id)
        with self._lock:
            for key in [key for key in self._resume_positions if key[0] == segment_id]:
                del self._resume_positions[key]

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
        window = self._window(metadata, position)
        for at, header in _batches(window, position):
            if header.max_timestamp < timestamp or header.last_offset < start_offset:
                continue
            end = at + header.size_in_bytes
            if not window.ensure(end):
                return None
            found = search_batch_for_timestamp(
                bytes(window.view(at, end)), header.partition_leader_epoch, timestamp, start_offset
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

    def _window(self, metadata: RemoteLogSegmentMetadata, position: int) -> _Window:
        return _Window(
            lambda indexes: self._load(metadata, indexes), self.chunk_bytes, position, metadata.segment_size_in_bytes
        )

    def _load(self, metadata: RemoteLogSegmentMetadata, indexes: list[int]) -> list[bytes]:
        """The chunks' bytes, their ranged reads (those not cached or loading already) started together. A chunk
        whose read-ahead failed is fetched once more, here; this read's own failures raise."""
        started = [(index, *self._chunk(metadata, index, prefetch=False)) for index in indexes]
        chunks = []
        for index, future, mine in started:
            try:
                data = future.result()
            except RemoteStorageError:
                if mine:
                    raise
                self.chunks.discard((metadata.segment_id.id, index), future)
                future, mine = self._chunk(metadata, index, prefetch=False)
                data = future.result()
            if not mine:
                with self._lock:
                    self.bytes_served_from_cache += len(data)
            chunks.append(data)
        return chunks

    def _chunk(self, metadata: RemoteLogSegmentMetadata, index: int, *, prefetch: bool) -> tuple[Future[bytes], bool]:
        key = (metadata.segment_id.id, index)
        start = index * self.chunk_bytes
        size = min(self.chunk_bytes, metadata.segment_size_in_bytes - start)
        future, mine = self.chunks.get_or_start(
            key, size, lambda: self._loader.submit(self._fetch_chunk, metadata, index, prefetch=prefetch)
        )
        if mine:
            # A failed load is not kept: the next read of the chunk asks the store again.
            future.add_done_callback(
                lambda done: (
                    None if not done.cancelled() and done.exception() is None else self.chunks.discard(key, done)
                )
            )
        return future, mine

    def _fetch_chunk(self, metadata: RemoteLogSegmentMetadata, index: int, *, prefetch: bool) -> bytes:
        start = index * self.chunk_bytes
        data = self._rsm.fetch_log_segment(
            metadata, start, min(start + self.chunk_bytes, metadata.segment_size_in_bytes)
        )
        with self._lock:
            self.bytes_fetched += len(data)
            if prefetch:
                self.bytes_prefetched += len(data)
        return data

    def _remember_resume_position(self, segment_id: uuid.UUID, next_offset: int, position: int) -> None:
        """Caller holds the lock."""
        key = (segment_id, next_offset)
        self._resume_positions[key] = position
        self._resume_positions.move_to_end(key)
        if len(self._resume_positions) > _MAX_RESUME_POSITIONS:
            self._resume_positions.popitem(last=False)
