"""Mutual TLS: with ssl.client.auth=required a client must present a certificate the broker's trust store
vouches for; one without a certificate is refused in the handshake, and the broker serves on."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from tls_helpers import TlsBroker, TlsFiles

pytestmark = pytest.mark.cluster

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def mtls_broker(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    broker = TlsBroker(
        tmp_path_factory.mktemp("mtls-broker") / "data",
        tls_files,
        **{"ssl.client.auth": "required", "ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1/"},
    )
    with broker:
        yield broker


def _with_certificate(tls_files: TlsFiles, broker: TlsBroker) -> dict[str, object]:
    return {
        "bootstrap.servers": broker.ssl_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls_files.ca_path),
        "ssl.certificate.location": str(tls_files.client_cert_path),
        "ssl.key.location": str(tls_files.client_key_path),
    }


def test_a_client_with_a_trusted_certificate_produces_and_consumes(tls_files: TlsFiles, mtls_broker: TlsBroker) -> None:
    topic = f"mtls-{uuid.uuid4().hex[:8]}"
    producer = Producer(_with_certificate(tls_files, mtls_broker))
    for i in range(10):
        producer.produce(topic, b"m%d" % i)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {**_with_certificate(tls_files, mtls_broker), "group.id": topic, "auto.offset.reset": "earliest"}
    )
    values = []
    try:
        consumer.subscribe([topic])
        while len(values) < 10:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None and message.error() is None
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"m%d" % i for i in range(10)]


def test_a_client_without_a_certificate_is_refused(tls_files: TlsFiles, mtls_broker: TlsBroker) -> None:
    without = {
        "bootstrap.servers": mtls_broker.ssl_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls_files.ca_path),
    }
    with pytest.raises(KafkaException) as refused:
        AdminClient(without).list_topics(timeout=5)
    assert refused.value.args[0].name() == "_TRANSPORT"
    listed = subprocess.run(
        [
            "kcat",
            "-L",
            "-b",
            mtls_broker.ssl_bootstrap,
            "-X",
            "security.protocol=SSL",
            "-X",
            f"ssl.ca.location={tls_files.ca_path}",
            "-m",
            "5",
        ],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert listed.returncode != 0
    # The broker serves a client with a certificate right after.
    assert 1 in AdminClient(_with_certificate(tls_files, mtls_broker)).list_topics(timeout=TIMEOUT_S).brokers
