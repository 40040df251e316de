"""The controller validates topic changes the way Kafka does and persists every change before showing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierlog.controller.controller import Controller
from tierlog.controller.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicDeletionDisabledError,
    TopicExistsError,
    UnknownTopicError,
)
from tierlog.controller.metadata import FileMetadataStore


def new_controller(tmp_path: Path, nodes: tuple[int, ...] = (1,)) -> Controller:
    return Controller(FileMetadataStore(tmp_path), lambda: list(nodes))


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a" * 250, "has space", "slash/name", "ünïcode"]
)
def test_illegal_topic_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidTopicError):
        new_controller(tmp_path).create_topic(name, 1, 1, {})


def test_topic_names_colliding_on_dot_and_underscore_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("a.b", 1, 1, {})
    with pytest.raises(InvalidTopicError, match="collides"):
        controller.create_topic("a_b", 1, 1, {})


def test_create_topic_assigns_every_partition_to_a_leader_and_persists(tmp_path: Path) -> None:
    controller = new_controller(tmp_path, nodes=(1, 2, 3))
    topic = controller.create_topic("events", 3, 2, {"retention.ms": "1000"})
    assert [p.replicas for p in topic.partitions] == [[1, 2], [2, 3], [3, 1]]
    assert all(p.leader == p.replicas[0] and p.isr == p.replicas for p in topic.partitions)
    reloaded = new_controller(tmp_path, nodes=(1, 2, 3))
    assert reloaded.metadata == controller.metadata
    assert reloaded.topic("events") is not None
    assert reloaded.topic("events").configs == {"retention.ms": "1000"}  # type: ignore[union-attr]


def test_validate_only_changes_nothing(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 2, 1, {}, validate_only=True)
    assert controller.topic("events") is None
    assert new_controller(tmp_path).topic("events") is None


def test_duplicate_topic_and_bad_counts_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 1, 1, {})
    with pytest.raises(TopicExistsError):
        controller.create_topic("events", 1, 1, {})
    with pytest.raises(InvalidPartitionsError):
        controller.create_topic("zero", 0, 1, {})
    with pytest.raises(InvalidReplicationFactorError, match="only 1 broker"):
        controller.create_topic("wide", 1, 3, {})


def test_unknown_or_invalid_topic_configs_are_refused(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    with pytest.raises(InvalidConfigError):
        controller.create_topic("events", 1, 1, {"no.such.config": "1"})
    with pytest.raises(InvalidConfigError):
        controller.create_topic("events", 1, 1, {"segment.bytes": "lots"})
    assert controller.topic("events") is None


def test_partitions_only_grow(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 2, 1, {})
    with pytest.raises(InvalidPartitionsError):
        controller.create_partitions("events", 1)
    with pytest.raises(InvalidPartitionsError):
        controller.create_partitions("events", 2)
    controller.create_partitions("events", 5)
    assert len(new_controller(tmp_path).topic("events").partitions) == 5  # type: ignore[union-attr]


def test_delete_topic(tmp_path: Path) -> None:
    controller = new_controller(tmp_path)
    controller.create_topic("events", 1, 1, {})
    with pytest.raises(TopicDeletionDisabledError):
        controller.delete_topic("events", deletion_enabled=False)
    controller.delete_topic("events")
    assert new_controller(tmp_path).topic("events") is None
    with pytest.raises(UnknownTopicError):
        controller.delete_topic("events")


def test_cluster_id_is_stable_across_restarts(tmp_path: Path) -> None:
    first = new_controller(tmp_path).metadata.cluster_id
    assert len(first) == 22
    assert new_controller(tmp_path).metadata.cluster_id == first
