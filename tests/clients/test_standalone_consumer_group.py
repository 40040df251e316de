"""A standalone broker on embedded defaults (no controller.quorum.voters) serves consumer groups as Kafka's
single-node quickstart does: __consumer_offsets gets one replica without any setting."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tierlog.testing.local_cluster import BrokerProcess

DEADLINE_S = 30.0


def _subscribe_and_read(bootstrap: str, group: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            values.append(message.value())
        if values:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_a_standalone_broker_on_embedded_defaults_serves_a_group_and_its_commits(
    broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    kafka.create_topic(broker.bootstrap, topic, partitions=2)
    kafka.produce(broker.bootstrap, topic, [{"value": f"v{i}".encode()} for i in range(10)])
    first = _subscribe_and_read(broker.bootstrap, "standalone", topic, 10)
    assert sorted(first) == sorted(f"v{i}".encode() for i in range(10))

    kafka.produce(broker.bootstrap, topic, [{"value": b"after-commit"}])
    # The group resumes at its commits: only the record produced after them is read again.
    assert _subscribe_and_read(broker.bootstrap, "standalone", topic, 1) == [b"after-commit"]

    committed = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "standalone"})
    try:
        offsets = committed.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        committed.close()
    assert sum(tp.offset for tp in offsets) == 11
