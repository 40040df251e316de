"""The replicated log of the quorum: `__cluster_metadata-0` on a voter's disk, the storage engine's `Log`.

Every batch carries the epoch of the leader that wrote it, and the leader-epoch cache (`leader-epoch-checkpoint`
in the partition directory) maps epochs to offsets, which is all Raft needs: the log end and the epoch of its
last record for votes, the end of an epoch for diverging-epoch truncation. Both roles append batches whose
offsets and epoch are already stamped (the leader stamps its own), and every append is fsynced before the
replica acts on it: a voter's log end counts towards the high watermark, so it must survive a power loss.

A new leader's first batch is a LeaderChangeMessage control batch (Kafka's, control type 2): once it commits,
every record before it is committed too (Raft commits only entries of the current term by counting replicas).
docs/quorum.md#the-log.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.protocol.fetch_response import uvarint
from tierlog.raft.messages import NO_EPOCH, OffsetAndEpoch
from tierlog.raft.snapshot import MAX_BATCH_SIZE_BYTES, Snapshot, SnapshotStore, SnapshotWriter
from tierlog.records.codec import build_batch
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig

METADATA_TOPIC = "__cluster_metadata"
# Kafka's fixed id of the metadata topic (Uuid.METADATA_TOPIC_ID), by which Fetch v13+ names it.
METADATA_TOPIC_ID = uuid.UUID(int=1)
METADATA_PARTITION = TopicPartition(METADATA_TOPIC, 0)
# ControlRecordType.LEADER_CHANGE, in the control record key (version int16 0, type int16).
LEADER_CHANGE_KEY = b"\x00\x00\x00\x02"


class RaftLog:
    def __init__(self, log_dir: Path, now_ms: int) -> None:
        # Segments below a snapshot are deleted at once: every read hands out bytes, never an open file.
        config = LogConfig.from_props({"max.message.bytes": str(MAX_BATCH_SIZE_BYTES), "file.delete.delay.ms": "0"}, {})
        self._log = Log.open(
            log_dir / str(METADATA_PARTITION),
            config,
            topic_partition=METADATA_PARTITION,
            # No checkpoints are kept for this log: every open validates it from the start, which costs little
            # for a log this small and truncates a tail torn by a crash.
            recovery_point=0,
            log_start_offset=0,
            # Unused: the Raft client keeps the high watermark, which is not durable (a restarted voter learns
            # it again from the leader).
            high_watermark=0,
            had_clean_shutdown=False,
            now_ms=now_ms,
        )
        self.snapshots = SnapshotStore(self._log.dir)
        self._start_at_latest_snapshot(now_ms)

    @property
    def end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def last_epoch(self) -> int:
        """The epoch of the last record, 0 for an empty log; that of the snapshot it starts at for a log emptied
        down to its latest snapshot (Kafka's lastFetchedEpoch)."""
        latest = self._log.latest_epoch
        if latest is not None:
            return latest
        snapshot_id = self.snapshots.latest_id()
        return 0 if snapshot_id is None else snapshot_id.epoch

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch <= `epoch` this log holds and the offset where it ends (the start of the next
        epoch, or the log end): where a fetcher whose last record has `epoch` must truncate to."""
        found_epoch, end_offset = self._log.leader_epoch_cache.end_offset_for(epoch, self.end_offset)
        if found_epoch < 0:
            return OffsetAndEpoch(0 if end_offset < 0 else end_offset, NO_EPOCH)
        return OffsetAndEpoch(end_offset, found_epoch)

    def epoch_of_offset_before(self, offset: int) -> int:
        """The epoch of the record at `offset - 1`: a fetch's LastFetchedEpoch. 0 at the start of the log."""
        if offset <= 0:
            return 0
        snapshot_id = self.snapshots.latest_id()
        if snapshot_id is not None and offset == snapshot_id.offset:
            # The record before the log start is in the snapshot, whose id carries its epoch.
            return snapshot_id.epoch
        epoch = self._log.leader_epoch_cache.epoch_for_offset(offset - 1)
        return 0 if epoch is None else epoch

    def append_values(self, values: Sequence[bytes], epoch: int, now_ms: int) -> int:
        """Append one batch of records with these values in `epoch` (the leader's append); returns the offset
        of the first."""
        first_offset = self.end_offset
        batch = build_batch(
            [(None, value, [], now_ms) for value in values], base_offset=first_offset, partition_leader_epoch=epoch
        )
        self._append(batch, now_ms)
        return first_offset

    def append_leader_change(
        self, leader_id: int, voters: Sequence[int], granting: Sequence[int], epoch: int, now_ms: int
    ) -> int:
        """Append the LeaderChangeMessage control batch that opens `epoch`; returns its offset."""
        first_offset = self.end_offset
        value = _leader_change_message(leader_id, voters, granting)
        batch = build_batch(
            [(LEADER_CHANGE_KEY, value, [], now_ms)],
            base_offset=first_offset,
            partition_leader_epoch=epoch,
            control=True,
        )
        self._append(batch, now_ms)
        return first_offset

    def append_fetched(self, data: bytes, now_ms: int) -> None:
        """Append the whole batches of a fetch response (a follower's append); a partial batch at the end is
        left for the next fetch. Batches below the log end (a duplicate response) are skipped."""
        end = self.end_offset
        for position, size in complete_batches(data):
            header = read_header(data, position)
            if header.last_offset < end:
                continue
            if header.base_offset != end:
                raise ValueError(f"fetched batch at offset {header.base_offset} does not follow the log end {end}")
            self._append(data[position : position + size], now_ms)
            end = self.end_offset

    def _append(self, batch: bytes, now_ms: int) -> None:
        self._log.append_as_follower(batch, now_ms)
        self._log.flush()

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after `offset`: the uncommitted tail a deposed leader or a follower of
        one wrote, which the new leader's log does not have."""
        self._log.truncate_to(offset)
        self._log.flush()

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one holding `start_offset` (at least one, whatever `max_bytes`), none at or
        past `max_offset`."""
        if start_offset >= self.end_offset:
            return b""
        data = self._log.read(start_offset, max_bytes, max_offset=max_offset, min_one_message=True).records
        return b"" if data is None else data.read_bytes()

    def close(self) -> None:
        self._log.close()

    # Snapshots (KIP-630): docs/quorum.md#snapshots. Whenever a snapshot exists the log starts at the latest one:
    # the records below it are only in the snapshot.

    def latest_snapshot(self) -> Snapshot | None:
        """The latest snapshot's records: with the log from its end offset on, the whole committed state."""
        snapshot_id = self.snapshots.latest_id()
        return None if snapshot_id is None else self.snapshots.read(snapshot_id)

    def create_snapshot(
        self,
        snapshot_id: OffsetAndEpoch,
        values: Iterable[bytes],
        last_contained_log_timestamp: int,
        high_watermark: int,
        now_ms: int,
    ) -> bool:
        """Write the snapshot of the state the records below `snapshot_id.offset` build, then start the log
        there. Only committed state is snapshotted (the offset is at most `high_watermark`), at a batch boundary,
        with the epoch of the record before it. False if the log starts there already; `values` is then not
        iterated."""
        if snapshot_id.offset <= self.start_offset:
            return False
        if snapshot_id.offset > high_watermark:
            raise ValueError(f"snapshot {snapshot_id} is past the high watermark {high_watermark}")
        if not self._starts_a_batch(snapshot_id.offset):
            # A fetch from the log start must get whole batches that start there.
            raise ValueError(f"snapshot {snapshot_id} ends inside a batch")
        if snapshot_id.epoch != self.epoch_of_offset_before(snapshot_id.offset):
            raise ValueError(
                f"snapshot {snapshot_id}: the record before offset {snapshot_id.offset} has epoch "
                f"{self.epoch_of_offset_before(snapshot_id.offset)}"
            )
        self.snapshots.write(snapshot_id, values, last_contained_log_timestamp, now_ms)
        self._start_at_snapshot(snapshot_id, now_ms)
        return True

    def _starts_a_batch(self, offset: int) -> bool:
        if offset >= self.end_offset:
            return offset == self.end_offset
        return read_header(self.read(offset, 1)).base_offset == offset

    def snapshot_to_fetch(self, fetch_offset: int, last_fetched_epoch: int) -> OffsetAndEpoch | None:
        """The snapshot a fetcher must load before it can fetch on: its fetch offset is below the log start, or at
        it with another epoch than the snapshot's, or its last epoch is older than the snapshot's (Kafka's
        ReplicatedLog.validateOffsetAndEpoch). None when the log can answer. A fetcher that sends no epoch (-1)
        is judged by its offset alone."""
        snapshot_id = self.snapshots.latest_id()
        if snapshot_id is None or (fetch_offset == 0 and self.start_offset == 0):
            return None
        if fetch_offset < self.start_offset:
            return snapshot_id
        if last_fetched_epoch >= 0 and (
            (fetch_offset == self.start_offset and last_fetched_epoch != snapshot_id.epoch)
            or last_fetched_epoch < snapshot_id.epoch
        ):
            return snapshot_id
        return None

    def begin_snapshot_download(self, snapshot_id: OffsetAndEpoch) -> SnapshotWriter:
        """A `.part` file the leader's snapshot is fetched into; `install_snapshot` once it is frozen."""
        return self.snapshots.writer(snapshot_id)

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, now_ms: int) -> None:
        """A snapshot fetched from the leader (frozen, checked whole) replaces the log below its end offset:
        the log is truncated fully and starts there, as its records may differ from the leader's."""
        self.snapshots.read(snapshot_id)
        self._start_empty_at_snapshot(snapshot_id, now_ms)

    def _start_at_latest_snapshot(self, now_ms: int) -> None:
        """At open: the log starts at the latest snapshot. A log that ends before it or holds a later epoch's
        records below its end (a follower that crashed after fetching a snapshot but before truncating: Kafka's
        truncateToLatestSnapshot) is truncated fully to start there."""
        snapshot_id = self.snapshots.latest_id()
        if snapshot_id is None:
            return
        if snapshot_id.offset > self.end_offset or snapshot_id.epoch > (self._log.latest_epoch or 0):
            self._start_empty_at_snapshot(snapshot_id, now_ms)
        else:
            self._start_at_snapshot(snapshot_id, now_ms)

    def _start_empty_at_snapshot(self, snapshot_id: OffsetAndEpoch, now_ms: int) -> None:
        self._log.truncate_fully_and_start_at(snapshot_id.offset)
        self._log.flush()
        self._log.remove_deleted_segments(now_ms)
        self.snapshots.delete_before(snapshot_id)

    def _start_at_snapshot(self, snapshot_id: OffsetAndEpoch, now_ms: int) -> None:
        """Move the log start to the snapshot's end offset and delete the segments and older snapshots below it.
        The storage log's high watermark (otherwise unused here) is raised to the snapshot, as its log start may
        not pass it."""
        self._log.update_high_watermark(max(self._log.high_watermark, snapshot_id.offset))
        self._log.maybe_increment_log_start_offset(snapshot_id.offset)
        self._log.delete_old_segments(now_ms)
        self._log.remove_deleted_segments(now_ms)
        self.snapshots.delete_before(snapshot_id)


def _leader_change_message(leader_id: int, voters: Sequence[int], granting: Sequence[int]) -> bytes:
    """LeaderChangeMessage v0 (flexible): version, leaderId, voters, grantingVoters, no tagged fields."""
    out = bytearray((0).to_bytes(2, "big", signed=True) + leader_id.to_bytes(4, "big", signed=True))
    for ids in (voters, granting):
        out += uvarint(len(ids) + 1)
        for voter in ids:
            out += voter.to_bytes(4, "big", signed=True) + b"\x00"
    out += b"\x00"
    return bytes(out)
