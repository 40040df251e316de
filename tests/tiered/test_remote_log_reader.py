"""RemoteLogReader: fetches from remote segments return what a local read of the same segment returns (whole
batches from the one holding the offset, bounded by max_bytes), sequential readers are served from chunks read
ahead, the chunk cache stays within its bound and forgets deleted segments, a failed read-ahead never fails a
later read, and timestamp searches follow Kafka's findOffsetByTimestamp across segments."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from fake_rsm import LOG_SUFFIX, FakeRemoteStorageManager, batch, build_log, upload_log
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierlog.records.record_batch import CompressionType, iter_batches
from tierlog.storage.file_records import TimestampAndOffset
from tierlog.storage.log import Log
from tierlog.tiered.remote_index_cache import RemoteIndexCache
from tierlog.tiered.remote_log_reader import RemoteLogReader, RemoteReadResult
from tierlog.tiered.remote_storage_manager import RemoteStorageError
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata

EPOCH = 3


def _local_read(log: Log, offset: int, max_bytes: int, min_one_message: bool) -> bytes:
    records = log.read(offset, max_bytes, None, min_one_message).records
    return b"" if records is None else records.read_bytes()


def _segment_bytes(rsm: FakeRemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> bytes:
    return rsm.objects[(metadata.segment_id.id, LOG_SUFFIX)]


def _holding(segments: list[RemoteLogSegmentMetadata], offset: int) -> RemoteLogSegmentMetadata:
    return next(m for m in segments if m.start_offset <= offset <= m.end_offset)


def _last_offset(records: bytes) -> int:
    return [header.last_offset for header in iter_batches(records)][-1]


_T = TypeVar("_T")


class InlineExecutor(Executor):
    """Runs each task at submit: the reader's read-aheads become deterministic."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:
            future.set_exception(error)
        return future


class Tier:
    """A log whose rolled segments are uploaded to a fake remote store, and a reader over them."""

    def __init__(self, directory: Path, batches: list[bytearray], segment_bytes: int, index_interval_bytes: int):
        self.log = build_log(
            directory / "topic-0",
            batches,
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            epoch=EPOCH,
        )
        self.rsm = FakeRemoteStorageManager()
        self.segments = upload_log(self.log, self.rsm)
        self.index_cache = RemoteIndexCache(directory / "remote-log-index-cache", self.rsm, 1 << 20)

    def reader(
        self,
        chunk_bytes: int = 1 << 20,
        prefetch_bytes: int = 0,
        cache_bytes: int = 1 << 22,
        loader: Executor | None = None,
    ) -> RemoteLogReader:
        """A reader whose ranged reads run in the calling thread unless `loader` is given: every load, read-ahead
        included, has happened when a call returns."""
        return RemoteLogReader(
            self.rsm, self.index_cache, chunk_bytes, cache_bytes, prefetch_bytes, loader=loader or InlineExecutor()
        )

    def close(self) -> None:
        self.index_cache.close()
        self.log.close()


def _mixed_batches(count: int) -> list[bytearray]:
    """Batches of 1 to 4 records and varying sizes; record at offset o has timestamp 1000 + 10 * o."""
    batches, offset = [], 0
    for index in range(count):
        records = index % 4 + 1
        batches.append(batch([1000 + 10 * (offset + i) for i in range(records)], value_size=8 + 13 * (index % 5)))
        offset += records
    return batches


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[Tier]:
    """Three segments of up to 2 KB; an index entry every few batches, so most reads skip batches first."""
    tier = Tier(tmp_path, _mixed_batches(30), segment_bytes=2048, index_interval_bytes=300)
    assert len(tier.segments) == 3
    assert all(segment.offset_index.entries >= 2 for segment in tier.log.segments[:2])
    yield tier
    tier.close()


def test_a_read_at_any_offset_starts_with_the_batch_holding_it_and_holds_whole_batches_only(tier: Tier) -> None:
    reader = tier.reader()
    for metadata in tier.segments:
        for offset in range(metadata.start_offset, metadata.end_offset + 1):
            records = reader.read(metadata, offset, 700, False).records
            headers = list(iter_batches(records))  # raises on a partial batch
            assert headers[0].base_offset <= offset <= headers[0].last_offset
            assert records == _local_read(tier.log, offset, 700, False)


