"""The log cleaner: compaction keeps the latest record per key at its offset, tombstones until their delete
horizon, the active segment untouched, producers' last batches, and survives a crash at every swap step."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import open_log

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches, encode_raw_batch
from tierlog.records.record_batch import CompressionType, InvalidRecordError, iter_batches, read_header
from tierlog.records.validation import RecordValidationError
from tierlog.storage.errors import KafkaStorageError
from tierlog.storage.log import Log
from tierlog.storage.log_cleaner import (
    CLEANER_OFFSET_CHECKPOINT_FILENAME,
    CleanerConfig,
    CleaningTask,
    CleanResult,
    LogCleaner,
    LogCleaningAbortedError,
)
from tierlog.storage.log_manager import LogManager
from tierlog.storage.offset_map import BYTES_PER_ENTRY
from tierlog.storage.segment import CLEANED_FILE_SUFFIX, DELETED_FILE_SUFFIX, SWAP_FILE_SUFFIX, LogSegment

T0 = 1_700_000_000_000
DAY_MS = 86_400_000
TP = TopicPartition("compacted", 0)
TOPIC_ID = uuid.UUID(int=5)
Entry = tuple[int, bytes | None, bytes | None]


def compacted_overrides(**settings: object) -> dict[str, str]:
    config = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"}
    config.update({name.replace("_", "."): str(value) for name, value in settings.items()})
    return config


def new_log(
    log_dir: Path, *, dedupe_buffer_size: int = 1 << 20, **settings: object
) -> tuple[LogManager, Log, LogCleaner]:
    manager = LogManager([log_dir], {})
    manager.startup({}, T0)
    log = manager.get_or_create_log(TP, TOPIC_ID, compacted_overrides(**settings), T0)
    return manager, log, LogCleaner(CleanerConfig(dedupe_buffer_size=dedupe_buffer_size), manager)


def reopen_without_snapshots(log: Log, *, high_watermark: int) -> Log:
    """Close `log`, delete its producer snapshots and open it after an unclean shutdown, so producer state
    is rebuilt from the (cleaned) batches alone."""
    log.close()
    for snapshot in log.dir.glob("*.snapshot"):
        snapshot.unlink()
    return open_log(log.dir, log.config, topic_partition=TP, high_watermark=high_watermark, had_clean_shutdown=False)


def append(
    log: Log,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    now_ms: int = T0,
    compression: CompressionType = CompressionType.NONE,
    producer: tuple[int, int, int] | None = None,
) -> int:
    """Append one batch (as a producer sends it) and move the HW to the log end; returns its first offset."""
    producer_id, producer_epoch, base_sequence = producer or (-1, -1, -1)
    batch = build_batch(
        [(key, value, [("h", b"1")], now_ms) for key, value in records],
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    info = log.append_as_leader(bytearray(batch), 0, now_ms)
    log.update_high_watermark(log.log_end_offset)
    return info.first_offset


def read_all(log: Log) -> list[Entry]:
    """(offset, key, value) of every record from the log start, as a consumer reads them."""
    entries: list[Entry] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        info = log.read(offset, 1 << 30, None, False)
        if info.records is None:
            break
        data = info.records.read_bytes()
        for batch in decode_batches(data):
            entries.extend((r.offset, r.key, r.value) for r in batch.records if r.offset >= offset)
            offset = batch.header.next_offset
    return entries


def contents(segment: LogSegment) -> bytes:
    return os.pread(segment.file.fileno(), segment.size, 0)


def latest_per_key(entries: Sequence[Entry]) -> list[Entry]:
    latest: dict[bytes | None, Entry] = {}
    for entry in entries:
        latest[entry[1]] = entry
    return sorted(latest.values())


def produce_updates(log: Log, keys: int, rounds: int, *, now_ms: int = T0) -> list[Entry]:
    written: list[Entry] = []
    for round_ in range(rounds):
        for key in range(keys):
            k, v = f"key-{key}".encode(), f"value-{key}-{round_}".encode()
            written.append((append(log, [(k, v)], now_ms=now_ms), k, v))
    return written


def roll_and_seal(log: Log, now_ms: int = T0) -> None:
    """Close the active segment so everything written so far is cleanable."""
    log.roll(now_ms)
    log.update_high_watermark(log.log_end_offset)


def test_many_updates_per_key_leave_the_latest_record_per_key_at_its_original_offset(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=5, rounds=20)
    roll_and_seal(log)
    assert len(log.segments) > 3
    before_end = log.log_end_offset
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(log) == latest_per_key(written)
    assert log.log_end_offset == before_end
    # Every batch left is still a valid batch (CRC included) and the files on disk hold nothing else.
    for segment in log.segments:
        assert segment.size == 0 or sum(h.size_in_bytes for h in iter_batches(contents(segment))) == segment.size
    assert cleaner.manager.checkpoint(TP) == log.active_segment.base_offset
    assert not any(p.name.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)) for p in log.dir.iterdir())


def test_a_batch_partly_kept_is_rebuilt_with_its_offsets_and_producer_fields(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    append(log, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")], producer=(7, 0, 0))
    append(log, [(b"b", b"2"), (b"d", b"2")], producer=(7, 0, 4))
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    batches = list(decode_batches(contents(log.segments[0])))
    first, second = (batch.header for batch in batches)
    assert (first.base_offset, first.last_offset, first.records_count) == (0, 3, 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 0, 0)
    assert [(r.offset, r.key, r.timestamp) for r in batches[0].records] == [(0, b"a", T0), (2, b"c", T0)]
    assert batches[0].records[0].headers == [("h", b"1")]
    assert (second.base_offset, second.last_offset, second.records_count) == (4, 5, 2)


def test_tombstones_are_kept_until_the_delete_horizon_and_removed_by_a_later_clean(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path, delete_retention_ms=DAY_MS)
    append(log, [(b"gone", b"v1"), (b"kept", b"v1")])
    append(log, [(b"gone", None)])
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(log) == [(1, b"kept", b"v1"), (2, b"gone", None)]
    tombstone_batch = next(b.header for b in decode_batches(contents(log.segments[0])) if b.header.base_offset == 2)
    assert tombstone_batch.delete_horizon_ms == T0 + DAY_MS
    # A clean before the horizon keeps it; only new dirty data triggers cleaning, as in Kafka.
    append(log, [(b"kept", b"v2")], now_ms=T0 + 1000)
    roll_and_seal(log, T0 + 1000)
    assert cleaner.clean_filthiest_log(T0 + DAY_MS - 1)
    assert read_all(log) == [(2, b"gone", None), (3, b"kept", b"v2")]
    append(log, [(b"kept", b"v3")], now_ms=T0 + 2000)
    roll_and_seal(log, T0 + 2000)
    assert cleaner.clean_filthiest_log(T0 + DAY_MS)
    assert read_all(log) == [(4, b"kept", b"v3")]


def test_the_active_segment_is_never_cleaned(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=2, rounds=3)
    assert len(log.segments) == 1
    assert not cleaner.clean_filthiest_log(T0)
    assert read_all(log) == written
    written += produce_updates(log, keys=2, rounds=40)
    active = log.active_segment
    active_bytes = contents(active)
    assert cleaner.clean_filthiest_log(T0)
    assert log.active_segment is active
    assert contents(active) == active_bytes
    tail = [entry for entry in written if entry[0] >= active.base_offset]
    assert read_all(log) == latest_per_key([e for e in written if e[0] < active.base_offset]) + tail


def test_records_at_or_above_the_high_watermark_are_not_cleaned(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=3, rounds=30)
    log.roll(T0)
    hw = log.segments[1].base_offset
    log.update_high_watermark(hw)  # a follower's HW lagging its log end
    assert cleaner.clean_filthiest_log(T0)
    below = [entry for entry in written if entry[0] < hw]
    assert read_all(log) == latest_per_key(below) + [entry for entry in written if entry[0] >= hw]


@pytest.mark.parametrize("codec", list(CompressionType))
def test_compressed_batches_are_cleaned_and_stay_decodable(tmp_path: Path, codec: CompressionType) -> None:
    _, log, cleaner = new_log(tmp_path)
    written: list[Entry] = []
    for round_ in range(12):
        records = [(f"k{i}".encode(), f"v{round_}-{i}".encode() * 5) for i in range(4)]
        first = append(log, records, compression=codec)
        written += [(first + i, k, v) for i, (k, v) in enumerate(records)]
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(log) == latest_per_key(written)
    for segment in log.segments[:-1]:
        for batch in decode_batches(contents(segment)):
            assert batch.header.compression_type == codec


def test_a_producers_last_batch_is_kept_empty_and_its_earlier_emptied_batches_go(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    append(log, [(b"a", b"1")], producer=(9, 2, 0))
    append(log, [(b"a", b"2")], producer=(9, 2, 1))
    append(log, [(b"a", b"3")])
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    headers = [b.header for b in decode_batches(contents(log.segments[0]))]
    assert [(h.base_offset, h.records_count, h.producer_id, h.base_sequence) for h in headers] == [
        (1, 0, 9, 1),
        (2, 1, -1, -1),
    ]
    assert read_all(log) == [(2, b"a", b"3")]
    # Producer state rebuilt from the cleaned log alone (no snapshot) still knows the producer's last sequence.
    entry = reopen_without_snapshots(log, high_watermark=3).producer_state_manager.last_entry(9)
    assert entry is not None and entry.last_seq == 1


def test_the_cleaner_checkpoint_advances_and_a_clean_log_is_not_cleaned_again(tmp_path: Path) -> None:
    manager, log, cleaner = new_log(tmp_path)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    first_checkpoint = cleaner.manager.checkpoint(TP)
    assert first_checkpoint == log.active_segment.base_offset
    assert not cleaner.clean_filthiest_log(T0)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    assert cleaner.manager.checkpoint(TP) == log.active_segment.base_offset > first_checkpoint
    text = (tmp_path / CLEANER_OFFSET_CHECKPOINT_FILENAME).read_text()
    assert text == f"0\n1\ncompacted 0 {log.active_segment.base_offset}\n"
    # A new cleaner (a restarted broker) starts from the checkpoint file.
    assert not LogCleaner(CleanerConfig(dedupe_buffer_size=1 << 20), manager).clean_filthiest_log(T0)


def test_a_log_below_min_cleanable_dirty_ratio_waits_unless_max_compaction_lag_passed(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path, min_cleanable_dirty_ratio="0.5", max_compaction_lag_ms=DAY_MS)
    produce_updates(log, keys=60, rounds=1)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    produce_updates(log, keys=3, rounds=2)
    roll_and_seal(log)
    # A few dirty records against 60 clean ones: below the ratio until max.compaction.lag.ms has passed.
    assert not cleaner.clean_filthiest_log(T0 + 1000)
    assert cleaner.clean_filthiest_log(T0 + DAY_MS + 1)


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path, min_compaction_lag_ms=60_000)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert not cleaner.clean_filthiest_log(T0 + 59_000)
    assert cleaner.clean_filthiest_log(T0 + 61_000)


def test_a_full_offset_map_cleans_only_up_to_the_last_key_it_mapped(tmp_path: Path) -> None:
    # A load factor of 0.9: room for 9 keys.
    _, log, cleaner = new_log(tmp_path, dedupe_buffer_size=BYTES_PER_ENTRY * 10)
    written: list[Entry] = []
    for key in range(30):
        k = f"key-{key}".encode()
        written += [(append(log, [(k, b"old")]), k, b"old"), (append(log, [(k, b"new")]), k, b"new")]
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    checkpoint = cleaner.manager.checkpoint(TP)
    assert checkpoint is not None and 0 < checkpoint < log.active_segment.base_offset
    assert read_all(log) == latest_per_key([e for e in written if e[0] < checkpoint]) + [
        e for e in written if e[0] >= checkpoint
    ]
    while cleaner.clean_filthiest_log(T0):
        pass
    assert read_all(log) == latest_per_key(written)


def test_the_dirtiest_log_is_cleaned_first(tmp_path: Path) -> None:
    manager, log, cleaner = new_log(tmp_path)
    other = manager.get_or_create_log(TopicPartition("compacted", 1), TOPIC_ID, compacted_overrides(), T0)
    for each in (log, other):
        produce_updates(each, keys=30, rounds=1)
        roll_and_seal(each)
    while cleaner.clean_filthiest_log(T0):
        pass
    produce_updates(log, keys=3, rounds=2)
    roll_and_seal(log)
    produce_updates(other, keys=3, rounds=20)
    roll_and_seal(other)
    task = cleaner.grab(T0)
    assert task is not None and task.to_clean.log is other
    cleaner.abort(task)
    assert cleaner.clean_filthiest_log(T0) and cleaner.manager.checkpoint(other.topic_partition) == other.log_end_offset


def test_a_compacted_topic_rejects_a_batch_naming_each_record_without_a_key(tmp_path: Path) -> None:
    _, log, _ = new_log(tmp_path)
    with pytest.raises(RecordValidationError) as raised:
        append(log, [(b"k", b"v"), (None, b"v"), (b"k", b"v"), (None, b"v")], compression=CompressionType.LZ4)
    assert raised.value.error_name == "INVALID_RECORD"
    message = "Compacted topic cannot accept message without key in topic partition compacted-0"
    assert [(e.batch_index, e.message) for e in raised.value.record_errors] == [(1, message), (3, message)]
    assert log.log_end_offset == 0


def test_a_clean_is_discarded_when_retention_or_truncation_changed_the_log(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    task, result = grab_and_clean(cleaner)
    log.truncate_to(log.segments[1].base_offset + 1)
    assert not cleaner.complete(task, result)
    assert not any(p.name.endswith(CLEANED_FILE_SUFFIX) for p in log.dir.iterdir())
    assert read_all(log) == [e for e in written if e[0] < log.log_end_offset]
    assert cleaner.manager.checkpoint(TP) is None


def test_an_aborted_clean_leaves_nothing_behind(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)

    def stop_once_writing() -> None:
        if any(p.name.endswith(CLEANED_FILE_SUFFIX) for p in log.dir.iterdir()):
            raise LogCleaningAbortedError("stopping")

    with pytest.raises(LogCleaningAbortedError):
        cleaner.clean_filthiest_log(T0, stop_once_writing)
    assert not any(p.name.endswith(CLEANED_FILE_SUFFIX) for p in log.dir.iterdir())
    assert read_all(log) == written
    assert TP not in cleaner.manager.in_progress


def test_truncation_below_the_checkpoint_lowers_it(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    log.truncate_to(5)
    written = produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    assert cleaner.manager.checkpoint(TP) == log.active_segment.base_offset
    assert [key for _, key, _ in read_all(log) if key is not None and key.startswith(b"key-")] == [
        key for _, key, _ in latest_per_key(written)
    ]


# Crash recovery at each step of the swap: what Log.open finds must hold every record once.


def grab_and_clean(cleaner: LogCleaner) -> tuple[CleaningTask, CleanResult]:
    """The filthiest log's cleaning run up to, not including, the swap (`cleaner.complete` does that)."""
    task = cleaner.grab(T0)
    assert task is not None
    return task, task.run(lambda: None)


