"""TLS and SASL together: confluent-kafka, kafka-python, aiokafka and kcat each authenticate on a SASL_SSL
listener with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (the SCRAM users created with confluent-kafka's
alter_user_scram_credentials by an admin on the same listener), produce and consume; a wrong password over
SASL_SSL is refused with each client's authentication error and the broker serves on (docs/security.md#sasl,
docs/security.md#tls)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping

import aiokafka
import aiokafka.errors
import kafka
import kafka.errors
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from sasl_helpers import PLAIN_JAAS, PLAIN_USERS
from tls_helpers import (
    ListenersBroker,
    TlsFiles,
    aiokafka_sasl_ssl,
    first_librdkafka_error,
    kafka_python_sasl_ssl,
    kcat_sasl_ssl,
    librdkafka_sasl_ssl,
)

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
RECORDS = [b"v0", b"v1", b"v2"]
SCRAM_MECHANISMS = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
SCRAM_PASSWORD = "scram-secret"


class Endpoint:
    """The SASL_SSL listener of the module's broker and the user each mechanism authenticates as."""

    def __init__(self, broker: ListenersBroker, files: TlsFiles, users: Mapping[str, tuple[str, str]]) -> None:
        self.broker = broker
        self.files = files
        self.users = users

    @property
    def bootstrap(self) -> str:
        return self.broker.address("SASL_SSL")

    def credentials(self, mechanism: str, wrong_password: bool = False) -> tuple[str, TlsFiles, str, str, str]:
        user, password = self.users[mechanism]
        return self.bootstrap, self.files, mechanism, user, "wrong-" + password if wrong_password else password


@pytest.fixture(scope="module")
def endpoint(listeners_broker_factory: Callable[..., ListenersBroker], tls_files: TlsFiles) -> Endpoint:
    broker = listeners_broker_factory(
        ("SASL_SSL",),
        {
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
            "num.partitions": "1",
        },
    )
    admin = AdminClient(librdkafka_sasl_ssl(broker.address("SASL_SSL"), tls_files, "PLAIN", "admin", "admin-secret"))
    users = {"PLAIN": ("alice", PLAIN_USERS["alice"])}
    for name, mechanism in SCRAM_MECHANISMS.items():
        user = f"scram-{name[-3:]}"
        upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), SCRAM_PASSWORD.encode())
        admin.alter_user_scram_credentials([upsertion])[user].result(timeout=TIMEOUT_S)
        users[name] = (user, SCRAM_PASSWORD)
    return Endpoint(broker, tls_files, users)


def confluent_round_trip(endpoint: Endpoint, mechanism: str, topic: str) -> list[bytes]:
    config = librdkafka_sasl_ssl(*endpoint.credentials(mechanism))
    producer = Producer({**config, "acks": "all"})
    for value in RECORDS:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({**config, "group.id": topic})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(values) < len(RECORDS) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        consumer.close()
    return values


