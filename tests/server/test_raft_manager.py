"""RaftManager over real sockets: three voters in one event loop, each serving its controller listener on a free
127.0.0.1 port with the controller's own request handling (serve_connection -> ControllerApis), elect one leader,
commit appends on a majority, and elect another when the leader stops or dies. Every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from asyncio_helpers import run_bounded

from tierlog.client.connection import KafkaConnection
from tierlog.client.raft_requests import API_FETCH, raft_request, raft_response_of
from tierlog.client.requests import request_schema
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.raft.messages import RaftFetchRequest, VoteRequest
from tierlog.records.record_batch import complete_batches, read_header
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
    raft: RaftManager
    server: asyncio.Server | None = None
    connections: dict[asyncio.Task[None], asyncio.StreamWriter] = field(default_factory=dict)

    @property
    def node_id(self) -> int:
        return self.config.node_id

    async def serve(self) -> None:
        apis = ControllerListenerApis(
            ControllerApis(self.config, ControllerServer(self.config), AuthHelper(None, ["CONTROLLER"]), self.raft)
        )
        host, port = self.config.quorum_voters[self.node_id]

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.connections[task] = writer
            try:
                await serve_connection(reader, writer, apis, 1 << 20, "CONTROLLER")  # type: ignore[arg-type]
            finally:
                del self.connections[task]
                writer.close()

        self.server = await asyncio.start_server(accept, host, port)

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


def voter_configs(tmp_path: Path, count: int) -> list[KafkaConfig]:
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
            }
        )
        for i in range(count)
    ]


@pytest.fixture
def several_voters_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """KafkaConfig still refuses more than one voter on this branch (the controller does not run on the quorum
    yet); the Raft manager alone needs nothing else of the configuration."""
    original = KafkaConfig._check_quorum

    def check_all_but_the_count(self: KafkaConfig) -> None:
        voters = self.get_list("controller.quorum.voters")
        if len(voters) <= 1:
            original(self)

    monkeypatch.setattr(KafkaConfig, "_check_quorum", check_all_but_the_count)


@contextlib.asynccontextmanager
async def quorum(tmp_path: Path, count: int) -> AsyncIterator[list[Voter]]:
    voters = [Voter(config, RaftManager(config)) for config in voter_configs(tmp_path, count)]
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
    from tierlog.records.codec import decode_batches

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


def test_three_voters_elect_one_leader_and_commit_on_a_majority(tmp_path: Path, several_voters_accepted: None) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            epoch = leader.raft.client.epoch
            assert {v.raft.client.epoch for v in voters} == {epoch}
            last = await append_and_commit(leader, [b"first", b"second"])
            # Every follower fetches the records and learns they are committed.
            await wait_for(
                lambda: all((v.raft.client.high_watermark or 0) > last for v in voters), "high watermark everywhere"
            )
            for voter in voters:
                assert committed_values(voter) == [b"first", b"second"]
            # The quorum-state file is Kafka's place: <metadata.log.dir>/__cluster_metadata-0/quorum-state.
            for voter in voters:
                assert (voter.config.metadata_log_dir / "__cluster_metadata-0" / "quorum-state").is_file()

    run_bounded(scenario, 30)


def test_a_majority_is_enough_to_commit(tmp_path: Path, several_voters_accepted: None) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            follower = next(v for v in voters if v is not leader)
            await follower.crash()
            await append_and_commit(leader, [b"with two of three"])
            assert committed_values(leader) == [b"with two of three"]

    run_bounded(scenario, 30)


def test_a_stopped_leader_resigns_and_another_is_elected(tmp_path: Path, several_voters_accepted: None) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            await append_and_commit(leader, [b"before"])
            old_epoch = leader.raft.client.epoch
            started = asyncio.get_running_loop().time()
            await leader.close_listener()
            await leader.raft.stop()
            rest = [v for v in voters if v is not leader]
            new_leader = await active_leader(rest)
            # EndQuorumEpoch: no need to wait out a fetch timeout before electing another.
            assert asyncio.get_running_loop().time() - started < 0.6 + 3 * 0.3 * 2
            assert new_leader.raft.client.epoch > old_epoch
            await append_and_commit(new_leader, [b"after"])
            assert committed_values(new_leader) == [b"before", b"after"]

    run_bounded(scenario, 30)


def test_a_killed_leader_is_replaced(tmp_path: Path, several_voters_accepted: None) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            await append_and_commit(leader, [b"before"])
            await leader.crash()
            rest = [v for v in voters if v is not leader]
            new_leader = await active_leader(rest)
            assert new_leader.raft.client.epoch > leader.raft.client.epoch
            await append_and_commit(new_leader, [b"after"])
            for voter in rest:
                await wait_for(lambda v=voter: committed_values(v) == [b"before", b"after"], "committed records")

    run_bounded(scenario, 30)


def test_a_single_voter_elects_itself(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 1) as (voter,):
            await active_leader([voter])
            await append_and_commit(voter, [b"alone"])
            assert committed_values(voter) == [b"alone"]

    run_bounded(scenario)


def test_wait_for_commit_is_false_once_the_leadership_is_lost(tmp_path: Path, several_voters_accepted: None) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            # Its followers cannot fetch any more: nothing it appends commits, and it resigns (check quorum).
            await leader.close_listener()
            offset = leader.raft.client.append([b"uncommitted"], now_ms())
            started = asyncio.get_running_loop().time()
            assert not await leader.raft.wait_for_commit(offset, 20)
            assert asyncio.get_running_loop().time() - started < 5  # told when it resigned, not at the timeout
            assert not leader.raft.client.is_leader

    run_bounded(scenario, 30)


def test_voters_requests_pass_the_controller_listener_and_observers_stay_outside(
    tmp_path: Path, several_voters_accepted: None
) -> None:
    """A Vote and a voter's Fetch reach the core through ControllerApis; a broker's metadata Fetch (a replica id
    that is not a voter) is not the Raft manager's (another branch routes it)."""

    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            host, port = leader.config.quorum_voters[leader.node_id]
            connection = await KafkaConnection.open(host, port, client_id="test", timeout_s=5)
            try:
                epoch = leader.raft.client.epoch
                stale_vote = VoteRequest(candidate_id=2, candidate_epoch=epoch - 1, last_offset_epoch=0, last_offset=0)
                reply = await connection.send(raft_request(stale_vote), timeout_s=5)
                vote = raft_response_of(stale_vote, reply)
                assert (vote.leader_id, vote.leader_epoch, vote.vote_granted) == (leader.node_id, epoch, False)
                fetch = RaftFetchRequest(2, epoch, 0, 0, max_wait_ms=0)
                answer = raft_response_of(fetch, await connection.send(raft_request(fetch), timeout_s=5))
                assert (answer.error, answer.leader_id, answer.leader_epoch) == (None, leader.node_id, epoch)
                assert answer.records  # the log starts with the leader's LeaderChangeMessage
                other_partition = request_schema(52, 2).VoteRequest(cluster_id=None, voter_id=1, topics=())
                reply = await connection.send(other_partition, timeout_s=5)
                assert reply.error_code.name == "invalid_request"
            finally:
                await connection.close()

    run_bounded(scenario, 30)
