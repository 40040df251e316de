"""HttpServer (aiohttp) over real sockets: routing and status codes, HEAD and other methods, malformed requests,
idle connections, whole and streamed (chunked) responses, streams that end when the client hangs up or the
server stops, with their iterator closed every time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from asyncio_helpers import run_bounded

from tierlog.server import http_server
from tierlog.server.http_server import HttpServer, stream_response, text_response

HOST = "127.0.0.1"
WAIT_S = 5.0
BODY = b"metric 1.0\n"


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


async def read_head(reader: asyncio.StreamReader) -> tuple[int, str, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *header_lines = head[:-4].split("\r\n")
    version, status, reason = status_line.split(" ", 2)
    assert version in ("HTTP/1.0", "HTTP/1.1")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return int(status), reason, headers


async def exchange(port: int, request: bytes) -> Reply:
    """Send raw request bytes; read the whole response (the server closes the connection after it)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        await writer.drain()
        status, reason, headers = await read_head(reader)
        body = await reader.read()  # until EOF: Connection: close
        return Reply(status, reason, headers, body)
    finally:
        writer.close()


async def get(port: int, target: str, method: str = "GET") -> Reply:
    return await exchange(port, f"{method} {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    """One chunk of a chunked body; b"" is the terminating chunk (whose trailer must be empty)."""
    size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
    data = await reader.readexactly(size + 2)
    assert data.endswith(b"\r\n")
    return data[:-2]


@dataclass
class Recorder:
    """A handler that answers with a fixed body and remembers the queries it got."""

    queries: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        return web.Response(body=BODY, headers={"Content-Type": "text/plain; version=0.0.4"})


async def serve(routes: Iterable[web.RouteDef], body: Callable[[int], Awaitable[Any]]) -> Any:
    server = HttpServer(routes)
    port = await server.start(HOST, 0)
    try:
        return await body(port)
    finally:
        await server.stop()


async def serve_metrics(recorder: Recorder, body: Callable[[int], Awaitable[Any]]) -> Any:
    return await serve([web.get("/metrics", recorder.handle)], body)


def test_get_of_a_route_answers_its_body_with_its_length() -> None:
    recorder = Recorder()
    reply: Reply = run_bounded(lambda: serve_metrics(recorder, lambda port: get(port, "/metrics?x=a%20b")))
    assert (reply.status, reply.reason) == (200, "OK")
    assert reply.headers["content-type"] == "text/plain; version=0.0.4"
    assert reply.headers["content-length"] == str(len(BODY))
    assert reply.body == BODY
    assert recorder.queries == [{"x": "a b"}]


def test_a_client_may_send_several_requests_on_one_connection() -> None:
    async def body(port: int) -> list[bytes]:
        reader, writer = await asyncio.open_connection(HOST, port)
        bodies = []
        for _ in range(3):
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, headers = await read_head(reader)
            assert status == 200 and headers.get("connection") != "close"
            bodies.append(await reader.readexactly(int(headers["content-length"])))
        writer.close()
        return bodies

    assert run_bounded(lambda: serve([web.get("/metrics", Recorder().handle)], body)) == [BODY] * 3


def test_an_http_1_0_request_is_answered() -> None:
    request = b"GET /m HTTP/1.0\r\n\r\n"
    reply: Reply = run_bounded(lambda: serve([web.get("/m", Recorder().handle)], lambda port: exchange(port, request)))
    assert (reply.status, reply.body) == (200, BODY)


def test_an_unknown_path_is_404() -> None:
    reply: Reply = run_bounded(
        lambda: serve([web.get("/metrics", Recorder().handle)], lambda port: get(port, "/nope?x=1"))
    )
    assert (reply.status, reply.reason) == (404, "Not Found")
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"


def test_head_of_a_get_route_answers_its_head_without_the_body() -> None:
    recorder = Recorder()
    reply: Reply = run_bounded(lambda: serve_metrics(recorder, lambda port: get(port, "/metrics", "HEAD")))
    assert reply.status == 200
    assert reply.headers["content-length"] == str(len(BODY))
    assert reply.body == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_other_methods_are_405_with_allow_get_and_head(method: str) -> None:
    recorder = Recorder()
    reply: Reply = run_bounded(lambda: serve_metrics(recorder, lambda port: get(port, "/metrics", method)))
    assert (reply.status, reply.reason) == (405, "Method Not Allowed")
    assert reply.headers["allow"] == "GET,HEAD"
    assert recorder.queries == []


def test_a_get_only_route_refuses_head_with_405() -> None:
    route = web.get("/stream", Recorder().handle, allow_head=False)
    reply: Reply = run_bounded(lambda: serve([route], lambda port: get(port, "/stream", "HEAD")))
    assert reply.status == 405
    assert reply.headers["allow"] == "GET"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"BREW /metrics HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",
        b"GET /m\xff HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: t\r\n" + b"X-Long: " + b"a" * (20 * 1024) + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: t\r\n" + b"X: y\r\n" * 200 + b"\r\n",
    ],
    ids=["garbage", "unknown-method", "http-1.1-without-host", "non-ascii", "long-header", "many-headers"],
)
def test_a_malformed_request_is_400(request_bytes: bytes) -> None:
    recorder = Recorder()
    reply: Reply = run_bounded(lambda: serve_metrics(recorder, lambda port: exchange(port, request_bytes)))
    assert reply.status == 400
    assert recorder.queries == []


def test_a_failing_handler_is_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(_request: web.Request) -> web.Response:
        raise RuntimeError("boom")

    reply: Reply = run_bounded(lambda: serve([web.get("/broken", broken)], lambda port: get(port, "/broken")))
    assert reply.status == 500
    assert "Error handling request" in caplog.text and "RuntimeError: boom" in caplog.text


def test_a_handler_chooses_its_status_with_a_one_line_text_response() -> None:
    async def bad(_request: web.Request) -> web.Response:
        return text_response(400, "missing query parameter: topic")

    reply: Reply = run_bounded(lambda: serve([web.get("/bad", bad)], lambda port: get(port, "/bad")))
    assert (reply.status, reply.reason, reply.body) == (400, "Bad Request", b"missing query parameter: topic\n")
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"


def test_a_client_that_closes_without_a_request_gets_nothing_and_the_server_carries_on() -> None:
    async def body(port: int) -> Reply:
        _reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /metr")
        writer.close()
        return await get(port, "/metrics")

    reply: Reply = run_bounded(lambda: serve([web.get("/metrics", Recorder().handle)], body))
    assert reply.status == 200


def test_a_connection_without_a_request_is_closed_after_the_idle_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "IDLE_CONNECTION_TIMEOUT_S", 0.3)

    async def body(port: int) -> float:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # and never the rest of the head
        started = time.monotonic()
        assert await reader.read() == b""
        writer.close()
        return time.monotonic() - started

    assert run_bounded(lambda: serve([web.get("/metrics", Recorder().handle)], body)) < 3.0


# --- streaming ----------------------------------------------------------------------------------------


@dataclass
class Stream:
    """A streaming handler's iterator: yields what is put into `feed` (None ends it), records its end."""

    feed: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        self.opened.set()
        try:
            while (chunk := await self.feed.get()) is not None:
                yield chunk
        finally:
            self.closed.set()

    def route(self, path: str = "/stream") -> web.RouteDef:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await stream_response(request, "application/x-ndjson", self.chunks())

        return web.get(path, handle, allow_head=False)


async def open_stream(port: int, target: str = "/stream") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    await writer.drain()
    status, _, headers = await read_head(reader)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == "application/x-ndjson"
    assert "content-length" not in headers
    return reader, writer


def test_a_stream_sends_each_chunk_as_it_comes_and_ends_with_the_last_chunk() -> None:
    stream = Stream()

    async def body(port: int) -> None:
        reader, writer = await open_stream(port)
        for line in (b'{"a":1}\n', b'{"b":2}\n'):
            await stream.feed.put(line)
            assert await read_chunk(reader) == line
        await stream.feed.put(b"")  # skipped: an empty chunk would end the body
        await stream.feed.put(b"x" * 70_000)
        received = b""
        while len(received) < 70_000:
            received += await read_chunk(reader)
        assert received == b"x" * 70_000
        await stream.feed.put(None)
        assert await read_chunk(reader) == b""
        writer.close()
        await asyncio.wait_for(stream.closed.wait(), WAIT_S)

    run_bounded(lambda: serve([stream.route()], body))


def test_a_stream_whose_client_hangs_up_is_closed_while_it_waits_for_a_chunk() -> None:
    stream = Stream()

    async def body(port: int) -> None:
        _reader, writer = await open_stream(port)
        await asyncio.wait_for(stream.opened.wait(), WAIT_S)
        writer.close()
        # Nothing is ever fed: the iterator is closed because the client went away, not because it ended.
        await asyncio.wait_for(stream.closed.wait(), WAIT_S)

    run_bounded(lambda: serve([stream.route()], body))


def test_stop_ends_live_streams_with_their_last_chunk_and_closes_their_iterators() -> None:
    streams = [Stream(), Stream()]

    async def scenario() -> float:
        server = HttpServer([s.route(f"/s{i}") for i, s in enumerate(streams)])
        port = await server.start(HOST, 0)
        clients = [await open_stream(port, f"/s{i}") for i in range(len(streams))]
        await streams[0].feed.put(b"first\n")
        assert await read_chunk(clients[0][0]) == b"first\n"
        await asyncio.gather(*(s.opened.wait() for s in streams))
        started = time.monotonic()
        await server.stop()
        elapsed = time.monotonic() - started
        for (reader, writer), stream in zip(clients, streams, strict=True):
            assert stream.closed.is_set()
            assert await read_chunk(reader) == b""
            assert await reader.read() == b""
            writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, port)
        return elapsed

    assert run_bounded(scenario) < 1.0


