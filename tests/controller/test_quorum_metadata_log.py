"""The controller on the quorum's log: appends go through the Raft client as one batch per operation, reads
skip the leaders' LeaderChangeMessage batches, the first active controller writes the cluster id even though
the log is not empty, and a controller that lost leadership appends nothing and answers NOT_CONTROLLER."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.errors import NotControllerError
from tierlog.controller.metadata_log import QuorumMetadataLog
from tierlog.metadata.records import ClusterIdRecord, ProducerIdsRecord
from tierlog.raft.raft_client import NotLeaderError, RaftClient
from tierlog.raft.raft_log import RaftLog
from tierlog.records.codec import decode_batches

NOW = 1_700_000_000_000


class LeaderOfOneEpoch:
    """The part of RaftClient the controller's log uses: a voter that leads `epoch` until `depose`."""

    def __init__(self, log: RaftLog, epoch: int) -> None:
        self.log = log
        self.epoch = epoch
        self.leading = True
        log.append_leader_change(1, [1, 2, 3], [1, 2], epoch, NOW)

    def append(self, values: Sequence[bytes], now_ms: int) -> int:
        if not self.leading:
            raise NotLeaderError(f"not the leader of epoch {self.epoch}")
        return self.log.append_values(values, self.epoch, now_ms)


def quorum_log(tmp_path: Path, epoch: int = 1) -> tuple[QuorumMetadataLog, LeaderOfOneEpoch, list[int]]:
    client = LeaderOfOneEpoch(RaftLog(tmp_path, NOW), epoch)
    pokes: list[int] = []
    log = QuorumMetadataLog(cast(RaftClient, client), lambda: pokes.append(client.log.end_offset))
    return log, client, pokes


def test_each_operation_is_one_batch_of_the_leaders_epoch_and_wakes_the_driver(tmp_path: Path) -> None:
    log, client, pokes = quorum_log(tmp_path, epoch=4)
    assert log.end_offset == 1, "the leader's LeaderChangeMessage comes first"
    assert log.append([ClusterIdRecord("c"), ProducerIdsRecord(1, 1000)], NOW) == 1
    assert log.append([ProducerIdsRecord(2, 2000)], NOW) == 3
    assert pokes == [3, 4]
    batches = list(decode_batches(client.log.read(0, 1 << 20)))
    assert [(b.header.base_offset, b.header.records_count, b.header.is_control) for b in batches] == [
        (0, 1, True),
        (1, 2, False),
        (3, 1, False),
    ]
    assert {b.header.partition_leader_epoch for b in batches} == {4}
    with pytest.raises(ValueError, match="at least one record"):
        log.append([], NOW)


def test_records_from_skips_control_batches_at_any_offset(tmp_path: Path) -> None:
    log, client, _ = quorum_log(tmp_path)
    log.append([ClusterIdRecord("c")], NOW)
    client.log.append_leader_change(2, [1, 2, 3], [2, 3], 2, NOW)
    client.epoch = 2
    log.append([ProducerIdsRecord(1, 1000), ProducerIdsRecord(2, 2000)], NOW)
    assert log.records_from(0) == [
        (1, ClusterIdRecord("c")),
        (3, ProducerIdsRecord(1, 1000)),
        (4, ProducerIdsRecord(2, 2000)),
    ]
    assert log.records_from(2) == [(3, ProducerIdsRecord(1, 1000)), (4, ProducerIdsRecord(2, 2000))]
    assert log.records_from(4) == [(4, ProducerIdsRecord(2, 2000))]
    assert log.records_from(5) == []


def test_the_first_active_controller_writes_the_cluster_id_after_the_leader_change(tmp_path: Path) -> None:
    log, _, _ = quorum_log(tmp_path)
    controller = Controller(log, ControllerConfig(), NOW)
    cluster_id = controller.metadata.cluster_id
    assert cluster_id
    assert log.records_from(0) == [(1, ClusterIdRecord(cluster_id))]


def test_a_later_active_controller_keeps_the_cluster_id_the_log_holds(tmp_path: Path) -> None:
    log, client, _ = quorum_log(tmp_path)
    first = Controller(log, ControllerConfig(), NOW)
    client.log.append_leader_change(2, [1, 2, 3], [2, 3], 2, NOW)
    client.epoch = 2
    end = log.end_offset
    second = Controller(log, ControllerConfig(), NOW)
    assert second.metadata.cluster_id == first.metadata.cluster_id
    assert log.end_offset == end, "nothing is written when the image has a cluster id"


def test_a_controller_that_lost_leadership_appends_nothing_and_answers_not_controller(tmp_path: Path) -> None:
    log, client, pokes = quorum_log(tmp_path)
    controller = Controller(log, ControllerConfig(), NOW)
    end = log.end_offset
    client.leading = False
    with pytest.raises(NotControllerError) as refused:
        controller.allocate_producer_id_block(1)
    assert refused.value.error_name == "NOT_CONTROLLER"
    assert log.end_offset == end
    assert pokes == [end], "only the cluster id's append woke the driver"
    assert controller.metadata.next_producer_id == 0, "the image shows only what was appended"
