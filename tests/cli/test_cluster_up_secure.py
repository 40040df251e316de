"""`tierlog cluster up --secure`: clients are served on SASL_SSL (PLAIN, a generated admin user, a generated CA
and broker certificate) and the brokers talk to each other on PLAINTEXT bound to 127.0.0.1. The client settings
it writes work as they are with `tierlog ... --command-config` and `kcat -F`; a client without them, or with a
wrong password, is refused. Needs the brokers' TLS (branch sec-tls) and SASL/PLAIN (branch sec-sasl)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from cli_helpers import CLUSTER_START_S, CliCluster, tierlog

from tierlog.cli.cluster import read_cluster_info
from tierlog.config import parse_properties

pytestmark = pytest.mark.cluster


def test_secure_cluster_serves_clients_with_the_settings_it_writes(cli_cluster: CliCluster) -> None:
    up = cli_cluster.tierlog(
        "cluster", "up", "--secure", "-n", "2", "--timeout", str(CLUSTER_START_S), timeout_s=CLUSTER_START_S + 30
    )
    assert up.returncode == 0, up.stderr
    info = read_cluster_info(cli_cluster.directory)
    security_dir = cli_cluster.directory / "security"
    client_config = security_dir / "client.properties"
    assert info.client_config == str(client_config)
    assert f"client settings (librdkafka: tierlog --command-config FILE, kcat -F FILE): {client_config}" in up.stdout
    assert f"(Java: Kafka's tools' --command-config FILE): {security_dir / 'client-java.properties'}" in up.stdout
    assert "brokers talk to each other unencrypted and unauthenticated on PLAINTEXT" in up.stdout
    assert "bound to 127.0.0.1 only (listener INTERNAL)" in up.stdout
    for node in info.nodes:
        assert node.overrides is not None
        assert node.overrides["listeners"].startswith(f"SASL_SSL://{node.kafka},INTERNAL://127.0.0.1:")
        assert node.internal is not None and node.internal.startswith("127.0.0.1:")

    secured = ("-b", info.bootstrap, "--command-config", str(client_config))
    created = tierlog("topic", "create", "secrets", "-p", "1", "-r", "2", *secured)
    assert created.code == 0, created.stderr
    produced = tierlog("produce", "secrets", "-v", "one", "-v", "two", *secured)
    assert (produced.code, produced.first_line) == (0, "Produced 2 records to secrets"), produced.stderr
    consumed = tierlog("consume", "secrets", "-n", "2", "-f", "%v\\n", *secured)
    assert consumed.code == 0, consumed.stderr
    assert consumed.stdout.splitlines() == ["one", "two"]
    elected = tierlog("cluster", "elect-leaders", "--topic", "secrets", *secured)
    assert elected.code == 0, elected.stderr

    # The same settings through -X, librdkafka's names as kcat takes them.
    settings = parse_properties(client_config.read_text())
    x_options = [arg for key, value in settings.items() for arg in ("-X", f"{key}={value}")]
    listed = tierlog("topic", "list", "-b", info.bootstrap, *x_options)
    assert listed.code == 0, listed.stderr
    assert "secrets" in listed.stdout

    wrong = tierlog("topic", "list", *secured, "-X", "sasl.password=wrong", "--timeout", "5")
    assert wrong.code == 1
    assert wrong.first_error_line.startswith("Error: listing topics: authentication failed: "), wrong.stderr
    assert "Invalid username or password" in wrong.first_error_line
    for command, said in (
        (("produce", "secrets", "-v", "x"), "Error: 1 of 1 record not acknowledged: authentication failed: "),
        (("groups", "list"), "Error: listing groups: authentication failed: "),
    ):
        refused = tierlog(*command, *secured, "-X", "sasl.username=nobody", "--timeout", "5")
        assert refused.code == 1
        assert refused.first_error_line.startswith(said), refused.stderr

    plaintext = tierlog("topic", "list", "-b", info.bootstrap, "--timeout", "5")
    assert plaintext.code == 1
    assert "is it a TLS listener (then set -X security.protocol=SSL or SASL_SSL)" in plaintext.first_error_line

    if shutil.which("kcat") is not None:
        kcat = subprocess.run(
            ["kcat", "-F", str(client_config), "-b", info.bootstrap, "-C", "-t", "secrets", "-e", "-q", "-f", "%s\\n"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert kcat.returncode == 0, kcat.stderr
        assert kcat.stdout.splitlines() == ["one", "two"]

    down = cli_cluster.tierlog("cluster", "down", "--purge")
    assert down.returncode == 0, down.stderr