def test_max_bytes_bounds_a_read_to_the_whole_batches_that_fit(tier: Tier) -> None:
    reader = tier.reader()
    metadata = tier.segments[0]
    whole = _segment_bytes(tier.rsm, metadata)
    for max_bytes in range(0, metadata.segment_size_in_bytes + 200, 37):
        records = reader.read(metadata, 0, max_bytes, False).records
        assert len(records) <= max_bytes
        assert whole.startswith(records)
        assert records == _local_read(tier.log, 0, max_bytes, False)
    assert reader.read(metadata, 0, 1 << 30, False).records == whole


def test_min_one_message_returns_a_first_batch_larger_than_max_bytes_and_the_chunk_whole(tmp_path: Path) -> None:
    small, large = batch([1000]), batch([1001, 1002, 1003], value_size=3000)
    tier = Tier(tmp_path, [small, large, small], segment_bytes=1 << 20, index_interval_bytes=0)
    try:
        reader = tier.reader(chunk_bytes=256)
        metadata = tier.segments[0]
        result = reader.read(metadata, 2, 100, True)
        assert [(h.base_offset, h.last_offset) for h in iter_batches(result.records)] == [(1, 3)]
        assert len(result.records) == len(large) > 256
        assert result.records == _local_read(tier.log, 2, 100, True)
        assert reader.read(metadata, 2, 100, False) == RemoteReadResult(b"", None)
        # From offset 0 the oversized batch does not fit after the first: only the first comes.
        first = reader.read(metadata, 0, len(small) + 100, True).records
        assert [h.base_offset for h in iter_batches(first)] == [0]
    finally:
        tier.close()


def test_an_offset_past_the_segment_end_reads_nothing_and_fetches_nothing(tier: Tier) -> None:
    reader = tier.reader()
    metadata = tier.segments[0]
    assert reader.read(metadata, metadata.end_offset + 1, 1 << 20, True) == RemoteReadResult(b"", None)
    assert tier.rsm.calls["fetch_log_segment"] == 0


def test_next_position_follows_the_last_batch_and_is_none_at_the_segment_end(tier: Tier) -> None:
    reader = tier.reader()
    metadata = tier.segments[0]
    result = reader.read(metadata, 0, 500, False)
    assert result.next_position == len(result.records)
    last = reader.read(metadata, metadata.end_offset, 1 << 20, False)
    assert last.records and last.next_position is None
    assert _segment_bytes(tier.rsm, metadata).endswith(last.records)


def _read_through(reader: RemoteLogReader, metadata: RemoteLogSegmentMetadata, max_bytes: int) -> bytes:
    """Read the segment front to back as a consumer does, each fetch at the offset after the last one."""
    offset, served = metadata.start_offset, b""
    while offset <= metadata.end_offset:
        records = bytes(reader.read(metadata, offset, max_bytes, True).records)
        served += records
        offset = _last_offset(records) + 1
    return served


def test_sequential_reads_are_served_from_chunks_read_ahead_each_fetched_once(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=400, prefetch_bytes=400)
    metadata = tier.segments[0]
    size = metadata.segment_size_in_bytes
    assert _read_through(reader, metadata, 150) == _segment_bytes(tier.rsm, metadata)
    segment_id = metadata.segment_id.id
    # One ranged read per aligned chunk, each once; the first read loaded the first chunk, read-ahead the rest.
    assert tier.rsm.log_reads == [(segment_id, start, min(start + 400, size)) for start in range(0, size, 400)]
    assert reader.bytes_fetched == size
    assert reader.bytes_prefetched == size - 400
    assert reader.bytes_served_from_cache >= size - 400


def test_prefetching_bytes_already_in_memory_fetches_nothing(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=400, prefetch_bytes=400)
    metadata = tier.segments[0]
    result = reader.read(metadata, 0, 100, True)
    assert result.next_position is not None
    calls = tier.rsm.calls["fetch_log_segment"]
    reader.prefetch(metadata, result.next_position)
    assert tier.rsm.calls["fetch_log_segment"] == calls


def test_without_read_ahead_or_cache_every_read_goes_to_remote_storage(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=400, prefetch_bytes=0, cache_bytes=0)
    metadata = tier.segments[0]
    first = reader.read(metadata, 0, 150, True)
    assert first.next_position is not None
    reader.read(metadata, _last_offset(bytes(first.records)) + 1, 150, True)
    assert tier.rsm.calls["fetch_log_segment"] == 2
    assert reader.bytes_served_from_cache == 0 and reader.bytes_prefetched == 0


