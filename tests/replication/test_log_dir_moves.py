"""Moving a replica between a broker's log dirs (AlterReplicaLogDirs, docs/replication.md#log-dirs): Kafka's errors
per partition, the preferred dir of a partition not yet here, and the future log that is filled step by step,
follows the current log's truncations, and replaces it with nothing lost, also across a restart."""

from __future__ import annotations

from pathlib import Path

from replication_helpers import NOW, TOPIC, TP, batch, single_topic_image

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.records.codec import decode_batches
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.storage.log import Log
from tierlog.storage.log_manager import LogManager

SMALL_SEGMENTS = {"segment.bytes": "400"}
REGISTRATION = PartitionRegistration(replicas=[1], isr=[1], leader=1)


def broker(dirs: list[Path]) -> ReplicaManager:
    log_manager = LogManager(dirs, {})
    log_manager.startup({TOPIC: SMALL_SEGMENTS}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    replica_manager.apply_metadata(single_topic_image(REGISTRATION, SMALL_SEGMENTS), NOW)
    return replica_manager


def produce(replica_manager: ReplicaManager, *values: bytes) -> None:
    answers: list[object] = []
    replica_manager.append_records({TP: batch(*values)}, 1, 30_000, NOW, answers.append)
    assert answers


def values(log: Log) -> list[bytes | None]:
    """Every record value of the log, in offset order, with its offset checked to follow the one before."""
    found: list[bytes | None] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        records = log.read(offset, 1 << 20, None, min_one_message=True).records
        assert records is not None
        for decoded in decode_batches(records.read_bytes()):
            for record in decoded.records:
                assert record.offset == len(found) + log.log_start_offset
                found.append(record.value)
            offset = decoded.header.last_offset + 1
    return found


def other_dir(replica_manager: ReplicaManager, dirs: list[Path]) -> Path:
    current = replica_manager.get_partition(TP).log.dir.parent
    return next(d for d in dirs if d != current)


def move_until_done(replica_manager: ReplicaManager, max_bytes: int, between_steps: int = 0) -> int:
    """Step the moves until none remains (bounded); `between_steps` records produced after each step."""
    for step in range(1000):
        if not replica_manager.has_future_logs():
            return step
        replica_manager.move_future_logs(NOW, max_bytes)
        if between_steps and step < 5:
            produce(replica_manager, *(b"during-%d-%d" % (step, i) for i in range(between_steps)))
    raise AssertionError("the move never finished")


def test_a_move_copies_everything_appended_before_and_during_it_then_swaps(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    for i in range(30):
        produce(replica_manager, b"before-%d" % i, b"x" * 40)
    source = replica_manager.get_partition(TP).log
    destination = other_dir(replica_manager, dirs)
    expected_before = values(source)
    assert len(source.segments) > 3

    assert replica_manager.alter_replica_log_dirs({TP: str(destination)}, NOW) == {TP: None}

    future = replica_manager.log_manager.get_future_log(TP)
    assert future is not None and future.dir.parent == destination and future.dir.name.endswith("-future")
    described = {d.path: d.replicas for d in replica_manager.log_manager.describe_log_dirs(None)}
    [(future_entry)] = described[destination]
    assert future_entry.is_future and future_entry.offset_lag == source.log_end_offset

    steps = move_until_done(replica_manager, max_bytes=300, between_steps=2)

    assert steps > 3  # copied a bit at a time, not in one go
    moved = replica_manager.get_partition(TP).log
    assert moved is replica_manager.log_manager.get_log(TP)
    assert moved.dir == destination / "events-0"
    assert values(moved) == expected_before + [b"during-%d-%d" % (s, i) for s in range(5) for i in range(2)]
    assert moved.high_watermark == moved.log_end_offset
    assert not (source.dir.parent / "events-0").exists()
    assert [p.name.endswith("-delete") for p in source.dir.parent.iterdir() if p.name.startswith("events-0")] == [True]
    # The moved log takes appends as the partition's log.
    produce(replica_manager, b"after")
    assert values(moved)[-1] == b"after"
    described = {d.path: d.replicas for d in replica_manager.log_manager.describe_log_dirs(None)}
    assert [r.is_future for r in described[destination]] == [False]


def test_the_current_dir_is_a_no_op_and_a_dir_not_configured_is_log_dir_not_found(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    current = replica_manager.get_partition(TP).log.dir.parent
    answers = replica_manager.alter_replica_log_dirs(
        {TP: str(current), TopicPartition(TOPIC, 7): str(tmp_path / "elsewhere")}, NOW
    )
    assert answers == {TP: None, TopicPartition(TOPIC, 7): "LOG_DIR_NOT_FOUND"}
    assert not replica_manager.has_future_logs()


def test_a_partition_not_here_is_replica_not_available_and_is_created_in_that_dir_later(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    log_manager = LogManager(dirs, {})
    log_manager.startup({}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    # Without the request, the first partition would go to the first dir (both hold none).
    assert replica_manager.alter_replica_log_dirs({TP: str(dirs[1])}, NOW) == {TP: "REPLICA_NOT_AVAILABLE"}
    replica_manager.apply_metadata(single_topic_image(REGISTRATION), NOW)
    assert replica_manager.get_partition(TP).log.dir == dirs[1] / "events-0"


def test_asking_for_the_current_dir_during_a_move_stops_it(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    produce(replica_manager, b"x" * 100)
    current = replica_manager.get_partition(TP).log.dir.parent
    replica_manager.alter_replica_log_dirs({TP: str(other_dir(replica_manager, dirs))}, NOW)
    future = replica_manager.log_manager.get_future_log(TP)
    assert future is not None

    assert replica_manager.alter_replica_log_dirs({TP: str(current)}, NOW) == {TP: None}

    assert not replica_manager.has_future_logs()
    assert not future.dir.exists()  # renamed for deletion
    assert replica_manager.get_partition(TP).log.dir.parent == current


def test_the_future_log_drops_what_the_current_log_truncated_before_it_swaps(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    for i in range(10):
        produce(replica_manager, b"first-%d" % i)
    source = replica_manager.get_partition(TP).log
    replica_manager.alter_replica_log_dirs({TP: str(other_dir(replica_manager, dirs))}, NOW)
    future = replica_manager.log_manager.get_future_log(TP)
    assert future is not None
    while future.log_end_offset < 7:
        replica_manager.move_future_logs(NOW, max_bytes=1)  # one batch a step
    assert future.log_end_offset < source.log_end_offset
    # The current log diverges below the future log's end, as a follower's does when it truncates to its new
    # leader's log and takes that leader's records of a later epoch.
    source.truncate_to(4)
    source.append_as_leader(batch(b"new-4", b"new-5"), leader_epoch=(source.latest_epoch or 0) + 1, now_ms=NOW)
    source.update_high_watermark(source.log_end_offset)

    move_until_done(replica_manager, max_bytes=1)

    moved = replica_manager.get_partition(TP).log
    assert values(moved) == [b"first-%d" % i for i in range(4)] + [b"new-4", b"new-5"]
    assert moved.leader_epoch_cache.epoch_entries() == source.leader_epoch_cache.epoch_entries()


def test_the_future_log_truncates_in_rounds_to_the_last_epoch_it_shares_with_the_current_log(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    source = replica_manager.get_partition(TP).log
    source.append_as_leader(batch(*(b"e1-%d" % i for i in range(8))), leader_epoch=1, now_ms=NOW)
    source.append_as_leader(batch(b"e1-8", b"e1-9"), leader_epoch=1, now_ms=NOW)
    source.append_as_leader(batch(b"e3-10", b"e3-11"), leader_epoch=3, now_ms=NOW)
    source.append_as_leader(batch(b"e3-12"), leader_epoch=3, now_ms=NOW)
    source.update_high_watermark(source.log_end_offset)
    replica_manager.alter_replica_log_dirs({TP: str(other_dir(replica_manager, dirs))}, NOW)
    future = replica_manager.log_manager.get_future_log(TP)
    assert future is not None
    while future.log_end_offset < 12:
        replica_manager.move_future_logs(NOW, max_bytes=1)
    # The current log's offsets 8-9 become epoch 2's (a leader the replica had not heard of), then epoch 4 follows:
    # the future log's epoch 3 ends at 10 in its own log, but only offsets 0-7 (epoch 1) are still the same.
    source.truncate_to(8)
    source.append_as_leader(batch(b"e2-8", b"e2-9", b"e2-10", b"e2-11"), leader_epoch=2, now_ms=NOW)
    source.append_as_leader(batch(b"e4-12", b"e4-13"), leader_epoch=4, now_ms=NOW)
    source.update_high_watermark(source.log_end_offset)

    move_until_done(replica_manager, max_bytes=1)

    moved = replica_manager.get_partition(TP).log
    assert values(moved) == [b"e1-%d" % i for i in range(8)] + [b"e2-%d" % i for i in range(8, 12)] + [
        b"e4-12",
        b"e4-13",
    ]
    assert [(e.epoch, e.start_offset) for e in moved.leader_epoch_cache.epoch_entries()] == [(1, 0), (2, 8), (4, 12)]


def test_a_move_goes_on_after_a_restart(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    replica_manager = broker(dirs)
    for i in range(20):
        produce(replica_manager, b"r-%d" % i, b"y" * 30)
    destination = other_dir(replica_manager, dirs)
    expected = values(replica_manager.get_partition(TP).log)
    replica_manager.alter_replica_log_dirs({TP: str(destination)}, NOW)
    replica_manager.move_future_logs(NOW, max_bytes=200)
    assert replica_manager.has_future_logs()
    replica_manager.log_manager.shutdown()

    restarted = broker(dirs)
    future = restarted.log_manager.get_future_log(TP)
    assert future is not None and future.dir.parent == destination and future.log_end_offset > 0
    move_until_done(restarted, max_bytes=200)

    moved = restarted.get_partition(TP).log
    assert moved.dir == destination / "events-0"
    assert values(moved) == expected
