"""The probes over TLS (security.protocol SSL or SASL_SSL): the handshake is made with the ClientSecurity's
context and the broker's certificate checked, then ApiVersions is asked as in plaintext. The CLI's reachability
check tells a failed handshake in one line."""

from __future__ import annotations

import ssl
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import trustme
from client_helpers import HOST, Answer, scripted_peer

from tierlog.cli.clients import CliError, ensure_reachable
from tierlog.client.probes import api_versions_answered, metadata_broker_ids
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.client.security_settings import client_security

TlsPeer = Callable[[Answer], int]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_peer(ca: trustme.CA) -> Iterator[TlsPeer]:
    """One-connection TLS peers with a certificate for 127.0.0.1 signed by `ca`."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    with ExitStack() as peers:
        yield lambda answer: peers.enter_context(scripted_peer(answer, tls=server))


def api_versions_answer(frame: bytes) -> bytes:
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    body = struct.pack(">ihi", correlation_id, 0, 1) + struct.pack(">hhh", 18, 0, 4)
    return struct.pack(">i", len(body)) + body


def trusting(ca: trustme.CA, tmp_path: Path, protocol: str = "SSL") -> ClientSecurity:
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings = {"security.protocol": protocol, "ssl.ca.location": str(ca_file)}
    if protocol == "SASL_SSL":
        settings |= {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    return client_security(settings)


def test_a_tls_listener_answers_api_versions_to_a_client_trusting_its_ca(
    tls_peer: TlsPeer, ca: trustme.CA, tmp_path: Path
) -> None:
    assert api_versions_answered(HOST, tls_peer(api_versions_answer), 5, trusting(ca, tmp_path))


def test_an_untrusted_certificate_is_not_an_answer(tls_peer: TlsPeer, tmp_path: Path) -> None:
    assert not api_versions_answered(HOST, tls_peer(api_versions_answer), 5, trusting(trustme.CA(), tmp_path))


def test_a_plaintext_probe_of_a_tls_listener_gets_no_answer(tls_peer: TlsPeer) -> None:
    assert not api_versions_answered(HOST, tls_peer(api_versions_answer), 2, PLAINTEXT)


def test_metadata_probe_refuses_to_ask_a_sasl_listener(ca: trustme.CA, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot authenticate"):
        metadata_broker_ids(HOST, 9, 1, trusting(ca, tmp_path, "SASL_SSL"))


def test_the_cli_reachability_check_passes_over_tls(tls_peer: TlsPeer, ca: trustme.CA, tmp_path: Path) -> None:
    ensure_reachable(f"{HOST}:{tls_peer(api_versions_answer)}", 5, trusting(ca, tmp_path, "SASL_SSL"))


def test_the_cli_tells_a_failed_handshake_in_one_line(tls_peer: TlsPeer, tmp_path: Path) -> None:
    address = f"{HOST}:{tls_peer(api_versions_answer)}"
    with pytest.raises(CliError) as error:
        ensure_reachable(address, 5, trusting(trustme.CA(), tmp_path))
    assert error.value.message.startswith(f"TLS handshake with {address} failed (certificate verify failed: ")
    assert "\n" not in error.value.message


def test_the_cli_suggests_tls_when_a_plaintext_probe_gets_no_answer(tls_peer: TlsPeer) -> None:
    address = f"{HOST}:{tls_peer(api_versions_answer)}"
    with pytest.raises(CliError) as error:
        ensure_reachable(address, 2, PLAINTEXT)
    assert "is it a TLS listener (then set -X security.protocol=SSL or SASL_SSL)" in error.value.message
