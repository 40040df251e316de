"""tierlog's own client (KafkaConnection with a SASL ClientSecurity) authenticates with SCRAM-SHA-256/512 and PLAIN
against the broker's authenticator and connection task, served in this process on a real socket; a refusal is a
KafkaConnectionError with the broker's message (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sasl_helpers import settings

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import api_versions_request
from tierlog.client.security import ClientSecurity
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.server.connection import serve_connection
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.server.request_context import principal


class RecordingApis:
    """Stands in for KafkaApis behind the connection: answers ApiVersions and records who asked."""

    def __init__(self) -> None:
        self.principals: list[str] = []
        self.handlers = {18: self.handle}

    async def handle(self, request: Request) -> Any:
        self.principals.append(str(principal()))
        s = response_schema(18, request.api_version)
        return s.ApiVersionsResponse(
            error_code=error_code(None),
            api_keys=(),
            throttle_time=NO_THROTTLE,
            supported_features=(),
            finalized_features_epoch=-1,
            finalized_features=(),
            zk_migration_ready=False,
        )


def sasl(user: str, password: str, mechanism: str) -> ClientSecurity:
    return ClientSecurity("SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username=user, sasl_password=password)


async def authenticate_and_ask(security: ClientSecurity) -> list[str]:
    # serve_connection needs only `handlers` and `handle` of KafkaApis.
    apis: Any = RecordingApis()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(
            reader,
            writer,
            apis,
            1 << 20,
            "SASL",
            security_protocol="SASL_PLAINTEXT",
            sasl=settings(),
        )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        connection = await KafkaConnection.open("127.0.0.1", port, client_id="t", timeout_s=10, security=security)
        try:
            await connection.send(api_versions_request(version=3), timeout_s=10)
        finally:
            await connection.close()
    finally:
        server.close()
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
