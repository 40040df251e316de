"""`tierlog quorum status`, run as a person runs it, against stand-ins of a broker and of controllers that answer
ApiVersions, DescribeQuorum and DescribeCluster with canned answers through the broker's own connection code
(server/connection.py): the request it sends (DescribeQuorum of `__cluster_metadata` partition 0, as
kafka-metadata-quorum.sh's Admin client sends it) and what it prints (Kafka's `describe --status` and
`--replication`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cli_helpers import tierlog

from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.server.connection import serve_connection
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.server.kafka_apis import api_versions_response

API_API_VERSIONS, API_DESCRIBE_QUORUM, API_DESCRIBE_CLUSTER = 18, 55, 60
LEADER_CAUGHT_UP_MS = 1_700_000_010_000


def replica(s: Any, node_id: int, log_end_offset: int, last_fetch: int, last_caught_up: int) -> Any:
    return s.ReplicaState(
        replica_id=node_id,
        replica_directory_id=None,
        log_end_offset=log_end_offset,
        last_fetch_timestamp=last_fetch,
        last_caught_up_timestamp=last_caught_up,
    )


def quorum_answer(version: int, error: str | None = None) -> Any:
    """Leader 3000 (LEO 125) of epoch 7, HW 120; followers 3001 (LEO 120) and 3002 (LEO 100); observers 1, 2."""
    s = response_schema(API_DESCRIBE_QUORUM, version)
    voters = (
        replica(s, 3000, 125, -1, LEADER_CAUGHT_UP_MS),
        replica(s, 3001, 120, LEADER_CAUGHT_UP_MS - 50, LEADER_CAUGHT_UP_MS - 1000),
        replica(s, 3002, 100, LEADER_CAUGHT_UP_MS - 20, LEADER_CAUGHT_UP_MS - 6000),
    )
    observers = (
        replica(s, 1, 120, LEADER_CAUGHT_UP_MS - 10, LEADER_CAUGHT_UP_MS - 10),
        replica(s, 2, -1, -1, -1),
    )
    partition = s.PartitionData(
        partition_index=0,
        error_code=error_code(error),
        error_message=None,
        leader_id=3001 if error else 3000,
        leader_epoch=7,
        high_watermark=120,
        current_voters=() if error else voters,
        observers=() if error else observers,
    )
    nodes = tuple(
        s.Node(node_id=node_id, listeners=(s.Listener(name="CONTROLLER", host="127.0.0.1", port=port),))
        for node_id, port in ((3000, 9093), (3001, 9094), (3002, 9095))
    )
    return s.DescribeQuorumResponse(
        error_code=error_code(None),
        error_message=None,
        topics=(s.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),),
        nodes=() if error else nodes,
    )


class FakeNode:
    """A listener on 127.0.0.1 answering ApiVersions, DescribeQuorum (the canned quorum, `error` on the partition,
    or with `stalled` never) and DescribeCluster; `requests` records what came in, as (api key, version, body)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, error: str | None = None, stalled: bool = False) -> None:
        self.error = error
        self.stalled = stalled
        self.requests: list[tuple[int, int, Any]] = []
        self.handlers = {
            API_API_VERSIONS: self._api_versions,
            API_DESCRIBE_QUORUM: self._describe_quorum,
            API_DESCRIBE_CLUSTER: self._describe_cluster,
        }
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), loop
        ).result(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, self, 1 << 20, "PLAINTEXT")

    async def handle(self, request: Request) -> Any:
        self.requests.append((request.api_key, request.api_version, request.body))
        return await self.handlers[request.api_key](request)

    async def _api_versions(self, request: Request) -> Any:
        return api_versions_response(request, self.handlers.keys())

    async def _describe_quorum(self, request: Request) -> Any:
        if self.stalled:
            await asyncio.Event().wait()
        return quorum_answer(request.api_version, self.error)

    async def _describe_cluster(self, request: Request) -> Any:
        return response_schema(API_DESCRIBE_CLUSTER, request.api_version).DescribeClusterResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            error_message=None,
            endpoint_type=1,
            cluster_id="Hq1lNT4GRm2wbVNw1Y7b4Q",
            controller_id=1,
            brokers=(),
            cluster_authorized_operations=-(2**31),
        )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on a thread of its own, where the fake nodes serve while `tierlog` runs as a subprocess."""
    event_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=event_loop.run_forever, daemon=True)
    thread.start()
    try:
        yield event_loop
    finally:
        asyncio.run_coroutine_threadsafe(_cancel_connections(), event_loop).result(10)
        event_loop.call_soon_threadsafe(event_loop.stop)
        thread.join(10)
        event_loop.close()


async def _cancel_connections() -> None:
    """End the connections still served (a stalled one waits for ever) before the loop stops."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_status_through_a_broker_prints_kafkas_status_and_replication(loop: asyncio.AbstractEventLoop) -> None:
    broker = FakeNode(loop)
    ran = tierlog("quorum", "status", "-b", broker.address)
    assert ran.code == 0, ran.stderr
    lines = ran.stdout.splitlines()
    endpoints = ', "endpoints": ["CONTROLLER://127.0.0.1:{}"]'
    assert lines[:9] == [
        "ClusterId:              Hq1lNT4GRm2wbVNw1Y7b4Q",
        "LeaderId:               3000",
        "LeaderEpoch:            7",
        "HighWatermark:          120",
        "MaxFollowerLag:         25",
        "MaxFollowerLagTimeMs:   6000",
        'CurrentVoters:          [{"id": 3000'
        + endpoints.format(9093)
        + '}, {"id": 3001'
        + endpoints.format(9094)
        + '}, {"id": 3002'
        + endpoints.format(9095)
        + "}]",
        'CurrentObservers:       [{"id": 1}, {"id": 2}]',
        "",
    ]
    assert [line.split() for line in lines[9:]] == [
        ["NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status"],
        ["3000", "125", "0", "-1", str(LEADER_CAUGHT_UP_MS), "Leader"],
        ["3001", "120", "5", str(LEADER_CAUGHT_UP_MS - 50), str(LEADER_CAUGHT_UP_MS - 1000), "Follower"],
        ["3002", "100", "25", str(LEADER_CAUGHT_UP_MS - 20), str(LEADER_CAUGHT_UP_MS - 6000), "Follower"],
        ["1", "120", "5", str(LEADER_CAUGHT_UP_MS - 10), str(LEADER_CAUGHT_UP_MS - 10), "Observer"],
        ["2", "-1", "126", "-1", "-1", "Observer"],
    ]
    # What went out: the reachability probe's ApiVersions; then on the command's connection ApiVersions,
    # DescribeQuorum v2 of __cluster_metadata partition 0 and DescribeCluster.
    assert [(key, version) for key, version, _ in broker.requests] == [(18, 0), (18, 0), (55, 2), (60, 0)]
    asked = broker.requests[2][2]
    assert [(t.topic_name, [p.partition_index for p in t.partitions]) for t in asked.topics] == [
        ("__cluster_metadata", [0])
    ]


