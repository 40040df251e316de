"""A connection to a Kafka listener: frames, correlation ids and timeouts around `wire`'s codec.

A `KafkaConnection` carries one request at a time, which is how the broker serves a connection anyway, so
a response always answers the request just sent and pipelining would buy nothing. Any failure (connect,
timeout, EOF, a frame that does not decode, a cancelled send) closes the connection: after a request
was written without its response being read, the stream's position is unknown, so the caller opens a new
connection rather than risk reading the next response as the answer to an older request.

`send_negotiated` sends a request at the newest version both sides serve, as Kafka's clients pick it from the
broker's ApiVersions (asked once per connection).

`send_blocking` is the same exchange on a connected blocking socket, for callers without an event loop
(the probes).

With a SASL `ClientSecurity` the connection authenticates before `open` returns: SaslHandshake v1, then the
mechanism's tokens in SaslAuthenticate requests (PLAIN, or SCRAM-SHA-256/512 with scramp's client), as Kafka's
clients do (docs/security.md#sasl).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

from kio.static.protocol import RequestPayload, ResponsePayload
from scramp import ScramClient, ScramException

from tierlog.client.requests import api_versions_request, sasl_authenticate_request, sasl_handshake_request
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.client.wire import MAX_RESPONSE_BYTES, MalformedResponseError, decode_response, encode_request
from tierlog.protocol.api_versions import api_name
from tierlog.protocol.framing import SIZE_PREFIX, FramingError, TruncatedFrame, check_frame_size, read_frame

__all__ = [
    "ApiNotServedError",
    "ConnectionPool",
    "KafkaConnection",
    "KafkaConnectionError",
    "ask_once",
    "send_blocking",
]

# How long close() waits for the peer to acknowledge; the socket is gone either way.
_CLOSE_TIMEOUT_S = 1.0
# asyncio's StreamReader stops reading the socket at twice its limit (64 KiB by default) until the reader catches
# up: a follower's 1 MiB fetch answer would cost a pause and a resume of the socket for every 128 KiB. The broker's
# own connections read with the same limit (server/socket_server.py). docs/performance.md#replication.
STREAM_BUFFER_BYTES = 2**20
_INT32_MAX = 2**31 - 1


class KafkaConnectionError(Exception):
    """The connection failed (connect, timeout, EOF, malformed response); it is closed and unusable."""


class ApiNotServedError(Exception):
    """The broker serves no version of an API the request needs that this client can send."""


class KafkaConnection:
    """One TCP connection to a Kafka listener; `send` serialises concurrent callers."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, address: str, client_id: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._address = address
        self._client_id = client_id
        self._lock = asyncio.Lock()
        self._next_correlation_id = 0
        self._closed = False
        # The broker's ApiVersions answer, api key -> (min, max) version, once asked.
        self._served_versions: dict[int, tuple[int, int]] | None = None

    @classmethod
    async def open(
        cls, host: str, port: int, *, client_id: str, timeout_s: float, security: ClientSecurity = PLAINTEXT
    ) -> KafkaConnection:
        address = f"{host}:{port}"
        context = security.ssl_context if security.uses_tls else None
        if security.uses_tls and context is None:
            raise KafkaConnectionError(
                f"connect to {address}: security.protocol={security.protocol} needs a TLS context"
            )
        try:
            async with asyncio.timeout(timeout_s):
                if context is None:
                    reader, writer = await asyncio.open_connection(host, port, limit=STREAM_BUFFER_BYTES)
                else:
                    # The host name is checked against the certificate only when
                    # ssl.endpoint.identification.algorithm asks for it (docs/security.md#tls).
                    reader, writer = await asyncio.open_connection(
                        host,
                        port,
                        ssl=context,
                        server_hostname=host if context.check_hostname else "",
                        ssl_handshake_timeout=timeout_s,
                        limit=STREAM_BUFFER_BYTES,
                    )
        except TimeoutError:
            raise KafkaConnectionError(f"connect to {address} timed out after {timeout_s}s") from None
        except ssl.SSLError as exc:
            raise KafkaConnectionError(f"connect to {address}: TLS handshake failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise KafkaConnectionError(f"connect to {address} failed: {exc.strerror or exc}") from None
        connection = cls(reader, writer, address=address, client_id=client_id)
        if security.uses_sasl:
            try:
                await connection._authenticate(security, timeout_s)
            except BaseException:
                await connection.close()
                raise
        return connection

    async def _authenticate(self, security: ClientSecurity, timeout_s: float) -> None:
        """SaslHandshake v1 and the mechanism's SaslAuthenticate exchange; KafkaConnectionError with the
        broker's message if it refuses the mechanism or the credentials."""
        mechanism, username, password = security.sasl_mechanism, security.sasl_username, security.sasl_password
        what = f"SASL {mechanism} authentication with {self._address}"
        if mechanism is None or username is None or password is None:
            raise KafkaConnectionError(f"{what}: needs a mechanism, a username and a password")
        handshake = await self.send(sasl_handshake_request(mechanism), timeout_s=timeout_s)
        if handshake.error_code != 0:
            raise KafkaConnectionError(
                f"{what}: the broker answers {handshake.error_code.name.upper()} "
                f"(its enabled mechanisms: {', '.join(handshake.mechanisms) or 'none'})"
            )
        try:
            if mechanism == "PLAIN":
                await self._sasl_token(f"\0{username}\0{password}".encode(), what, timeout_s)
                return
            scram = ScramClient([mechanism], username, password)
            server_first = await self._sasl_token(scram.get_client_first().encode(), what, timeout_s)
            scram.set_server_first(server_first.decode())
            server_final = await self._sasl_token(scram.get_client_final().encode(), what, timeout_s)
            # Checks the server's signature: the broker knows the credential, not only this client.
            scram.set_server_final(server_final.decode())
        except (ScramException, UnicodeDecodeError) as exc:
            raise KafkaConnectionError(f"{what}: {exc}") from None

    async def _sasl_token(self, token: bytes, what: str, timeout_s: float) -> bytes:
        response = await self.send(sasl_authenticate_request(token), timeout_s=timeout_s)
        if response.error_code != 0:
            raise KafkaConnectionError(f"{what} failed: {response.error_message or response.error_code.name.upper()}")
        return bytes(response.auth_bytes)

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, request: RequestPayload, *, timeout_s: float) -> ResponsePayload:
        """Send `request` and return its response entity (the kio response type of its API and version).

        Raises KafkaConnectionError, after closing the connection, if no well-formed response with the
        request's correlation id arrives within `timeout_s` (which includes waiting for earlier senders).
        """
        what = _describe(request, self._address)
        try:
            async with asyncio.timeout(timeout_s), self._lock:
                return await self._exchange(request, what)
        except TimeoutError:
            self._abort()
            raise KafkaConnectionError(f"{what}: no response within {timeout_s}s") from None
        except BaseException:
            # Failed or cancelled mid-request: a late response would be read as the answer to the next one.
            self._abort()
            raise

    async def send_negotiated(
        self, api_key: int, build: Callable[[int], RequestPayload], newest: int, *, timeout_s: float
    ) -> ResponsePayload:
        """`build(version)`'s response, sent at the newest version both this client (up to `newest`) and the
        broker serve. Raises ApiNotServedError if there is none, KafkaConnectionError as `send`."""
        if self._served_versions is None:
            answer = await self.send(api_versions_request(), timeout_s=timeout_s)
            self._served_versions = {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in answer.api_keys}
        served = self._served_versions.get(api_key)
        if served is None or served[0] > newest:
            raise ApiNotServedError(f"does not serve {api_name(api_key)} (API {api_key})")
        return await self.send(build(min(newest, served[1])), timeout_s=timeout_s)

    async def _exchange(self, request: RequestPayload, what: str) -> ResponsePayload:
        if self._closed:
            raise KafkaConnectionError(f"{what}: connection is closed")
        correlation_id = self._next_correlation_id
        self._next_correlation_id = 0 if correlation_id == _INT32_MAX else correlation_id + 1
        try:
            self._writer.write(encode_request(request, correlation_id, self._client_id))
            await self._writer.drain()
            frame = await read_frame(self._reader, MAX_RESPONSE_BYTES)
        except (OSError, FramingError) as exc:
            raise KafkaConnectionError(f"{what}: {exc}") from None
        if frame is None:
            raise KafkaConnectionError(f"{what}: connection closed by the peer")
        try:
            return decode_response(request, correlation_id, frame)
        except MalformedResponseError as exc:
            raise KafkaConnectionError(f"{what}: {exc}") from None

    def _abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.transport.abort()

    async def close(self) -> None:
        """Close the connection; idempotent, never raises. A send in progress fails."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        # The peer may already be gone (reset) or slow to acknowledge: neither matters to the caller.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._writer.wait_closed()


async def ask_once(
    host: str,
    port: int,
    api_key: int,
    build: Callable[[int], RequestPayload],
    newest: int,
    *,
    client_id: str,
    timeout_s: float,
    security: ClientSecurity = PLAINTEXT,
) -> ResponsePayload:
    """`build(version)`'s response at the newest version both sides serve, on a connection of its own (the
    command-line tools' one-off questions to one broker)."""
    connection = await KafkaConnection.open(host, port, client_id=client_id, timeout_s=timeout_s, security=security)
    try:
        return await connection.send_negotiated(api_key, build, newest, timeout_s=timeout_s)
    finally:
        await connection.close()


