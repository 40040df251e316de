"""df.write.format("tierlog") and writeStream.format("tierlog"): rows become records, as Spark's Kafka sink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

from tierlog.testing.local_cluster import BrokerProcess

QUERY_TIMEOUT_S = 120
HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def test_a_batch_write_produces_every_row_with_its_key_value_headers_and_partition(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=3)
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", HEADERS),
        ]
    )
    rows = [
        (None if i % 5 == 0 else f"k{i}", f"v{i}".encode(), i % 3, [("n", str(i).encode())] if i % 2 else None)
        for i in range(90)
    ]
    (
        spark.createDataFrame(rows, schema)
        .write.format("tierlog")
        .option("kafka.bootstrap.servers", shared_broker.bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )

    stored = kafka.consume_all(shared_broker.bootstrap, topic, partitions=(0, 1, 2))
    assert len(stored) == 90
    by_value = {r.value: r for r in stored}
    for key, value, partition, headers in rows:
        record = by_value[value]
        assert record.key == (None if key is None else key.encode())
        assert record.partition == partition
        assert list(record.headers) == (headers or [])
    # What the sink wrote reads back through the source unchanged.
    read = (
        spark.read.format("tierlog")
        .option("kafka.bootstrap.servers", shared_broker.bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "value", "partition")
        .collect()
    )
    assert sorted((r.key or "", bytes(r.value), r.partition) for r in read) == sorted(
        (k or "", v, p) for k, v, p, _ in rows
    )


def test_the_topic_column_names_each_rows_topic_and_the_topic_option_overrides_it(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    first, second, forced = kafka.topic_name("a"), kafka.topic_name("b"), kafka.topic_name("c")
    for topic in (first, second, forced):
        kafka.create_topic(shared_broker.bootstrap, topic)
    frame = spark.createDataFrame([(first, "one"), (second, "two"), (first, "three")], "topic string, value string")
    frame.write.format("tierlog").mode("append").option("kafka.bootstrap.servers", shared_broker.bootstrap).save()
    assert sorted(r.value for r in kafka.consume_all(shared_broker.bootstrap, first)) == [b"one", b"three"]
    assert [r.value for r in kafka.consume_all(shared_broker.bootstrap, second)] == [b"two"]

    frame.write.format("tierlog").mode("append").option("kafka.bootstrap.servers", shared_broker.bootstrap).option(
        "topic", forced
    ).save()
    assert sorted(r.value for r in kafka.consume_all(shared_broker.bootstrap, forced)) == [b"one", b"three", b"two"]


@pytest.mark.parametrize(
    ("ddl", "options", "message"),
    [
        ("key string", {"topic": "t"}, "required attribute 'value' not found"),
        ("value string", {}, "topic option required when no 'topic' attribute is present"),
        ("value int", {"topic": "t"}, "value attribute type must be a string or binary"),
        ("value string, key double", {"topic": "t"}, "key attribute type must be a string or binary"),
        ("value string, partition string", {"topic": "t"}, "partition attribute type must be an int"),
        ("value string, topic int", {}, "topic attribute type must be a string"),
    ],
)
def test_a_write_the_sink_cannot_do_fails_with_spark_kafka_sinks_message(
    spark: SparkSession, ddl: str, options: dict[str, str], message: str
) -> None:
    frame = spark.createDataFrame([], ddl)
    writer = frame.write.format("tierlog").mode("append").option("kafka.bootstrap.servers", "127.0.0.1:9")
    writer = writer.options(**options)
    with pytest.raises(Exception, match=message):
        writer.save()


def test_overwrite_is_refused_because_a_log_is_only_appended_to(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("v",)], "value string")
    writer = frame.write.format("tierlog").option("kafka.bootstrap.servers", "127.0.0.1:9").option("topic", "t")
    with pytest.raises(Exception, match="save mode overwrite is not allowed"):
        writer.mode("overwrite").save()


def test_a_row_the_broker_does_not_acknowledge_fails_the_job(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap)
    # Partition 7 of a one-partition topic: the record can never be delivered, so the task must fail rather
    # than report success.
    frame = spark.createDataFrame([("v", 0), ("w", 7)], "value string, partition int")
    writer = (
        frame.write.format("tierlog")
        .mode("append")
        .option("kafka.bootstrap.servers", shared_broker.bootstrap)
        .option("topic", topic)
        .option("kafka.message.timeout.ms", "3000")
    )
    with pytest.raises(Exception, match="writing to tierlog failed"):
        writer.save()


def test_a_stream_copies_one_topic_into_another_with_every_record(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    source, target = kafka.topic_name("in"), kafka.topic_name("out")
    kafka.create_topic(shared_broker.bootstrap, source, partitions=2)
    kafka.create_topic(shared_broker.bootstrap, target)
    kafka.produce(
        shared_broker.bootstrap, source, [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(60)]
    )
    query = (
        spark.readStream.format("tierlog")
        .option("kafka.bootstrap.servers", shared_broker.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "25")
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
        .writeStream.format("tierlog")
        .option("kafka.bootstrap.servers", shared_broker.bootstrap)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish"
    assert query.exception() is None, query.exception()
    copied = kafka.consume_all(shared_broker.bootstrap, target)
    assert sorted((r.key, r.value) for r in copied) == sorted((f"k{i}".encode(), f"V{i}".encode()) for i in range(60))
