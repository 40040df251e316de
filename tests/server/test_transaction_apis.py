"""The transaction APIs of a whole broker in this process, through raw requests of several versions:
FindCoordinator creates __transaction_state and names this broker, InitProducerId gives a transactional id its
producer id and bumps the epoch (fencing the older producer), AddPartitionsToTxn / AddOffsetsToTxn / EndTxn answer
Kafka's errors, and DescribeTransactions / ListTransactions show it all (docs/transactions.md#coordinator-shell)."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from test_group_apis import create_events_topic, started_broker

from tierlog.client.requests import request_schema
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.server.kafka_apis import KafkaApis
from tierlog.server.transaction_apis import (
    API_ADD_OFFSETS_TO_TXN,
    API_ADD_PARTITIONS_TO_TXN,
    API_DESCRIBE_TRANSACTIONS,
    API_END_TXN,
    API_FIND_COORDINATOR,
    API_INIT_PRODUCER_ID,
    API_LIST_TRANSACTIONS,
)

TIMEOUT = datetime.timedelta(seconds=60)
TYPE_NAMES = {
    API_FIND_COORDINATOR: "FindCoordinatorRequest",
    API_INIT_PRODUCER_ID: "InitProducerIdRequest",
    API_ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxnRequest",
    API_ADD_OFFSETS_TO_TXN: "AddOffsetsToTxnRequest",
    API_END_TXN: "EndTxnRequest",
    API_DESCRIBE_TRANSACTIONS: "DescribeTransactionsRequest",
    API_LIST_TRANSACTIONS: "ListTransactionsRequest",
}


def broker_config(tmp_path: Path, **overrides: str) -> KafkaConfig:
    return KafkaConfig(
        {
            "log.dirs": str(tmp_path),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "auto.create.topics.enable": "false",
            "transaction.state.log.num.partitions": "3",
            "offsets.topic.num.partitions": "3",
            **overrides,
        }
    )


async def call(apis: KafkaApis, api_key: int, version: int, **fields: Any) -> Any:
    s = request_schema(api_key, version)
    body = getattr(s, TYPE_NAMES[api_key])(**fields)
    return await apis.handle(Request(api_key, version, 7, "test-client", body, 0))


async def find_coordinator(apis: KafkaApis, transactional_id: str) -> Any:
    """FindCoordinator v4 until the coordinator is known (the first ones create __transaction_state)."""
    async with asyncio.timeout(20):
        while True:
            response = await call(apis, API_FIND_COORDINATOR, 4, key_type=1, coordinator_keys=(transactional_id,))
            (found,) = response.coordinators
            if found.error_code == ErrorCode.none:
                return found
            assert found.error_code == ErrorCode.coordinator_not_available, found
            await asyncio.sleep(0.05)


async def init_producer_id(apis: KafkaApis, transactional_id: str, version: int = 4, **fields: Any) -> Any:
    """InitProducerId, again while the coordinator loads its partition or fetches a producer id block."""
    async with asyncio.timeout(20):
        while True:
            response = await call(
                apis,
                API_INIT_PRODUCER_ID,
                version,
                transactional_id=transactional_id,
                **{"transaction_timeout": TIMEOUT, **fields},
            )
            if response.error_code not in (ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions):
                return response
            await asyncio.sleep(0.05)


async def add_partitions(
    apis: KafkaApis, version: int, txn: str, producer: Any, partitions: dict[str, tuple[int, ...]]
) -> dict[tuple[str, int], ErrorCode]:
    s = request_schema(API_ADD_PARTITIONS_TO_TXN, version)
    response = await call(
        apis,
        API_ADD_PARTITIONS_TO_TXN,
        version,
        v3_and_below_transactional_id=txn,
        v3_and_below_producer_id=producer.producer_id,
        v3_and_below_producer_epoch=producer.producer_epoch,
        v3_and_below_topics=tuple(s.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in partitions.items()),
    )
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def run_broker(tmp_path: Path, test: Any) -> None:
    async def main() -> None:
        async with started_broker(broker_config(tmp_path)) as broker:
            await create_events_topic(broker)
            await test(broker.apis)

    asyncio.run(main())


def test_find_coordinator_creates_transaction_state_then_names_this_broker(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        first = await call(apis, API_FIND_COORDINATOR, 3, key_type=1, key="tx")
        assert first.error_code == ErrorCode.coordinator_not_available
        found = await find_coordinator(apis, "tx")
        assert (found.node_id, found.host) == (apis.node_id, "127.0.0.1")
        topic = apis.image.topics["__transaction_state"]
        assert len(topic.partitions) == 3
        assert topic.configs["cleanup.policy"] == "compact"
        assert topic.configs["min.insync.replicas"] == "1"  # standalone: replication factor 1
        # Group keys are still the group APIs'.
        group = await call(apis, API_FIND_COORDINATOR, 3, key_type=0, key="g")
        assert group.error_code == ErrorCode.coordinator_not_available

    run_broker(tmp_path, test)


def test_init_producer_id_bumps_the_epoch_and_the_older_producer_is_fenced(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        await find_coordinator(apis, "tx")
        first = await init_producer_id(apis, "tx")
        assert (first.error_code, first.producer_epoch) == (ErrorCode.none, 0)
        second = await init_producer_id(apis, "tx")
        assert (second.error_code, second.producer_id, second.producer_epoch) == (
            ErrorCode.none,
            first.producer_id,
            1,
        )
        # The first producer's epoch is fenced: PRODUCER_FENCED from v2, INVALID_PRODUCER_EPOCH for older clients.
        assert await add_partitions(apis, 3, "tx", first, {"events": (0,)}) == {
            ("events", 0): ErrorCode.producer_fenced
        }
        assert await add_partitions(apis, 1, "tx", first, {"events": (0,)}) == {
            ("events", 0): ErrorCode.invalid_producer_epoch
        }
        idempotent = await call(apis, API_INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout=TIMEOUT)
        assert idempotent.error_code == ErrorCode.none
        assert idempotent.producer_id != first.producer_id
        too_long = await init_producer_id(apis, "other", transaction_timeout=datetime.timedelta(hours=1))
        assert too_long.error_code == ErrorCode.invalid_transaction_timeout
        half = await init_producer_id(apis, "other", producer_id=5, producer_epoch=-1)
        assert half.error_code == ErrorCode.invalid_request

    run_broker(tmp_path, test)


def test_a_transaction_is_listed_described_and_ended(tmp_path: Path) -> None:
    async def test(apis: KafkaApis) -> None:
        await find_coordinator(apis, "tx")
        producer = await init_producer_id(apis, "tx")
        refused = await add_partitions(
            apis, 3, "tx", producer, {"events": (0,), "missing": (0,), "__consumer_offsets": (0,)}
        )
        assert refused == {
            ("events", 0): ErrorCode.operation_not_attempted,
            ("missing", 0): ErrorCode.unknown_topic_or_partition,
            ("__consumer_offsets", 0): ErrorCode.topic_authorization_failed,
        }
        added = await add_partitions(apis, 3, "tx", producer, {"events": (0, 1)})
        assert added == {("events", 0): ErrorCode.none, ("events", 1): ErrorCode.none}
        offsets = await call(
            apis,
            API_ADD_OFFSETS_TO_TXN,
            3,
            transactional_id="tx",
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            group_id="g",
        )
        assert offsets.error_code == ErrorCode.none
        described = await call(apis, API_DESCRIBE_TRANSACTIONS, 0, transactional_ids=("tx", "unknown"))
        tx, unknown = described.transaction_states
        assert (tx.error_code, tx.transaction_state, tx.producer_id, tx.producer_epoch) == (
            ErrorCode.none,
            "Ongoing",
            producer.producer_id,
            0,
        )
        assert tx.transaction_timeout == TIMEOUT
        assert tx.transaction_start_time.timestamp() > 0
        partitions = {(t.topic, p) for t in tx.topics for p in t.partitions}
        assert ("events", 0) in partitions and ("events", 1) in partitions
        assert any(topic == "__consumer_offsets" for topic, _ in partitions)
        assert unknown.error_code == ErrorCode.transactional_id_not_found
        listed = await call(apis, API_LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=())
        assert listed.error_code == ErrorCode.none
        assert [(t.transactional_id, t.producer_id, t.transaction_state) for t in listed.transaction_states] == [
            ("tx", producer.producer_id, "Ongoing")
        ]
        filtered = await call(
            apis,
            API_LIST_TRANSACTIONS,
            1,
            state_filters=("Ongoing",),
            producer_id_filters=(),
            duration_filter=3_600_000,
        )
        assert filtered.transaction_states == ()
        ended = await call(
            apis,
            API_END_TXN,
            3,
            transactional_id="tx",
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            committed=False,
        )
        assert ended.error_code == ErrorCode.none
        # The markers go out through the marker channel (WriteTxnMarkers to this broker), then CompleteAbort.
        async with asyncio.timeout(10):
            while True:
                after = await call(apis, API_DESCRIBE_TRANSACTIONS, 0, transactional_ids=("tx",))
                if after.transaction_states[0].transaction_state == "CompleteAbort":
                    break
                assert after.transaction_states[0].transaction_state == "PrepareAbort"
                await asyncio.sleep(0.05)
        assert after.transaction_states[0].topics == ()

    run_broker(tmp_path, test)


async def describe(apis: KafkaApis, transactional_id: str) -> Any:
    """DescribeTransactions, again while the coordinator loads the id's partition."""
    async with asyncio.timeout(20):
        while True:
            response = await call(apis, API_DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,))
            (state,) = response.transaction_states
            if state.error_code != ErrorCode.coordinator_load_in_progress:
                return state
            await asyncio.sleep(0.05)


