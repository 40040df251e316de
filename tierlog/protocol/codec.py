"""Requests from frames, responses to chunks: everything between a frame's bytes and kio entities.

Parsing: the fixed request-header prefix (api key, version, correlation id) is read by hand first, so
a version we do not serve is refused before kio is touched, with the correlation id needed to answer
it. The body is parsed by `tolerant_reader`: kio's native field readers for primitives, with the struct
walk in Python, because kio's native entity reader raises on unknown tagged fields (KIP-482 says skip
them) and allocates whatever length a forged array claims, aborting the process (found by fuzzing). It
costs about 30 us more per 8-partition Produce request. Whatever the bytes, `parse_request` raises only
`UnsupportedVersion` or `InvalidRequest`.

A records blob (Produce) is copied exactly once, by kio, out of the frame into its own `bytes`.

Encoding: Fetch responses go through the hand-written chunk encoder (`fetch_response`), every other
response through kio's serialiser into a single `bytes` chunk.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16
from kio.static.protocol import RequestPayload, ResponsePayload

from tierlog.protocol.api_versions import (
    API_VERSIONS_KEY,
    SUPPORTED_APIS,
    ApiSupport,
    response_header_version,
    supported_api_versions,
)
from tierlog.protocol.fetch_response import (
    FETCH_KEY,
    ResponseChunk,
    SupportsFileSlice,
    encode_fetch_response,
)
from tierlog.protocol.tolerant_reader import Reader, skip_tagged_fields, tolerant_entity_reader

__all__ = [
    "InvalidRequest",
    "Request",
    "ResponseChunk",
    "SupportsFileSlice",
    "UnsupportedVersion",
    "api_versions_fallback",
    "encode_response",
    "parse_request",
    "unsupported_version_response",
]

_HEADER_PREFIX = struct.Struct(">hhi")  # request_api_key, request_api_version, correlation_id
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class InvalidRequest(Exception):
    """The frame is not a well-formed request; Kafka closes the connection."""


class UnsupportedVersion(Exception):
    """An API key or version outside the served table.

    For ApiVersions the broker answers with `api_versions_fallback` (KIP-511); for any other API it
    closes the connection, as Kafka does. `unsupported_version_response` makes that choice.
    """

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"unsupported API key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # The kio request entity of (api_key, api_version), e.g. kio.schema.produce.v9.ProduceRequest.
    body: RequestPayload
    # Bytes of the frame, without its 4-byte size prefix.
    size: int


@cache
def _request_type(api_key: int, api_version: int) -> type[RequestPayload]:
    return load_request_schema(api_key, api_version)


@cache
def _reader(api_key: int, api_version: int) -> Reader:
    return tolerant_entity_reader(_request_type(api_key, api_version))


def parse_request(frame: bytes, apis: Mapping[int, ApiSupport] = SUPPORTED_APIS) -> Request:
    """Parse one frame (without its size prefix) into a Request.

    Raises UnsupportedVersion for an API key or version outside `apis`, InvalidRequest for anything
    that is not a well-formed request of its version (truncated, bad strings, ...). Bytes after the body
    are ignored, as in Kafka.
    """
    size = len(frame)
    if size < _HEADER_PREFIX.size:
        raise InvalidRequest(f"frame of {size} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    api = apis.get(api_key)
    if api is None or not api.serves(api_version):
        raise UnsupportedVersion(api_key, api_version, correlation_id)

    # kio's Rust reader refuses writable buffers; a read-only view of `bytes` costs nothing.
    view = memoryview(frame).toreadonly()
    try:
        client_id, position = _read_client_id(view, _HEADER_PREFIX.size)
        if api.is_flexible(api_version):
            position += skip_tagged_fields(view, position)
        body, _ = _reader(api_key, api_version)(view, position)
    except InvalidRequest:
        raise
    # kio's native field readers raise their own errors, ValueError, UnicodeDecodeError...: every failure of a
    # client's bytes is the client's malformed request, never a broker error.
    except Exception as exc:
        raise InvalidRequest(
            f"malformed {api.name} v{api_version} request (correlation id {correlation_id}): {exc!r}"
        ) from exc
    # Bytes after the body are ignored, as Kafka does: librdkafka's Metadata v12 "all topics" request
    # carries three left over from an array-count placeholder.
    return Request(api_key, api_version, correlation_id, client_id, body, size)


def _read_client_id(view: memoryview, offset: int) -> tuple[str | None, int]:
    # Always a nullable int16-length string, even in request header v2 (RequestHeader.json).
    if offset + 2 > len(view):
        raise InvalidRequest("frame ends inside the client id")
    (length,) = _INT16.unpack_from(view, offset)
    offset += 2
    if length < 0:
        return None, offset
    end = offset + length
    if end > len(view):
        raise InvalidRequest("frame ends inside the client id")
    # Java decodes it leniently (new String(bytes, UTF_8)); so do we, it only names the client.
    return bytes(view[offset:end]).decode("utf-8", errors="replace"), end


def encode_response(request: Request, body: ResponsePayload) -> list[ResponseChunk]:
    """The whole response frame: size prefix, response header, body, as chunks to write in order.

    Only Fetch responses may hold file slices (in `records`); they become chunks of their own and are
    never read. Raises ValueError if `body` is not the response type of the request's API and version.
    """
    body_type = type(body)
    if body_type.__api_key__ != request.api_key or body_type.__version__ != request.api_version:
        raise ValueError(
            f"{body_type.__name__} v{body_type.__version__} does not answer api key "
            f"{request.api_key} v{request.api_version}"
        )
    if request.api_key == FETCH_KEY:
        return encode_fetch_response(request.correlation_id, request.api_version, body)
    header_version = response_header_version(request.api_key, request.api_version)
    return [_encode_entity(request.correlation_id, header_version, body)]


def _encode_entity(correlation_id: int, header_version: int, body: ResponsePayload) -> bytes:
    out = io.BytesIO()
    out.write(bytes(_INT32.size))  # the size prefix, filled in below
    out.write(_INT32.pack(correlation_id))
    if header_version == 1:
        out.write(b"\x00")  # response header v1: no tagged fields
    entity_writer(type(body))(out, body)
    with out.getbuffer() as frame:
        _INT32.pack_into(frame, 0, len(frame) - _INT32.size)
    return out.getvalue()


def api_versions_fallback(correlation_id: int, enabled_keys: Iterable[int] = SUPPORTED_APIS) -> list[bytes]:
    """The answer to an ApiVersions request of a version we do not serve (KIP-511).

    An ApiVersions v0 response (header v0, which every client can read whatever version it sent) with
    UNSUPPORTED_VERSION and our API list; the client retries with the highest ApiVersions version of
    that list it knows.
    """
    response_type = load_response_schema(API_VERSIONS_KEY, 0)
    entry_type = load_payload_module(API_VERSIONS_KEY, 0, EntityType.response).ApiVersion
    body = response_type(
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            entry_type(api_key=i16(key), min_version=i16(low), max_version=i16(high))
            for key, low, high in supported_api_versions(enabled_keys)
        ),
    )
    return [_encode_entity(correlation_id, 0, body)]


def unsupported_version_response(
    error: UnsupportedVersion, enabled_keys: Iterable[int] = SUPPORTED_APIS
) -> list[bytes] | None:
    """What to send for an UnsupportedVersion: the fallback for ApiVersions, None (close) otherwise."""
    if error.api_key == API_VERSIONS_KEY:
        return api_versions_fallback(error.correlation_id, enabled_keys)
    return None