def clean_without_swapping(tmp_path: Path) -> tuple[LogManager, Log, list[Entry], list[Entry], list]:
    manager, log, cleaner = new_log(tmp_path)
    written = produce_updates(log, keys=4, rounds=15)
    roll_and_seal(log)
    _, result = grab_and_clean(cleaner)
    compacted = latest_per_key(written)
    return manager, log, written, compacted, result.groups


def reopen_after_crash(log: Log, groups: list) -> Log:
    for group in groups:
        group.new_segment.close_handlers()
    log.close_handlers()
    return open_log(
        log.dir, log.config, topic_partition=TP, high_watermark=log.log_end_offset, had_clean_shutdown=False
    )


def assert_no_leftovers(log: Log) -> None:
    names = [p.name for p in log.dir.iterdir()]
    assert not [n for n in names if n.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX, DELETED_FILE_SUFFIX))]


def rename_cleaned_to_swap(groups: list) -> None:
    for group in groups:
        group.new_segment.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)


def crash_with_only_cleaned_files_written(groups: list) -> None:
    pass


def crash_halfway_through_the_cleaned_to_swap_rename(groups: list) -> None:
    # The log file is renamed first; the indexes still end in .cleaned.
    new = groups[0].new_segment
    new.log_path = new.log_path.rename(new.log_path.with_name(new.log_path.name.replace(".cleaned", ".swap")))