def kafka_python_round_trip(endpoint: Endpoint, mechanism: str, topic: str) -> list[bytes]:
    config = kafka_python_sasl_ssl(*endpoint.credentials(mechanism))
    producer = kafka.KafkaProducer(**config, acks="all")
    try:
        for value in RECORDS:
            producer.send(topic, value, partition=0).get(timeout=TIMEOUT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(**config, consumer_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        partition = kafka.TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        return [record.value for _, record in zip(range(len(RECORDS)), consumer, strict=False)]
    finally:
        consumer.close()


def aiokafka_round_trip(endpoint: Endpoint, mechanism: str, topic: str) -> list[bytes]:
    async def run() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(**aiokafka_sasl_ssl(*endpoint.credentials(mechanism)), acks="all")
        await producer.start()
        try:
            for value in RECORDS:
                await producer.send_and_wait(topic, value, partition=0)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**aiokafka_sasl_ssl(*endpoint.credentials(mechanism)))
        await consumer.start()
        try:
            partition = aiokafka.TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            async with asyncio.timeout(TIMEOUT_S):
                return [(await consumer.getone()).value for _ in RECORDS]
        finally:
            await consumer.stop()

    return asyncio.run(run())


def kcat_round_trip(endpoint: Endpoint, mechanism: str, topic: str) -> list[bytes]:
    kcat = kcat_sasl_ssl(*endpoint.credentials(mechanism))
    produced = subprocess.run(
        [*kcat, "-P", "-t", topic, "-p", "0"], input=b"\n".join(RECORDS) + b"\n", capture_output=True, timeout=TIMEOUT_S
    )
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = subprocess.run(
        [*kcat, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", str(len(RECORDS)), "-e"],
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    assert consumed.returncode == 0, consumed.stderr.decode()
    return consumed.stdout.splitlines()


CLIENTS: dict[str, Callable[[Endpoint, str, str], list[bytes]]] = {
    "confluent-kafka": confluent_round_trip,
    "kafka-python": kafka_python_round_trip,
    "aiokafka": aiokafka_round_trip,
    "kcat": kcat_round_trip,
}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_authenticates_over_sasl_ssl_produces_and_consumes(
    endpoint: Endpoint, client: str, mechanism: str
) -> None:
    topic = f"sasl-ssl-{client}-{mechanism}-{uuid.uuid4().hex[:6]}".lower()
    assert CLIENTS[client](endpoint, mechanism, topic) == RECORDS


def confluent_refusal(endpoint: Endpoint, mechanism: str, caplog: pytest.LogCaptureFixture) -> str:
    error = first_librdkafka_error(
        librdkafka_sasl_ssl(*endpoint.credentials(mechanism, wrong_password=True)), TIMEOUT_S
    )
    assert error.code() == KafkaError._AUTHENTICATION, error
    return error.str()


def logged_sasl_failure(caplog: pytest.LogCaptureFixture) -> str:
    failures = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailed" in r.getMessage()]
    assert failures, "the client logged no SaslAuthenticationFailedError"
    return failures[0]


# kafka-python and aiokafka report the broker's SASL_AUTHENTICATION_FAILED in their log and then fail to bootstrap.
def kafka_python_refusal(endpoint: Endpoint, mechanism: str, caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.WARNING, logger="kafka")
    config = kafka_python_sasl_ssl(*endpoint.credentials(mechanism, wrong_password=True))
    with pytest.raises(kafka.errors.KafkaTimeoutError):
        kafka.KafkaProducer(**config, bootstrap_timeout_ms=3000)
    return logged_sasl_failure(caplog)


def aiokafka_refusal(endpoint: Endpoint, mechanism: str, caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def start() -> None:
        producer = aiokafka.AIOKafkaProducer(**aiokafka_sasl_ssl(*endpoint.credentials(mechanism, wrong_password=True)))
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(aiokafka.errors.KafkaConnectionError):
        asyncio.run(start())
    return logged_sasl_failure(caplog)


def kcat_refusal(endpoint: Endpoint, mechanism: str, caplog: pytest.LogCaptureFixture) -> str:
    listed = subprocess.run(
        [*kcat_sasl_ssl(*endpoint.credentials(mechanism, wrong_password=True)), "-L", "-m", "5"],
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    assert listed.returncode != 0
    assert "SASL authentication error" in listed.stderr.decode()
    return listed.stderr.decode()


REFUSALS: dict[str, Callable[[Endpoint, str, pytest.LogCaptureFixture], str]] = {
    "confluent-kafka": confluent_refusal,
    "kafka-python": kafka_python_refusal,
    "aiokafka": aiokafka_refusal,
    "kcat": kcat_refusal,
}
# Kafka's message for each mechanism's failure (docs/security.md#sasl), which every client passes on.
REFUSAL_MESSAGES = {
    "PLAIN": "Authentication failed: Invalid username or password",
    **{
        name: f"Authentication failed during authentication due to invalid credentials with SASL mechanism {name}"
        for name in SCRAM_MECHANISMS
    },
}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", REFUSALS)
def test_a_wrong_password_over_sasl_ssl_is_refused_and_the_broker_serves_on(
    endpoint: Endpoint, client: str, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert REFUSAL_MESSAGES[mechanism] in REFUSALS[client](endpoint, mechanism, caplog)
    topic = f"after-refusal-{client}-{mechanism}-{uuid.uuid4().hex[:6]}".lower()
    assert confluent_round_trip(endpoint, mechanism, topic) == RECORDS
