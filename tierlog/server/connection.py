"""One client connection: read frames, answer them in order, send record bytes with sendfile.

Like Kafka, a connection is served one request at a time (Kafka mutes the channel until the response is
sent), so responses always leave in request order even when a fetch waits in the purgatory. Bad input
closes only this connection, with one log line; everyone else is served on.

On a SASL listener the connection first authenticates (server/sasl_authenticator.py): until then only
ApiVersions and SaslHandshake reach the broker, every frame is bounded by sasl.server.max.receive.size and the
whole exchange by tierlog.sasl.authentication.timeout.ms (docs/security.md#sasl).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence

from tierlog.protocol.api_versions import ApiSupport, enabled_apis
from tierlog.protocol.codec import (
    InvalidRequest,
    UnsupportedVersion,
    api_versions_fallback,
    encode_response,
    parse_request,
)
from tierlog.protocol.framing import FrameTooLarge, FramingError, read_frame
from tierlog.server.kafka_apis import API_API_VERSIONS, KafkaApis
from tierlog.server.request_context import authenticated_as, enter_connection
from tierlog.server.sasl_authenticator import SaslAuthenticator, SaslServerSettings
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)

# Below this size a pread + write is cheaper than handing the socket to sendfile.
SENDFILE_MIN_BYTES = 64 * 1024


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    apis: KafkaApis,
    max_request_bytes: int,
    listener_name: str = "",
    *,
    security_protocol: str = "PLAINTEXT",
    sasl: SaslServerSettings | None = None,
) -> None:
    """Serve one client connection until it closes; on a SASL_PLAINTEXT or SASL_SSL listener (`sasl` holds the
    listener's SASL settings) only once it has authenticated."""
    peer = writer.get_extra_info("peername")
    client_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""
    enter_connection(client_host, listener_name)
    served = enabled_apis(apis.handlers.keys())
    try:
        if security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            if sasl is None:
                raise ValueError(f"listener {listener_name} uses {security_protocol} but has no SASL settings")
            if not await _authenticate(reader, writer, apis, served, sasl, client_host):
                return
        while True:
            frame = await read_frame(reader, max_request_bytes)
            if frame is None:
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


async def _authenticate(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    apis: KafkaApis,
    served: Mapping[int, ApiSupport],
    sasl: SaslServerSettings,
    client_host: str,
) -> bool:
    """Run the SASL exchange; True once the client is authenticated (its principal is set), False when the
    connection must be closed (already logged)."""
    authenticator = SaslAuthenticator(sasl, served)
    timeout_s = sasl.authentication_timeout_ms / 1000
    try:
        async with asyncio.timeout(timeout_s):
            while not authenticator.complete:
                frame = await read_frame(reader, sasl.max_receive_size)
                if frame is None:
                    return False
                step = authenticator.on_frame(frame)
                if step.api_versions is not None:
                    response = await apis.handle(step.api_versions)
                    await send_chunks(writer, encode_response(step.api_versions, response))
                for response_frame in step.frames:
                    writer.write(response_frame)
                await writer.drain()
                if step.close_reason is not None:
                    logger.info("Failed authentication with %s (%s)", client_host, step.close_reason)
                    return False
    except TimeoutError:
        logger.info("Failed authentication with %s (not authenticated within %ss)", client_host, timeout_s)
        return False
    except FrameTooLarge as e:
        logger.info(
            "Failed authentication with %s (Failing SASL authentication due to invalid receive size %d)",
            client_host,
            e.size,
        )
        return False
    authenticated_as(authenticator.principal)
    logger.debug("%s authenticated as %s with %s", client_host, authenticator.principal, authenticator.mechanism)
    return True


async def send_chunks(writer: asyncio.StreamWriter, chunks: Sequence[bytes | memoryview | FileSlice]) -> None:
    loop = asyncio.get_running_loop()
    for chunk in chunks:
        if not isinstance(chunk, FileSlice):
            writer.write(chunk)
            continue
        if chunk.size < SENDFILE_MIN_BYTES:
            data = os.pread(chunk.file.fileno(), chunk.size, chunk.position)
        else:
            await writer.drain()
            sent = await loop.sendfile(writer.transport, chunk.file, chunk.position, chunk.size)
            if sent == chunk.size:
                continue
            data = os.pread(chunk.file.fileno(), chunk.size - sent, chunk.position + sent)
        # A segment truncated while its bytes were on the way: pad, so the frame length stays true; the
        # client discards the incomplete last batch as it would any partial batch.
        writer.write(data.ljust(chunk.size, b"\0"))
    await writer.drain()
