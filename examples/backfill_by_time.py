"""Rebuild the days of a Parquet table from the records of a time range (a batch job).

python examples/backfill_by_time.py BOOTSTRAP TOPIC OUTPUT_DIR FROM TO    (ISO-8601 times, UTC)
"""

import os
import sys
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tierlog.spark.shipping import ship_tierlog
from tierlog.spark.source import TierlogDataSource


def millis(text: str) -> str:
    return str(int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000))


bootstrap, topic, output, start, end = sys.argv[1:6]
# Spark's Python workers must run this interpreter, the one that has tierlog (unless the venv is active).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Run with python, the job is local (local[*]) and listens on the loopback interface only (Spark's default is
# every interface); run with spark-submit --master, it is the cluster's, and SPARK_LOCAL_IP is as the shell has it.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
spark = (
    SparkSession.builder.config("spark.ui.enabled", "false")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.sql.sources.partitionOverwriteMode", "dynamic")  # replace only the days written
    .getOrCreate()
)
ship_tierlog(spark.sparkContext)  # on a cluster: the executors import this tierlog (before registering)
spark.dataSource.register(TierlogDataSource)

records = (
    spark.read.format("tierlog")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .option("startingTimestamp", millis(start))  # the first offset at or after it, per partition
    .option("endingTimestamp", millis(end))
    .option("startingOffsetsByTimestampStrategy", "latest")
    .load()
)
events = records.select(
    F.from_json(F.col("value").cast("string"), "event_id BIGINT, user STRING, type STRING").alias("e"), "timestamp"
).select("e.*", "timestamp", F.to_date("timestamp").alias("date"))
events.write.mode("overwrite").partitionBy("date").parquet(output)
print(f"{events.count()} events from {start} to {end} written to {output}")
