"""TxnMarkerApis.write_markers over a real ReplicaManager (docs/transactions.md#write-txn-markers): each partition's
outcome as Kafka answers it (UNKNOWN_TOPIC_OR_PARTITION for a partition not hosted, the append's own error
otherwise, REQUEST_TIMED_OUT when the HW does not pass the marker in time), and the group coordinator told of each
marker written to `__consumer_offsets`, a failure there answering UNKNOWN_SERVER_ERROR."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from asyncio_helpers import run_bounded

from tierlog.client.requests import TxnMarker
from tierlog.common import TopicPartition
from tierlog.metadata.image import BrokerRegistration, ClusterMetadata, PartitionRegistration, TopicMetadata
from tierlog.records.codec import build_batch
from tierlog.replication.replica_manager import AppendResult, ReplicaManager
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.group_coordinator import GROUP_METADATA_TOPIC
from tierlog.server.txn_marker_apis import OffsetsTransactionCompleted, TxnMarkerApis
from tierlog.storage.log_manager import LogManager
from tierlog.storage.producer_state import AppendOrigin

EVENTS = TopicPartition("events", 0)
REPLICATED = TopicPartition("replicated", 0)
OFFSETS = TopicPartition(GROUP_METADATA_TOPIC, 0)
PRODUCER = 7000
TIMEOUT_MS = 1000


def replica_manager(tmp_path: Path) -> ReplicaManager:
    """Broker 1 leads `events-0` and `__consumer_offsets-0` alone, and `replicated-0` with broker 2 in its ISR."""
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, now_ms())
    manager = ReplicaManager(1, log_manager)
    alone = PartitionRegistration(replicas=[1], isr=[1], leader=1)
    pair = PartitionRegistration(replicas=[1, 2], isr=[1, 2], leader=1)
    topics = {
        tp.topic: TopicMetadata(tp.topic, uuid.uuid4(), [registration])
        for tp, registration in ((EVENTS, alone), (OFFSETS, alone), (REPLICATED, pair))
    }
    brokers = {b: BrokerRegistration(b, f"incarnation-{b}", 0, [], None, fenced=False) for b in (1, 2)}
    manager.apply_metadata(ClusterMetadata(topics=topics, brokers=brokers), now_ms())
    return manager


def appender(manager: ReplicaManager) -> Callable[..., Awaitable[dict[TopicPartition, AppendResult]]]:
    """KafkaApis' append without the shell: the test expires the produce purgatory itself."""

    async def append(
        entries: dict[TopicPartition, bytearray], acks: int, timeout_ms: int, origin: AppendOrigin
    ) -> dict[TopicPartition, AppendResult]:
        answered: asyncio.Future[dict[TopicPartition, AppendResult]] = asyncio.get_running_loop().create_future()
        manager.append_records(entries, acks, timeout_ms, now_ms(), answered.set_result, origin=origin)
        return await answered

    return append


def begin_transaction(manager: ReplicaManager, tp: TopicPartition, sequence: int = 0, epoch: int = 0) -> None:
    batch = build_batch(
        [(None, b"v", [], now_ms())],
        producer_id=PRODUCER,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )
    answers: list[dict[TopicPartition, AppendResult]] = []
    manager.append_records({tp: bytearray(batch)}, 1, TIMEOUT_MS, now_ms(), answers.append)
    assert answers[0][tp].error is None


def marker(
    *partitions: TopicPartition, committed: bool = True, epoch: int = 0, coordinator_epoch: int = 5
) -> TxnMarker:
    return TxnMarker(PRODUCER, epoch, committed=committed, coordinator_epoch=coordinator_epoch, partitions=partitions)


def apis(manager: ReplicaManager, completed: OffsetsTransactionCompleted | None = None) -> TxnMarkerApis:
    return TxnMarkerApis(AuthHelper(None), appender(manager), TIMEOUT_MS, completed)


def test_a_marker_ends_the_transaction_and_a_partition_not_hosted_is_unknown(tmp_path: Path) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, EVENTS)
    log = manager.get_partition(EVENTS).log
    assert log.last_stable_offset == 0
    missing = TopicPartition("events", 3)
    results = run_bounded(lambda: apis(manager).write_markers([marker(EVENTS, missing)]))
    assert results == {PRODUCER: {EVENTS: None, missing: "UNKNOWN_TOPIC_OR_PARTITION"}}
    assert (log.log_end_offset, log.last_stable_offset) == (2, 2)


