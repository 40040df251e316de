"""TxnOffsetCommit on a whole broker in this process, through raw requests: the offsets are written to
__consumer_offsets as the producer's transactional batch, a read_committed consumer's OffsetFetch
(require_stable) is told UNSTABLE_OFFSET_COMMIT until the transaction's marker, KIP-447 fences stale members,
and a restarted broker loads the transactions back as they were (docs/transactions.md#offsets)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from test_group_apis import (
    API_OFFSET_FETCH,
    broker_config,
    call,
    commit,
    create_events_topic,
    find_coordinator,
    join_and_sync,
    started_broker,
)

from tierlog.client.requests import request_schema
from tierlog.common import TopicPartition
from tierlog.protocol.codec import Request
from tierlog.records.codec import decode_batches
from tierlog.server.broker import Broker
from tierlog.server.clock import now_ms
from tierlog.server.group_apis import API_TXN_OFFSET_COMMIT
from tierlog.server.group_coordinator import GROUP_METADATA_TOPIC
from tierlog.server.txn_marker_apis import API_WRITE_TXN_MARKERS

PRODUCER_ID = 4000


async def txn_commit(
    broker: Broker,
    group: str,
    offset: int,
    producer_id: int = PRODUCER_ID,
    member: str = "",
    generation: int = -1,
    version: int = 3,
    producer_epoch: int = 0,
) -> ErrorCode:
    s = request_schema(API_TXN_OFFSET_COMMIT, version)
    # The schema's builder drops the fields a version lacks (v0-v2 have no member fields).
    body = s.TxnOffsetCommitRequest(
        transactional_id="txn-1",
        group_id=group,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        topics=(
            s.TxnOffsetCommitRequestTopic(
                name="events",
                partitions=(
                    s.TxnOffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_metadata="in-txn"
                    ),
                ),
            ),
        ),
    )
    response = await broker.apis.handle(Request(API_TXN_OFFSET_COMMIT, version, 7, "test-client", body, 0))
    ((partition,),) = [t.partitions for t in response.topics]
    return ErrorCode(partition.error_code)


async def fetch(broker: Broker, group: str, require_stable: bool) -> tuple[int, ErrorCode]:
    s = request_schema(API_OFFSET_FETCH, 9)
    response = await call(
        broker.apis,
        API_OFFSET_FETCH,
        9,
        groups=(
            s.OffsetFetchRequestGroup(
                group_id=group, topics=(s.OffsetFetchRequestTopics(name="events", partition_indexes=(0,)),)
            ),
        ),
        require_stable=require_stable,
    )
    ((topic,),) = [g.topics for g in response.groups]
    (partition,) = topic.partitions
    return partition.committed_offset, ErrorCode(partition.error_code)


async def write_marker(broker: Broker, group: str, producer_id: int, committed: bool) -> None:
    """The transaction coordinator's WriteTxnMarkers for the group's __consumer_offsets partition."""
    partition = broker.group_coordinator.coordinator.partition_for(group)
    s = request_schema(API_WRITE_TXN_MARKERS, 1)
    body = s.WriteTxnMarkersRequest(
        markers=(
            s.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=0,
                transaction_result=committed,
                topics=(s.WritableTxnMarkerTopic(name=GROUP_METADATA_TOPIC, partition_indexes=(partition,)),),
                coordinator_epoch=0,
            ),
        )
    )
    response = await broker.apis.handle(Request(API_WRITE_TXN_MARKERS, 1, 8, "coordinator", body, 0))
    ((result,),) = [[p for t in m.topics for p in t.partitions] for m in response.markers]
    assert result.error_code == ErrorCode.none


def offsets_batches(broker: Broker, group: str) -> list[Any]:
    tp = TopicPartition(GROUP_METADATA_TOPIC, broker.group_coordinator.coordinator.partition_for(group))
    log = broker.replica_manager.get_partition(tp).log
    data = log.read(log.log_start_offset, 1 << 20, log.log_end_offset, True).records
    assert data is not None
    return list(decode_batches(data.read_bytes()))


def test_offsets_committed_in_a_transaction_are_unstable_until_the_marker(tmp_path: Path) -> None:
    async def main() -> None:
        async with started_broker(broker_config(tmp_path)) as broker:
            await create_events_topic(broker)
            await find_coordinator(broker.apis, "g")
            member, generation = await join_and_sync(broker.apis, "g")
            assert await commit(broker.apis, "g", 5, member, generation) == ErrorCode.none
            assert await txn_commit(broker, "g", 9, member=member, generation=generation) == ErrorCode.none
            assert await fetch(broker, "g", require_stable=True) == (-1, ErrorCode.unstable_offset_commit)
            assert await fetch(broker, "g", require_stable=False) == (5, ErrorCode.none)
            # The offsets went to the log as the producer's transactional batch.
            last = offsets_batches(broker, "g")[-1].header
            assert (last.is_transactional, last.producer_id, last.producer_epoch) == (True, PRODUCER_ID, 0)
            await write_marker(broker, "g", PRODUCER_ID, committed=True)
            assert await fetch(broker, "g", require_stable=True) == (9, ErrorCode.none)
            # KIP-447: a member of an older generation is fenced; v0-v2 (no member) are accepted.
            stale = await txn_commit(broker, "g", 10, member=member, generation=generation - 1)
            assert stale == ErrorCode.illegal_generation
            assert await txn_commit(broker, "g", 10, member="zombie", generation=generation) == (
                ErrorCode.unknown_member_id
            )
            assert await txn_commit(broker, "g", 11, version=0) == ErrorCode.none
            await write_marker(broker, "g", PRODUCER_ID, committed=False)
            assert await fetch(broker, "g", require_stable=True) == (9, ErrorCode.none)
            # A producer fenced by a newer epoch: the log refuses its batch and the error is passed on.
            assert await txn_commit(broker, "g", 12, producer_epoch=1) == ErrorCode.none
            assert await txn_commit(broker, "g", 13, producer_epoch=0) == ErrorCode.invalid_producer_epoch

    asyncio.run(main())


def test_a_restarted_broker_loads_pending_committed_and_aborted_transactions(tmp_path: Path) -> None:
    async def before(broker: Broker) -> None:
        await find_coordinator(broker.apis, "pending")
        await find_coordinator(broker.apis, "aborted")
        await find_coordinator(broker.apis, "committed")
        assert await commit(broker.apis, "aborted", 5) == ErrorCode.none
        assert await txn_commit(broker, "pending", 7, producer_id=1) == ErrorCode.none
        assert await txn_commit(broker, "aborted", 8, producer_id=2) == ErrorCode.none
        assert await txn_commit(broker, "committed", 9, producer_id=3) == ErrorCode.none
        await write_marker(broker, "aborted", 2, committed=False)
        await write_marker(broker, "committed", 3, committed=True)

    async def after(broker: Broker) -> None:
        await find_coordinator(broker.apis, "pending")
        assert await fetch(broker, "pending", require_stable=True) == (-1, ErrorCode.unstable_offset_commit)
        assert await fetch(broker, "aborted", require_stable=True) == (5, ErrorCode.none)
        assert await fetch(broker, "committed", require_stable=True) == (9, ErrorCode.none)
        # The marker that arrives after the failover completes the loaded transaction.
        await write_marker(broker, "pending", 1, committed=True)
        assert await fetch(broker, "pending", require_stable=True) == (7, ErrorCode.none)

    async def restart() -> None:
        for test in (before, after):
            async with started_broker(broker_config(tmp_path)) as broker:
                if "events" not in broker.apis.image.topics:
                    await create_events_topic(broker)
                await test(broker)

    asyncio.run(restart())


def test_producers_before_2_0_are_told_coordinator_not_available_while_the_group_loads(tmp_path: Path) -> None:
    async def main() -> None:
        async with started_broker(broker_config(tmp_path)) as broker:
            await create_events_topic(broker)
            await find_coordinator(broker.apis, "g")
            core = broker.group_coordinator.coordinator
            partition = core.partition_for("g")
            # The partition is being loaded again (a new leader epoch), and the load has not finished.
            core.on_resignation(partition, now_ms())
            core.on_election(partition, 99)
            assert await txn_commit(broker, "g", 1, version=3) == ErrorCode.coordinator_load_in_progress
            assert await txn_commit(broker, "g", 1, version=2) == ErrorCode.coordinator_load_in_progress
            assert await txn_commit(broker, "g", 1, version=1) == ErrorCode.coordinator_not_available
            assert await txn_commit(broker, "g", 1, version=0) == ErrorCode.coordinator_not_available

    asyncio.run(main())
