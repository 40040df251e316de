"""SCRAM-SHA-256 and SCRAM-SHA-512 end to end: an admin authenticated with PLAIN creates a user with confluent-kafka's
alter_user_scram_credentials (the metadata log keeps the credential), then confluent-kafka, kafka-python, aiokafka
and kcat connect as that user with SCRAM, produce and consume; a wrong password is refused with Kafka's SCRAM
message; a deleted credential no longer authenticates (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from typing import Any

import aiokafka
import kafka
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from sasl_helpers import PLAIN_JAAS
from tls_helpers import first_librdkafka_error, librdkafka_sasl, python_sasl

from tierlog.testing.local_cluster import BrokerProcess

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
MECHANISMS = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
PASSWORD = "carol-secret"


@pytest.fixture(scope="module")
def scram_broker(module_broker_factory: Any) -> BrokerProcess:
    broker: BrokerProcess = module_broker_factory(
        {
            "listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "num.partitions": "1",
        }
    )
    return broker


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient(librdkafka_sasl(broker.bootstrap, "SASL_PLAINTEXT", "PLAIN", "admin", "admin-secret"))


def scram_user(broker: BrokerProcess, mechanism: str) -> str:
    """A new user with a credential for `mechanism`, created through AlterUserScramCredentials."""
    user = f"carol-{uuid.uuid4().hex[:6]}"
    upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(MECHANISMS[mechanism], 4096), PASSWORD.encode())
    client = admin(broker)  # kept alive until the answer is in
    client.alter_user_scram_credentials([upsertion])[user].result(timeout=TIMEOUT_S)
    return user


def confluent_config(broker: BrokerProcess, mechanism: str, user: str, password: str = PASSWORD) -> dict[str, Any]:
    return librdkafka_sasl(broker.bootstrap, "SASL_PLAINTEXT", mechanism, user, password)


def python_config(broker: BrokerProcess, mechanism: str, user: str) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings."""
    return python_sasl(broker.bootstrap, "SASL_PLAINTEXT", mechanism, user, PASSWORD)


def produce_and_consume_confluent(broker: BrokerProcess, mechanism: str, user: str, topic: str) -> list[bytes]:
    producer = Producer({**confluent_config(broker, mechanism, user), "acks": "all"})
    for i in range(3):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({**confluent_config(broker, mechanism, user), "group.id": topic})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 3 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def produce_and_consume_kafka_python(broker: BrokerProcess, mechanism: str, user: str, topic: str) -> list[bytes]:
    producer = kafka.KafkaProducer(**python_config(broker, mechanism, user), acks="all")
    for i in range(3):
        producer.send(topic, f"v{i}".encode(), partition=0).get(timeout=TIMEOUT_S)
    producer.close()
    consumer = kafka.KafkaConsumer(**python_config(broker, mechanism, user), consumer_timeout_ms=int(TIMEOUT_S * 1000))
    partition = kafka.TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    values = [record.value for _, record in zip(range(3), consumer, strict=False)]
    consumer.close()
    return values


def produce_and_consume_aiokafka(broker: BrokerProcess, mechanism: str, user: str, topic: str) -> list[bytes]:
    async def run() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(**python_config(broker, mechanism, user), acks="all")
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, f"v{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**python_config(broker, mechanism, user))
        await consumer.start()
        try:
            partition = aiokafka.TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            async with asyncio.timeout(TIMEOUT_S):
                return [(await consumer.getone()).value for _ in range(3)]
        finally:
            await consumer.stop()

    return asyncio.run(run())


# kcat runs on the system's librdkafka (2.0 on Debian), which repeats its nonce in the final message: accepted as by
# Kafka.
def produce_and_consume_kcat(broker: BrokerProcess, mechanism: str, user: str, topic: str) -> list[bytes]:
    base = [
        "kcat",
        "-b",
        broker.bootstrap,
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        f"sasl.mechanisms={mechanism}",
    ]
    base += ["-X", f"sasl.username={user}", "-X", f"sasl.password={PASSWORD}"]
    produced = subprocess.run(
        [*base, "-P", "-t", topic, "-p", "0"], input="v0\nv1\nv2\n", capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [*base, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", "3", "-e"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert consumed.returncode == 0, consumed.stderr
    return [line.encode() for line in consumed.stdout.splitlines()]


CLIENTS = {
    "confluent-kafka": produce_and_consume_confluent,
    "kafka-python": produce_and_consume_kafka_python,
    "aiokafka": produce_and_consume_aiokafka,
    "kcat": produce_and_consume_kcat,
}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_user_created_with_alter_user_scram_credentials_produces_and_consumes(
    scram_broker: BrokerProcess, client: str, mechanism: str
) -> None:
    user = scram_user(scram_broker, mechanism)
    topic = f"scram-{uuid.uuid4().hex[:8]}"
    assert CLIENTS[client](scram_broker, mechanism, user, topic) == [b"v0", b"v1", b"v2"]


def authentication_error(broker: BrokerProcess, mechanism: str, user: str, password: str) -> KafkaError:
    return first_librdkafka_error(confluent_config(broker, mechanism, user, password), TIMEOUT_S)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_scram_password_is_refused_with_kafkas_message(scram_broker: BrokerProcess, mechanism: str) -> None:
    user = scram_user(scram_broker, mechanism)
    error = authentication_error(scram_broker, mechanism, user, "wrong-password")
    assert error.code() == KafkaError._AUTHENTICATION
    assert (
        f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        in error.str()
    )


def test_a_credential_for_one_mechanism_does_not_authenticate_with_the_other(scram_broker: BrokerProcess) -> None:
    user = scram_user(scram_broker, "SCRAM-SHA-256")
    assert authentication_error(scram_broker, "SCRAM-SHA-512", user, PASSWORD).code() == KafkaError._AUTHENTICATION


def test_a_deleted_credential_no_longer_authenticates(scram_broker: BrokerProcess) -> None:
    user = scram_user(scram_broker, "SCRAM-SHA-256")
    assert AdminClient(confluent_config(scram_broker, "SCRAM-SHA-256", user)).list_topics(timeout=TIMEOUT_S).brokers
    deletion = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)
    client = admin(scram_broker)
    client.alter_user_scram_credentials([deletion])[user].result(timeout=TIMEOUT_S)
    assert authentication_error(scram_broker, "SCRAM-SHA-256", user, PASSWORD).code() == KafkaError._AUTHENTICATION
