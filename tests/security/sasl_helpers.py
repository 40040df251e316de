"""What the SASL tests share: a JAAS config with users, SCRAM credentials made by scramp, request frames, and an
authenticator driven frame by frame (docs/security.md#sasl)."""

from __future__ import annotations

from typing import Any

from scramp import ScramMechanism

from tierlog.client.requests import request_schema
from tierlog.client.wire import decode_response, encode_request
from tierlog.metadata.image import ScramCredential
from tierlog.protocol.api_versions import SUPPORTED_APIS
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.security.sasl import PLAIN, SUPPORTED_MECHANISMS, SaslServer
from tierlog.security.sasl_plain import PlainSaslServer
from tierlog.security.sasl_scram import ScramSaslServer
from tierlog.server.sasl_authenticator import SaslAuthenticator, SaslServerSettings

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
    mechanisms: tuple[str, ...] = SUPPORTED_MECHANISMS, *, max_receive_size: int = 524288, timeout_ms: int = 30000
) -> SaslServerSettings:
    def new_server(mechanism: str) -> SaslServer:
        if mechanism == PLAIN:
            return PlainSaslServer(PLAIN_USERS)
        return ScramSaslServer(mechanism, lambda user, m: SCRAM_CREDENTIALS.get((user, m)))

    return SaslServerSettings(mechanisms, new_server, max_receive_size, timeout_ms)


def authenticator(mechanisms: tuple[str, ...] = SUPPORTED_MECHANISMS) -> SaslAuthenticator:
    return SaslAuthenticator(settings(mechanisms), SUPPORTED_APIS)


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
