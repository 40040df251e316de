"""aiokafka against a real broker: produce and consume (no consumer group), offsets by time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000


def records(count: int) -> list[dict[str, Any]]:
    return [
        {
            "key": None if i % 4 == 0 else b"\x00key\xff%d" % i,
            "value": None if i % 10 == 3 else b"\x00\x01" * i + b"v%d" % i,
            "headers": [("n", b"%d" % i), ("bin", b"\x00\xff")] if i % 3 else [],
            "timestamp": BASE_TS - i,  # going backwards in time
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_records_round_trip_with_aiokafka(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, storage: Any, codec: str
) -> None:
    client = clients["aiokafka"]
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    sent = records(300)
    assert client.produce(shared_broker.bootstrap, topic, sent, compression=codec) == list(range(300))
    # A client may send a batch uncompressed when compression would make it bigger; never only so.
    stored = storage(shared_broker, topic, 0)
    assert codec in stored and stored <= {codec, "none"}, f"batches on disk are {stored}, not {codec}"
    got = client.consume(shared_broker.bootstrap, topic, len(sent))
    assert [r.offset for r in got] == list(range(300))
    for record, spec in zip(got, sent, strict=True):
        assert record.content() == (spec["key"], spec["value"], tuple(spec["headers"])), record.offset
        assert (record.create_time, record.timestamp) == (True, spec["timestamp"])


def test_aiokafka_offsets_for_times_beginning_and_end_offsets(
    shared_broker: BrokerProcess, kafka: Any, clients: Any
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    clients["aiokafka"].produce(
        shared_broker.bootstrap, topic, [{"value": b"v%d" % i, "timestamp": BASE_TS + i * 100} for i in range(50)]
    )

    async def lookups() -> tuple[Any, ...]:
        consumer = AIOKafkaConsumer(bootstrap_servers=shared_broker.bootstrap, group_id=None)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            return (
                await consumer.beginning_offsets([tp]),
                await consumer.end_offsets([tp]),
                await consumer.offsets_for_times({tp: BASE_TS + 4801}),
                await consumer.offsets_for_times({tp: BASE_TS + 9999}),
            )
        finally:
            await consumer.stop()

    tp = TopicPartition(topic, 0)
    beginning, end, found, none = asyncio.run(asyncio.wait_for(lookups(), kafka.timeout_s))
    assert beginning == {tp: 0}
    assert end == {tp: 50}
    assert found[tp] is not None and (found[tp].offset, found[tp].timestamp) == (49, BASE_TS + 4900)
    assert none == {tp: None}
