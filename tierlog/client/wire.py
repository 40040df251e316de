"""A request as the bytes of its frame and a response frame as its kio entity, without any I/O.

The request header is v1, or v2 in flexible versions (KIP-482); the response header is v0, or v1 in flexible
versions, except ApiVersions, which always answers with v0 (KIP-511).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from functools import cache
from typing import IO, Any, TypeAlias

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.protocol import RequestPayload, ResponsePayload

from tierlog.client.lenient_responses import LENIENT_RESPONSES
from tierlog.protocol.api_versions import SUPPORTED_APIS, response_header_version
from tierlog.protocol.framing import SIZE_PREFIX
from tierlog.protocol.tolerant_reader import Reader, skip_tagged_fields

__all__ = ["MAX_RESPONSE_BYTES", "MalformedResponseError", "decode_response", "encode_request"]

# Kafka's clients accept responses of any size; a bound still turns a peer that is not a Kafka broker
# (an HTTP server's "HTTP" reads as a 1.2 GB size) into an error instead of a long wait. Kafka's default
# socket.request.max.bytes is generous for every response a broker sends another.
MAX_RESPONSE_BYTES = 100 * 1024 * 1024

_REQUEST_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

Writer: TypeAlias = Callable[[IO[bytes], Any], None]


class MalformedResponseError(Exception):
    """The frame is not the response to the request it should answer."""


def encode_request(request: RequestPayload, correlation_id: int, client_id: str | None) -> bytes:
    """The whole frame of `request`, size prefix included."""
    out = io.BytesIO()
    out.write(bytes(SIZE_PREFIX.size))  # filled in below
    out.write(_REQUEST_HEADER_PREFIX.pack(request.__api_key__, request.__version__, correlation_id))
    # The client id is an int16-length nullable string in both header versions.
    if client_id is None:
        out.write(_INT16.pack(-1))
    else:
        encoded = client_id.encode("utf-8")
        out.write(_INT16.pack(len(encoded)))
        out.write(encoded)
    if request.__flexible__:
        out.write(b"\x00")  # no tagged fields
    _request_writer(type(request))(out, request)
    with out.getbuffer() as frame:
        SIZE_PREFIX.pack_into(frame, 0, len(frame) - SIZE_PREFIX.size)
    return out.getvalue()


def decode_response(request: RequestPayload, correlation_id: int, frame: bytes) -> ResponsePayload:
    """The response entity in `frame` (without its size prefix), which must answer `request` sent with
    `correlation_id`; raises MalformedResponseError otherwise."""
    if len(frame) < _INT32.size:
        raise MalformedResponseError(f"response frame of {len(frame)} bytes has no correlation id")
    (received,) = _INT32.unpack_from(frame)
    if received != correlation_id:
        raise MalformedResponseError(f"correlation id {received} answers no request (expected {correlation_id})")
    try:
        # kio's reader refuses writable buffers; a read-only view of `bytes` costs nothing.
        view = memoryview(frame).toreadonly()
        position = _INT32.size
        if _response_header_version(request) == 1:
            position += skip_tagged_fields(view, position)
        body: ResponsePayload
        body, _ = _response_reader(request.__api_key__, request.__version__)(view, position)
    # kio's reader raises its own errors, ValueError, UnicodeDecodeError...: all mean a bad frame.
    except Exception as exc:
        raise MalformedResponseError(f"malformed response: {exc!r}") from None
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
    schema = LENIENT_RESPONSES.get((api_key, api_version)) or load_response_schema(api_key, api_version)
    reader: Reader = entity_reader(schema)
    return reader
