"""The ETL jobs of `tierlog pipeline`: a topic of JSON events into a Parquet table partitioned by date and hour.

`stream_to_parquet` is the streaming job: it reads the topic from the earliest offset (remote tier included,
straight from object storage when the job has the remote tier's settings), parses each value with a schema and
appends to the table; Spark's file sink and the offsets in the checkpoint make it exactly-once across restarts.
`backfill` is the batch job over a time range, rewriting only the date/hour partitions it touches.

Values that are not JSON of the schema are kept, not dropped: their fields are null and `_corrupt_record` holds
the raw value, as Spark's PERMISSIVE JSON reader does, so bad input is visible in the table.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkException
from pyspark.java_gateway import launch_gateway
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StringType, StructField, StructType

from tierlog.spark.offsets import DataLossError
from tierlog.spark.options import KAFKA_OPTION_PREFIX, RSM_OPTION_PREFIX
from tierlog.spark.remote_tier import RemoteTierError
from tierlog.spark.shipping import runs_in_this_process, ship_tierlog
from tierlog.spark.source import TierlogDataSource

# The events `tierlog demo` produces; a job over other events passes its own DDL.
DEFAULT_EVENT_SCHEMA = "event_id BIGINT, user STRING, type STRING, amount_cents BIGINT"
CORRUPT_RECORD_COLUMN = "_corrupt_record"
PARTITION_COLUMNS = ("date", "hour")
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# Spark binds its driver (RPC, block manager, UI) here unless SPARK_LOCAL_IP says otherwise: a local job has no
# business listening on every interface.
DEFAULT_LOCAL_IP = "127.0.0.1"
# How long stopping a streaming query may wait for its running micro-batch (Spark's default waits forever).
QUERY_STOP_TIMEOUT = "30s"
# Offsets per partition, as in the stream's checkpoint: {("events", 0): 23, ("events", 1): 7}.
Offsets = dict[tuple[str, int], int]
# The errors tierlog's source raises for a person to read: their message alone says what is wrong.
_SELF_EXPLAINING_ERRORS = frozenset({RemoteTierError.__name__, DataLossError.__name__})
# The line a Python traceback ends with: `package.module.SomeError: message`.
_PYTHON_ERROR_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): (.+)")
_SPARK_MESSAGE_CHARS = 400


class PipelineError(RuntimeError):
    """A pipeline's Spark job failed; the message is one line naming the cause."""


@dataclass(frozen=True)
class PipelineConfig:
    bootstrap_servers: str
    topic: str
    output: str
    event_schema: str = DEFAULT_EVENT_SCHEMA
    # The brokers' rsm.config.* settings (names without the prefix): with them the remote tier is read directly.
    remote_storage: Mapping[str, str] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    # The brokers' client settings (librdkafka's or the Java client's names: security.protocol, sasl.*, ssl.*),
    # handed to the source as kafka.* options.
    client_settings: Mapping[str, str] = field(default_factory=dict)

    def source_options(self) -> dict[str, str]:
        options = {f"{KAFKA_OPTION_PREFIX}{key}": value for key, value in self.client_settings.items()}
        options |= {"kafka.bootstrap.servers": self.bootstrap_servers, "subscribe": self.topic}
        options |= {RSM_OPTION_PREFIX + key: value for key, value in self.remote_storage.items()}
        return options


