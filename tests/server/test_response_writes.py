"""How a response's chunks reach the socket (server/connection.py send_chunks): byte for byte, the small pieces of a
response in one write, and a file slice that the segment no longer fully holds padded to its announced size."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from asyncio_helpers import run_bounded

from tierlog.server.connection import SENDFILE_MIN_BYTES, send_chunks
from tierlog.storage.file_records import FileSlice


async def _sent_over_a_socket(chunks: list[Any], expected_size: int) -> bytes:
    """What a peer receives when `send_chunks` writes `chunks` to a real TCP connection."""
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await send_chunks(writer, chunks)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await reader.read(-1)  # to EOF: any byte too many would show
        writer.close()
        received.set_result(data)
    assert len(data) == expected_size
    return await received


def test_bytes_and_small_and_large_file_slices_arrive_in_order_byte_for_byte(tmp_path: Path) -> None:
    contents = bytes(range(256)) * (SENDFILE_MIN_BYTES // 128)  # 2 x SENDFILE_MIN_BYTES
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(contents)
    with open(segment, "rb") as file:
        small = FileSlice(file, 10, 1000)  # read and written with the bytes around it
        large = FileSlice(file, 5, SENDFILE_MIN_BYTES + 7)  # sent with sendfile
        chunks: list[Any] = [b"head", small, memoryview(b"-mid-"), large, b"tail"]
        expected = b"head" + contents[10:1010] + b"-mid-" + contents[5 : 5 + SENDFILE_MIN_BYTES + 7] + b"tail"
        assert run_bounded(lambda: _sent_over_a_socket(chunks, len(expected))) == expected


def test_a_slice_past_the_end_of_a_truncated_segment_is_padded_to_exactly_its_size(tmp_path: Path) -> None:
    """The frame's length was announced before the bytes were read: whatever the file lost meanwhile is sent as
    zeros (the client drops the incomplete batch), never more bytes than announced."""
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"x" * (SENDFILE_MIN_BYTES + 100))
    with open(segment, "rb") as file:
        for size in (SENDFILE_MIN_BYTES // 2, SENDFILE_MIN_BYTES * 2):  # pread, then sendfile
            cut_short = FileSlice(file, 50, size)
            held = SENDFILE_MIN_BYTES + 100 - 50
            expected = b"<" + b"x" * min(size, held) + bytes(max(0, size - held)) + b">"
            sent = functools.partial(_sent_over_a_socket, [b"<", cut_short, b">"], len(expected))
            assert run_bounded(sent) == expected


class _RecordingWriter:
    """A StreamWriter stand-in that records each write (no TLS, no transport: only bytes chunks are sent)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    async def drain(self) -> None:
        return None


def test_the_small_pieces_of_a_response_go_out_in_one_write(tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"records!")
    writer = _RecordingWriter()
    with open(segment, "rb") as file:
        chunks: list[Any] = [b"header", FileSlice(file, 0, 8), b"trailer"]
        run_bounded(lambda: send_chunks(writer, chunks))  # type: ignore[arg-type]
    assert writer.writes == [b"headerrecords!trailer"]
