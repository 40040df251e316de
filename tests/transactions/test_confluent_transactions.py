"""confluent-kafka's (librdkafka's) transactional producer against a real broker: commit and abort across
partitions and topics, read_committed readers never past the last stable offset, zombie fencing, the coordinator
aborting a transaction past its timeout, and consume-transform-produce with send_offsets_to_transaction
(docs/transactions.md#proof)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
from txn_helpers import (
    TIMEOUT_S,
    group_offsets,
    latest_offsets,
    read_whole,
    transactional_producer,
    unique,
    values,
)

from tierlog.testing.local_cluster import BrokerProcess, wait_until


def test_a_committed_transaction_is_visible_across_partitions_and_topics(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    first, second = kafka.new_topic(bootstrap, 3), kafka.new_topic(bootstrap, 1)
    producer = transactional_producer(bootstrap, unique("commit"))
    producer.begin_transaction()
    for i in range(6):
        producer.produce(first, b"a%d" % i, partition=i % 3)
    producer.produce(second, b"b0")
    producer.commit_transaction(TIMEOUT_S)
    assert values(read_whole(bootstrap, first, range(3), "read_committed")) == [
        b"a0",
        b"a3",
        b"a1",
        b"a4",
        b"a2",
        b"a5",
    ]
    assert values(read_whole(bootstrap, second, [0], "read_committed")) == [b"b0"]
    # Each partition's commit marker takes an offset after the transaction's records.
    assert latest_offsets(bootstrap, first, range(3), IsolationLevel.READ_UNCOMMITTED) == {0: 3, 1: 3, 2: 3}
    assert latest_offsets(bootstrap, first, range(3), IsolationLevel.READ_COMMITTED) == {0: 3, 1: 3, 2: 3}


def test_an_aborted_transaction_is_invisible_to_read_committed_only(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 2)
    producer = transactional_producer(bootstrap, unique("abort"))
    for label, commit in ((b"kept-1", True), (b"aborted", False), (b"kept-2", True)):
        producer.begin_transaction()
        producer.produce(topic, label + b"-p0", partition=0)
        producer.produce(topic, label + b"-p1", partition=1)
        # Delivered first: librdkafka's abort_transaction purges what it has not sent yet.
        assert producer.flush(TIMEOUT_S) == 0
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)
    committed = read_whole(bootstrap, topic, range(2), "read_committed")
    assert values(committed) == [b"kept-1-p0", b"kept-2-p0", b"kept-1-p1", b"kept-2-p1"]
    # record, marker, aborted record, marker, record, marker
    assert [(p, o) for p, o, _ in committed] == [(0, 0), (0, 4), (1, 0), (1, 4)]
    uncommitted = read_whole(bootstrap, topic, range(2), "read_uncommitted")
    assert b"aborted-p0" in values(uncommitted) and b"aborted-p1" in values(uncommitted)


def test_read_committed_never_reads_past_the_last_stable_offset(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 1)
    kafka.produce(bootstrap, topic, [{"value": b"before"}])
    producer = transactional_producer(bootstrap, unique("open"))
    producer.begin_transaction()
    producer.produce(topic, b"open")
    assert producer.flush(TIMEOUT_S) == 0
    kafka.produce(bootstrap, topic, [{"value": b"after"}])  # not transactional, but behind the open transaction
    # The LSO is the open transaction's first offset; the high watermark is past "after".
    assert latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_COMMITTED) == {0: 1}
    assert latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_UNCOMMITTED) == {0: 3}
    assert values(read_whole(bootstrap, topic, [0], "read_committed")) == [b"before"]
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("lso"), "isolation.level": "read_committed"})
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
        assert seen == [b"before"], "a read_committed consumer went past the LSO"
        producer.commit_transaction(TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while len(seen) < 3 and time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
        assert seen == [b"before", b"open", b"after"]
    finally:
        reader.close()
    assert latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_COMMITTED) == {0: 4}


def test_a_new_producer_of_the_same_transactional_id_fences_the_old_one(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 2)
    transactional_id = unique("zombie")
    zombie = transactional_producer(bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    assert zombie.flush(TIMEOUT_S) == 0
    # The successor's InitProducerId bumps the epoch and aborts the zombie's open transaction.
    successor = transactional_producer(bootstrap, transactional_id)
    successor.begin_transaction()
    successor.produce(topic, b"successor", partition=1)
    successor.commit_transaction(TIMEOUT_S)
    with pytest.raises(KafkaException) as fenced:
        zombie.produce(topic, b"zombie-2", partition=1)
        zombie.commit_transaction(TIMEOUT_S)
    assert fenced.value.args[0].fatal(), fenced.value
    assert values(read_whole(bootstrap, topic, range(2), "read_committed")) == [b"successor"]
    assert b"zombie" in values(read_whole(bootstrap, topic, range(2), "read_uncommitted"))


def test_the_coordinator_aborts_a_transaction_past_its_timeout(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 1)
    # 6 s: long enough that the open transaction is still seen open below on a loaded machine (2 s was not always).
    producer = transactional_producer(bootstrap, unique("timeout"), transaction_timeout_ms=6000)
    producer.begin_transaction()
    producer.produce(topic, b"abandoned")
    assert producer.flush(TIMEOUT_S) == 0
    assert latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_COMMITTED) == {0: 0}
    # The coordinator's abort marker moves the LSO to the high watermark.
    wait_until(
        lambda: (
            latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_COMMITTED)
            == latest_offsets(bootstrap, topic, [0], IsolationLevel.READ_UNCOMMITTED)
            == {0: 2}
        ),
        30.0,
        "the coordinator to abort the transaction past its 6 s timeout",
        interval_s=0.5,
    )
    assert values(read_whole(bootstrap, topic, [0], "read_committed")) == []
    with pytest.raises(KafkaException):
        producer.commit_transaction(TIMEOUT_S)
    assert values(read_whole(bootstrap, topic, [0], "read_committed")) == []


def test_offsets_sent_to_a_transaction_commit_and_abort_with_it(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    source, sink = kafka.new_topic(bootstrap, 1, hint="-in"), kafka.new_topic(bootstrap, 2, hint="-out")
    kafka.produce(bootstrap, source, [{"value": b"in-%d" % i} for i in range(10)])
    group = unique("ctp")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = transactional_producer(bootstrap, unique("ctp"))
    try:
        consumer.subscribe([source])
        for batch, commit in ((0, True), (1, False)):
            inputs = _consume(consumer, 5)
            assert [m.offset() for m in inputs] == list(range(5 * batch, 5 * batch + 5))
            producer.begin_transaction()
            for message in inputs:
                producer.produce(sink, b"out-" + (message.value() or b""), partition=(message.offset() or 0) % 2)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), TIMEOUT_S
            )
            if commit:
                producer.commit_transaction(TIMEOUT_S)
            else:
                producer.abort_transaction(TIMEOUT_S)
            # The group's offset is where the last committed transaction left it.
            assert group_offsets(bootstrap, group, source, [0]) == {0: 5}
    finally:
        consumer.close()
    outputs = sorted(values(read_whole(bootstrap, sink, range(2), "read_committed")))
    assert outputs == sorted(b"out-in-%d" % i for i in range(5))


def _consume(consumer: Consumer, count: int) -> list[Any]:
    messages: list[Any] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(messages) < count:
        assert time.monotonic() < deadline, f"consumed {len(messages)} of {count}"
        messages.extend(m for m in consumer.consume(count - len(messages), 0.5) if m.error() is None)
    return messages


def test_a_transactional_producer_is_idempotent_across_its_transactions(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 1)
    producer: Producer = transactional_producer(bootstrap, unique("many"))
    for n in range(20):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, b"%d-%d" % (n, i))
        producer.commit_transaction(TIMEOUT_S)
    committed = read_whole(bootstrap, topic, [0], "read_committed")
    assert values(committed) == [b"%d-%d" % (n, i) for n in range(20) for i in range(5)]
    # five records and a marker per transaction
    assert [o for _, o, _ in committed] == [6 * n + i for n in range(20) for i in range(5)]
