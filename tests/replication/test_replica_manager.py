"""Produce and fetch through ReplicaManager and Partition on real logs: the HW rule (SPEC.md §1) on a
single replica, leader epochs stamped and cached (SPEC.md §2), and fetches parked in the purgatory."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierlog.common import TopicPartition
from tierlog.controller.controller import Controller
from tierlog.controller.metadata import FileMetadataStore, PartitionRegistration
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.errors import FencedLeaderEpochError, UnknownLeaderEpochError
from tierlog.replication.replica_manager import FetchParams, FetchPartitionResult, PartitionFetchInfo, ReplicaManager
from tierlog.storage.errors import OffsetOutOfRangeError
from tierlog.storage.log_manager import LogManager

TP = TopicPartition("events", 0)
NOW = 1_700_000_000_000


def batch(*values: bytes) -> bytearray:
    return bytearray(build_batch([(None, v, [], NOW) for v in values]))


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Controller, ReplicaManager]:
    controller = Controller(FileMetadataStore(tmp_path), lambda: [1])
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    controller.create_topic("events", 1, 1, {})
    replica_manager.apply_metadata(controller.metadata, NOW)
    return controller, replica_manager


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


def test_leader_append_moves_hw_to_leo_on_a_single_replica(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    results = replica_manager.append_records({TP: batch(b"a", b"b")}, 1, NOW)
    assert results[TP].error is None
    assert results[TP].info is not None and results[TP].info.first_offset == 0
    log = replica_manager.get_partition(TP).log
    assert (log.log_end_offset, log.high_watermark) == (2, 2)


def test_new_leader_epoch_starts_at_the_leo_and_is_stamped_into_batches(
    cluster: tuple[Controller, ReplicaManager],
) -> None:
    _, replica_manager = cluster
    partition = replica_manager.get_partition(TP)
    replica_manager.append_records({TP: batch(b"a")}, 1, NOW)
    registration = partition_registration(cluster)
    registration.leader_epoch = 3
    partition.make_leader(registration)
    replica_manager.append_records({TP: batch(b"b")}, 1, NOW)
    cache = partition.log.leader_epoch_cache
    assert [(e.epoch, e.start_offset) for e in cache.epoch_entries()] == [(0, 0), (3, 1)]
    answers, _ = fetch(replica_manager, 0)
    records = answers[0][0].read.records  # type: ignore[union-attr]
    assert records is not None
    epochs = [b.header.partition_leader_epoch for b in decode_batches(records.read_bytes())]
    assert epochs == [0, 3]


def partition_registration(cluster: tuple[Controller, ReplicaManager]) -> PartitionRegistration:
    controller, _ = cluster
    return controller.metadata.topics["events"].partitions[0]


def test_acks_all_is_refused_when_the_isr_is_below_min_insync_replicas(tmp_path: Path) -> None:
    controller = Controller(FileMetadataStore(tmp_path), lambda: [1])
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    replica_manager = ReplicaManager(1, log_manager)
    controller.create_topic("events", 1, 1, {"min.insync.replicas": "2"})
    replica_manager.apply_metadata(controller.metadata, NOW)
    assert replica_manager.append_records({TP: batch(b"a")}, -1, NOW)[TP].error == "NOT_ENOUGH_REPLICAS"
    assert replica_manager.get_partition(TP).log.log_end_offset == 0
    assert replica_manager.append_records({TP: batch(b"a")}, 1, NOW)[TP].error is None


def test_corrupt_batch_is_refused_and_nothing_is_appended(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    bad = batch(b"hello")
    bad[-1] ^= 0xFF
    assert replica_manager.append_records({TP: bad}, 1, NOW)[TP].error == "CORRUPT_MESSAGE"
    assert replica_manager.get_partition(TP).log.log_end_offset == 0


def test_produce_to_a_missing_partition_is_unknown_topic_or_partition(
    cluster: tuple[Controller, ReplicaManager],
) -> None:
    _, replica_manager = cluster
    missing = TopicPartition("events", 7)
    assert replica_manager.append_records({missing: batch(b"a")}, 1, NOW)[missing].error == "UNKNOWN_TOPIC_OR_PARTITION"


def test_fetch_waits_in_purgatory_until_an_append_wakes_it(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    answers, delayed = fetch(replica_manager, 0)
    assert answers == [] and delayed is not None
    replica_manager.append_records({TP: batch(b"a")}, 1, NOW)
    assert len(answers) == 1
    assert answers[0][0].read is not None and answers[0][0].read.size > 0
    assert replica_manager.fetch_purgatory.expire(NOW + 10_000) == 0


def test_fetch_without_enough_bytes_answers_empty_at_its_deadline(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    answers, _ = fetch(replica_manager, 0, min_bytes=1 << 20)
    replica_manager.append_records({TP: batch(b"a")}, 1, NOW)
    assert answers == []
    assert replica_manager.fetch_purgatory.expire(NOW + 499) == 0
    assert replica_manager.fetch_purgatory.expire(NOW + 500) == 1
    assert answers[0][0].read is not None and answers[0][0].read.size > 0


def test_fetch_out_of_range_answers_at_once_with_the_error(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    answers, delayed = fetch(replica_manager, 5)
    assert delayed is None
    assert answers[0][0].error == "OFFSET_OUT_OF_RANGE"


def test_fetch_with_a_stale_or_future_leader_epoch_is_refused(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    partition = replica_manager.get_partition(TP)
    registration = partition_registration(cluster)
    registration.leader_epoch = 2
    partition.make_leader(registration)
    with pytest.raises(FencedLeaderEpochError):
        partition.check_leader_epoch(1)
    with pytest.raises(UnknownLeaderEpochError):
        partition.check_leader_epoch(3)
    answers, _ = fetch(replica_manager, 0, epoch=1)
    assert answers[0][0].error == "FENCED_LEADER_EPOCH"


def test_deleting_a_topic_answers_its_waiting_fetches_and_removes_its_log(
    cluster: tuple[Controller, ReplicaManager],
) -> None:
    controller, replica_manager = cluster
    answers, _ = fetch(replica_manager, 0)
    log_dir = replica_manager.get_partition(TP).log.dir
    controller.delete_topic("events")
    replica_manager.apply_metadata(controller.metadata, NOW)
    assert answers[0][0].error == "UNKNOWN_TOPIC_OR_PARTITION"
    assert not log_dir.exists()


def test_delete_records_moves_the_log_start_but_not_past_the_hw(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    replica_manager.append_records({TP: batch(b"a", b"b", b"c")}, 1, NOW)
    assert replica_manager.delete_records(TP, 2) == 2
    assert replica_manager.delete_records(TP, -1) == 3
    with pytest.raises(OffsetOutOfRangeError):
        replica_manager.delete_records(TP, 10)


def test_list_offsets_on_an_empty_log_gives_zero_for_earliest_and_latest(
    cluster: tuple[Controller, ReplicaManager],
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


def test_list_offsets_by_timestamp_and_special_targets(cluster: tuple[Controller, ReplicaManager]) -> None:
    _, replica_manager = cluster
    replica_manager.append_records(
        {TP: bytearray(build_batch([(None, b"a", [], NOW), (None, b"b", [], NOW + 5)]))}, 1, NOW
    )
    replica_manager.append_records({TP: bytearray(build_batch([(None, b"c", [], NOW + 2)]))}, 1, NOW)

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
    replica_manager.apply_metadata(Controller(FileMetadataStore(tmp_path), lambda: [1]).metadata, NOW)
    assert restarted.get_log(orphan) is None
    (stray,) = tmp_path.glob("orphan-0.*-stray")
    assert b"keep me" in (stray / "00000000000000000000.log").read_bytes()
