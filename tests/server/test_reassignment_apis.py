"""ControllerApis' AlterPartitionReassignments, ListPartitionReassignments and UnregisterBroker (docs/reassignment.md
#the-wire): Kafka's answers, given once what the request wrote is committed and NOT_CONTROLLER everywhere when the
leadership was lost first; and AlterPartition's NEW_LEADER_ELECTED when the ISR change it commits completes a
reassignment that moves the leadership (docs/reassignment.md#completion)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from asyncio_helpers import run_bounded
from kio.schema.errors import ErrorCode
from test_controller_apis_quorum import NOW, QuorumStandIn, controller

from tierlog.client.requests import (
    alter_partition_reassignments_request,
    list_partition_reassignments_request,
    request_schema,
    unregister_broker_request,
)
from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller
from tierlog.protocol.codec import Request
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.controller_apis import ControllerApis
from tierlog.server.controller_server import ControllerServer

TP = TopicPartition("events", 0)


def active_controller(tmp_path: Path) -> Controller:
    """Brokers 1 to 4 registered and unfenced; events-0 on [1, 2, 3]."""
    active, _ = controller(tmp_path)
    for node in (1, 2, 3, 4):
        epoch = active.register_broker(node, f"incarnation-{node}", "", [], None, NOW)
        active.heartbeat(node, epoch, active.metadata.offset, False, False, NOW)
    active.create_topic("events", 1, 3, {}, assignments=[[1, 2, 3]])
    return active


def ask(server: QuorumStandIn, api_key: int, version: int, body: Any) -> Any:
    apis = ControllerApis(KafkaConfig({}), cast(ControllerServer, server), AuthHelper(None, ["CONTROLLER"]))

    async def answer() -> Any:
        return await apis.handle(Request(api_key, version, 1, "test", body, 0))

    return run_bounded(answer)


def partition_errors(response: Any) -> dict[tuple[str, int], tuple[ErrorCode, str | None]]:
    return {
        (t.name, p.partition_index): (p.error_code, p.error_message) for t in response.responses for p in t.partitions
    }


def test_alter_answers_each_partition_once_the_accepted_changes_are_committed(tmp_path: Path) -> None:
    active = active_controller(tmp_path)
    server = QuorumStandIn(active, commits=True)
    body = alter_partition_reassignments_request(
        {TP: [2, 3, 4], TopicPartition("events", 3): [1], TopicPartition("nope", 0): [1]}, timeout_ms=1000
    )
    response = ask(server, 45, 0, body)
    assert (response.error_code, response.error_message) == (ErrorCode.none, None)
    assert partition_errors(response) == {
        ("events", 0): (ErrorCode.none, None),
        ("events", 3): (ErrorCode.unknown_topic_or_partition, "Unable to find partition events:3."),
        ("nope", 0): (ErrorCode.unknown_topic_or_partition, "Unable to find a topic named nope."),
    }
    assert server.waited == [active.metadata_log.end_offset - 1]

    listed = ask(server, 46, 0, list_partition_reassignments_request(None, timeout_ms=1000))
    assert listed.error_code == ErrorCode.none
    assert [
        (t.name, [(p.partition_index, p.replicas, p.adding_replicas, p.removing_replicas) for p in t.partitions])
        for t in listed.topics
    ] == [("events", [(0, (2, 3, 4, 1), (4,), (1,))])]
    # Named partitions that do not exist or are not reassigning are left out.
    named = ask(
        server,
        46,
        0,
        list_partition_reassignments_request([TopicPartition("events", 9), TopicPartition("nope", 0)], timeout_ms=1000),
    )
    assert named.topics == ()


def test_alter_answers_not_controller_everywhere_when_the_leadership_is_lost_first(tmp_path: Path) -> None:
    active = active_controller(tmp_path)
    server = QuorumStandIn(active, commits=False)
    response = ask(server, 45, 0, alter_partition_reassignments_request({TP: [2, 3, 4]}, timeout_ms=1000))
    assert response.error_code == ErrorCode.not_controller
    assert partition_errors(response)[("events", 0)][0] == ErrorCode.not_controller


def test_unregister_broker_answers_kafkas_codes(tmp_path: Path) -> None:
    active = active_controller(tmp_path)
    server = QuorumStandIn(active, commits=True)
    assert ask(server, 64, 0, unregister_broker_request(4)).error_code == ErrorCode.none
    assert 4 not in active.metadata.brokers
    unknown = ask(server, 64, 0, unregister_broker_request(4))
    assert (unknown.error_code, unknown.error_message) == (
        ErrorCode.broker_id_not_registered,
        "Broker ID 4 is not currently registered",
    )
    assert ask(QuorumStandIn(None, commits=True), 64, 0, unregister_broker_request(3)).error_code == (
        ErrorCode.not_controller
    )


def test_an_alter_partition_that_completes_a_reassignment_moving_the_leader_is_new_leader_elected(
    tmp_path: Path,
) -> None:
    active = active_controller(tmp_path)
    active.alter_partition_reassignments({TP: [2, 3, 4]})
    current = active.metadata.topics["events"].partitions[0]
    s = request_schema(56, 3)
    body = s.AlterPartitionRequest(
        broker_id=1,
        broker_epoch=active.metadata.brokers[1].broker_epoch,
        topics=(
            s.TopicData(
                topic_id=active.metadata.topics["events"].topic_id,
                partitions=(
                    s.PartitionData(
                        partition_index=0,
                        leader_epoch=current.leader_epoch,
                        new_isr_with_epochs=tuple(
                            s.BrokerState(broker_id=b, broker_epoch=active.metadata.brokers[b].broker_epoch)
                            for b in (1, 2, 3, 4)
                        ),
                        leader_recovery_state=0,
                        partition_epoch=current.partition_epoch,
                    ),
                ),
            ),
        ),
    )
    response = ask(QuorumStandIn(active, commits=True), 56, 3, body)
    (partition,) = response.topics[0].partitions
    assert partition.error_code == ErrorCode.new_leader_elected
    # Committed nonetheless: the reassignment is complete and broker 2 leads.
    completed = active.metadata.topics["events"].partitions[0]
    assert (completed.replicas, completed.isr, completed.leader) == ([2, 3, 4], [2, 3, 4], 2)
