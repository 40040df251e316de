"""One client connection: read frames, answer them in order, send record bytes with sendfile (with reads of the
file on a TLS connection, which sendfile cannot carry).

Like Kafka, a connection is served one request at a time (Kafka mutes the channel until the response is
sent), so responses always leave in request order even when a fetch waits in the purgatory. Bad input
closes only this connection, with one log line; everyone else is served on.

On a SASL listener the connection first authenticates (server/sasl_authenticator.py): until then only
ApiVersions and SaslHandshake reach the broker, every frame is bounded by sasl.server.max.receive.size and the
whole exchange by tierlog.sasl.authentication.timeout.ms. With connections.max.reauth.ms a SaslHandshake on the
authenticated connection starts a re-authentication (KIP-368), and any other request after the session's end
closes the connection (docs/security.md#sasl).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from tierlog.client.security import SASL_PROTOCOLS
from tierlog.protocol.api_versions import ApiSupport, enabled_apis
from tierlog.protocol.codec import (
    InvalidRequest,
    Request,
    UnsupportedVersion,
    api_versions_fallback,
    encode_response,
    parse_request,
)
from tierlog.protocol.framing import FrameTooLarge, FramingError, read_frame
from tierlog.security.ssl_context import NoMatchingRuleError, SslPrincipalMapper
from tierlog.server.kafka_apis import API_API_VERSIONS
from tierlog.server.request_context import authenticated_as, enter_connection
from tierlog.server.sasl_authenticator import SASL_HANDSHAKE, SaslAuthenticator, SaslServerSettings, SaslSession
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)

# How long a connection whose authentication failed waits for the client to close it, after the broker's answer.
LINGER_S = 1.0
# Below this size a pread + write is cheaper than handing the socket to sendfile.
SENDFILE_MIN_BYTES = 64 * 1024
# Largest read of record bytes sent on a TLS connection (it becomes several TLS records either way).
TLS_READ_BYTES = 1024 * 1024


class RequestHandler(Protocol):
    """What serves a connection's requests: a broker's KafkaApis, a dedicated controller's ControllerNodeApis."""

    @property
    def handlers(self) -> Mapping[int, Callable[[Request], Awaitable[Any]]]: ...

    async def handle(self, request: Request) -> Any: ...


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    apis: RequestHandler,
    max_request_bytes: int,
    listener_name: str = "",
    *,
    security_protocol: str = "PLAINTEXT",
    ssl_principal_mapper: SslPrincipalMapper | None = None,
    sasl: SaslServerSettings | None = None,
) -> None:
    """Serve one client connection until it closes; on a SASL_PLAINTEXT or SASL_SSL listener (`sasl` holds the
    listener's SASL settings) only once it has authenticated."""
    peer = writer.get_extra_info("peername")
    client_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""
    enter_connection(client_host, listener_name)
    if security_protocol == "SSL" and not _authenticate_certificate(writer, ssl_principal_mapper, peer):
        writer.close()
        return
    served = enabled_apis(apis.handlers.keys())
    try:
        session: SaslSession | None = None
        if security_protocol in SASL_PROTOCOLS:
            if sasl is None:
                raise ValueError(f"listener {listener_name} uses {security_protocol} but has no SASL settings")
            session = await _authenticate(reader, writer, apis, served, sasl, client_host)
            if session is None:
                return
        loop = asyncio.get_running_loop()
        session_ends = _session_end(session, loop.time())
        while True:
            frame = await read_frame(reader, max_request_bytes)
            if frame is None:
                return
            if session is not None and session_ends is not None:
                assert sasl is not None
                if _is_sasl_handshake(frame) and session.client_supports_reauthentication:
                    session = await _authenticate(
                        reader, writer, apis, served, sasl, client_host, handshake=frame, previous=session
                    )
                    if session is None:
                        return
                    session_ends = _session_end(session, loop.time())
                    continue
                if loop.time() >= session_ends:
                    logger.info(
                        "closing connection from %s: its SASL session ended %d ms after authentication "
                        "(connections.max.reauth.ms) and it did not re-authenticate",
                        client_host,
                        session.lifetime_ms,
                    )
                    return
            try:
                request = parse_request(frame, served)
            except UnsupportedVersion as e:
                if e.api_key == API_API_VERSIONS:
                    writer.write(b"".join(api_versions_fallback(e.correlation_id, apis.handlers.keys())))
                    await writer.drain()
                    continue
                logger.warning("closing connection from %s: %s", peer, e)
                return
            except InvalidRequest as e:
                logger.warning("closing connection from %s: invalid request: %s", peer, e)
                return
            response = await apis.handle(request)
            if response is not None:
                await send_chunks(writer, encode_response(request, response))
    except FramingError as e:
        logger.warning("closing connection from %s: %s", peer, e)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    except Exception:
        logger.exception("closing connection from %s after an unexpected error", peer)
    finally:
        writer.close()


def _authenticate_certificate(writer: asyncio.StreamWriter, mapper: SslPrincipalMapper | None, peer: object) -> bool:
    """On an SSL listener, a verified client certificate makes the connection's principal User:<mapped
    subject>; without one it stays User:ANONYMOUS. False (the connection is closed, as Kafka closes it) when
    no rule of ssl.principal.mapping.rules applies. docs/security.md#tls."""
    certificate = writer.get_extra_info("peercert")
    if not certificate or mapper is None:
        return True
    try:
        authenticated_as(mapper.principal_of(certificate))
    except NoMatchingRuleError as e:
        logger.warning("closing connection from %s: %s", peer, e)
        return False
    return True


