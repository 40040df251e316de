"""The log dirs' core (docs/replication.md#log-dirs): what DescribeLogDirs reports of each configured log dir."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from storage_helpers import T0, make_batch

from tierlog.common import TopicPartition
from tierlog.storage.log_manager import LogManager, ReplicaLogDescription

A0 = TopicPartition("alpha", 0)
A1 = TopicPartition("alpha", 1)
B0 = TopicPartition("beta", 0)
TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def started(log_dirs: list[Path]) -> LogManager:
    manager = LogManager(log_dirs, {})
    manager.startup({}, T0)
    return manager


def on_disk_size(directory: Path) -> int:
    return sum(segment.stat().st_size for segment in directory.glob("*.log"))


def test_describe_lists_every_log_dir_with_the_size_and_lag_of_the_logs_it_holds(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"]
    manager = started(dirs)
    a0, a1, _ = (manager.get_or_create_log(tp, TOPIC_ID, {"segment.bytes": "300"}, T0) for tp in (A0, A1, B0))
    for _ in range(4):
        a0.append_as_leader(make_batch(2, value_size=40), 0, T0)
    a0.update_high_watermark(6)
    a1.append_as_leader(make_batch(3), 0, T0)

    described = manager.describe_log_dirs(None)

    assert [d.path for d in described] == dirs
    assert described[0].replicas == [
        ReplicaLogDescription(A0, on_disk_size(dirs[0] / "alpha-0"), offset_lag=0, is_future=False)
    ]
    assert len(list((dirs[0] / "alpha-0").glob("*.log"))) > 1  # the size is of every segment, not the active one
    assert described[1].replicas == [ReplicaLogDescription(A1, on_disk_size(dirs[1] / "alpha-1"), 0, False)]
    assert described[2].replicas == [ReplicaLogDescription(B0, 0, 0, False)]


def test_describe_of_some_partitions_leaves_out_the_others_and_those_not_here(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"]
    manager = started(dirs)
    for tp in (A0, A1, B0):
        manager.get_or_create_log(tp, TOPIC_ID, {}, T0)

    described = manager.describe_log_dirs({A1, TopicPartition("gamma", 0)})

    assert [[r.topic_partition for r in d.replicas] for d in described] == [[], [A1], []]


def test_describe_gives_absolute_paths_for_relative_log_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    manager = started([Path("relative")])
    assert [d.path for d in manager.describe_log_dirs(None)] == [tmp_path / "relative"]
