"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) on the server, with scramp's exchange and the
credentials of the metadata image (`ClusterMetadata.scram_credentials`), as Kafka's ScramSaslServer.

Any failure (unknown user, wrong proof, a malformed message, an authzid, channel binding) answers the client
with Kafka's one message, which says no more than that the credentials were not accepted. Rules:
docs/security.md#sasl.
"""

from __future__ import annotations

from collections.abc import Callable

from scramp import ScramException, ScramMechanism
from scramp.core import Nonce

from tierlog.metadata.image import ScramCredential
from tierlog.security.sasl import SCRAM_MECHANISMS, SaslAuthenticationError, SaslCredentialsRejected

CredentialLookup = Callable[[str, str], ScramCredential | None]


class ScramSaslServer:
    def __init__(self, mechanism: str, credentials: CredentialLookup) -> None:
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"{mechanism} is not a SCRAM mechanism ({', '.join(SCRAM_MECHANISMS)})")
        self._mechanism = mechanism
        self._credentials = credentials
        self._username: str | None = None
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._complete = False

    @property
    def mechanism(self) -> str:
        return self._mechanism

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        if not self._complete or self._username is None:
            raise RuntimeError("Authentication exchange has not completed")
        return self._username

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int] | None:
        credential = self._credentials(username, self._mechanism)
        if credential is None:
            return None
        self._username = username
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _accept_a_longer_final_nonce(self, client_final: str) -> None:
        """Kafka's ScramSaslServer accepts a client-final nonce that only ends with the server's (client nonce +
        server nonce), and librdkafka 2.0 sends the client nonce twice there; scramp wants the two equal, so it is
        told to expect the client's. The proof still covers the nonce as the client sent it."""
        received = next((item[2:] for item in client_final.split(",") if item.startswith("r=")), None)
        expected = str(self._server.nonce)
        if received is not None and received != expected and received.endswith(expected):
            self._server.nonce = Nonce(received)

    def evaluate_response(self, token: bytes) -> bytes:
        if self._complete:
            raise SaslAuthenticationError("Unexpected challenge in Sasl server state COMPLETE")
        try:
            message = token.decode("utf-8")
            if self._server.stage is None:
                self._server.set_client_first(message)
                return self._server.get_server_first().encode()
            self._accept_a_longer_final_nonce(message)
            self._server.set_client_final(message)
            final = self._server.get_server_final().encode()
        except (UnicodeDecodeError, ScramException):
            raise SaslCredentialsRejected(self._mechanism) from None
        self._complete = True
        return final
