"""A controller on a metadata log in a test's tmp_path, with its brokers registered and unfenced."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tierlog.controller.controller import Controller, ControllerConfig, HeartbeatResult
from tierlog.controller.metadata_log import DiskMetadataLog
from tierlog.metadata.image import PartitionRegistration
from tierlog.metadata.records import Endpoint

SESSION_TIMEOUT_MS = ControllerConfig().session_timeout_ms


def incarnation(node: int, run: int = 0) -> str:
    """A fixed incarnation id per (node, process start), so tests can re-register the same process."""
    return str(uuid.UUID(int=(run << 32) | node))


def endpoints(node: int) -> list[Endpoint]:
    return [Endpoint("PLAINTEXT", "localhost", 9092 + node)]


def open_controller(tmp_path: Path, now_ms: int = 0, **config: Any) -> Controller:
    return Controller(DiskMetadataLog(tmp_path), ControllerConfig(**config), now_ms)


def new_controller(tmp_path: Path, nodes: tuple[int, ...] = (1,), now_ms: int = 0, **config: Any) -> Controller:
    """Register each node (fenced, as every registration starts) and unfence it with a caught-up heartbeat."""
    controller = open_controller(tmp_path, now_ms, **config)
    for node in nodes:
        broker_epoch = controller.register_broker(node, incarnation(node), "", endpoints(node), None, now_ms)
        controller.heartbeat(node, broker_epoch, controller.metadata.offset, False, False, now_ms)
    return controller


def restart(controller: Controller, tmp_path: Path, now_ms: int = 0, **config: Any) -> Controller:
    """A new controller process on the same metadata log, as after a crash (nothing is flushed on close
    that the log did not already fsync)."""
    controller.metadata_log.close()
    return open_controller(tmp_path, now_ms, **config)


def heartbeat(
    controller: Controller, node: int, now_ms: int, *, want_fence: bool = False, want_shut_down: bool = False
) -> HeartbeatResult:
    """A heartbeat from the current registration of `node`, caught up with the whole metadata log."""
    broker = controller.metadata.brokers[node]
    return controller.heartbeat(
        node, broker.broker_epoch, controller.metadata.offset, want_fence, want_shut_down, now_ms
    )


def fence(controller: Controller, node: int, now_ms: int = 0) -> None:
    heartbeat(controller, node, now_ms, want_fence=True)


def offline_after_fencing_both(controller: Controller, topic_config: dict[str, str] | None = None) -> None:
    """events-0 on [1, 2]: 2 leaves the ISR, comes back unfenced but out of sync, then leader 1 is fenced."""
    controller.create_topic("events", 1, 2, topic_config or {})
    fence(controller, 2)
    assert state(controller) == (1, [1], 0, 1)
    heartbeat(controller, 2, 0)
    assert state(controller) == (1, [1], 0, 1), "unfencing does not put a broker back into the ISR"
    fence(controller, 1)


def partition(controller: Controller, topic: str = "events", partition_id: int = 0) -> PartitionRegistration:
    found = controller.topic(topic)
    assert found is not None, f"no topic {topic}"
    return found.partitions[partition_id]


def state(controller: Controller, topic: str = "events", partition_id: int = 0) -> tuple[int, list[int], int, int]:
    """(leader, ISR, leader epoch, partition epoch): what the election rules decide."""
    p = partition(controller, topic, partition_id)
    return p.leader, p.isr, p.leader_epoch, p.partition_epoch
