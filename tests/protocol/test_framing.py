"""Size-prefixed frames: limits, truncation, and byte-at-a-time delivery."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tierlog.protocol.framing import FrameTooLarge, TruncatedFrame, read_frame

LIMIT = 1024


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def read_all(data: bytes, *, eof: bool = True, max_bytes: int = LIMIT) -> list[bytes | None]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    frames: list[bytes | None] = []
    while True:
        frame = await read_frame(reader, max_bytes)
        frames.append(frame)
        if frame is None:
            return frames


def test_read_frame_returns_frames_then_none_on_clean_eof() -> None:
    frames = asyncio.run(read_all(framed(b"abc") + framed(b"") + framed(b"x" * LIMIT)))
    assert frames == [b"abc", b"", b"x" * LIMIT, None]


@pytest.mark.parametrize("size", [LIMIT + 1, 2**31 - 1, -1, -(2**31)])
def test_read_frame_rejects_sizes_above_the_limit_or_negative(size: int) -> None:
    with pytest.raises(FrameTooLarge) as caught:
        asyncio.run(read_all(struct.pack(">i", size) + b"x" * 10))
    assert caught.value.size == size


@pytest.mark.parametrize("data", [b"\x00\x00", framed(b"abcdef")[:-2]])
def test_read_frame_raises_on_eof_inside_a_frame(data: bytes) -> None:
    with pytest.raises(TruncatedFrame):
        asyncio.run(read_all(data))
