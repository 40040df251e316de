"""kafka-python 3's transactional API against a real broker: commit and abort read back by its own read_committed
consumer, send_offsets_to_transaction with the consumer's group metadata (KIP-447), and zombie fencing
(docs/transactions.md#proof)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, ProducerFencedError
from kafka.structs import OffsetAndMetadata
from txn_helpers import TIMEOUT_S, group_offsets, read_whole, unique, values

from tierlog.testing.local_cluster import BrokerProcess

# How long a reader keeps polling after it has what it expects, to see nothing more arrive.
QUIET_S = 1.0


@contextmanager
def transactional(bootstrap: str, transactional_id: str) -> Iterator[KafkaProducer]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, request_timeout_ms=20_000, max_block_ms=30_000
    )
    try:
        producer.init_transactions()
        yield producer
    finally:
        producer.close(timeout=10)


def read_committed(bootstrap: str, topic: str, partitions: range, expected: int) -> list[bytes]:
    """What kafka-python's read_committed consumer reads from the start: `expected` records, then QUIET_S more."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False, group_id=None
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        seen: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until = None
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline, f"read {len(seen)} of {expected} committed records"
            for records in consumer.poll(timeout_ms=200).values():
                seen.extend((r.partition, r.offset, r.value) for r in records)
            if quiet_until is None and len(seen) >= expected:
                quiet_until = time.monotonic() + QUIET_S
        return [value for _, _, value in sorted(seen)]
    finally:
        consumer.close()


def test_kafka_python_commits_and_aborts_across_partitions(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 2)
    with transactional(bootstrap, unique("kafka-python")) as producer:
        for label, commit in ((b"kept-1", True), (b"aborted", False), (b"kept-2", True)):
            producer.begin_transaction()
            for partition in (0, 1):
                producer.send(topic, label + b"-p%d" % partition, partition=partition)
            producer.flush(timeout=TIMEOUT_S)  # the aborted records reach the log too
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    expected = [b"kept-1-p0", b"kept-2-p0", b"kept-1-p1", b"kept-2-p1"]
    assert read_committed(bootstrap, topic, range(2), len(expected)) == expected
    assert b"aborted-p1" in values(read_whole(bootstrap, topic, range(2), "read_uncommitted"))


def test_kafka_python_sends_the_group_offsets_with_the_transaction(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    source, sink = kafka.new_topic(bootstrap, 1, hint="-in"), kafka.new_topic(bootstrap, 1, hint="-out")
    kafka.produce(bootstrap, source, [{"value": b"in-%d" % i} for i in range(6)])
    group = unique("kafka-python-ctp")
    consumer = KafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=3,
    )
    try:
        with transactional(bootstrap, unique("kafka-python-ctp")) as producer:
            for commit in (True, False):
                inputs: list[Any] = []
                deadline = time.monotonic() + TIMEOUT_S
                while len(inputs) < 3:
                    assert time.monotonic() < deadline, f"consumed {len(inputs)} of 3"
                    for records in consumer.poll(timeout_ms=500, max_records=3 - len(inputs)).values():
                        inputs.extend(records)
                producer.begin_transaction()
                for record in inputs:
                    producer.send(sink, b"out-" + record.value)
                offsets = {TopicPartition(source, 0): OffsetAndMetadata(inputs[-1].offset + 1, "", -1)}
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                if commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
                assert group_offsets(bootstrap, group, source, [0]) == {0: 3}
    finally:
        consumer.close()
    assert values(read_whole(bootstrap, sink, [0], "read_committed")) == [b"out-in-0", b"out-in-1", b"out-in-2"]


def test_kafka_python_producer_is_fenced_by_its_successor(txn_broker: BrokerProcess, kafka: Any) -> None:
    bootstrap = txn_broker.bootstrap
    topic = kafka.new_topic(bootstrap, 1)
    transactional_id = unique("kafka-python-zombie")
    with transactional(bootstrap, transactional_id) as zombie:
        zombie.begin_transaction()
        zombie.send(topic, b"zombie").get(timeout=TIMEOUT_S)
        with transactional(bootstrap, transactional_id) as successor:
            successor.begin_transaction()
            successor.send(topic, b"successor")
            successor.commit_transaction()
        with pytest.raises((ProducerFencedError, KafkaError)) as fenced:
            zombie.send(topic, b"zombie-2")
            zombie.commit_transaction()
        assert "fenced" in repr(fenced.value).lower() or "epoch" in repr(fenced.value).lower(), fenced.value
    assert read_committed(bootstrap, topic, range(1), 1) == [b"successor"]
