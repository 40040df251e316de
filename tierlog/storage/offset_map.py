"""Kafka's SkimpyOffsetMap: key -> latest offset over the dirty part of a log, bounded in memory.

Kafka stores a 16-byte MD5 of each key plus its 8-byte offset in a preallocated buffer of
`log.cleaner.dedupe.buffer.size / log.cleaner.threads` bytes; the cleaner stops mapping once the map holds
`slots * log.cleaner.io.buffer.load.factor` keys and cleans only up to the last offset it mapped. The same
rule applies here, but to a dict of MD5 digests, whose entry costs far more than Kafka's 24 bytes: slots are
counted at the measured cost of an entry, so the setting still bounds the memory a clean uses (a log with
more distinct keys in its dirty part than fit is cleaned in several passes, as in Kafka).
"""

from __future__ import annotations

import hashlib

HASH_SIZE = 16
# A 16-byte bytes object, an int above the small-int cache and the dict's slot at its worst load, measured
# with tracemalloc on CPython 3.11-3.13 (133 bytes settled, 150 while the dict resizes).
BYTES_PER_ENTRY = 150
NOT_FOUND = -1


class OffsetMap:
    def __init__(self, memory: int) -> None:
        if memory < BYTES_PER_ENTRY:
            raise ValueError(f"the offset map needs at least {BYTES_PER_ENTRY} bytes, got {memory}")
        self.slots = memory // BYTES_PER_ENTRY
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = NOT_FOUND

    @property
    def size(self) -> int:
        return len(self._offsets)

    @property
    def utilization(self) -> float:
        return len(self._offsets) / self.slots

    def put(self, key: bytes, offset: int) -> None:
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        if len(self._offsets) >= self.slots and digest not in self._offsets:
            raise OverflowError(f"the offset map is full ({self.slots} entries)")
        self._offsets[digest] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The latest offset mapped for `key`, or -1 if it is not mapped (so every offset is >= it)."""
        return self._offsets.get(hashlib.md5(key, usedforsecurity=False).digest(), NOT_FOUND)

    def update_latest_offset(self, offset: int) -> None:
        """The last offset the map covers (a batch's last offset), mapped keys or not."""
        self.latest_offset = offset

    def clear(self) -> None:
        self._offsets.clear()
        self.latest_offset = NOT_FOUND