def test_an_open_transaction_survives_a_restart_and_can_then_be_committed(tmp_path: Path) -> None:
    opened: list[Any] = []

    async def before(apis: KafkaApis) -> None:
        await find_coordinator(apis, "tx")
        producer = await init_producer_id(apis, "tx")
        assert await add_partitions(apis, 3, "tx", producer, {"events": (1,)}) == {("events", 1): ErrorCode.none}
        opened.append(producer)

    async def after(apis: KafkaApis) -> None:
        (producer,) = opened
        await find_coordinator(apis, "tx")
        state = await describe(apis, "tx")
        assert (state.transaction_state, state.producer_id, state.producer_epoch) == (
            "Ongoing",
            producer.producer_id,
            producer.producer_epoch,
        )
        assert [(t.topic, t.partitions) for t in state.topics] == [("events", (1,))]
        ended = await call(
            apis,
            API_END_TXN,
            3,
            transactional_id="tx",
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            committed=True,
        )
        assert ended.error_code == ErrorCode.none
        async with asyncio.timeout(10):
            while (await describe(apis, "tx")).transaction_state != "CompleteCommit":
                await asyncio.sleep(0.05)

    async def restart() -> None:
        for test in (before, after):
            async with started_broker(broker_config(tmp_path)) as broker:
                if "events" not in broker.apis.image.topics:
                    await create_events_topic(broker)
                await test(broker.apis)

    asyncio.run(restart())


def test_a_cluster_too_small_for_the_transaction_state_topic_says_which_setting_to_change(tmp_path: Path) -> None:
    async def main() -> None:
        async with started_broker(
            broker_config(tmp_path, **{"transaction.state.log.replication.factor": "3"})
        ) as broker:
            async with asyncio.timeout(20):
                while True:
                    response = await call(broker.apis, API_FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",))
                    (found,) = response.coordinators
                    assert found.error_code == ErrorCode.coordinator_not_available
                    if "transaction.state.log.replication.factor" in (found.error_message or ""):
                        break
                    await asyncio.sleep(0.05)
            assert "__transaction_state" not in broker.apis.image.topics

    asyncio.run(main())
