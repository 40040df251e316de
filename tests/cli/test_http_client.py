"""The HTTP client of `cluster status` and `trace` (tierlog.cli.cluster.http_get, on aiohttp's client) against
raw servers that answer well, slowly, wrongly or not at all: the body as it arrives, and one-line HttpErrors
for everything short of a 200."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from asyncio_helpers import run_bounded

from tierlog.cli.cluster import HttpError, http_get, http_get_json
from tierlog.testing.local_cluster import free_port

HOST = "127.0.0.1"
TIMEOUT_S = 1.0

Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(respond: Respond) -> AsyncIterator[str]:
    """A server that reads a request head and then does what `respond` does; yields its host:port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await respond(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, HOST, 0)
    try:
        yield f"{HOST}:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def chunked_head(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
    await writer.drain()


def test_a_chunked_body_is_read_as_it_arrives() -> None:
    async def scenario() -> list[bytes]:
        first_chunk_read = asyncio.Event()

        async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await chunked_head(writer)
            writer.write(b'6\r\n{"a":1\r\n')
            await writer.drain()
            await first_chunk_read.wait()
            writer.write(b"2\r\n}\n\r\n0\r\n\r\n")
            await writer.drain()

        async with raw_server(respond) as address, http_get(address, "/v1/trace?topic=t", TIMEOUT_S) as body:
            # The rest is sent only once the first chunk is in: a client waiting for the end would hang here.
            async with asyncio.timeout(TIMEOUT_S):
                first = await anext(body)
            first_chunk_read.set()
            return [first, *[chunk async for chunk in body]]

    chunks = run_bounded(scenario)
    assert chunks[0] == b'{"a":1'
    assert b"".join(chunks) == b'{"a":1}\n'


def test_a_sized_body_is_read_whole() -> None:
    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{"partitions":1}')

    async def scenario() -> Any:
        async with raw_server(respond) as address:
            return await http_get_json(address, "/v1/partitions", TIMEOUT_S)

    assert run_bounded(scenario) == {"partitions": 1}


async def answer_404(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # until the client gives up


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    pass


async def answer_not_in_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


@pytest.mark.parametrize(
    ("respond", "path", "error"),
    [
        (answer_404, "/v1/trace", r"^127\.0\.0\.1:\d+ answered GET /v1/trace with HTTP 404 Not Found$"),
        (never_answer, "/v1/partitions", r"did not answer GET /v1/partitions within 1s$"),
        (close_at_once, "/v1/partitions", "closed the connection before answering GET /v1/partitions"),
        (answer_not_in_http, "/v1/partitions", "did not answer GET /v1/partitions in HTTP"),
    ],
    ids=["other-than-200", "never-answers-within-the-timeout", "closes-without-answering", "not-http"],
)
def test_a_server_that_does_not_answer_200_in_time_is_an_http_error(respond: Respond, path: str, error: str) -> None:
    async def scenario() -> None:
        async with raw_server(respond) as address, http_get(address, path, TIMEOUT_S):
            pass

    with pytest.raises(HttpError, match=error):
        run_bounded(scenario)


def test_an_unreachable_address_is_an_http_error() -> None:
    address = f"{HOST}:{free_port()}"

    async def scenario() -> None:
        async with http_get(address, "/v1/partitions", TIMEOUT_S):
            pass

    with pytest.raises(HttpError, match=f"^cannot reach {address}: "):
        run_bounded(scenario)


def test_a_body_cut_short_raises_connection_error() -> None:
    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await chunked_head(writer)
        writer.write(b"4\r\nline\r\n")  # and then the connection closes, without the last chunk

    async def scenario() -> list[bytes]:
        received = []
        async with raw_server(respond) as address, http_get(address, "/v1/trace", TIMEOUT_S) as body:
            async for chunk in body:
                received.append(chunk)
        return received

    with pytest.raises(ConnectionError, match="the answer to GET /v1/trace broke off"):
        run_bounded(scenario)