def test_json_has_every_replica_with_its_lag_and_role(loop: asyncio.AbstractEventLoop) -> None:
    ran = tierlog("quorum", "status", "-b", FakeNode(loop).address, "--json")
    assert ran.code == 0, ran.stderr
    document = json.loads(ran.stdout)
    assert {k: v for k, v in document.items() if k != "replicas"} == {
        "cluster_id": "Hq1lNT4GRm2wbVNw1Y7b4Q",
        "leader_id": 3000,
        "leader_epoch": 7,
        "high_watermark": 120,
        "max_follower_lag": 25,
        "max_follower_lag_time_ms": 6000,
    }
    assert document["replicas"][2] == {
        "node_id": 3002,
        "log_end_offset": 100,
        "last_fetch_timestamp": LEADER_CAUGHT_UP_MS - 20,
        "last_caught_up_timestamp": LEADER_CAUGHT_UP_MS - 6000,
        "lag": 25,
        "status": "Follower",
        "endpoints": ["CONTROLLER://127.0.0.1:9095"],
    }
    assert [(r["node_id"], r["status"]) for r in document["replicas"]] == [
        (3000, "Leader"),
        (3001, "Follower"),
        (3002, "Follower"),
        (1, "Observer"),
        (2, "Observer"),
    ]


def test_human_readable_times_are_how_long_ago(loop: asyncio.AbstractEventLoop) -> None:
    ran = tierlog("quorum", "status", "-b", FakeNode(loop).address, "--human-readable")
    assert ran.code == 0, ran.stderr
    leader_row = next(line for line in ran.stdout.splitlines() if line.split()[:1] == ["3000"])
    assert leader_row.split()[3] == "-1"
    assert leader_row.split()[5:] == ["ms", "ago", "Leader"]


def test_controllers_are_asked_in_turn_until_the_leader_answers(loop: asyncio.AbstractEventLoop) -> None:
    follower, leader = FakeNode(loop, error="NOT_LEADER_OR_FOLLOWER"), FakeNode(loop)
    ran = tierlog("quorum", "status", "--bootstrap-controller", f"{follower.address},{leader.address}")
    assert ran.code == 0, ran.stderr
    assert ran.first_line == "LeaderId:               3000"
    # A controller is not asked for the cluster id (DescribeCluster is a broker's).
    assert [key for key, _, _ in follower.requests][-2:] == [18, 55]
    assert [key for key, _, _ in leader.requests][-2:] == [18, 55]
    assert API_DESCRIBE_CLUSTER not in {key for key, _, _ in follower.requests + leader.requests}


def test_a_controller_that_does_not_answer_does_not_keep_the_leader_from_being_asked(
    loop: asyncio.AbstractEventLoop,
) -> None:
    stalled, leader = FakeNode(loop, stalled=True), FakeNode(loop)
    ran = tierlog("quorum", "status", "--bootstrap-controller", f"{stalled.address},{leader.address}", "--timeout", "5")
    assert ran.code == 0, ran.stderr
    assert ran.first_line == "LeaderId:               3000"
    assert ran.elapsed_s < 5


def test_no_controller_that_leads_is_one_line_naming_each_answer(loop: asyncio.AbstractEventLoop) -> None:
    first, second = FakeNode(loop, error="NOT_LEADER_OR_FOLLOWER"), FakeNode(loop, error="NOT_LEADER_OR_FOLLOWER")
    ran = tierlog("quorum", "status", "--bootstrap-controller", f"{first.address},{second.address}")
    assert ran.code == 1
    assert ran.stderr.splitlines() == [
        f"Error: cannot describe the controller quorum: {first.address}: NOT_LEADER_OR_FOLLOWER; "
        f"{second.address}: NOT_LEADER_OR_FOLLOWER"
    ]


def test_a_broker_and_a_controller_together_are_refused(loop: asyncio.AbstractEventLoop) -> None:
    node = FakeNode(loop)
    ran = tierlog("quorum", "status", "-b", node.address, "--bootstrap-controller", node.address)
    assert ran.code == 1
    assert ran.stderr.splitlines() == ["Error: give --bootstrap-server or --bootstrap-controller, not both"]
    assert node.requests == []