class ConnectionPool:
    """One connection per address, opened on first use and again after a failure closed it: how a broker's own
    senders (transaction markers, the remote log metadata topic) reach their peers."""

    def __init__(self, *, client_id: str, security: ClientSecurity, connect_timeout_s: float) -> None:
        self._client_id = client_id
        self._security = security
        self._connect_timeout_s = connect_timeout_s
        self._connections: dict[tuple[str, int], KafkaConnection] = {}

    async def send(self, host: str, port: int, request: RequestPayload, *, timeout_s: float) -> ResponsePayload:
        address = (host, port)
        connection = self._connections.get(address)
        if connection is None or connection.closed:
            connection = await KafkaConnection.open(
                host, port, client_id=self._client_id, timeout_s=self._connect_timeout_s, security=self._security
            )
            self._connections[address] = connection
        try:
            return await connection.send(request, timeout_s=timeout_s)
        except KafkaConnectionError:
            self._connections.pop(address, None)
            await connection.close()
            raise

    async def close(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            await connection.close()


def send_blocking(sock: socket.socket, request: RequestPayload, *, client_id: str) -> ResponsePayload:
    """Send `request` as the first request on the connected blocking `sock` and return its response, each
    socket operation bounded by the socket's timeout. Raises KafkaConnectionError; the caller closes `sock`."""
    what = _describe(request, _peer_of(sock))
    correlation_id = 0
    try:
        sock.sendall(encode_request(request, correlation_id, client_id))
        prefix = _recv_exactly(sock, SIZE_PREFIX.size)
        if not prefix:
            raise KafkaConnectionError(f"{what}: connection closed by the peer")
        if len(prefix) < SIZE_PREFIX.size:
            raise TruncatedFrame(SIZE_PREFIX.size, len(prefix))
        (size,) = SIZE_PREFIX.unpack(prefix)
        check_frame_size(size, MAX_RESPONSE_BYTES)
        frame = _recv_exactly(sock, size)
        if len(frame) < size:
            raise TruncatedFrame(SIZE_PREFIX.size + size, SIZE_PREFIX.size + len(frame))
        return decode_response(request, correlation_id, frame)
    except TimeoutError:
        raise KafkaConnectionError(f"{what}: no response within {sock.gettimeout()}s") from None
    except (OSError, FramingError, MalformedResponseError) as exc:
        raise KafkaConnectionError(f"{what}: {exc}") from None


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes, or fewer if the peer closes the connection first."""
    chunks = []
    received = 0
    while received < size:
        chunk = sock.recv(min(size - received, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        received += len(chunk)
    return b"".join(chunks)


def _peer_of(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "an unconnected socket"
    return f"{host}:{port}"


def _describe(request: RequestPayload, address: str) -> str:
    return f"{type(request).__name__} v{request.__version__} to {address}"
