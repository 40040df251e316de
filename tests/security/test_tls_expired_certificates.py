"""Certificates that must not be accepted: a broker whose certificate has expired is refused by confluent-kafka,
kafka-python, aiokafka and kcat; with ssl.client.auth=required the broker refuses, in the TLS handshake, a client
certificate that has expired or that its trust store does not vouch for, and serves a valid one right after
(docs/security.md#tls)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import aiokafka
import aiokafka.errors
import kafka
import kafka.errors
import pytest
import trustme
from aiokafka.helpers import create_ssl_context
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from tls_helpers import ListenersBroker, TlsFiles

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0
EXPIRED = {
    "not_before": datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC),
    "not_after": datetime.datetime(2021, 1, 1, tzinfo=datetime.UTC),
}


@pytest.fixture(scope="module")
def expired_server_broker(
    listeners_broker_factory: Callable[..., ListenersBroker],
    tls_files: TlsFiles,
    tmp_path_factory: pytest.TempPathFactory,
) -> ListenersBroker:
    """An SSL listener whose certificate, signed by the trusted CA, expired in 2021."""
    keystore = tmp_path_factory.mktemp("expired-server") / "broker.pem"
    tls_files.ca.issue_cert("127.0.0.1", "localhost", **EXPIRED).private_key_and_cert_chain_pem.write_to_path(keystore)
    return listeners_broker_factory(("SSL",), {"ssl.keystore.location": str(keystore)})


def confluent_refuses(broker: ListenersBroker, files: TlsFiles) -> str:
    errors: list[KafkaError] = []
    admin = AdminClient(
        {
            "bootstrap.servers": broker.address("SSL"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(files.ca_path),
            "error_cb": errors.append,
        }
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)
    assert errors, "librdkafka reported no error"
    return " ".join(error.str() for error in errors)


def kafka_python_refuses(broker: ListenersBroker, files: TlsFiles, caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.WARNING, logger="kafka")
    with pytest.raises(kafka.errors.KafkaTimeoutError):
        kafka.KafkaProducer(
            bootstrap_servers=broker.address("SSL"),
            security_protocol="SSL",
            ssl_cafile=str(files.ca_path),
            bootstrap_timeout_ms=3000,
        )
    return " ".join(record.getMessage() for record in caplog.records)


def aiokafka_refuses(broker: ListenersBroker, files: TlsFiles, caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def start() -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=broker.address("SSL"),
            security_protocol="SSL",
            ssl_context=create_ssl_context(cafile=str(files.ca_path)),
        )
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(aiokafka.errors.KafkaConnectionError):
        asyncio.run(start())
    return " ".join(record.getMessage() for record in caplog.records)


def kcat(broker: ListenersBroker, files: TlsFiles, *settings: str) -> subprocess.CompletedProcess[str]:
    command = ["kcat", "-L", "-m", "5", "-b", broker.address("SSL"), "-X", "security.protocol=SSL"]
    command += ["-X", f"ssl.ca.location={files.ca_path}"]
    for setting in settings:
        command += ["-X", setting]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_an_expired_broker_certificate_is_refused_by_every_client(
    expired_server_broker: ListenersBroker, tls_files: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    # librdkafka says only that verification failed; Python's ssl (kafka-python, aiokafka) names the reason.
    assert "certificate verify failed" in confluent_refuses(expired_server_broker, tls_files)
    listed = kcat(expired_server_broker, tls_files)
    assert listed.returncode != 0
    assert "certificate verify failed" in listed.stderr
    assert "certificate verify failed: certificate has expired" in kafka_python_refuses(
        expired_server_broker, tls_files, caplog
    )
    caplog.clear()
    assert "certificate verify failed: certificate has expired" in aiokafka_refuses(
        expired_server_broker, tls_files, caplog
    )
    # The broker itself serves on (its plaintext listener).
    assert (
        1 in AdminClient({"bootstrap.servers": expired_server_broker.bootstrap}).list_topics(timeout=TIMEOUT_S).brokers
    )


@pytest.fixture(scope="module")
def client_auth_broker(listeners_broker_factory: Callable[..., ListenersBroker]) -> ListenersBroker:
    return listeners_broker_factory(("SSL",), {"ssl.client.auth": "required"})


def with_certificate(broker: ListenersBroker, files: TlsFiles, certificate: Path, key: Path) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": broker.address("SSL"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(files.ca_path),
            "ssl.certificate.location": str(certificate),
            "ssl.key.location": str(key),
        }
    )


def client_certificate(ca: trustme.CA, directory: Path, name: str, **validity: datetime.datetime) -> tuple[Path, Path]:
    issued = ca.issue_cert(f"{name}@example.com", common_name=name, **validity)
    issued.cert_chain_pems[0].write_to_path(directory / f"{name}.crt")
    issued.private_key_pem.write_to_path(directory / f"{name}.key")
    return directory / f"{name}.crt", directory / f"{name}.key"


def handshake_failure(broker: ListenersBroker, files: TlsFiles, certificate: Path, key: Path) -> str:
    """Why the TLS 1.2 handshake failed, as OpenSSL names it."""
    context = ssl.create_default_context(cafile=str(files.ca_path))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    address = ("127.0.0.1", broker.listener_ports["SSL"])
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock, pytest.raises(ssl.SSLError) as failed:
        context.wrap_socket(sock, server_hostname="127.0.0.1")
    return str(failed.value.reason)


@pytest.mark.parametrize("which", ["expired", "untrusted"])
def test_the_broker_refuses_an_expired_or_untrusted_client_certificate_in_the_handshake(
    client_auth_broker: ListenersBroker, tls_files: TlsFiles, tmp_path: Path, which: str
) -> None:
    if which == "expired":
        certificate, key = client_certificate(tls_files.ca, tmp_path, "expired", **EXPIRED)
    else:
        certificate, key = client_certificate(trustme.CA(), tmp_path, "stranger")
    with pytest.raises(KafkaException) as refused:
        with_certificate(client_auth_broker, tls_files, certificate, key).list_topics(timeout=5)
    assert refused.value.args[0].code() == KafkaError._TRANSPORT
    listed = kcat(client_auth_broker, tls_files, f"ssl.certificate.location={certificate}", f"ssl.key.location={key}")
    assert listed.returncode != 0
    assert "Failed to acquire metadata" in listed.stderr
    # Forced to TLS 1.2, the handshake itself fails. The broker (asyncio's TLS) closes the connection without
    # sending the alert Kafka's broker would: the client reads the end of the stream in the handshake.
    assert handshake_failure(client_auth_broker, tls_files, certificate, key) in {
        "SSLV3_ALERT_CERTIFICATE_EXPIRED" if which == "expired" else "TLSV1_ALERT_UNKNOWN_CA",
        "UNEXPECTED_EOF_WHILE_READING",
    }
    # The broker serves a client with a valid certificate right after.
    valid = with_certificate(client_auth_broker, tls_files, tls_files.client_cert_path, tls_files.client_key_path)
    assert 1 in valid.list_topics(timeout=TIMEOUT_S).brokers
    client_auth_broker.check_alive()
