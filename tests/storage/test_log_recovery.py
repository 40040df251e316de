"""Log.open after crashes: torn and corrupt batches, missing or corrupt indexes, leftovers, checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

from storage_helpers import T0, batch_offsets, fetched, log_config, make_batch, open_log

from tierlog.storage.checkpoints import LeaderEpochCheckpointFile
from tierlog.storage.epoch_entry import EpochEntry
from tierlog.storage.log import Log

BATCH = len(make_batch(5))


def build_log(directory: Path, batches: int = 9, batches_per_segment: int = 3) -> Log:
    """Segments of `batches_per_segment` 5-record batches, epochs 1, 2, 3 by thirds, all flushed."""
    log = open_log(directory, log_config(segment_bytes=batches_per_segment * BATCH, index_interval_bytes=100))
    for i in range(batches):
        log.append_as_leader(make_batch(5, timestamp=T0 + i), 1 + i * 3 // batches, T0)
    log.update_high_watermark(log.log_end_offset)
    log.flush()
    return log


def reopen(directory: Path, *, clean: bool, recovery_point: int = 0, high_watermark: int = 0, **kwargs: int) -> Log:
    return open_log(
        directory,
        log_config(segment_bytes=3 * BATCH, index_interval_bytes=100),
        recovery_point=recovery_point,
        high_watermark=high_watermark,
        had_clean_shutdown=clean,
        **kwargs,
    )


def segment_file(directory: Path, base_offset: int, suffix: str = ".log") -> Path:
    return directory / f"{base_offset:020d}{suffix}"


def append_to_the_active_segment(directory: Path, data: bytes) -> tuple[Path, int]:
    """Build the log in `directory`, close it and append `data` to its active segment's file; return that file
    and its size before."""
    build_log(directory).close()
    active = segment_file(directory, 30)
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(data)
    return active, size


def test_garbage_appended_to_the_active_segment_is_truncated_on_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    active, size = append_to_the_active_segment(directory, os.urandom(300))
    log = reopen(directory, clean=False, recovery_point=30, high_watermark=45)
    assert active.stat().st_size == size
    assert log.log_end_offset == 45
    assert log.append_as_leader(make_batch(1), 3, T0).first_offset == 45


def test_a_torn_last_batch_is_truncated_on_reopen(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    active = segment_file(directory, 30)
    os.truncate(active, active.stat().st_size - 10)
    log = reopen(directory, clean=False, recovery_point=30, high_watermark=45)
    assert log.log_end_offset == 40
    assert log.high_watermark == 40
    assert active.stat().st_size == 2 * BATCH
    assert batch_offsets(fetched(log.read(30, 1 << 20, None, False))) == [(30, 34), (35, 39)]


def test_a_flipped_byte_in_a_middle_segment_truncates_there_and_deletes_later_segments(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    middle = segment_file(directory, 15)
    data = bytearray(middle.read_bytes())
    data[BATCH + 80] ^= 0x40  # the second batch of the middle segment
    middle.write_bytes(data)
    log = reopen(directory, clean=False, recovery_point=0, high_watermark=45)
    assert [s.base_offset for s in log.segments] == [0, 15]
    assert log.log_end_offset == 20
    assert log.high_watermark == 20
    assert not segment_file(directory, 30).exists()
    assert not segment_file(directory, 30, ".index").exists()
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 15)]
    # The trimmed entries are written at the log's next change; a crash before it loads them the same way.
    crashed = reopen(directory, clean=False, recovery_point=0, high_watermark=20)
    assert crashed.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 15)]
    crashed.append_as_follower(make_batch(5, base_offset=20, epoch=2), T0)
    assert LeaderEpochCheckpointFile(directory / "leader-epoch-checkpoint").read() == [
        EpochEntry(1, 0),
        EpochEntry(2, 15),
    ]


def test_recovery_starts_at_the_recovery_point(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    first = segment_file(directory, 0)
    data = bytearray(first.read_bytes())
    data[-5] ^= 0x01  # below the recovery point: trusted, as in Kafka
    first.write_bytes(data)
    log = reopen(directory, clean=False, recovery_point=30, high_watermark=45)
    assert log.log_end_offset == 45


def test_a_deleted_index_is_rebuilt_even_after_a_clean_shutdown(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    index = segment_file(directory, 15, ".index")
    original = index.read_bytes()
    assert original
    index.unlink()
    log = reopen(directory, clean=True, high_watermark=45)
    assert index.read_bytes() == original
    assert log.log_end_offset == 45
    assert batch_offsets(fetched(log.read(27, 1 << 20, None, False)))[0] == (25, 29)


def test_a_corrupt_index_is_rebuilt(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    index = segment_file(directory, 0, ".index")
    time_index = segment_file(directory, 0, ".timeindex")
    original, original_time = index.read_bytes(), time_index.read_bytes()
    index.write_bytes(original[::-1] + b"\x01")
    log = reopen(directory, clean=True, high_watermark=45)
    assert index.read_bytes() == original
    assert time_index.read_bytes() == original_time
    assert batch_offsets(fetched(log.read(12, 1 << 20, None, False)))[0] == (10, 14)


def test_the_clean_shutdown_flag_skips_recovery(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    active, size = append_to_the_active_segment(directory, b"\x00" * 100)
    log = reopen(directory, clean=True, recovery_point=45, high_watermark=45)
    assert active.stat().st_size == size + 100  # nothing validated the file
    assert log.log_end_offset == 45
    assert log.recovery_point == 45


def test_an_unclean_reopen_keeps_the_recovery_point_until_a_flush(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    log = reopen(directory, clean=False, recovery_point=30, high_watermark=45)
    assert log.recovery_point == 30
    log.flush()
    assert log.recovery_point == 45


def test_the_epoch_cache_is_trimmed_to_the_log_and_hw_clamped(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    LeaderEpochCheckpointFile(directory / "leader-epoch-checkpoint").write(
        [EpochEntry(1, 0), EpochEntry(2, 15), EpochEntry(3, 30), EpochEntry(9, 60)]
    )
    log = reopen(directory, clean=True, high_watermark=1000, log_start_offset=17)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (17, 45, 45)
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(2, 17), EpochEntry(3, 30)]
    log.close()
    log = reopen(directory, clean=True, high_watermark=3, log_start_offset=10)
    assert (log.log_start_offset, log.high_watermark) == (10, 10)


def test_log_start_is_at_least_the_first_segment_base(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    segment_file(directory, 0).unlink()
    for suffix in (".index", ".timeindex"):
        segment_file(directory, 0, suffix).unlink()
    log = reopen(directory, clean=True, high_watermark=0, log_start_offset=3)
    assert (log.log_start_offset, log.high_watermark) == (15, 15)


def test_a_log_start_beyond_the_log_end_starts_the_log_over_there(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    log = reopen(directory, clean=True, log_start_offset=100, high_watermark=100)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (100, 100, 100)
    assert sorted(p.name for p in directory.iterdir() if p.suffix == ".log") == ["00000000000000000100.log"]


def test_leftovers_of_interrupted_operations_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    leftovers = [
        directory / "00000000000000000007.log.deleted",
        directory / "00000000000000000007.index.deleted",
        directory / "00000000000000000090.log.cleaned",
        directory / "leader-epoch-checkpoint.tmp",
        directory / "00000000000000000099.index",  # an index without its log
        directory / "00000000000000000099.timeindex",
    ]
    for path in leftovers:
        path.write_bytes(b"x" * 12)
    log = reopen(directory, clean=True, high_watermark=45)
    assert not any(path.exists() for path in leftovers)
    assert log.log_end_offset == 45


def test_a_swap_segment_replaces_the_segments_it_covers(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    build_log(directory).close()
    # What a compaction that merged the first two segments leaves behind if it crashes before renaming.
    merged = segment_file(directory, 0).read_bytes() + segment_file(directory, 15).read_bytes()
    segment_file(directory, 0, ".log.swap").write_bytes(merged)
    log = reopen(directory, clean=True, high_watermark=45)
    assert [s.base_offset for s in log.segments] == [0, 30]
    assert not segment_file(directory, 15).exists()
    assert not any(p.name.endswith(".swap") for p in directory.iterdir())
    assert batch_offsets(fetched(log.read(16, 1 << 20, None, False)))[0] == (15, 19)


def test_loading_a_log_writes_no_epoch_checkpoint(tmp_path: Path) -> None:
    """An idle partition's entry starts at its log end (its leader's epoch, with no record yet): the load drops it
    from the cache, as Kafka's LogLoader does, and leaves the file to the log's next change, as Kafka 3.8 does
    (KAFKA-16541), so a restart does not rewrite and fsync every partition's file."""
    directory = tmp_path / "topic-0"
    log = build_log(directory)
    log.leader_epoch_cache.assign(4, 45)
    log.close()
    checkpoint = directory / "leader-epoch-checkpoint"
    inode = checkpoint.stat().st_ino
    log = reopen(directory, clean=True, high_watermark=45)
    assert log.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 15), EpochEntry(3, 30)]
    assert checkpoint.stat().st_ino == inode


def test_a_crash_after_records_follow_a_load_finds_the_trimmed_epoch_checkpoint(tmp_path: Path) -> None:
    """The file the load left stale is written before the log grows: records of the latest kept epoch appended
    where the dropped entry began must not be taken, after a crash, for that dropped epoch's (recovery assigns only
    epochs above the latest, so it would not repair the file)."""
    directory = tmp_path / "topic-0"
    log = build_log(directory)
    log.leader_epoch_cache.assign(4, 45)
    log.close()
    log = reopen(directory, clean=True, high_watermark=45)
    log.append_as_follower(make_batch(5, base_offset=45, epoch=3), T0)
    crashed = reopen(directory, clean=False, recovery_point=45, high_watermark=50)
    assert crashed.log_end_offset == 50
    assert crashed.leader_epoch_cache.epoch_entries() == [EpochEntry(1, 0), EpochEntry(2, 15), EpochEntry(3, 30)]
