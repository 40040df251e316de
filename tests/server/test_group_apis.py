"""The group APIs of a whole broker in this process, through raw requests of several versions: the
coordinator is found once __consumer_offsets exists, a member joins, syncs, heartbeats and commits, bad
commits get Kafka's error codes without disturbing what is stored, and a restarted broker loads it all back."""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import generate_latest

from tierlog.client.requests import request_schema
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.server.broker import Broker
from tierlog.server.group_apis import (
    API_DELETE_GROUPS,
    API_DESCRIBE_GROUPS,
    API_FIND_COORDINATOR,
    API_HEARTBEAT,
    API_JOIN_GROUP,
    API_LEAVE_GROUP,
    API_LIST_GROUPS,
    API_OFFSET_COMMIT,
    API_OFFSET_DELETE,
    API_OFFSET_FETCH,
    API_SYNC_GROUP,
)
from tierlog.server.kafka_apis import KafkaApis

SESSION = datetime.timedelta(seconds=10)
SUBSCRIPTION = struct.pack(">hih", 0, 1, 6) + b"events" + struct.pack(">i", -1)


def broker_config(tmp_path: Path) -> KafkaConfig:
    return KafkaConfig(
        {
            "log.dirs": str(tmp_path),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
        }
    )


async def call(apis: KafkaApis, api_key: int, version: int, **fields: Any) -> Any:
    """A request of that version built from `fields` (those the version lacks are dropped)."""
    s = request_schema(api_key, version)
    body = getattr(s, type_name(api_key))(**fields)
    return await apis.handle(Request(api_key, version, 7, "test-client", body, 0))


def type_name(api_key: int) -> str:
    return {
        API_FIND_COORDINATOR: "FindCoordinatorRequest",
        API_JOIN_GROUP: "JoinGroupRequest",
        API_SYNC_GROUP: "SyncGroupRequest",
        API_HEARTBEAT: "HeartbeatRequest",
        API_LEAVE_GROUP: "LeaveGroupRequest",
        API_OFFSET_COMMIT: "OffsetCommitRequest",
        API_OFFSET_FETCH: "OffsetFetchRequest",
        API_LIST_GROUPS: "ListGroupsRequest",
        API_DESCRIBE_GROUPS: "DescribeGroupsRequest",
        API_DELETE_GROUPS: "DeleteGroupsRequest",
        API_OFFSET_DELETE: "OffsetDeleteRequest",
    }[api_key]


@asynccontextmanager
async def started_broker(config: KafkaConfig) -> AsyncIterator[Broker]:
    """A broker in this process, started, and stopped when the block ends."""
    broker = Broker(config)
    async with asyncio.timeout(30):
        await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def create_events_topic(broker: Broker) -> None:
    """The two-partition topic the members subscribe to, in the broker's metadata image once this returns."""
    broker.controller_server.controller.create_topic("events", 2, 1, {})
    await broker.forwarding_manager.sync_metadata()


def run_broker(tmp_path: Path, test: Callable[[KafkaApis], Awaitable[None]]) -> None:
    async def main() -> None:
        async with started_broker(broker_config(tmp_path)) as broker:
            await create_events_topic(broker)
            await test(broker.apis)

    asyncio.run(main())


async def find_coordinator(apis: KafkaApis, group: str) -> Any:
    """FindCoordinator v4 until the group's coordinator is known (the first ones create __consumer_offsets),
    then, as a client's first group request would, until the coordinator has loaded the group's partition
    (FindCoordinator answers during the load, as Kafka's does)."""
    async with asyncio.timeout(20):
        while True:
            response = await call(apis, API_FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(group,))
            (found,) = response.coordinators
            if found.error_code == ErrorCode.none:
                break
            assert found.error_code in (ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress)
            await asyncio.sleep(0.05)
        s = request_schema(API_OFFSET_FETCH, 9)
        while True:
            probe = await call(
                apis, API_OFFSET_FETCH, 9, groups=(s.OffsetFetchRequestGroup(group_id=group, topics=()),)
            )
            if probe.groups[0].error_code != ErrorCode.coordinator_load_in_progress:
                return found
            await asyncio.sleep(0.05)


async def join_and_sync(apis: KafkaApis, group: str, version: int = 9) -> tuple[str, int]:
    s = request_schema(API_JOIN_GROUP, version)
    fields = dict(
        group_id=group,
        session_timeout=SESSION,
        rebalance_timeout=SESSION,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(s.JoinGroupRequestProtocol(name="range", metadata=SUBSCRIPTION),),
        reason=None,
    )
    joined = await call(apis, API_JOIN_GROUP, version, member_id="", **fields)
    if joined.error_code == ErrorCode.member_id_required:
        joined = await call(apis, API_JOIN_GROUP, version, member_id=joined.member_id, **fields)
    assert joined.error_code == ErrorCode.none and joined.leader == joined.member_id
    assert [m.metadata for m in joined.members] == [SUBSCRIPTION]
    member, generation = joined.member_id, joined.generation_id
    sync_schema = request_schema(API_SYNC_GROUP, 5)
    synced = await call(
        apis,
        API_SYNC_GROUP,
        5,
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(sync_schema.SyncGroupRequestAssignment(member_id=member, assignment=b"assigned"),),
    )
    assert (synced.error_code, synced.assignment, synced.protocol_name) == (ErrorCode.none, b"assigned", "range")
    return member, generation


