"""How the project's own connections (replica fetchers, the controller channel, the remote log metadata consumer,
the Spark source) authenticate and encrypt: Kafka's client-side security.protocol, ssl.* and sasl.* in one value.
Rules: docs/security.md.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    protocol: str = "PLAINTEXT"
    # For SSL and SASL_SSL: the context the connection is wrapped in (trust store, and a client certificate for
    # ssl.client.auth); server_hostname checks follow ssl.endpoint.identification.algorithm.
    ssl_context: ssl.SSLContext | None = None
    # For SASL_PLAINTEXT and SASL_SSL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, and the credentials.
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS


PLAINTEXT = ClientSecurity()
