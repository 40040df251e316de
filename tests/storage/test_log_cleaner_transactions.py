"""Compaction of logs holding transactions (docs/transactions.md#compaction), as Kafka's cleaner: the batches of
aborted transactions go, markers stay while their transaction has a batch left and go only after their delete
horizon, the transaction index follows the markers kept, and nothing at or past the first unstable offset is
cleaned."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import open_log

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_raw_records, encode_raw_batch
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, build_end_txn_marker_batch
from tierlog.records.record_batch import RecordBatchHeader, read_header
from tierlog.storage.log import Log
from tierlog.storage.log_cleaner import CleanedGroup, CleanerConfig, LogCleaner
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.segment import CLEANED_FILE_SUFFIX, DELETED_FILE_SUFFIX, SWAP_FILE_SUFFIX, LogSegment
from tierlog.storage.transaction_index import AbortedTxn

T0 = 1_700_000_000_000
DAY_MS = 86_400_000
TP = TopicPartition("compacted-txn", 0)
TOPIC_ID = uuid.UUID(int=19)
COMMITTER, ABORTER = 1001, 1002


def new_log(log_dir: Path, segment_bytes: int = 4096) -> tuple[LogManager, Log, LogCleaner]:
    manager = LogManager([log_dir], {})
    manager.startup({}, T0)
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": str(segment_bytes),
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": str(DAY_MS),
    }
    log = manager.get_or_create_log(TP, TOPIC_ID, config, T0)
    return manager, log, LogCleaner(CleanerConfig(dedupe_buffer_size=1 << 20), manager)


class Producers:
    """Appends as a broker leader does, moving the HW to the log end after each append (all replicas in sync)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.sequences: dict[int, int] = {}

    def send(self, records: list[tuple[bytes, bytes | None]], producer_id: int = -1, now_ms: int = T0) -> int:
        transactional = producer_id >= 0
        sequence = self.sequences.get(producer_id, 0)
        batch = build_batch(
            [(key, value, (), now_ms) for key, value in records],
            producer_id=producer_id,
            producer_epoch=0 if transactional else -1,
            base_sequence=sequence if transactional else -1,
            transactional=transactional,
        )
        if transactional:
            self.sequences[producer_id] = sequence + len(records)
        return self._append(bytearray(batch), AppendOrigin.CLIENT)

    def end(self, producer_id: int, committed: bool, now_ms: int = T0) -> int:
        control_type = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
        marker = build_end_txn_marker_batch(producer_id, 0, EndTxnMarker(control_type, 0), now_ms)
        return self._append(marker, AppendOrigin.COORDINATOR)

    def _append(self, batch: bytearray, origin: AppendOrigin) -> int:
        info = self.log.append_as_leader(batch, 0, T0, origin)
        self.log.update_high_watermark(self.log.log_end_offset)
        return info.first_offset

    def roll(self, now_ms: int = T0) -> None:
        self.log.roll(now_ms)
        self.log.update_high_watermark(self.log.log_end_offset)


@dataclass(frozen=True)
class Batch:
    header: RecordBatchHeader
    data: bytes

    @property
    def summary(self) -> tuple[int, int, int, bool, list[tuple[bytes | None, bytes | None]]]:
        records = decode_raw_records(self.data, self.header)
        return (
            self.header.base_offset,
            self.header.last_offset,
            self.header.producer_id,
            self.header.is_control,
            [(r.key, r.value) for r in records],
        )


def batches(log: Log, segment_index: int = 0) -> list[Batch]:
    segment = log.segments[segment_index]
    data = os.pread(segment.file.fileno(), segment.size, 0)
    out, position = [], 0
    while position < len(data):
        header = read_header(data, position)
        out.append(Batch(header, data[position : position + header.size_in_bytes]))
        position += header.size_in_bytes
    return out


def commit_marker() -> tuple[bytes, bytes]:
    # Control record key: version 0, type; value: version 0, coordinator epoch 0.
    return (b"\x00\x00\x00" + bytes([ControlRecordType.COMMIT]), b"\x00\x00\x00\x00\x00\x00")


def abort_marker() -> tuple[bytes, bytes]:
    return (b"\x00\x00\x00" + bytes([ControlRecordType.ABORT]), b"\x00\x00\x00\x00\x00\x00")


