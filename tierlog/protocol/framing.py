"""Kafka's size-prefixed frames: a big-endian int32 length, then that many bytes.

The size is checked before a single byte of the body is buffered, so a client cannot make the broker
allocate more than `socket.request.max.bytes` (Kafka's NetworkReceive rejects the same sizes: negative,
or above the limit). `FrameDecoder` is the pure, sans-I/O form (feed bytes, get frames); `read_frame`
is the asyncio form the connection loop uses.
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


class FrameDecoder:
    """Splits a byte stream into frames without any I/O: `feed` bytes, get the frames they complete.

    After a FramingError the stream position is lost, so every later call raises the same error. Frames
    completed before an oversized size prefix in the same `feed` are still returned; the error is then
    raised by the next call.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        # Size of the frame whose body is being buffered, None while waiting for a size prefix.
        self._pending_size: int | None = None
        self._error: FramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if self._error is not None:
            raise self._error
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        position = 0
        while True:
            if self._pending_size is None:
                if len(buffer) - position < SIZE_PREFIX_BYTES:
                    break
                (size,) = SIZE_PREFIX.unpack_from(buffer, position)
                try:
                    check_frame_size(size, self._max_bytes)
                except FrameTooLarge as exc:
                    self._error = exc
                    if not frames:
                        raise
                    # Hand out the frames that precede the bad one (they are valid requests);
                    # the next call raises.
                    break
                self._pending_size = size
                position += SIZE_PREFIX_BYTES
            size = self._pending_size
            if len(buffer) - position < size:
                break
            # One copy, straight from the buffer (slicing the bytearray first would copy twice).
            with memoryview(buffer) as view, view[position : position + size] as body:
                frames.append(bytes(body))
            position += size
            self._pending_size = None
        # Deleting a prefix of a bytearray is cheap (CPython moves its start pointer).
        del buffer[:position]
        return frames

    def close(self) -> None:
        """The peer closed the stream: raise TruncatedFrame if it stopped inside a frame."""
        if self._error is None:
            if self._pending_size is None:
                if self._buffer:
                    self._error = TruncatedFrame(SIZE_PREFIX_BYTES, len(self._buffer))
            else:
                self._error = TruncatedFrame(
                    SIZE_PREFIX_BYTES + self._pending_size, SIZE_PREFIX_BYTES + len(self._buffer)
                )
        if self._error is not None:
            raise self._error