async def commit(
    apis: KafkaApis,
    group: str,
    offset: int,
    member: str = "",
    generation: int = -1,
    metadata: str = "",
    version: int = 9,
    topic: str = "events",
    partition: int = 0,
) -> ErrorCode:
    s = request_schema(API_OFFSET_COMMIT, version)
    response = await call(
        apis,
        API_OFFSET_COMMIT,
        version,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=-1),
        topics=(
            s.OffsetCommitRequestTopic(
                name=topic,
                partitions=(
                    s.OffsetCommitRequestPartition(
                        partition_index=partition,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        committed_metadata=metadata,
                    ),
                ),
            ),
        ),
    )
    ((partition,),) = [t.partitions for t in response.topics]
    return partition.error_code


async def fetch_offset(apis: KafkaApis, group: str, version: int = 9) -> tuple[int, str | None]:
    s = request_schema(API_OFFSET_FETCH, version)
    if version >= 8:
        response = await call(
            apis,
            API_OFFSET_FETCH,
            version,
            groups=(
                s.OffsetFetchRequestGroup(
                    group_id=group, topics=(s.OffsetFetchRequestTopics(name="events", partition_indexes=(0,)),)
                ),
            ),
            require_stable=True,
        )
        ((topic,),) = [g.topics for g in response.groups]
    else:
        response = await call(
            apis,
            API_OFFSET_FETCH,
            version,
            group_id=group,
            topics=(s.OffsetFetchRequestTopic(name="events", partition_indexes=(0,)),),
            require_stable=False,
        )
        (topic,) = response.topics
    (partition,) = topic.partitions
    assert partition.error_code == ErrorCode.none
    return partition.committed_offset, partition.metadata


