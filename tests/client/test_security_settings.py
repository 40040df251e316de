"""Client security settings: the Java client's names mapped onto librdkafka's, and librdkafka's made into the
ClientSecurity of tierlog's own connections; every refusal one line naming the setting."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from tierlog.client.security_settings import (
    SecuritySettingError,
    client_security,
    parse_jaas_config,
    to_librdkafka,
)

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="s3cret";'
SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="bob" password="p w\\"x";'


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def pem_files(ca: trustme.CA, tmp_path: Path) -> dict[str, Path]:
    """The CA certificate, and a client certificate with its key in one PEM file (Kafka's PEM key store)."""
    client = ca.issue_cert("client@example.com")
    ca_file, keystore = tmp_path / "ca.pem", tmp_path / "client.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client.private_key_and_cert_chain_pem.write_to_path(str(keystore))
    return {"ca": ca_file, "keystore": keystore}


def test_jaas_plain_and_scram_give_username_and_password() -> None:
    assert parse_jaas_config(PLAIN_JAAS) == ("alice", "s3cret")
    assert parse_jaas_config(SCRAM_JAAS) == ("bob", 'p w"x')
    bare = "org.apache.kafka.common.security.plain.PlainLoginModule required username=carol password=pw ;"
    assert parse_jaas_config(bare) == ("carol", "pw")


@pytest.mark.parametrize(
    ("jaas", "problem"),
    [
        ("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;", "login module"),
        ("org.apache.kafka.common.security.plain.PlainLoginModule always username='a';", "control flag"),
        (
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="b"',
            "not terminated by semi-colon",
        ),
        ('org.apache.kafka.common.security.plain.PlainLoginModule required username="a";', "has no password"),
        ("PlainLoginModule", "control flag not specified"),
    ],
)
def test_bad_jaas_config_is_one_line_naming_the_option(jaas: str, problem: str) -> None:
    with pytest.raises(SecuritySettingError) as error:
        to_librdkafka({"sasl.jaas.config": jaas}, lambda key: f"option 'kafka.{key}'")
    message = str(error.value)
    assert message.startswith("option 'kafka.sasl.jaas.config': ")
    assert problem in message
    assert "\n" not in message


def test_java_names_become_librdkafka_names(pem_files: dict[str, Path]) -> None:
    settings, origin = to_librdkafka(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": PLAIN_JAAS,
            "ssl.truststore.location": str(pem_files["ca"]),
            "ssl.truststore.type": "PEM",
            "ssl.keystore.location": str(pem_files["keystore"]),
            "ssl.keystore.type": "pem",
            "ssl.key.password": "kp",
            "ssl.endpoint.identification.algorithm": "",
            "linger.ms": "5",
        }
    )
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
        "ssl.ca.location": str(pem_files["ca"]),
        "ssl.certificate.location": str(pem_files["keystore"]),
        "ssl.key.location": str(pem_files["keystore"]),
        "ssl.key.password": "kp",
        "ssl.endpoint.identification.algorithm": "none",
        "linger.ms": "5",
    }
    assert origin["sasl.password"] == "sasl.jaas.config"
    assert origin["ssl.key.location"] == "ssl.keystore.location"
    assert origin["linger.ms"] == "linger.ms"


def test_inline_pem_stores_become_librdkafka_pem_settings() -> None:
    settings, _ = to_librdkafka({"ssl.truststore.certificates": "CA", "ssl.keystore.certificate.chain": "C"})
    assert settings == {"ssl.ca.pem": "CA", "ssl.certificate.pem": "C"}
    settings, _ = to_librdkafka({"ssl.keystore.key": "K"})
    assert settings == {"ssl.key.pem": "K"}


def test_librdkafka_names_pass_unchanged() -> None:
    given = {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "a", "sasl.password": "b", "acks": "all"}
    assert to_librdkafka(given)[0] == given


@pytest.mark.parametrize(
    ("settings", "named", "problem"),
    [
        ({"ssl.truststore.location": "/x/ca.jks"}, "ssl.truststore.location", "only PEM truststores"),
        (
            {"ssl.truststore.location": "/x/ca", "ssl.truststore.type": "JKS"},
            "ssl.truststore.type",
            "not JKS",
        ),
        ({"ssl.keystore.location": "/x/k.p12"}, "ssl.keystore.location", "keystores are supported, not PKCS12"),
        ({"ssl.keystore.type": "PKCS12"}, "ssl.keystore.type", "only PEM keystores"),
        (
            {"ssl.truststore.location": "/x/ca.pem", "ssl.truststore.password": "pw"},
            "ssl.truststore.password",
            "takes no password",
        ),
        (
            {"ssl.keystore.location": "/x/k.pem", "ssl.keystore.password": "pw"},
            "ssl.keystore.password",
            "ssl.key.password",
        ),
        (
            {"sasl.jaas.config": PLAIN_JAAS, "sasl.username": "mallory"},
            "sasl.jaas.config",
            "conflicts with option 'kafka.sasl.username'",
        ),
    ],
)
def test_stores_librdkafka_cannot_read_are_refused(settings: dict[str, str], named: str, problem: str) -> None:
    with pytest.raises(SecuritySettingError) as error:
        to_librdkafka(settings, lambda key: f"option 'kafka.{key}'")
    assert str(error.value).startswith(f"option 'kafka.{named}': ")
    assert problem in str(error.value)


