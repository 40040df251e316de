"""AlterPartition is a compare-and-set of the ISR by the current leader: every stale or ineligible request is
refused with Kafka's error and writes nothing; an accepted one bumps only the partition epoch."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from controller_helpers import heartbeat, new_controller, state

from tierlog.controller.controller import Controller
from tierlog.controller.errors import ControllerError
from tierlog.metadata.image import IsrChange, PartitionRegistration
from tierlog.metadata.records import PartitionRecord


def setup(tmp_path: Path, nodes: tuple[int, ...] = (1, 2, 3, 4)) -> tuple[Controller, uuid.UUID]:
    controller = new_controller(tmp_path, nodes=nodes)
    topic = controller.create_topic("events", 1, 3, {})
    assert state(controller) == (1, [1, 2, 3], 0, 0)
    return controller, topic.topic_id


def alter(
    controller: Controller,
    topic_id: uuid.UUID,
    new_isr: Sequence[int],
    *,
    broker_id: int = 1,
    leader_epoch: int = 0,
    partition_epoch: int = 0,
    partition: int = 0,
    broker_epoch: int | None = None,
) -> PartitionRegistration:
    if broker_epoch is None:
        broker_epoch = controller.metadata.brokers[broker_id].broker_epoch
    return controller.alter_partition(
        broker_id, broker_epoch, topic_id, partition, leader_epoch, partition_epoch, new_isr
    )


def test_an_isr_change_bumps_only_the_partition_epoch(tmp_path: Path) -> None:
    controller, topic_id = setup(tmp_path)
    end = controller.metadata_log.end_offset
    shrunk = alter(controller, topic_id, [1, 2])
    assert shrunk == PartitionRegistration([1, 2, 3], [1, 2], 1, 0, 1)
    assert controller.metadata_log.records_from(end) == [
        (end, PartitionRecord(topic_id, 0, (1, 2, 3), (1, 2), 1, 0, 1))
    ]
    expanded = alter(controller, topic_id, [1, 2, 3], partition_epoch=1)
    assert expanded == PartitionRegistration([1, 2, 3], [1, 2, 3], 1, 0, 2)
    assert state(controller) == (1, [1, 2, 3], 0, 2)


def test_a_retry_with_the_current_isr_returns_the_registration_unchanged(tmp_path: Path) -> None:
    controller, topic_id = setup(tmp_path)
    alter(controller, topic_id, [1, 2])
    end = controller.metadata_log.end_offset
    assert alter(controller, topic_id, [1, 2], partition_epoch=1) == PartitionRegistration([1, 2, 3], [1, 2], 1, 0, 1)
    assert controller.metadata_log.end_offset == end


@pytest.mark.parametrize(
    ("request_fields", "error_name"),
    [
        ({"broker_epoch": 0}, "STALE_BROKER_EPOCH"),
        ({"broker_id": 9, "broker_epoch": 3}, "STALE_BROKER_EPOCH"),
        ({"topic_id": uuid.UUID(int=7)}, "UNKNOWN_TOPIC_ID"),
        ({"partition": 1}, "UNKNOWN_TOPIC_OR_PARTITION"),
        ({"leader_epoch": 1}, "FENCED_LEADER_EPOCH"),
        ({"broker_id": 2}, "NOT_LEADER_OR_FOLLOWER"),
        ({"partition_epoch": 1}, "INVALID_UPDATE_VERSION"),
        ({"new_isr": [2, 3]}, "INELIGIBLE_REPLICA"),
        ({"new_isr": []}, "INELIGIBLE_REPLICA"),
        ({"new_isr": [1, 4]}, "INELIGIBLE_REPLICA"),
        ({"new_isr": [1, 9]}, "INELIGIBLE_REPLICA"),
        ({"new_isr": [1, 2, 2]}, "INVALID_REQUEST"),
    ],
)
def test_refusals(tmp_path: Path, request_fields: dict[str, object], error_name: str) -> None:
    controller, topic_id = setup(tmp_path)
    fields: dict[str, object] = {"topic_id": topic_id, "new_isr": [1, 2], **request_fields}
    end = controller.metadata_log.end_offset
    with pytest.raises(ControllerError) as refused:
        alter(controller, **fields)  # type: ignore[arg-type]
    assert refused.value.error_name == error_name
    assert controller.metadata_log.end_offset == end
    assert state(controller) == (1, [1, 2, 3], 0, 0)


def test_a_fenced_replica_may_not_join_the_isr(tmp_path: Path) -> None:
    controller, topic_id = setup(tmp_path)
    heartbeat(controller, 3, 0, want_fence=True)
    assert state(controller) == (1, [1, 2], 0, 1)
    with pytest.raises(ControllerError) as refused:
        alter(controller, topic_id, [1, 2, 3], partition_epoch=1)
    assert refused.value.error_name == "INELIGIBLE_REPLICA"
    heartbeat(controller, 3, 0)
    assert alter(controller, topic_id, [1, 2, 3], partition_epoch=1).isr == [1, 2, 3]


def test_a_replica_in_controlled_shutdown_may_not_join_the_isr(tmp_path: Path) -> None:
    controller, topic_id = setup(tmp_path)
    heartbeat(controller, 3, 0, want_shut_down=True)
    with pytest.raises(ControllerError) as refused:
        alter(controller, topic_id, [1, 2, 3], partition_epoch=1)
    assert refused.value.error_name == "INELIGIBLE_REPLICA"


def test_a_deposed_leader_is_fenced_by_the_leader_epoch(tmp_path: Path) -> None:
    controller, topic_id = setup(tmp_path)
    heartbeat(controller, 1, 0, want_fence=True)
    heartbeat(controller, 1, 0)
    assert state(controller) == (2, [2, 3], 1, 1)
    with pytest.raises(ControllerError) as refused:
        alter(controller, topic_id, [1, 2])
    assert refused.value.error_name == "FENCED_LEADER_EPOCH"
    assert alter(controller, topic_id, [2, 3, 1], broker_id=2, leader_epoch=1, partition_epoch=1).isr == [2, 3, 1]


def test_a_fenced_broker_is_refused_even_with_current_epochs(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1,))
    topic_id = controller.create_topic("events", 1, 1, {}).topic_id
    heartbeat(controller, 1, 0, want_fence=True)
    assert state(controller) == (-1, [1], 1, 1)
    with pytest.raises(ControllerError) as refused:
        alter(controller, topic_id, [1], leader_epoch=1, partition_epoch=1)
    assert refused.value.error_name == "NOT_LEADER_OR_FOLLOWER"


def test_the_changes_of_one_request_are_committed_together_each_decided_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One AlterPartition request is one metadata commit however many partitions it changes (each commit is a
    publish on every broker); a refused change refuses only its own partition."""
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    topic = controller.create_topic("events", 6, 3, {})
    led = [index for index, p in enumerate(topic.partitions) if p.leader == 1]
    assert len(led) >= 2
    appends: list[int] = []
    append = controller.metadata_log.append
    monkeypatch.setattr(
        controller.metadata_log,
        "append",
        lambda records, now_ms: appends.append(len(records)) or append(records, now_ms),
    )
    shrink = [IsrChange(topic.topic_id, index, 0, 0, [1, 2]) for index in led]
    stale = IsrChange(topic.topic_id, led[0], 0, 7, [1, 2])
    outcomes = controller.alter_partitions(1, controller.metadata.brokers[1].broker_epoch, [*shrink, stale])
    assert appends == [len(led)]
    assert [o.isr for o in outcomes[:-1]] == [[1, 2]] * len(led)  # type: ignore[union-attr]
    assert [o.partition_epoch for o in outcomes[:-1]] == [1] * len(led)  # type: ignore[union-attr]
    assert isinstance(outcomes[-1], ControllerError) and outcomes[-1].error_name == "INVALID_UPDATE_VERSION"
