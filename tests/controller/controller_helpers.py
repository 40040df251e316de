"""A controller on a one-voter quorum's metadata log in a test's tmp_path, with its brokers registered and
unfenced."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

from tierlog.controller.controller import Controller, ControllerConfig, HeartbeatResult
from tierlog.controller.metadata_log import QuorumMetadataLog
from tierlog.metadata.image import PartitionRegistration
from tierlog.metadata.records import Endpoint
from tierlog.raft.quorum_state import QUORUM_STATE_FILE, FileQuorumStateStore
from tierlog.raft.raft_client import RaftClient, RaftConfig
from tierlog.raft.raft_log import METADATA_PARTITION, RaftLog

SESSION_TIMEOUT_MS = ControllerConfig().session_timeout_ms


def incarnation(node: int, run: int = 0) -> str:
    """A fixed incarnation id per (node, process start), so tests can re-register the same process."""
    return str(uuid.UUID(int=(run << 32) | node))


def endpoints(node: int) -> list[Endpoint]:
    return [Endpoint("PLAINTEXT", "localhost", 9092 + node)]


def single_voter(directory: Path, now_ms: int = 0) -> RaftClient:
    """A one-voter quorum: it leads at once and every append commits at once."""
    store = FileQuorumStateStore(directory / str(METADATA_PARTITION) / QUORUM_STATE_FILE, frozenset({1}))
    client = RaftClient(1, [1], RaftLog(directory, now_ms), store, RaftConfig(), now_ms, random.Random(1))
    assert client.is_active_leader()
    return client


class SingleVoterMetadataLog(QuorumMetadataLog):
    """The active controller's log on a one-voter quorum, which the test closes as a process exit would."""

    def __init__(self, directory: Path, now_ms: int = 0) -> None:
        self.client = single_voter(directory, now_ms)
        super().__init__(self.client, on_append=lambda: None)

    def close(self) -> None:
        self.client.log.close()


def open_controller(tmp_path: Path, now_ms: int = 0, **config: Any) -> Controller:
    return Controller(SingleVoterMetadataLog(tmp_path, now_ms), ControllerConfig(**config), now_ms)


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
    assert isinstance(controller.metadata_log, SingleVoterMetadataLog)
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
