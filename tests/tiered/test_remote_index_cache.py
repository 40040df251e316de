"""RemoteIndexCache: remote offset and time indexes cached on disk and in memory, LRU by total bytes, reloaded
after a restart, fetched once however many threads miss at once, and left consistent when a fetch fails."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_rsm import FakeRemoteStorageManager, batch, build_log, upload_log

from tierlog.storage.errors import CorruptIndexError
from tierlog.storage.log import Log
from tierlog.testing.local_cluster import wait_until
from tierlog.tiered.remote_index_cache import RemoteIndexCache
from tierlog.tiered.remote_storage_manager import IndexType, RemoteResourceNotFoundError, RemoteStorageError
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

BOUNDED_WAIT_S = 10.0


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    """Three segments of 12 two-record batches each, timestamps 1000 + 10 * offset, an index entry every
    couple of batches."""
    batches = [batch([1000 + 10 * offset, 1000 + 10 * (offset + 1)]) for offset in range(0, 72, 2)]
    log = build_log(tmp_path / "topic-0", batches, segment_bytes=12 * len(batches[0]), index_interval_bytes=150)
    yield log
    log.close()


@pytest.fixture
def rsm() -> FakeRemoteStorageManager:
    return FakeRemoteStorageManager()


@pytest.fixture
def segments(log: Log, rsm: FakeRemoteStorageManager) -> list[RemoteLogSegmentMetadata]:
    uploaded = upload_log(log, rsm)
    assert len(uploaded) == 3
    return uploaded


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def cache(cache_dir: Path, rsm: FakeRemoteStorageManager) -> RemoteIndexCache:
    """A cache far larger than the three segments' indexes."""
    return RemoteIndexCache(cache_dir, rsm, 1 << 20)


def _entry_size(rsm: FakeRemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> int:
    return sum(len(rsm.objects[(metadata.segment_id.id, t.value)]) for t in (IndexType.OFFSET, IndexType.TIMESTAMP))


def _cache_files(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()}


def _file_names(metadata: RemoteLogSegmentMetadata) -> set[str]:
    prefix = f"{metadata.start_offset:020d}_{metadata.segment_id.id}"
    return {prefix + ".index", prefix + ".timeindex"}


def _lookups_during_one_held_fetch(
    rsm: FakeRemoteStorageManager,
    cache: RemoteIndexCache,
    lookups: list[Callable[[], object]],
    while_held: Callable[[], object] = lambda: None,
) -> None:
    """Run each of `lookups` in a thread of its own while the fake holds the first index fetch; once every thread
    but the fetching one has found the load in progress and waits on it, run `while_held`, release the fetch and
    join the threads."""
    rsm.gate = threading.Event()
    threads = [threading.Thread(target=lookup) for lookup in lookups]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: rsm.fetch_started.is_set() and cache.hits == len(lookups) - 1,
        BOUNDED_WAIT_S,
        f"{len(lookups) - 1} threads waiting on one fetch",
        interval_s=0.001,
    )
    while_held()
    rsm.gate.set()
    for thread in threads:
        thread.join(BOUNDED_WAIT_S)


def test_lookups_answer_as_the_local_indexes_do(
    cache: RemoteIndexCache, log: Log, segments: list[RemoteLogSegmentMetadata]
) -> None:
    for segment, metadata in zip(log.segments, segments, strict=False):
        assert segment.offset_index.entries > 0 and segment.time_index.entries > 0
        for offset in range(metadata.start_offset - 1, metadata.end_offset + 2):
            assert cache.lookup_offset(metadata, offset) == segment.offset_index.lookup(offset).position
        for timestamp in range(900, 1800, 5):
            assert cache.lookup_timestamp(metadata, timestamp) == segment.time_index.lookup(timestamp).offset


def test_without_a_floor_entry_lookups_fall_back_to_the_segment_start(
    cache: RemoteIndexCache, segments: list[RemoteLogSegmentMetadata]
) -> None:
    second = segments[1]
    assert cache.lookup_offset(second, second.start_offset) == 0
    assert cache.lookup_timestamp(second, 0) == second.start_offset


