"""Certificates for the TLS tests (trustme, written to tmp_path) and the broker settings that use them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

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
