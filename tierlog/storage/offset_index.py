"""Kafka's OffsetIndex: `.index` files of 8-byte entries (relative offset int32 BE, position int32 BE).

An entry (offset, position) says the batch at byte `position` of the segment ends at or below `offset` and
every earlier batch ends below it: Kafka indexes an append's last offset at the append's start position.
A lookup therefore lands on a batch boundary at or before the batch holding the target offset.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from typing import NamedTuple

from tierlog.storage.abstract_index import AbstractIndex, ascending
from tierlog.storage.errors import CorruptIndexError, InvalidOffsetError

_ENTRY = struct.Struct(">ii")


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(AbstractIndex):
    ENTRY_SIZE = 8

    def _load(self, data: bytes) -> None:
        flat = array("i", data)
        if sys.byteorder == "little":
            flat.byteswap()
        self._relative_offsets = flat[0::2]
        self._positions = flat[1::2]

    def _truncate_arrays(self, entries: int) -> None:
        del self._relative_offsets[entries:]
        del self._positions[entries:]

    @property
    def last_offset(self) -> int:
        return self.base_offset + self._relative_offsets[-1] if self.entries else self.base_offset

    @property
    def last_position(self) -> int:
        return self._positions[-1] if self.entries else 0

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The largest entry with offset <= target, or (base offset, 0) if there is none."""
        slot = bisect_right(self._relative_offsets, target_offset - self.base_offset) - 1
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._relative_offsets[slot], self._positions[slot])

    def floor_position(self, position: int) -> int:
        """The largest indexed position <= `position` (a batch boundary), or 0."""
        slot = bisect_right(self._positions, position) - 1
        return self._positions[slot] if slot >= 0 else 0

    def append(self, offset: int, position: int) -> None:
        if self.is_full:
            raise ValueError(f"Attempt to append to a full index {self.path} (size = {self.entries})")
        if self.entries and offset <= self.last_offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to position {self.entries} no larger than the last "
                f"offset appended ({self.last_offset}) to {self.path}"
            )
        relative = offset - self.base_offset
        self._append_bytes(_ENTRY.pack(relative, position))
        self._relative_offsets.append(relative)
        self._positions.append(position)

    def sanity_check(self) -> None:
        super().sanity_check()
        offsets, positions = self._relative_offsets, self._positions
        if not (ascending(offsets, strictly=True) and ascending(positions, strictly=True)):
            raise CorruptIndexError(f"Corrupt index found, entries of {self.path} are not strictly ascending")
