"""When a controller node snapshots its metadata log (Kafka's SnapshotGenerator, KIP-630).

Every voter, leader or follower, folds its committed log into an image of its own and snapshots that image when
`metadata.log.max.record.bytes.between.snapshots` bytes of batches have been committed since its latest
snapshot, or when committed records arrive `metadata.log.max.snapshot.interval.ms` or more after it (0: never by
time). The snapshot starts the log there (`RaftClient.create_snapshot`), so a restart replays the snapshot and
the records after it, and a voter or broker too far behind fetches the snapshot instead of the log.

Committed records only: the active controller's own image holds its records before they commit, so it is not
the one snapshotted. Like the Raft core, nothing here reads a clock: the shell calls `poll` with the time after
the core's events. docs/quorum.md#snapshots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tierlog.controller.metadata_log import read_metadata_snapshot
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import MetadataRecord, decode_record, encode_record
from tierlog.raft.messages import OffsetAndEpoch
from tierlog.raft.raft_client import RaftClient
from tierlog.raft.snapshot import MAX_BATCH_SIZE_BYTES
from tierlog.records.codec import decode_batches


@dataclass(frozen=True, slots=True)
class SnapshotConfig:
    # metadata.log.max.record.bytes.between.snapshots
    max_bytes_between_snapshots: int = 20 * 1024 * 1024
    # metadata.log.max.snapshot.interval.ms; 0 disables time-based snapshots.
    max_interval_ms: int = 3_600_000


class MetadataSnapshotter:
    def __init__(self, client: RaftClient, config: SnapshotConfig, now_ms: int) -> None:
        self._client = client
        self._config = config
        self.image = ClusterMetadata()
        # The offset after the last batch folded into the image (control batches included).
        self._next_offset = 0
        self._last_batch_timestamp = -1
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = now_ms
        self._load_latest_snapshot(now_ms)

    def _load_latest_snapshot(self, now_ms: int) -> None:
        snapshot = read_metadata_snapshot(self._client.log)
        if snapshot is None:
            return
        self.image = ClusterMetadata.from_snapshot(snapshot.records, snapshot.end_offset)
        self._next_offset = snapshot.end_offset
        # Kafka's SnapshotGenerator counts from a loaded snapshot as from one it wrote.
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = now_ms

    def poll(self, now_ms: int) -> OffsetAndEpoch | None:
        """Fold in what was committed since the last call and snapshot if due; the snapshot's id if one was
        written."""
        if self._next_offset < self._client.log.start_offset:
            # The log was replaced by the leader's snapshot (this voter was too far behind): start from that.
            self._load_latest_snapshot(now_ms)
        high_watermark = self._client.high_watermark
        while high_watermark is not None and self._next_offset < high_watermark:
            data = self._client.read_committed(self._next_offset, MAX_BATCH_SIZE_BYTES)
            if not data:
                break
            for batch in decode_batches(data):
                if batch.header.next_offset <= self._next_offset:
                    continue
                if not batch.header.is_control:
                    for record in batch.records:
                        if record.value is not None:
                            self.image.apply(record.offset, decode_record(record.value))
                self._next_offset = batch.header.next_offset
                self._last_batch_timestamp = batch.header.max_timestamp
                self._bytes_since_snapshot += batch.header.size_in_bytes
        if not self._due(now_ms):
            return None
        return self._snapshot(now_ms)

    def _due(self, now_ms: int) -> bool:
        if self._bytes_since_snapshot == 0:
            return False
        if self._bytes_since_snapshot >= self._config.max_bytes_between_snapshots:
            return True
        interval = self._config.max_interval_ms
        return interval != 0 and now_ms - self._last_snapshot_ms >= interval

    def _snapshot(self, now_ms: int) -> OffsetAndEpoch | None:
        log = self._client.log
        snapshot_id = OffsetAndEpoch(self._next_offset, log.epoch_of_offset_before(self._next_offset))
        # A generator: the image is written out only if the snapshot is taken.
        values = (encode_record(record) for record in _records_of(self.image))
        if not self._client.create_snapshot(snapshot_id, values, self._last_batch_timestamp, now_ms):
            return None
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = now_ms
        return snapshot_id


def _records_of(image: ClusterMetadata) -> Iterator[MetadataRecord]:
    # A generator function, so the image's records are listed when iterated, not when the generator is made.
    yield from image.snapshot_records()