def test_plaintext_is_the_default() -> None:
    security = client_security({})
    assert security.protocol == "PLAINTEXT"
    assert security.ssl_context is None
    assert security.sasl_mechanism is None


def test_sasl_plaintext_carries_mechanism_and_credentials() -> None:
    security = client_security(
        {"security.protocol": "sasl_plaintext", "sasl.mechanisms": "plain", "sasl.username": "a", "sasl.password": "b"}
    )
    assert (security.protocol, security.sasl_mechanism, security.sasl_username, security.sasl_password) == (
        "SASL_PLAINTEXT",
        "PLAIN",
        "a",
        "b",
    )
    assert security.ssl_context is None
    assert security.uses_sasl and not security.uses_tls


def test_sasl_ssl_trusts_the_given_ca_and_checks_host_names(pem_files: dict[str, Path], ca: trustme.CA) -> None:
    security = client_security(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "a",
            "sasl.password": "b",
            "ssl.ca.location": str(pem_files["ca"]),
        }
    )
    context = security.ssl_context
    assert context is not None
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    subjects = [dict(entry[0] for entry in cert["subject"]) for cert in context.get_ca_certs()]
    assert any("trustme" in subject.get("organizationName", "") for subject in subjects)


def test_ssl_with_a_client_certificate_and_no_host_name_check(pem_files: dict[str, Path]) -> None:
    keystore = str(pem_files["keystore"])
    security = client_security(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(pem_files["ca"]),
            "ssl.certificate.location": keystore,
            "ssl.key.location": keystore,
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert security.ssl_context is not None
    assert not security.ssl_context.check_hostname
    assert security.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert security.sasl_mechanism is None


def test_inline_pem_certificate_and_key_load(ca: trustme.CA) -> None:
    client = ca.issue_cert("client@example.com")
    security = client_security(
        {
            "security.protocol": "SSL",
            "ssl.ca.pem": ca.cert_pem.bytes().decode(),
            "ssl.certificate.pem": client.cert_chain_pems[0].bytes().decode(),
            "ssl.key.pem": client.private_key_pem.bytes().decode(),
        }
    )
    assert security.ssl_context is not None


def test_verification_off_accepts_any_certificate() -> None:
    security = client_security({"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"})
    assert security.ssl_context is not None
    assert security.ssl_context.verify_mode == ssl.CERT_NONE and not security.ssl_context.check_hostname


@pytest.mark.parametrize(
    ("settings", "named", "problem"),
    [
        ({"security.protocol": "TLS"}, "security.protocol", "must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "sasl.mechanisms", "needs sasl.mechanism"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism", "not 'GSSAPI'"),
        (
            {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
            "ssl.ca.location",
            "not a readable PEM certificate file",
        ),
        ({"security.protocol": "SSL", "ssl.ca.pem": "not a pem"}, "ssl.ca.pem", "not a readable PEM"),
        (
            {"security.protocol": "SSL", "ssl.certificate.location": "/x.pem"},
            "ssl.certificate.location",
            "needs both",
        ),
        (
            {"security.protocol": "SSL", "ssl.certificate.location": "/x.pem", "ssl.key.location": "/x.pem"},
            "ssl.certificate.location",
            "cannot load the certificate and key",
        ),
        ({"security.protocol": "SSL", "ssl.key.pem": "K"}, "ssl.key.pem", "needs both"),
        (
            {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"},
            "ssl.endpoint.identification.algorithm",
            "https or none",
        ),
        (
            {"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"},
            "enable.ssl.certificate.verification",
            "true or false",
        ),
    ],
)
def test_unusable_settings_are_one_line_naming_the_setting(settings: dict[str, str], named: str, problem: str) -> None:
    with pytest.raises(SecuritySettingError) as error:
        client_security(settings, lambda key: f"client setting {key}")
    message = str(error.value)
    assert message.startswith(f"client setting {named}: "), message
    assert problem in message
    assert "\n" not in message


def test_sasl_without_credentials_says_which_is_missing() -> None:
    with pytest.raises(SecuritySettingError, match=r"needs sasl\.password"):
        client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "a"})


def test_wrong_key_password_is_refused(ca: trustme.CA, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    client = ca.issue_cert("client@example.com")
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"right"),
    )
    keystore = tmp_path / "client.pem"
    keystore.write_bytes(encrypted + client.cert_chain_pems[0].bytes())
    settings = {
        "security.protocol": "SSL",
        "ssl.certificate.location": str(keystore),
        "ssl.key.location": str(keystore),
    }
    assert client_security({**settings, "ssl.key.password": "right"}).ssl_context is not None
    with pytest.raises(SecuritySettingError, match=r"^setting 'ssl\.certificate\.location': cannot load"):
        client_security({**settings, "ssl.key.password": "wrong"})
