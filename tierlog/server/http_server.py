"""The broker's observability endpoints (`/metrics`, `/v1/...`) on aiohttp's HTTP server.

aiohttp parses requests, keeps connections alive, answers what no route takes (404; 405 with an Allow
header) and refuses malformed requests (400). On top of it this module gives the broker a listener it starts
and stops with bounded time, and streamed responses (the live trace) that end with their last chunk when the
broker stops and close their iterator whatever ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable

from aiohttp import hdrs, web

__all__ = ["HttpServer", "stream_response", "text_response"]

# A connection with no request for this long is closed: longer than Prometheus' default scrape interval (one
# minute), so a scraper keeps its connection, while a client that connects and sends nothing is let go.
IDLE_CONNECTION_TIMEOUT_S = 75.0
# How long `stop` lets a request finish (a stream's last chunk, a slow client draining) before cancelling it;
# stopping takes at most about twice this.
STOP_GRACE_S = 2.0

_STOPPING = web.AppKey("stopping", asyncio.Event)


def text_response(status: int, message: str) -> web.Response:
    """A one-line plain-text response, e.g. the reason of a 400."""
    return web.Response(status=status, text=f"{message}\n")


class HttpServer:
    """Serves `routes` (aiohttp route definitions, e.g. `web.get("/metrics", handler)`) on one listener."""

    def __init__(self, routes: Iterable[web.RouteDef]) -> None:
        self._routes = list(routes)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (port 0: any free port) and return the bound port."""
        if self._runner is not None:
            raise RuntimeError("HTTP server already started")
        app = web.Application()
        app[_STOPPING] = asyncio.Event()
        app.add_routes(self._routes)
        app.on_shutdown.append(_end_streams)
        # handler_cancellation: a client that hangs up cancels its handler, which ends a stream's subscription
        # at once rather than at its next write. No access log: a scraper's request every few seconds is noise.
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=IDLE_CONNECTION_TIMEOUT_S,
            shutdown_timeout=STOP_GRACE_S,
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound: int = runner.addresses[0][1]
        return bound

    async def stop(self) -> None:
        """Stop listening, end live streams (each gets its terminating chunk) and close every connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def _end_streams(app: web.Application) -> None:
    app[_STOPPING].set()


async def stream_response(
    request: web.Request, content_type: str, chunks: AsyncGenerator[bytes, None]
) -> web.StreamResponse:
    """A 200 response whose body is `chunks`, sent with chunked transfer encoding as they come, until they end
    or the server stops; the body then ends properly. `chunks` is closed in every case: also when the client
    hangs up (aiohttp cancels the handler) and when `chunks` fails (the error propagates: aiohttp logs it and
    cuts the body without its last chunk, which tells the client the body is incomplete)."""
    response = web.StreamResponse(headers={hdrs.CONTENT_TYPE: content_type})
    response.enable_chunked_encoding()
    async with contextlib.aclosing(chunks):
        await response.prepare(request)
        pump = asyncio.ensure_future(_pump(response, chunks))
        stopping = asyncio.ensure_future(request.app[_STOPPING].wait())
        try:
            await asyncio.wait({pump, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not pump.done():
                pump.cancel()
                # The iterator must be idle before it is closed.
                await asyncio.wait({pump})
        if not pump.cancelled():
            pump.result()
    await response.write_eof()
    return response


async def _pump(response: web.StreamResponse, chunks: AsyncGenerator[bytes, None]) -> None:
    async for chunk in chunks:
        # An empty chunk would read as the end of the body.
        if chunk:
            await response.write(chunk)
