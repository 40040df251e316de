"""A broker's controller channel finds the active controller among the voters (docs/quorum.md#active-controller):
against scripted controller listeners on 127.0.0.1, it moves on after NOT_CONTROLLER, after a voter that does
not answer and after a connection that fails, follows the leader a metadata Fetch answer names, and gives up
with ControllerUnavailableError once the call's timeout has passed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from asyncio_helpers import run_bounded

from tierlog.client.raft_requests import API_FETCH, raft_response
from tierlog.metadata.loader import MetadataFetchRequest
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.raft.messages import RaftFetchResponse
from tierlog.server.connection import serve_connection
from tierlog.server.controller_apis import API_BROKER_HEARTBEAT
from tierlog.server.controller_channel import ControllerUnavailableError, QuorumControllerChannel
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.server.kafka_apis import API_API_VERSIONS
from tierlog.testing.local_cluster import free_ports

# One try waits at most this long for a voter that does not answer.
TRY_TIMEOUT_MS = 300


@dataclass
class ScriptedVoter:
    """A controller listener that answers heartbeats as `active` says, and metadata fetches naming `leader`;
    `silent` takes requests and never answers them."""

    node_id: int
    active: bool = False
    silent: bool = False
    leader: int = -1
    heard: list[int] = field(default_factory=list)
    handlers: dict[int, Callable[[Request], Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # ApiVersions is served by every listener; the channel never asks it.
        self.handlers = {API_BROKER_HEARTBEAT: self.handle, API_FETCH: self.handle, API_API_VERSIONS: self.handle}

    async def handle(self, request: Request) -> Any:
        self.heard.append(request.api_key)
        if self.silent:
            await asyncio.sleep(3600)
        s = response_schema(request.api_key, request.api_version)
        if request.api_key == API_BROKER_HEARTBEAT:
            return s.BrokerHeartbeatResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code(None if self.active else "NOT_CONTROLLER"),
                is_caught_up=True,
                is_fenced=False,
                should_shut_down=False,
            )
        # The metadata fetch as a Raft leader (or a voter naming it) answers it, through the project's codec.
        answer = RaftFetchResponse(None if self.active else "NOT_LEADER_OR_FOLLOWER", self.leader, 3, high_watermark=7)
        return raft_response(answer, request.api_version)


@asynccontextmanager
async def listening(voters: list[ScriptedVoter], dead: int = 0) -> AsyncIterator[list[tuple[int | None, str, int]]]:
    """The voters on free ports, then `dead` more addresses nobody listens on; yields every address."""
    ports = free_ports(len(voters) + dead)
    servers = []
    for voter, port in zip(voters, ports, strict=False):

        async def accept(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, voter: ScriptedVoter = voter
        ) -> None:
            await serve_connection(reader, writer, voter, 1 << 20, "CONTROLLER")  # type: ignore[arg-type]

        servers.append(await asyncio.start_server(accept, "127.0.0.1", port))
    addresses: list[tuple[int | None, str, int]] = [
        (v.node_id, "127.0.0.1", p) for v, p in zip(voters, ports, strict=False)
    ]
    addresses += [(len(voters) + 1 + i, "127.0.0.1", port) for i, port in enumerate(ports[len(voters) :])]
    try:
        yield addresses
    finally:
        for server in servers:
            server.close()


def channel(servers: list[tuple[int | None, str, int]], request_timeout_ms: int = 5000) -> QuorumControllerChannel:
    return QuorumControllerChannel(
        servers,
        local=None,
        client_id="test-broker",
        request_timeout_ms=request_timeout_ms,
        quorum_request_timeout_ms=TRY_TIMEOUT_MS,
        retry_backoff_ms=10,
    )


def test_not_controller_answers_move_the_call_on_until_the_active_controller_answers() -> None:
    voters = [ScriptedVoter(1), ScriptedVoter(2), ScriptedVoter(3, active=True)]

    async def scenario() -> None:
        async with listening(voters) as servers:
            to_controller = channel(servers)
            result = await to_controller.heartbeat(4, 10, 0, False, False)
            assert not result.is_fenced
            assert [len(v.heard) for v in voters] == [1, 1, 1]
            # The guess stays on the voter that answered.
            await to_controller.heartbeat(4, 10, 0, False, False)
            assert [len(v.heard) for v in voters] == [1, 1, 2]
            await to_controller.close()

    run_bounded(scenario)


def test_a_dead_voter_and_one_that_does_not_answer_are_passed_over() -> None:
    voters = [ScriptedVoter(1, silent=True), ScriptedVoter(2, active=True)]

    async def scenario() -> None:
        async with listening(voters, dead=1) as servers:
            # The dead address first: connection refused, then the silent voter: the try's timeout.
            to_controller = channel([servers[2], servers[0], servers[1]])
            started = asyncio.get_running_loop().time()
            await to_controller.heartbeat(4, 10, 0, False, False)
            assert asyncio.get_running_loop().time() - started >= TRY_TIMEOUT_MS / 1000
            assert [len(v.heard) for v in voters] == [1, 1]
            await to_controller.close()

    run_bounded(scenario)


def test_with_no_active_controller_the_call_fails_once_its_timeout_has_passed() -> None:
    voters = [ScriptedVoter(1), ScriptedVoter(2)]

    async def scenario() -> None:
        async with listening(voters) as servers:
            to_controller = channel(servers, request_timeout_ms=400)
            with pytest.raises(ControllerUnavailableError, match="no active controller answered the heartbeat"):
                await to_controller.heartbeat(4, 10, 0, False, False)
            assert all(len(v.heard) > 1 for v in voters), "it kept trying every voter until the timeout"
            await to_controller.close()

    run_bounded(scenario)


def test_a_metadata_fetch_follows_the_leader_a_voter_names() -> None:
    voters = [ScriptedVoter(1, leader=3), ScriptedVoter(2, leader=3), ScriptedVoter(3, active=True, leader=3)]

    async def scenario() -> None:
        async with listening(voters) as servers:
            to_controller = channel(servers)
            batches, high_watermark = await to_controller.fetch_metadata(4, MetadataFetchRequest(0, 0, 0))
            assert (batches.records, high_watermark) == ([], 7)
            # Voter 1 named voter 3; voter 2 was never asked.
            assert [len(v.heard) for v in voters] == [1, 0, 1]
            await to_controller.close()

    run_bounded(scenario)
