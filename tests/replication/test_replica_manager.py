"""Produce and fetch through ReplicaManager and Partition on real logs: the HW rule
(docs/replication.md#leader-hw) on a single replica, leader epochs stamped and cached (#leader-epoch,
#epoch-cache), and fetches parked in the purgatory."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from replication_helpers import NOW, batch, count_reads, single_topic_image

from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata, PartitionRegistration
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.errors import FencedLeaderEpochError, UnknownLeaderEpochError
from tierlog.replication.replica_manager import (
    AppendResult,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
)
from tierlog.storage.errors import OffsetOutOfRangeError
from tierlog.storage.log_manager import LogManager

TP = TopicPartition("events", 0)

Cluster = tuple[PartitionRegistration, ReplicaManager]


def single_broker(tmp_path: Path, configs: dict[str, str] | None = None) -> Cluster:
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    registration = PartitionRegistration(replicas=[1], isr=[1], leader=1)
    replica_manager.apply_metadata(single_topic_image(registration, configs), NOW)
    return registration, replica_manager


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return single_broker(tmp_path)


def append(replica_manager: ReplicaManager, records: bytearray, acks: int = 1) -> AppendResult:
    answers: list[dict[TopicPartition, AppendResult]] = []
    replica_manager.append_records({TP: records}, acks, 30_000, NOW, answers.append)
    (answer,) = answers
    return answer[TP]


def fetch(
    replica_manager: ReplicaManager, offset: int, *, min_bytes: int = 1, max_wait_ms: int = 500, epoch: int = -1
) -> tuple[list[list[FetchPartitionResult]], object]:
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0
    )
    delayed = replica_manager.fetch_messages(
        params, [(TP, PartitionFetchInfo(offset, 1 << 20, epoch))], NOW, answers.append
    )
    return answers, delayed


def test_leader_append_moves_hw_to_leo_on_a_single_replica(cluster: Cluster) -> None:
    _, replica_manager = cluster
    result = append(replica_manager, batch(b"a", b"b"), 1)
    assert result.error is None
    assert result.info is not None and result.info.first_offset == 0
    log = replica_manager.get_partition(TP).log
    assert (log.log_end_offset, log.high_watermark) == (2, 2)


def test_new_leader_epoch_starts_at_the_leo_and_is_stamped_into_batches(
    cluster: Cluster,
) -> None:
    _, replica_manager = cluster
    partition = replica_manager.get_partition(TP)
    append(replica_manager, batch(b"a"), 1)
    registration, _ = cluster
    registration.leader_epoch = 3
    partition.make_leader(registration, NOW)
    append(replica_manager, batch(b"b"), 1)
    cache = partition.log.leader_epoch_cache
    assert [(e.epoch, e.start_offset) for e in cache.epoch_entries()] == [(0, 0), (3, 1)]
    answers, _ = fetch(replica_manager, 0)
    records = answers[0][0].read.records  # type: ignore[union-attr]
    assert records is not None
    epochs = [b.header.partition_leader_epoch for b in decode_batches(records.read_bytes())]
    assert epochs == [0, 3]


def test_acks_all_is_refused_when_the_isr_is_below_min_insync_replicas(tmp_path: Path) -> None:
    _, replica_manager = single_broker(tmp_path, {"min.insync.replicas": "2"})
    assert append(replica_manager, batch(b"a"), -1).error == "NOT_ENOUGH_REPLICAS"
    assert replica_manager.get_partition(TP).log.log_end_offset == 0
    assert append(replica_manager, batch(b"a"), 1).error is None


def test_corrupt_batch_is_refused_and_nothing_is_appended(cluster: Cluster) -> None:
    _, replica_manager = cluster
    bad = batch(b"hello")
    bad[-1] ^= 0xFF
    assert append(replica_manager, bad, 1).error == "CORRUPT_MESSAGE"
    assert replica_manager.get_partition(TP).log.log_end_offset == 0


def test_produce_to_a_missing_partition_is_unknown_topic_or_partition(
    cluster: Cluster,
) -> None:
    _, replica_manager = cluster
    missing = TopicPartition("events", 7)
    answers: list[dict[TopicPartition, AppendResult]] = []
    replica_manager.append_records({missing: batch(b"a")}, 1, 30_000, NOW, answers.append)
    assert answers[0][missing].error == "UNKNOWN_TOPIC_OR_PARTITION"


def test_fetch_waits_in_purgatory_until_an_append_wakes_it(cluster: Cluster) -> None:
    _, replica_manager = cluster
    answers, delayed = fetch(replica_manager, 0)
    assert answers == [] and delayed is not None
    append(replica_manager, batch(b"a"), 1)
    assert len(answers) == 1
    assert answers[0][0].read is not None and answers[0][0].read.size > 0
    assert replica_manager.fetch_purgatory.expire(NOW + 10_000) == 0


def test_parked_fetch_is_read_once_then_again_on_each_append(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    _, replica_manager = cluster
    reads = count_reads(replica_manager.get_partition(TP), monkeypatch)
    answers, delayed = fetch(replica_manager, 0, min_bytes=1 << 20)
    assert delayed is not None and reads == [(-1, 0)]
    append(replica_manager, batch(b"a"), 1)
    assert answers == [] and reads == [(-1, 0), (-1, 0)]


def test_metadata_that_leaves_a_partition_unchanged_does_not_reread_its_parked_fetches(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    registration, replica_manager = cluster
    reads = count_reads(replica_manager.get_partition(TP), monkeypatch)
    answers, _ = fetch(replica_manager, 0, epoch=0)
    replica_manager.apply_metadata(single_topic_image(registration), NOW)
    assert answers == [] and reads == [(-1, 0)]
    registration.leader_epoch += 1
    replica_manager.apply_metadata(single_topic_image(registration), NOW)
    assert answers[0][0].error == "FENCED_LEADER_EPOCH"


def test_fetch_without_enough_bytes_answers_empty_at_its_deadline(cluster: Cluster) -> None:
    _, replica_manager = cluster
    answers, _ = fetch(replica_manager, 0, min_bytes=1 << 20)
    append(replica_manager, batch(b"a"), 1)
    assert answers == []
    assert replica_manager.fetch_purgatory.expire(NOW + 499) == 0
    assert replica_manager.fetch_purgatory.expire(NOW + 500) == 1
    assert answers[0][0].read is not None and answers[0][0].read.size > 0


def test_fetch_out_of_range_answers_at_once_with_the_error(cluster: Cluster) -> None:
    _, replica_manager = cluster
    answers, delayed = fetch(replica_manager, 5)
    assert delayed is None
    assert answers[0][0].error == "OFFSET_OUT_OF_RANGE"


def test_fetch_with_a_stale_or_future_leader_epoch_is_refused(cluster: Cluster) -> None:
    _, replica_manager = cluster
    partition = replica_manager.get_partition(TP)
    registration, _ = cluster
    registration.leader_epoch = 2
    partition.make_leader(registration, NOW)
    with pytest.raises(FencedLeaderEpochError):
        partition.check_leader_epoch(1)
    with pytest.raises(UnknownLeaderEpochError):
        partition.check_leader_epoch(3)
    answers, _ = fetch(replica_manager, 0, epoch=1)
    assert answers[0][0].error == "FENCED_LEADER_EPOCH"


def test_deleting_a_topic_answers_its_waiting_fetches_and_removes_its_log(
    cluster: Cluster,
) -> None:
    _, replica_manager = cluster
    answers, _ = fetch(replica_manager, 0)
    log_dir = replica_manager.get_partition(TP).log.dir
    replica_manager.apply_metadata(ClusterMetadata(), NOW)
    assert answers[0][0].error == "UNKNOWN_TOPIC_OR_PARTITION"
    assert not log_dir.exists()


def test_delete_records_moves_the_log_start_but_not_past_the_hw(cluster: Cluster) -> None:
    _, replica_manager = cluster
    append(replica_manager, batch(b"a", b"b", b"c"), 1)
    assert replica_manager.delete_records(TP, 2, NOW) == 2
    assert replica_manager.delete_records(TP, -1, NOW) == 3
    with pytest.raises(OffsetOutOfRangeError):
        replica_manager.delete_records(TP, 10, NOW)


def test_list_offsets_on_an_empty_log_gives_zero_for_earliest_and_latest(
    cluster: Cluster,
) -> None:
    _, replica_manager = cluster
    for timestamp in (-1, -2, -4):
        found = replica_manager.fetch_offset_for_timestamp(
            TP, timestamp, isolation_level=0, current_leader_epoch=-1, replica_id=-1
        )
        assert found is not None and found.offset == 0, timestamp
    assert (
        replica_manager.fetch_offset_for_timestamp(TP, NOW, isolation_level=0, current_leader_epoch=-1, replica_id=-1)
        is None
    )


def test_list_offsets_by_timestamp_and_special_targets(cluster: Cluster) -> None:
    _, replica_manager = cluster
    append(replica_manager, bytearray(build_batch([(None, b"a", [], NOW), (None, b"b", [], NOW + 5)])))
    append(replica_manager, bytearray(build_batch([(None, b"c", [], NOW + 2)])), 1)

    def lookup(timestamp: int) -> tuple[int, int, int] | None:
        found = replica_manager.fetch_offset_for_timestamp(
            TP, timestamp, isolation_level=0, current_leader_epoch=-1, replica_id=-1
        )
        return None if found is None else (found.offset, found.timestamp, found.leader_epoch)

    assert lookup(-2) == (0, -1, 0)
    assert lookup(-1) == (3, -1, 0)
    assert lookup(-3) == (1, NOW + 5, 0)
    assert lookup(-5) == (-1, -1, -1)
    assert lookup(NOW + 1) == (1, NOW + 5, 0)
    assert lookup(NOW + 6) is None


def test_partitions_unknown_to_the_metadata_are_set_aside_not_deleted(tmp_path: Path) -> None:
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    orphan = TopicPartition("orphan", 0)
    log_manager.get_or_create_log(orphan, uuid.uuid4(), {}, NOW).append_as_leader(batch(b"keep me"), 0, NOW)
    log_manager.shutdown()

    restarted = LogManager([tmp_path], {})
    restarted.startup({}, NOW)
    replica_manager = ReplicaManager(1, restarted)
    replica_manager.apply_metadata(ClusterMetadata(), NOW)
    assert restarted.get_log(orphan) is None
    (stray,) = tmp_path.glob("orphan-0.*-stray")
    assert b"keep me" in (stray / "00000000000000000000.log").read_bytes()


def _moved_off_broker_1(leader_epoch: int) -> PartitionRegistration:
    """events-0 after a reassignment from [1] to [2] completed: broker 1 no longer a replica."""
    return PartitionRegistration(replicas=[2], isr=[2], leader=2, leader_epoch=leader_epoch, partition_epoch=2)


def test_a_replica_a_reassignment_removes_is_deleted_by_its_running_broker(cluster: Cluster) -> None:
    """docs/reassignment.md#removed-replicas: Kafka's ReplicaManager stops the replica and deletes its log."""
    _, replica_manager = cluster
    append(replica_manager, batch(b"moved"))
    log_dir = replica_manager.get_partition(TP).log.dir
    replica_manager.apply_metadata(single_topic_image(_moved_off_broker_1(1)), NOW)
    assert TP not in replica_manager.partitions
    assert replica_manager.log_manager.get_log(TP) is None
    assert not log_dir.exists()
    (deleted,) = log_dir.parent.glob("events-0.*-delete")
    assert deleted.is_dir()


def test_a_replica_removed_while_its_broker_was_down_is_set_aside_as_stray_at_restart(tmp_path: Path) -> None:
    """docs/reassignment.md#removed-replicas: at start-up, a log of a partition whose replicas no longer list
    the broker is a stray log, renamed `-stray` and kept, as Kafka 3.8+ (KAFKA-16234) does."""
    _, replica_manager = single_broker(tmp_path)
    append(replica_manager, batch(b"kept aside"))
    replica_manager.log_manager.shutdown()

    restarted = LogManager([tmp_path], {})
    restarted.startup({}, NOW)
    assert restarted.get_log(TP) is not None
    ReplicaManager(1, restarted).apply_metadata(single_topic_image(_moved_off_broker_1(1)), NOW)
    assert restarted.get_log(TP) is None
    (stray,) = tmp_path.glob("events-0.*-stray")
    assert b"kept aside" in (stray / "00000000000000000000.log").read_bytes()