def crash_after_the_swap_rename(groups: list) -> None:
    rename_cleaned_to_swap(groups)


def crash_while_old_segments_are_renamed_deleted(groups: list) -> None:
    rename_cleaned_to_swap(groups)
    groups[0].old_segments[0].change_file_suffixes("", DELETED_FILE_SUFFIX)


def crash_while_dropping_the_swap_suffix(groups: list) -> None:
    rename_cleaned_to_swap(groups)
    for group in groups:
        for old in group.old_segments:
            old.change_file_suffixes("", DELETED_FILE_SUFFIX)
    # The new log file has its final name; its indexes still end in .swap.
    new = groups[0].new_segment
    new.log_path = new.log_path.rename(new.log_path.with_name(new.log_path.name.replace(".swap", "")))


@pytest.mark.parametrize(
    ("crash", "swap_completed"),
    [
        (crash_with_only_cleaned_files_written, False),
        (crash_halfway_through_the_cleaned_to_swap_rename, False),
        (crash_after_the_swap_rename, True),
        (crash_while_old_segments_are_renamed_deleted, True),
        (crash_while_dropping_the_swap_suffix, True),
    ],
    ids=lambda value: value.__name__ if callable(value) else ("completes the swap" if value else "keeps the old"),
)
def test_a_crash_during_the_swap_keeps_the_old_segments_or_completes_the_swap(
    tmp_path: Path, crash: Callable[[list], None], swap_completed: bool
) -> None:
    """Until every cleaned file is renamed to .swap the old segments stay; from then on recovery completes the
    swap. Either way no temporary file is left."""
    _, log, written, compacted, groups = clean_without_swapping(tmp_path)
    crash(groups)
    reopened = reopen_after_crash(log, groups)
    active = [e for e in written if e[0] >= reopened.active_segment.base_offset]
    assert read_all(reopened) == (compacted + active if swap_completed else written)
    assert_no_leftovers(reopened)


