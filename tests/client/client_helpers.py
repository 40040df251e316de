"""A scripted fake peer for the client's blocking exchanges: a server on 127.0.0.1 that takes one connection,
reads one request frame and answers it as the test says, or stays silent."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HOST = "127.0.0.1"
# What a fake peer does with a request frame: the bytes to answer with, or None to stay silent.
Answer = Callable[[bytes], bytes | None]
# How long a silent peer holds its connection open, and how long its thread may take to end.
SILENT_S = 30.0
JOIN_S = 5.0


@contextmanager
def scripted_peer(answer: Answer, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """The port of a one-connection peer that writes `answer(request frame)` back (None: nothing, the connection
    stays open until the block ends); its thread is joined and its socket closed when the block ends. With
    `tls` (a server context) the peer speaks TLS; a failed handshake ends it."""
    stop = threading.Event()
    with socket.create_server((HOST, 0)) as server:

        def serve() -> None:
            connection, _ = server.accept()
            if tls is not None:
                try:
                    connection = tls.wrap_socket(connection, server_side=True)
                except (ssl.SSLError, OSError):
                    connection.close()
                    return
            with connection:
                (size,) = struct.unpack(">i", connection.recv(4))
                frame = b""
                while len(frame) < size:
                    frame += connection.recv(size - len(frame))
                reply = answer(frame)
                if reply is None:
                    stop.wait(SILENT_S)
                else:
                    connection.sendall(reply)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            port: int = server.getsockname()[1]
            yield port
        finally:
            stop.set()
            thread.join(JOIN_S)
