"""tierlog's own client (KafkaConnection with a SASL ClientSecurity) authenticates with SCRAM-SHA-256/512 and PLAIN
against the broker's authenticator and connection task, served in this process on a real socket; a refusal is a
KafkaConnectionError with the broker's message (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio

import pytest
from sasl_helpers import RecordingApis, serving_sasl, settings

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import api_versions_request
from tierlog.client.security import ClientSecurity


def sasl(user: str, password: str, mechanism: str) -> ClientSecurity:
    return ClientSecurity("SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username=user, sasl_password=password)


async def authenticate_and_ask(security: ClientSecurity) -> list[str]:
    apis = RecordingApis()
    async with serving_sasl(apis, settings()) as port:
        connection = await KafkaConnection.open("127.0.0.1", port, client_id="t", timeout_s=10, security=security)
        try:
            await connection.send(api_versions_request(version=3), timeout_s=10)
        finally:
            await connection.close()
    return apis.principals


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_client_authenticates_with_scram_and_requests_then_come_from_the_user(mechanism: str) -> None:
    security = ClientSecurity(
        "SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="carol", sasl_password="carol-secret"
    )
    assert asyncio.run(authenticate_and_ask(security)) == ["User:carol"]


def test_the_client_authenticates_with_plain() -> None:
    security = ClientSecurity(
        "SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="alice", sasl_password="alice-secret"
    )
    assert asyncio.run(authenticate_and_ask(security)) == ["User:alice"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_scram_password_is_a_connection_error_with_the_brokers_message(mechanism: str) -> None:
    security = sasl("carol", "nope", mechanism)
    with pytest.raises(KafkaConnectionError) as refused:
        asyncio.run(authenticate_and_ask(security))
    assert str(refused.value).endswith(
        "failed: Authentication failed during authentication due to invalid credentials with SASL mechanism "
        + mechanism
    )


def test_a_mechanism_the_listener_does_not_enable_names_the_enabled_ones() -> None:
    security = sasl("carol", "x", "GSSAPI")
    with pytest.raises(KafkaConnectionError) as refused:
        asyncio.run(authenticate_and_ask(security))
    assert "UNSUPPORTED_SASL_MECHANISM (its enabled mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)" in str(
        refused.value
    )
