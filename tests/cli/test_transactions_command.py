"""`tierlog transactions list|describe` against a real broker, run as a person runs it, with a confluent-kafka
transactional producer holding a transaction open: kafka-transactions.sh's columns, the transaction's state,
partitions and producer, and one error line for an id nobody uses (docs/transactions.md#cli)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from cli_helpers import tierlog
from cluster_helpers import BrokerFactory
from confluent_kafka import Producer

TIMEOUT_S = 30.0
TRANSACTIONS = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
}


def test_list_and_describe_show_an_open_transaction(broker_factory: BrokerFactory, kafka: Any) -> None:
    broker = broker_factory(TRANSACTIONS)
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
    transactional_id = f"cli-{uuid.uuid4().hex[:8]}"
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id, "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(TIMEOUT_S)
    b = ("-b", broker.bootstrap)
    ran = tierlog("transactions", "describe", *b, "--transactional-id", transactional_id)
    assert ran.code == 0, ran.stderr
    [described] = [line.split() for line in ran.stdout.splitlines()[1:]]
    # No transaction yet: no start time, no duration, no partitions (kafka-transactions.sh prints None).
    assert described[1:] == [transactional_id, described[2], "0", "Empty", "60000", "None", "None"]

    producer.begin_transaction()
    for partition in (0, 1):
        producer.produce(topic, b"v", partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    started = time.time() * 1000

    ran = tierlog("transactions", "list", *b)
    assert ran.code == 0, ran.stderr
    assert ran.first_line.split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    rows = [line.split() for line in ran.stdout.splitlines()[1:]]
    [row] = [row for row in rows if row[0] == transactional_id]
    assert row[1] == "1" and row[3] == "Ongoing"
    producer_id = row[2]

    ran = tierlog("transactions", "describe", *b, "--transactional-id", transactional_id)
    assert ran.code == 0, ran.stderr
    assert ran.first_line.split() == [
        "CoordinatorId",
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "TransactionState",
        "TransactionTimeoutMs",
        "CurrentTransactionStartTimeMs",
        "TransactionDurationMs",
        "TopicPartitions",
    ]
    [described] = [line.split() for line in ran.stdout.splitlines()[1:]]
    assert described[:6] == ["1", transactional_id, producer_id, "0", "Ongoing", "60000"]
    assert abs(int(described[6]) - started) < 60_000 and int(described[7]) >= 0
    assert sorted(described[8].split(",")) == [f"{topic}-0", f"{topic}-1"]

    producer.commit_transaction(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        ran = tierlog("transactions", "describe", *b, "--transactional-id", transactional_id)
        assert ran.code == 0, ran.stderr
        [described] = [line.split() for line in ran.stdout.splitlines()[1:]]
        if described[4] == "CompleteCommit" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # The coordinator keeps the last transaction's start time (as Kafka's); its partitions are gone.
    assert described[4] == "CompleteCommit" and len(described) == 8

    ran = tierlog("transactions", "list", *b, "--duration-filter", "3600000")
    assert ran.code == 0, ran.stderr
    assert transactional_id not in ran.stdout

    ran = tierlog("transactions", "describe", *b, "--transactional-id", "nobody-uses-this")
    assert ran.code != 0
    assert ran.first_error_line == (
        "Error: Failed to describe transaction state of transactional-id `nobody-uses-this`: TRANSACTIONAL_ID_NOT_FOUND"
    )
