"""Kafka's AbstractIndex without mmap: the file holds exactly the entries, mirrored in memory.

Kafka preallocates an index file to segment.index.bytes, maps it, and trims it to its entries when the
segment is closed or rolled, so on disk both brokers leave identical bytes. Here an entry is appended to the
file with one write and to in-memory arrays that `bisect` searches; nothing is preallocated. Entries are
keyed by offset relative to the segment's base offset (int32 on disk), ascending.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import ClassVar

from tierlog.storage.errors import CorruptIndexError
from tierlog.storage.index_file import IndexFile

INT32_MAX = 2**31 - 1


def ascending(values: Sequence[int], *, strictly: bool) -> bool:
    """Whether every value is above (strictly) or at least (not strictly) the one before it."""
    compare = operator.lt if strictly else operator.le
    return all(map(compare, values, islice(values, 1, None)))


class AbstractIndex(IndexFile, ABC):
    ENTRY_SIZE: ClassVar[int]

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_index_size // self.ENTRY_SIZE
        self._relative_offsets = array("i")
        data = self._read_file(path)
        # A torn trailing entry is left out here and reported by sanity_check, which recovery acts on.
        self._load(data[: len(data) - len(data) % self.ENTRY_SIZE])

    @abstractmethod
    def _load(self, data: bytes) -> None:
        """Fill the in-memory arrays from whole entries read from the file."""

    @abstractmethod
    def _truncate_arrays(self, entries: int) -> None:
        """Keep the first `entries` entries of the in-memory arrays."""

    @property
    def entries(self) -> int:
        return len(self._relative_offsets)

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def can_append_offset(self, offset: int) -> bool:
        """Kafka's canAppendOffset: the offset fits the int32 relative encoding of this index."""
        return 0 <= offset - self.base_offset <= INT32_MAX

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the file is whole entries with offsets ascending from the base."""
        if self._file_size % self.ENTRY_SIZE:
            raise CorruptIndexError(
                f"Index file {self.path} is corrupt, found {self._file_size} bytes which is not a multiple "
                f"of the entry size {self.ENTRY_SIZE}"
            )
        if self.entries and self._relative_offsets[0] < 0:
            raise CorruptIndexError(
                f"Corrupt index found, index file ({self.path}) has an entry below the base offset {self.base_offset}"
            )

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= `offset`."""
        self._truncate_to_entries(bisect_left(self._relative_offsets, offset - self.base_offset))

    def reset(self) -> None:
        """Empty the index (creating its file if needed), as recovery does before rebuilding it."""
        self._truncate_to_entries(0)

    def _truncate_to_entries(self, entries: int) -> None:
        size = entries * self.ENTRY_SIZE
        if size == self._file_size and self.path.exists():
            return
        self._truncate_file(size)
        self._truncate_arrays(entries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, entries={self.entries})"
