"""Stream a topic of JSON events into Parquet, partitioned by day; run it again to pick up where it stopped.

python examples/stream_events_to_parquet.py BOOTSTRAP TOPIC OUTPUT_DIR
"""

import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tierlog.spark.shipping import ship_tierlog
from tierlog.spark.source import TierlogDataSource

bootstrap, topic, output = sys.argv[1:4]
# Spark's Python workers must run this interpreter, the one that has tierlog (unless the venv is active).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Run with python, the job is local (local[*]) and listens on the loopback interface only (Spark's default is
# every interface); run with spark-submit --master, it is the cluster's, and SPARK_LOCAL_IP is as the shell has it.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
spark = (
    SparkSession.builder.config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate()
)
ship_tierlog(spark.sparkContext)  # on a cluster: the executors import this tierlog (before registering)
spark.dataSource.register(TierlogDataSource)

events = (
    spark.readStream.format("tierlog")  # the only change from a format("kafka") job
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", "50000")
    .load()
    .select(
        F.from_json(F.col("value").cast("string"), "event_id BIGINT, user STRING, type STRING").alias("e"),
        "partition",
        "offset",
        "timestamp",
    )
    .select("e.*", "partition", "offset", "timestamp", F.to_date("timestamp").alias("date"))
)
query = (
    events.writeStream.format("parquet")
    .option("path", output)
    .option("checkpointLocation", f"{output}/_checkpoint")
    .partitionBy("date")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
spark.read.parquet(output).groupBy("date", "type").count().orderBy("date", "type").show()
