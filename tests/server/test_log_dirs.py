"""The log-dir APIs against a real broker with two log dirs (docs/replication.md#log-dirs), through kafka-python's
KafkaAdminClient: each dir with the partitions it holds and their sizes, as the files on disk have them, and a
partition moved to the other dir with every record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_helpers import BrokerFactory
from kafka.admin import KafkaAdminClient

from tierlog.testing.local_cluster import BrokerProcess, wait_until


def two_log_dir_broker(broker_factory: BrokerFactory, tmp_path: Path) -> tuple[BrokerProcess, list[Path]]:
    dirs = [tmp_path / "disk-a", tmp_path / "disk-b"]
    return broker_factory({"log.dirs": ",".join(map(str, dirs))}), dirs


def segment_bytes(partition_dir: Path) -> int:
    return sum(segment.stat().st_size for segment in partition_dir.glob("*.log"))


def by_dir(described: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    """{log dir: {(topic, partition): partition entry}} of the one broker's answer."""
    [answer] = described
    return {
        log_dir["log_dir"]: {
            (topic["name"], partition["partition_index"]): partition
            for topic in log_dir["topics"]
            for partition in topic["partitions"]
        }
        for log_dir in answer["log_dirs"]
    }


def test_describe_log_dirs_lists_each_dir_with_its_partitions_sized_as_on_disk(
    broker_factory: BrokerFactory, kafka: Any, tmp_path: Path
) -> None:
    broker, dirs = two_log_dir_broker(broker_factory, tmp_path)
    topic = kafka.new_topic(broker.bootstrap, partitions=4)
    kafka.produce(broker.bootstrap, topic, [{"partition": p, "value": b"x" * (100 * (p + 1))} for p in range(4)] * 5)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20_000)
    try:
        everything = by_dir(admin.describe_log_dirs())
        one = by_dir(admin.describe_log_dirs({topic: [1]}))
    finally:
        admin.close()

    assert list(everything) == [str(d) for d in dirs]
    for log_dir in dirs:
        on_disk = {
            (topic, int(p.name.rpartition("-")[2])): segment_bytes(p)
            for p in log_dir.iterdir()
            if p.name.startswith(topic)
        }
        assert {tp: entry["partition_size"] for tp, entry in everything[str(log_dir)].items()} == on_disk
        assert all(
            entry["offset_lag"] == 0 and not entry["is_future_key"] for entry in everything[str(log_dir)].values()
        )
    assert sorted(tp for entries in everything.values() for tp in entries) == [(topic, p) for p in range(4)]
    assert all(size > 0 for entries in everything.values() for size in (e["partition_size"] for e in entries.values()))
    # Asking for one partition: both dirs are listed, only the dir holding it has an entry.
    assert list(one) == [str(d) for d in dirs]
    assert sorted(tp for entries in one.values() for tp in entries) == [(topic, 1)]


def test_alter_replica_log_dirs_moves_a_partition_to_the_other_dir_with_its_records(
    broker_factory: BrokerFactory, kafka: Any, tmp_path: Path
) -> None:
    broker, dirs = two_log_dir_broker(broker_factory, tmp_path)
    topic = kafka.new_topic(broker.bootstrap, partitions=1, config={"segment.bytes": "2000"})
    for first in range(0, 100, 10):  # batches of 10 records, each well under a segment
        kafka.produce(
            broker.bootstrap, topic, [{"value": b"record-%03d" % i + b"." * 100} for i in range(first, first + 10)]
        )
    [source] = [d for d in dirs if (d / f"{topic}-0").exists()]
    [destination] = [d for d in dirs if d != source]
    assert len(list((source / f"{topic}-0").glob("*.log"))) > 3
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20_000)
    try:
        answers = admin.alter_replica_log_dirs(
            {
                (topic, 0, 1): str(destination),
                (topic, 1, 1): str(destination),  # not on this broker
                ("not-yet-created", 0, 1): str(tmp_path / "not-a-log-dir"),
            }
        )
        assert {(tpr.topic, tpr.partition): error.__name__ for tpr, error in answers.items()} == {
            (topic, 0): "NoError",
            (topic, 1): "ReplicaNotAvailableError",
            ("not-yet-created", 0): "LogDirNotFoundError",
        }

        def moved() -> dict[str, dict[tuple[str, int], dict[str, Any]]] | None:
            described = by_dir(admin.describe_log_dirs({topic: [0]}))
            return (
                described if list(described[str(destination)]) == [(topic, 0)] and not described[str(source)] else None
            )

        described = wait_until(moved, 30, f"{topic}-0 to be in {destination} alone")
    finally:
        admin.close()

    entry = described[str(destination)][(topic, 0)]
    assert entry["is_future_key"] is False and entry["offset_lag"] == 0
    assert entry["partition_size"] == segment_bytes(destination / f"{topic}-0")
    assert not (source / f"{topic}-0").exists()
    values = [r.value for r in kafka.consume_all(broker.bootstrap, topic)]
    assert values == [b"record-%03d" % i + b"." * 100 for i in range(100)]
    # The moved partition takes new records where it is now.
    kafka.produce(broker.bootstrap, topic, [{"value": b"after the move"}])
    assert [r.value for r in kafka.consume_all(broker.bootstrap, topic, start_offset=100)] == [b"after the move"]