# The model: for any workload the cleaned log is the latest record per key, minus expired tombstones.


workloads = st.lists(
    st.tuples(st.integers(0, 6), st.booleans(), st.integers(1, 4)),  # key, tombstone, records in the batch
    min_size=1,
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    workload=workloads,
    segment_bytes=st.sampled_from([200, 500, 1500, 100_000]),
    expired=st.booleans(),
    codec=st.sampled_from(list(CompressionType)),
    idempotent=st.booleans(),
)
def test_the_cleaned_log_is_the_latest_record_per_key_minus_expired_tombstones(
    tmp_path_factory: pytest.TempPathFactory,
    workload: list[tuple[int, bool, int]],
    segment_bytes: int,
    expired: bool,
    codec: CompressionType,
    idempotent: bool,
) -> None:
    log_dir = tmp_path_factory.mktemp("cleaner")
    _, log, cleaner = new_log(log_dir, segment_bytes=segment_bytes, delete_retention_ms=1000)
    written: list[Entry] = []
    for n, (key, tombstone, count) in enumerate(workload):
        records = [
            (f"k{(key + i) % 7}".encode(), None if tombstone and i == 0 else f"v{n}-{i}".encode()) for i in range(count)
        ]
        producer = (1, 0, len(written)) if idempotent else None
        first = append(log, records, compression=codec, producer=producer)
        written += [(first + i, k, v) for i, (k, v) in enumerate(records)]
    roll_and_seal(log)
    cleaner.clean_filthiest_log(T0)
    # A second clean after the horizon removes the tombstones the first one dated (if it saw new data).
    if expired:
        append(log, [(b"other", b"x")])
        written.append((log.log_end_offset - 1, b"other", b"x"))
        roll_and_seal(log)
        cleaner.clean_filthiest_log(T0 + 1000)
    result = read_all(log)
    offsets = [offset for offset, _, _ in result]
    assert offsets == sorted(set(offsets))
    assert set(offsets) <= {offset for offset, _, _ in written}
    end = cleaner.manager.checkpoint(TP) or 0
    model = latest_per_key([e for e in written if e[0] < end])
    if expired:
        model = [e for e in model if e[2] is not None]
    assert [e for e in result if e[0] < end] == model
    assert [e for e in result if e[0] >= end] == [e for e in written if e[0] >= end]
    if idempotent:
        # Producer state rebuilt from the cleaned log alone (no snapshot) still ends at the last sequence.
        reopened = reopen_without_snapshots(log, high_watermark=0)
        entry = reopened.producer_state_manager.last_entry(1)
        produced = sum(count for _, _, count in workload)
        assert entry is not None and entry.last_seq == produced - 1
        reopened.close()