def spark_session(
    app_name: str,
    master: str = "local[*]",
    jvm_output: IO[Any] | None = None,
    ui: bool = False,
    spark_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession with the tierlog source registered, its Python workers on this interpreter (the one that
    has tierlog) unless PYSPARK_PYTHON names another, and every timestamp in UTC, so the table's date/hour
    partitions do not depend on the machine's time zone.

    `master` is Spark's master URL: `local[*]`, or a cluster's (`spark://HOST:7077`, `yarn`, `k8s://...`), to
    which the driver's tierlog is shipped (tierlog.spark.shipping). A driver on the same host as its master
    (local, or a master on a loopback address) listens on SPARK_LOCAL_IP (default 127.0.0.1) only; one whose
    master is elsewhere listens where Spark's defaults say (SPARK_LOCAL_IP, else the host's address), since the
    executors connect back to it. The web UI is off unless `ui`. `spark_conf`: Spark properties, as
    spark-submit's --conf, applied last. `jvm_output`: a file for everything the JVM and the Python workers it
    starts print (Spark's log, their tracebacks); without it they print to this process's stdout and stderr."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = SparkConf().setMaster(master).setAppName(app_name)
    if runs_in_this_process(master) or master_on_loopback(master):
        local_ip = os.environ.setdefault("SPARK_LOCAL_IP", DEFAULT_LOCAL_IP)
        conf.setAll([("spark.driver.host", local_ip), ("spark.driver.bindAddress", local_ip)])
    conf.setAll(
        [
            ("spark.ui.enabled", str(ui).lower()),
            ("spark.sql.session.timeZone", "UTC"),
            ("spark.sql.shuffle.partitions", "4"),
            ("spark.sql.sources.partitionOverwriteMode", "dynamic"),
            ("spark.sql.streaming.stopTimeout", QUERY_STOP_TIMEOUT),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG4J_CONFIG}"),
            *(spark_conf or {}).items(),
        ]
    )
    # PySpark's own launcher, told where the JVM's output goes (the JVM ignores SIGINT either way: Ctrl-C is
    # this process's to handle).
    gateway = None if jvm_output is None else launch_gateway(conf, {"stdout": jvm_output, "stderr": jvm_output})
    context = SparkContext(conf=conf, gateway=gateway)
    ship_tierlog(context)
    session = SparkSession.builder.getOrCreate()
    session.dataSource.register(TierlogDataSource)
    return session


def master_on_loopback(master: str) -> bool:
    """Whether a standalone master's URL (spark://HOST:PORT[,HOST:PORT...]) names this host's loopback only."""
    if not master.startswith("spark://"):
        return False
    hosts = [address.rsplit(":", 1)[0].strip("[]") for address in master.removeprefix("spark://").split(",")]
    return all(host == "localhost" or _is_loopback(host) for host in hosts)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    """Report each finished micro-batch (its StreamingQueryProgress as a dict) until the query stops; raise a
    PipelineError naming the cause if it failed."""
    seen = -1
    while True:
        active = query.isActive
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                on_batch(progress)
        if not active:
            break
        try:
            query.awaitTermination(poll_s)
        except PySparkException:
            continue  # the query failed: report the batches it finished, then its error
    error = query.exception()
    if error is not None:
        raise PipelineError(spark_failure(error))


def spark_failure(error: BaseException) -> str:
    """One line for a failed Spark job. An exception raised by Python code (tierlog's source, on the driver or
    an executor) reaches Spark's error with its whole traceback; its last line is the cause. Anything else is
    told by the first line of Spark's message."""
    try:
        text = str(error)
    except Exception:  # a captured Spark error reads part of its message through the JVM, which may be gone
        return f"Spark failed ({type(error).__name__}) and cannot say why"
    traceback_at = text.rfind("Traceback (most recent call last):")
    if traceback_at >= 0:
        for line in text[traceback_at:].splitlines()[1:]:
            if not line or line[0].isspace():
                continue  # the traceback's frames
            match = _PYTHON_ERROR_LINE.fullmatch(line.strip())
            if match is not None:
                name, message = match.groups()
                return message if name in _SELF_EXPLAINING_ERRORS else f"{name}: {message}"
            break
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first_line[:_SPARK_MESSAGE_CHARS]


def checkpoint_position(checkpoint: str) -> tuple[int, Offsets | None] | None:
    """Where a query restarted on `checkpoint` resumes: the last committed micro-batch and its end offsets,
    from Spark's offset log (`offsets/N`: a version line, the batch's metadata, then each source's offset). A
    batch logged but not committed is redone from there. None when no batch was committed (the query starts
    from its starting offsets); offsets None when the log is not in a form this reads."""
    commits = Path(checkpoint) / "commits"
    committed = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    if not committed:
        return None
    batch = max(committed)
    try:
        lines = (Path(checkpoint) / "offsets" / str(batch)).read_text().splitlines()
        return batch, offsets_from_json(json.loads(lines[2]))
    except (OSError, IndexError, ValueError, AttributeError):
        return batch, None


def offsets_from_json(offsets: Any) -> Offsets:
    """A stream offset as the source writes it (`{"topic": {"0": 23}}`, maybe still a JSON string) to Offsets;
    none (a first batch's start is JSON null in Spark's progress) is no offsets."""
    if isinstance(offsets, str):
        offsets = json.loads(offsets)
    if offsets is None:
        return {}
    return {(topic, int(p)): int(o) for topic, partitions in offsets.items() for p, o in partitions.items()}
