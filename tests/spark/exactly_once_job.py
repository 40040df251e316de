"""A consume-transform-produce stream for tests/spark/test_exactly_once_sink.py, run as its own process (so the
test can SIGKILL it with its JVM): read `input` read_committed, write `out-<value>` to `output` with the
transactional sink.

    python exactly_once_job.py BOOTSTRAP INPUT OUTPUT CHECKPOINT (--available-now | --every-second)
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from tierlog.spark.source import TierlogDataSource

# Rows per micro-batch: small, so the stream runs many batches and a kill finds one in flight.
MAX_OFFSETS_PER_TRIGGER = 40


def main(bootstrap: str, input_topic: str, output_topic: str, checkpoint: str, mode: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tierlog-exactly-once")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.dataSource.register(TierlogDataSource)
    source = (
        spark.readStream.format("tierlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", input_topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
        .load()
    )
    writer = (
        source.selectExpr("key", "concat('out-', cast(value as string)) AS value")
        .writeStream.format("tierlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output_topic)
        .option("tierlog.sink.transactional", "true")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "--available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="1 second")
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
