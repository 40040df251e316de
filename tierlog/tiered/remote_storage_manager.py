"""KIP-405's RemoteStorageManager: the pluggable interface that moves segments to and from object storage.

It is I/O (and may block for seconds on a slow object store), so the shell calls it from worker threads;
the deterministic core only decides *what* to copy, read or delete.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tierlog.tiered.segment_metadata import RemoteLogSegmentMetadata


class IndexType(enum.Enum):
    """Kafka's RemoteStorageManager.IndexType, with the suffix each is stored under."""

    OFFSET = ".index"
    TIMESTAMP = ".timeindex"
    TRANSACTION = ".txnindex"
    LEADER_EPOCH = ".leader_epoch_checkpoint"
    PRODUCER_SNAPSHOT = ".snapshot"


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """What one copy uploads: the segment's files, and the leader-epoch checkpoint as of the segment's end
    (the whole history up to it, in the `leader-epoch-checkpoint` file format). The transaction index and
    producer snapshot are None when the broker has none (no transactions, no idempotent producers yet)."""

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot: Path | None
    leader_epoch_checkpoint: bytes


class RemoteStorageError(Exception):
    """The remote store failed (unreachable, refused, timed out). Retriable: the caller tries again later."""


class RemoteResourceNotFoundError(RemoteStorageError):
    """An object that should exist does not (deleted by retention, or never fully copied)."""


class RemoteStorageManager(Protocol):
    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        """Upload every file of the segment under names unique to `metadata.segment_id`. Raises
        RemoteStorageError; a failed copy may leave some objects behind for delete_log_segment_data."""
        ...

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int) -> bytes:
        """Bytes [start_position, end_position) of the segment's log file (end clamped to its size)."""
        ...

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index file of the given type; RemoteResourceNotFoundError if it was not uploaded."""
        ...

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete every object of the segment. Idempotent: objects already gone are not an error."""
        ...

    def close(self) -> None: ...
