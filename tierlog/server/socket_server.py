"""SocketServer (Kafka's class of that name): a node's listeners and the connections they accept, for a broker
(server/broker.py) and a dedicated controller (server/controller_node.py) alike.

Every port is bound first and served later (`start_serving` on the `asyncio.Server` `bind` returns), as Kafka's
SocketServer binds its acceptors when it is built and enables request processing once the node is ready. TLS
contexts are built (their files read) when the SocketServer is, so a key store that cannot be used stops the start
with one line before any port is bound (docs/security.md#tls).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from tierlog.client.security import SASL_PROTOCOLS
from tierlog.config import KafkaConfig, Listener
from tierlog.metadata.image import ScramCredential
from tierlog.security.ssl_context import SslPrincipalMapper
from tierlog.server.connection import RequestHandler, serve_connection
from tierlog.server.sasl_authenticator import SaslServerSettings, sasl_server_settings
from tierlog.server.startup import StartupError, reason_of

SHUTDOWN_DRAIN_S = 5.0
SSL_HANDSHAKE_TIMEOUT_S = 10.0

ScramLookup = Callable[[str, str], ScramCredential | None]


class SocketServer:
    def __init__(self, config: KafkaConfig, listeners: Sequence[Listener]) -> None:
        self._config = config
        self._ssl_contexts = {listener.name: config.server_ssl_context(listener.name) for listener in listeners}
        # SSL listeners name a client by its certificate (SASL_SSL ones by its SASL identity).
        self._ssl_principal_mappers = {
            listener.name: SslPrincipalMapper(config.ssl_settings(listener.name).principal_mapping_rules)
            for listener in listeners
            if config.security_protocol_of(listener.name) == "SSL"
        }
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def bind(self, listener: Listener, apis: RequestHandler, scram_credential: ScramLookup) -> asyncio.Server:
        """The listener's socket, bound now and served (by `apis`) once the caller starts serving it; a SASL
        listener looks SCRAM users up with `scram_credential`. StartupError when the port cannot be bound."""
        ssl_context = self._ssl_contexts[listener.name]
        protocol = self._config.listener_security_protocols[listener.name]
        sasl = (
            sasl_server_settings(self._config, listener.name, scram_credential) if protocol in SASL_PROTOCOLS else None
        )
        max_request = self._config.get_int("socket.request.max.bytes")
        try:
            server = await asyncio.start_server(
                lambda r, w: self._accept(r, w, apis, max_request, listener.name, protocol, sasl),
                listener.host or None,
                listener.port,
                reuse_address=True,
                limit=2**20,
                start_serving=False,
                ssl=ssl_context,
                # A client that never finishes the handshake is dropped by asyncio after this long; the
                # connection's task only starts once the handshake is done, so nothing is left behind.
                ssl_handshake_timeout=SSL_HANDSHAKE_TIMEOUT_S if ssl_context is not None else None,
            )
        except OSError as e:
            raise StartupError(
                f"cannot listen on {listener.name}://{listener.host}:{listener.port}: {reason_of(e)}"
            ) from None
        self._servers.append(server)
        return server

    async def _accept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        apis: RequestHandler,
        max_request: int,
        listener_name: str,
        security_protocol: str,
        sasl: SaslServerSettings | None,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            await serve_connection(
                reader,
                writer,
                apis,
                max_request,
                listener_name,
                security_protocol=security_protocol,
                ssl_principal_mapper=self._ssl_principal_mappers.get(listener_name),
                sasl=sasl,
            )
        finally:
            del self._connections[task]

    @property
    def bound_ports(self) -> list[int]:
        return [sock.getsockname()[1] for server in self._servers for sock in server.sockets]

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def close_connections(self) -> None:
        """End each connection by closing its socket: the connection's loop sees the end of its stream and
        returns, with no half-written response and no cancellation; one still busy after SHUTDOWN_DRAIN_S is
        cancelled. Call once every parked request has been answered."""
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, lingering = await asyncio.wait(list(self._connections), timeout=SHUTDOWN_DRAIN_S)
            for task in lingering:
                task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
