"""spark.readStream.format("tierlog"): micro-batches with offsets in the Spark checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewPartitions
from pyspark.sql import SparkSession

from tierlog.spark.options import parse_stream_options
from tierlog.spark.source import TierlogStreamReader, rate_limit
from tierlog.testing.local_cluster import BrokerProcess, wait_until

QUERY_TIMEOUT_S = 120


def _produce(kafka: Any, bootstrap: str, topic: str, start: int, count: int, partitions: int = 2) -> None:
    kafka.produce(
        bootstrap,
        topic,
        [{"value": f"v{i}".encode(), "partition": i % partitions} for i in range(start, start + count)],
    )


def _run_available_now(
    spark: SparkSession, bootstrap: str, topic: str, out: Path, checkpoint: Path, **opts: str
) -> Any:
    reader = (
        spark.readStream.format("tierlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in opts.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_available_now_writes_every_record_once_and_a_restart_resumes_from_the_checkpoint(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    _produce(kafka, shared_broker.bootstrap, topic, 0, 40)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_available_now(spark, shared_broker.bootstrap, topic, out, checkpoint)
    assert sorted(r.value for r in spark.read.parquet(str(out)).collect()) == sorted(f"v{i}" for i in range(40))
    _produce(kafka, shared_broker.bootstrap, topic, 40, 20)
    _run_available_now(spark, shared_broker.bootstrap, topic, out, checkpoint)
    values = [r.value for r in spark.read.parquet(str(out)).collect()]
    assert sorted(values) == sorted(f"v{i}" for i in range(60))


def test_max_offsets_per_trigger_bounds_every_micro_batch(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    _produce(kafka, shared_broker.bootstrap, topic, 0, 50)
    query = _run_available_now(
        spark, shared_broker.bootstrap, topic, tmp_path / "out", tmp_path / "cp", maxOffsetsPerTrigger="10"
    )
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(rows) == 50 and max(rows) <= 10 and len(rows) >= 5
    assert spark.read.parquet(str(tmp_path / "out")).count() == 50


def test_rate_limit_shares_the_limit_in_proportion_and_rounds_small_shares_up() -> None:
    begin = {("t", 0): 0, ("t", 1): 0, ("t", 2): 5}
    end = {("t", 0): 90, ("t", 1): 9, ("t", 2): 6}
    # 90/100 of 10 = 9, 9/100 of 10 = 0.9 -> 1, 1/100 of 10 = 0.1 -> 1
    assert rate_limit(10, begin, end) == {("t", 0): 9, ("t", 1): 1, ("t", 2): 6}
    assert rate_limit(1000, begin, end) == end


def test_deleted_offsets_fail_the_stream_with_fail_on_data_loss_and_are_skipped_without_it(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=1)
    _produce(kafka, shared_broker.bootstrap, topic, 0, 30, partitions=1)
    kafka.delete_records_before(shared_broker.bootstrap, topic, 10)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        _run_available_now(
            spark, shared_broker.bootstrap, topic, tmp_path / "a", tmp_path / "cpa", startingOffsets=start
        )
    _run_available_now(
        spark,
        shared_broker.bootstrap,
        topic,
        tmp_path / "b",
        tmp_path / "cpb",
        startingOffsets=start,
        failOnDataLoss="false",
    )
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "b")).collect())
    assert offsets == list(range(10, 30))


def test_min_offsets_per_trigger_holds_back_a_micro_batch_until_enough_offsets_or_the_max_trigger_delay(
    shared_broker: BrokerProcess, kafka: Any
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=2)
    _produce(kafka, shared_broker.bootstrap, topic, 0, 10)
    options = {"kafka.bootstrap.servers": shared_broker.bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
    patient = TierlogStreamReader(parse_stream_options(options | {"minOffsetsPerTrigger": "25"}))
    start = patient.initialOffset()
    assert patient.latestOffset(start, patient.getDefaultReadLimit()) == start, "10 offsets are fewer than 25"
    _produce(kafka, shared_broker.bootstrap, topic, 10, 15)
    assert patient.latestOffset(start, patient.getDefaultReadLimit()) == {topic: {"0": 13, "1": 12}}

    hurried = TierlogStreamReader(
        parse_stream_options(options | {"minOffsetsPerTrigger": "100", "maxTriggerDelay": "300ms"})
    )
    start = hurried.initialOffset()
    assert hurried.latestOffset(start, hurried.getDefaultReadLimit()) == start
    # Past maxTriggerDelay since the last micro-batch, what there is is read even though it is fewer; and the
    # delay starts again from that batch.
    ends: list[dict] = []
    wait_until(
        lambda: ends.append(hurried.latestOffset(start, hurried.getDefaultReadLimit())) or ends[-1] != start,
        10,
        "the delayed batch",
    )
    assert ends[-1] == {topic: {"0": 13, "1": 12}}
    assert hurried.latestOffset(start, hurried.getDefaultReadLimit()) == start


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("minOffsetsPerTrigger", "0", "minOffsetsPerTrigger' must be a positive integer"),
        ("maxTriggerDelay", "soon", "maxTriggerDelay' must be a duration"),
        ("tierlog.remote.read", "s3", "must be direct or broker"),
        ("tierlog.remote.read", "direct", "no remote tier settings were given"),
    ],
)
def test_bad_admission_and_remote_read_options_fail_with_one_line(name: str, value: str, message: str) -> None:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t", name: value}
    with pytest.raises(ValueError, match=message):
        parse_stream_options(options)


def test_remote_read_is_direct_when_the_job_gives_the_remote_tier_settings_and_broker_otherwise() -> None:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    assert parse_stream_options(options).remote_read == "broker"
    given = parse_stream_options(options | {"tierlog.remote.rsm.config.url": "file:///tmp/x"})
    assert given.remote_read == "direct" and given.rsm_config == (("url", "file:///tmp/x"),)
    forced = options | {"tierlog.remote.rsm.config.url": "file:///tmp/x", "tierlog.remote.read": "broker"}
    assert parse_stream_options(forced).remote_read == "broker"
    assert parse_stream_options(options | {"maxTriggerDelay": "2m"}).max_trigger_delay_ms == 120_000


def test_partitions_added_to_a_topic_are_picked_up_and_read_from_their_start(
    spark: SparkSession, shared_broker: BrokerProcess, kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(shared_broker.bootstrap, partitions=1)
    _produce(kafka, shared_broker.bootstrap, topic, 0, 10, partitions=1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_available_now(spark, shared_broker.bootstrap, topic, out, checkpoint)

    admin = kafka.admin(shared_broker.bootstrap)
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    wait_until(lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == 3, 30, "3 partitions")
    _produce(kafka, shared_broker.bootstrap, topic, 10, 30, partitions=3)
    _run_available_now(spark, shared_broker.bootstrap, topic, out, checkpoint)

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}" for i in range(40))
    assert {r.partition for r in rows} == {0, 1, 2}
