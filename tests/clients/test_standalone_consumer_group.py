"""A standalone broker on embedded defaults (no controller.quorum.voters) serves consumer groups as Kafka's
single-node quickstart does: __consumer_offsets gets one replica without any setting."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tierlog.testing.local_cluster import BrokerProcess, wait_until

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

        def read_all() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            return len(values) >= count

        wait_until(read_all, DEADLINE_S, lambda: f"{count} records of {topic} for {group} (have {len(values)})", 0)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_a_standalone_broker_on_embedded_defaults_serves_a_group_and_its_commits(
    broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
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
