"""tierlog as a PySpark data source (`spark.read.format("tierlog")`), modelled on Spark's Kafka source."""