def test_the_chunk_cache_keeps_the_most_recent_chunks_within_its_bound(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=256, prefetch_bytes=512, cache_bytes=600)
    metadata = tier.segments[0]
    segment_id = metadata.segment_id.id
    offset = metadata.start_offset
    while offset <= metadata.end_offset:
        records = bytes(reader.read(metadata, offset, 100, True).records)
        assert reader.chunks.size_bytes <= 600
        offset = _last_offset(records) + 1
    last_chunk = (metadata.segment_size_in_bytes - 1) // 256
    # Two chunks of 256 fit in 600 bytes (three would not): the last two of the segment stay.
    assert reader.chunks.keys() == [(segment_id, last_chunk - 1), (segment_id, last_chunk)]
    # The first chunk was evicted: reading it again asks the store again.
    calls = tier.rsm.calls["fetch_log_segment"]
    assert reader.read(metadata, 0, 100, True).records == _local_read(tier.log, 0, 100, True)
    assert tier.rsm.calls["fetch_log_segment"] > calls


def test_a_read_across_many_chunks_loads_them_in_parallel_and_reassembles_them(tier: Tier) -> None:
    metadata = tier.segments[0]
    size = metadata.segment_size_in_bytes
    chunks = (size + 99) // 100
    tier.index_cache.lookup_offset(metadata, 0)  # the gate below holds index fetches too
    with ThreadPoolExecutor(chunks) as loader:
        reader = tier.reader(chunk_bytes=100, loader=loader)
        tier.rsm.gate = threading.Event()
        answers: list[bytes] = []
        reading = threading.Thread(target=lambda: answers.append(bytes(reader.read(metadata, 0, size, True).records)))
        reading.start()
        # Every chunk's ranged read is in flight before any returns.
        deadline = time.monotonic() + 10
        while tier.rsm.calls["fetch_log_segment"] < chunks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tier.rsm.calls["fetch_log_segment"] == chunks
        tier.rsm.gate.set()
        reading.join(10)
    # Chunk boundaries every 100 bytes fall inside batches, and the last chunk is shorter: the bytes are the same.
    assert answers == [_segment_bytes(tier.rsm, metadata)]
    assert size % 100 != 0
    # A fetch ending mid-segment, from an offset inside it, cuts at a batch boundary as a local read does.
    middle = (metadata.start_offset + metadata.end_offset) // 2
    with ThreadPoolExecutor(4) as loader:
        reader = tier.reader(chunk_bytes=64, loader=loader)
        assert reader.read(metadata, middle, 700, True).records == _local_read(tier.log, middle, 700, True)


def test_a_deleted_segments_chunks_and_positions_are_dropped(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=400, prefetch_bytes=800)
    deleted, kept = tier.segments[0], tier.segments[1]
    reader.read(deleted, deleted.start_offset, 150, True)
    reader.read(kept, kept.start_offset, 150, True)
    before = reader.chunks.size_bytes
    reader.forget_segment(deleted.segment_id.id)
    assert {key[0] for key in reader.chunks.keys()}  # noqa: SIM118 == {kept.segment_id.id}
    assert reader.chunks.size_bytes < before
    calls = tier.rsm.calls["fetch_log_segment"]
    assert reader.read(deleted, deleted.start_offset, 150, True).records == _local_read(
        tier.log, deleted.start_offset, 150, True
    )
    assert tier.rsm.calls["fetch_log_segment"] > calls


def test_a_failed_read_ahead_is_not_kept_and_the_read_fetches_the_chunk_itself(tier: Tier) -> None:
    reader = tier.reader(chunk_bytes=400, prefetch_bytes=400)
    metadata = tier.segments[0]
    segment_id = metadata.segment_id.id
    tier.rsm.fail_next("fetch_log_segment", RemoteStorageError("store unreachable"))
    reader.prefetch(metadata, 0)
    assert (segment_id, 0) not in reader.chunks.keys()  # noqa: SIM118
    assert reader.read(metadata, 0, 150, True).records == _local_read(tier.log, 0, 150, True)


