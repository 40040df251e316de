"""The Spark sink's transaction client against a real broker (no Spark): it finds the transaction coordinator
(FindCoordinator v3) and lists the transactional id it initialised (ListTransactions v0)."""

from __future__ import annotations

from cluster_helpers import BrokerFactory

from tierlog.client.security import ClientSecurity
from tierlog.spark.txn_client import ListedTransaction, TxnClient


def test_the_sink_client_initialises_a_transactional_id_that_list_transactions_shows_empty(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    with TxnClient(broker.bootstrap, ClientSecurity(), timeout_s=30.0) as client:
        producer = client.init_producer_id("rv-spark-txn", 60_000)
        assert client.list_transactions(["Ongoing"]) == []
        assert client.list_transactions() == [ListedTransaction("rv-spark-txn", producer.producer_id, "Empty")]
