"""kafka-python against a real broker: produce and consume (no consumer group), offsets by time."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000


def records(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(count):
        out.append(
            {
                "key": None if i % 5 == 0 and i % 9 else b"key-%d" % i,  # never both null: kafka-python refuses
                "value": None if i % 9 == 0 else bytes(range(256)) * (i % 4) + b"value-%d" % i,
                "headers": [("h", b"%d" % i), ("h", b"again"), ("empty", b"")] if i % 2 else [],
                "timestamp": BASE_TS + i * 10,
            }
        )
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_records_round_trip_with_kafka_python(
    shared_broker: BrokerProcess, kafka: Any, clients: Any, storage: Any, codec: str
) -> None:
    client = clients["kafka-python"]
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


def test_kafka_python_admin_creates_and_lists_topics(shared_broker: BrokerProcess, kafka: Any) -> None:
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=20_000)
    try:
        topic = kafka.topic_name()
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        assert topic in admin.list_topics()
        [described] = admin.describe_topics([topic])
        assert described["error_code"] == 0
        assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1, 2]
    finally:
        admin.close()


def test_kafka_python_offsets_for_times_beginning_and_end_offsets(
    shared_broker: BrokerProcess, kafka: Any, clients: Any
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    clients["kafka-python"].produce(
        shared_broker.bootstrap, topic, [{"value": b"v%d" % i, "timestamp": BASE_TS + i * 100} for i in range(50)]
    )
    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.beginning_offsets([tp], timeout_ms=20_000) == {tp: 0}
        assert consumer.end_offsets([tp], timeout_ms=20_000) == {tp: 50}
        found = consumer.offsets_for_times({tp: BASE_TS + 1250}, timeout_ms=20_000)[tp]
        assert found is not None and (found.offset, found.timestamp) == (13, BASE_TS + 1300)
        found = consumer.offsets_for_times({tp: BASE_TS}, timeout_ms=20_000)[tp]
        assert found is not None and (found.offset, found.timestamp) == (0, BASE_TS)
        assert consumer.offsets_for_times({tp: BASE_TS + 50 * 100}, timeout_ms=20_000)[tp] is None
    finally:
        consumer.close()


def test_kafka_python_producer_with_default_settings_delivers(shared_broker: BrokerProcess, kafka: Any) -> None:
    # kafka-python 3 enables idempotence by default against any broker that looks >= 0.11, and then needs
    # InitProducerId for a producer id before it sends anything.
    topic = kafka.topic_name()
    kafka.create_topic(shared_broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=20_000)
    try:
        futures = [producer.send(topic, b"default-%d" % i) for i in range(10)]
        producer.flush(timeout=20)
        assert [f.get(timeout=20).offset for f in futures] == list(range(10))
    finally:
        producer.close(timeout=20)
    values = [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)]
    assert values == [b"default-%d" % i for i in range(10)]
