"""Voters of the controller quorum in one event loop, for tests: each a RaftManager serving its controller listener
on a free 127.0.0.1 port with the controller's own request handling (serve_connection -> ControllerApis), over
PLAINTEXT or SSL as the configuration says. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlog.client.raft_requests import API_FETCH
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.records.codec import decode_batches
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.security.authorizer import StandardAuthorizer, parse_super_users
from tierlog.security.ssl_context import SslPrincipalMapper
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.connection import serve_connection
from tierlog.server.controller_apis import ControllerApis
from tierlog.server.controller_server import ControllerServer
from tierlog.server.kafka_apis import API_API_VERSIONS
from tierlog.server.raft_manager import RaftManager
from tierlog.testing.local_cluster import free_ports

# Short timers, so an election takes well under a second; the test deadline bounds everything else.
QUORUM_TIMERS = {
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "200",
    "controller.quorum.request.timeout.ms": "1000",
}
WAIT_S = 10.0


class ControllerListenerApis:
    """What these tests' controller listeners serve: the quorum's APIs and the metadata Fetch, exactly as the
    broker's KafkaApis hands them to ControllerApis on a controller node."""

    def __init__(self, controller_apis: ControllerApis) -> None:
        self.handlers: dict[int, Callable[[Request], Awaitable[Any]]] = {
            **controller_apis.quorum_handlers,
            API_FETCH: controller_apis.handle_metadata_fetch,
            API_API_VERSIONS: self._api_versions,
        }

    @staticmethod
    async def _api_versions(request: Request) -> Any:
        raise AssertionError("the Raft manager does not negotiate versions")

    async def handle(self, request: Request) -> Any:
        return await self.handlers[request.api_key](request)


@dataclass
class Voter:
    config: KafkaConfig
    controller_server: ControllerServer
    server: asyncio.Server | None = None
    connections: dict[asyncio.Task[None], asyncio.StreamWriter] = field(default_factory=dict)

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def raft(self) -> RaftManager:
        return self.controller_server.raft

    async def serve(self) -> None:
        config = self.config
        authorizer = None
        if config.get("authorizer.class.name"):
            authorizer = StandardAuthorizer(
                parse_super_users(config.get("super.users")),
                allow_everyone_if_no_acl_found=config.get_bool("allow.everyone.if.no.acl.found"),
            )
        apis = ControllerListenerApis(
            ControllerApis(config, self.controller_server, AuthHelper(authorizer, ["CONTROLLER"]))
        )
        host, port = config.quorum_voters[self.node_id]
        protocol = config.security_protocol_of("CONTROLLER")
        mapper = SslPrincipalMapper(config.ssl_settings("CONTROLLER").principal_mapping_rules)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.connections[task] = writer
            try:
                await serve_connection(
                    reader,
                    writer,
                    apis,  # type: ignore[arg-type]
                    1 << 20,
                    "CONTROLLER",
                    security_protocol=protocol,
                    ssl_principal_mapper=mapper,
                )
            finally:
                del self.connections[task]
                writer.close()

        self.server = await asyncio.start_server(accept, host, port, ssl=config.server_ssl_context("CONTROLLER"))

    async def close_listener(self) -> None:
        """Nobody reaches this voter any more: its listener and every connection to it close."""
        assert self.server is not None
        self.server.close()
        for writer in self.connections.values():
            writer.transport.abort()
        # A request being answered (a parked fetch) finishes within its max wait, then finds the connection gone.
        if self.connections:
            await asyncio.wait(list(self.connections), timeout=WAIT_S)
        await self.server.wait_closed()

    async def crash(self) -> None:
        """kill -9, as far as one event loop allows: the listener goes, the driver and every send stop mid-way,
        nothing resigns and nothing is closed cleanly."""
        await self.close_listener()
        tasks = [self.raft._driver, *self.raft._sends] if self.raft._driver else []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def voter_configs(tmp_path: Path, count: int, overrides: Mapping[str, str]) -> list[KafkaConfig]:
    ports = free_ports(2 * count)
    voters = ",".join(f"{i + 1}@127.0.0.1:{ports[count + i]}" for i in range(count))
    return [
        KafkaConfig(
            {
                "node.id": str(i + 1),
                "process.roles": "broker,controller",
                "listeners": f"PLAINTEXT://127.0.0.1:{ports[i]},CONTROLLER://127.0.0.1:{ports[count + i]}",
                "controller.listener.names": "CONTROLLER",
                "controller.quorum.voters": voters,
                "log.dirs": str(tmp_path / f"node-{i + 1}"),
                **QUORUM_TIMERS,
                **overrides,
            }
        )
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def quorum(tmp_path: Path, count: int, overrides: Mapping[str, str] | None = None) -> AsyncIterator[list[Voter]]:
    voters = [Voter(config, ControllerServer(config)) for config in voter_configs(tmp_path, count, overrides or {})]
    for voter in voters:
        await voter.serve()
    for voter in voters:
        await voter.raft.start()
    try:
        yield voters
    finally:
        for voter in voters:
            if voter.server is not None and voter.server.is_serving():
                await voter.close_listener()
            await voter.raft.stop()


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {what} within {timeout_s}s")
        await asyncio.sleep(0.02)


async def active_leader(voters: list[Voter]) -> Voter:
    """The one active leader, once every given voter follows it."""

    def agreed() -> bool:
        leaders = [v for v in voters if v.raft.client.is_active_leader()]
        return len(leaders) == 1 and all(v.raft.client.leader_id == leaders[0].node_id for v in voters)

    await wait_for(agreed, "active leader every voter follows")
    return next(v for v in voters if v.raft.client.is_active_leader())


def committed_values(voter: Voter) -> list[bytes]:
    """The values of the data records in the voter's committed log (control batches skipped)."""
    data = voter.raft.client.read_committed(0, 1 << 20)
    values = []
    for position, size in complete_batches(data):
        if read_header(data, position).is_control:
            continue
        for batch in decode_batches(data[position : position + size]):
            values.extend(record.value for record in batch.records)
    return values


async def append_and_commit(leader: Voter, values: list[bytes]) -> int:
    first = leader.raft.client.append(values, now_ms())
    leader.raft.poke()
    last = first + len(values) - 1
    assert await leader.raft.wait_for_commit(last, WAIT_S)
    return last
