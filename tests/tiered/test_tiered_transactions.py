"""Transactions in the remote tier end to end (docs/transactions.md#tiered): a transactional producer
(confluent-kafka) commits and aborts transactions on a tiered topic until its closed segments have left the
broker's disk; each copied segment's transaction index is in the remote tier, and a read_committed consumer
reading from offset 0, served from the remote tier, sees exactly the committed records."""

from __future__ import annotations

import uuid
from pathlib import Path

from cluster_helpers import ClusterFactory, read_partition_from_start
from confluent_kafka import Producer
from tiered_helpers import (
    CLIENT_TIMEOUT_S,
    create_topic,
    leader_of,
    tiered_overrides,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.storage.transaction_index import ABORTED_TXN_SIZE, parse_aborted_txns

# One broker: the transaction state and group topics with one replica, a few partitions each.
TRANSACTION_OVERRIDES = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
}
TRANSACTIONS = 24
RECORDS_PER_TRANSACTION = 30


def test_read_committed_from_the_remote_tier_sees_only_committed_records(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    remote_dir = tmp_path / "remote"
    cluster = cluster_factory(
        {**tiered_overrides({"rsm.config.url": f"file://{remote_dir}"}, brokers=1), **TRANSACTION_OVERRIDES},
        brokers=1,
    )
    topic = "tiered-transactions"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), replication_factor=1)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": f"tiered-{uuid.uuid4().hex[:8]}", "linger.ms": 5}
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    for txn in range(TRANSACTIONS):
        commit = txn % 3 != 1
        values = [f"txn-{txn:03d}-{i:03d}-".encode() + b"v" * 100 for i in range(RECORDS_PER_TRANSACTION)]
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        # Delivered first: librdkafka's abort_transaction purges what it has not sent yet.
        assert producer.flush(CLIENT_TIMEOUT_S) == 0
        if commit:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
            committed += values
        else:
            producer.abort_transaction(CLIENT_TIMEOUT_S)
            aborted += values
    total_offsets = TRANSACTIONS * (RECORDS_PER_TRANSACTION + 1)

    leader = leader_of(cluster, topic)
    state = wait_tiered(cluster, leader, topic, local_start_above=total_offsets // 2, settled=True)
    assert state["log_start_offset"] == 0

    # The copies of segments holding ABORT markers took their transaction indexes along, under Kafka's names.
    txn_indexes = sorted(remote_dir.rglob("*.txnindex"))
    assert txn_indexes, f"no transaction index in the remote tier: {sorted(p.name for p in remote_dir.rglob('*'))}"
    entries = [txn for path in txn_indexes for txn in parse_aborted_txns(path.read_bytes())]
    assert all(path.stat().st_size % ABORTED_TXN_SIZE == 0 for path in txn_indexes)
    assert len({txn.last_offset for txn in entries}) == len(entries)
    aborted_in_remote = sum(1 for txn in entries if txn.last_offset <= state["highest_offset_in_remote_storage"])
    assert aborted_in_remote >= 1

    # Served from the remote tier up to the local log start: only the committed records, in order.
    read = read_partition_from_start(cluster.bootstrap, topic, "read_committed", CLIENT_TIMEOUT_S)
    assert [value for _, _, value in read] == committed
    assert read[0][0] == 0
    everything = read_partition_from_start(cluster.bootstrap, topic, "read_uncommitted", CLIENT_TIMEOUT_S)
    assert sorted(value or b"" for _, _, value in everything) == sorted(committed + aborted)
