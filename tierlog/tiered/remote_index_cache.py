"""Kafka's RemoteIndexCache: remote segments' offset and time indexes, kept on local disk and in memory.

A fetch below the local log start needs the remote segment's offset index to know where in the remote `.log`
to start, and a ListOffsets into the remote tier needs its time index too. Fetching them on every request
would cost two object-store round trips per read, so they are cached: as files under
`<first log dir>/remote-log-index-cache/` (kept across restarts) and parsed in memory, bounded by their total
size in bytes (`remote.log.index.file.cache.total.size.bytes`), least recently used first out.

The uploaded index files are byte for byte the local `.index`/`.timeindex` files, so the local OffsetIndex
and TimeIndex classes read them and answer lookups exactly as for a local segment. Lookups run from the
shell's worker threads: one lock guards the LRU, and the remote fetches happen outside it, one per segment
however many threads miss on it at once.

A `read_committed` read also needs the segments' transaction indexes (docs/transactions.md#tiered-txn-index):
their entries are kept in memory only (a few 34-byte entries a segment, most often none), least recently used
first out, within a bound of the same size.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tierlog.storage.abstract_index import AbstractIndex
from tierlog.storage.errors import CorruptIndexError
from tierlog.storage.offset_index import OffsetIndex
from tierlog.storage.segment import filename_prefix_from_offset
from tierlog.storage.time_index import TimeIndex
from tierlog.storage.transaction_index import ABORTED_TXN_SIZE, AbortedTxn
from tierlog.tiered.remote_storage_manager import IndexType, RemoteStorageManager
from tierlog.tiered.remote_transactions import fetch_remote_aborted_txns
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

_TMP_SUFFIX = ".tmp"

# The index classes size their "full" check from this; a cached index is never appended to.
_UNBOUNDED_INDEX_SIZE = 2**31 - 1

_Index = TypeVar("_Index", bound=AbstractIndex)

# What a cached transaction index costs besides its entries, so that empty ones are bounded too.
_TXN_ENTRY_OVERHEAD_BYTES = 64


@dataclass(slots=True)
class _Entry:
    segment_id: uuid.UUID
    offset_index: OffsetIndex
    time_index: TimeIndex
    size_bytes: int

    def delete_files(self) -> None:
        self.offset_index.delete()
        self.time_index.delete()


@dataclass(slots=True)
class _Load:
    """A miss being fetched by one thread; others missing on the same segment wait for `result`."""

    result: Future[_Entry] = field(default_factory=Future)
    # Set by remove() while the fetch runs: the segment is gone, so the result must not be cached.
    discard: bool = False


class RemoteIndexCache:
    def __init__(self, directory: Path, rsm: RemoteStorageManager, max_size_bytes: int) -> None:
        if max_size_bytes < 0:
            raise ValueError(f"Invalid remote index cache size {max_size_bytes}")
        self._directory = directory
        self._rsm = rsm
        self._max_size_bytes = max_size_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[uuid.UUID, _Entry] = OrderedDict()
        self._loading: dict[uuid.UUID, _Load] = {}
        self._size_bytes = 0
        # segment id -> (its transaction index's entries, their cost in bytes)
        self._aborted_txns: OrderedDict[uuid.UUID, tuple[list[AbortedTxn], int]] = OrderedDict()
        self._aborted_txns_bytes = 0
        self._closed = False
        # misses: lookups that fetched from the remote store; hits: the rest, including those that waited on
        # another thread's fetch of the same segment.
        self.hits = 0
        self.misses = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._load_existing_files()

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._size_bytes

    @property
    def entries(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup_offset(self, metadata: RemoteLogSegmentMetadata, offset: int) -> int:
        """The position in the remote `.log` where a read for `offset` starts: the floor index entry's batch,
        0 if the index has none at or below `offset`."""
        return self._entry(metadata).offset_index.lookup(offset).position

    def lookup_timestamp(self, metadata: RemoteLogSegmentMetadata, timestamp: int) -> int:
        """The offset of the time index's floor entry for `timestamp` (no earlier batch holds a later
        timestamp), or the segment's start offset if there is none."""
        return self._entry(metadata).time_index.lookup(timestamp).offset

    def aborted_txns(self, metadata: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        """The entries of the segment's transaction index (none if it has none). Two threads missing on the
        same segment at once may both fetch it: it is small, and rarely wanted by two reads at once."""
        if not metadata.has_txn_index:
            return []
        segment_id = metadata.segment_id.id
        with self._lock:
            self._check_open()
            cached = self._aborted_txns.get(segment_id)
            if cached is not None:
                self._aborted_txns.move_to_end(segment_id)
                self.hits += 1
                return cached[0]
            self.misses += 1
        entries = fetch_remote_aborted_txns(self._rsm, metadata)
        cost = len(entries) * ABORTED_TXN_SIZE + _TXN_ENTRY_OVERHEAD_BYTES
        with self._lock:
            if not self._closed and segment_id not in self._aborted_txns:
                self._aborted_txns[segment_id] = (entries, cost)
                self._aborted_txns_bytes += cost
                while self._aborted_txns_bytes > self._max_size_bytes and self._aborted_txns:
                    _, (_, evicted_cost) = self._aborted_txns.popitem(last=False)
                    self._aborted_txns_bytes -= evicted_cost
        return entries

    def remove(self, segment_id: uuid.UUID) -> None:
        """Forget a segment (deleted from the remote tier) and delete its files."""
        with self._lock:
            txns = self._aborted_txns.pop(segment_id, None)
            if txns is not None:
                self._aborted_txns_bytes -= txns[1]
            entry = self._entries.pop(segment_id, None)
            if entry is not None:
                self._size_bytes -= entry.size_bytes
                entry.delete_files()
            load = self._loading.get(segment_id)
            if load is not None:
                load.discard = True

    def close(self) -> None:
        """Drop the in-memory indexes; the files stay for the next start-up to reload."""
        with self._lock:
            self._closed = True
            for entry in self._entries.values():
                entry.offset_index.close()
                entry.time_index.close()
            self._entries.clear()
            self._size_bytes = 0
            self._aborted_txns.clear()
            self._aborted_txns_bytes = 0

    def _entry(self, metadata: RemoteLogSegmentMetadata) -> _Entry:
        segment_id = metadata.segment_id.id
        with self._lock:
            self._check_open()
            entry = self._entries.get(segment_id)
            if entry is not None:
                self._entries.move_to_end(segment_id)
                self.hits += 1
                return entry
            load = self._loading.get(segment_id)
            fetching = load is None
            if load is None:
                self.misses += 1
                load = self._loading[segment_id] = _Load()
            else:
                self.hits += 1
        if not fetching:
            # Another thread is fetching these indexes already; its answer (or error) is ours.
            return load.result.result()
        try:
            entry = self._fetch(metadata)
        except BaseException as e:
            with self._lock:
                del self._loading[segment_id]
            load.result.set_exception(e)
            raise
        with self._lock:
            del self._loading[segment_id]
            if load.discard:
                entry.delete_files()
            elif not self._closed:
                self._insert(entry)
        load.result.set_result(entry)
        return entry

    def _check_open(self) -> None:
        """Caller holds the lock."""
        if self._closed:
            raise RuntimeError(f"Remote index cache {self._directory} is closed")

    def _fetch(self, metadata: RemoteLogSegmentMetadata) -> _Entry:
        """Fetch both indexes, check them, and write them under their cache names. Raises RemoteStorageError
        from the RSM, or CorruptIndexError for an index that is not one; either way no file is left behind."""
        offset_data = self._rsm.fetch_index(metadata, IndexType.OFFSET)
        time_data = self._rsm.fetch_index(metadata, IndexType.TIMESTAMP)
        prefix = _file_prefix(metadata.start_offset, metadata.segment_id.id)
        offset_path = self._directory / f"{prefix}{IndexType.OFFSET.value}"
        time_path = self._directory / f"{prefix}{IndexType.TIMESTAMP.value}"
        try:
            offset_index = _write_index(OffsetIndex, offset_path, metadata.start_offset, offset_data)
            time_index = _write_index(TimeIndex, time_path, metadata.start_offset, time_data)
        except BaseException:
            for path in (offset_path, time_path):
                path.unlink(missing_ok=True)
                _tmp_path(path).unlink(missing_ok=True)
            raise
        return _Entry(metadata.segment_id.id, offset_index, time_index, len(offset_data) + len(time_data))

    def _insert(self, entry: _Entry) -> None:
        """Add an entry as the most recently used, then evict from the least recently used end until the
        total fits (an entry larger than the whole bound goes too: it was still used for this lookup)."""
        self._entries[entry.segment_id] = entry
        self._size_bytes += entry.size_bytes
        while self._size_bytes > self._max_size_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._size_bytes -= evicted.size_bytes
            # Under the lock, so a later miss on the same segment cannot write files this deletes.
            evicted.delete_files()

    def _load_existing_files(self) -> None:
        """Reload what an earlier run cached. Leftover temporary files, an index without its partner and
        indexes that fail their sanity check are deleted; the oldest files are the least recently used."""
        by_prefix: dict[str, dict[str, Path]] = {}
        for path in self._directory.iterdir():
            if path.name.endswith(_TMP_SUFFIX):
                path.unlink(missing_ok=True)
                continue
            for index_type in (IndexType.OFFSET, IndexType.TIMESTAMP):
                if path.name.endswith(index_type.value):
                    by_prefix.setdefault(path.name.removesuffix(index_type.value), {})[index_type.value] = path
        loaded: list[tuple[int, _Entry]] = []
        for prefix, paths in by_prefix.items():
            entry = _read_entry(prefix, paths)
            if entry is None:
                for path in paths.values():
                    path.unlink(missing_ok=True)
            else:
                loaded.append((max(path.stat().st_mtime_ns for path in paths.values()), entry))
        loaded.sort(key=lambda item: item[0])
        with self._lock:
            for _, entry in loaded:
                self._insert(entry)


def _file_prefix(start_offset: int, segment_id: uuid.UUID) -> str:
    return f"{filename_prefix_from_offset(start_offset)}_{segment_id}"


def _tmp_path(path: Path) -> Path:
    return path.with_name(path.name + _TMP_SUFFIX)


def _write_index(cls: type[_Index], path: Path, base_offset: int, data: bytes) -> _Index:
    """Write an index through a temporary file, so a crash never leaves a torn file under the final name.
    Not fsynced: after a power loss a short index still reloads and still answers correctly (every floor
    entry it keeps is a real batch boundary), and anything malformed fails the sanity check and is dropped."""
    tmp = _tmp_path(path)
    tmp.write_bytes(data)
    index = cls(tmp, base_offset, _UNBOUNDED_INDEX_SIZE)
    index.sanity_check()
    index.rename_to(path)
    return index


def _read_entry(prefix: str, paths: dict[str, Path]) -> _Entry | None:
    """The cache entry a pair of files from an earlier run holds, or None if they are not a sound pair."""
    offset_path = paths.get(IndexType.OFFSET.value)
    time_path = paths.get(IndexType.TIMESTAMP.value)
    start, _, segment_id = prefix.partition("_")
    if offset_path is None or time_path is None:
        return None
    try:
        base_offset = int(start)
        entry_id = uuid.UUID(segment_id)
        if prefix != _file_prefix(base_offset, entry_id):
            return None
        offset_index = OffsetIndex(offset_path, base_offset, _UNBOUNDED_INDEX_SIZE)
        time_index = TimeIndex(time_path, base_offset, _UNBOUNDED_INDEX_SIZE)
        offset_index.sanity_check()
        time_index.sanity_check()
    except (ValueError, CorruptIndexError):
        return None
    size = offset_path.stat().st_size + time_path.stat().st_size
    return _Entry(entry_id, offset_index, time_index, size)
