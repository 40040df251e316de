"""Topic operations are validated the way Kafka validates them, written to the metadata log before they are
visible, and a restarted controller replays the log to the very same image."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from controller_helpers import (
    SingleVoterMetadataLog,
    endpoints,
    heartbeat,
    new_controller,
    open_controller,
    restart,
    state,
)

from tierlog.controller.controller import PRODUCER_ID_BLOCK_SIZE, Controller, ControllerConfig
from tierlog.controller.errors import (
    InconsistentClusterIdError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicDeletionDisabledError,
    TopicExistsError,
    UnknownTopicError,
)
from tierlog.metadata.records import ClusterIdRecord, ConfigRecord, PartitionRecord, RemoveTopicRecord, TopicRecord
from tierlog.storage.checkpoints import kafka_uuid_from_str, kafka_uuid_to_str


def records_after(controller: Controller, offset: int) -> list[object]:
    return [record for _, record in controller.metadata_log.records_from(offset + 1)]


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "has space", "slash/name", "ünïcode", "__cluster_metadata"])
def test_illegal_topic_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidTopicError):
        new_controller(tmp_path).create_topic(name, 1, 1, {})


def test_topic_names_colliding_on_dot_and_underscore_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("a.b", 1, 1, {})
    with pytest.raises(InvalidTopicError, match="collides"):
        controller.create_topic("a_b", 1, 1, {})


def test_create_topic_writes_topic_partition_and_config_records(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    before = controller.metadata.offset
    topic = controller.create_topic("events", 3, 2, {"retention.ms": "1000", "cleanup.policy": "delete"})
    assert [p.replicas for p in topic.partitions] == [[1, 2], [2, 3], [3, 1]]
    assert [(p.leader, p.isr, p.leader_epoch, p.partition_epoch) for p in topic.partitions] == [
        (1, [1, 2], 0, 0),
        (2, [2, 3], 0, 0),
        (3, [3, 1], 0, 0),
    ]
    assert records_after(controller, before) == [
        TopicRecord("events", topic.topic_id),
        PartitionRecord(topic.topic_id, 0, (1, 2), (1, 2), 1, 0, 0),
        PartitionRecord(topic.topic_id, 1, (2, 3), (2, 3), 2, 0, 0),
        PartitionRecord(topic.topic_id, 2, (3, 1), (3, 1), 3, 0, 0),
        ConfigRecord("events", "cleanup.policy", "delete"),
        ConfigRecord("events", "retention.ms", "1000"),
    ]
    assert controller.metadata.offset == before + 6
    assert controller.topic_by_id(topic.topic_id) is topic


def test_replicas_go_only_to_unfenced_brokers(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    heartbeat(controller, 2, 0, want_fence=True)
    topic = controller.create_topic("events", 2, 2, {})
    assert [p.replicas for p in topic.partitions] == [[1, 3], [3, 1]]
    with pytest.raises(InvalidReplicationFactorError, match="only 2 broker"):
        controller.create_topic("wide", 1, 3, {})
    with pytest.raises(InvalidReplicationFactorError, match="only 2 broker"):
        controller.create_topic("wide", 1, 3, {}, validate_only=True)


def test_a_new_cluster_has_no_brokers_to_place_replicas_on(tmp_path: Path) -> None:
    with pytest.raises(InvalidReplicationFactorError, match="only 0 broker"):
        open_controller(tmp_path).create_topic("events", 1, 1, {})


def test_validate_only_changes_nothing(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("kept", 1, 1, {"retention.ms": "5"})
    end = controller.metadata_log.end_offset
    created = controller.create_topic("events", 2, 1, {}, validate_only=True)
    assert len(created.partitions) == 2
    grown = controller.create_partitions("kept", 3, validate_only=True)
    assert len(grown.partitions) == 3
    altered = controller.alter_topic_configs("kept", {"retention.ms": "7"}, validate_only=True)
    assert altered.configs == {"retention.ms": "7"}
    assert controller.metadata_log.end_offset == end
    assert controller.topic("events") is None
    kept = controller.topic("kept")
    assert kept is not None and len(kept.partitions) == 1 and kept.configs == {"retention.ms": "5"}
    assert restart(controller, tmp_path).metadata == controller.metadata


def test_duplicate_topic_and_bad_counts_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 1, 1, {})
    end = controller.metadata_log.end_offset
    with pytest.raises(TopicExistsError):
        controller.create_topic("events", 1, 1, {})
    with pytest.raises(InvalidPartitionsError):
        controller.create_topic("zero", 0, 1, {})
    with pytest.raises(InvalidReplicationFactorError, match="larger than 0"):
        controller.create_topic("none", 1, 0, {})
    with pytest.raises(InvalidReplicationFactorError, match="only 1 broker"):
        controller.create_topic("wide", 1, 3, {})
    assert controller.metadata_log.end_offset == end


def test_unknown_or_invalid_topic_configs_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    with pytest.raises(InvalidConfigError):
        controller.create_topic("events", 1, 1, {"no.such.config": "1"})
    with pytest.raises(InvalidConfigError):
        controller.create_topic("events", 1, 1, {"segment.bytes": "lots"})
    assert controller.topic("events") is None


def test_partitions_only_grow_and_new_ones_are_placed_round_robin(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 2, 2, {})
    with pytest.raises(InvalidPartitionsError):
        controller.create_partitions("events", 1)
    with pytest.raises(InvalidPartitionsError):
        controller.create_partitions("events", 2)
    with pytest.raises(UnknownTopicError):
        controller.create_partitions("nope", 2)
    grown = controller.create_partitions("events", 4)
    assert [p.replicas for p in grown.partitions] == [[1, 2], [2, 3], [3, 1], [1, 2]]
    assert restart(controller, tmp_path).topic("events") == grown


def test_create_partitions_needs_enough_unfenced_brokers(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2))
    controller.create_topic("events", 1, 2, {})
    heartbeat(controller, 2, 0, want_fence=True)
    with pytest.raises(InvalidReplicationFactorError, match="only 1 broker"):
        controller.create_partitions("events", 2)


def test_alter_topic_configs_writes_only_what_changed(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 1, 1, {"retention.ms": "1", "segment.ms": "2", "cleanup.policy": "delete"})
    before = controller.metadata.offset
    topic = controller.alter_topic_configs("events", {"retention.ms": "10", "segment.ms": "2", "flush.ms": "3"})
    assert topic.configs == {"retention.ms": "10", "segment.ms": "2", "flush.ms": "3"}
    assert records_after(controller, before) == [
        ConfigRecord("events", "flush.ms", "3"),
        ConfigRecord("events", "retention.ms", "10"),
        ConfigRecord("events", "cleanup.policy", None),
    ]
    end = controller.metadata_log.end_offset
    controller.alter_topic_configs("events", dict(topic.configs))
    assert controller.metadata_log.end_offset == end
    with pytest.raises(InvalidConfigError):
        controller.alter_topic_configs("events", {"retention.ms": "soon"})
    with pytest.raises(UnknownTopicError):
        controller.alter_topic_configs("nope", {})


def test_delete_topic(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    topic = controller.create_topic("events", 1, 1, {})
    with pytest.raises(TopicDeletionDisabledError):
        controller.delete_topic("events", deletion_enabled=False)
    before = controller.metadata.offset
    assert controller.delete_topic("events") is topic
    assert records_after(controller, before) == [RemoveTopicRecord(topic.topic_id)]
    assert controller.topic("events") is None
    assert controller.topic_by_id(topic.topic_id) is None
    assert restart(controller, tmp_path).topic("events") is None
    with pytest.raises(UnknownTopicError):
        controller.delete_topic("events")


def test_producer_id_blocks_never_repeat_across_restarts(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    assert controller.allocate_producer_id_block(1) == range(0, PRODUCER_ID_BLOCK_SIZE)
    assert controller.allocate_producer_id_block() == range(PRODUCER_ID_BLOCK_SIZE, 2 * PRODUCER_ID_BLOCK_SIZE)
    restarted = restart(controller, tmp_path)
    assert restarted.allocate_producer_id_block(1) == range(2 * PRODUCER_ID_BLOCK_SIZE, 3 * PRODUCER_ID_BLOCK_SIZE)


def test_a_new_log_starts_with_the_cluster_id(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    cluster_id = controller.metadata.cluster_id
    kafka_uuid_from_str(cluster_id)  # Kafka's Uuid string form, as `kafka-storage random-uuid` prints
    # Right after the one voter's LeaderChangeMessage (offset 0), which holds no metadata.
    assert controller.metadata_log.records_from(0) == [(1, ClusterIdRecord(cluster_id))]
    assert restart(controller, tmp_path).metadata.cluster_id == cluster_id


def test_a_given_cluster_id_is_used_and_must_match_the_log(tmp_path: Path) -> None:
    log = SingleVoterMetadataLog(tmp_path)
    controller = Controller(log, ControllerConfig(), 0, cluster_id="MkU3OEVBNTcwNTJENDM2Qk")
    assert controller.metadata.cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"
    log.close()
    log = SingleVoterMetadataLog(tmp_path)
    with pytest.raises(InconsistentClusterIdError):
        Controller(log, ControllerConfig(), 0, cluster_id="AAAAAAAAAAAAAAAAAAAAAA")
    log.close()


def test_restart_replays_to_the_same_image(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    controller.create_topic("events", 3, 3, {"retention.ms": "1000"})
    controller.create_topic("gone", 1, 1, {})
    controller.delete_topic("gone")
    controller.allocate_producer_id_block(2)
    controller.fence_stale_brokers(1)  # nobody is stale yet
    heartbeat(controller, 3, 0, want_fence=True)
    events = controller.topic("events")
    assert events is not None
    p0 = events.partitions[0]
    controller.alter_partition(1, controller.metadata.brokers[1].broker_epoch, events.topic_id, 0, 0, 1, [1])
    assert state(controller, "events", 0) == (1, [1], 0, 2)
    assert p0.partition_epoch == 1, "a registration handed out stays as it was"

    restarted = restart(controller, tmp_path, now_ms=5)
    # Equality covers every field of the image (offset, cluster id, brokers, topics) but the id index.
    assert restarted.metadata == controller.metadata
    assert restarted.metadata.next_producer_id == PRODUCER_ID_BLOCK_SIZE
    assert restarted.metadata.unfenced_broker_ids() == [1, 2]
    assert restarted.topic_by_id(events.topic_id) == events
    assert state(restarted, "events", 1) == (2, [2, 1], 0, 1)


def test_create_topic_honours_a_manual_replica_assignment(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    topic = controller.create_topic("placed", 2, 2, {}, assignments=[[2, 3], [3, 2]])
    assert [(p.replicas, p.isr, p.leader) for p in topic.partitions] == [([2, 3], [2, 3], 2), ([3, 2], [3, 2], 3)]


@pytest.mark.parametrize("assignments", [[[4]], [[2, 2]], [[]], [[1, 2], [3]]])
def test_manual_assignments_naming_unknown_or_duplicated_brokers_are_refused(
    tmp_path: Path, assignments: list[list[int]]
) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    with pytest.raises(InvalidReplicaAssignmentError):
        controller.create_topic("placed", len(assignments), len(assignments[0]) or 1, {}, assignments=assignments)
    assert controller.topic("placed") is None


def test_the_cluster_id_and_topic_ids_come_from_the_id_source_it_is_given(tmp_path: Path) -> None:
    ids = iter(uuid.UUID(int=n, version=4) for n in range(1, 10))
    controller = Controller(SingleVoterMetadataLog(tmp_path), ControllerConfig(), 0, new_uuid=lambda: next(ids))
    assert controller.metadata.cluster_id == kafka_uuid_to_str(uuid.UUID(int=1, version=4))
    broker_epoch = controller.register_broker(1, "incarnation-1", "", endpoints(1), None, 0)
    controller.heartbeat(1, broker_epoch, controller.metadata.offset, False, False, 0)
    assert controller.create_topic("events", 1, 1, {}).topic_id == uuid.UUID(int=2, version=4)