def test_a_read_waiting_on_a_read_ahead_that_fails_fetches_the_chunk_itself(tier: Tier) -> None:
    metadata = tier.segments[0]
    with ThreadPoolExecutor(2) as loader:
        reader = tier.reader(chunk_bytes=400, prefetch_bytes=400, loader=loader)
        tier.index_cache.lookup_offset(metadata, 0)
        tier.rsm.gate = threading.Event()
        tier.rsm.fail_next("fetch_log_segment", RemoteStorageError("store unreachable"))
        reader.prefetch(metadata, 0)
        assert tier.rsm.fetch_started.wait(10)
        answers: list[bytes] = []
        reading = threading.Thread(target=lambda: answers.append(bytes(reader.read(metadata, 0, 150, True).records)))
        reading.start()
        # Whether the read joins the read-ahead in flight or comes after its failure, it answers.
        tier.rsm.gate.set()
        reading.join(10)
    assert answers == [_local_read(tier.log, 0, 150, True)]
    # The failed read-ahead of the first chunk (the fake records only reads that succeed), the read's own ranged
    # read of it, then the read-ahead of the second chunk.
    assert tier.rsm.calls["fetch_log_segment"] == 3
    assert [start for _, start, _ in tier.rsm.log_reads] == [0, 400]


def test_a_remote_storage_error_propagates_and_the_next_read_succeeds(tier: Tier) -> None:
    reader = tier.reader()
    metadata = tier.segments[1]
    tier.rsm.fail_next("fetch_log_segment", RemoteStorageError("store unreachable"))
    with pytest.raises(RemoteStorageError):
        reader.read(metadata, metadata.start_offset, 1000, True)
    assert reader.read(metadata, metadata.start_offset, 1000, True).records == _local_read(
        tier.log, metadata.start_offset, 1000, True
    )


# Timestamp search: offsets 0-11 (first segment) carry 1000 + 10 * offset, offsets 12-23 (second) 2000 + ...


@pytest.fixture
def timed(tmp_path: Path) -> Iterator[Tier]:
    batches = [batch([base + 10 * i for i in range(3)]) for base in (1000, 1030, 1060, 1090, 2000, 2030, 2060, 2090)]
    tier = Tier(tmp_path, batches, segment_bytes=4 * len(batches[0]), index_interval_bytes=0)
    assert [(m.start_offset, m.end_offset, m.max_timestamp_ms) for m in tier.segments] == [
        (0, 11, 1110),
        (12, 23, 2110),
    ]
    yield tier
    tier.close()


@pytest.mark.parametrize(
    ("target", "start_offset", "expected"),
    [
        pytest.param(0, 0, (1000, 0), id="below-both-segments"),
        pytest.param(1000, 0, (1000, 0), id="first-timestamp"),
        pytest.param(1001, 0, (1010, 1), id="next-record-in-the-first-batch"),
        pytest.param(1055, 0, (1060, 6), id="inside-the-first-segment"),
        pytest.param(1500, 0, (2000, 12), id="between-the-segments"),
        pytest.param(2110, 0, (2110, 23), id="last-timestamp"),
        pytest.param(2111, 0, None, id="above-both-segments"),
        pytest.param(0, 5, (1050, 5), id="start-offset-inside-a-batch"),
        pytest.param(1055, 14, (2020, 14), id="start-offset-past-the-first-segment"),
        pytest.param(0, 24, None, id="start-offset-past-both-segments"),
    ],
)
def test_timestamp_search_across_two_segments(
    timed: Tier, target: int, start_offset: int, expected: tuple[int, int] | None
) -> None:
    found = timed.reader().find_offset_by_timestamp(timed.segments, target, start_offset)
    assert found == (None if expected is None else TimestampAndOffset(*expected, EPOCH))


def test_timestamp_search_looks_only_at_the_segments_it_is_given(timed: Tier) -> None:
    reader = timed.reader()
    assert reader.find_offset_by_timestamp(timed.segments[1:], 0, 0) == TimestampAndOffset(2000, 12, EPOCH)
    assert reader.find_offset_by_timestamp(timed.segments[:1], 1500, 0) is None