def test_a_follower_copies_a_compacted_leader_log_with_its_gaps_and_empty_batches(tmp_path: Path) -> None:
    _, leader, cleaner = new_log(tmp_path / "leader")
    append(leader, [(b"a", b"1"), (b"b", b"1")], producer=(3, 0, 0))
    append(leader, [(b"a", b"2"), (b"b", b"2")])
    written = produce_updates(leader, keys=4, rounds=10)
    roll_and_seal(leader)
    assert cleaner.clean_filthiest_log(T0)
    follower_manager = LogManager([tmp_path / "follower"], {})
    follower_manager.startup({}, T0)
    follower = follower_manager.get_or_create_log(TP, TOPIC_ID, compacted_overrides(), T0)
    for segment in leader.segments:
        if segment.size:
            follower.append_as_follower(contents(segment), T0)
    follower.update_high_watermark(follower.log_end_offset)
    assert follower.log_end_offset == leader.log_end_offset
    assert read_all(follower) == read_all(leader) == [(2, b"a", b"2"), (3, b"b", b"2"), *latest_per_key(written)]
    assert any(b.header.records_count == 0 for b in decode_batches(contents(follower.segments[0])))


def test_producers_still_may_not_send_an_empty_batch(tmp_path: Path) -> None:
    _, log, _ = new_log(tmp_path)
    batch = bytearray(encode_raw_batch(read_header(build_batch([(b"k", b"v", [], T0)])), [], delete_horizon_ms=None))
    with pytest.raises(InvalidRecordError, match="Inconsistent batch offset range"):
        log.append_as_leader(batch, 0, T0)


