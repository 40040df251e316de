"""Brokers run as local processes on 127.0.0.1: for `tierlog demo`, the tests and the benchmarks.

Each `BrokerProcess` is one `python -m tierlog broker` with its own node id, port and data directory, so
several of them side by side form the local cluster that `tierlog cluster up` will start. Every wait is
bounded; a broker that does not come up raises `BrokerStartError` with the tail of its log, which is
where the reason is.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from tierlog.protocol.api_versions import API_VERSIONS_KEY

_HOST = "127.0.0.1"
_POLL_INTERVAL_S = 0.05


class BrokerStartError(RuntimeError):
    """The broker process exited or did not answer in time; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def api_versions_answered(host: str, port: int, timeout_s: float) -> bool:
    """True when `host:port` answers a Kafka ApiVersions v0 request without error.

    v0 (no tagged fields, response header v0) is the request every Kafka broker must answer, so this
    probe depends on nothing but the wire format: it works before any client library can connect.
    """
    correlation_id = 0x7E1A
    client_id = b"tierlog-probe"
    body = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            # Size (4), correlation id (4), error code (2) is all we need to read.
            header = _recv_exactly(sock, 10)
    except OSError:
        return False
    if header is None:
        return False
    size, got_correlation_id, error_code = struct.unpack(">iih", header)
    return size >= 6 and got_correlation_id == correlation_id and error_code == 0


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class BrokerProcess:
    """One broker subprocess: `sys.executable -m tierlog broker --override ...`.

    Its stdout and stderr go to `log_file` (default: `broker-<node_id>.log` next to `log_dir`, so the
    log survives when a test wipes the data directory). The port is chosen once, so a restarted broker
    comes back at the same `bootstrap` address and clients reconnect to it.

        with BrokerProcess(tmp_path / "broker-1") as broker:   # started and ready
            produce_to(broker.bootstrap)
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        node_id: int = 1,
        port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.node_id = node_id
        self.port = port if port is not None else free_port()
        self.overrides = dict(overrides or {})
        self.log_file = log_file if log_file is not None else log_dir.parent / f"broker-{node_id}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def bootstrap(self) -> str:
        return f"{_HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        settings = {
            "node.id": str(self.node_id),
            "listeners": f"PLAINTEXT://{_HOST}:{self.port}",
            "log.dirs": str(self.log_dir),
            **self.overrides,
        }
        args = [sys.executable, "-m", "tierlog", "broker"]
        for key, value in settings.items():
            args += ["--override", f"{key}={value}"]
        return args

    def start(self) -> None:
        """Spawn the process; `wait_ready` tells when it serves."""
        if self.running:
            raise RuntimeError(f"broker {self.node_id} is already running (pid {self.pid})")
        self.log_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        # Appending keeps the log of every incarnation across restarts, which is what a crash test reads.
        # The child gets its own copy of the descriptor, so ours is closed at once.
        with self.log_file.open("ab") as log_handle:
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log_handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._paused = False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the port accepts connections and answers ApiVersions; raise `BrokerStartError`
        if the process exits first or `timeout_s` passes."""
        process = self._require_process()
        deadline = time.monotonic() + timeout_s
        while True:
            code = process.poll()
            if code is not None:
                raise BrokerStartError(f"broker {self.node_id} exited with code {code}{self._tail_suffix()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"broker {self.node_id} did not answer ApiVersions on {self.bootstrap} "
                    f"within {timeout_s:.0f}s{self._tail_suffix()}"
                )
            if api_versions_answered(_HOST, self.port, timeout_s=min(1.0, remaining)):
                return
            time.sleep(min(_POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Controlled shutdown (SIGTERM); SIGKILL if it has not exited after `timeout_s`.

        Returns the exit code (None if it was never started)."""
        if self._process is None:
            return None
        if self._process.poll() is None:
            if self._paused:
                # A stopped process only acts on SIGTERM once it runs again.
                self.resume()
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout_s)
        return self._process.returncode

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 15.0) -> None:
        """Send `sig` (a crash by default); for SIGKILL wait until the process is gone."""
        process = self._require_process()
        if process.poll() is not None:
            return
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            process.wait(timeout_s)
            self._paused = False

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing, like a long GC pause."""
        self._require_process().send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._require_process().send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout_s: float = 30.0) -> None:
        """Controlled shutdown, then start again on the same port and data directory and wait until ready."""
        self.stop(timeout_s)
        self.start()
        self.wait_ready(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"broker {self.node_id} was never started")
        return self._process

    def _tail_suffix(self) -> str:
        tail = self.log_tail()
        return f"; last lines of {self.log_file}:\n{tail}" if tail else f"; {self.log_file} is empty"
