"""kafka-python against a real broker: its admin client and its default producer settings (its round trip and offset
lookups are in test_round_trip.py and test_offset_lookups.py)."""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from tierlog.testing.local_cluster import BrokerProcess


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


def test_kafka_python_producer_with_default_settings_delivers(shared_broker: BrokerProcess, kafka: Any) -> None:
    # kafka-python 3 enables idempotence by default against any broker that looks >= 0.11, and then needs
    # InitProducerId for a producer id before it sends anything.
    topic = kafka.new_topic(shared_broker.bootstrap)
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=20_000)
    try:
        futures = [producer.send(topic, b"default-%d" % i) for i in range(10)]
        producer.flush(timeout=20)
        assert [f.get(timeout=20).offset for f in futures] == list(range(10))
    finally:
        producer.close(timeout=20)
    values = [r.value for r in kafka.consume_all(shared_broker.bootstrap, topic)]
    assert values == [b"default-%d" % i for i in range(10)]
