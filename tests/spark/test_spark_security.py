"""The Spark source and sink against a broker whose listener speaks SASL_PLAINTEXT with PLAIN: every client the
connector makes (the driver's consumer, the sink's producer, the executors' fetch connections) authenticates
with the job's kafka.* options, in the Java client's names as a job ported from `format("kafka")` has them; a
wrong password fails the query. Needs the brokers' SASL (branch sec-sasl)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from tierlog.testing.local_cluster import BrokerProcess

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
PASSWORD = "spark-secret"
ADMIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="admin" password="{PASSWORD}" user_admin="{PASSWORD}" user_etl="etl-secret";'
)
# The broker's listener keeps the name the fixtures give it, PLAINTEXT, and speaks SASL_PLAINTEXT.
SASL_BROKER = {
    "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.plaintext.plain.sasl.jaas.config": ADMIN_JAAS,
}


def etl_options(broker: BrokerProcess, password: str = "etl-secret") -> dict[str, str]:
    """What a Spark job for a SASL/PLAIN Kafka cluster sets, in the Java client's names."""
    return {
        "kafka.bootstrap.servers": broker.bootstrap,
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": (
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="etl" password="{password}";'
        ),
    }


@pytest.fixture(scope="module")
def sasl_broker(module_broker_factory: Any) -> BrokerProcess:
    broker: BrokerProcess = module_broker_factory(SASL_BROKER)
    return broker


def new_topic(broker: BrokerProcess, partitions: int) -> str:
    name = f"spark-sasl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(
        {
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": PASSWORD,
        }
    )
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(TIMEOUT_S)
    return name


def test_a_batch_write_and_read_authenticate_with_the_jobs_kafka_options(
    spark: SparkSession, sasl_broker: BrokerProcess
) -> None:
    topic = new_topic(sasl_broker, partitions=2)
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    rows = [(f"k{i}", f"v{i}".encode()) for i in range(50)]
    writer = spark.createDataFrame(rows, schema).write.format("tierlog").options(**etl_options(sasl_broker))
    writer.option("topic", topic).mode("append").save()

    read = spark.read.format("tierlog").options(**etl_options(sasl_broker)).option("subscribe", topic).load()
    got = sorted((row["key"].decode(), row["value"].decode()) for row in read.select("key", "value").collect())
    assert got == sorted((k, v.decode()) for k, v in rows)


def test_a_wrong_password_fails_the_read(spark: SparkSession, sasl_broker: BrokerProcess) -> None:
    topic = new_topic(sasl_broker, partitions=1)
    options = etl_options(sasl_broker, password="wrong")
    with pytest.raises(
        Exception,
        match=r"BrokerRefusalError: the brokers refused the job's credentials: .*Invalid username or password",
    ):
        spark.read.format("tierlog").options(**options).option("subscribe", topic).load().collect()
