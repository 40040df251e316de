"""spark.read.format("tierlog") against a real broker: the Kafka source's options, schema and offsets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tierlog.spark.offsets import OffsetRange, split_ranges
from tierlog.testing.local_cluster import BrokerProcess

BASE_TS = 1_700_000_000_000


def _fill(kafka: Any, bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    kafka.create_topic(bootstrap, topic, partitions=partitions)
    records = [
        {
            "key": f"k{p}-{i}".encode(),
            "value": f"v{p}-{i}".encode(),
            "headers": [("n", str(i).encode())],
            "timestamp": BASE_TS + i,
            "partition": p,
        }
        for p in range(partitions)
        for i in range(per_partition)
    ]
    # Several producer batches per partition, so reads cross batch boundaries.
    kafka.produce(bootstrap, topic, records, batch_num_messages=7)


def _read(spark: SparkSession, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format("tierlog").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_returns_every_record_exactly_once_with_its_key_value_offset_timestamp_and_headers(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    _fill(kafka, shared_broker.bootstrap, topic, partitions=3, per_partition=50)
    df = _read(spark, shared_broker.bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = df.collect()
    assert len(rows) == 150
    seen = {(r.partition, r.offset) for r in rows}
    assert seen == {(p, i) for p in range(3) for i in range(50)}
    for r in rows:
        assert r.topic == topic
        assert bytes(r.key) == f"k{r.partition}-{r.offset}".encode()
        assert bytes(r.value) == f"v{r.partition}-{r.offset}".encode()
        assert int(r.timestamp.timestamp() * 1000) == BASE_TS + r.offset
        assert r.timestampType == 0
        assert [(h.key, bytes(h.value)) for h in r.headers] == [("n", str(r.offset).encode())]


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        (
            {"startingOffsets": {"0": 5, "1": -2}, "endingOffsets": {"0": 8, "1": -1}},
            [(0, 5), (0, 6), (0, 7)] + [(1, i) for i in range(20)],
        ),
        (
            {"startingTimestamp": BASE_TS + 5, "endingTimestamp": BASE_TS + 9},
            [(p, i) for p in range(2) for i in range(5, 9)],
        ),
        (
            {
                "startingOffsetsByTimestamp": {"0": BASE_TS + 18, "1": BASE_TS},
                "endingOffsetsByTimestamp": {"0": BASE_TS + 10_000, "1": BASE_TS + 2},
            },
            [(0, 18), (0, 19), (1, 0), (1, 1)],
        ),
    ],
    ids=["offsets-json", "timestamps", "timestamps-by-partition"],
)
def test_starting_and_ending_offsets_and_timestamps_bound_each_partition(
    spark: SparkSession,
    shared_broker: BrokerProcess,
    kafka: Any,
    bounds: dict[str, int | dict[str, int]],
    expected: list[tuple[int, int]],
) -> None:
    topic = kafka.topic_name()
    _fill(kafka, shared_broker.bootstrap, topic, partitions=2, per_partition=20)
    # Per-partition bounds are JSON keyed by topic, as the Kafka source takes them.
    options = {name: json.dumps({topic: v}) if isinstance(v, dict) else str(v) for name, v in bounds.items()}
    df = _read(spark, shared_broker.bootstrap, subscribe=topic, **options)
    assert sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect()) == expected


def test_earliest_to_latest_reads_the_whole_log_and_assign_reads_only_its_partitions(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    _fill(kafka, shared_broker.bootstrap, topic, partitions=3, per_partition=10)
    whole = _read(spark, shared_broker.bootstrap, subscribe=topic, startingOffsets="earliest", endingOffsets="latest")
    assert whole.count() == 30
    assigned = _read(spark, shared_broker.bootstrap, assign=json.dumps({topic: [2]}))
    assert {r.partition for r in assigned.select("partition").collect()} == {2}
    assert assigned.count() == 10


def test_subscribe_pattern_reads_every_matching_topic(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    prefix = kafka.topic_name("pattern")
    for suffix in ("a", "b"):
        _fill(kafka, shared_broker.bootstrap, f"{prefix}.{suffix}", partitions=1, per_partition=4)
    _fill(kafka, shared_broker.bootstrap, f"other-{prefix}", partitions=1, per_partition=4)
    df = _read(spark, shared_broker.bootstrap, subscribePattern=f"{prefix}\\..*")
    assert sorted({r.topic for r in df.select("topic").collect()}) == [f"{prefix}.a", f"{prefix}.b"]
    assert df.count() == 8


def test_min_partitions_splits_ranges_into_that_many_spark_partitions(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    _fill(kafka, shared_broker.bootstrap, topic, partitions=1, per_partition=100)
    df = _read(spark, shared_broker.bootstrap, subscribe=topic, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == list(range(100))


def test_min_partitions_split_follows_the_kafka_range_calculator() -> None:
    ranges = [OffsetRange("t", 0, 0, 100, "h:1"), OffsetRange("t", 1, 0, 50, "h:1"), OffsetRange("t", 2, 5, 5, "h:1")]
    out = split_ranges(ranges, 6)
    # 100 of 150 offsets -> round(4.0) = 4 parts, 50 -> 2 parts; the empty range is dropped.
    assert [(r.partition, r.start, r.end) for r in out] == [
        (0, 0, 25),
        (0, 25, 50),
        (0, 50, 75),
        (0, 75, 100),
        (1, 0, 25),
        (1, 25, 50),
    ]
    assert split_ranges(ranges, 2) == ranges[:2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "x:1"}, "one of the options 'assign', 'subscribe' or 'subscribePattern'"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "assign": '{"t":[0]}'}, "got assign, subscribe"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingOffsets": "latest"}, "startingOffsets"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingOffsets": "{bad"}, "startingOffsets"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "minPartitions": "0"}, "minPartitions"),
        ({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "includeHeaders": "yes"}, "includeHeaders"),
    ],
)
def test_bad_options_fail_the_query_with_a_message_naming_the_option(
    spark: SparkSession, options: dict[str, str], message: str
) -> None:
    reader = spark.read.format("tierlog")
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace("[", r"\[")):
        reader.load().collect()


def test_a_starting_offset_before_the_log_start_fails_unless_fail_on_data_loss_is_false(
    spark: SparkSession, broker_factory: Any, kafka: Any
) -> None:
    broker = broker_factory()
    topic = kafka.topic_name()
    _fill(kafka, broker.bootstrap, topic, partitions=1, per_partition=30)
    kafka.delete_records_before(broker.bootstrap, topic, 10)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        _read(spark, broker.bootstrap, subscribe=topic, startingOffsets=start).collect()
    rows = _read(spark, broker.bootstrap, subscribe=topic, startingOffsets=start, failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(10, 30))


def test_a_starting_timestamp_after_every_record_fails_unless_the_strategy_is_latest(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.topic_name()
    _fill(kafka, shared_broker.bootstrap, topic, partitions=1, per_partition=5)
    late = str(BASE_TS + 10_000)
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        _read(spark, shared_broker.bootstrap, subscribe=topic, startingTimestamp=late).collect()
    rows = _read(
        spark,
        shared_broker.bootstrap,
        subscribe=topic,
        startingTimestamp=late,
        startingOffsetsByTimestampStrategy="latest",
    ).collect()
    assert rows == []
