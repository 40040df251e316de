"""What the CLI tests share: `tierlog(...)`, the real command run as a subprocess; `tierlog` run in a terminal
of a given width; a stand-in for a broker's HTTP listener (tierlog.http.listener), so `cluster status` and
`trace` are tested against canned answers without broker processes; and a cluster started with `tierlog
cluster up` whose brokers are killed when the test ends."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import selectors
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from click.testing import CliRunner, Result

from tierlog.cli.cluster import CLUSTER_FILE, broker_alive, read_cluster_info
from tierlog.cli.main import cli

# How long a trace stream stays open after its backlog, unless the fake is closed first.
_STREAM_OPEN_S = 30.0
# The `tierlog` console script of the environment running the tests (the editable install's).
TIERLOG = Path(sys.executable).with_name("tierlog")
# No test command should run this long: a hung one fails its test instead of the whole run.
_COMMAND_LIMIT_S = 120.0


@dataclass(frozen=True)
class Ran:
    """A finished `tierlog` run: exit code, what it wrote to stdout and stderr, and how long it took."""

    code: int
    out: bytes
    err: bytes
    elapsed_s: float

    @property
    def stdout(self) -> str:
        return self.out.decode()

    @property
    def stderr(self) -> str:
        return self.err.decode()

    @property
    def first_error_line(self) -> str:
        return next(iter(self.stderr.splitlines()), "")

    @property
    def first_line(self) -> str:
        return next(iter(self.stdout.splitlines()), "")


def tierlog(*args: str, stdin: bytes = b"", env: Mapping[str, str] | None = None) -> Ran:
    """Run the real `tierlog` command as a person would. $TIERLOG_BOOTSTRAP is removed from the environment
    unless `env` sets it, so only the arguments say where the brokers are."""
    environment = {k: v for k, v in os.environ.items() if k != "TIERLOG_BOOTSTRAP"} | dict(env or {})
    started = time.monotonic()
    result = subprocess.run(
        [str(TIERLOG), *args], input=stdin, capture_output=True, env=environment, timeout=_COMMAND_LIMIT_S
    )
    return Ran(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


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


# --- tierlog in a terminal ----------------------------------------------------------------------------------

_ESCAPE_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def run_in_terminal(args: list[str], columns: int, timeout_s: float = 60.0) -> tuple[int, list[str]]:
    """Run `tierlog ARGS` with stdout and stderr on a pseudo-terminal `columns` wide (COLUMNS too), as a person
    at that terminal sees it: (exit code, the lines without colours)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    process = subprocess.Popen(
        [str(TIERLOG), *args], stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env
    )
    os.close(terminal)
    output = bytearray()
    deadline = time.monotonic() + timeout_s
    # A selector, not select.select: the test process may hold more than FD_SETSIZE (1024) descriptors.
    readable = selectors.DefaultSelector()
    readable.register(controller, selectors.EVENT_READ)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"tierlog {' '.join(args)} still runs after {timeout_s}s:\n{output.decode()}")
            if not readable.select(remaining):
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the command and everything it started have closed the terminal
                break
            if not chunk:
                break
            output += chunk
        code = process.wait(max(0.1, deadline - time.monotonic()))
    finally:
        readable.close()
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait(5)
    text = _ESCAPE_SEQUENCE.sub("", output.decode(errors="replace")).replace("\r\n", "\n")
    return code, text.splitlines()


def assert_fits(lines: list[str], columns: int) -> None:
    """No line is wider than the terminal, and nothing was cut short with an ellipsis."""
    too_wide = [line for line in lines if len(line) > columns]
    cut = [line for line in lines if "\u2026" in line]
    assert not too_wide and not cut, "\n".join(lines)


# --- a cluster started with `tierlog cluster up` --------------------------------------------------------------

# Fast failure detection, so a killed broker is fenced within seconds; RF 3 with min ISR 2 as in production.
OVERRIDES = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "log.segment.bytes": str(1024 * 1024),
}
CLUSTER_START_S = 60.0


class CliCluster:
    """Runs `tierlog cluster ...` as its own process (so the test sees the brokers outlive it) and remembers
    every pid the cluster recorded, to kill them when the test ends."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pids: set[int] = set()
        self.log_files: set[Path] = set()

    def up(self, *options: str) -> subprocess.CompletedProcess[str]:
        """`tierlog cluster up --brokers 3` with the test overrides and `options` (e.g. `--controllers 3`)."""
        overrides = [arg for key, value in OVERRIDES.items() for arg in ("--override", f"{key}={value}")]
        return self.tierlog(
            "cluster",
            "up",
            "--brokers",
            "3",
            *options,
            *overrides,
            "--timeout",
            str(CLUSTER_START_S),
            timeout_s=CLUSTER_START_S + 30,
        )

    def tierlog(self, *args: str, timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
        """`tierlog ARGS --dir DIRECTORY`, as a user types it; the pids it recorded are remembered."""
        try:
            return subprocess.run(
                [str(TIERLOG), *args, "--dir", str(self.directory)], capture_output=True, text=True, timeout=timeout_s
            )
        finally:
            self._remember()

    def _remember(self) -> None:
        if (self.directory / CLUSTER_FILE).exists():
            info = read_cluster_info(self.directory)
            self.pids.update(node.pid for node in info.nodes)
            self.log_files.update(Path(node.log_file) for node in info.nodes)

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(cli, [*args, "--dir", str(self.directory)])

    def kill_leftovers(self) -> None:
        for pid in self.pids:
            if broker_alive(pid):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(broker_alive(pid) for pid in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def log_tails(log_files: list[Path]) -> None:
    for log_file in log_files:
        text = log_file.read_text(errors="replace") if log_file.exists() else "(no log)"
        print(f"\n---- last lines of {log_file} ----\n" + "\n".join(text.splitlines()[-40:]))
