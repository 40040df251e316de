"""Kafka's SaslServerAuthenticator: the state machine a connection on a SASL_PLAINTEXT or SASL_SSL listener goes
through before it may send anything but ApiVersions and SaslHandshake. Frames in, response frames out: no sockets
(the connection's task, server/connection.py, carries them).

    [ApiVersions] -> SaslHandshake(mechanism) -> SaslAuthenticate(token) ... until the mechanism is complete

SaslHandshake v0 (before KIP-152) means the tokens that follow are bare size-prefixed frames without Kafka's
headers; v1 means they come in SaslAuthenticate requests. Any other request before authentication, a second
handshake, an unknown mechanism or a failed exchange ends the connection (after Kafka's answer where Kafka sends
one).

With connections.max.reauth.ms set, the final SaslAuthenticate answer carries that session lifetime, and a client
that sent SaslAuthenticate v1+ may re-authenticate (KIP-368) with a SaslHandshake on the authenticated connection:
a new authenticator for that connection takes the same mechanism and must end with the same principal. Rules:
docs/security.md#sasl.
"""

from __future__ import annotations

import datetime
import enum
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tierlog.config import KafkaConfig
from tierlog.protocol.api_versions import SUPPORTED_APIS, ApiSupport
from tierlog.protocol.codec import InvalidRequest, Request, UnsupportedVersion, api_versions_fallback, encode_response
from tierlog.protocol.codec import parse_request as parse_kafka_request
from tierlog.protocol.errors import error_code
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.security.principal import USER_TYPE, KafkaPrincipal
from tierlog.security.sasl import PLAIN, SaslAuthenticationError, SaslCredentialsRejected, SaslServer
from tierlog.security.sasl_plain import PlainSaslServer
from tierlog.security.sasl_scram import CredentialLookup, ScramSaslServer
from tierlog.server.entities import NO_THROTTLE, response_schema

SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36
_API_KEY = struct.Struct(">h")


@dataclass(frozen=True, slots=True)
class SaslServerSettings:
    """A SASL listener's settings: its enabled mechanisms (in the order they are configured) and how to make the
    server side of each for one connection."""

    enabled_mechanisms: tuple[str, ...]
    new_server: Callable[[str], SaslServer]
    # sasl.server.max.receive.size: no frame before authentication may be larger.
    max_receive_size: int
    # tierlog.sasl.authentication.timeout.ms: the whole exchange, from connect to authenticated.
    authentication_timeout_ms: int
    # connections.max.reauth.ms: the session lifetime told to clients (KIP-368); 0: sessions do not expire.
    max_reauth_ms: int = 0


@dataclass(frozen=True, slots=True)
class SaslSession:
    """An authenticated connection: who, with which mechanism, and whether it may and must re-authenticate."""

    principal: KafkaPrincipal
    mechanism: str
    # 0: the session does not expire.
    lifetime_ms: int
    # The client sent SaslAuthenticate v1 or later, so it knows about session lifetimes (Kafka's
    # connectedClientSupportsReauthentication).
    client_supports_reauthentication: bool


def sasl_server_settings(
    config: KafkaConfig, listener_name: str, scram_credentials: CredentialLookup
) -> SaslServerSettings:
    """A SASL listener's settings: PLAIN's users from its JAAS config (read once, at start-up, as Kafka), SCRAM's
    credentials through `scram_credentials`, which reads the current metadata image (so a user created or changed
    with AlterUserScramCredentials can authenticate on the next connection)."""
    mechanisms = tuple(config.sasl_enabled_mechanisms(listener_name))
    plain_module = config.sasl_jaas_config(listener_name, PLAIN) if PLAIN in mechanisms else None
    plain_users = plain_module.plain_users() if plain_module is not None else {}

    def new_server(mechanism: str) -> SaslServer:
        if mechanism == PLAIN:
            return PlainSaslServer(plain_users)
        return ScramSaslServer(mechanism, scram_credentials)

    return SaslServerSettings(
        enabled_mechanisms=mechanisms,
        new_server=new_server,
        max_receive_size=config.get_int("sasl.server.max.receive.size"),
        authentication_timeout_ms=config.get_int("tierlog.sasl.authentication.timeout.ms"),
        max_reauth_ms=config.get_int("connections.max.reauth.ms"),
    )


class _State(enum.Enum):
    HANDSHAKE_OR_VERSIONS_REQUEST = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclass(slots=True)
