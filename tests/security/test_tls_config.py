"""TLS settings at start-up: Kafka's ssl.* names, per-listener overrides, one line for anything unusable (a
listener without a key store, a JKS store, a file that cannot be read or is not PEM, bad mapping rules), and
the contexts of the broker's own connections."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from tls_helpers import TlsFiles, broker_tls_settings

from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException
from tierlog.testing.local_cluster import free_port

SSL_ONLY = {"listeners": "SSL://127.0.0.1:9094"}


def _refusal(settings: dict[str, str]) -> str:
    with pytest.raises(ConfigException) as refused:
        config = KafkaConfig(settings)
        config.server_ssl_context(config.listeners[0].name)
    return str(refused.value)


def test_an_ssl_listener_without_a_key_store_is_refused() -> None:
    assert _refusal(SSL_ONLY) == (
        "listeners: SSL://127.0.0.1:9094 uses security protocol SSL but has no key store: set ssl.keystore.location "
        "(a PEM file with the private key and certificate chain), or ssl.keystore.certificate.chain and "
        "ssl.keystore.key (or their listener.name.ssl.ssl.* forms)"
    )


def test_a_listener_mapped_to_ssl_needs_a_key_store_too() -> None:
    settings = {"listeners": "CLIENT://127.0.0.1:9094", "listener.security.protocol.map": "CLIENT:SSL"}
    assert "CLIENT://127.0.0.1:9094 uses security protocol SSL but has no key store" in _refusal(settings)


def test_jks_and_pkcs12_key_stores_are_refused_with_pem_named(tls_files: TlsFiles) -> None:
    for store_type in ("JKS", "PKCS12"):
        settings = {**SSL_ONLY, "ssl.keystore.type": store_type, "ssl.keystore.location": "/etc/kafka/broker.jks"}
        assert _refusal(settings) == (
            f"listeners: SSL://127.0.0.1:9094: ssl.keystore.type={store_type}: tierlog reads PEM key stores only "
            "(a PEM file with the private key and certificate chain); set ssl.keystore.type=PEM"
        )
    # Kafka's default type is JKS, so a PEM file needs ssl.keystore.type=PEM, as in Kafka.
    assert "ssl.keystore.type=JKS" in _refusal({**SSL_ONLY, "ssl.keystore.location": str(tls_files.keystore_path)})


def test_a_key_store_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    settings = {**SSL_ONLY, "ssl.keystore.type": "PEM", "ssl.keystore.location": str(missing)}
    assert _refusal(settings) == (
        f"listener SSL: ssl.keystore.location={missing}: cannot read it: No such file or directory"
    )


def test_a_key_store_file_that_is_not_pem_is_named(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    settings = {**SSL_ONLY, "ssl.keystore.type": "PEM", "ssl.keystore.location": str(garbage)}
    message = _refusal(settings)
    assert message.startswith(f"listener SSL: ssl.keystore.location={garbage}: not a PEM private key and certificate")
    assert "\n" not in message


def test_a_trust_store_that_is_not_pem_is_named(tls_files: TlsFiles, tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    settings = {
        **SSL_ONLY,
        **broker_tls_settings(tls_files, **{"ssl.client.auth": "required"}),
        "ssl.truststore.location": str(garbage),
    }
    assert _refusal(settings).startswith(f"listener SSL: ssl.truststore.location={garbage}: not PEM certificates")


def test_pem_stores_take_no_store_password(tls_files: TlsFiles) -> None:
    settings = {**SSL_ONLY, **broker_tls_settings(tls_files), "ssl.keystore.password": "secret"}
    assert _refusal(settings).startswith("ssl.keystore.password is set, but PEM stores take no store password")


def test_an_inline_key_store_and_trust_store_make_a_context(tls_files: TlsFiles) -> None:
    pem = tls_files.keystore_path.read_text()
    key_end = re.search(r"-----END [A-Z ]*PRIVATE KEY-----", pem).end()  # type: ignore[union-attr]
    config = KafkaConfig(
        {
            **SSL_ONLY,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.key": pem[:key_end],
            "ssl.keystore.certificate.chain": pem[key_end:],
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": tls_files.ca_path.read_text(),
            "ssl.client.auth": "required",
        }
    )
    context = config.server_ssl_context("SSL")
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED


def test_per_listener_settings_take_precedence(tls_files: TlsFiles, tmp_path: Path) -> None:
    config = KafkaConfig(
        {
            "listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9095",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tmp_path / "not-this-one.pem"),
            "listener.name.internal.ssl.keystore.location": str(tls_files.keystore_path),
            "listener.name.internal.ssl.client.auth": "requested",
        }
    )
    settings = config.ssl_settings("INTERNAL")
    assert settings.keystore_location == str(tls_files.keystore_path)
    assert settings.client_auth == "requested"
    assert config.ssl_settings("PLAINTEXT").keystore_location == str(tmp_path / "not-this-one.pem")
    assert config.server_ssl_context("PLAINTEXT") is None
    context = config.server_ssl_context("INTERNAL")
    assert context is not None and context.verify_mode == ssl.CERT_OPTIONAL


def test_a_per_listener_setting_is_validated_as_the_setting_itself() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"listener.name.ssl.ssl.client.auth": "always"})
    assert str(refused.value) == (
        "Invalid value always for configuration ssl.client.auth: String must be one of: required, requested, none"
    )


def test_a_per_listener_setting_spelled_with_an_upper_case_listener_name_is_refused() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"listener.name.SSL.ssl.client.auth": "required"})
    assert str(refused.value) == (
        "listener.name.SSL.ssl.client.auth is set, but listener names in per-listener settings are lower case: "
        "listener.name.ssl.ssl.client.auth"
    )


def test_ssl_settings_tierlog_does_not_read_are_refused() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"listener.name.ssl.ssl.engine.factory.class": "com.example.Factory"})
    assert str(refused.value) == (
        "listener.name.ssl.ssl.engine.factory.class is set, but tierlog does not support it: the TLS settings it "
        "reads are in docs/security.md#tls"
    )


def test_principal_mapping_rules_that_do_not_parse_are_refused() -> None:
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({"ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U"})
    assert str(refused.value).startswith(
        "Invalid value RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U for configuration ssl.principal.mapping.rules: "
        "Invalid rule"
    )


def test_tls_versions_and_suites_python_cannot_honour_are_refused(tls_files: TlsFiles) -> None:
    base = {**SSL_ONLY, **broker_tls_settings(tls_files)}
    assert _refusal({**base, "ssl.enabled.protocols": "TLSv1.1"}) == (
        "listeners: SSL://127.0.0.1:9094: ssl.enabled.protocols=TLSv1.1: tierlog supports TLSv1.2, TLSv1.3"
    )
    assert "which Python's ssl cannot restrict" in _refusal({**base, "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256"})
    assert "OpenSSL knows none of these suites" in _refusal({**base, "ssl.cipher.suites": "NO-SUCH-SUITE"})


def test_tls_versions_and_suites_are_applied(tls_files: TlsFiles) -> None:
    config = KafkaConfig(
        {
            **SSL_ONLY,
            **broker_tls_settings(tls_files),
            "ssl.enabled.protocols": "TLSv1.2",
            "ssl.cipher.suites": "ECDHE-ECDSA-AES128-GCM-SHA256",
        }
    )
    context = config.server_ssl_context("SSL")
    assert context is not None
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    assert [c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"] == ["ECDHE-ECDSA-AES128-GCM-SHA256"]


def test_the_inter_broker_and_controller_connections_use_their_listeners_tls(tls_files: TlsFiles) -> None:
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "SSL",
        **broker_tls_settings(tls_files),
    }
    config = KafkaConfig(settings)
    inter_broker = config.inter_broker_client_security()
    assert inter_broker.protocol == "SSL" and inter_broker.ssl_context is not None
    assert inter_broker.ssl_context.check_hostname
    controller = config.controller_client_security()
    assert controller.protocol == "SSL" and controller.ssl_context is not None
    no_host_check = KafkaConfig({**settings, "ssl.endpoint.identification.algorithm": ""})
    context = no_host_check.inter_broker_client_security().ssl_context
    assert context is not None and not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    plain = KafkaConfig({**settings, "inter.broker.listener.name": "PLAINTEXT"}).inter_broker_client_security()
    assert plain.protocol == "PLAINTEXT" and plain.ssl_context is None


def test_security_inter_broker_protocol_names_the_inter_broker_listener(tls_files: TlsFiles) -> None:
    settings = {"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9094", **broker_tls_settings(tls_files)}
    config = KafkaConfig({**settings, "security.inter.broker.protocol": "SSL"})
    assert config.inter_broker_listener_name == "SSL"
    assert config.inter_broker_client_security().protocol == "SSL"
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({**settings, "security.inter.broker.protocol": "SSL", "inter.broker.listener.name": "SSL"})
    assert (
        str(refused.value) == "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set."
    )


def test_describe_configs_hides_passwords_and_keys(tls_files: TlsFiles) -> None:
    config = KafkaConfig(
        {
            **SSL_ONLY,
            **broker_tls_settings(tls_files),
            "ssl.key.password": "secret",
            "listener.name.ssl.ssl.key.password": "secret2",
        }
    )
    described = {entry.name: entry for entry in config.describe_broker(per_broker=True)}
    for name in ("ssl.key.password", "listener.name.ssl.ssl.key.password", "ssl.keystore.key"):
        assert described[name].sensitive and described[name].value is None
        assert all(synonym.value is None for synonym in described[name].synonyms)
    assert described["ssl.keystore.location"].value == str(tls_files.keystore_path)


def test_the_broker_command_prints_one_line_for_an_unreadable_key_store(tmp_path: Path) -> None:
    missing = tmp_path / "broker.pem"
    settings = {
        "listeners": f"SSL://127.0.0.1:{free_port()}",
        "log.dirs": str(tmp_path / "data"),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(missing),
    }
    overrides = [arg for key, value in settings.items() for arg in ("--override", f"{key}={value}")]
    done = subprocess.run(
        [sys.executable, "-m", "tierlog", "broker", *overrides],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"Error: listener SSL: ssl.keystore.location={missing}: cannot read it: No such file or directory"
    )
