"""Transactions and the remote tier (docs/transactions.md#tiered): each copied segment's transaction index goes
to the remote store under Kafka's name and comes back entry for entry; a read_committed read's aborted
transactions are collected from the remote segment read, the following remote segments, then the local log."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fake_rsm import FakeRemoteStorageManager, batch, build_log, upload_log
from storage_helpers import T0, TP, log_config, open_log

from tierlog.records.codec import build_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import iter_batches
from tierlog.replication.partition import RemoteFetchInfo
from tierlog.replication.replica_manager import RemoteLogReadResult
from tierlog.server.remote_log_tasks import RemoteLogStats, RemoteStorageReaderThreadPool
from tierlog.storage.log import Log
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.transaction_index import ABORTED_TXN_SIZE, AbortedTxn, TxnIndexSearchResult
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_index_cache import RemoteIndexCache
from tierlog.tiered.remote_log_manager import copy_candidates, copy_lag_bytes, segment_data
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataStore
from tierlog.tiered.remote_storage_manager import IndexType, RemoteResourceNotFoundError
from tierlog.tiered.remote_transactions import (
    AbortedTxnSearch,
    collect_remote_aborted_transactions,
    fetch_remote_aborted_txns,
)
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    decode_event,
    encode_event,
)

TOPIC_ID = uuid.UUID(int=0x7A7)


def _metadata(log: Log, segment_index: int, *, segment_id: int) -> RemoteLogSegmentMetadata:
    segment, next_segment = log.segments[segment_index], log.segments[segment_index + 1]
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, TP), uuid.UUID(int=segment_id)),
        start_offset=segment.base_offset,
        end_offset=next_segment.base_offset - 1,
        max_timestamp_ms=segment.max_timestamp_so_far,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_in_bytes=segment.size,
        segment_leader_epochs=((0, segment.base_offset),),
        state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
    )


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    """Three closed segments of five one-record batches each (offsets 0-4, 5-9, 10-14) and an empty active one."""
    log = build_log(tmp_path / "topic-0", [batch([i]) for i in range(15)], segment_bytes=450, index_interval_bytes=1)
    assert [s.base_offset for s in log.segments] == [0, 5, 10, 15], "the fixture's segment layout changed"
    yield log
    log.close()


def test_copy_uploads_the_txn_index_under_kafkas_name_and_it_comes_back_entry_for_entry(
    log: Log, tmp_path: Path
) -> None:
    aborted = [AbortedTxn(7, 1, 3, 1), AbortedTxn(8, 2, 4, 5)]
    for txn in aborted:
        log.segments[0].txn_index.append(txn)
    candidates = copy_candidates(log, -1, log.log_end_offset)
    assert [c.segment.base_offset for c in candidates] == [0, 5, 10]
    with FsspecRemoteStorageManager(f"file://{tmp_path / 'remote'}") as rsm:
        copied = []
        for index, candidate in enumerate(candidates):
            data = segment_data(log, candidate)
            metadata = _metadata(log, index, segment_id=index + 1)
            rsm.copy_log_segment_data(metadata, data)
            copied.append((metadata, data))
        first, second = copied[0], copied[1]
        # Only the segment holding an ABORT marker's entries has a `.txnindex` (Kafka creates it lazily).
        assert first[1].transaction_index == log.segments[0].txn_index.path
        assert second[1].transaction_index is None
        names = rsm.list_segment_objects()
        expected = f"{TP}-{TOPIC_ID}/{0:020d}-{first[0].segment_id.id}.txnindex"
        assert expected in names
        assert [name for name in names if name.endswith(".txnindex")] == [expected]
        raw = rsm.fetch_index(first[0], IndexType.TRANSACTION)
        assert raw == log.segments[0].txn_index.path.read_bytes()
        assert len(raw) == 2 * ABORTED_TXN_SIZE
        assert fetch_remote_aborted_txns(rsm, first[0]) == aborted
        assert fetch_remote_aborted_txns(rsm, second[0]) == []
        rsm.delete_log_segment_data(first[0])
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.fetch_index(first[0], IndexType.TRANSACTION)


def _segments(*ranges: tuple[int, int]) -> list[RemoteLogSegmentMetadata]:
    return [
        RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, TP), uuid.UUID(int=i + 1)),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=0,
            broker_id=0,
            event_timestamp_ms=0,
            segment_size_in_bytes=1,
            segment_leader_epochs=((0, start),),
        )
        for i, (start, end) in enumerate(ranges)
    ]


def test_search_goes_on_through_later_segments_until_an_entry_completes_it() -> None:
    seg_a, seg_b, seg_c, seg_d = _segments((0, 9), (10, 19), (20, 29), (30, 39))
    # pid 1 aborted [2, 12] (marker in b), pid 2 aborted [5, 25] (marker in c, LSO then 26), pid 3 aborted later.
    entries = {
        seg_a.segment_id: [],
        seg_b.segment_id: [AbortedTxn(1, 2, 12, 5)],
        seg_c.segment_id: [AbortedTxn(2, 5, 25, 26), AbortedTxn(3, 27, 28, 29)],
        seg_d.segment_id: [AbortedTxn(4, 1, 31, 32)],
    }
    consulted: list[RemoteLogSegmentMetadata] = []

    def aborted_txns_of(segment: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        consulted.append(segment)
        return entries[segment.segment_id]

    result = collect_remote_aborted_transactions(3, 9, iter([seg_a, seg_b, seg_c, seg_d]), aborted_txns_of)
    # pid 2's entry has LSO 26 >= 9: nothing aborted later started below 9, so d is never read.
    assert result == TxnIndexSearchResult([AbortedTxn(1, 2, 12, 5), AbortedTxn(2, 5, 25, 26)], True)
    assert consulted == [seg_a, seg_b, seg_c]


def test_search_that_runs_out_of_remote_segments_is_incomplete_and_the_local_log_finishes_it() -> None:
    (seg_a,) = _segments((0, 9))
    remote = collect_remote_aborted_transactions(0, 10, [seg_a], lambda _: [AbortedTxn(1, 0, 4, 0)])
    assert remote == TxnIndexSearchResult([AbortedTxn(1, 0, 4, 0)], False)
    search = AbortedTxnSearch(0, 10)
    assert not search.add([AbortedTxn(1, 0, 4, 0)])
    local_marker_txn = AbortedTxn(2, 8, 14, 15)
    asked: list[tuple[int, int]] = []

    def local(start: int, upper: int) -> list[AbortedTxn]:
        asked.append((start, upper))
        return [AbortedTxn(1, 0, 4, 0), local_marker_txn]

    assert search.with_local(local) == [AbortedTxn(1, 0, 4, 0), local_marker_txn]
    assert asked == [(0, 10)]
    complete = AbortedTxnSearch(0, 10)
    assert complete.add([AbortedTxn(1, 0, 4, 10)])
    assert complete.with_local(lambda start, upper: pytest.fail("the local log must not be read")) == [
        AbortedTxn(1, 0, 4, 10)
    ]


def test_overlapping_copies_of_a_segment_give_each_aborted_transaction_once() -> None:
    copy_1, copy_2 = _segments((0, 9), (0, 9))
    txn = AbortedTxn(1, 0, 4, 0)
    result = collect_remote_aborted_transactions(0, 10, [copy_1, copy_2], lambda _: [txn])
    assert result.aborted == [txn]


def test_index_cache_fetches_a_txn_index_once_and_forgets_it_with_its_segment(tmp_path: Path) -> None:
    log = build_log(tmp_path / "topic-0", [batch([i]) for i in range(10)], segment_bytes=450, index_interval_bytes=1)
    try:
        txn = AbortedTxn(9, 0, 3, 1)
        log.segments[0].txn_index.append(txn)
        rsm = FakeRemoteStorageManager()
        with_index, without_index = upload_log(log, rsm)
        cache = RemoteIndexCache(tmp_path / "cache", rsm, 1 << 20)
        try:
            assert cache.aborted_txns(with_index) == [txn]
            assert cache.aborted_txns(without_index) == []
            fetches = rsm.calls["fetch_index"]
            assert cache.aborted_txns(with_index) == [txn]
            assert cache.aborted_txns(without_index) == []
            assert rsm.calls["fetch_index"] == fetches, "served from memory the second time"
            cache.remove(with_index.segment_id.id)
            assert cache.aborted_txns(with_index) == [txn]
            assert rsm.calls["fetch_index"] == fetches + 1
        finally:
            cache.close()
    finally:
        log.close()


def test_index_cache_keeps_txn_indexes_within_its_bound(tmp_path: Path) -> None:
    rsm = FakeRemoteStorageManager()
    segments = _segments(*((10 * i, 10 * i + 9) for i in range(4)))
    # Room for two empty transaction indexes (64 bytes each), not three.
    cache = RemoteIndexCache(tmp_path / "cache", rsm, 150)
    try:
        for segment in itertools.chain(segments, segments[-2:]):
            assert cache.aborted_txns(segment) == []
        assert rsm.calls["fetch_index"] == 4, "the last two stayed cached"
        cache.aborted_txns(segments[0])
        assert rsm.calls["fetch_index"] == 5, "the first was evicted"
    finally:
        cache.close()


class TransactionalLog:
    """A log whose transactions' markers land in later segments than their records:
    segment 0: [0] txn of producer 1, [1] plain | segment 1: [2] plain, [3] ABORT 1 |
    segment 2: [4] txn of producer 2, [5] plain | segment 3: [6] ABORT 2 | active, empty.
    Segments 0-2 are in the remote tier, segment 3 only local."""

    ABORTED_1, ABORTED_2 = 1, 2

    def __init__(self, directory: Path) -> None:
        self.log = open_log(directory / "topic-0", log_config(segment_bytes=1 << 20))
        self.sequences: dict[int, int] = {}
        self._send(self.ABORTED_1)
        self._send()
        self.log.roll(T0)
        self._send()
        self._abort(self.ABORTED_1)
        self.log.roll(T0)
        self._send(self.ABORTED_2)
        self._send()
        self.log.roll(T0)
        self._abort(self.ABORTED_2)
        self.log.roll(T0)
        assert [s.base_offset for s in self.log.segments] == [0, 2, 4, 6, 7]
        self.rsm = FakeRemoteStorageManager()
        self.store = RemoteLogMetadataStore()
        self.segments = upload_log(self.log, self.rsm)[:3]
        for metadata in self.segments:
            self.store.apply(replace(metadata, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED))
            self.store.apply(
                RemoteLogSegmentMetadataUpdate(metadata.segment_id, T0, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)
            )

    def _send(self, producer_id: int = -1) -> None:
        transactional = producer_id >= 0
        records = build_batch(
            [(b"k", b"v", (), T0)],
            producer_id=producer_id,
            producer_epoch=0 if transactional else -1,
            base_sequence=0 if transactional else -1,
            transactional=transactional,
        )
        self.log.append_as_leader(bytearray(records), 0, T0)
        self.log.update_high_watermark(self.log.log_end_offset)

    def _abort(self, producer_id: int) -> None:
        marker = build_end_txn_marker_batch(producer_id, 0, EndTxnMarker(ControlRecordType.ABORT, 0), T0)
        self.log.append_as_leader(marker, 0, T0, AppendOrigin.COORDINATOR)
        self.log.update_high_watermark(self.log.log_end_offset)

    def read(
        self, tmp_path: Path, fetch_offset: int, *, read_committed: bool, read_ahead: Callable[[], bool] | None = None
    ) -> RemoteLogReadResult:
        """A consumer's fetch at `fetch_offset` served from the remote tier, as the ReplicaManager starts it. No
        read-ahead unless `read_ahead` is given: then the pool reads ahead as a broker's does, and stops once
        `read_ahead()` holds (checked for up to 10 s)."""

        async def main() -> RemoteLogReadResult:
            pool = RemoteStorageReaderThreadPool(
                self.store,
                self.rsm,
                RemoteLogStats(),
                lambda tp: self.log if tp == TP else None,
                index_cache_dir=tmp_path / "remote-log-index-cache",
                index_cache_bytes=1 << 20,
                reader_threads=2,
                prefetch_bytes=0 if read_ahead is None else 1 << 20,
            )
            answered: asyncio.Future[RemoteLogReadResult] = asyncio.get_running_loop().create_future()
            try:
                topic_id = self.segments[0].segment_id.topic_id_partition.topic_id
                info = RemoteFetchInfo(topic_id, fetch_offset, 1 << 20, True, 0, read_committed)
                pool.async_read(TP, info, answered.set_result)
                result = await asyncio.wait_for(answered, 10)
                deadline = asyncio.get_running_loop().time() + 10
                while read_ahead is not None and not read_ahead() and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.01)
                return result
            finally:
                await pool.stop()

        return asyncio.run(main())


def test_remote_read_committed_gets_the_aborted_transaction_whose_marker_is_in_a_later_remote_segment(
    tmp_path: Path,
) -> None:
    tier = TransactionalLog(tmp_path)
    try:
        result = tier.read(tmp_path, 0, read_committed=True)
        assert result.error is None and result.records is not None
        assert [(h.base_offset, h.last_offset) for h in iter_batches(result.records)] == [(0, 0), (1, 1)]
        assert result.aborted_transactions is not None
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in result.aborted_transactions] == [(1, 0, 3)]
        assert result.aborted_transactions == tier.log.collect_aborted_transactions(0, 2)
        # The segment's offset and time indexes, then the transaction index of segment 1 (complete there); segment
        # 0 was copied without one, which its metadata says.
        assert not tier.segments[0].has_txn_index and tier.segments[1].has_txn_index
        assert tier.rsm.calls["fetch_index"] == 3
    finally:
        tier.log.close()


def test_remote_read_committed_goes_on_to_the_local_log_when_the_remote_segments_run_out(tmp_path: Path) -> None:
    tier = TransactionalLog(tmp_path)
    try:
        result = tier.read(tmp_path, 4, read_committed=True)
        assert result.records is not None
        assert [(h.base_offset, h.last_offset) for h in iter_batches(result.records)] == [(4, 4), (5, 5)]
        assert result.aborted_transactions is not None
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in result.aborted_transactions] == [(2, 4, 6)]
    finally:
        tier.log.close()


def test_remote_read_uncommitted_carries_no_aborted_transactions(tmp_path: Path) -> None:
    tier = TransactionalLog(tmp_path)
    try:
        result = tier.read(tmp_path, 0, read_committed=False)
        assert result.records is not None and result.aborted_transactions is None
        assert tier.rsm.calls["fetch_index"] == 2, "the offset and time indexes only"
    finally:
        tier.log.close()


def test_a_segment_copied_without_a_txn_index_is_not_asked_for_one(tmp_path: Path) -> None:
    rsm = FakeRemoteStorageManager()
    (segment,) = _segments((0, 9))
    without = replace(segment, has_txn_index=False)
    assert fetch_remote_aborted_txns(rsm, without) == []
    cache = RemoteIndexCache(tmp_path / "cache", rsm, 1 << 20)
    try:
        assert cache.aborted_txns(without) == []
    finally:
        cache.close()
    assert rsm.calls["fetch_index"] == 0
    # Metadata written before the field existed says nothing: the index is asked for (and found missing).
    assert decode_event(encode_event(without)) == without
    fields = json.loads(encode_event(segment))
    del fields["has_txn_index"]
    older = decode_event(json.dumps(fields).encode())
    assert isinstance(older, RemoteLogSegmentMetadata) and older.has_txn_index
    assert fetch_remote_aborted_txns(rsm, older) == []
    assert rsm.calls["fetch_index"] == 1


def test_segments_at_or_past_an_open_transaction_are_not_copied_until_it_ends(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", log_config(segment_bytes=1 << 20))
    try:

        def append(producer_id: int = -1, marker: ControlRecordType | None = None) -> None:
            if marker is not None:
                records = build_end_txn_marker_batch(producer_id, 0, EndTxnMarker(marker, 0), T0)
                log.append_as_leader(records, 0, T0, AppendOrigin.COORDINATOR)
            else:
                transactional = producer_id >= 0
                batch = build_batch(
                    [(b"k", b"v", (), T0)],
                    producer_id=producer_id,
                    producer_epoch=0 if transactional else -1,
                    base_sequence=0 if transactional else -1,
                    transactional=transactional,
                )
                log.append_as_leader(bytearray(batch), 0, T0)
            log.update_high_watermark(log.log_end_offset)

        append()
        log.roll(T0)
        append()
        append(producer_id=5)  # offset 2: a transaction that stays open
        log.roll(T0)
        append()
        log.roll(T0)
        assert [s.base_offset for s in log.segments] == [0, 1, 3, 4]
        assert log.high_watermark == 4 and log.last_stable_offset == 2
        copy = [c.segment.base_offset for c in copy_candidates(log, -1, log.last_stable_offset)]
        assert copy == [0]
        assert copy_lag_bytes(log) == log.segments[0].size
        append(producer_id=5, marker=ControlRecordType.COMMIT)
        assert log.last_stable_offset == log.high_watermark == 5
        assert [c.segment.base_offset for c in copy_candidates(log, -1, log.last_stable_offset)] == [0, 1, 3]
    finally:
        log.close()


def test_a_remote_read_that_ends_its_segment_reads_ahead_the_next_segment_and_its_offset_index(tmp_path: Path) -> None:
    tier = TransactionalLog(tmp_path)
    following = tier.segments[1]

    def next_segment_read_ahead() -> bool:
        return tier.rsm.calls["fetch_index"] >= 4 and any(
            read[0] == following.segment_id.id for read in tier.rsm.log_reads
        )

    try:
        result = tier.read(tmp_path, 0, read_committed=False, read_ahead=next_segment_read_ahead)
        assert result.error is None and result.records is not None
        # The whole of segment 0 came back; the next segment's head was loaded and its indexes (offset and time,
        # which the index cache fetches together) fetched, both before any fetch asked for them.
        assert [h.last_offset for h in iter_batches(result.records)][-1] == tier.segments[0].end_offset
        assert next_segment_read_ahead()
        assert (following.segment_id.id, 0, following.segment_size_in_bytes) in tier.rsm.log_reads
    finally:
        tier.log.close()
