"""One client connection: read frames, answer them in order, send record bytes with sendfile (with reads of the
file on a TLS connection, which sendfile cannot carry).

Like Kafka, a connection is served one request at a time (Kafka mutes the channel until the response is
sent), so responses always leave in request order even when a fetch waits in the purgatory. Bad input
closes only this connection, with one log line; everyone else is served on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from tierlog.protocol.api_versions import enabled_apis
from tierlog.protocol.codec import (
    InvalidRequest,
    UnsupportedVersion,
    api_versions_fallback,
    encode_response,
    parse_request,
)
from tierlog.protocol.framing import FramingError, read_frame
from tierlog.security.ssl_context import NoMatchingRuleError, SslPrincipalMapper
from tierlog.server.kafka_apis import API_API_VERSIONS, KafkaApis
from tierlog.server.request_context import authenticated_as, enter_connection
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)

# Below this size a pread + write is cheaper than handing the socket to sendfile.
SENDFILE_MIN_BYTES = 64 * 1024
# Largest read of record bytes sent on a TLS connection (it becomes several TLS records either way).
TLS_READ_BYTES = 1024 * 1024


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    apis: KafkaApis,
    max_request_bytes: int,
    listener_name: str = "",
    *,
    security_protocol: str = "PLAINTEXT",
    ssl_principal_mapper: SslPrincipalMapper | None = None,
) -> None:
    peer = writer.get_extra_info("peername")
    enter_connection(f"/{peer[0]}" if isinstance(peer, tuple) and peer else "", listener_name)
    if security_protocol == "SSL" and not _authenticate_certificate(writer, ssl_principal_mapper, peer):
        writer.close()
        return
    served = enabled_apis(apis.handlers.keys())
    try:
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


async def send_chunks(writer: asyncio.StreamWriter, chunks: Sequence[bytes | memoryview | FileSlice]) -> None:
    loop = asyncio.get_running_loop()
    # TLS encrypts in user space, so the kernel cannot send the file itself: asyncio's sendfile fallback would
    # read it in 256 KiB blocks through a thread pool; reading it here in large preads is simpler and faster
    # (bench/tls.py). docs/security.md#tls.
    tls = writer.get_extra_info("sslcontext") is not None
    for chunk in chunks:
        if not isinstance(chunk, FileSlice):
            writer.write(chunk)
            continue
        if tls:
            await _send_file_slice_by_reads(writer, chunk)
            continue
        if chunk.size < SENDFILE_MIN_BYTES:
            data = os.pread(chunk.file.fileno(), chunk.size, chunk.position)
        else:
            await writer.drain()
            sent = await loop.sendfile(writer.transport, chunk.file, chunk.position, chunk.size)
            if sent == chunk.size:
                continue
            data = os.pread(chunk.file.fileno(), chunk.size - sent, chunk.position + sent)
        writer.write(_padded(data, chunk.size))
    await writer.drain()


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
