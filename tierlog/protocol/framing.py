"""Kafka's size-prefixed frames: a big-endian int32 length, then that many bytes.

The size is checked before a single byte of the body is buffered, so a client cannot make the broker
allocate more than `socket.request.max.bytes` (Kafka's NetworkReceive rejects the same sizes: negative,
or above the limit).
"""

from __future__ import annotations

import asyncio
import struct

SIZE_PREFIX = struct.Struct(">i")
SIZE_PREFIX_BYTES = SIZE_PREFIX.size


class FramingError(Exception):
    """The byte stream cannot be split into frames; the connection must be closed."""


class FrameTooLarge(FramingError):
    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(
            f"invalid frame size {size}: negative"
            if size < 0
            else f"frame of {size} bytes exceeds socket.request.max.bytes={max_bytes}"
        )
        self.size = size
        self.max_bytes = max_bytes


class TruncatedFrame(FramingError):
    def __init__(self, expected: int, received: int) -> None:
        super().__init__(f"connection closed after {received} of {expected} frame bytes")
        self.expected = expected
        self.received = received


def check_frame_size(size: int, max_bytes: int) -> None:
    if size < 0 or size > max_bytes:
        raise FrameTooLarge(size, max_bytes)


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame's body (without its size prefix), or None on EOF between frames.

    Raises FrameTooLarge for a negative size or one above `max_bytes`, TruncatedFrame on EOF inside a
    frame (or inside its size prefix).
    """
    try:
        prefix = await reader.readexactly(SIZE_PREFIX_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise TruncatedFrame(SIZE_PREFIX_BYTES, len(exc.partial)) from None
    (size,) = SIZE_PREFIX.unpack(prefix)
    check_frame_size(size, max_bytes)
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise TruncatedFrame(SIZE_PREFIX_BYTES + size, SIZE_PREFIX_BYTES + len(exc.partial)) from None
