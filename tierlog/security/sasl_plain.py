"""SASL/PLAIN (RFC 4616) on the server, as Kafka's PlainSaslServer: `[authzid] NUL user NUL password`, checked
against the users of the listener's PlainLoginModule JAAS config. Rules: docs/security.md#sasl.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from tierlog.security.sasl import PLAIN, SaslAuthenticationError


class PlainSaslServer:
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self._authorization_id: str | None = None

    @property
    def mechanism(self) -> str:
        return PLAIN

    @property
    def complete(self) -> bool:
        return self._authorization_id is not None

    @property
    def authorization_id(self) -> str:
        if self._authorization_id is None:
            raise RuntimeError("Authentication exchange has not completed")
        return self._authorization_id

    def evaluate_response(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslAuthenticationError("Unexpected challenge in Sasl server state COMPLETE")
        # Java decodes the bytes leniently (new String(bytes, UTF_8)); so does this.
        tokens = token.decode("utf-8", errors="replace").split("\0", 3)
        if len(tokens) != 3:
            raise SaslAuthenticationError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}")
        authorization_id, username, password = tokens
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        expected = self._users.get(username)
        # A constant-time comparison, so the time taken tells nothing about the password; an unknown user is
        # compared too, against the password itself, so it takes as long as a known one.
        matches = hmac.compare_digest(password.encode(), (password if expected is None else expected).encode())
        if expected is None or not matches:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authorization_id and authorization_id != username:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        self._authorization_id = username
        return b""
