"""Aborted transactions of a read from the remote tier (docs/transactions.md#tiered).

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
    transaction's marker in it, so the broker had no `.txnindex` file, or copied before tierlog uploaded them)
    has none. Raises RemoteStorageError from the store, CorruptIndexError for bytes that are not an index."""
    try:
        data = rsm.fetch_index(metadata, IndexType.TRANSACTION)
    except RemoteResourceNotFoundError:
        return []
    return parse_aborted_txns(data, f"of remote segment {metadata.segment_id.id}")


def collect_remote_aborted_transactions(
    start_offset: int,
    upper_bound_offset: int,
    segments: Iterable[RemoteLogSegmentMetadata],
    aborted_txns_of: Callable[[RemoteLogSegmentMetadata], Sequence[AbortedTxn]],
) -> TxnIndexSearchResult:
    """The aborted transactions overlapping [start_offset, upper_bound_offset), from the transaction indexes of
    `segments` (the remote segment the range was read from, then the following ones of the log's lineage, in
    offset order; consumed lazily, only as far as needed), and whether the search is complete. An entry is in
    the list once even if two overlapping copies of a segment both hold it."""
    aborted: list[AbortedTxn] = []
    seen: set[AbortedTxn] = set()
    for segment in segments:
        result = search_aborted_txns(aborted_txns_of(segment), start_offset, upper_bound_offset)
        for txn in result.aborted:
            if txn not in seen:
                seen.add(txn)
                aborted.append(txn)
        if result.is_complete:
            return TxnIndexSearchResult(aborted, True)
    return TxnIndexSearchResult(aborted, False)


def with_local_aborted_transactions(
    remote: TxnIndexSearchResult, local: Callable[[], Sequence[AbortedTxn]]
) -> list[AbortedTxn]:
    """The remote search's transactions, and if it was not complete those the local log adds (`local()`: the
    log's collect_aborted_transactions over the same range), each once."""
    if remote.is_complete:
        return list(remote.aborted)
    seen = set(remote.aborted)
    return [*remote.aborted, *(txn for txn in local() if txn not in seen)]
