"""A minimal HTTP/1.1 server for the broker's observability endpoints (`/metrics`, `/v1/...`).

GET only, one request per connection (`Connection: close`), no request bodies: that is all a Prometheus
scraper, curl or a browser needs, and it keeps the server small enough to read in one sitting. A handler
returns a whole `HttpResponse`, or a `StreamingResponse` whose chunks are sent with chunked transfer
encoding as they come (the live trace stream), until the iterator ends, the client hangs up, or the server
stops; the iterator is closed (`aclose`) in every case, so a subscription it holds is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

__all__ = ["Handler", "HttpResponse", "HttpServer", "StreamingResponse", "text_response"]

logger = logging.getLogger(__name__)

# A request head (request line and headers) larger than this is refused: no client of these endpoints
# sends more than a few hundred bytes.
MAX_REQUEST_HEAD_BYTES = 16 * 1024
MAX_REQUEST_HEADERS = 100
# A client that opens a connection and sends nothing must not hold it forever.
REQUEST_HEAD_TIMEOUT_S = 10.0
# How long `stop` lets connections finish (a stream's last chunk, a slow client draining) before cancelling.
STOP_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class StreamingResponse:
    """A 200 response whose body is `chunks`, sent as they come with chunked transfer encoding."""

    content_type: str
    chunks: AsyncIterator[bytes]


Handler = Callable[[dict[str, str]], Awaitable[HttpResponse | StreamingResponse]]


def text_response(status: int, message: str) -> HttpResponse:
    """A one-line plain-text response, e.g. the reason of a 400."""
    return HttpResponse(status, "text/plain; charset=utf-8", f"{message}\n".encode())


class _BadRequest(Exception):
    pass


class HttpServer:
    """Serves `routes` (exact paths, e.g. "/metrics") to GET requests; the query string is parsed into a
    dict (the last value of a repeated name wins)."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (port 0: any free port) and return the bound port."""
        if self._server is not None:
            raise RuntimeError("HTTP server already started")
        self._stopping = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST_HEAD_BYTES)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Stop listening, end live streams (each gets its terminating chunk) and close every connection;
        returns within about twice STOP_GRACE_S whatever handlers and clients do."""
        if self._server is None:
            return
        self._server.close()
        self._stopping.set()
        if self._connections:
            _, pending = await asyncio.wait(self._connections, timeout=STOP_GRACE_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=STOP_GRACE_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        try:
            if self._stopping.is_set():
                return
            try:
                async with asyncio.timeout(REQUEST_HEAD_TIMEOUT_S):
                    request_line = await _read_head(reader)
            except (TimeoutError, asyncio.IncompleteReadError):
                return  # nothing to answer: the client went quiet or away mid-request
            except _BadRequest as exc:
                await _send(writer, text_response(HTTPStatus.BAD_REQUEST, str(exc)))
                return
            response = await self._respond(request_line)
            if isinstance(response, StreamingResponse):
                await self._stream(reader, writer, response)
            else:
                await _send(writer, response)
        except ConnectionError:
            pass  # the client hung up; nobody to tell
        finally:
            writer.close()

    async def _respond(self, request_line: str) -> HttpResponse | StreamingResponse:
        parts = request_line.split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not parts[1]:
            return text_response(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, _version = parts
        if method != "GET":
            return text_response(HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} not allowed: GET only")
        try:
            url = urlsplit(target)
        except ValueError:
            return text_response(HTTPStatus.BAD_REQUEST, "malformed request target")
        handler = self._routes.get(url.path)
        if handler is None:
            return text_response(HTTPStatus.NOT_FOUND, f"no such path: {url.path}")
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        try:
            return await handler(query)
        except Exception:
            logger.exception("HTTP handler of %s failed", url.path)
            return text_response(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: StreamingResponse
    ) -> None:
        pump = asyncio.ensure_future(_pump(writer, response))
        hangup = asyncio.ensure_future(_wait_for_hangup(reader))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({pump, hangup, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                error = pump.exception()
                # A hangup while writing is nobody's fault. Any other error cuts the body short without its
                # last chunk, which tells the client it is incomplete.
                if error is not None and not isinstance(error, ConnectionError):
                    logger.error("HTTP stream failed", exc_info=error)
                return
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await pump
            if not hangup.done():
                # Stopping: end the body properly, so the client sees a complete response, not a cut.
                writer.write(b"0\r\n\r\n")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_GRACE_S):
                        await writer.drain()
        finally:
            for waiter in (pump, hangup, stopping):
                waiter.cancel()
            await _close_chunks(response.chunks)


async def _read_head(reader: asyncio.StreamReader) -> str:
    """The request line; the headers are read and ignored (nothing here depends on them)."""
    lines: list[bytes] = []
    size = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise _BadRequest("request head too large") from None
        size += len(line)
        if size > MAX_REQUEST_HEAD_BYTES or len(lines) > MAX_REQUEST_HEADERS:
            raise _BadRequest("request head too large")
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line)
    if not lines:
        raise _BadRequest("empty request")
    try:
        return lines[0].rstrip(b"\r\n").decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest("request line is not ASCII") from None


async def _pump(writer: asyncio.StreamWriter, response: StreamingResponse) -> None:
    writer.write(
        _head(
            HTTPStatus.OK,
            [("Content-Type", response.content_type), ("Transfer-Encoding", "chunked"), ("Connection", "close")],
        )
    )
    async for chunk in response.chunks:
        # An empty chunk would read as the end of the body.
        if chunk:
            writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _close_chunks(chunks: AsyncIterator[bytes]) -> None:
    aclose = getattr(chunks, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        logger.exception("closing an HTTP stream's iterator failed")


async def _wait_for_hangup(reader: asyncio.StreamReader) -> None:
    # Whatever else the client sends (a pipelined request) is discarded: one request per connection. EOF
    # means the client is gone: HTTP clients do not half-close while they wait for a response.
    with contextlib.suppress(ConnectionError):
        while await reader.read(4096):
            pass


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send(writer: asyncio.StreamWriter, response: HttpResponse) -> None:
    headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body)))]
    if response.status == HTTPStatus.METHOD_NOT_ALLOWED:
        headers.append(("Allow", "GET"))
    headers.append(("Connection", "close"))
    writer.write(_head(response.status, headers) + response.body)
    await writer.drain()