def test_stop_is_bounded_when_a_client_never_sends_its_request() -> None:
    async def scenario() -> float:
        server = HttpServer([web.get("/metrics", Recorder().handle)])
        port = await server.start(HOST, 0)
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # and never the blank line
        await writer.drain()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await server.stop()
        elapsed = time.monotonic() - started
        assert await reader.read() == b""
        writer.close()
        return elapsed

    assert run_bounded(scenario) < 1.0


def test_stop_is_bounded_when_a_handler_never_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "STOP_GRACE_S", 0.2)
    cancelled = asyncio.Event()

    async def forever(_request: web.Request) -> web.Response:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    async def scenario() -> float:
        server = HttpServer([web.get("/forever", forever)])
        port = await server.start(HOST, 0)
        _reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /forever HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await server.stop()
        elapsed = time.monotonic() - started
        assert cancelled.is_set()
        writer.close()
        return elapsed

    assert run_bounded(scenario) < 1.5


def test_a_stream_whose_iterator_fails_is_cut_without_its_last_chunk(caplog: pytest.LogCaptureFixture) -> None:
    closed = asyncio.Event()

    async def failing() -> AsyncGenerator[bytes, None]:
        try:
            yield b"one\n"
            raise RuntimeError("iterator broke")
        finally:
            closed.set()

    async def handle(request: web.Request) -> web.StreamResponse:
        return await stream_response(request, "application/x-ndjson", failing())

    async def body(port: int) -> bytes:
        reader, writer = await open_stream(port)
        assert await read_chunk(reader) == b"one\n"
        rest = await reader.read()
        writer.close()
        return rest

    assert run_bounded(lambda: serve([web.get("/stream", handle)], body)) == b""
    assert closed.is_set()
    assert "RuntimeError: iterator broke" in caplog.text


def test_start_returns_the_bound_port_refuses_a_second_start_and_works_again_after_stop() -> None:
    async def scenario() -> None:
        server = HttpServer([])
        port = await server.start(HOST, 0)
        assert port > 0
        with pytest.raises(RuntimeError, match="already started"):
            await server.start(HOST, 0)
        await server.stop()
        await server.stop()  # idempotent
        port = await server.start(HOST, 0)  # and startable again
        reply = await get(port, "/nope")
        await server.stop()
        assert reply.status == 404

    run_bounded(scenario)


def test_start_on_a_port_in_use_raises_and_leaves_the_server_stopped() -> None:
    async def scenario() -> None:
        first = HttpServer([])
        port = await first.start(HOST, 0)
        second = HttpServer([])
        try:
            with pytest.raises(OSError):
                await second.start(HOST, port)
            await second.stop()  # nothing to stop
        finally:
            await first.stop()

    run_bounded(scenario)
