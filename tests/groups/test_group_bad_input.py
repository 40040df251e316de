"""Requests a well-behaved client never sends, over the raw protocol (kio entities on a KafkaConnection to
the group's coordinator): each is answered with the error code Kafka's GroupCoordinator gives (checked
against kafka/coordinator/group/GroupCoordinator.scala: handleCommitOffsets/doCommitOffsets,
handleHeartbeat, doSyncGroup, handleJoinGroup, validateGroupStatus; GroupMetadataManager.storeOffsets for
offset.metadata.max.bytes), and a group's committed offsets are the same afterwards.

Each test forms a live group of one member by hand (JoinGroup -> MEMBER_ID_REQUIRED, JoinGroup again,
SyncGroup) and commits offset 5 of partition 0 and 7 of partition 1 as that member.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from group_helpers import committed_offsets, create_topic, unique
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as find_coordinator_v3
from kio.schema.heartbeat.v4 import request as heartbeat_v4
from kio.schema.join_group.v7 import request as join_group_v7
from kio.schema.leave_group.v4 import request as leave_group_v4
from kio.schema.offset_commit.v8 import request as offset_commit_v8
from kio.schema.offset_fetch.v7 import request as offset_fetch_v7
from kio.schema.sync_group.v5 import request as sync_group_v5

from tierlog.client.connection import KafkaConnection
from tierlog.testing.local_cluster import LocalCluster

TIMEOUT_S = 20.0
# Comfortably above group.min.session.timeout.ms (6000): the hand-made member sends no heartbeats.
SESSION = datetime.timedelta(seconds=60)
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's default offset.metadata.max.bytes
COMMITTED = {0: 5, 1: 7}


async def _connect(address: str) -> KafkaConnection:
    host, _, port = address.rpartition(":")
    return await KafkaConnection.open(host, int(port), client_id="bad-input", timeout_s=TIMEOUT_S)


async def find_coordinator(cluster: LocalCluster, group: str) -> int:
    """The node id FindCoordinator names for `group`."""
    any_broker = await _connect(cluster.broker(1).bootstrap)
    try:
        request = find_coordinator_v3.FindCoordinatorRequest(key=group, key_type=0)
        found = await any_broker.send(request, timeout_s=TIMEOUT_S)
    finally:
        await any_broker.close()
    assert found.error_code == ErrorCode.none, found
    assert cluster.broker(found.node_id).bootstrap == f"{found.host}:{found.port}"
    node_id: int = found.node_id
    return node_id


async def coordinator_of(cluster: LocalCluster, group: str) -> KafkaConnection:
    """A connection to the broker FindCoordinator names for `group`."""
    return await _connect(cluster.broker(await find_coordinator(cluster, group)).bootstrap)


def join_request(group: str, member_id: str = "", session: datetime.timedelta = SESSION) -> Any:
    return join_group_v7.JoinGroupRequest(
        group_id=group,
        session_timeout=session,
        rebalance_timeout=SESSION,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(join_group_v7.JoinGroupRequestProtocol(name="range", metadata=b"subscription"),),
    )


def commit_request(
    group: str, generation: int, member_id: str, offsets: dict[int, tuple[int, str | None]], topic: str
) -> Any:
    partitions = tuple(
        offset_commit_v8.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=metadata
        )
        for p, (offset, metadata) in offsets.items()
    )
    return offset_commit_v8.OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        topics=(offset_commit_v8.OffsetCommitRequestTopic(name=topic, partitions=partitions),),
    )


def commit_errors(response: Any) -> dict[int, ErrorCode]:
    return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}


@dataclass
class LiveGroup:
    """A group of one member in the Stable state, formed over `connection`."""

    connection: KafkaConnection
    group: str
    topic: str
    member_id: str
    generation: int

    async def send(self, request: Any) -> Any:
        return await self.connection.send(request, timeout_s=TIMEOUT_S)

    async def commit(self, offsets: dict[int, tuple[int, str | None]], **overrides: Any) -> dict[int, ErrorCode]:
        fields = {"group": self.group, "generation": self.generation, "member_id": self.member_id}
        fields.update(overrides)
        return commit_errors(await self.send(commit_request(offsets=offsets, topic=self.topic, **fields)))

    async def fetch(self, group: str | None = None) -> dict[int, tuple[int, str | None]]:
        request = offset_fetch_v7.OffsetFetchRequest(
            group_id=group if group is not None else self.group,
            topics=(offset_fetch_v7.OffsetFetchRequestTopic(name=self.topic, partition_indexes=(0, 1)),),
            require_stable=False,
        )
        response = await self.send(request)
        assert response.error_code == ErrorCode.none, response
        return {p.partition_index: (p.committed_offset, p.metadata) for t in response.topics for p in t.partitions}


async def form_group(cluster: LocalCluster, topic: str) -> LiveGroup:
    group = unique("bad-input")
    connection = await coordinator_of(cluster, group)
    first = await connection.send(join_request(group), timeout_s=TIMEOUT_S)
    assert first.error_code == ErrorCode.member_id_required, first
    joined = await connection.send(join_request(group, first.member_id), timeout_s=TIMEOUT_S)
    assert joined.error_code == ErrorCode.none, joined
    assert (joined.leader, joined.member_id, joined.protocol_name) == (first.member_id, first.member_id, "range")
    assignment = sync_group_v5.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"everything")
    synced = await connection.send(
        sync_group_v5.SyncGroupRequest(
            group_id=group,
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(assignment,),
        ),
        timeout_s=TIMEOUT_S,
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"everything"), synced
    live = LiveGroup(connection, group, topic, joined.member_id, joined.generation_id)
    assert await live.commit({p: (o, "ok") for p, o in COMMITTED.items()}) == {0: ErrorCode.none, 1: ErrorCode.none}
    return live


def with_live_group(cluster: LocalCluster, test: Callable[[LiveGroup], Awaitable[None]]) -> None:
    """Run `test` on a fresh live group; afterwards its committed offsets must be exactly COMMITTED, over the
    raw protocol and through the admin API, once the member has left."""
    topic = unique("bad-input")
    create_topic(cluster.bootstrap, topic, partitions=2)

    async def main() -> str:
        async with asyncio.timeout(60):
            live = await form_group(cluster, topic)
            try:
                await test(live)
                assert await live.fetch() == {p: (o, "ok") for p, o in COMMITTED.items()}
                member = leave_group_v4.MemberIdentity(member_id=live.member_id, group_instance_id=None)
                left = await live.send(leave_group_v4.LeaveGroupRequest(group_id=live.group, members=(member,)))
                assert left.error_code == ErrorCode.none, left
            finally:
                await live.connection.close()
            return live.group

    group = asyncio.run(main())
    assert committed_offsets(cluster.bootstrap, group, topic, COMMITTED) == COMMITTED


def test_commit_for_an_unknown_group_with_a_generation_is_an_illegal_generation(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        unknown = unique("never-joined")
        # Sent to the live group's coordinator, which may not coordinate `unknown`: ask the right one.
        connection = await coordinator_of(cluster, unknown)
        try:
            response = await connection.send(
                commit_request(unknown, 3, "someone", {0: (9, None)}, live.topic), timeout_s=TIMEOUT_S
            )
            assert commit_errors(response) == {0: ErrorCode.illegal_generation}
            fetched = await LiveGroup(connection, unknown, live.topic, "", -1).fetch()
            assert {p: offset for p, (offset, _) in fetched.items()} == {0: -1, 1: -1}
        finally:
            await connection.close()

    with_live_group(cluster, test)


def test_commit_from_an_unknown_member_of_a_live_group_is_refused(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        assert await live.commit({0: (100, None)}, member_id="intruder") == {0: ErrorCode.unknown_member_id}
        # A standalone commit (generation -1, no member) is only for groups without members.
        assert await live.commit({0: (100, None)}, member_id="", generation=-1) == {0: ErrorCode.unknown_member_id}

    with_live_group(cluster, test)


def test_commit_with_a_wrong_generation_is_an_illegal_generation(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        for generation in (live.generation + 1, live.generation - 1):
            assert await live.commit({0: (100, None)}, generation=generation) == {0: ErrorCode.illegal_generation}

    with_live_group(cluster, test)


def test_oversized_metadata_fails_only_its_own_partition(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        errors = await live.commit({0: (100, "m" * (OFFSET_METADATA_MAX_BYTES + 1)), 1: (COMMITTED[1], "ok")})
        assert errors == {0: ErrorCode.offset_metadata_too_large, 1: ErrorCode.none}
        # Exactly the limit is accepted (then put back, so the common check after the test holds).
        limit = "m" * OFFSET_METADATA_MAX_BYTES
        assert await live.commit({0: (COMMITTED[0], limit)}) == {0: ErrorCode.none}
        assert (await live.fetch())[0] == (COMMITTED[0], limit)
        assert await live.commit({0: (COMMITTED[0], "ok")}) == {0: ErrorCode.none}

    with_live_group(cluster, test)


def test_heartbeat_and_sync_with_a_bad_member_or_generation_are_refused(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        def heartbeat(**fields: Any) -> Any:
            request = {"group_id": live.group, "generation_id": live.generation, "member_id": live.member_id}
            return heartbeat_v4.HeartbeatRequest(group_instance_id=None, **{**request, **fields})

        def sync(**fields: Any) -> Any:
            request = {"group_id": live.group, "generation_id": live.generation, "member_id": live.member_id}
            return sync_group_v5.SyncGroupRequest(
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=(),
                **{**request, **fields},
            )

        assert (await live.send(heartbeat())).error_code == ErrorCode.none
        assert (await live.send(heartbeat(member_id="intruder"))).error_code == ErrorCode.unknown_member_id
        assert (await live.send(heartbeat(generation_id=live.generation + 1))).error_code == (
            ErrorCode.illegal_generation
        )
        assert (await live.send(sync(member_id="intruder"))).error_code == ErrorCode.unknown_member_id
        assert (await live.send(sync(generation_id=live.generation + 1))).error_code == ErrorCode.illegal_generation
        # A Stable group answers its member's SyncGroup with the assignment it already has.
        synced = await live.send(sync())
        assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"everything")

    with_live_group(cluster, test)


def test_join_with_a_session_timeout_out_of_bounds_or_an_empty_group_id_is_refused(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        # group.min.session.timeout.ms 6000 and group.max.session.timeout.ms 1800000 (Kafka's defaults).
        for session in (datetime.timedelta(milliseconds=5999), datetime.timedelta(milliseconds=1_800_001)):
            joined = await live.send(join_request(live.group, live.member_id, session))
            assert joined.error_code == ErrorCode.invalid_session_timeout, session
        # The member is still the member of the same generation: nothing was rebalanced.
        heartbeat = heartbeat_v4.HeartbeatRequest(
            group_id=live.group, generation_id=live.generation, member_id=live.member_id, group_instance_id=None
        )
        assert (await live.send(heartbeat)).error_code == ErrorCode.none
        # An empty group id is refused for membership before anything else, by any broker.
        assert (await live.send(join_request(""))).error_code == ErrorCode.invalid_group_id
        empty = heartbeat_v4.HeartbeatRequest(group_id="", generation_id=1, member_id="m", group_instance_id=None)
        assert (await live.send(empty)).error_code == ErrorCode.invalid_group_id

    with_live_group(cluster, test)


def test_commits_for_unknown_topics_or_partitions_fail_only_those(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        request = commit_request(live.group, live.generation, live.member_id, {0: (100, None)}, "no-such-topic")
        unknown_topic = offset_commit_v8.OffsetCommitRequestTopic(
            name="no-such-topic", partitions=request.topics[0].partitions
        )
        beyond = offset_commit_v8.OffsetCommitRequestPartition(
            partition_index=99, committed_offset=100, committed_leader_epoch=-1, committed_metadata=None
        )
        known = commit_request(live.group, live.generation, live.member_id, {1: (COMMITTED[1], "ok")}, live.topic)
        known_topic = offset_commit_v8.OffsetCommitRequestTopic(
            name=live.topic, partitions=(*known.topics[0].partitions, beyond)
        )
        response = await live.send(dataclasses.replace(known, topics=(unknown_topic, known_topic)))
        errors = {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}
        assert errors == {
            ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
            (live.topic, 1): ErrorCode.none,
            (live.topic, 99): ErrorCode.unknown_topic_or_partition,
        }

    with_live_group(cluster, test)


def test_group_requests_to_a_broker_that_is_not_the_coordinator_get_not_coordinator(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        coordinator = await find_coordinator(cluster, live.group)
        other = next(n for n in cluster.node_ids if n != coordinator)
        connection = await _connect(cluster.broker(other).bootstrap)
        try:
            elsewhere = LiveGroup(connection, live.group, live.topic, live.member_id, live.generation)
            assert await elsewhere.commit({0: (100, None)}) == {0: ErrorCode.not_coordinator}
            heartbeat = heartbeat_v4.HeartbeatRequest(
                group_id=live.group, generation_id=live.generation, member_id=live.member_id, group_instance_id=None
            )
            assert (await elsewhere.send(heartbeat)).error_code == ErrorCode.not_coordinator
            assert (await elsewhere.send(join_request(live.group))).error_code == ErrorCode.not_coordinator
        finally:
            await connection.close()

    with_live_group(cluster, test)


def test_a_member_whose_protocols_the_group_cannot_share_is_refused(cluster: LocalCluster) -> None:
    async def test(live: LiveGroup) -> None:
        other_type = dataclasses.replace(join_request(live.group), protocol_type="connect")
        assert (await live.send(other_type)).error_code == ErrorCode.inconsistent_group_protocol
        roundrobin = join_group_v7.JoinGroupRequestProtocol(name="roundrobin", metadata=b"subscription")
        no_common = dataclasses.replace(join_request(live.group), protocols=(roundrobin,))
        assert (await live.send(no_common)).error_code == ErrorCode.inconsistent_group_protocol
        # Neither became a member: the live member's generation is still current.
        heartbeat = heartbeat_v4.HeartbeatRequest(
            group_id=live.group, generation_id=live.generation, member_id=live.member_id, group_instance_id=None
        )
        assert (await live.send(heartbeat)).error_code == ErrorCode.none

    with_live_group(cluster, test)
