"""The SASL_SSL material of `tierlog cluster up --secure`: a CA and a broker certificate clients verify for
127.0.0.1 and localhost, the admin user in the listener's JAAS config, the client settings in librdkafka's and
Java's names, and a cluster whose brokers serve clients on SASL_SSL and each other on PLAINTEXT on 127.0.0.1."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest

from tierlog.client.security_settings import client_security, to_librdkafka
from tierlog.config import parse_properties
from tierlog.testing.local_cluster import BrokerProcess, LocalCluster
from tierlog.testing.local_security import LocalSecurity


@pytest.fixture
def security(tmp_path: Path) -> LocalSecurity:
    return LocalSecurity.generate(tmp_path / "security")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> None:
    """A TLS handshake between the two contexts in memory; raises ssl.SSLError when the client refuses."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    client_side = client.wrap_bio(to_client, to_server, server_hostname=host)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def _overrides(broker: BrokerProcess) -> dict[str, str]:
    """The server.properties the broker process is started with (its --override arguments)."""
    args = broker.command()
    return dict(arg.split("=", 1) for arg in args[args.index("--override") + 1 :: 2])


def _server_context(security: LocalSecurity) -> ssl.SSLContext:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(security.keystore_file)
    return server


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_clients_trusting_the_ca_accept_the_broker_certificate(security: LocalSecurity, host: str) -> None:
    client = client_security(security.client_settings()).ssl_context
    assert client is not None and client.check_hostname
    _handshake(_server_context(security), client, host)


def test_another_host_name_is_refused(security: LocalSecurity) -> None:
    client = client_security(security.client_settings()).ssl_context
    assert client is not None
    with pytest.raises(ssl.SSLCertVerificationError, match=r"127\.0\.0\.2"):
        _handshake(_server_context(security), client, "127.0.0.2")


def test_a_client_without_the_ca_refuses_the_broker(security: LocalSecurity) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake(_server_context(security), ssl.create_default_context(), "127.0.0.1")


def test_client_files_hold_the_settings_and_only_their_owner_reads_secrets(security: LocalSecurity) -> None:
    librdkafka = parse_properties(security.client_config_file.read_text())
    assert librdkafka == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": security.password,
        "ssl.ca.location": str(security.ca_file),
    }
    java = parse_properties(security.java_client_config_file.read_text())
    # The Java names say the same thing: mapped to librdkafka's they are the other file.
    assert to_librdkafka(java)[0] == librdkafka
    for path in (security.keystore_file, security.client_config_file, security.java_client_config_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert LocalSecurity.load(security.directory) == security
    assert len(security.password) >= 20


def test_each_cluster_gets_its_own_password(tmp_path: Path) -> None:
    assert LocalSecurity.generate(tmp_path / "a").password != LocalSecurity.generate(tmp_path / "b").password


def test_secured_cluster_serves_clients_on_sasl_ssl_and_brokers_on_internal_plaintext(
    security: LocalSecurity, tmp_path: Path
) -> None:
    cluster = LocalCluster(tmp_path, brokers=2, security=security)
    overrides = _overrides(cluster.broker(2))
    client_port, internal_port = cluster.broker(2).port, cluster.broker(2).probe_port
    assert client_port != internal_port
    assert overrides["listeners"] == f"SASL_SSL://127.0.0.1:{client_port},INTERNAL://127.0.0.1:{internal_port}"
    assert overrides["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert overrides["inter.broker.listener.name"] == "INTERNAL"
    assert overrides["ssl.keystore.type"] == "PEM"
    assert overrides["ssl.keystore.location"] == str(security.keystore_file)
    assert overrides["sasl.enabled.mechanisms"] == "PLAIN"
    assert overrides["listener.name.sasl_ssl.plain.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{security.password}" user_admin="{security.password}";'
    )
    controller = _overrides(cluster.broker(1))
    assert controller["listeners"].endswith(f",CONTROLLER://{cluster.controller_address}")
    assert cluster.bootstrap == ",".join(f"127.0.0.1:{cluster.broker(n).port}" for n in (1, 2))
    assert cluster.internal_bootstrap == ",".join(f"127.0.0.1:{cluster.broker(n).probe_port}" for n in (1, 2))


def test_a_secured_cluster_sets_its_listener_map_itself(security: LocalSecurity, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"inter\.broker\.listener\.name is set per node"):
        LocalCluster(tmp_path, brokers=1, overrides={"inter.broker.listener.name": "X"}, security=security)


def test_an_unsecured_cluster_probes_its_client_port(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=1)
    assert cluster.broker(1).probe_port == cluster.broker(1).port
    assert cluster.internal_bootstrap == cluster.bootstrap
