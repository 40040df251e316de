"""confluent-kafka, kafka-python, aiokafka, kcat and tierlog's own client connect to a SASL_PLAINTEXT listener with
PLAIN, produce and consume; a wrong password or an unknown user is refused with the error each client reports,
and the broker serves on (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
import uuid
from typing import Any

import aiokafka
import kafka
import kafka.errors
import pytest
from aiokafka.errors import KafkaConnectionError as AioKafkaConnectionError
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sasl_helpers import PLAIN_JAAS
from tls_helpers import first_librdkafka_error, librdkafka_sasl, python_sasl

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import metadata_request
from tierlog.client.security import ClientSecurity
from tierlog.testing.local_cluster import BrokerProcess

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
BAD_CREDENTIALS = [("alice", "wrong-password"), ("mallory", "alice-secret")]
# The broker's listener keeps the name tierlog's test fixtures give it, PLAINTEXT, and speaks SASL_PLAINTEXT.
SASL_BROKER = {
    "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
    "num.partitions": "1",
}


@pytest.fixture(scope="module")
def sasl_broker(module_broker_factory: Any) -> BrokerProcess:
    broker: BrokerProcess = module_broker_factory(SASL_BROKER)
    return broker


def confluent_config(broker: BrokerProcess, user: str = "alice", password: str = "alice-secret") -> dict[str, Any]:
    return librdkafka_sasl(broker.bootstrap, "SASL_PLAINTEXT", "PLAIN", user, password)


def python_config(broker: BrokerProcess, user: str = "alice", password: str = "alice-secret") -> dict[str, Any]:
    """kafka-python's and aiokafka's settings."""
    return python_sasl(broker.bootstrap, "SASL_PLAINTEXT", "PLAIN", user, password)


def topic_name() -> str:
    return f"sasl-{uuid.uuid4().hex[:8]}"


def assert_serves(broker: BrokerProcess) -> None:
    """The broker still answers an authenticated client."""
    metadata = AdminClient(confluent_config(broker)).list_topics(timeout=TIMEOUT_S)
    assert list(metadata.brokers) == [1]


def test_confluent_kafka_produces_and_consumes_over_sasl_plain(sasl_broker: BrokerProcess) -> None:
    topic = topic_name()
    producer = Producer({**confluent_config(sasl_broker), "acks": "all"})
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({**confluent_config(sasl_broker), "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 10 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(10)]


@pytest.mark.parametrize(("user", "password"), BAD_CREDENTIALS)
def test_confluent_kafka_reports_the_brokers_authentication_failure(
    sasl_broker: BrokerProcess, user: str, password: str
) -> None:
    error = first_librdkafka_error(confluent_config(sasl_broker, user, password), TIMEOUT_S)
    assert error.code() == KafkaError._AUTHENTICATION
    assert "Authentication failed: Invalid username or password" in error.str()
    assert_serves(sasl_broker)


def test_kafka_python_produces_and_consumes_over_sasl_plain(sasl_broker: BrokerProcess) -> None:
    topic = topic_name()
    producer = kafka.KafkaProducer(**python_config(sasl_broker), acks="all")
    offsets = [producer.send(topic, f"v{i}".encode(), partition=0).get(timeout=TIMEOUT_S).offset for i in range(5)]
    producer.close()
    assert offsets == [0, 1, 2, 3, 4]
    consumer = kafka.KafkaConsumer(**python_config(sasl_broker), consumer_timeout_ms=int(TIMEOUT_S * 1000))
    consumer.assign([kafka.TopicPartition(topic, 0)])
    consumer.seek(kafka.TopicPartition(topic, 0), 0)
    values = [record.value for _, record in zip(range(5), consumer, strict=False)]
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


@pytest.mark.parametrize(("user", "password"), BAD_CREDENTIALS)
def test_kafka_python_reports_sasl_authentication_failed(
    sasl_broker: BrokerProcess, user: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kafka")
    with pytest.raises(kafka.errors.KafkaTimeoutError):
        kafka.KafkaProducer(**python_config(sasl_broker, user, password), bootstrap_timeout_ms=3000)
    failures = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailedError" in r.getMessage()]
    assert failures, "kafka-python logged no SaslAuthenticationFailedError"
    assert "Authentication failed: Invalid username or password" in failures[0]
    assert_serves(sasl_broker)


def test_aiokafka_produces_and_consumes_over_sasl_plain(sasl_broker: BrokerProcess) -> None:
    topic = topic_name()

    async def run() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(**python_config(sasl_broker), acks="all")
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"v{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**python_config(sasl_broker))
        await consumer.start()
        try:
            partition = aiokafka.TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            values = []
            async with asyncio.timeout(TIMEOUT_S):
                while len(values) < 5:
                    values.append((await consumer.getone()).value)
            return values
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"v{i}".encode() for i in range(5)]


@pytest.mark.parametrize(("user", "password"), BAD_CREDENTIALS)
def test_aiokafka_reports_sasl_authentication_failed(
    sasl_broker: BrokerProcess, user: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(**python_config(sasl_broker, user, password))
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(AioKafkaConnectionError):
        asyncio.run(run())
    failures = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailed" in r.getMessage()]
    assert failures and "Authentication failed: Invalid username or password" in failures[0]
    assert_serves(sasl_broker)


def kcat(broker: BrokerProcess, *args: str, password: str = "alice-secret", stdin: str | None = None) -> Any:
    command = ["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN"]
    command += ["-X", "sasl.username=alice", "-X", f"sasl.password={password}", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_kcat_produces_and_consumes_over_sasl_plain(sasl_broker: BrokerProcess) -> None:
    topic = topic_name()
    produced = kcat(sasl_broker, "-P", "-t", topic, "-p", "0", stdin="one\ntwo\nthree\n")
    assert produced.returncode == 0, produced.stderr
    consumed = kcat(sasl_broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", "3", "-e")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == ["one", "two", "three"]


def test_kcat_with_a_wrong_password_shows_the_brokers_message(sasl_broker: BrokerProcess) -> None:
    listed = kcat(sasl_broker, "-L", "-m", "5", password="wrong-password")
    assert "SASL authentication error: Authentication failed: Invalid username or password" in listed.stderr
    assert "Failed to acquire metadata" in listed.stderr
    assert_serves(sasl_broker)


def test_tierlogs_own_client_authenticates_with_plain(sasl_broker: BrokerProcess) -> None:
    host, port = sasl_broker.bootstrap.rsplit(":", 1)

    async def run(password: str) -> Any:
        security = ClientSecurity(
            "SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="admin", sasl_password=password
        )
        connection = await KafkaConnection.open(host, int(port), client_id="t", timeout_s=10, security=security)
        try:
            return await connection.send(metadata_request(()), timeout_s=10)
        finally:
            await connection.close()

    assert [int(b.node_id) for b in asyncio.run(run("admin-secret")).brokers] == [1]
    with pytest.raises(KafkaConnectionError) as refused:
        asyncio.run(run("wrong"))
    assert str(refused.value) == (
        f"SASL PLAIN authentication with {sasl_broker.bootstrap} failed: "
        "Authentication failed: Invalid username or password"
    )


def test_a_request_before_authentication_closes_the_connection_unanswered(sasl_broker: BrokerProcess) -> None:
    host, port = sasl_broker.bootstrap.rsplit(":", 1)

    async def run() -> None:
        connection = await KafkaConnection.open(host, int(port), client_id="t", timeout_s=10)
        try:
            await connection.send(metadata_request(()), timeout_s=10)
        finally:
            await connection.close()

    with pytest.raises(KafkaConnectionError, match="connection closed by the peer"):
        asyncio.run(run())
    assert_serves(sasl_broker)
