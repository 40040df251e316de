"""LeaderEpochFileCache: the (leader epoch, start offset) history of one partition replica
(docs/replication.md#epoch-cache).

Mirrors Kafka 3.9's org.apache.kafka.storage.internals.epoch.LeaderEpochFileCache. Invariant kept by
`assign` and both truncations: entries are strictly increasing in epoch *and* in start offset, so a plain
list ordered by epoch plays the role of Kafka's TreeMap and `bisect` gives its floor/higher lookups.

Every change is written to the `leader-epoch-checkpoint` file at once. Kafka defers the write after a
truncation (KAFKA-15046) to keep the fetcher's lock short; a synchronous write is simpler and equally
safe, because recovery re-trims the cache to the log anyway. A change that leaves the entries as the file holds
them writes nothing.

Loading a log trims its cache to the log's start and end without writing (`flush=False`), as Kafka 3.8 defers that
write (KAFKA-16541): an idle partition's entry starts at its log end, so every load of every partition rewrote and
fsynced its file, most of a restart's log loading (docs/performance.md#many-partitions). The file is then "stale"
(it holds entries the cache dropped) only until the log's next change: every append writes it first
(`flush_if_stale`, before the records reach the segment), and every other change writes the whole cache. So while
it is stale the log is the one that was loaded, and a crash then makes the next load read the same file and the
same log and trim them the same way.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable

from tierlog.storage.checkpoints import LeaderEpochCheckpointFile
from tierlog.storage.epoch_entry import EpochEntry

# Kafka's OffsetsForLeaderEpoch "no answer": EpochEndOffset.UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochFileCache:
    def __init__(self, checkpoint: LeaderEpochCheckpointFile | None) -> None:
        self._checkpoint = checkpoint
        self._entries: list[EpochEntry] = []
        # What the file holds, as last read or written (None while there is no file), and whether it differs.
        self._persisted: list[EpochEntry] | None = None
        self._stale = False
        if checkpoint is not None:
            persisted = checkpoint.read()
            if checkpoint.path.exists():
                self._persisted = persisted
            # Replaying through the assign rule (as Kafka does) repairs a hand-edited, non-monotonic file
            # instead of trusting it.
            for entry in persisted:
                self._assign(entry)

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` (a leader's first append, or a follower seeing a new
        epoch in a fetched batch). A no-op in the common case of another batch of the latest epoch."""
        if self._assign(EpochEntry(epoch, start_offset)):
            self._flush()

    def _assign(self, entry: EpochEntry) -> bool:
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"Received invalid partition leader epoch entry {entry}")
        latest = self.latest_entry
        if latest is not None and entry.epoch == latest.epoch and entry.start_offset >= latest.start_offset:
            return False
        # Tail entries at or past the new one (by epoch or by offset) describe log that no longer exists: the
        # log was truncated beneath them, or a newer epoch began before they got a record.
        self._remove_from_end(lambda e: e.epoch >= entry.epoch or e.start_offset >= entry.start_offset)
        self._entries.append(entry)
        return True

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def epoch_entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def previous_epoch(self) -> int | None:
        """The epoch just before the latest one (Kafka's previousEpoch)."""
        return self._entries[-2].epoch if len(self._entries) >= 2 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= requested, first offset after that epoch's data).

        Example (docs/replication.md#end-offset-for): entries 2->30, 3->50, 4->70 and a request for epoch 2
        answer (2, 50).
        """
        if requested_epoch == UNDEFINED_EPOCH:
            # A bootstrapping follower, or data written before leader epochs existed.
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self.latest_epoch:
            # The latest epoch is still being written to, so it ends at the log end.
            return requested_epoch, log_end_offset
        higher_index = bisect.bisect_right(self._entries, requested_epoch, key=_epoch)
        if higher_index == len(self._entries):
            # Larger than every known epoch (or an empty cache): nothing to say about it.
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher = self._entries[higher_index]
        if higher_index == 0:
            # Older than anything cached: that data is gone from the log, so point the follower at the
            # start of the first known epoch even though epochs may have existed in between.
            return requested_epoch, higher.start_offset
        return self._entries[higher_index - 1].epoch, higher.start_offset

    def epoch_for_offset(self, offset: int) -> int | None:
        """Epoch of the entry covering `offset`; past the last entry that is the latest epoch (the cache does
        not know the log end), before the first entry there is none."""
        index = bisect.bisect_right(self._entries, offset, key=_start_offset)
        return self._entries[index - 1].epoch if index > 0 else None

    def truncate_from_end(self, end_offset: int, *, flush: bool = True) -> None:
        """Forget epochs starting at or after `end_offset`: the log was truncated to end there. `flush=False` (a
        log's load only) leaves the file stale until `flush_if_stale`."""
        latest = self.latest_entry
        if end_offset < 0 or latest is None or latest.start_offset < end_offset:
            return
        self._remove_from_end(lambda e: e.start_offset >= end_offset)
        self._flush(flush)

    def truncate_from_start(self, start_offset: int, *, flush: bool = True) -> None:
        """Forget epochs that ended before the new log start offset (`flush` as in `truncate_from_end`).

        The last entry at or before `start_offset` is kept and moved to begin there, because the records
        from `start_offset` on still belong to that epoch.
        """
        removed = self._remove_from_start(lambda e: e.start_offset <= start_offset)
        if removed is None:
            return
        self._entries.insert(0, EpochEntry(removed.epoch, start_offset))
        self._flush(flush)

    def flush_if_stale(self) -> None:
        """Write the entries if a truncation left the file holding others."""
        if self._stale:
            self._flush()

    def clear_and_flush(self) -> None:
        self._entries.clear()
        self._flush()

    def _remove_from_end(self, predicate: Callable[[EpochEntry], bool]) -> None:
        while self._entries and predicate(self._entries[-1]):
            self._entries.pop()

    def _remove_from_start(self, predicate: Callable[[EpochEntry], bool]) -> EpochEntry | None:
        """Drop the leading entries matching `predicate`; return the last one dropped."""
        count = sum(1 for _ in itertools.takewhile(predicate, self._entries))
        if count == 0:
            return None
        last_removed = self._entries[count - 1]
        del self._entries[:count]
        return last_removed

    def _flush(self, now: bool = True) -> None:
        if self._checkpoint is None:
            return
        self._stale = self._entries != self._persisted
        if self._stale and now:
            self._checkpoint.write(self._entries)
            self._persisted = list(self._entries)
            self._stale = False

    def __repr__(self) -> str:
        return f"LeaderEpochFileCache({self._entries!r})"


def _epoch(entry: EpochEntry) -> int:
    return entry.epoch


def _start_offset(entry: EpochEntry) -> int:
    return entry.start_offset
