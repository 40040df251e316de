"""A stand-in for a broker's HTTP listener (tierlog.http.listener), so `cluster status` and `trace` are tested
against canned answers without broker processes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

# How long a trace stream stays open after its backlog, unless the fake is closed first.
_STREAM_OPEN_S = 30.0


class FakeBrokerHttp:
    """Serves GET /v1/partitions (`partitions`, a JSON document) and GET /v1/trace (`trace_lines`, sent as
    chunks of a never-ending chunked NDJSON answer, the first line split over two chunks as a real stream
    may do). `trace_status` other than 200 makes /v1/trace fail. `trace_queries` records the queries."""

    def __init__(
        self,
        *,
        partitions: dict[str, Any] | None = None,
        trace_lines: list[str] | None = None,
        trace_status: int = 200,
    ) -> None:
        self.partitions = partitions
        self.trace_lines = trace_lines or []
        self.trace_status = trace_status
        self.trace_queries: list[dict[str, list[str]]] = []
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/v1/partitions" and fake.partitions is not None:
                    body = json.dumps(fake.partitions).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif url.path == "/v1/trace" and fake.trace_status == 200:
                    fake.trace_queries.append(parse_qs(url.query))
                    self._stream(fake.trace_lines)
                else:
                    self.send_error(fake.trace_status if url.path == "/v1/trace" else 404)

            def _stream(self, lines: list[str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                data = [(line + "\n").encode() for line in lines]
                if data:
                    data[:1] = [data[0][:5], data[0][5:]]
                for chunk in data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                fake._closing.wait(_STREAM_OPEN_S)
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test output stays readable

        return Handler

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def event(seq: int, time_ms: int, broker_id: int, attribute: str, old: Any, new: Any, why: str = "") -> dict[str, Any]:
    """A /v1/trace event of partition orders-0, phase named after the seed 000 step it belongs to."""
    return {
        "seq": seq,
        "time_ms": time_ms,
        "broker_id": broker_id,
        "topic": "orders",
        "partition": 0,
        "attribute": attribute,
        "phase": "PRODUCE" if time_ms < 2000 else "FETCH",
        "old": old,
        "new": new,
        "why": why,
    }
