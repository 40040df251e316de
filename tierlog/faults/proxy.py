"""A TCP proxy that can cut the link it stands on: every broker's inter-broker listener and every broker's
controller link go through one, so a fault run can partition brokers without root or network namespaces.

`cut(mode)`: "reset" closes every connection and refuses new ones (peers see a disconnect at once and
reconnect with backoff); "blackhole" keeps connections open but forwards nothing (peers wait for their
request timeout, as behind a dropped route). `heal()` forwards again; a black-holed connection stays useless
to its owner (bytes were lost mid-stream), so healing closes it for the peer to reconnect.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

CutMode = Literal["reset", "blackhole"]
_HOST = "127.0.0.1"


class FaultProxy:
    def __init__(self, target_port: int, name: str = "") -> None:
        self.name = name
        self.target_port = target_port
        self._server = socket.create_server((_HOST, 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._mode: CutMode | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy-{name}", daemon=True)
        self._thread.start()

    @property
    def cut_mode(self) -> CutMode | None:
        return self._mode

    def cut(self, mode: CutMode = "reset") -> None:
        with self._lock:
            self._mode = mode
        if mode == "reset":
            self._close_all()

    def heal(self) -> None:
        with self._lock:
            was, self._mode = self._mode, None
        if was == "blackhole":
            self._close_all()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._mode == "reset":
                client.close()
                continue
            try:
                upstream = socket.create_connection((_HOST, self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self._mode is None:
                    target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(target)
