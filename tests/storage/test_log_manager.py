"""LogManager: loading log dirs, checkpoints across restarts, the clean-shutdown marker, deletion, retention."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from storage_helpers import T0, make_batch

from tierlog.common import TopicPartition
from tierlog.storage.checkpoints import OffsetCheckpointFile, PartitionMetadataFile
from tierlog.storage.errors import InconsistentTopicIdError
from tierlog.storage.log_manager import LogManager

A0 = TopicPartition("alpha", 0)
A1 = TopicPartition("alpha", 1)
B0 = TopicPartition("beta", 0)
TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def started(log_dirs: list[Path], topic_configs: dict[str, dict[str, str]] | None = None, **broker: str) -> LogManager:
    manager = LogManager(log_dirs, {name.replace("_", "."): value for name, value in broker.items()})
    manager.startup(topic_configs or {}, T0)
    return manager


def test_partitions_spread_over_log_dirs_and_get_partition_metadata(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    manager = started(dirs)
    logs = [manager.get_or_create_log(tp, TOPIC_ID, {}, T0) for tp in (A0, A1, B0)]
    assert [log.dir for log in logs] == [dirs[0] / "alpha-0", dirs[1] / "alpha-1", dirs[0] / "beta-0"]
    assert manager.get_or_create_log(A0, TOPIC_ID, {}, T0) is logs[0]
    assert manager.get_log(A0) is logs[0]
    assert manager.get_log(TopicPartition("gamma", 0)) is None
    assert (dirs[0] / "alpha-0" / "partition.metadata").read_text() == "version: 0\ntopic_id: EjRWeBI0VngSNFZ4EjRWeA"
    with pytest.raises(InconsistentTopicIdError):
        manager.get_or_create_log(A0, uuid.uuid4(), {}, T0)


def test_checkpoints_and_data_round_trip_through_a_clean_restart(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    manager = started([log_dir])
    log = manager.get_or_create_log(A0, TOPIC_ID, {"segment.bytes": "300"}, T0)
    for _ in range(6):
        log.append_as_leader(make_batch(2, value_size=40), 5, T0)
    log.update_high_watermark(9)
    log.maybe_increment_log_start_offset(3)
    manager.shutdown()
    assert (log_dir / ".kafka_cleanshutdown").exists()
    assert OffsetCheckpointFile(log_dir / "replication-offset-checkpoint").read() == {A0: 9}
    assert OffsetCheckpointFile(log_dir / "recovery-point-offset-checkpoint").read() == {A0: 12}
    assert OffsetCheckpointFile(log_dir / "log-start-offset-checkpoint").read() == {A0: 3}
    assert (log_dir / "replication-offset-checkpoint").read_text() == "0\n1\nalpha 0 9\n"

    restarted = started([log_dir], {"alpha": {"segment.bytes": "300"}})
    assert not (log_dir / ".kafka_cleanshutdown").exists()  # a crash from now on is detected
    log = restarted.get_log(A0)
    assert log is not None
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset, log.recovery_point) == (3, 9, 12, 12)
    assert log.config.segment_bytes == 300
    assert log.latest_epoch == 5
    info = log.read(3, 1 << 20, log.high_watermark, False)
    assert info.records is not None
    restarted.get_or_create_log(A0, TOPIC_ID, {}, T0)  # the topic id read back from partition.metadata


def test_a_checkpoint_written_later_in_a_thread_holds_its_snapshot_and_never_overwrites_a_newer_one(
    tmp_path: Path,
) -> None:
    """The broker takes its HW and log start checkpoints on the event loop and writes them in a thread; a write that
    lands after a newer snapshot was written (e.g. at shutdown) must not put the older offsets back."""
    log_dir = tmp_path / "data"
    manager = started([log_dir])
    log = manager.get_or_create_log(A0, TOPIC_ID, {}, T0)
    for _ in range(3):
        log.append_as_leader(make_batch(2), 0, T0)
    log.update_high_watermark(2)
    older = manager.high_watermark_checkpoint()
    log.update_high_watermark(4)
    taken_at_4 = manager.high_watermark_checkpoint()
    log.update_high_watermark(6)
    taken_at_4()  # the offsets as of the snapshot, not as of the write
    assert OffsetCheckpointFile(log_dir / "replication-offset-checkpoint").read() == {A0: 4}
    manager.checkpoint_high_watermarks()
    older()
    assert OffsetCheckpointFile(log_dir / "replication-offset-checkpoint").read() == {A0: 6}

    log.maybe_increment_log_start_offset(2)
    late_log_start = manager.log_start_offset_checkpoint()
    log.maybe_increment_log_start_offset(4)
    manager.checkpoint_log_start_offsets()
    late_log_start()
    assert OffsetCheckpointFile(log_dir / "log-start-offset-checkpoint").read() == {A0: 4}


def test_an_unclean_restart_recovers_from_the_checkpointed_recovery_point(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    manager = started([log_dir])
    log = manager.get_or_create_log(A0, TOPIC_ID, {}, T0)
    for _ in range(3):
        log.append_as_leader(make_batch(2), 0, T0)
    log.update_high_watermark(6)
    manager.checkpoint_high_watermarks()
    manager.checkpoint_recovery_points()
    active = log.active_segment.log_path
    with open(active, "ab") as f:
        f.write(os.urandom(64))  # a crash in the middle of a write: no clean shutdown marker
    restarted = started([log_dir])
    log = restarted.get_log(A0)
    assert log is not None
    assert (log.log_end_offset, log.high_watermark) == (6, 6)
    assert active.stat().st_size == 3 * len(make_batch(2))


def test_directories_marked_for_deletion_are_removed_at_startup(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    leftover = log_dir / f"alpha-0.{uuid.uuid4().hex}-delete"
    leftover.mkdir(parents=True)
    (leftover / "00000000000000000000.log").write_bytes(b"")
    (log_dir / "not-a-partition").mkdir()
    manager = started([log_dir])
    assert not leftover.exists()
    assert manager.all_logs() == []


def test_delete_log_renames_at_once_and_removes_after_the_delay(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    manager = started([log_dir])
    log = manager.get_or_create_log(A0, TOPIC_ID, {"file.delete.delay.ms": "1000"}, T0)
    batch = make_batch(3)
    log.append_as_leader(batch, 0, T0)
    held = log.read(0, 1 << 20, None, False).records
    manager.delete_log(A0)
    assert manager.get_log(A0) is None
    renamed = [p.name for p in log_dir.iterdir() if p.is_dir()]
    assert len(renamed) == 1 and renamed[0].startswith("alpha-0.") and renamed[0].endswith("-delete")
    assert held is not None and held.read_bytes() == bytes(batch)  # reads in flight still complete
    manager.cleanup_logs(T0 + 10)  # starts the delay
    manager.cleanup_logs(T0 + 1009)
    assert (log_dir / renamed[0]).exists()
    manager.cleanup_logs(T0 + 1010)
    assert not (log_dir / renamed[0]).exists()
    recreated = manager.get_or_create_log(A0, uuid.uuid4(), {}, T0)
    assert recreated.log_end_offset == 0


def test_cleanup_logs_applies_retention_and_removes_deleted_segments(tmp_path: Path) -> None:
    size = len(make_batch(2))
    manager = started([tmp_path / "data"], log_retention_ms="1000", log_segment_delete_delay_ms="0")
    log = manager.get_or_create_log(A0, TOPIC_ID, {"segment.bytes": str(size)}, T0)
    for _ in range(3):
        log.append_as_leader(make_batch(2, timestamp=T0), 0, T0)
    log.update_high_watermark(6)
    assert log.config.retention_ms == 1000
    assert manager.cleanup_logs(T0 + 1002) == 3
    assert [s.base_offset for s in log.segments] == [6]
    assert not any(p.name.endswith(".deleted") for p in log.dir.iterdir())


def test_update_topic_config_reaches_every_partition_of_the_topic(tmp_path: Path) -> None:
    manager = started([tmp_path / "data"])
    for tp in (A0, A1, B0):
        manager.get_or_create_log(tp, TOPIC_ID, {}, T0)
    manager.update_topic_config("alpha", {"retention.ms": "5"})
    retention = {log.topic_partition: log.config.retention_ms for log in manager.all_logs()}
    assert retention == {A0: 5, A1: 5, B0: 604_800_000}


def test_update_topic_config_passes_over_the_logs_only_when_the_overrides_changed(tmp_path: Path) -> None:
    manager = started([tmp_path / "data"])
    for tp in (A0, A1):
        manager.get_or_create_log(tp, TOPIC_ID, {}, T0)
    manager.update_topic_config("alpha", {"retention.ms": "5"})
    applied = [log.config for log in manager.all_logs()]
    manager.update_topic_config("alpha", {"retention.ms": "5"})
    assert [log.config for log in manager.all_logs()] == applied
    assert all(log.config is config for log, config in zip(manager.all_logs(), applied, strict=True))
    manager.update_topic_config("alpha", {"retention.ms": "6"})
    assert [log.config.retention_ms for log in manager.all_logs()] == [6, 6]


def test_flush_dirty_logs_flushes_rolled_segments(tmp_path: Path) -> None:
    size = len(make_batch(2))
    manager = started([tmp_path / "data"])
    log = manager.get_or_create_log(A0, TOPIC_ID, {"segment.bytes": str(size)}, T0)
    for _ in range(3):
        log.append_as_leader(make_batch(2), 0, T0)
    manager.flush_dirty_logs(T0)
    manager.checkpoint_recovery_points()
    assert OffsetCheckpointFile(tmp_path / "data" / "recovery-point-offset-checkpoint").read() == {A0: 4}


def test_the_log_start_checkpoint_lists_only_logs_whose_start_is_inside_a_segment(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    manager = started([log_dir])
    moved = manager.get_or_create_log(A0, TOPIC_ID, {}, T0)
    manager.get_or_create_log(B0, TOPIC_ID, {}, T0)
    moved.append_as_leader(make_batch(4), 0, T0)
    moved.update_high_watermark(4)
    moved.maybe_increment_log_start_offset(2)
    manager.checkpoint_log_start_offsets()
    assert OffsetCheckpointFile(log_dir / "log-start-offset-checkpoint").read() == {A0: 2}
    assert PartitionMetadataFile(log_dir / "beta-0" / "partition.metadata").read() == TOPIC_ID