def write_committed_and_aborted(producers: Producers) -> None:
    """Offsets: 0-1 committed txn (k1, k2), 2 and 3 an aborted txn (k1, k3), 4 COMMIT, 5 ABORT, 6 plain k2, then
    each producer's last data batch in a later committed transaction: 7 (k4), 8 COMMIT, 9 (k5), 10 COMMIT."""
    assert producers.send([(b"k1", b"committed"), (b"k2", b"committed")], COMMITTER) == 0
    assert producers.send([(b"k1", b"aborted")], ABORTER) == 2
    assert producers.send([(b"k3", b"aborted")], ABORTER) == 3
    assert producers.end(COMMITTER, committed=True) == 4
    assert producers.end(ABORTER, committed=False) == 5
    assert producers.send([(b"k2", b"plain")]) == 6
    assert producers.send([(b"k4", b"committed-later")], COMMITTER) == 7
    assert producers.end(COMMITTER, committed=True) == 8
    assert producers.send([(b"k5", b"committed-later")], ABORTER) == 9
    assert producers.end(ABORTER, committed=True) == 10
    producers.roll()


def test_aborted_batches_go_and_markers_of_transactions_with_batches_left_stay_byte_for_byte(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    producers = Producers(log)
    write_committed_and_aborted(producers)
    before = batches(log)
    assert [b.header.base_offset for b in before] == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert log.collect_aborted_transactions(0, 11) == [AbortedTxn(ABORTER, 2, 5, 6)]

    assert cleaner.clean_filthiest_log(T0)

    after = batches(log)
    # The committed batch loses k2 (superseded by offset 6) and is rebuilt with k1; the aborted transaction's
    # batches go (neither is its producer's last: 9 is); every marker stays as it was, since each transaction
    # still has a batch here; the rest is untouched.
    first = before[0]
    k1_record = [r for r in decode_raw_records(first.data, first.header) if r.key == b"k1"]
    expected = [encode_raw_batch(first.header, k1_record, delete_horizon_ms=None)] + [
        b.data for b in before if b.header.base_offset >= 4
    ]
    assert [b.data for b in after] == expected
    assert [b.summary for b in after] == [
        (0, 1, COMMITTER, False, [(b"k1", b"committed")]),
        (4, 4, COMMITTER, True, [commit_marker()]),
        (5, 5, ABORTER, True, [abort_marker()]),
        (6, 6, -1, False, [(b"k2", b"plain")]),
        (7, 7, COMMITTER, False, [(b"k4", b"committed-later")]),
        (8, 8, COMMITTER, True, [commit_marker()]),
        (9, 9, ABORTER, False, [(b"k5", b"committed-later")]),
        (10, 10, ABORTER, True, [commit_marker()]),
    ]
    # The ABORT marker is kept, so is its transaction's entry, now in the cleaned segment's index (and file).
    segment = log.segments[0]
    assert segment.txn_index.all_aborted_txns() == [AbortedTxn(ABORTER, 2, 5, 6)]
    assert segment.txn_index.path.name == f"{0:020d}.txnindex"
    assert segment.txn_index.path.read_bytes() == AbortedTxn(ABORTER, 2, 5, 6).to_bytes()
    assert not [p.name for p in log.dir.iterdir() if p.name.endswith((".cleaned", ".swap"))]


def test_markers_of_transactions_left_without_batches_go_only_after_the_delete_horizon(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    producers = Producers(log)
    write_committed_and_aborted(producers)
    assert cleaner.clean_filthiest_log(T0)
    # k1 is overwritten: the first committed transaction's last record goes in the next clean.
    producers.send([(b"k1", b"plain")], now_ms=T0 + 1)
    producers.roll(T0 + 1)
    assert cleaner.clean_filthiest_log(T0 + 1)
    summaries = [b.summary[:4] for b in batches(log)]
    # The aborted transaction has no batch left: its ABORT marker gets a delete horizon and its index entry
    # goes. The COMMIT at 4 saw its transaction's batch in this pass (emptied by it): it stays without one.
    assert summaries[:3] == [(4, 4, COMMITTER, True), (5, 5, ABORTER, True), (6, 6, -1, False)]
    by_offset = {b.header.base_offset: b.header for b in batches(log)}
    assert by_offset[4].delete_horizon_ms is None
    assert by_offset[5].delete_horizon_ms == T0 + 1 + DAY_MS
    assert all(s.txn_index.all_aborted_txns() == [] for s in log.segments)
    assert log.collect_aborted_transactions(0, log.log_end_offset) == []

    # Before the horizon both stay (the COMMIT now gets its own horizon); at it, the ABORT goes.
    producers.send([(b"k2", b"plain-2")], now_ms=T0 + 2)
    producers.roll(T0 + 2)
    assert cleaner.clean_filthiest_log(T0 + 2)
    by_offset = {b.header.base_offset: b.header for b in batches(log)}
    assert 5 in by_offset
    assert by_offset[4].delete_horizon_ms == T0 + 2 + DAY_MS
    producers.send([(b"k2", b"plain-3")], now_ms=T0 + 3)
    producers.roll(T0 + 3)
    assert cleaner.clean_filthiest_log(T0 + 1 + DAY_MS)
    offsets = [b.header.base_offset for b in batches(log)]
    assert 5 not in offsets and 4 in offsets
    producers.send([(b"k2", b"plain-4")], now_ms=T0 + 4)
    producers.roll(T0 + 4)
    assert cleaner.clean_filthiest_log(T0 + 2 + DAY_MS)
    summaries = [b.summary for b in batches(log)]
    # Left: each producer's last transaction (its data batch and COMMIT), and the latest plain values.
    assert [s for s in summaries if s[2] != -1] == [
        (7, 7, COMMITTER, False, [(b"k4", b"committed-later")]),
        (8, 8, COMMITTER, True, [commit_marker()]),
        (9, 9, ABORTER, False, [(b"k5", b"committed-later")]),
        (10, 10, ABORTER, True, [commit_marker()]),
    ]


def test_a_producers_last_batch_in_an_aborted_transaction_is_kept_empty_with_its_marker(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    producers = Producers(log)
    producers.send([(b"k1", b"aborted")], ABORTER)
    producers.end(ABORTER, committed=False)
    producers.send([(b"k2", b"plain")])
    producers.roll()
    assert cleaner.clean_filthiest_log(T0)
    summaries = [b.summary for b in batches(log)]
    # The batch holds the producer's last sequence: kept, empty (a consumer sees no record of it), and so its
    # ABORT marker and index entry stay too.
    assert summaries == [
        (0, 0, ABORTER, False, []),
        (1, 1, ABORTER, True, [abort_marker()]),
        (2, 2, -1, False, [(b"k2", b"plain")]),
    ]
    assert batches(log)[0].header.is_transactional
    assert log.collect_aborted_transactions(0, 3) == [AbortedTxn(ABORTER, 0, 1, 2)]
    entry = log.producer_state_manager.last_entry(ABORTER)
    assert entry is not None and entry.last_seq == 0


def test_nothing_at_or_past_the_first_unstable_offset_is_cleaned(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    producers = Producers(log)
    for round_ in range(3):
        producers.send([(b"k", f"v{round_}".encode())])
    producers.roll()
    # An open transaction starts in the second segment: its records, and all after, are not yet decided.
    open_txn_offset = producers.send([(b"k", b"undecided")], COMMITTER)
    for round_ in range(3):
        producers.send([(b"k", f"w{round_}".encode())])
    producers.roll()
    for round_ in range(3):
        producers.send([(b"k", f"x{round_}".encode())])
    producers.roll()
    assert log.last_stable_offset == open_txn_offset == 3
    untouched = [[b.data for b in batches(log, index)] for index in (1, 2)]
    assert cleaner.clean_filthiest_log(T0)
    assert [b.summary[0] for b in batches(log, 0)] == [2]
    assert [[b.data for b in batches(log, index)] for index in (1, 2)] == untouched
    assert cleaner.manager.checkpoint(TP) == 3
    # Once committed, the rest is cleanable: the open transaction's record is superseded and goes.
    producers.end(COMMITTER, committed=True)
    producers.roll()
    assert cleaner.clean_filthiest_log(T0)
    remaining = [s for index in range(len(log.segments) - 1) for s in (b.summary for b in batches(log, index))]
    assert (3, 3, COMMITTER, False, [(b"k", b"undecided")]) not in remaining
    assert remaining[-2:] == [(9, 9, -1, False, [(b"k", b"x2")]), (10, 10, COMMITTER, True, [commit_marker()])]


def test_a_transaction_spanning_segments_cleaned_in_separate_groups_keeps_its_marker_and_index_entry(
    tmp_path: Path,
) -> None:
    # Segments of two batches; no two fit one cleaned segment, so each is cleaned into its own.
    _, log, cleaner = new_log(tmp_path, segment_bytes=200)
    producers = Producers(log)
    producers.send([(b"a", b"aborted")], ABORTER)
    producers.send([(b"b", b"plain")])
    producers.roll()
    producers.send([(b"c", b"plain")])
    producers.send([(b"d", b"aborted")], ABORTER)
    producers.roll()
    producers.send([(b"e", b"plain")])
    producers.end(ABORTER, committed=False)
    producers.roll()
    producers.send([(b"f", b"committed")], ABORTER)
    producers.end(ABORTER, committed=True)
    producers.roll()
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8]
    assert cleaner.clean_filthiest_log(T0)
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8], "each segment cleaned on its own"
    assert [b.summary for b in batches(log, 0)] == [(1, 1, -1, False, [(b"b", b"plain")])]
    assert [b.summary for b in batches(log, 1)] == [(2, 2, -1, False, [(b"c", b"plain")])]
    assert [b.summary for b in batches(log, 2)] == [
        (4, 4, -1, False, [(b"e", b"plain")]),
        (5, 5, ABORTER, True, [abort_marker()]),
    ]
    # Its batches were seen in this pass (in earlier groups): the marker and its index entry stay, in the
    # cleaned segment holding the marker.
    assert [s.txn_index.all_aborted_txns() for s in log.segments] == [[], [], [AbortedTxn(ABORTER, 0, 5, 6)], [], []]
    assert (log.dir / f"{4:020d}.txnindex").read_bytes() == AbortedTxn(ABORTER, 0, 5, 6).to_bytes()


def _swap_renames(groups: list[CleanedGroup]) -> list[tuple[Path, Path]]:
    """Every file rename Log.replace_segments makes, in its order: the new segment's files .cleaned -> .swap, the
    old segments' files -> .deleted, the new segment's files .swap -> final."""

    def files(segment: LogSegment) -> list[Path]:
        return [segment.log_path, segment.offset_index.path, segment.time_index.path, segment.txn_index.path]

    renames: list[tuple[Path, Path]] = []
    for group in groups:
        new_files = [path for path in files(group.new_segment) if path.exists()]
        swaps = [path.with_name(path.name.replace(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)) for path in new_files]
        renames += list(zip(new_files, swaps, strict=True))
        renames += [
            (path, path.with_name(path.name + DELETED_FILE_SUFFIX))
            for old in group.old_segments
            for path in files(old)
            if path.exists()
        ]
        renames += [(swap, swap.with_name(swap.name.removesuffix(SWAP_FILE_SUFFIX))) for swap in swaps]
    return renames


def test_a_crash_at_any_step_of_the_swap_keeps_the_old_segments_or_the_cleaned_ones_with_their_txn_index(
    tmp_path: Path,
) -> None:
    """After a crash at each rename of the swap, the reopened log (not recovered: below its recovery point) holds
    either the old segments with their transaction index or the cleaned ones with theirs, never a mix."""
    steps = None
    step = 0
    while steps is None or step <= steps:
        _, log, cleaner = new_log(tmp_path / f"crash-{step}")
        producers = Producers(log)
        write_committed_and_aborted(producers)
        old_batches, old_aborted = [b.data for b in batches(log)], log.collect_aborted_transactions(0, 11)
        task = cleaner.grab(T0)
        assert task is not None
        result = task.run(lambda: None)
        renames = _swap_renames(result.groups)
        steps = len(renames)
        for source, target in renames[:step]:
            os.rename(source, target)
        for group in result.groups:
            group.new_segment.close_handlers()
        task.close()
        log.close_handlers()
        reopened = open_log(
            log.dir, log.config, topic_partition=TP, recovery_point=11, high_watermark=11, had_clean_shutdown=False
        )
        try:
            kept_old = step < len([1 for source, _ in renames if source.name.endswith(CLEANED_FILE_SUFFIX)])
            if kept_old:
                assert [b.data for b in batches(reopened)] == old_batches, f"step {step}"
            else:
                assert [b.header.base_offset for b in batches(reopened)] == [0, 4, 5, 6, 7, 8, 9, 10], f"step {step}"
            # The clean saw the aborted transaction's batches (and removed them), so it kept the marker and the
            # index entry: both logs list the transaction, from the index of the segment holding the marker.
            assert reopened.collect_aborted_transactions(0, 11) == old_aborted, f"step {step}"
            assert reopened.segments[0].txn_index.path.exists(), f"step {step}"
            leftovers = [
                p.name for p in reopened.dir.iterdir() if p.name.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX))
            ]
            assert not leftovers, f"step {step}: {leftovers}"
        finally:
            reopened.close()
        step += 1


