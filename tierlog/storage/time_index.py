"""Kafka's TimeIndex: `.timeindex` files of 12-byte entries (timestamp int64 BE, relative offset int32 BE).

An entry (timestamp, offset) says no batch before the one holding `offset` has a larger timestamp.
Timestamps only grow along the index (Kafka's maybeAppend skips an entry that would not raise the maximum),
and one slot is kept free for the entry a segment writes when it stops being active.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from typing import NamedTuple

from tierlog.records.record_batch import NO_TIMESTAMP
from tierlog.storage.abstract_index import AbstractIndex, ascending
from tierlog.storage.errors import CorruptIndexError, InvalidOffsetError

_ENTRY = struct.Struct(">qi")


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(AbstractIndex):
    ENTRY_SIZE = 12

    def _load(self, data: bytes) -> None:
        unpacked = list(_ENTRY.iter_unpack(data))
        self._timestamps = array("q", [timestamp for timestamp, _ in unpacked])
        self._relative_offsets = array("i", [relative for _, relative in unpacked])

    def _truncate_arrays(self, entries: int) -> None:
        del self._relative_offsets[entries:]
        del self._timestamps[entries:]

    @property
    def is_full(self) -> bool:
        # Reserve the last slot for the entry onBecomeInactiveSegment appends on roll.
        return self.entries >= self.max_entries - 1

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or (NO_TIMESTAMP, base offset) for an empty index."""
        if not self.entries:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return TimestampOffset(self._timestamps[-1], self.base_offset + self._relative_offsets[-1])

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp <= target, or (NO_TIMESTAMP, base offset)."""
        slot = bisect_right(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return TimestampOffset(self._timestamps[slot], self.base_offset + self._relative_offsets[slot])

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append (timestamp, offset) if the timestamp is larger than the last entry's."""
        if not skip_full_check and self.is_full:
            raise ValueError(f"Attempt to append to a full time index {self.path} (size = {self.entries})")
        last = self.last_entry
        if self.entries and offset < last.offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to slot {self.entries} no larger than the last offset "
                f"appended ({last.offset}) to {self.path}"
            )
        if self.entries and timestamp < last.timestamp:
            raise InvalidOffsetError(
                f"Attempt to append a timestamp ({timestamp}) to slot {self.entries} no larger than the last "
                f"timestamp appended ({last.timestamp}) to {self.path}"
            )
        if timestamp > last.timestamp:
            relative = offset - self.base_offset
            self._append_bytes(_ENTRY.pack(timestamp, relative))
            self._timestamps.append(timestamp)
            self._relative_offsets.append(relative)

    def sanity_check(self) -> None:
        super().sanity_check()
        timestamps, offsets = self._timestamps, self._relative_offsets
        if not (ascending(timestamps, strictly=True) and ascending(offsets, strictly=False)):
            raise CorruptIndexError(f"Corrupt time index found, entries of {self.path} are not ascending")
