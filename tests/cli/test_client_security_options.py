"""Every command that talks to brokers takes the client's security settings through `-X key=value` and
`--command-config FILE` (librdkafka's names, as kcat -X / -F): tierlog checks them itself first, naming the
setting in one line, and its own reachability probe speaks TLS when security.protocol says so, telling a failed
handshake in one line. Each test runs the real `tierlog` command."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from cli_helpers import tierlog

# One invocation of each command that talks to brokers, without the client options.
BROKER_COMMANDS = {
    "topic list": ["topic", "list"],
    "topic describe": ["topic", "describe", "t"],
    "topic create": ["topic", "create", "t"],
    "topic delete": ["topic", "delete", "t"],
    "topic alter-config": ["topic", "alter-config", "t", "--set", "retention.ms=1000"],
    "groups list": ["groups", "list"],
    "groups describe": ["groups", "describe", "g"],
    "groups delete": ["groups", "delete", "g"],
    "produce": ["produce", "t", "-v", "x"],
    "consume": ["consume", "t", "-n", "1"],
    "cluster elect-leaders": ["cluster", "elect-leaders"],
    "pipeline run": ["pipeline", "run", "-t", "t", "-o", "/tmp/tierlog-never-written"],
    "pipeline backfill": [
        "pipeline",
        "backfill",
        "-t",
        "t",
        "-o",
        "/tmp/tierlog-never-written",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ],
}
MISSING_CA = "client setting ssl.ca.location=/nonexistent/ca.pem ({origin}): not a readable PEM certificate file"


@pytest.mark.parametrize("command", sorted(BROKER_COMMANDS))
def test_every_broker_command_takes_security_settings_through_x(command: str) -> None:
    x_options = ["-X", "security.protocol=SSL", "-X", "ssl.ca.location=/nonexistent/ca.pem"]
    ran = tierlog(*BROKER_COMMANDS[command], "-b", "127.0.0.1:1", *x_options)
    assert ran.code == 1, ran.stderr
    assert ran.first_error_line.startswith("Error: " + MISSING_CA.format(origin="-X")), ran.stderr


@pytest.mark.parametrize("command", ["topic list", "cluster elect-leaders", "pipeline run"])
def test_security_settings_come_from_command_config_too(command: str, tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=admin\n")
    ran = tierlog(*BROKER_COMMANDS[command], "-b", "127.0.0.1:1", "--command-config", str(config))
    assert ran.code == 1
    assert ran.first_error_line == "Error: security.protocol=SASL_SSL with PLAIN needs sasl.password", ran.stderr


def test_an_unsupported_mechanism_is_named(tmp_path: Path) -> None:
    x_options = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=GSSAPI"]
    ran = tierlog("topic", "list", "-b", "127.0.0.1:1", *x_options)
    assert ran.code == 1
    assert ran.first_error_line == (
        "Error: client setting sasl.mechanism=GSSAPI (-X): security.protocol=SASL_PLAINTEXT needs sasl.mechanism, "
        "one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, not 'GSSAPI'"
    )


@pytest.fixture
def tls_listener() -> Iterator[int]:
    """A TLS listener on 127.0.0.1 with a certificate from a CA no client here trusts; it takes any number of
    connections (librdkafka connects too) and closes each after the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(2)
            try:
                context.wrap_socket(connection, server_side=True).close()
            except (ssl.SSLError, OSError):
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_an_untrusted_broker_certificate_is_told_in_one_line(tls_listener: int, tmp_path: Path) -> None:
    ca_file = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))
    address = f"127.0.0.1:{tls_listener}"
    x_options = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={ca_file}", "--timeout", "5"]
    ran = tierlog("topic", "list", "-b", address, *x_options)
    assert ran.code == 1
    assert ran.first_error_line.startswith(
        f"Error: TLS handshake with {address} failed (certificate verify failed: "
    ), ran.stderr


def test_a_plaintext_client_of_a_tls_listener_is_told_to_set_the_protocol(tls_listener: int) -> None:
    address = f"127.0.0.1:{tls_listener}"
    ran = tierlog("topic", "list", "-b", address, "--timeout", "3")
    assert ran.code == 1
    assert "is it a TLS listener (then set -X security.protocol=SSL or SASL_SSL)" in ran.first_error_line
