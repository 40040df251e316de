"""What the log cleaner knows of transactions as it walks a log front to back (Kafka's CleanedTransactionMetadata,
docs/transactions.md#compaction).

The cleaner is handed the aborted transactions of each segment's range (from the transaction indexes) before it
reads the segment. A transaction becomes "ongoing" here when the walk reaches its first offset; its data
batches are then known to be aborted (removable) or, for a transactional batch of a producer with no aborted
transaction ongoing, committed. Its marker ends it:
- an ABORT marker is kept, and its transaction written to the cleaned segment's transaction index, while any
  batch of the transaction was still seen in this pass (a read_committed consumer needs both to drop them);
  once none is, the marker may go (after the delete horizon) and the index entry goes at once;
- a COMMIT marker may go (after the delete horizon) once no batch of its transaction is left;
- a control batch emptied by an earlier clean may go.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from tierlog.records.codec import RawRecord
from tierlog.records.control_batch import ControlRecordType, control_record_type
from tierlog.records.record_batch import RecordBatchHeader
from tierlog.storage.transaction_index import AbortedTxn, TransactionIndex


@dataclass(slots=True)
class _OngoingAbortedTxn:
    txn: AbortedTxn
    # Whether this pass read a data batch of the transaction (so its records, or an empty batch, remain).
    batch_seen: bool = False


class CleanedTransactionMetadata:
    def __init__(self) -> None:
        self._ongoing_committed: set[int] = set()
        self._ongoing_aborted: dict[int, _OngoingAbortedTxn] = {}
        # (first offset, arrival, txn): the aborted transactions not yet reached, first offset first.
        self._aborted: list[tuple[int, int, AbortedTxn]] = []
        self._arrivals = itertools.count()
        # The transaction index of the segment being written: where kept ABORT markers' transactions go.
        self.cleaned_index: TransactionIndex | None = None

    def add_aborted_transactions(self, txns: Iterable[AbortedTxn]) -> None:
        for txn in txns:
            heapq.heappush(self._aborted, (txn.first_offset, next(self._arrivals), txn))

    def on_control_batch_read(self, header: RecordBatchHeader, records: list[RawRecord]) -> bool:
        """A control batch (with its decoded records) reached: whether it may be discarded (its transaction has no
        batch left)."""
        self._reach(header.last_offset)
        if not records:
            # Emptied by an earlier clean: nothing left to mark.
            return True
        control_type = control_record_type(records[0].key)
        producer_id = header.producer_id
        if control_type == ControlRecordType.ABORT:
            ongoing = self._ongoing_aborted.pop(producer_id, None)
            if ongoing is not None and ongoing.batch_seen:
                if self.cleaned_index is not None:
                    self.cleaned_index.append(ongoing.txn)
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False

    def on_batch_read(self, header: RecordBatchHeader) -> bool:
        """A data batch reached: whether it belongs to an aborted transaction (and may be discarded)."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        ongoing = self._ongoing_aborted.get(header.producer_id)
        if ongoing is not None:
            ongoing.batch_seen = True
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def _reach(self, offset: int) -> None:
        """Start every aborted transaction whose first offset is at or below `offset`."""
        while self._aborted and self._aborted[0][0] <= offset:
            _, _, txn = heapq.heappop(self._aborted)
            self._ongoing_aborted.setdefault(txn.producer_id, _OngoingAbortedTxn(txn))
