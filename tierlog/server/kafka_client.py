"""The broker's own Kafka client, for inter-broker traffic: follower fetches and controller RPCs.

A `KafkaConnection` carries one request at a time, which is how the broker serves a connection anyway, so
a response always answers the request just sent and pipelining would buy nothing. Any failure (connect,
timeout, EOF, a frame that does not decode, a cancelled send) closes the connection: after a request
was written without its response being read, the stream's position is unknown, so the caller opens a new
connection rather than risk reading the next response as the answer to an older request.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from collections.abc import Callable
from functools import cache
from typing import IO, Any, TypeAlias

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.protocol import RequestPayload, ResponsePayload

from tierlog.protocol.api_versions import SUPPORTED_APIS, response_header_version
from tierlog.protocol.framing import SIZE_PREFIX, FramingError, read_frame
from tierlog.protocol.tolerant_reader import Reader, skip_tagged_fields

__all__ = ["MAX_RESPONSE_BYTES", "KafkaConnection", "KafkaConnectionError"]

# Kafka's clients accept responses of any size; a bound still turns a peer that is not a Kafka broker
# (an HTTP server's "HTTP" reads as a 1.2 GB size) into an error instead of a long wait. Kafka's default
# socket.request.max.bytes is generous for every response a broker sends another.
MAX_RESPONSE_BYTES = 100 * 1024 * 1024
# How long close() waits for the peer to acknowledge; the socket is gone either way.
_CLOSE_TIMEOUT_S = 1.0

_REQUEST_HEADER_PREFIX = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_INT32 = struct.Struct(">i")
_INT32_MAX = 2**31 - 1

Writer: TypeAlias = Callable[[IO[bytes], Any], None]


class KafkaConnectionError(Exception):
    """The connection failed (connect, timeout, EOF, malformed response); it is closed and unusable."""


class KafkaConnection:
    """One TCP connection to a Kafka listener; `send` serialises concurrent callers."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, address: str, client_id: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._address = address
        self._client_id = client_id.encode("utf-8")
        self._lock = asyncio.Lock()
        self._next_correlation_id = 0
        self._closed = False

    @classmethod
    async def open(cls, host: str, port: int, *, client_id: str, timeout_s: float) -> KafkaConnection:
        address = f"{host}:{port}"
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            raise KafkaConnectionError(f"connect to {address} timed out after {timeout_s}s") from None
        except OSError as exc:
            raise KafkaConnectionError(f"connect to {address} failed: {exc.strerror or exc}") from None
        return cls(reader, writer, address=address, client_id=client_id)

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, request: RequestPayload, *, timeout_s: float) -> ResponsePayload:
        """Send `request` and return its response entity (the kio response type of its API and version).

        Raises KafkaConnectionError, after closing the connection, if no well-formed response with the
        request's correlation id arrives within `timeout_s` (which includes waiting for earlier senders).
        """
        what = f"{type(request).__name__} v{request.__version__} to {self._address}"
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

    async def _exchange(self, request: RequestPayload, what: str) -> ResponsePayload:
        if self._closed:
            raise KafkaConnectionError(f"{what}: connection is closed")
        correlation_id = self._next_correlation_id
        self._next_correlation_id = 0 if correlation_id == _INT32_MAX else correlation_id + 1
        try:
            self._writer.write(_encode_request(request, correlation_id, self._client_id))
            await self._writer.drain()
            frame = await read_frame(self._reader, MAX_RESPONSE_BYTES)
        except (OSError, FramingError) as exc:
            raise KafkaConnectionError(f"{what}: {exc}") from None
        if frame is None:
            raise KafkaConnectionError(f"{what}: connection closed by the peer")
        try:
            return _decode_response(request, correlation_id, frame)
        except KafkaConnectionError as exc:
            raise KafkaConnectionError(f"{what}: {exc}") from None
        # kio's reader raises its own errors, ValueError, UnicodeDecodeError...: all mean a bad frame.
        except Exception as exc:
            raise KafkaConnectionError(f"{what}: malformed response: {exc!r}") from None

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


def _encode_request(request: RequestPayload, correlation_id: int, client_id: bytes) -> bytes:
    out = io.BytesIO()
    out.write(bytes(SIZE_PREFIX.size))  # filled in below
    # Request header v1, or v2 in flexible versions; the client id is an int16-length string in both.
    out.write(_REQUEST_HEADER_PREFIX.pack(request.__api_key__, request.__version__, correlation_id, len(client_id)))
    out.write(client_id)
    if request.__flexible__:
        out.write(b"\x00")  # no tagged fields
    _request_writer(type(request))(out, request)
    with out.getbuffer() as frame:
        SIZE_PREFIX.pack_into(frame, 0, len(frame) - SIZE_PREFIX.size)
    return out.getvalue()


def _decode_response(request: RequestPayload, correlation_id: int, frame: bytes) -> ResponsePayload:
    if len(frame) < _INT32.size:
        raise KafkaConnectionError(f"response frame of {len(frame)} bytes has no correlation id")
    (received,) = _INT32.unpack_from(frame)
    if received != correlation_id:
        raise KafkaConnectionError(f"correlation id {received} answers no request (expected {correlation_id})")
    # kio's reader refuses writable buffers; a read-only view of `bytes` costs nothing.
    view = memoryview(frame).toreadonly()
    position = _INT32.size
    if _response_header_version(request) == 1:
        position += skip_tagged_fields(view, position)
    body: ResponsePayload
    body, _ = _response_reader(request.__api_key__, request.__version__)(view, position)
    return body


def _response_header_version(request: RequestPayload) -> int:
    if request.__api_key__ in SUPPORTED_APIS:
        return response_header_version(request.__api_key__, request.__version__)
    # The controller's APIs (BrokerRegistration, BrokerHeartbeat, ...) are not in the client-facing table;
    # the rule is the same (ApiVersions, the one exception, is in the table).
    return 1 if request.__flexible__ else 0


@cache
def _request_writer(request_type: type[RequestPayload]) -> Writer:
    writer: Writer = entity_writer(request_type)
    return writer


@cache
def _response_reader(api_key: int, api_version: int) -> Reader:
    reader: Reader = entity_reader(load_response_schema(api_key, api_version))
    return reader
