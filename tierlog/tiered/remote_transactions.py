"""Aborted transactions of a read from the remote tier (docs/transactions.md#tiered-read).

A `read_committed` consumer drops the records of aborted transactions itself, from the list of aborted
transactions (producer id, first offset) the Fetch answer carries for the range it returns. For a range read
from a remote segment that list comes from the transaction indexes copied with the segments, searched as
Kafka's RemoteLogManager.collectAbortedTransactions searches them: the segment read, then each following remote
segment of the log's lineage, until one index says the search is complete (an entry whose last stable offset
reaches the range's end: every transaction aborted later started after the range). If the remote segments
run out first, the rest is in the local log, which only the broker has: `is_complete` False tells it (and the
Spark direct reader, which then reads the range through a broker) to go on there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tierlog.storage.transaction_index import AbortedTxn, TxnIndexSearchResult, parse_aborted_txns, search_aborted_txns
from tierlog.tiered.remote_storage_manager import IndexType, RemoteResourceNotFoundError, RemoteStorageManager
from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata


def fetch_remote_aborted_txns(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
    """The entries of the transaction index copied with the segment. A segment without one (no aborted
    transaction's marker in it, so the broker had no `.txnindex` file) has none, and is not asked for one when
    its metadata says so. Raises RemoteStorageError from the store, CorruptIndexError for bytes that are not an
    index."""
    if not metadata.has_txn_index:
        return []
    try:
        data = rsm.fetch_index(metadata, IndexType.TRANSACTION)
    except RemoteResourceNotFoundError:
        return []
    return parse_aborted_txns(data, f"of remote segment {metadata.segment_id.id}")


class AbortedTxnSearch:
    """The search over one index after another for the aborted transactions overlapping [start_offset,
    upper_bound_offset): feed each index's entries in offset order to `add` until it says the search is
    complete. Each transaction is listed once, even if two overlapping copies of a segment both hold it."""

    def __init__(self, start_offset: int, upper_bound_offset: int) -> None:
        self.start_offset = start_offset
        self.upper_bound_offset = upper_bound_offset
        self.aborted: list[AbortedTxn] = []
        self.is_complete = False
        self._seen: set[AbortedTxn] = set()

    def add(self, entries: Iterable[AbortedTxn]) -> bool:
        """Search one more index; whether the search is now complete."""
        found = search_aborted_txns(entries, self.start_offset, self.upper_bound_offset)
        for txn in found.aborted:
            if txn not in self._seen:
                self._seen.add(txn)
                self.aborted.append(txn)
        self.is_complete = self.is_complete or found.is_complete
        return self.is_complete

    @property
    def result(self) -> TxnIndexSearchResult:
        return TxnIndexSearchResult(list(self.aborted), self.is_complete)

    def with_local(self, local: Callable[[int, int], Sequence[AbortedTxn]]) -> list[AbortedTxn]:
        """The transactions found, and if the search is not complete those `local(start, upper bound)` adds (the
        broker's Log.collect_aborted_transactions, which searches the local segments until complete)."""
        if not self.is_complete:
            self.add(local(self.start_offset, self.upper_bound_offset))
        return list(self.aborted)


def collect_remote_aborted_transactions(
    start_offset: int,
    upper_bound_offset: int,
    segments: Iterable[RemoteLogSegmentMetadata],
    aborted_txns_of: Callable[[RemoteLogSegmentMetadata], Sequence[AbortedTxn]],
) -> TxnIndexSearchResult:
    """The aborted transactions overlapping [start_offset, upper_bound_offset), from the transaction indexes of
    `segments` (the remote segment the range was read from, then the following ones of the log's lineage, in
    offset order; consumed lazily, only as far as needed), and whether the search is complete. For a reader
    with the remote store only: `aborted_txns_of` is `lambda m: fetch_remote_aborted_txns(rsm, m)`."""
    search = AbortedTxnSearch(start_offset, upper_bound_offset)
    for segment in segments:
        if search.add(aborted_txns_of(segment)):
            break
    return search.result