def test_a_miss_fetches_both_indexes_once_and_writes_them_under_their_cache_names(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first = segments[0]
    for offset in range(first.start_offset, first.end_offset + 1):
        cache.lookup_offset(first, offset)
    cache.lookup_timestamp(first, 1050)
    assert rsm.calls["fetch_index"] == 2
    assert (cache.misses, cache.hits) == (1, first.end_offset - first.start_offset + 1)
    assert _cache_files(cache_dir) == _file_names(first)
    for name in _file_names(first):
        suffix = "." + name.rsplit(".", 1)[1]
        assert (cache_dir / name).read_bytes() == rsm.objects[(first.segment_id.id, suffix)]
    assert (cache.entries, cache.size_bytes) == (1, _entry_size(rsm, first))


def test_least_recently_used_segments_are_evicted_when_the_total_size_is_exceeded(
    cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    a, b, c = segments
    bound = _entry_size(rsm, a) + _entry_size(rsm, c)
    cache = RemoteIndexCache(cache_dir, rsm, bound)
    cache.lookup_offset(a, 0)
    cache.lookup_offset(b, b.start_offset)
    cache.lookup_offset(a, 1)  # a is now more recently used than b
    cache.lookup_offset(c, c.start_offset)
    assert cache.entries == 2
    assert cache.size_bytes == _entry_size(rsm, a) + _entry_size(rsm, c) <= bound
    assert _cache_files(cache_dir) == _file_names(a) | _file_names(c)
    fetches = rsm.calls["fetch_index"]
    cache.lookup_offset(a, 2)
    assert rsm.calls["fetch_index"] == fetches
    cache.lookup_offset(b, b.start_offset)
    assert rsm.calls["fetch_index"] == fetches + 2


def test_an_entry_larger_than_the_whole_cache_answers_its_lookup_but_is_not_kept(
    cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first = segments[0]
    cache = RemoteIndexCache(cache_dir, rsm, _entry_size(rsm, first) - 1)
    assert cache.lookup_timestamp(first, 2000) > first.start_offset
    assert (cache.entries, cache.size_bytes) == (0, 0)
    assert _cache_files(cache_dir) == set()


def test_a_new_cache_reloads_the_files_a_previous_one_wrote(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    expected = {m.segment_id.id: [cache.lookup_offset(m, offset) for offset in range(72)] for m in segments[:2]}
    cache.close()
    reloaded = RemoteIndexCache(cache_dir, FakeRemoteStorageManager(), 1 << 20)
    assert reloaded.entries == 2
    assert reloaded.size_bytes == sum(_entry_size(rsm, m) for m in segments[:2])
    for metadata in segments[:2]:
        assert [reloaded.lookup_offset(metadata, offset) for offset in range(72)] == expected[metadata.segment_id.id]
    assert reloaded.misses == 0


def test_reloading_keeps_the_newest_files_within_the_bound(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    for metadata in segments:
        cache.lookup_offset(metadata, metadata.start_offset)
    cache.close()
    newest = segments[-1]
    reloaded = RemoteIndexCache(cache_dir, rsm, _entry_size(rsm, newest))
    assert reloaded.entries == 1
    assert _cache_files(cache_dir) == _file_names(newest)


def test_start_up_deletes_temporary_orphaned_and_corrupt_index_files(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    good, orphaned, corrupt = segments
    for metadata in segments:
        cache.lookup_offset(metadata, metadata.start_offset)
    cache.close()
    orphan_time_index = next(name for name in _file_names(orphaned) if name.endswith(".timeindex"))
    (cache_dir / orphan_time_index).unlink()
    corrupt_index = next(name for name in _file_names(corrupt) if name.endswith(".index"))
    (cache_dir / corrupt_index).write_bytes(b"\x00" * 7)
    (cache_dir / (corrupt_index + ".tmp")).write_bytes(b"torn")
    reloaded = RemoteIndexCache(cache_dir, rsm, 1 << 20)
    assert reloaded.entries == 1
    assert _cache_files(cache_dir) == _file_names(good)
    fetches = rsm.calls["fetch_index"]
    assert reloaded.lookup_offset(corrupt, corrupt.end_offset) > 0
    assert rsm.calls["fetch_index"] == fetches + 2


def test_concurrent_misses_on_one_segment_fetch_its_indexes_once(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first = segments[0]
    results: list[int] = []
    _lookups_during_one_held_fetch(
        rsm, cache, [lambda: results.append(cache.lookup_offset(first, first.end_offset))] * 8
    )
    assert results == [cache.lookup_offset(first, first.end_offset)] * 8
    assert rsm.calls["fetch_index"] == 2
    assert cache.misses == 1


def test_a_failed_fetch_propagates_to_every_waiting_thread_and_caches_nothing(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first = segments[0]
    rsm.fail_next("fetch_index", RemoteStorageError("store unreachable"))
    errors: list[BaseException] = []

    def lookup() -> None:
        try:
            cache.lookup_offset(first, 0)
        except RemoteStorageError as e:
            errors.append(e)

    _lookups_during_one_held_fetch(rsm, cache, [lookup] * 3)
    assert [str(e) for e in errors] == ["store unreachable"] * 3
    assert (cache.entries, cache.size_bytes) == (0, 0)
    assert _cache_files(cache_dir) == set()
    rsm.gate = None
    assert cache.lookup_offset(first, first.end_offset) > 0
    assert cache.entries == 1


def _without_time_index(rsm: FakeRemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> None:
    del rsm.objects[(metadata.segment_id.id, IndexType.TIMESTAMP.value)]


def _with_malformed_offset_index(rsm: FakeRemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> None:
    rsm.objects[(metadata.segment_id.id, IndexType.OFFSET.value)] = b"\x00\x00\x00\x05\x00\x00\x00\x10" * 2


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        # The offset index fetched first must not stay behind when the time index is missing.
        pytest.param(_without_time_index, RemoteResourceNotFoundError, id="missing time index"),
        pytest.param(_with_malformed_offset_index, CorruptIndexError, id="malformed offset index"),
    ],
)
def test_indexes_that_cannot_be_used_are_refused_and_nothing_is_cached(
    cache: RemoteIndexCache,
    cache_dir: Path,
    rsm: FakeRemoteStorageManager,
    segments: list[RemoteLogSegmentMetadata],
    damage: Callable[[FakeRemoteStorageManager, RemoteLogSegmentMetadata], None],
    error: type[Exception],
) -> None:
    first = segments[0]
    damage(rsm, first)
    with pytest.raises(error):
        cache.lookup_offset(first, 0)
    assert (cache.entries, _cache_files(cache_dir)) == (0, set())


def test_remove_forgets_a_segment_and_deletes_its_files(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first, second = segments[:2]
    cache.lookup_offset(first, 0)
    cache.lookup_offset(second, second.start_offset)
    cache.remove(first.segment_id.id)
    assert (cache.entries, cache.size_bytes) == (1, _entry_size(rsm, second))
    assert _cache_files(cache_dir) == _file_names(second)


def test_a_segment_removed_while_its_indexes_are_fetched_is_not_cached(
    cache: RemoteIndexCache, cache_dir: Path, rsm: FakeRemoteStorageManager, segments: list[RemoteLogSegmentMetadata]
) -> None:
    first = segments[0]
    results: list[int] = []
    _lookups_during_one_held_fetch(
        rsm,
        cache,
        [lambda: results.append(cache.lookup_offset(first, first.end_offset))],
        while_held=lambda: cache.remove(first.segment_id.id),
    )
    assert results and results[0] > 0
    assert (cache.entries, cache.size_bytes, _cache_files(cache_dir)) == (0, 0, set())


def test_a_closed_cache_refuses_lookups_and_keeps_its_files(
    cache: RemoteIndexCache, cache_dir: Path, segments: list[RemoteLogSegmentMetadata]
) -> None:
    cache.lookup_offset(segments[0], 0)
    cache.close()
    with pytest.raises(RuntimeError):
        cache.lookup_offset(segments[0], 0)
    assert _cache_files(cache_dir) == _file_names(segments[0])
