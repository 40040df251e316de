"""Produce requests of an idempotent producer against a whole broker in this process: a retried batch is
answered with its original base offset and stored once, a sequence gap answers OUT_OF_ORDER_SEQUENCE_NUMBER
and an older producer epoch INVALID_PRODUCER_EPOCH, as Kafka answers them."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kio.schema.describe_producers.v0 import request as describe_producers_v0
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init_producer_id_v4
from kio.schema.produce.v9 import request as produce_v9

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.protocol.codec import Request
from tierlog.records.codec import build_batch
from tierlog.records.record_batch import iter_batches
from tierlog.server.broker import Broker
from tierlog.server.clock import now_ms
from tierlog.server.kafka_apis import API_DESCRIBE_PRODUCERS, API_PRODUCE, KafkaApis
from tierlog.server.transaction_apis import API_INIT_PRODUCER_ID

TOPIC = "events"


def run_with_broker(tmp_path: Path, test: Callable[[Broker], Awaitable[None]], *, create_topic: bool = True) -> None:
    """A whole broker (controller included) in this process on free ports; the test calls its KafkaApis."""

    async def main() -> None:
        config = KafkaConfig(
            {"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0", "auto.create.topics.enable": "false"}
        )
        broker = Broker(config)
        async with asyncio.timeout(30):
            await broker.start()
        try:
            if create_topic:
                broker.controller_server.controller.create_topic(TOPIC, 1, 1, {})
                await broker.forwarding_manager.sync_metadata()
            async with asyncio.timeout(60):
                await test(broker)
        finally:
            await broker.stop()

    asyncio.run(main())


async def call(apis: KafkaApis, api_key: int, version: int, body: Any) -> Any:
    return await apis.handle(Request(api_key, version, 7, "test", body, 0))


async def init_producer_id(apis: KafkaApis) -> tuple[int, int]:
    body = init_producer_id_v4.InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)
    )
    response = await call(apis, API_INIT_PRODUCER_ID, 4, body)
    assert response.error_code == ErrorCode.none
    return response.producer_id, response.producer_epoch


async def produce(apis: KafkaApis, records: bytes, acks: int = -1) -> tuple[ErrorCode, int]:
    body = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            produce_v9.TopicProduceData(
                name=TOPIC, partition_data=(produce_v9.PartitionProduceData(index=0, records=records),)
            ),
        ),
    )
    (topic,) = (await call(apis, API_PRODUCE, 9, body)).responses
    (partition,) = topic.partition_responses
    return partition.error_code, partition.base_offset


def idempotent_batch(producer_id: int, epoch: int, sequence: int, records: int = 1) -> bytes:
    return build_batch(
        [(None, b"value-%d" % (sequence + i), [], now_ms()) for i in range(records)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def stored_batches(broker: Broker) -> list[tuple[int, int]]:
    log = broker.log_manager.get_log(TopicPartition(TOPIC, 0))
    assert log is not None
    info = log.read(0, 1 << 20, None, True)
    data = info.records.read_bytes() if info.records is not None else b""
    return [(h.base_offset, h.base_sequence) for h in iter_batches(data)]


def test_a_retried_produce_is_answered_with_the_same_base_offset_and_stored_once(tmp_path: Path) -> None:
    async def test(broker: Broker) -> None:
        producer_id, epoch = await init_producer_id(broker.apis)
        assert await produce(broker.apis, idempotent_batch(producer_id, epoch, 0, 3)) == (ErrorCode.none, 0)
        second = idempotent_batch(producer_id, epoch, 3, 2)
        assert await produce(broker.apis, second) == (ErrorCode.none, 3)
        # The response to the second request was lost; the producer sends the same batch again.
        assert await produce(broker.apis, second) == (ErrorCode.none, 3)
        assert await produce(broker.apis, second, acks=1) == (ErrorCode.none, 3)
        assert await produce(broker.apis, idempotent_batch(producer_id, epoch, 5)) == (ErrorCode.none, 5)
        assert stored_batches(broker) == [(0, 0), (3, 3), (5, 5)]

    run_with_broker(tmp_path, test)


def test_a_sequence_gap_answers_out_of_order_sequence_number(tmp_path: Path) -> None:
    async def test(broker: Broker) -> None:
        producer_id, epoch = await init_producer_id(broker.apis)
        assert await produce(broker.apis, idempotent_batch(producer_id, epoch, 0)) == (ErrorCode.none, 0)
        error, base_offset = await produce(broker.apis, idempotent_batch(producer_id, epoch, 2))
        assert (error, base_offset) == (ErrorCode.out_of_order_sequence_number, -1)
        assert stored_batches(broker) == [(0, 0)]

    run_with_broker(tmp_path, test)


def test_an_older_producer_epoch_answers_invalid_producer_epoch(tmp_path: Path) -> None:
    async def test(broker: Broker) -> None:
        producer_id, _ = await init_producer_id(broker.apis)
        assert await produce(broker.apis, idempotent_batch(producer_id, 1, 0)) == (ErrorCode.none, 0)
        error, _ = await produce(broker.apis, idempotent_batch(producer_id, 0, 1))
        assert error == ErrorCode.invalid_producer_epoch
        # A new epoch starts at sequence 0; anything else is out of order.
        error, _ = await produce(broker.apis, idempotent_batch(producer_id, 2, 4))
        assert error == ErrorCode.out_of_order_sequence_number
        assert await produce(broker.apis, idempotent_batch(producer_id, 2, 0)) == (ErrorCode.none, 1)
        assert stored_batches(broker) == [(0, 0), (1, 0)]

    run_with_broker(tmp_path, test)


def test_producer_state_survives_a_broker_restart(tmp_path: Path) -> None:
    state: dict[str, int] = {}

    async def first(broker: Broker) -> None:
        producer_id, epoch = await init_producer_id(broker.apis)
        state.update(producer_id=producer_id, epoch=epoch)
        for sequence in range(3):
            await produce(broker.apis, idempotent_batch(producer_id, epoch, sequence))

    async def second(broker: Broker) -> None:
        producer_id, epoch = state["producer_id"], state["epoch"]
        assert await produce(broker.apis, idempotent_batch(producer_id, epoch, 2)) == (ErrorCode.none, 2)
        error, _ = await produce(broker.apis, idempotent_batch(producer_id, epoch, 5))
        assert error == ErrorCode.out_of_order_sequence_number
        assert stored_batches(broker) == [(0, 0), (1, 1), (2, 2)]

    run_with_broker(tmp_path, first)
    run_with_broker(tmp_path, second, create_topic=False)


def test_describe_producers_shows_each_producers_epoch_and_last_sequence(tmp_path: Path) -> None:
    async def test(broker: Broker) -> None:
        first, epoch = await init_producer_id(broker.apis)
        second, _ = await init_producer_id(broker.apis)
        await produce(broker.apis, idempotent_batch(first, epoch, 0, 3))
        await produce(broker.apis, idempotent_batch(second, 4, 0, 1))
        body = describe_producers_v0.DescribeProducersRequest(
            topics=(
                describe_producers_v0.TopicRequest(name=TOPIC, partition_indexes=(0, 7)),
                describe_producers_v0.TopicRequest(name="missing", partition_indexes=(0,)),
            )
        )
        (known, missing) = (await call(broker.apis, API_DESCRIBE_PRODUCERS, 0, body)).topics
        here, absent = known.partitions
        assert here.error_code == ErrorCode.none
        described = {
            (p.producer_id, p.producer_epoch, p.last_sequence, p.current_txn_start_offset)
            for p in here.active_producers
        }
        assert described == {(first, epoch, 2, -1), (second, 4, 0, -1)}
        assert absent.error_code == ErrorCode.unknown_topic_or_partition
        assert missing.partitions[0].error_code == ErrorCode.unknown_topic_or_partition

    run_with_broker(tmp_path, test)


def test_describe_producers_shows_where_an_ongoing_transaction_started(tmp_path: Path) -> None:
    async def test(broker: Broker) -> None:
        plain, epoch = await init_producer_id(broker.apis)
        transactional, txn_epoch = await init_producer_id(broker.apis)
        await produce(broker.apis, idempotent_batch(plain, epoch, 0, 2))
        log = broker.log_manager.get_log(TopicPartition(TOPIC, 0))
        assert log is not None
        # The data path for transactional produce is not this test's: the batch goes to the log directly.
        records = build_batch(
            [(None, b"in a transaction", [], now_ms())],
            producer_id=transactional,
            producer_epoch=txn_epoch,
            base_sequence=0,
            transactional=True,
        )
        log.append_as_leader(bytearray(records), 0, now_ms())
        body = describe_producers_v0.DescribeProducersRequest(
            topics=(describe_producers_v0.TopicRequest(name=TOPIC, partition_indexes=(0,)),)
        )
        ((here,),) = [topic.partitions for topic in (await call(broker.apis, API_DESCRIBE_PRODUCERS, 0, body)).topics]
        described = {(p.producer_id, p.current_txn_start_offset) for p in here.active_producers}
        assert described == {(plain, -1), (transactional, 2)}

    run_with_broker(tmp_path, test)
