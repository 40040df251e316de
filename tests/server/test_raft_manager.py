"""RaftManager over real sockets: three voters in one event loop (tests/quorum_helpers.py) elect one leader,
commit appends on a majority, and elect another when the leader stops or dies; the controller listener passes
voters' requests to the core. Every wait is bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from asyncio_helpers import run_bounded
from quorum_helpers import (
    active_leader,
    append_and_commit,
    committed_values,
    quorum,
    wait_for,
)

from tierlog.client.connection import KafkaConnection
from tierlog.client.raft_requests import raft_request, raft_response_of
from tierlog.client.requests import request_schema
from tierlog.raft.messages import RaftFetchRequest, VoteRequest
from tierlog.server.clock import now_ms


def test_three_voters_elect_one_leader_and_commit_on_a_majority(tmp_path: Path) -> None:
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


def test_a_majority_is_enough_to_commit(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with quorum(tmp_path, 3) as voters:
            leader = await active_leader(voters)
            follower = next(v for v in voters if v is not leader)
            await follower.crash()
            await append_and_commit(leader, [b"with two of three"])
            assert committed_values(leader) == [b"with two of three"]

    run_bounded(scenario, 30)


def test_a_stopped_leader_resigns_and_another_is_elected(tmp_path: Path) -> None:
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


def test_a_killed_leader_is_replaced(tmp_path: Path) -> None:
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


def test_wait_for_commit_is_false_once_the_leadership_is_lost(tmp_path: Path) -> None:
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


def test_voters_requests_pass_the_controller_listener_and_observers_stay_outside(tmp_path: Path) -> None:
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
