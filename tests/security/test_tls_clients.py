"""Kafka's clients over TLS against a broker with an SSL listener: confluent-kafka, kafka-python, aiokafka and
kcat each produce and consume; an untrusted broker certificate is refused by the client; a plaintext client on
the TLS port and a TLS client on the plaintext port each fail, and the broker serves normal clients afterwards."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from tls_helpers import TlsBroker, TlsFiles

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import api_versions_request
from tierlog.client.security import ClientSecurity
from tierlog.security.ssl_context import SslSettings, client_context
from tierlog.server.socket_server import SSL_HANDSHAKE_TIMEOUT_S

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def tls_broker(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    broker = TlsBroker(tmp_path_factory.mktemp("tls-broker") / "data", tls_files)
    with broker:
        yield broker


def _librdkafka_tls(tls_files: TlsFiles, broker: TlsBroker) -> dict[str, object]:
    return {
        "bootstrap.servers": broker.ssl_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls_files.ca_path),
    }


def _topic() -> str:
    return f"tls-{uuid.uuid4().hex[:8]}"


def _plaintext_round_trip(broker: TlsBroker) -> None:
    """The broker still serves a plain client: produce one record and read it back."""
    topic = _topic()
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, b"still-serving")
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        message = consumer.poll(TIMEOUT_S)
        assert message is not None and message.error() is None and message.value() == b"still-serving"
    finally:
        consumer.close()


def test_confluent_kafka_produces_and_consumes_over_tls(tls_files: TlsFiles, tls_broker: TlsBroker) -> None:
    topic = _topic()
    producer = Producer({**_librdkafka_tls(tls_files, tls_broker), "acks": "all"})
    for i in range(100):
        producer.produce(topic, b"v%d" % i, key=b"k%d" % i)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({**_librdkafka_tls(tls_files, tls_broker), "group.id": topic, "auto.offset.reset": "earliest"})
    values = []
    try:
        consumer.subscribe([topic])
        while len(values) < 100:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"only {len(values)} of 100 records came back"
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"v%d" % i for i in range(100)]


def test_kafka_python_produces_and_consumes_over_tls(tls_files: TlsFiles, tls_broker: TlsBroker) -> None:
    topic = _topic()
    tls = {"security_protocol": "SSL", "ssl_cafile": str(tls_files.ca_path)}
    producer = KafkaProducer(bootstrap_servers=tls_broker.ssl_bootstrap, acks="all", **tls)
    for i in range(20):
        producer.send(topic, b"kp%d" % i).get(timeout=TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=tls_broker.ssl_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
        **tls,
    )
    values = []
    for message in consumer:
        values.append(message.value)
        if len(values) == 20:
            break
    consumer.close()
    assert values == [b"kp%d" % i for i in range(20)]


def test_aiokafka_produces_and_consumes_over_tls(tls_files: TlsFiles, tls_broker: TlsBroker) -> None:
    topic = _topic()

    async def round_trip() -> list[bytes]:
        context = create_ssl_context(cafile=str(tls_files.ca_path))
        producer = AIOKafkaProducer(
            bootstrap_servers=tls_broker.ssl_bootstrap, security_protocol="SSL", ssl_context=context, acks="all"
        )
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, b"aio%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=tls_broker.ssl_bootstrap,
            security_protocol="SSL",
            ssl_context=context,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT_S):
                async for message in consumer:
                    values.append(message.value)
                    if len(values) == 20:
                        break
        finally:
            await consumer.stop()
        return values

    assert asyncio.run(round_trip()) == [b"aio%d" % i for i in range(20)]


def _kcat(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False)


def test_kcat_produces_and_consumes_over_tls(tls_files: TlsFiles, tls_broker: TlsBroker) -> None:
    topic = _topic()
    tls = ["-b", tls_broker.ssl_bootstrap, "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={tls_files.ca_path}"]
    produced = _kcat("-P", *tls, "-t", topic, stdin=b"one\ntwo\nthree\n")
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = _kcat("-C", *tls, "-t", topic, "-e", "-q", "-o", "beginning")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().split() == ["one", "two", "three"]
    listing = _kcat("-L", *tls).stdout.decode()
    # Metadata answers with the endpoints of the listener the request came in on, as Kafka's does.
    assert f"broker 1 at {tls_broker.ssl_bootstrap}" in listing


def test_a_broker_certificate_from_an_untrusted_ca_is_refused(tls_files: TlsFiles, tls_broker: TlsBroker) -> None:
    admin = AdminClient({**_librdkafka_tls(tls_files, tls_broker), "ssl.ca.location": str(tls_files.other_ca_path)})
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=5)
    assert refused.value.args[0].name() == "_TRANSPORT"
    listed = _kcat(
        "-L",
        "-b",
        tls_broker.ssl_bootstrap,
        "-X",
        "security.protocol=SSL",
        "-X",
        f"ssl.ca.location={tls_files.other_ca_path}",
        "-m",
        "5",
    )
    assert listed.returncode != 0
    assert "certificate verify failed" in listed.stderr.decode()


def test_a_plaintext_client_on_the_tls_port_fails_and_the_broker_serves_on(
    tls_files: TlsFiles, tls_broker: TlsBroker
) -> None:
    with pytest.raises(KafkaException) as failed:
        AdminClient({"bootstrap.servers": tls_broker.ssl_bootstrap}).list_topics(timeout=3)
    assert failed.value.args[0].name() == "_TRANSPORT"
    listed = _kcat("-L", "-b", tls_broker.ssl_bootstrap, "-m", "3")
    assert listed.returncode != 0
    _plaintext_round_trip(tls_broker)


def test_a_tls_client_on_the_plaintext_port_fails_and_the_broker_serves_on(
    tls_files: TlsFiles, tls_broker: TlsBroker
) -> None:
    listed = _kcat(
        "-L",
        "-b",
        tls_broker.bootstrap,
        "-X",
        "security.protocol=SSL",
        "-X",
        f"ssl.ca.location={tls_files.ca_path}",
        "-m",
        "3",
    )
    assert listed.returncode != 0
    assert "SSL handshake failed" in listed.stderr.decode()
    _plaintext_round_trip(tls_broker)


def test_a_client_that_never_completes_the_handshake_does_not_stop_others(
    tls_files: TlsFiles, tls_broker: TlsBroker
) -> None:
    # Connections that send nothing, and one that sends half a ClientHello, hold no connection task: the
    # broker serves TLS clients while they hang (asyncio drops them after the handshake timeout).
    stalled = [socket.create_connection(("127.0.0.1", tls_broker.ssl_port), timeout=5) for _ in range(20)]
    stalled[0].sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    try:
        admin = AdminClient(_librdkafka_tls(tls_files, tls_broker))
        assert 1 in admin.list_topics(timeout=TIMEOUT_S).brokers
    finally:
        for sock in stalled:
            sock.close()


def test_tls_consumption_of_a_large_batch_reads_the_whole_file_slice(
    tls_files: TlsFiles, tls_broker: TlsBroker
) -> None:
    # Fetch responses larger than one TLS read (1 MiB) go out in several preads: every byte must arrive.
    topic = _topic()
    producer = Producer({**_librdkafka_tls(tls_files, tls_broker), "linger.ms": 50, "batch.size": 1_000_000})
    payloads = [bytes([i % 251]) * 10_000 for i in range(400)]
    for payload in payloads:
        producer.produce(topic, payload)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {
            **_librdkafka_tls(tls_files, tls_broker),
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 8_000_000,
            "max.partition.fetch.bytes": 8_000_000,
        }
    )
    received = []
    try:
        consumer.subscribe([topic])
        while len(received) < len(payloads):
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"only {len(received)} records came back"
            assert message.error() is None, message.error()
            received.append(message.value())
    finally:
        consumer.close()
    assert received == payloads


def _project_client(cafile: Path) -> ClientSecurity:
    return ClientSecurity("SSL", client_context(SslSettings(truststore_type="PEM", truststore_location=str(cafile))))


def test_the_projects_own_connection_speaks_tls_and_refuses_an_untrusted_broker(
    tls_files: TlsFiles, tls_broker: TlsBroker
) -> None:
    async def api_versions(host: str, security: ClientSecurity) -> int:
        connection = await KafkaConnection.open(
            host, tls_broker.ssl_port, client_id="t", timeout_s=10, security=security
        )
        try:
            response = await connection.send(api_versions_request(), timeout_s=10)
        finally:
            await connection.close()
        return int(response.error_code)

    assert asyncio.run(api_versions("127.0.0.1", _project_client(tls_files.ca_path))) == 0
    assert asyncio.run(api_versions("localhost", _project_client(tls_files.ca_path))) == 0
    with pytest.raises(KafkaConnectionError) as refused:
        asyncio.run(api_versions("127.0.0.1", _project_client(tls_files.other_ca_path)))
    assert str(refused.value) == (
        f"connect to 127.0.0.1:{tls_broker.ssl_port}: TLS handshake failed: CERTIFICATE_VERIFY_FAILED"
    )


def test_a_handshake_that_never_completes_is_dropped_by_the_broker(tls_broker: TlsBroker) -> None:
    with socket.create_connection(("127.0.0.1", tls_broker.ssl_port), timeout=SSL_HANDSHAKE_TIMEOUT_S + 10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b"", "the broker sent something to a client that never said hello"
        waited = time.monotonic() - started
    assert SSL_HANDSHAKE_TIMEOUT_S - 1 <= waited <= SSL_HANDSHAKE_TIMEOUT_S + 5
