"""Kafka's TransactionIndex: the aborted transactions whose ABORT markers a segment holds.

The file `{base offset:020d}.txnindex` sits next to its segment's `.log` and holds 34-byte entries, Kafka's AbortedTxn
(docs/transactions.md#txn-index): version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64 |
lastStableOffset int64, in the order the markers were written, so lastOffset (the marker's offset) ascends. The
last stable offset is the log's first unstable offset once the marker completed the transaction: a reader
searching the index for a fetch range can stop at the first entry whose LSO reaches the range's end, as nothing
aborted later can start before that offset. The file is created with its first entry, as Kafka's; a segment
without aborted transactions has none. The entries are also kept in memory (they are few).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tierlog.storage.errors import CorruptIndexError

TXN_INDEX_FILE_SUFFIX = ".txnindex"
ABORTED_TXN_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ABORTED_TXN_SIZE = _ENTRY.size  # 34


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """A transaction aborted by the marker at `last_offset`; its first record was at `first_offset`."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        return _ENTRY.pack(
            ABORTED_TXN_VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    """The aborted transactions overlapping a fetch range in one index, and whether the search is over
    (`is_complete`: no later segment can hold one that overlaps the range)."""

    aborted: list[AbortedTxn]
    is_complete: bool


def parse_aborted_txns(data: bytes | bytearray | memoryview, source: object = "transaction index") -> list[AbortedTxn]:
    """The entries of a transaction index file's bytes (a torn trailing entry is left out, as Kafka's reader
    does). An entry of a newer version than 0 is an error: its layout is unknown."""
    entries = []
    for offset in range(0, len(data) - len(data) % ABORTED_TXN_SIZE, ABORTED_TXN_SIZE):
        version, producer_id, first_offset, last_offset, last_stable_offset = _ENTRY.unpack_from(data, offset)
        if version > ABORTED_TXN_VERSION:
            raise CorruptIndexError(
                f"Unexpected aborted transaction version {version} in transaction index {source}, "
                f"current version is {ABORTED_TXN_VERSION}"
            )
        entries.append(AbortedTxn(producer_id, first_offset, last_offset, last_stable_offset))
    return entries


def search_aborted_txns(
    entries: Iterable[AbortedTxn], fetch_offset: int, upper_bound_offset: int
) -> TxnIndexSearchResult:
    """Kafka's collectAbortedTxns over one index's entries: those overlapping [fetch_offset,
    upper_bound_offset), stopping at the first whose last stable offset is at or past the upper bound."""
    aborted = []
    for txn in entries:
        if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
            aborted.append(txn)
        if txn.last_stable_offset >= upper_bound_offset:
            return TxnIndexSearchResult(aborted, True)
    return TxnIndexSearchResult(aborted, False)


class TransactionIndex:
    def __init__(self, path: Path, start_offset: int | None = None) -> None:
        """`start_offset` is the segment's base offset; by default read from the file name."""
        self.path = path
        self.start_offset = int(path.name[: path.name.index(".")]) if start_offset is None else start_offset
        self._fd: int | None = None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        self._file_size = len(data)
        self._entries = parse_aborted_txns(data, path)

    @property
    def entries(self) -> int:
        return len(self._entries)

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry; its last offset (its marker's) must be above the previous entry's."""
        if self._entries and self._entries[-1].last_offset >= txn.last_offset:
            raise ValueError(
                f"The last offset of appended transactions must increase sequentially, but {txn.last_offset} is "
                f"not greater than current last offset {self._entries[-1].last_offset} of index {self.path}"
            )
        data = txn.to_bytes()
        os.write(self._open(), data)
        self._file_size += len(data)
        self._entries.append(txn)

    def all_aborted_txns(self) -> list[AbortedTxn]:
        return list(self._entries)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """The aborted transactions overlapping [fetch_offset, upper_bound_offset) (docs/transactions.md#txn-index)."""
        return search_aborted_txns(self._entries, fetch_offset, upper_bound_offset)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries whose marker is at or after `offset` (and every entry after the first such)."""
        for position, txn in enumerate(self._entries):
            if txn.last_offset >= offset:
                self._truncate_to_entries(position)
                return

    def reset(self) -> None:
        """Remove every entry, as recovery does before rebuilding the index (no file is created)."""
        if self._file_size or self._fd is not None or self.path.exists():
            self._truncate_to_entries(0)
        self._entries.clear()

    def sanity_check(self) -> None:
        """Raise CorruptIndexError for a torn entry or an entry whose marker lies before the segment."""
        if self._file_size % ABORTED_TXN_SIZE:
            raise CorruptIndexError(
                f"Transaction index {self.path} is corrupt, found {self._file_size} bytes which is not a multiple "
                f"of the entry size {ABORTED_TXN_SIZE}"
            )
        for txn in self._entries:
            if txn.last_offset < self.start_offset:
                raise CorruptIndexError(
                    f"Last offset of aborted transaction {txn} in index {self.path} is less than start offset "
                    f"{self.start_offset}"
                )

    def flush(self) -> None:
        """fsync the file and close it, as the offset and time indexes do: a flushed segment is usually a rolled
        one, which takes no more markers, so it should not hold a descriptor."""
        if self._fd is not None:
            os.fsync(self._fd)
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename_to(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def _truncate_to_entries(self, entries: int) -> None:
        size = entries * ABORTED_TXN_SIZE
        os.ftruncate(self._open(), size)
        self._file_size = size
        del self._entries[entries:]

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def __repr__(self) -> str:
        return f"TransactionIndex({str(self.path)!r}, entries={self.entries})"
