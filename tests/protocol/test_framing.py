"""Size-prefixed frames: limits, truncation, and byte-at-a-time delivery."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierlog.protocol.framing import FrameDecoder, FrameTooLarge, TruncatedFrame, read_frame

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


def test_decoder_splits_frames_fed_in_arbitrary_pieces() -> None:
    stream = framed(b"one") + framed(b"") + framed(b"three!")
    decoder = FrameDecoder(LIMIT)
    frames = [frame for byte in stream for frame in decoder.feed(bytes([byte]))]
    assert frames == [b"one", b"", b"three!"]
    assert decoder.buffered == 0
    decoder.close()


@given(st.lists(st.binary(max_size=64)), st.lists(st.integers(min_value=1, max_value=50)))
def test_decoder_is_independent_of_how_the_stream_is_cut(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(framed(body) for body in bodies)
    decoder = FrameDecoder(LIMIT)
    frames: list[bytes] = []
    position = 0
    for cut in cuts:
        frames += decoder.feed(stream[position : position + cut])
        position += cut
    frames += decoder.feed(stream[position:])
    assert frames == bodies


def test_decoder_rejects_an_oversized_prefix_before_buffering_its_body() -> None:
    decoder = FrameDecoder(LIMIT)
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">i", LIMIT + 1))
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"more")


def test_decoder_returns_the_frames_before_an_oversized_one_then_fails() -> None:
    decoder = FrameDecoder(LIMIT)
    assert decoder.feed(framed(b"ok") + struct.pack(">i", -5)) == [b"ok"]
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"")
    with pytest.raises(FrameTooLarge):
        decoder.close()


@pytest.mark.parametrize("tail", [b"\x00", struct.pack(">i", 10), framed(b"0123456789")[:-1]])
def test_decoder_close_inside_a_frame_is_truncation(tail: bytes) -> None:
    decoder = FrameDecoder(LIMIT)
    assert decoder.feed(framed(b"done") + tail) == [b"done"]
    with pytest.raises(TruncatedFrame):
        decoder.close()