class SaslStep:
    """What the connection does with one frame: answer `api_versions` through KafkaApis (so it lists what every
    other ApiVersions lists), send `frames`, then close if `close_reason` is set."""

    frames: list[bytes] = field(default_factory=list)
    api_versions: Request | None = None
    close_reason: str | None = None


class SaslAuthenticator:
    """One connection's authentication. Feed every frame to `on_frame` until `complete` (then `principal` is the
    client) or a step says to close."""

    def __init__(
        self,
        settings: SaslServerSettings,
        served: Mapping[int, ApiSupport],
        *,
        reauthenticating: SaslSession | None = None,
    ) -> None:
        self._settings = settings
        self._served = served
        # A re-authentication starts with the SaslHandshake (Kafka's REAUTH_PROCESS_HANDSHAKE).
        self._previous = reauthenticating
        self._state = _State.HANDSHAKE_REQUEST if reauthenticating else _State.HANDSHAKE_OR_VERSIONS_REQUEST
        self._server: SaslServer | None = None
        # SaslHandshake v1+: tokens travel in SaslAuthenticate requests (KIP-152); v0: as bare frames.
        self._kafka_headers = False
        self._client_supports_reauthentication = False
        # Set when a re-authentication asks for another mechanism: the next token fails with it.
        self._bad_mechanism: str | None = None

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    @property
    def mechanism(self) -> str | None:
        return None if self._server is None else self._server.mechanism

    @property
    def session(self) -> SaslSession:
        if self._server is None or not self.complete:
            raise RuntimeError("the connection is not authenticated")
        return SaslSession(
            KafkaPrincipal(USER_TYPE, self._server.authorization_id),
            self._server.mechanism,
            self._settings.max_reauth_ms,
            self._client_supports_reauthentication,
        )

    @property
    def principal(self) -> KafkaPrincipal:
        return self.session.principal

    def on_frame(self, frame: bytes) -> SaslStep:
        if self._state in (_State.COMPLETE, _State.FAILED):
            raise RuntimeError(f"no frame is expected in SASL state {self._state.value}")
        if self._state is _State.AUTHENTICATE:
            step = self._on_authenticate_frame(frame) if self._kafka_headers else self._on_bare_token(frame)
        else:
            step = self._on_handshake_frame(frame)
        if step.close_reason is not None:
            self._state = _State.FAILED
        return step

    # Before the mechanism is chosen: ApiVersions (once) and SaslHandshake.

    def _on_handshake_frame(self, frame: bytes) -> SaslStep:
        if len(frame) < _API_KEY.size:
            # Kafka would read a frame that is not a Kafka request as a GSSAPI token of a 0.9 client; GSSAPI is
            # never enabled here.
            return SaslStep(close_reason="the first SASL packet is not a Kafka request (GSSAPI is not supported)")
        (api_key,) = _API_KEY.unpack_from(frame)
        if api_key not in (API_VERSIONS, SASL_HANDSHAKE):
            return SaslStep(
                close_reason=f"Unexpected Kafka request of type {_api_name(api_key)} during SASL handshake."
            )
        if api_key == API_VERSIONS and self._state is _State.HANDSHAKE_REQUEST:
            return SaslStep(close_reason="Unexpected ApiVersions request received during SASL authentication state")
        try:
            request = parse_kafka_request(frame, {api_key: SUPPORTED_APIS[api_key]})
        except UnsupportedVersion as e:
            if api_key == API_VERSIONS:
                # KIP-511: the client retries with a version of the list; the state does not change.
                return SaslStep(frames=api_versions_fallback(e.correlation_id, self._served.keys()))
            return SaslStep(close_reason=str(e))
        except InvalidRequest as e:
            return SaslStep(close_reason=f"invalid request during SASL handshake: {e}")
        if api_key == API_VERSIONS:
            self._state = _State.HANDSHAKE_REQUEST
            return SaslStep(api_versions=request)
        return self._on_handshake(request)

    def _on_handshake(self, request: Request) -> SaslStep:
        mechanism = request.body.mechanism
        enabled = self._settings.enabled_mechanisms
        s = response_schema(SASL_HANDSHAKE, request.api_version)
        if mechanism not in enabled:
            response = s.SaslHandshakeResponse(error_code=error_code("UNSUPPORTED_SASL_MECHANISM"), mechanisms=enabled)
            return SaslStep(frames=_encode(request, response), close_reason=f"Unsupported SASL mechanism {mechanism}")
        if self._previous is not None and mechanism != self._previous.mechanism:
            self._bad_mechanism = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for re-authentication of "
                f"mechanism '{self._previous.mechanism}'"
            )
        self._server = self._settings.new_server(mechanism)
        self._kafka_headers = request.api_version >= 1
        self._state = _State.AUTHENTICATE
        return SaslStep(
            frames=_encode(request, s.SaslHandshakeResponse(error_code=error_code(None), mechanisms=enabled))
        )

    # The mechanism's exchange.

    def _on_bare_token(self, token: bytes) -> SaslStep:
        """SaslHandshake v0: the token is the whole frame, the challenge goes back as a bare frame, and a failure
        just closes the connection (there is no way to tell the client why)."""
        try:
            challenge = self._evaluate(token)
        except SaslAuthenticationError as e:
            return SaslStep(close_reason=str(e))
        return SaslStep(frames=[SIZE_PREFIX.pack(len(challenge)) + challenge])

    def _on_authenticate_frame(self, frame: bytes) -> SaslStep:
        if self._bad_mechanism is not None:
            return SaslStep(close_reason=self._bad_mechanism)
        try:
            request = parse_kafka_request(frame, SUPPORTED_APIS)
        except (UnsupportedVersion, InvalidRequest) as e:
            return SaslStep(close_reason=f"during SASL authentication: {e}")
        if request.api_key != SASL_AUTHENTICATE:
            reason = f"Unexpected Kafka request of type {_api_name(request.api_key)} during SASL authentication."
            answer = _illegal_sasl_state(request)
            return SaslStep(frames=[] if answer is None else _encode(request, answer), close_reason=reason)
        s = response_schema(SASL_AUTHENTICATE, request.api_version)
        self._client_supports_reauthentication |= request.api_version > 0
        try:
            challenge = self._evaluate(request.body.auth_bytes)
        except SaslAuthenticationError as e:
            failure = s.SaslAuthenticateResponse(
                error_code=error_code("SASL_AUTHENTICATION_FAILED"),
                error_message=str(e),
                auth_bytes=b"",
                session_lifetime=NO_THROTTLE,
            )
            return SaslStep(frames=_encode(request, failure), close_reason=str(e))
        lifetime_ms = self._settings.max_reauth_ms if self.complete else 0
        response = s.SaslAuthenticateResponse(
            error_code=error_code(None),
            error_message=None,
            auth_bytes=challenge,
            session_lifetime=datetime.timedelta(milliseconds=lifetime_ms),
        )
        return SaslStep(frames=_encode(request, response))

    def _evaluate(self, token: bytes) -> bytes:
        """The mechanism's challenge; COMPLETE once the mechanism is, if a re-authentication keeps the principal.
        SaslAuthenticationError with what the client is told."""
        server = self._server
        assert server is not None
        if self._bad_mechanism is not None:
            raise SaslAuthenticationError(self._bad_mechanism)
        try:
            challenge = server.evaluate_response(token)
        except SaslCredentialsRejected as e:
            raise SaslCredentialsRejected(e.mechanism, reauthentication=self._previous is not None) from None
        if server.complete:
            previous = self._previous
            if previous is not None and server.authorization_id != previous.principal.name:
                old = previous.principal
                raise SaslAuthenticationError(
                    "Cannot change principals during re-authentication from "
                    f"{old.principal_type}.{old.name}: {USER_TYPE}.{server.authorization_id}"
                )
            self._state = _State.COMPLETE
        return challenge


def _illegal_sasl_state(request: Request) -> Any | None:
    """Kafka answers a request that arrives in the middle of the exchange with that request's error response
    (ILLEGAL_SASL_STATE); tierlog does for a second SaslHandshake and closes without an answer for the other APIs
    (no client sends them there)."""
    if request.api_key != SASL_HANDSHAKE:
        return None
    s = response_schema(request.api_key, request.api_version)
    return s.SaslHandshakeResponse(error_code=error_code("ILLEGAL_SASL_STATE"), mechanisms=())


def _encode(request: Request, response: Any) -> list[bytes]:
    # Every response but Fetch's is one chunk of bytes.
    return [bytes(chunk) for chunk in encode_response(request, response) if isinstance(chunk, bytes)]


def _api_name(api_key: int) -> str:
    api = SUPPORTED_APIS.get(api_key)
    return f"API key {api_key}" if api is None else api.name