def test_find_coordinator_creates_consumer_offsets_then_names_this_broker(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        first = await call(apis, API_FIND_COORDINATOR, 3, key_type=0, key="g")
        assert first.error_code == ErrorCode.coordinator_not_available
        found = await find_coordinator(apis, "g")
        assert (found.node_id, found.host) == (apis.node_id, "127.0.0.1")
        topic = apis.image.topics["__consumer_offsets"]
        assert len(topic.partitions) == 3
        assert topic.configs["cleanup.policy"] == "compact"

    run_broker(tmp_path, test)


def test_join_sync_heartbeat_commit_and_fetch_across_versions(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        await find_coordinator(apis, "g")
        member, generation = await join_and_sync(apis, "g", version=9)
        heartbeat = await call(
            apis, API_HEARTBEAT, 4, group_id="g", generation_id=generation, member_id=member, group_instance_id=None
        )
        assert heartbeat.error_code == ErrorCode.none
        assert await commit(apis, "g", 42, member, generation, metadata="m", version=9) == ErrorCode.none
        assert await fetch_offset(apis, "g", version=9) == (42, "m")
        assert await fetch_offset(apis, "g", version=1) == (42, "m")
        assert await commit(apis, "g", 43, member, generation, version=2) == ErrorCode.none
        assert await fetch_offset(apis, "g", version=7) == (43, "")
        described = await call(apis, API_DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=False)
        (group,) = described.groups
        assert (group.group_state, group.protocol_data, len(group.members)) == ("Stable", "range", 1)
        assert group.members[0].member_assignment == b"assigned"
        listed = await call(apis, API_LIST_GROUPS, 5, states_filter=(), types_filter=())
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Stable")]
        s = request_schema(API_LEAVE_GROUP, 5)
        left = await call(
            apis,
            API_LEAVE_GROUP,
            5,
            group_id="g",
            members=(s.MemberIdentity(member_id=member, group_instance_id=None, reason=None),),
        )
        assert left.error_code == ErrorCode.none and left.members[0].error_code == ErrorCode.none
        deleted = await call(apis, API_DELETE_GROUPS, 2, groups_names=("g", "never"))
        assert [r.error_code for r in deleted.results] == [ErrorCode.none, ErrorCode.group_id_not_found]
        assert await fetch_offset(apis, "g") == (-1, "")

    run_broker(tmp_path, test)


def test_bad_commits_get_kafkas_error_codes_and_nothing_is_corrupted(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        await find_coordinator(apis, "g")
        member, generation = await join_and_sync(apis, "g")
        assert await commit(apis, "g", 10, member, generation) == ErrorCode.none
        assert await commit(apis, "unknown-group", 11, "someone", 5) == ErrorCode.illegal_generation
        assert await commit(apis, "g", 11, member, generation + 1) == ErrorCode.illegal_generation
        assert await commit(apis, "g", 11, "intruder", generation) == ErrorCode.unknown_member_id
        assert await commit(apis, "g", 11) == ErrorCode.unknown_member_id
        assert await commit(apis, "g", 11, member, generation, metadata="x" * 5000) == (
            ErrorCode.offset_metadata_too_large
        )
        assert await commit(apis, "", 11, member, generation) == ErrorCode.illegal_generation
        assert await commit(apis, "g", 11, member, generation, topic="missing") == ErrorCode.unknown_topic_or_partition
        assert await commit(apis, "g", 11, member, generation, partition=2) == ErrorCode.unknown_topic_or_partition
        assert await fetch_offset(apis, "g") == (10, "")
        heartbeat = await call(
            apis, API_HEARTBEAT, 4, group_id="g", generation_id=generation, member_id=member, group_instance_id=None
        )
        assert heartbeat.error_code == ErrorCode.none
        joined = await call(
            apis,
            API_JOIN_GROUP,
            9,
            group_id="",
            session_timeout=SESSION,
            rebalance_timeout=SESSION,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(),
            reason=None,
        )
        assert joined.error_code == ErrorCode.invalid_group_id
        s = request_schema(API_OFFSET_DELETE, 0)
        deleted = await call(
            apis,
            API_OFFSET_DELETE,
            0,
            group_id="g",
            topics=(
                s.OffsetDeleteRequestTopic(
                    name="events", partitions=(s.OffsetDeleteRequestPartition(partition_index=0),)
                ),
            ),
        )
        assert deleted.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic

    run_broker(tmp_path, test)


def test_committed_offsets_and_groups_survive_a_restart(tmp_path: Path) -> None:
    async def before(apis: KafkaApis) -> None:
        await find_coordinator(apis, "g")
        member, generation = await join_and_sync(apis, "g")
        assert await commit(apis, "g", 7, member, generation, metadata="kept") == ErrorCode.none
        assert await commit(apis, "standalone", 3) == ErrorCode.none

    async def after(apis: KafkaApis) -> None:
        await find_coordinator(apis, "g")
        assert await fetch_offset(apis, "g") == (7, "kept")
        assert await fetch_offset(apis, "standalone") == (3, "")
        described = await call(apis, API_DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=False)
        # Loaded as Kafka loads it: Stable with the stored member, which is removed unless it heartbeats.
        assert described.groups[0].group_state == "Stable"
        assert described.groups[0].members[0].member_assignment == b"assigned"
        assert described.groups[0].protocol_type == "consumer"

    async def restart() -> None:
        for test in (before, after):
            async with started_broker(broker_config(tmp_path)) as broker:
                if "events" not in broker.apis.image.topics:
                    await create_events_topic(broker)
                await test(broker.apis)

    asyncio.run(restart())


def test_a_cluster_too_small_for_the_offsets_topic_says_which_setting_to_change(tmp_path: Path) -> None:
    async def main() -> None:
        config = broker_config(tmp_path)
        config = KafkaConfig({**config.originals, "offsets.topic.replication.factor": "3"})
        async with started_broker(config) as broker:
            async with asyncio.timeout(20):
                while True:
                    response = await call(broker.apis, API_FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g",))
                    (found,) = response.coordinators
                    assert found.error_code == ErrorCode.coordinator_not_available
                    if "offsets.topic.replication.factor" in (found.error_message or ""):
                        break
                    await asyncio.sleep(0.05)
            assert "__consumer_offsets" not in broker.apis.image.topics

    asyncio.run(main())


def test_metrics_count_groups_by_state_and_offset_commits(tmp_path: Path) -> None:
    async def main() -> None:
        async with started_broker(broker_config(tmp_path)) as broker:
            await create_events_topic(broker)
            await find_coordinator(broker.apis, "g")
            member, generation = await join_and_sync(broker.apis, "g")
            assert await commit(broker.apis, "g", 1, member, generation) == ErrorCode.none
            assert await commit(broker.apis, "g", 2, member, generation) == ErrorCode.none
            text = generate_latest(broker._metrics_registry).decode()
        assert 'kafka_coordinator_group_groupmetadatamanager_numgroups{state="Stable"} 1' in text
        assert 'kafka_coordinator_group_groupmetadatamanager_numgroups{state="Empty"} 0' in text
        assert "kafka_coordinator_group_groupmetadatamanager_numoffsets 1" in text
        assert "kafka_coordinator_group_groupmetadatamanager_offsetcommits_total 2" in text

    asyncio.run(main())
