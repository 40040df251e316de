"""The transaction coordinator end to end on a three-broker cluster, with confluent-kafka's transactional producer
(docs/transactions.md#coordinator-shell): __transaction_state is created with Kafka's defaults (3 replicas, min.isr
2), a transaction over partitions led by other brokers gets its markers over the network, so a read_committed
consumer sees a committed transaction whole and an aborted one not at all, and a second producer with the same
transactional.id fences the first."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from cluster_helpers import ClusterFactory
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 30.0
PARTITIONS = 3


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(TIMEOUT_S)
    return producer


def read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    """Every record of every partition up to its end (the LSO for read_committed), as (partition, value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        records: list[tuple[int, bytes]] = []
        at_end: set[int] = set()
        while len(at_end) < PARTITIONS:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"no end of partition within {TIMEOUT_S}s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            records.append((message.partition(), message.value()))
        return sorted(records)
    finally:
        consumer.close()


def test_commit_abort_and_fencing_across_brokers(cluster_factory: ClusterFactory, kafka: Any) -> None:
    cluster = cluster_factory({"transaction.state.log.num.partitions": "3"}, brokers=3)
    bootstrap = cluster.bootstrap
    topic = kafka.topic_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # One replica per partition, spread over the brokers: most markers go to a broker other than the coordinator.
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(TIMEOUT_S)
    leaders = {p.id: p.leader for p in admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions.values()}
    assert len(set(leaders.values())) > 1, leaders

    producer = transactional_producer(bootstrap, "shell-e2e")
    state = admin.list_topics("__transaction_state", timeout=TIMEOUT_S).topics["__transaction_state"]
    assert all(len(p.replicas) == 3 for p in state.partitions.values())

    producer.begin_transaction()
    for partition in range(PARTITIONS):
        producer.produce(topic, f"committed-{partition}".encode(), partition=partition)
    producer.commit_transaction(TIMEOUT_S)
    committed = [(p, f"committed-{p}".encode()) for p in range(PARTITIONS)]
    assert read_all(bootstrap, topic, "read_committed") == committed

    producer.begin_transaction()
    for partition in range(PARTITIONS):
        producer.produce(topic, f"aborted-{partition}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    producer.abort_transaction(TIMEOUT_S)
    assert read_all(bootstrap, topic, "read_committed") == committed
    assert len(read_all(bootstrap, topic, "read_uncommitted")) == 2 * PARTITIONS

    zombie = producer
    producer = transactional_producer(bootstrap, "shell-e2e")
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(TIMEOUT_S)
    error = fenced.value.args[0]
    assert error.fatal() and error.code() == KafkaError._FENCED, error
    producer.begin_transaction()
    producer.produce(topic, b"after-fencing", partition=1)
    producer.commit_transaction(TIMEOUT_S)
    assert read_all(bootstrap, topic, "read_committed") == sorted([*committed, (1, b"after-fencing")])