def test_replace_segments_refuses_segments_that_are_not_consecutive_closed_ones(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    produce_updates(log, keys=3, rounds=30)
    roll_and_seal(log)
    task, result = grab_and_clean(cleaner)
    new_segment = result.groups[0].new_segment
    segments = log.segments
    with pytest.raises(KafkaStorageError, match="not consecutive closed segments"):
        log.replace_segments(new_segment, [segments[0], segments[2]])
    with pytest.raises(KafkaStorageError, match="not consecutive closed segments"):
        log.replace_segments(new_segment, segments)
    cleaner.abort(task, result)
    assert not any(p.name.endswith(CLEANED_FILE_SUFFIX) for p in log.dir.iterdir())


def test_a_dirty_range_ending_in_an_offset_gap_is_cleaned_once(tmp_path: Path) -> None:
    # A follower of a compacted leader: its segment before the active one ends below the next segment's base.
    _, log, cleaner = new_log(tmp_path)
    records = [(b"a", b"1", [], T0), (b"b", b"1", [], T0), (b"a", b"2", [], T0)]
    log.append_as_follower(build_batch(records, partition_leader_epoch=0), T0)
    log.roll(T0, 10)
    log.append_as_follower(build_batch([(b"c", b"1", [], T0)], base_offset=10, partition_leader_epoch=0), T0)
    log.update_high_watermark(log.log_end_offset)
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(log) == [(1, b"b", b"1"), (2, b"a", b"2"), (10, b"c", b"1")]
    assert cleaner.manager.checkpoint(TP) == 10
    assert cleaner.grab(T0) is None


def test_an_offset_map_full_in_the_middle_of_a_batch_still_advances(tmp_path: Path) -> None:
    # Room for 2 keys: each pass maps 2 keys of the 10-key batch and cleans up to the second.
    _, log, cleaner = new_log(tmp_path, dedupe_buffer_size=BYTES_PER_ENTRY * 3)
    append(log, [(f"k{i}".encode(), b"old") for i in range(10)])
    append(log, [(f"k{i}".encode(), b"new") for i in range(10)])
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    assert cleaner.manager.checkpoint(TP) == 2
    passes = 1
    while cleaner.clean_filthiest_log(T0):
        passes += 1
    assert passes == 10
    assert read_all(log) == [(10 + i, f"k{i}".encode(), b"new") for i in range(10)]


def test_a_fetch_holding_a_slice_of_a_replaced_segment_still_reads_the_old_bytes(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    info = log.read(0, 1 << 20, None, False)
    assert info.records is not None
    before = info.records.read_bytes()
    assert cleaner.clean_filthiest_log(T0)
    assert info.records.read_bytes() == before
    assert any(p.name.endswith(DELETED_FILE_SUFFIX) for p in log.dir.iterdir())
    assert log.remove_deleted_segments(T0 + log.config.file_delete_delay_ms) > 0
    assert not any(p.name.endswith(DELETED_FILE_SUFFIX) for p in log.dir.iterdir())


def cleaned_then_deleted(tmp_path: Path) -> tuple[LogManager, LogCleaner]:
    """A compacted partition cleaned once, so it has a cleaner checkpoint, then deleted."""
    manager, log, cleaner = new_log(tmp_path)
    produce_updates(log, keys=3, rounds=20)
    roll_and_seal(log)
    assert cleaner.clean_filthiest_log(T0)
    manager.delete_log(TP)
    return manager, cleaner


def test_a_deleted_partition_loses_its_checkpoint_and_a_recreated_one_starts_dirty(tmp_path: Path) -> None:
    manager, cleaner = cleaned_then_deleted(tmp_path)
    assert not cleaner.clean_filthiest_log(T0)
    assert cleaner.manager.checkpoint(TP) is None
    assert (tmp_path / CLEANER_OFFSET_CHECKPOINT_FILENAME).read_text() == "0\n0\n"
    recreated = manager.get_or_create_log(TP, uuid.UUID(int=6), compacted_overrides(), T0)
    written = produce_updates(recreated, keys=3, rounds=20)
    roll_and_seal(recreated)
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(recreated) == latest_per_key(written)


def test_a_partition_recreated_between_two_passes_starts_dirty(tmp_path: Path) -> None:
    manager, cleaner = cleaned_then_deleted(tmp_path)
    recreated = manager.get_or_create_log(TP, uuid.UUID(int=6), compacted_overrides(), T0)
    # Duplicates below the old checkpoint, distinct keys above it: a stale checkpoint would keep them.
    written = produce_updates(recreated, keys=2, rounds=30)
    written += [(append(recreated, [(f"late-{i}".encode(), b"v")]), f"late-{i}".encode(), b"v") for i in range(40)]
    roll_and_seal(recreated)
    assert cleaner.clean_filthiest_log(T0)
    assert read_all(recreated) == latest_per_key(written)


def test_compact_delete_topics_are_compacted_and_their_expired_segments_deleted(tmp_path: Path) -> None:
    _, log, cleaner = new_log(tmp_path, cleanup_policy="compact,delete", retention_ms=DAY_MS)
    for i in range(40):
        append(log, [(f"old-{i}".encode(), b"v")], now_ms=T0)
    roll_and_seal(log, T0)
    recent = produce_updates(log, keys=3, rounds=20, now_ms=T0 + DAY_MS)
    roll_and_seal(log, T0 + DAY_MS)
    # Retention removes the segments whose records are all older than retention.ms; compaction the rest.
    assert log.delete_old_segments(T0 + DAY_MS + 1) > 0
    assert log.log_start_offset == 40
    assert cleaner.clean_filthiest_log(T0 + DAY_MS + 1)
    assert read_all(log) == latest_per_key(recent)
