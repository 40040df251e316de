"""Fetch sessions (KIP-227, docs/performance.md#fetch-sessions) on a real broker: a full fetch with epoch 0 gets
a session, an incremental fetch is answered with only the partitions that changed, a wrong epoch is answered
INVALID_FETCH_SESSION_EPOCH (71) and an unknown session FETCH_SESSION_ID_NOT_FOUND (70); kafka-python's consumer,
which asks for sessions, reads a topic through many incremental fetches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from asyncio_helpers import run_bounded
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

from tierlog.client.connection import KafkaConnection
from tierlog.client.requests import PartitionFetch, create_topics_request, fetch_request, produce_request
from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.testing.local_cluster import BrokerProcess

TIMEOUT_S = 10.0
PARTITIONS = 4


@pytest.fixture(scope="module")
def session_broker(module_broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return module_broker_factory()


def answered(response: Any) -> dict[int, Any]:
    """The partitions of a one-topic Fetch answer, by index."""
    return {p.partition_index: p for topic in response.responses for p in topic.partitions}


def test_an_incremental_fetch_answers_only_the_partitions_that_changed(session_broker: BrokerProcess) -> None:
    topic = "sessions"
    partitions = [TopicPartition(topic, i) for i in range(PARTITIONS)]

    def fetch(session_id: int, epoch: int, wanted: list[PartitionFetch], **kwargs: Any) -> Any:
        return fetch_request(
            wanted, max_wait_ms=50, max_bytes=1 << 20, session_id=session_id, session_epoch=epoch, **kwargs
        )

    def produce(partition: int, value: bytes) -> Any:
        return produce_request(
            TopicPartition(topic, partition),
            build_batch([(None, value, [], 1_700_000_000_000)]),
            acks=1,
            timeout_ms=10_000,
        )

    async def scenario() -> dict[str, Any]:
        connection = await KafkaConnection.open(
            "127.0.0.1", session_broker.port, client_id="sessions", timeout_s=TIMEOUT_S
        )
        try:
            send = connection.send
            await send(create_topics_request(topic, PARTITIONS, 1, {}, timeout_ms=10_000), timeout_s=TIMEOUT_S)
            await send(produce(0, b"first"), timeout_s=TIMEOUT_S)
            full = await send(fetch(0, 0, [PartitionFetch(tp, 0, 1 << 20) for tp in partitions]), timeout_s=TIMEOUT_S)
            session_id = int(full.session_id)
            # The first record of partition 0 was read: only its fetch offset changed.
            moved = await send(fetch(session_id, 1, [PartitionFetch(partitions[0], 1, 1 << 20)]), timeout_s=TIMEOUT_S)
            await send(produce(2, b"second"), timeout_s=TIMEOUT_S)
            changed = await send(fetch(session_id, 2, []), timeout_s=TIMEOUT_S)
            # Partition 2's record was read: its new fetch offset is the only change.
            quiet = await send(fetch(session_id, 3, [PartitionFetch(partitions[2], 1, 1 << 20)]), timeout_s=TIMEOUT_S)
            # Partition 0 gets a record but is forgotten by the same fetch.
            await send(produce(0, b"third"), timeout_s=TIMEOUT_S)
            forgotten = await send(fetch(session_id, 4, [], forgotten=[partitions[0]]), timeout_s=TIMEOUT_S)
            wrong_epoch = await send(fetch(session_id, 7, []), timeout_s=TIMEOUT_S)
            unknown = await send(fetch(session_id + 1, 1, []), timeout_s=TIMEOUT_S)
            sessionless = await send(
                fetch(0, -1, [PartitionFetch(tp, 0, 1 << 20) for tp in partitions]), timeout_s=TIMEOUT_S
            )
            return {
                "full": full,
                "moved": moved,
                "changed": changed,
                "quiet": quiet,
                "forgotten": forgotten,
                "wrong_epoch": wrong_epoch,
                "unknown": unknown,
                "sessionless": sessionless,
            }
        finally:
            await connection.close()

    answers = run_bounded(scenario, 60.0)
    full = answers["full"]
    assert int(full.error_code) == 0 and int(full.session_id) != 0
    assert sorted(answered(full)) == list(range(PARTITIONS))
    assert answered(full)[0].records
    # Partition 0 is read from offset 1 now: nothing new there, and nothing anywhere else.
    assert int(answers["moved"].session_id) == int(full.session_id) and answered(answers["moved"]) == {}
    changed = answered(answers["changed"])
    assert sorted(changed) == [2] and changed[2].records and int(changed[2].high_watermark) == 1
    assert answered(answers["quiet"]) == {}
    assert int(answers["forgotten"].error_code) == 0 and answered(answers["forgotten"]) == {}
    wrong_epoch = answers["wrong_epoch"]
    assert (int(wrong_epoch.error_code), answered(wrong_epoch)) == (71, {})
    unknown = answers["unknown"]
    assert (int(unknown.error_code), int(unknown.session_id), answered(unknown)) == (70, 0, {})
    sessionless = answers["sessionless"]
    assert (int(sessionless.error_code), int(sessionless.session_id)) == (0, 0)
    assert sorted(answered(sessionless)) == list(range(PARTITIONS))


def test_kafka_python_reads_a_topic_through_incremental_fetch_sessions(
    session_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(session_broker.bootstrap, partitions=3)
    producer = KafkaProducer(bootstrap_servers=session_broker.bootstrap, request_timeout_ms=20_000)
    try:
        for i in range(300):
            producer.send(topic, b"value-%d" % i, partition=i % 3)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=20)
    consumer = KafkaConsumer(
        bootstrap_servers=session_broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # Small fetches, so the topic takes many fetches of one session.
        max_partition_fetch_bytes=1024,
        fetch_max_bytes=2048,
        request_timeout_ms=20_000,
    )
    try:
        consumer.assign([KafkaTopicPartition(topic, p) for p in range(3)])
        seen: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
        for _ in range(200):
            for tp, records in consumer.poll(timeout_ms=500).items():
                seen[tp.partition].extend(r.value for r in records)
            if sum(map(len, seen.values())) >= 300:
                break
        handlers = consumer._fetcher._session_handlers
        sessions = [handler.next_metadata.session_id for handler in handlers.values()]
    finally:
        consumer.close()
    for p in range(3):
        assert seen[p] == [b"value-%d" % i for i in range(p, 300, 3)]
    # The consumer's fetches went through a session the broker gave it.
    assert sessions and all(session_id != 0 for session_id in sessions)
