"""The ETL jobs of `tierlog pipeline`: a topic of JSON events into a Parquet table partitioned by date and hour.

`stream_to_parquet` is the streaming job: it reads the topic from the earliest offset (remote tier included,
straight from object storage when the job has the remote tier's settings), parses each value with a schema and
appends to the table; Spark's file sink and the offsets in the checkpoint make it exactly-once across restarts.
`backfill` is the batch job over a time range, rewriting only the date/hour partitions it touches.

Values that are not JSON of the schema are kept, not dropped: their fields are null and `_corrupt_record` holds
the raw value, as Spark's PERMISSIVE JSON reader does, so bad input is visible in the table.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StringType, StructField, StructType

from tierlog.spark.options import RSM_OPTION_PREFIX
from tierlog.spark.source import TierlogDataSource

# The events `tierlog demo` produces; a job over other events passes its own DDL.
DEFAULT_EVENT_SCHEMA = "event_id BIGINT, user STRING, type STRING, amount_cents BIGINT"
CORRUPT_RECORD_COLUMN = "_corrupt_record"
PARTITION_COLUMNS = ("date", "hour")
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


@dataclass(frozen=True)
class PipelineConfig:
    bootstrap_servers: str
    topic: str
    output: str
    event_schema: str = DEFAULT_EVENT_SCHEMA
    # The brokers' rsm.config.* settings (names without the prefix): with them the remote tier is read directly.
    remote_storage: Mapping[str, str] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None

    def source_options(self) -> dict[str, str]:
        options = {"kafka.bootstrap.servers": self.bootstrap_servers, "subscribe": self.topic}
        options |= {RSM_OPTION_PREFIX + key: value for key, value in self.remote_storage.items()}
        return options


def spark_session(app_name: str, master: str = "local[*]") -> SparkSession:
    """A local SparkSession with the tierlog source registered, its Python workers on this interpreter (the
    one that has tierlog) and every timestamp in UTC, so the table's date/hour partitions do not depend on
    the machine's time zone."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG4J_CONFIG}")
        .getOrCreate()
    )
    session.dataSource.register(TierlogDataSource)
    return session


def parse_events(records: DataFrame, event_schema: str) -> DataFrame:
    """Kafka-source rows to table rows: the event's fields, where it came from, and its date/hour partition."""
    schema = StructType.fromDDL(event_schema).add(StructField(CORRUPT_RECORD_COLUMN, StringType()))
    event = F.from_json(
        F.col("value").cast("string"),
        schema,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_RECORD_COLUMN},
    )
    fields = [F.col("event")[f.name].alias(f.name) for f in schema.fields]
    return records.select(
        event.alias("event"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("event_time"),
    ).select(
        *fields,
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "event_time",
        F.date_format("event_time", "yyyy-MM-dd").alias("date"),
        F.hour("event_time").alias("hour"),
    )


def stream_to_parquet(
    spark: SparkSession,
    config: PipelineConfig,
    checkpoint: str,
    trigger: str | None = None,
) -> StreamingQuery:
    """Start the streaming job. `trigger` None reads what the topic holds now and stops (Trigger.AvailableNow);
    an interval like "10 seconds" keeps running."""
    reader = spark.readStream.format("tierlog").options(**config.source_options()).option("startingOffsets", "earliest")
    if config.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    writer = (
        parse_events(reader.load(), config.event_schema)
        .writeStream.format("parquet")
        .option("path", config.output)
        .option("checkpointLocation", checkpoint)
        .partitionBy(*PARTITION_COLUMNS)
        .queryName(f"tierlog-{config.topic}-to-parquet")
    )
    writer = writer.trigger(availableNow=True) if trigger is None else writer.trigger(processingTime=trigger)
    return writer.start()


def backfill(spark: SparkSession, config: PipelineConfig, from_ms: int, to_ms: int) -> int:
    """Rewrite the table's partitions with the records whose timestamps are in [from_ms, to_ms) (Kafka's
    startingTimestamp/endingTimestamp: the first offsets at or after each); returns the rows written."""
    if to_ms <= from_ms:
        raise ValueError(f"the end of the range ({to_ms}) must be after its start ({from_ms})")
    records = (
        spark.read.format("tierlog")
        .options(**config.source_options())
        .option("startingTimestamp", str(from_ms))
        .option("endingTimestamp", str(to_ms))
        .option("startingOffsetsByTimestampStrategy", "latest")
        .load()
    )
    rows = parse_events(records, config.event_schema).cache()
    try:
        count = rows.count()
        rows.write.mode("overwrite").partitionBy(*PARTITION_COLUMNS).parquet(config.output)
    finally:
        rows.unpersist()
    return count


def watch(query: StreamingQuery, on_batch: Callable[[dict[str, Any]], None], poll_s: float = 0.5) -> None:
    """Report each finished micro-batch (its StreamingQueryProgress as a dict) until the query stops; raise the
    query's exception if it failed."""
    seen = -1
    while True:
        active = query.isActive
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                on_batch(progress)
        if not active:
            break
        query.awaitTermination(poll_s)
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the pipeline's query failed: {error.desc if hasattr(error, 'desc') else error}")
