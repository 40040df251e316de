"""Read a topic, transform the values, write them to another topic (the sink: acks=all, idempotent producer).

python examples/copy_topic.py BOOTSTRAP SOURCE_TOPIC TARGET_TOPIC
"""

import os
import sys

from pyspark.sql import SparkSession

from tierlog.spark.shipping import ship_tierlog
from tierlog.spark.source import TierlogDataSource

bootstrap, source, target = sys.argv[1:4]
# Spark's Python workers must run this interpreter, the one that has tierlog (unless the venv is active).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Run with python, the job is local (local[*]) and listens on the loopback interface only (Spark's default is
# every interface); run with spark-submit --master, it is the cluster's, and SPARK_LOCAL_IP is as the shell has it.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
spark = SparkSession.builder.config("spark.ui.enabled", "false").getOrCreate()
ship_tierlog(spark.sparkContext)  # on a cluster: the executors import this tierlog (before registering)
spark.dataSource.register(TierlogDataSource)

(
    spark.read.format("tierlog")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", source)
    .option("includeHeaders", "true")  # to carry the headers over
    .load()
    .selectExpr("key", "upper(CAST(value AS STRING)) AS value", "headers")
    .write.format("tierlog")
    .mode("append")  # a log is appended to; PySpark data sources have no errorifexists mode
    .option("kafka.bootstrap.servers", bootstrap)
    .option("topic", target)
    .save()
)
print(f"copied {source} to {target}")
