"""The Spark sink's transaction client against a real broker, without Spark: FindCoordinator, InitProducerId,
ListTransactions, AddPartitionsToTxn, transactional Produce and EndTxn at the versions the sink sends."""

from __future__ import annotations

from typing import Any

from cluster_helpers import BrokerFactory, read_partition_from_start

from tierlog.client.security import ClientSecurity
from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.spark.txn_client import ListedTransaction, TxnClient


def test_the_sink_client_initialises_a_transactional_id_that_list_transactions_shows_empty(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    with TxnClient(broker.bootstrap, ClientSecurity(), timeout_s=30.0) as client:
        producer = client.init_producer_id("rv-spark-txn", 60_000)
        assert client.list_transactions(["Ongoing"]) == []
        assert client.list_transactions() == [ListedTransaction("rv-spark-txn", producer.producer_id, "Empty")]


def test_the_sink_client_commits_a_transaction_that_a_read_committed_reader_sees(
    broker_factory: BrokerFactory, kafka: Any
) -> None:
    broker = broker_factory()
    topic = kafka.new_topic(broker.bootstrap)
    tp = TopicPartition(topic, 0)
    with TxnClient(broker.bootstrap, ClientSecurity(), timeout_s=30.0) as client:
        producer = client.init_producer_id("rv-spark-commit", 60_000)
        client.add_partitions("rv-spark-commit", producer, [tp])
        records = [(None, f"v{i}".encode(), (), 0) for i in range(3)]
        batch = build_batch(
            records,
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            base_sequence=0,
            transactional=True,
        )
        client.produce("rv-spark-commit", {tp: batch}, acks=-1, timeout_ms=30_000)
        assert read_partition_from_start(broker.bootstrap, topic, "read_committed") == []
        assert client.end_txn("rv-spark-commit", producer, commit=True) is None
    committed = read_partition_from_start(broker.bootstrap, topic, "read_committed")
    assert [value for _, _, value in committed] == [b"v0", b"v1", b"v2"]
