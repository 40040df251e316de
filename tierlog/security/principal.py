"""Who a request comes from: Kafka's KafkaPrincipal ("User:alice").

A connection gets its principal when it authenticates (SASL: the user name; SSL with a client certificate:
the certificate's subject through ssl.principal.mapping.rules); without either it is User:ANONYMOUS, as in
Kafka. Rules: docs/security.md.
"""

from __future__ import annotations

from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """'User:alice' -> KafkaPrincipal('User', 'alice'); ValueError with Kafka's message (SecurityUtils.
        parseKafkaPrincipal's) without a colon."""
        principal_type, sep, name = text.partition(":")
        if not sep:
            raise ValueError(f"expected a string in format principalType:principalName but got {text}")
        return cls(principal_type, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")
