"""The transactional sink's recovery on a real broker's transaction coordinator, crash points placed exactly
(no Spark: the tasks' and the driver's code with tierlog's client): a driver dead between two EndTxns of a
decided batch, and one dead before deciding with a rerun cut into fewer Spark partitions."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from tierlog.client.security import ClientSecurity
from tierlog.spark.exactly_once import (
    Decision,
    SinkLog,
    SinkRow,
    TaskTransaction,
    TransactionWriter,
    commit_batch,
    complete_decisions,
    query_prefix,
    transactional_id,
)
from tierlog.spark.txn_client import TxnClient
from tierlog.testing.local_cluster import BrokerProcess

PREFIX = "tierlog-spark"
TIMEOUT_MS = 60_000
PARTITIONS = 2


def write_task(
    client: TxnClient, query: str, batch_id: int, partition: int, topic: str, rows: list[bytes]
) -> TaskTransaction:
    """What a task of the transactional sink does (sink.write_in_transaction without Spark's TaskContext)."""
    tid = transactional_id(PREFIX, query, partition)
    producer = client.init_producer_id(tid, TIMEOUT_MS)
    writer = TransactionWriter(client, tid, producer, acks=-1, timeout_ms=30_000)
    for value in rows:
        writer.add(SinkRow(topic, value, value, (), None), 0)
    writer.flush()
    return TaskTransaction(
        tid, producer.producer_id, producer.producer_epoch, batch_id, writer.written_partitions(), writer.records
    )


def read(bootstrap: str, topic: str, isolation: str) -> tuple[list[bytes], list[int]]:
    """The values `isolation` reads (up to each partition's end as it sees it), and those ends."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        ends = [
            consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(PARTITIONS)
        ]
        consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        for _ in range(100):
            positions = consumer.position([KafkaTopicPartition(topic, p) for p in range(PARTITIONS)])
            if all(position.offset >= ends[position.partition] for position in positions):
                break
            values.extend(m.value() for m in consumer.consume(500, timeout=0.3) if m.error() is None)
        return values, ends
    finally:
        consumer.close()


def open_transactions(client: TxnClient, query: str) -> list[str]:
    return [
        t.transactional_id
        for t in client.list_transactions(["Ongoing"])
        if t.transactional_id.startswith(query_prefix(PREFIX, query))
    ]


def test_a_driver_dead_between_the_end_txns_of_a_decided_batch_is_completed_and_the_rerun_aborted(
    shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    bootstrap = shared_broker.bootstrap
    topic = kafka.new_topic(bootstrap, partitions=PARTITIONS, hint="out")
    query, log = uuid.uuid4().hex, SinkLog(str(tmp_path))
    rows = {p: [f"p{p}-{i}".encode() for i in range(30)] for p in range(2)}
    with TxnClient(bootstrap, ClientSecurity()) as client:
        messages = [write_task(client, query, 0, p, topic, rows[p]) for p in range(2)]
        # The driver decides, commits the first transaction, and dies.
        log.write(Decision(0, tuple(messages)))
        assert client.end_txn(messages[0].transactional_id, messages[0].producer, commit=True) is None
        assert sorted(read(bootstrap, topic, "read_committed")[0]) == sorted(rows[0])

    with TxnClient(bootstrap, ClientSecurity()) as client:
        # The restart plans batch 0 again: the decision is completed before any task runs.
        complete_decisions(client, log)
        assert all(d.completed for d in log.decisions())
        # The rerun's tasks write the batch again, under the same ids; its commit finds the batch decided.
        rerun = [write_task(client, query, 0, p, topic, rows[p]) for p in range(2)]
        commit_batch(client, log, 0, rerun, query_prefix(PREFIX, query), TIMEOUT_MS)
        assert open_transactions(client, query) == []

    committed, lso = read(bootstrap, topic, "read_committed")
    assert sorted(committed) == sorted(rows[0] + rows[1])
    everything, high_watermark = read(bootstrap, topic, "read_uncommitted")
    assert lso == high_watermark, "nothing is left open"
    assert len(everything) == 2 * len(committed)  # the rerun's copies, aborted


def test_a_driver_dead_before_deciding_leaves_nothing_visible_and_nothing_open_after_a_smaller_rerun(
    shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    bootstrap = shared_broker.bootstrap
    topic = kafka.new_topic(bootstrap, partitions=PARTITIONS, hint="out")
    query, log = uuid.uuid4().hex, SinkLog(str(tmp_path))
    rows = [f"r{i}".encode() for i in range(40)]
    with TxnClient(bootstrap, ClientSecurity()) as client:
        # Three tasks write, the driver dies before its decision.
        for p in range(3):
            write_task(client, query, 0, p, topic, rows[p::3])
        assert read(bootstrap, topic, "read_committed")[0] == []
        assert len(open_transactions(client, query)) == 3

    with TxnClient(bootstrap, ClientSecurity()) as client:
        complete_decisions(client, log)  # nothing was decided
        # The rerun cuts the batch into one Spark partition: ids 1 and 2 are not reused by any task.
        rerun = [write_task(client, query, 0, 0, topic, rows)]
        commit_batch(client, log, 0, rerun, query_prefix(PREFIX, query), TIMEOUT_MS)
        assert open_transactions(client, query) == []

    committed, lso = read(bootstrap, topic, "read_committed")
    assert sorted(committed) == sorted(rows)
    assert lso == read(bootstrap, topic, "read_uncommitted")[1]
