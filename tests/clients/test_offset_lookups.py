"""Offset lookups with each Python client library's own consumer: the beginning and end offsets, and offsets for
times (the first offset whose timestamp is at or after the target; none when every record is older). kcat's and
librdkafka's lookups are in test_kcat.py and test_confluent_kafka.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000
RECORDS = 50  # record i has the timestamp BASE_TS + i * 100
# target timestamp -> (offset, timestamp) of the record found, or None
EXPECTED = {
    BASE_TS: (0, BASE_TS),
    BASE_TS + 1250: (13, BASE_TS + 1300),
    BASE_TS + 4801: (49, BASE_TS + 4900),
    BASE_TS + 5000: None,
    BASE_TS + 9999: None,
}
TIMEOUT_MS = 20_000

# (beginning offset, end offset, what each target timestamp finds) of partition 0
Lookups = tuple[int, int, list[tuple[int, int] | None]]


def kafka_python_lookups(bootstrap: str, topic: str, targets: list[int]) -> Lookups:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = KafkaTopicPartition(topic, 0)
        found = [consumer.offsets_for_times({tp: target}, timeout_ms=TIMEOUT_MS)[tp] for target in targets]
        return (
            consumer.beginning_offsets([tp], timeout_ms=TIMEOUT_MS)[tp],
            consumer.end_offsets([tp], timeout_ms=TIMEOUT_MS)[tp],
            [None if f is None else (f.offset, f.timestamp) for f in found],
        )
    finally:
        consumer.close()


def aiokafka_lookups(bootstrap: str, topic: str, targets: list[int]) -> Lookups:
    async def lookups() -> Lookups:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            found = [(await consumer.offsets_for_times({tp: target}))[tp] for target in targets]
            return (
                (await consumer.beginning_offsets([tp]))[tp],
                (await consumer.end_offsets([tp]))[tp],
                [None if f is None else (f.offset, f.timestamp) for f in found],
            )
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(lookups(), TIMEOUT_MS / 1000))


LOOKUPS: dict[str, Callable[[str, str, list[int]], Lookups]] = {
    "kafka-python": kafka_python_lookups,
    "aiokafka": aiokafka_lookups,
}


@pytest.mark.parametrize("client", list(LOOKUPS))
def test_beginning_and_end_offsets_and_offsets_for_times(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, client: str
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    sent = [{"value": b"v%d" % i, "timestamp": BASE_TS + i * 100} for i in range(RECORDS)]
    clients[client].produce(shared_broker.bootstrap, topic, sent)
    beginning, end, found = LOOKUPS[client](shared_broker.bootstrap, topic, list(EXPECTED))
    assert (beginning, end) == (0, RECORDS)
    assert dict(zip(EXPECTED, found, strict=True)) == EXPECTED