async def _authenticate(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    apis: RequestHandler,
    served: Mapping[int, ApiSupport],
    sasl: SaslServerSettings,
    client_host: str,
    *,
    handshake: bytes | None = None,
    previous: SaslSession | None = None,
) -> SaslSession | None:
    """Run the SASL exchange (a re-authentication of `previous`, starting with its `handshake` frame); the session
    once the client is authenticated (its principal is set), None when the connection must be closed (already
    logged)."""
    authenticator = SaslAuthenticator(sasl, served, reauthenticating=previous)
    what = "authentication" if previous is None else "re-authentication"
    timeout_s = sasl.authentication_timeout_ms / 1000
    pending = handshake
    try:
        async with asyncio.timeout(timeout_s):
            while not authenticator.complete:
                if pending is not None:
                    frame, pending = pending, None
                else:
                    frame = await read_frame(reader, sasl.max_receive_size)
                if frame is None:
                    return None
                step = authenticator.on_frame(frame)
                if step.api_versions is not None:
                    response = await apis.handle(step.api_versions)
                    await send_chunks(writer, encode_response(step.api_versions, response))
                for response_frame in step.frames:
                    writer.write(response_frame)
                await writer.drain()
                if step.close_reason is not None:
                    logger.info("Failed %s with %s (%s)", what, client_host, step.close_reason)
                    if step.frames:
                        await _linger(reader)
                    return None
    except TimeoutError:
        logger.info("Failed %s with %s (not authenticated within %ss)", what, client_host, timeout_s)
        return None
    except FrameTooLarge as e:
        logger.info(
            "Failed %s with %s (Failing SASL authentication due to invalid receive size %d)", what, client_host, e.size
        )
        return None
    session = authenticator.session
    authenticated_as(session.principal)
    logger.debug("%s: %s as %s with %s", client_host, what, session.principal, session.mechanism)
    return session


async def _linger(reader: asyncio.StreamReader) -> None:
    """After the answer to a failed authentication: wait (at most LINGER_S) for the client to close the connection,
    discarding whatever else it sends. A client that sees the connection end in the same read as the answer may
    report only a dropped connection (kafka-python does), not the broker's message."""
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER_S):
            while await reader.read(65536):
                pass


def _session_end(session: SaslSession | None, now: float) -> float | None:
    """When the session ends (event loop time), None if it does not."""
    if session is None or session.lifetime_ms <= 0:
        return None
    return now + session.lifetime_ms / 1000


def _is_sasl_handshake(frame: bytes) -> bool:
    return len(frame) >= 2 and int.from_bytes(frame[:2], "big", signed=True) == SASL_HANDSHAKE


async def send_chunks(writer: asyncio.StreamWriter, chunks: Sequence[bytes | memoryview | FileSlice]) -> None:
    loop = asyncio.get_running_loop()
    # TLS encrypts in user space, so the kernel cannot send the file itself: asyncio's sendfile fallback would
    # read it in 256 KiB blocks through a thread pool; reading it here in large preads is simpler and faster
    # (bench/tls.py). docs/security.md#tls.
    tls = writer.get_extra_info("sslcontext") is not None
    # The pieces up to the next sendfile go out in one write: one send() for a whole small Fetch answer (header,
    # records, trailer) instead of one per piece (docs/performance.md#replication).
    pending: list[bytes | memoryview] = []
    for chunk in chunks:
        if not isinstance(chunk, FileSlice):
            pending.append(chunk)
            continue
        if tls:
            _write_pending(writer, pending)
            await _send_file_slice_by_reads(writer, chunk)
            continue
        if chunk.size < SENDFILE_MIN_BYTES:
            pending.append(_padded(os.pread(chunk.file.fileno(), chunk.size, chunk.position), chunk.size))
            continue
        _write_pending(writer, pending)
        await writer.drain()
        sent = await loop.sendfile(writer.transport, chunk.file, chunk.position, chunk.size)
        if sent < chunk.size:
            rest = chunk.size - sent
            pending.append(_padded(os.pread(chunk.file.fileno(), rest, chunk.position + sent), rest))
    _write_pending(writer, pending)
    await writer.drain()


def _write_pending(writer: asyncio.StreamWriter, pending: list[bytes | memoryview]) -> None:
    if pending:
        writer.write(pending[0] if len(pending) == 1 else b"".join(pending))
        pending.clear()


async def _send_file_slice_by_reads(writer: asyncio.StreamWriter, chunk: FileSlice) -> None:
    offset = 0
    while offset < chunk.size:
        size = min(TLS_READ_BYTES, chunk.size - offset)
        writer.write(_padded(os.pread(chunk.file.fileno(), size, chunk.position + offset), size))
        offset += size
        if offset < chunk.size:
            await writer.drain()


def _padded(data: bytes, size: int) -> bytes:
    """A segment truncated while its bytes were on the way: pad, so the frame length stays true; the client
    discards the incomplete last batch as it would any partial batch."""
    return data.ljust(size, b"\0")
