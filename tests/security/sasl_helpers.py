"""What the SASL tests share: a JAAS config with users, SCRAM credentials made by scramp, request frames, and an
authenticator driven frame by frame (docs/security.md#sasl)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from scramp import ScramMechanism

from tierlog.client.requests import request_schema
from tierlog.client.wire import decode_response, encode_request
from tierlog.metadata.image import ScramCredential
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.security.sasl import PLAIN, SUPPORTED_MECHANISMS, SaslServer
from tierlog.security.sasl_plain import PlainSaslServer
from tierlog.security.sasl_scram import ScramSaslServer
from tierlog.server.connection import serve_connection
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.server.request_context import principal
from tierlog.server.sasl_authenticator import SaslAuthenticator, SaslServerSettings, SaslSession

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";'
)
PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
SCRAM_PASSWORDS = {"carol": "carol-secret"}


def scram_credential(mechanism: str, password: str, iterations: int = 4096) -> ScramCredential:
    salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(password, iteration_count=iterations)
    return ScramCredential(salt, stored_key, server_key, count)


SCRAM_CREDENTIALS = {
    (user, mechanism): scram_credential(mechanism, password)
    for user, password in SCRAM_PASSWORDS.items()
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
}


def settings(
    mechanisms: tuple[str, ...] = SUPPORTED_MECHANISMS,
    *,
    max_receive_size: int = 524288,
    timeout_ms: int = 30000,
    max_reauth_ms: int = 0,
) -> SaslServerSettings:
    def new_server(mechanism: str) -> SaslServer:
        if mechanism == PLAIN:
            return PlainSaslServer(PLAIN_USERS)
        return ScramSaslServer(mechanism, lambda user, m: SCRAM_CREDENTIALS.get((user, m)))

    return SaslServerSettings(mechanisms, new_server, max_receive_size, timeout_ms, max_reauth_ms)


def authenticator(
    mechanisms: tuple[str, ...] = SUPPORTED_MECHANISMS,
    *,
    max_reauth_ms: int = 0,
    reauthenticating: SaslSession | None = None,
) -> SaslAuthenticator:
    return SaslAuthenticator(
        settings(mechanisms, max_reauth_ms=max_reauth_ms), SUPPORTED_APIS, reauthenticating=reauthenticating
    )


CORRELATION_ID = 7
_REQUEST_NAMES = {17: "SaslHandshakeRequest", 18: "ApiVersionsRequest", 36: "SaslAuthenticateRequest"}


def request(api_key: int, version: int, **fields: Any) -> Any:
    return getattr(request_schema(api_key, version), _REQUEST_NAMES[api_key])(**fields)


def frame(entity: Any) -> bytes:
    """The request's frame without its size prefix, as the connection hands it to the authenticator."""
    return encode_request(entity, CORRELATION_ID, "test-client")[SIZE_PREFIX.size :]


def handshake(mechanism: str, version: int = 1) -> Any:
    return request(17, version, mechanism=mechanism)


def authenticate(token: bytes, version: int = 2) -> Any:
    return request(36, version, auth_bytes=token)


def answer(entity: Any, sent: bytes) -> Any:
    """The response the authenticator sent (a whole frame, size prefix included) to `entity`."""
    (size,) = SIZE_PREFIX.unpack_from(sent)
    assert size == len(sent) - SIZE_PREFIX.size
    return decode_response(entity, CORRELATION_ID, sent[SIZE_PREFIX.size :])


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


@contextlib.asynccontextmanager
async def serving_sasl(apis: RecordingApis, sasl: SaslServerSettings) -> AsyncIterator[int]:
    """The broker's connection task on a SASL_PLAINTEXT listener of this process, in front of `apis`; yields the
    port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # serve_connection needs only `handlers` and `handle` of KafkaApis.
        kafka_apis: Any = apis
        await serve_connection(
            reader, writer, kafka_apis, 1 << 20, "SASL", security_protocol="SASL_PLAINTEXT", sasl=sasl
        )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