# The model: whatever the interleaving of transactions, a read_committed reader of the cleaned log reads the latest
# committed record of each key, at its offset.

Op = tuple[int, int, bool]  # (producer: 0 plain, 1-3 transactional; key; for a producer, end its transaction?)
operations = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.booleans()), min_size=1, max_size=50)


def read_committed(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record a read_committed consumer reads from the log start (Kafka's
    consumer: a producer's transactional batches are dropped from its aborted transaction's first offset to its
    ABORT marker; control batches are skipped)."""
    pending = sorted(log.collect_aborted_transactions(0, log.log_end_offset), key=lambda txn: txn.first_offset)
    aborted: set[int] = set()
    out = []
    for index in range(len(log.segments)):
        for batch in batches(log, index):
            header = batch.header
            while pending and pending[0].first_offset <= header.last_offset:
                aborted.add(pending.pop(0).producer_id)
            if header.is_control:
                records = decode_raw_records(batch.data, header)
                if records and records[0].key == abort_marker()[0]:
                    aborted.discard(header.producer_id)
                continue
            if header.is_transactional and header.producer_id in aborted:
                continue
            out += [
                (header.base_offset + r.offset_delta, r.key, r.value) for r in decode_raw_records(batch.data, header)
            ]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, segment_bytes=st.sampled_from([150, 300, 1000, 100_000]), commit_last=st.booleans())
def test_read_committed_of_the_cleaned_log_is_the_latest_committed_record_per_key(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Op], segment_bytes: int, commit_last: bool
) -> None:
    _, log, cleaner = new_log(tmp_path_factory.mktemp("model"), segment_bytes=segment_bytes)
    producers = Producers(log)
    committed: list[tuple[int, bytes, bytes]] = []
    # producer -> the records of its open transaction
    pending: dict[int, list[tuple[int, bytes, bytes]]] = {}

    def end(producer: int, commit: bool) -> None:
        producers.end(producer, committed=commit)
        records = pending.pop(producer)
        if commit:
            committed.extend(records)

    for n, (producer, key, ends) in enumerate(ops):
        if producer and ends and producer in pending:
            end(producer, commit=n % 3 != 0)
            continue
        record = (b"key-%d" % key, b"value-%d" % n)
        offset = producers.send([record], producer_id=producer if producer else -1)
        if producer:
            pending.setdefault(producer, []).append((offset, *record))
        else:
            committed.append((offset, *record))
    for producer in list(pending):
        end(producer, commit_last)
    producers.roll()
    assert log.last_stable_offset == log.high_watermark

    def latest(records: list[tuple[int, bytes, bytes]]) -> list[tuple[int, bytes | None, bytes | None]]:
        by_key = {key: (offset, key, value) for offset, key, value in sorted(records)}
        return sorted(by_key.values())

    assert read_committed(log) == sorted(committed)
    assert cleaner.clean_filthiest_log(T0)
    assert read_committed(log) == latest(committed)
    # Past every delete horizon (markers of transactions without batches go), with new dirty data to clean.
    offset = producers.send([(b"key-new", b"new")])
    committed.append((offset, b"key-new", b"new"))
    producers.roll()
    assert cleaner.clean_filthiest_log(T0 + DAY_MS)
    assert read_committed(log) == latest(committed)
