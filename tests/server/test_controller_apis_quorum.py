"""ControllerApis on the quorum (docs/quorum.md#active-controller): a controller that is not the active one answers
NOT_CONTROLLER and writes nothing; the active one answers once what the request wrote is committed, and
NOT_CONTROLLER, for the whole request, if it lost its leadership before that."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from asyncio_helpers import run_bounded

from tierlog.client.requests import CREATE_TOPICS_VERSION, create_topics_request
from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import QuorumMetadataLog
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.raft.raft_client import NotLeaderError, RaftClient
from tierlog.raft.raft_log import RaftLog
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.controller_apis import API_CREATE_TOPICS, ControllerApis
from tierlog.server.controller_server import ControllerServer

NOW = 1_700_000_000_000


class OneVoterLog:
    """The part of RaftClient the controller's log uses: the leader of epoch 1 until `depose`."""

    def __init__(self, log: RaftLog) -> None:
        self.log = log
        self.leading = True
        log.append_leader_change(1, [1], [1], 1, NOW)

    def append(self, values: Sequence[bytes], now_ms: int) -> int:
        if not self.leading:
            raise NotLeaderError("deposed")
        return self.log.append_values(values, 1, now_ms)


class QuorumStandIn:
    """ControllerServer's side ControllerApis uses: the active controller (or None) and the commit wait, whose
    outcome the test decides: committed, or leadership lost first (the controller is dropped then)."""

    def __init__(self, controller: Controller | None, commits: bool) -> None:
        self.controller = controller
        self.commits = commits
        self.waited: list[int] = []

    async def wait_for_commit(self, controller: Controller) -> bool:
        self.waited.append(controller.metadata_log.end_offset - 1)
        await asyncio.sleep(0)
        if not self.commits:
            self.controller = None
        return self.commits


def controller(tmp_path: Path) -> tuple[Controller, OneVoterLog]:
    client = OneVoterLog(RaftLog(tmp_path, NOW))
    log = QuorumMetadataLog(cast(RaftClient, client), lambda: None)
    return Controller(log, ControllerConfig(), NOW), client


def create_topics(server: QuorumStandIn, *names: str) -> Any:
    apis = ControllerApis(
        KafkaConfig({"num.partitions": "1"}), cast(ControllerServer, server), AuthHelper(None, ["CONTROLLER"])
    )
    body = create_topics_request(names[0], 1, -1, {}, timeout_ms=1000)
    topics = tuple(dataclasses.replace(body.topics[0], name=name) for name in names)
    request = Request(API_CREATE_TOPICS, CREATE_TOPICS_VERSION, 1, "test", dataclasses.replace(body, topics=topics), 0)

    async def ask() -> Any:
        return await apis.handle(request)

    return run_bounded(ask)


def test_a_controller_that_is_not_active_answers_not_controller(tmp_path: Path) -> None:
    server = QuorumStandIn(None, commits=True)
    response = create_topics(server, "a", "b")
    assert [t.error_code for t in response.topics] == [error_code("NOT_CONTROLLER")] * 2
    assert server.waited == [], "nothing was written, so nothing is waited for"


def test_the_active_controller_answers_once_what_it_wrote_is_committed(tmp_path: Path) -> None:
    active, _ = controller(tmp_path)
    active.register_broker(1, "incarnation", "", [], None, NOW)
    active.heartbeat(1, active.metadata.brokers[1].broker_epoch, active.metadata.offset, False, False, NOW)
    server = QuorumStandIn(active, commits=True)
    response = create_topics(server, "a")
    assert [t.error_code for t in response.topics] == [error_code(None)]
    assert server.waited == [active.metadata_log.end_offset - 1]
    assert active.topic("a") is not None


def test_leadership_lost_before_the_commit_turns_the_whole_answer_into_not_controller(tmp_path: Path) -> None:
    active, _ = controller(tmp_path)
    active.register_broker(1, "incarnation", "", [], None, NOW)
    active.heartbeat(1, active.metadata.brokers[1].broker_epoch, active.metadata.offset, False, False, NOW)
    server = QuorumStandIn(active, commits=False)
    response = create_topics(server, "a", "b")
    assert [t.error_code for t in response.topics] == [error_code("NOT_CONTROLLER")] * 2
    assert len(server.waited) == 1


def test_an_append_refused_by_a_deposed_leader_is_not_controller(tmp_path: Path) -> None:
    active, client = controller(tmp_path)
    active.register_broker(1, "incarnation", "", [], None, NOW)
    active.heartbeat(1, active.metadata.brokers[1].broker_epoch, active.metadata.offset, False, False, NOW)
    client.leading = False
    server = QuorumStandIn(active, commits=False)
    response = create_topics(server, "a")
    assert [t.error_code for t in response.topics] == [error_code("NOT_CONTROLLER")]
    assert active.topic("a") is None, "the image shows only what was appended"
