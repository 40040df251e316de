"""SASL settings as Kafka's brokers read them: the JAAS config syntax, per-listener mechanisms and JAAS configs,
the inter-broker and controller credentials, and the one-line refusals of what cannot work
(docs/security.md#sasl)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sasl_helpers import PLAIN_JAAS

from tierlog.client.security import ClientSecurity
from tierlog.config import KafkaConfig
from tierlog.config_def import ConfigException
from tierlog.security.jaas import JaasConfigError, parse_jaas_config
from tierlog.testing.local_cluster import free_port

SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="s";'
SASL_LISTENER = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:9092",
    "sasl.enabled.mechanisms": "PLAIN",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
}


def test_kafkas_jaas_syntax_gives_the_module_its_flag_and_options() -> None:
    module = parse_jaas_config(PLAIN_JAAS)
    assert module.class_name == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert module.control_flag == "required"
    assert (module.username, module.password) == ("admin", "admin-secret")
    assert module.plain_users() == {"admin": "admin-secret", "alice": "alice-secret"}


def test_jaas_values_may_be_bare_words_or_quoted_with_escapes_and_comments_are_skipped() -> None:
    module = parse_jaas_config(
        "org.apache.kafka.common.security.plain.PlainLoginModule REQUIRED /* the broker */ username=admin\n"
        "  password='it\\'s' // trailing comment\n"
        '  user_bob="say \\"hi\\"; ok" ;'
    )
    assert module.control_flag == "required"
    assert module.options == {"username": "admin", "password": "it's", "user_bob": 'say "hi"; ok'}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Login module not specified in JAAS config"),
        ("org.Module", "Login module control flag not specified in JAAS config"),
        ("org.Module mandatory;", "Invalid login module control flag 'mandatory' in JAAS config"),
        ('org.Module required username="a"', "JAAS config entry not terminated by semi-colon"),
        ("org.Module required username=;", "Value not specified for key 'username' in JAAS config"),
        ("org.A required; org.B required;", "JAAS config property contains 2 login modules, should be 1 module"),
        ('org.Module required username="a;', "Unterminated quoted value in JAAS config"),
    ],
)
def test_a_malformed_jaas_config_is_refused_with_kafkas_message(text: str, message: str) -> None:
    with pytest.raises(JaasConfigError) as refused:
        parse_jaas_config(text)
    assert str(refused.value) == message


def test_a_sasl_plaintext_listener_with_plain_users_starts_and_gives_the_broker_its_credentials() -> None:
    config = KafkaConfig(SASL_LISTENER)
    assert config.sasl_enabled_mechanisms("SASL_PLAINTEXT") == ["PLAIN"]
    assert config.inter_broker_client_security() == ClientSecurity(
        "SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="admin", sasl_password="admin-secret"
    )
    assert config.unused_keys() == []


def test_a_listener_level_mechanism_list_overrides_the_broker_wide_one() -> None:
    config = KafkaConfig(
        {
            **SASL_LISTENER,
            "listeners": "SASL_PLAINTEXT://127.0.0.1:9092,EXTERNAL://127.0.0.1:9094",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
            "listener.name.external.sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
        }
    )
    assert config.sasl_enabled_mechanisms("EXTERNAL") == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    assert config.sasl_enabled_mechanisms("SASL_PLAINTEXT") == ["PLAIN"]


def test_the_controller_channel_authenticates_with_the_controller_listeners_credentials() -> None:
    config = KafkaConfig(
        {
            **SASL_LISTENER,
            "process.roles": "broker",
            "node.id": "2",
            "controller.quorum.voters": "1@127.0.0.1:9093",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            "sasl.mechanism.controller.protocol": "SCRAM-SHA-256",
            "listener.name.controller.sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.controller.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
        }
    )
    assert config.controller_client_security() == ClientSecurity(
        "SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username="admin", sasl_password="s"
    )


def test_plaintext_listeners_need_no_sasl_settings_and_connect_in_plaintext() -> None:
    config = KafkaConfig({})
    assert config.inter_broker_client_security() == ClientSecurity()
    assert config.controller_client_security() == ClientSecurity()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"sasl.enabled.mechanisms": "GSSAPI"},
            "sasl.enabled.mechanisms=GSSAPI for SASL listener SASL_PLAINTEXT: tierlog supports PLAIN, SCRAM-SHA-256, "
            "SCRAM-SHA-512, not GSSAPI (Kafka's default is GSSAPI): set sasl.enabled.mechanisms=PLAIN",
        ),
        ({"sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER"}, "not OAUTHBEARER"),
        ({"sasl.enabled.mechanisms": ""}, "No SASL mechanisms are enabled on listener SASL_PLAINTEXT"),
        (
            {"listener.name.sasl_plaintext.plain.sasl.jaas.config": None},
            "listener SASL_PLAINTEXT enables SASL mechanism PLAIN but has no users: set "
            "listener.name.sasl_plaintext.plain.sasl.jaas.config=",
        ),
        (
            {"listener.name.sasl_plaintext.plain.sasl.jaas.config": SCRAM_JAAS},
            "Invalid value (hidden) for configuration listener.name.sasl_plaintext.plain.sasl.jaas.config: the "
            "login module of PLAIN is org.apache.kafka.common.security.plain.PlainLoginModule",
        ),
        (
            {"listener.name.sasl_plaintext.plain.sasl.jaas.config": "PlainLoginModule required user_a=b"},
            "listener.name.sasl_plaintext.plain.sasl.jaas.config: JAAS config entry not terminated by semi-colon",
        ),
        (
            {"sasl.mechanism.inter.broker.protocol": "GSSAPI"},
            "sasl.mechanism.inter.broker.protocol=GSSAPI, but the inter-broker listener SASL_PLAINTEXT uses SASL",
        ),
        (
            {"sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256"},
            "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms when SASL is used "
            "for inter-broker communication",
        ),
        (
            {
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": "org.apache.kafka.common.security.plain."
                'PlainLoginModule required user_admin="x";'
            },
            "listener.name.sasl_plaintext.plain.sasl.jaas.config needs username and password: this broker's own "
            "credentials for inter-broker connections over PLAIN",
        ),
        ({"connections.max.reauth.ms": "-1"}, "Invalid value -1 for configuration connections.max.reauth.ms"),
        (
            {"listener.name.sasl_plaintext.plain.sasl.server.callback.handler.class": "com.example.Ldap"},
            "does not load SASL plugins",
        ),
        ({"listeners": "SASL_SSL://127.0.0.1:9092"}, "uses security protocol SASL_SSL, which tierlog does not"),
    ],
)
def test_a_sasl_setup_that_cannot_work_is_refused_with_one_line(settings: dict[str, str | None], message: str) -> None:
    props = {**SASL_LISTENER, **settings}
    with pytest.raises(ConfigException) as refused:
        KafkaConfig({key: value for key, value in props.items() if value is not None})
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
    assert "admin-secret" not in str(refused.value), "a refusal never shows a password"


def test_a_top_level_sasl_jaas_config_is_reported_unused_as_kafkas_broker_ignores_it() -> None:
    config = KafkaConfig({**SASL_LISTENER, "sasl.jaas.config": PLAIN_JAAS})
    assert config.unused_keys() == ["sasl.jaas.config"]


def test_tierlog_broker_with_a_sasl_listener_left_at_kafkas_gssapi_default_ends_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    log_dir = tmp_path / "data"
    args = [sys.executable, "-m", "tierlog", "broker"]
    for key, value in {"log.dirs": str(log_dir), "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}"}.items():
        args += ["--override", f"{key}={value}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0
    assert lines == [
        "Error: sasl.enabled.mechanisms=GSSAPI for SASL listener SASL_PLAINTEXT: tierlog supports PLAIN, "
        "SCRAM-SHA-256, SCRAM-SHA-512, not GSSAPI (Kafka's default is GSSAPI): set sasl.enabled.mechanisms=PLAIN"
    ]
    assert not log_dir.exists() or not any(log_dir.iterdir())
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen on the SASL port"
