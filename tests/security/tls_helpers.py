"""Certificates for the TLS tests (trustme, written to tmp_path), the broker settings that use them, and the
settings that let confluent-kafka, kafka-python, aiokafka and kcat reach a SASL_SSL listener."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka.helpers import create_ssl_context
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from tierlog.testing.local_cluster import BrokerProcess, free_ports


@dataclass(frozen=True)
class TlsFiles:
    ca: trustme.CA
    ca_path: Path
    # The broker's key store: its private key and certificate chain (127.0.0.1 and localhost) in one PEM file.
    keystore_path: Path
    # A client certificate whose subject is CN=alice,OU=eng,O=acme, and its key.
    client_cert_path: Path
    client_key_path: Path
    # Trusted by nobody here: a client that trusts it must refuse the broker.
    other_ca_path: Path


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(directory / "ca.pem")
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(directory / "broker.pem")
    alice = ca.issue_cert(
        "alice@example.com", common_name="alice", organization_name="acme", organization_unit_name="eng"
    )
    alice.cert_chain_pems[0].write_to_path(directory / "alice.crt")
    alice.private_key_pem.write_to_path(directory / "alice.key")
    trustme.CA().cert_pem.write_to_path(directory / "other-ca.pem")
    return TlsFiles(
        ca,
        directory / "ca.pem",
        directory / "broker.pem",
        directory / "alice.crt",
        directory / "alice.key",
        directory / "other-ca.pem",
    )


def broker_tls_settings(files: TlsFiles, **extra: str) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_path),
        **extra,
    }


class TlsBroker(BrokerProcess):
    """A broker with a PLAINTEXT listener (where the fixtures check it is ready) and an SSL one."""

    def __init__(self, log_dir: Path, files: TlsFiles, **extra: str) -> None:
        plaintext_port, self.ssl_port = free_ports(2)
        super().__init__(
            log_dir,
            port=plaintext_port,
            overrides={
                "listeners": f"PLAINTEXT://127.0.0.1:{plaintext_port},SSL://127.0.0.1:{self.ssl_port}",
                **broker_tls_settings(files, **extra),
            },
        )

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"


class ListenersBroker(BrokerProcess):
    """A broker whose first listener is PLAINTEXT (readiness probes, inter-broker) followed by one listener per
    name in `listeners` (its protocol that of the same name unless the overrides map it), with the TLS settings
    of `files` and the `overrides`."""

    def __init__(
        self, log_dir: Path, files: TlsFiles, listeners: tuple[str, ...], overrides: Mapping[str, str]
    ) -> None:
        plaintext_port, *ports = free_ports(1 + len(listeners))
        self.listener_ports = dict(zip(listeners, ports, strict=True))
        spelled = [f"PLAINTEXT://127.0.0.1:{plaintext_port}"]
        spelled += [f"{name}://127.0.0.1:{port}" for name, port in self.listener_ports.items()]
        super().__init__(
            log_dir,
            port=plaintext_port,
            overrides={
                "listeners": ",".join(spelled),
                "log.segment.bytes": str(1024 * 1024),
                **broker_tls_settings(files),
                **overrides,
            },
        )

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.listener_ports[listener]}"


def librdkafka_sasl(bootstrap: str, protocol: str, mechanism: str, user: str, password: str) -> dict[str, Any]:
    """confluent-kafka's and kcat's settings (librdkafka's names) of a SASL user on a SASL_PLAINTEXT or SASL_SSL
    listener; for SASL_SSL, `librdkafka_sasl_ssl` adds the trust store."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def python_sasl(bootstrap: str, protocol: str, mechanism: str, user: str, password: str) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (they share these names) of a SASL user."""
    return {
        "bootstrap_servers": bootstrap,
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def librdkafka_sasl_ssl(bootstrap: str, files: TlsFiles, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {**librdkafka_sasl(bootstrap, "SASL_SSL", mechanism, user, password), "ssl.ca.location": str(files.ca_path)}


def kafka_python_sasl_ssl(bootstrap: str, files: TlsFiles, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {**python_sasl(bootstrap, "SASL_SSL", mechanism, user, password), "ssl_cafile": str(files.ca_path)}


def aiokafka_sasl_ssl(bootstrap: str, files: TlsFiles, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        **python_sasl(bootstrap, "SASL_SSL", mechanism, user, password),
        "ssl_context": create_ssl_context(cafile=str(files.ca_path)),
    }


def first_librdkafka_error(config: Mapping[str, Any], timeout_s: float) -> KafkaError:
    """The first error librdkafka reports (through error_cb) for a client with `config` that cannot list topics:
    the failed request alone does not say why, the error callback does, a little later."""
    errors: list[KafkaError] = []
    admin = AdminClient({**config, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    deadline = time.monotonic() + timeout_s
    while not errors and time.monotonic() < deadline:
        admin.poll(0.2)
    assert errors, "librdkafka reported no error"
    return errors[0]


def kcat_sasl_ssl(bootstrap: str, files: TlsFiles, mechanism: str, user: str, password: str) -> list[str]:
    """kcat's arguments before the mode: the broker and `-X` per librdkafka setting."""
    args = ["kcat", "-b", bootstrap]
    for key, value in librdkafka_sasl_ssl(bootstrap, files, mechanism, user, password).items():
        if key != "bootstrap.servers":
            # kcat's librdkafka (2.0 on Debian) spells the mechanism setting in the plural.
            args += ["-X", f"{'sasl.mechanisms' if key == 'sasl.mechanism' else key}={value}"]
    return args


@dataclass(frozen=True)
class Identity:
    """A certificate of the test CA whose subject starts with CN=<name>, its key, and both in one key store."""

    certificate_path: Path
    key_path: Path
    keystore_path: Path


# Maps such a subject (CN=alice,OU=Testing cert ...,O=trustme ...) to the common name: User:alice.
CN_MAPPING_RULES = "RULE:^CN=(.*?),.*$/$1/"


def issue_identity(ca: trustme.CA, directory: Path, name: str) -> Identity:
    """A certificate for CN=<name>, valid for 127.0.0.1 and localhost too, so a broker can serve with it."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = ca.issue_cert("127.0.0.1", "localhost", common_name=name)
    identity = Identity(directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}-keystore.pem")
    issued.cert_chain_pems[0].write_to_path(identity.certificate_path)
    issued.private_key_pem.write_to_path(identity.key_path)
    issued.private_key_and_cert_chain_pem.write_to_path(identity.keystore_path)
    return identity
