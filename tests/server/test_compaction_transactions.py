"""Compaction of a topic written in transactions, on a running broker (docs/transactions.md#compaction):
confluent-kafka's transactional producer commits and aborts updates of the same keys; the broker's cleaner
removes the aborted records for every reader (read_uncommitted ones too) and keeps each key's latest committed
value, which read_committed consumers still read, with the transactions' markers."""

from __future__ import annotations

import uuid
from typing import Any

from cluster_helpers import BrokerFactory, read_partition_from_start
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import wait_until

TIMEOUT_S = 30.0
BROKER_OVERRIDES = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
    "log.cleaner.backoff.ms": "200",
}
KEYS = [f"key-{i}".encode() for i in range(5)]
# Rounds of one update of every key, each a transaction; these are aborted.
ROUNDS, ABORTED_ROUNDS = 6, (2, 5)


def test_the_cleaner_removes_aborted_records_and_keeps_the_latest_committed_value_per_key(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(BROKER_OVERRIDES)
    bootstrap = broker.bootstrap
    topic = "compacted-transactions"
    configs = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(TIMEOUT_S)
    # Batches well below segment.bytes, so several fit a segment.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"compact-{uuid.uuid4().hex[:8]}", "batch.size": 400}
    )
    producer.init_transactions(TIMEOUT_S)

    def transaction(records: list[tuple[bytes, bytes]], commit: bool) -> None:
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, value, key, partition=0)
        # Delivered first: librdkafka's abort_transaction purges what it has not sent yet.
        assert producer.flush(TIMEOUT_S) == 0
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)

    for round_ in range(ROUNDS):
        transaction([(key, b"round-%d" % round_) for key in KEYS], commit=round_ not in ABORTED_ROUNDS)
    # Later committed records of other keys, so the rounds above lie in closed (cleanable) segments.
    fillers = [(b"filler-%d" % i, b"x" * 100) for i in range(30)]
    transaction(fillers, commit=True)
    latest_committed = {key: b"round-4" for key in KEYS}

    def cleaned() -> list[tuple[int, bytes | None, bytes | None]] | None:
        records = read_partition_from_start(bootstrap, topic, "read_uncommitted", TIMEOUT_S)
        keyed = [(key, value) for _, key, value in records if key in latest_committed]
        return records if sorted(keyed) == sorted(latest_committed.items()) else None

    after: Any = wait_until(cleaned, TIMEOUT_S, "the cleaner to remove superseded and aborted records")
    # read_uncommitted readers no longer see the aborted rounds: the records are gone from the log. Every reader
    # sees the same: each key's latest committed value at its original offset, then the fillers.
    committed = read_partition_from_start(bootstrap, topic, "read_committed", TIMEOUT_S)
    assert committed == after
    # A round's records take consecutive offsets, its marker the next one: round r's key i is at 6r + i.
    assert [(offset, key) for offset, key, _ in committed if key in latest_committed] == [
        (6 * 4 + i, key) for i, key in enumerate(KEYS)
    ]
    assert [(key, value) for _, key, value in committed if key not in latest_committed] == fillers