def test_timestamp_search_moves_on_when_a_segment_has_no_match_at_or_after_the_start_offset(tmp_path: Path) -> None:
    # The first segment's largest timestamp (5000, at offset 0) reaches the target, but no record from offset 1 on
    # does, so the answer comes from the second segment; records out of time order are searched in offset order.
    batches = [batch([5000, 1000, 1001]), batch([1002, 1003, 1004]), batch([6000, 6001, 6002])]
    tier = Tier(tmp_path, batches, segment_bytes=2 * len(batches[0]), index_interval_bytes=0)
    try:
        reader = tier.reader()
        assert len(tier.segments) == 2
        assert reader.find_offset_by_timestamp(tier.segments, 4000, 1) == TimestampAndOffset(6000, 6, EPOCH)
        assert reader.find_offset_by_timestamp(tier.segments, 4000, 0) == TimestampAndOffset(5000, 0, EPOCH)
        assert reader.find_offset_by_timestamp(tier.segments, 1001, 0) == TimestampAndOffset(5000, 0, EPOCH)
        assert reader.find_offset_by_timestamp(tier.segments, 1001, 1) == TimestampAndOffset(1001, 2, EPOCH)
    finally:
        tier.close()


# Properties over random layouts: the remote tier answers as the local log does.

_layouts = st.lists(
    st.tuples(
        st.lists(st.integers(0, 5000), min_size=1, max_size=5),  # record timestamps
        st.integers(0, 300),  # value size
        st.booleans(),  # gzip
    ),
    min_size=1,
    max_size=25,
)


def _build(directory: Path, layout: list[tuple[list[int], int, bool]], segment_bytes: int, interval: int) -> Tier:
    batches = [
        batch(timestamps, value_size=size, compression=CompressionType.GZIP if gzip else CompressionType.NONE)
        for timestamps, size, gzip in layout
    ]
    return Tier(directory, batches, max(segment_bytes, *map(len, batches)), interval)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=_layouts,
    segment_bytes=st.integers(200, 4000),
    interval=st.integers(0, 800),
    chunk_bytes=st.integers(32, 2048),
    prefetch_bytes=st.integers(0, 4096),
    cache_bytes=st.integers(0, 8192),
    data=st.data(),
)
def test_remote_reads_return_the_bytes_a_local_read_returns(
    layout: list[tuple[list[int], int, bool]],
    segment_bytes: int,
    interval: int,
    chunk_bytes: int,
    prefetch_bytes: int,
    cache_bytes: int,
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        tier = _build(Path(directory), layout, segment_bytes, interval)
        try:
            # One reader for every draw: its resume positions and cached chunks must never change an answer.
            reader = tier.reader(chunk_bytes, prefetch_bytes, cache_bytes)
            for _ in range(8):
                offset = data.draw(st.integers(0, tier.log.log_end_offset - 1), label="offset")
                max_bytes = data.draw(st.integers(0, 5000), label="max_bytes")
                min_one_message = data.draw(st.booleans(), label="min_one_message")
                metadata = _holding(tier.segments, offset)
                result = reader.read(metadata, offset, max_bytes, min_one_message)
                assert result.records == _local_read(tier.log, offset, max_bytes, min_one_message)
                if result.next_position is not None and data.draw(st.booleans(), label="prefetch"):
                    reader.prefetch(metadata, result.next_position)
        finally:
            tier.close()


def _offsets_and_timestamps(tier: Tier) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record uploaded, in offset order."""
    records = []
    for metadata in tier.segments:
        whole = _segment_bytes(tier.rsm, metadata)
        for header in iter_batches(whole):
            batch_bytes = whole[header.position : header.position + header.size_in_bytes]
            records.extend((record.offset, record.timestamp) for record in DefaultRecordBatch(batch_bytes))
    return records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=_layouts,
    segment_bytes=st.integers(200, 4000),
    interval=st.integers(0, 800),
    data=st.data(),
)
def test_timestamp_search_finds_the_first_record_at_or_after_the_target_and_start_offset(
    layout: list[tuple[list[int], int, bool]], segment_bytes: int, interval: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        tier = _build(Path(directory), layout, segment_bytes, interval)
        try:
            reader = tier.reader(chunk_bytes=128)
            records = _offsets_and_timestamps(tier)
            for _ in range(8):
                target = data.draw(st.integers(0, 5001), label="target")
                start_offset = data.draw(st.integers(0, tier.log.log_end_offset), label="start_offset")
                expected = next(
                    (
                        TimestampAndOffset(ts, offset, EPOCH)
                        for offset, ts in records
                        if ts >= target and offset >= start_offset
                    ),
                    None,
                )
                assert reader.find_offset_by_timestamp(tier.segments, target, start_offset) == expected
                if start_offset == 0:
                    assert tier.log.fetch_offset_by_timestamp(target) == expected
        finally:
            tier.close()
