"""kafka.isolation.level=read_committed on real brokers: transactions committed and aborted by a transactional
producer, most of them already in the remote tier, read by the Spark source through the brokers and straight from
the remote tier, give exactly the committed records a read_committed Kafka consumer reads; an open transaction
ends a read_committed read at the last stable offset."""

from __future__ import annotations

import itertools
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import ClusterFactory
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from pyspark.sql import SparkSession
from tiered_helpers import CLIENT_TIMEOUT_S, create_topic, tiered_overrides, tiered_topic_configs, wait_tiered

from tierlog.spark.options import parse_batch_options
from tierlog.spark.source import RangePartition, RemoteSlicePartition, TierlogBatchReader
from tierlog.testing.local_cluster import BrokerProcess, LocalCluster, wait_until

TOPIC = "orders"
TRANSACTIONS = 36
RECORDS_PER_TRANSACTION = 12
LAST_ABORTED_RECORDS = 60  # about 25 KiB: more than a segment


def aborted(transaction: int) -> bool:
    return transaction % 3 == 1


def produce_transactions(bootstrap: str) -> list[bytes]:
    """TRANSACTIONS transactions of one producer, every third aborted, with a plain record between each two;
    the values a read_committed reader must see, in offset order."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "orders-writer", "linger.ms": 5, "batch.size": 2048}
    )
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.init_transactions(CLIENT_TIMEOUT_S)
    committed = []
    for t in range(TRANSACTIONS):
        producer.begin_transaction()
        values = [f"t{t:03d}-r{r:02d}-".encode() + b"x" * 400 for r in range(RECORDS_PER_TRANSACTION)]
        for value in values:
            producer.produce(TOPIC, value=value, partition=0)
        producer.flush(CLIENT_TIMEOUT_S)
        if aborted(t):
            producer.abort_transaction(CLIENT_TIMEOUT_S)
        else:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
            committed.extend(values)
        plain.produce(TOPIC, value=f"plain-{t:03d}".encode(), partition=0)
        assert plain.flush(CLIENT_TIMEOUT_S) == 0
        committed.append(f"plain-{t:03d}".encode())
    # Last, an aborted transaction larger than a segment: its records go to the remote tier, its marker stays in
    # the active, local, segment, so a direct read completes its search from the local log.
    producer.begin_transaction()
    for r in range(LAST_ABORTED_RECORDS):
        producer.produce(TOPIC, value=f"last-r{r:02d}-".encode() + b"x" * 400, partition=0)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.abort_transaction(CLIENT_TIMEOUT_S)
    plain.produce(TOPIC, value=b"after", partition=0)
    assert plain.flush(CLIENT_TIMEOUT_S) == 0
    committed.append(b"after")
    return committed


def consume_committed(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    try:

        def more() -> bool:
            for m in consumer.consume(500, timeout=0.5):
                assert m.error() is None, m.error()
                values.append(m.value())
            return len(values) >= count

        wait_until(more, CLIENT_TIMEOUT_S * 2, lambda: f"{count} committed records (have {len(values)})")
    finally:
        consumer.close()
    return values


def remote_fetches_served(cluster: LocalCluster) -> float:
    """The broker's count of reads it served from the remote tier (Kafka's RemoteFetchRequestsPerSec)."""
    node_id = cluster.node_ids[0]
    with urllib.request.urlopen(f"http://{cluster.http_address(node_id)}/metrics", timeout=5) as response:
        text = response.read().decode()
    lines = text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("tierlog_remote_fetch_requests_total"))


TieredTransactions = tuple[LocalCluster, dict[str, str], list[bytes]]
# One broker: __transaction_state and __consumer_offsets with one replica and a few partitions.
TRANSACTION_OVERRIDES = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture
def tiered_transactions(tmp_path: Path, cluster_factory: ClusterFactory) -> TieredTransactions:
    remote = tmp_path / "remote"
    remote.mkdir()
    rsm_config = {"url": f"file://{remote}"}
    overrides = tiered_overrides({"rsm.config.url": rsm_config["url"]}, brokers=1) | TRANSACTION_OVERRIDES
    cluster = cluster_factory(overrides, brokers=1)
    create_topic(cluster.bootstrap, TOPIC, tiered_topic_configs(**{"retention.ms": "-1"}), replication_factor=1)
    committed = produce_transactions(cluster.bootstrap)
    wait_tiered(cluster, 1, TOPIC, TRANSACTIONS * RECORDS_PER_TRANSACTION // 2, settled=True)
    return cluster, rsm_config, committed


@pytest.mark.parametrize("remote_read", ["direct", "broker"])
def test_read_committed_reads_exactly_the_committed_records_through_brokers_and_from_the_remote_tier(
    spark: SparkSession, tiered_transactions: TieredTransactions, remote_read: str
) -> None:
    cluster, rsm_config, committed = tiered_transactions
    options = {
        "kafka.bootstrap.servers": cluster.bootstrap,
        "subscribe": TOPIC,
        "tierlog.remote.read": remote_read,
        **{f"tierlog.remote.rsm.config.{key}": value for key, value in rsm_config.items()},
    }
    read_committed = {**options, "kafka.isolation.level": "read_committed"}
    planned = TierlogBatchReader(parse_batch_options(read_committed)).partitions()
    remote = [p for p in planned if isinstance(p, RemoteSlicePartition)]
    if remote_read == "direct":
        # The remote slices carry the aborted transactions of the remote transaction indexes, and the last
        # one's, whose marker is still in the local log, from a read_committed Fetch at the remote tier's end.
        assert len(remote) >= 2
        aborted = [txn for p in remote for txn in p.slice.aborted_transactions or ()]
        assert len(aborted) >= 3
        assert any(txn.last_stable_offset == -1 for txn in aborted), "the local log's part of the search"
    else:
        assert not remote and all(isinstance(p, RangePartition) and p.read_committed for p in planned)

    served_before = remote_fetches_served(cluster)
    rows = spark.read.format("tierlog").options(**read_committed).load().select("offset", "value").collect()
    served = remote_fetches_served(cluster) - served_before
    if remote_read == "direct":
        assert served == 0, "the direct path must not read the remote tier through the broker"
    values = [bytes(r.value) for r in sorted(rows, key=lambda r: r.offset)]
    assert values == committed
    assert values == consume_committed(cluster.bootstrap, len(committed))

    # read_uncommitted (Spark's Kafka source's default) sees the aborted transactions' records too.
    everything = spark.read.format("tierlog").options(**options).load().count()
    assert everything == TRANSACTIONS * (RECORDS_PER_TRANSACTION + 1) + LAST_ABORTED_RECORDS + 1


def test_read_committed_stops_at_the_last_stable_offset_of_an_open_transaction(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    """A transaction still open: read_committed plans its end at the LSO (ListOffsets with isolation level 1) and
    reads the records before it without waiting; read_uncommitted reads to the high watermark, open records too."""
    bootstrap = shared_broker.bootstrap
    topic = kafka.new_topic(bootstrap, partitions=1, hint="open")
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(5):
        plain.produce(topic, value=f"before-{i}".encode(), partition=0)
    assert plain.flush(CLIENT_TIMEOUT_S) == 0
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"open-{topic}"})
    producer.init_transactions(CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"open-{i}".encode(), partition=0)
    producer.flush(CLIENT_TIMEOUT_S)
    for i in range(2):
        plain.produce(topic, value=f"after-{i}".encode(), partition=0)
    assert plain.flush(CLIENT_TIMEOUT_S) == 0
    try:
        options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic}
        committed_plan = TierlogBatchReader(parse_batch_options({**options, "kafka.isolation.level": "read_committed"}))
        assert [(p.range.start, p.range.end) for p in committed_plan.partitions()] == [(0, 5)]
        read_committed = spark.read.format("tierlog").options(**options, **{"kafka.isolation.level": "read_committed"})
        assert sorted(bytes(r.value) for r in read_committed.load().collect()) == [
            f"before-{i}".encode() for i in range(5)
        ]
        everything = sorted(bytes(r.value) for r in spark.read.format("tierlog").options(**options).load().collect())
        assert len(everything) == 10 and b"open-0" in everything
    finally:
        producer.abort_transaction(CLIENT_TIMEOUT_S)


def test_read_committed_in_grouped_remote_tasks_drops_exactly_the_aborted_records_across_segments(
    spark: SparkSession, tiered_transactions: TieredTransactions
) -> None:
    """minPartitions groups the remote segments into one task (and then cuts that task at offsets inside
    segments): each slice still applies only the aborted transactions that overlap its chunks, so the committed
    records of transactions that span segment boundaries come back once and the aborted ones never."""
    cluster, rsm_config, committed = tiered_transactions
    options = {
        "kafka.bootstrap.servers": cluster.bootstrap,
        "subscribe": TOPIC,
        "tierlog.remote.read": "direct",
        "kafka.isolation.level": "read_committed",
        **{f"tierlog.remote.rsm.config.{key}": value for key, value in rsm_config.items()},
    }
    per_segment = TierlogBatchReader(parse_batch_options(options)).partitions()
    segments = [p for p in per_segment if isinstance(p, RemoteSlicePartition)]
    assert len(segments) >= 2
    for min_partitions in ("2", "5"):
        reader = TierlogBatchReader(parse_batch_options(options | {"minPartitions": min_partitions}))
        planned = reader.partitions()
        remote = [p for p in planned if isinstance(p, RemoteSlicePartition)]
        # minPartitions 2: the remote part and the tail, one task each; 5: the remote part cut into several.
        assert len(remote) == 1 if min_partitions == "2" else 1 < len(remote) < len(segments) + 3
        slices = [s for p in remote for s in p.slices]
        assert slices[0].start_offset == segments[0].slice.start_offset
        assert all(before.end_offset == after.start_offset for before, after in itertools.pairwise(slices))
        assert slices[-1].end_offset == segments[-1].slice.end_offset
        in_process = [
            (offset, bytes(value))
            for p in planned
            for batch in reader.read(p)
            for offset, value in zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
        ]
        assert [value for _, value in sorted(in_process)] == committed
        rows = spark.read.format("tierlog").options(**options, minPartitions=min_partitions).load().collect()
        assert [bytes(r.value) for r in sorted(rows, key=lambda r: r.offset)] == committed