def test_each_partition_answers_its_own_append_error(tmp_path: Path) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, EVENTS)
    markers = apis(manager)
    assert run_bounded(lambda: markers.write_markers([marker(EVENTS)])) == {PRODUCER: {EVENTS: None}}
    begin_transaction(manager, EVENTS, sequence=1)
    # A coordinator older than the one that wrote the last marker is fenced; an older producer epoch is refused.
    stale = marker(EVENTS, coordinator_epoch=4)
    assert run_bounded(lambda: markers.write_markers([stale])) == {PRODUCER: {EVENTS: "TRANSACTION_COORDINATOR_FENCED"}}
    begin_transaction(manager, EVENTS, epoch=1)
    old_epoch = marker(EVENTS, epoch=0, coordinator_epoch=6)
    assert run_bounded(lambda: markers.write_markers([old_epoch])) == {PRODUCER: {EVENTS: "INVALID_PRODUCER_EPOCH"}}


def test_an_offsets_marker_is_handed_to_the_group_coordinator_once_written(tmp_path: Path) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, EVENTS)
    begin_transaction(manager, OFFSETS)
    told: list[tuple[int, int, bool]] = []
    results = run_bounded(
        lambda: apis(manager, lambda *call: told.append(call)).write_markers([marker(EVENTS, OFFSETS, committed=False)])
    )
    assert results == {PRODUCER: {EVENTS: None, OFFSETS: None}}
    assert told == [(0, PRODUCER, False)]
    # A marker the partition refuses is not handed on.
    refused = marker(OFFSETS, coordinator_epoch=1)
    assert run_bounded(lambda: apis(manager, lambda *call: told.append(call)).write_markers([refused])) == {
        PRODUCER: {OFFSETS: "TRANSACTION_COORDINATOR_FENCED"}
    }
    assert told == [(0, PRODUCER, False)]


def test_a_group_coordinator_failure_answers_unknown_server_error_for_that_partition(tmp_path: Path) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, EVENTS)
    begin_transaction(manager, OFFSETS)

    def failing(offsets_partition: int, producer_id: int, committed: bool) -> None:
        raise RuntimeError("offsets cache broken")

    results = run_bounded(lambda: apis(manager, failing).write_markers([marker(EVENTS, OFFSETS)]))
    assert results == {PRODUCER: {EVENTS: None, OFFSETS: "UNKNOWN_SERVER_ERROR"}}


def test_a_marker_the_followers_do_not_replicate_in_time_answers_request_timed_out(tmp_path: Path) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, REPLICATED)

    async def scenario() -> dict[int, dict[TopicPartition, str | None]]:
        writing = asyncio.ensure_future(apis(manager).write_markers([marker(REPLICATED)]))
        await asyncio.sleep(0.05)
        assert not writing.done()
        assert manager.produce_purgatory.expire(now_ms() + TIMEOUT_MS) == 1
        return await writing

    assert run_bounded(scenario) == {PRODUCER: {REPLICATED: "REQUEST_TIMED_OUT"}}
    # Written though: the marker stays in the log, as Kafka's (the coordinator retries and the retry is a no-op
    # for the transaction, which is already over).
    assert manager.get_partition(REPLICATED).log.log_end_offset == 2


@pytest.mark.parametrize("committed", [True, False])
def test_markers_of_several_producers_in_one_request_are_answered_per_producer(tmp_path: Path, committed: bool) -> None:
    manager = replica_manager(tmp_path)
    begin_transaction(manager, EVENTS)
    other = TxnMarker(PRODUCER + 1, 0, committed=committed, coordinator_epoch=5, partitions=(EVENTS,))
    results = run_bounded(lambda: apis(manager).write_markers([marker(EVENTS, committed=committed), other]))
    # The second producer never wrote here: its marker is written all the same (Kafka's appendEndTxnMarker).
    assert results == {PRODUCER: {EVENTS: None}, PRODUCER + 1: {EVENTS: None}}
    assert manager.get_partition(EVENTS).log.log_end_offset == 3
