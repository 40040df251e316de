"""What a handler may need to know about the connection a request came in on (Kafka's RequestContext): the
client's address and the listener. Each connection is its own task, so the values are that connection's."""

from __future__ import annotations

import contextvars

from tierlog.security.principal import ANONYMOUS, KafkaPrincipal

_client_host: contextvars.ContextVar[str] = contextvars.ContextVar("client_host", default="")
_listener_name: contextvars.ContextVar[str] = contextvars.ContextVar("listener_name", default="")
_principal: contextvars.ContextVar[KafkaPrincipal] = contextvars.ContextVar("principal", default=ANONYMOUS)


def enter_connection(client_host: str, listener_name: str) -> None:
    """Called by the connection's task before it serves its first request."""
    _client_host.set(client_host)
    _listener_name.set(listener_name)


def client_host() -> str:
    """The client's address as Kafka shows it ("/127.0.0.1"), for handlers that record it (group members)."""
    return _client_host.get()


def listener_name() -> str:
    """The name of the listener the request came in on ("" for a request made inside the broker)."""
    return _listener_name.get()


def authenticated_as(principal: KafkaPrincipal) -> None:
    """Called by the connection's task when the client authenticates (SASL, or a TLS client certificate)."""
    _principal.set(principal)


def principal() -> KafkaPrincipal:
    """Who the request comes from: User:ANONYMOUS until the connection authenticates."""
    return _principal.get()
