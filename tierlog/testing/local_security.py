"""What a local cluster needs to serve its clients on SASL_SSL: a certificate authority, a broker certificate
for 127.0.0.1 and localhost signed by it, an admin user with a random password, and the client settings that
use them, written to files next to the cluster's data. Rules: docs/security.md#tools.

The files are made with `cryptography` (never hand-written crypto); the private key, the password and the
settings holding it are readable by their owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tierlog.config import parse_properties

CLIENT_LISTENER = "SASL_SSL"
SASL_MECHANISM = "PLAIN"
ADMIN_USER = "admin"
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_VALIDITY = datetime.timedelta(days=365)
_PRIVATE = 0o600
_CLIENT_CONFIG_FILE_NAME = "client.properties"


@dataclass(frozen=True)
class LocalSecurity:
    """The SASL_SSL material of one local cluster, in `directory`."""

    directory: Path
    username: str
    password: str

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (ssl.ca.location, ssl.truststore.location)."""
        return self.directory / "ca.pem"

    @property
    def keystore_file(self) -> Path:
        """The brokers' private key and certificate chain in one PEM file (ssl.keystore.type=PEM)."""
        return self.directory / "broker-keystore.pem"

    @property
    def client_config_file(self) -> Path:
        """librdkafka's settings: `tierlog ... --command-config FILE`, `kcat -F FILE`."""
        return self.directory / _CLIENT_CONFIG_FILE_NAME

    @property
    def java_client_config_file(self) -> Path:
        """The Java client's settings: Kafka's tools' `--command-config FILE`, `--producer.config FILE`."""
        return self.directory / "client-java.properties"

    @classmethod
    def generate(cls, directory: Path, username: str = ADMIN_USER) -> LocalSecurity:
        """A new CA, broker certificate and admin password in `directory` (files there are replaced)."""
        directory.mkdir(parents=True, exist_ok=True)
        security = cls(directory, username, secrets.token_urlsafe(18))
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tierlog local cluster CA")])
        now = datetime.datetime.now(datetime.UTC)
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        broker_key = ec.generate_private_key(ec.SECP256R1())
        broker_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name)
            .public_key(broker_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            # Clients check the host name they connect to (127.0.0.1, as the brokers advertise) against these.
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        security.ca_file.write_bytes(ca_cert.public_bytes(pem))
        key_pem = broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        _write_private(security.keystore_file, key_pem + broker_cert.public_bytes(pem) + ca_cert.public_bytes(pem))
        _write_private(security.client_config_file, _properties(security.client_settings()))
        _write_private(security.java_client_config_file, _properties(security.java_client_settings()))
        return security

    def jaas_config(self) -> str:
        return f'{PLAIN_LOGIN_MODULE} required username="{self.username}" password="{self.password}";'

    def broker_settings(self) -> dict[str, str]:
        """The server.properties of the client listener: TLS with the generated certificate, SASL/PLAIN with
        the admin user (as `user_<name>` of the listener's JAAS config, Kafka's way of listing PLAIN users)."""
        listener = CLIENT_LISTENER.lower()
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file),
            "sasl.enabled.mechanisms": SASL_MECHANISM,
            f"listener.name.{listener}.plain.sasl.jaas.config": (
                f'{PLAIN_LOGIN_MODULE} required username="{self.username}" password="{self.password}" '
                f'user_{self.username}="{self.password}";'
            ),
        }

    def client_settings(self) -> dict[str, str]:
        """librdkafka's names (and so tierlog's -X, the Spark connector's kafka.* options)."""
        return {
            "security.protocol": CLIENT_LISTENER,
            "sasl.mechanism": SASL_MECHANISM,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.ca_file),
        }

    def java_client_settings(self) -> dict[str, str]:
        """The Java client's names, for Kafka's own tools."""
        return {
            "security.protocol": CLIENT_LISTENER,
            "sasl.mechanism": SASL_MECHANISM,
            "sasl.jaas.config": self.jaas_config(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
        }

    @classmethod
    def load(cls, directory: Path) -> LocalSecurity:
        """The material `generate` wrote in `directory` (for a command that finds a running cluster)."""
        settings = parse_properties((directory / _CLIENT_CONFIG_FILE_NAME).read_text())
        return cls(directory, settings["sasl.username"], settings["sasl.password"])


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _properties(settings: dict[str, str]) -> bytes:
    lines = [
        "# written by tierlog for its local cluster's SASL_SSL listener",
        *(f"{k}={v}" for k, v in settings.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def _write_private(path: Path, content: bytes) -> None:
    """Write `content` to `path`, readable by its owner only from the first byte."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
