"""What every SASL mechanism's server side offers the authenticator (Kafka's javax.security.sasl.SaslServer, as
Kafka's PlainSaslServer and ScramSaslServer use it): tokens in, challenges out, no sockets.

Rules: docs/security.md#sasl.
"""

from __future__ import annotations

from typing import Protocol

from tierlog.metadata.records import SCRAM_MECHANISM_NAMES

PLAIN = "PLAIN"
SCRAM_MECHANISMS = tuple(SCRAM_MECHANISM_NAMES.values())
# What tierlog's brokers and its own connections authenticate with (GSSAPI and OAUTHBEARER are not built).
SUPPORTED_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)


class SaslAuthenticationError(Exception):
    """The client failed to authenticate; str(error) is what SaslAuthenticate tells it (Kafka's message)."""


class SaslCredentialsRejected(SaslAuthenticationError):
    """A failure whose details must not reach the client, who may not even learn whether the user exists (Kafka's
    SaslException): the client is told only that its credentials were not accepted."""

    def __init__(self, mechanism: str, *, reauthentication: bool = False) -> None:
        during = "re-authentication" if reauthentication else "authentication"
        super().__init__(
            f"Authentication failed during {during} due to invalid credentials with SASL mechanism {mechanism}"
        )
        self.mechanism = mechanism


class SaslServer(Protocol):
    @property
    def mechanism(self) -> str: ...

    @property
    def complete(self) -> bool:
        """True once the client is authenticated."""
        ...

    @property
    def authorization_id(self) -> str:
        """The authenticated user's name; only once `complete`."""
        ...

    def evaluate_response(self, token: bytes) -> bytes:
        """The challenge that answers the client's `token`; SaslAuthenticationError when it fails."""
        ...
