"""The metadata log: `__cluster_metadata-0`, the durable store of every metadata change.

It is an ordinary partition log (the storage engine's `Log`) holding RecordBatch v2 batches whose record
values are `records.encode_record` JSON, so brokers read it with ordinary Fetch requests and `tierlog
dump-log` can show it. On a controller node it is the Raft log of the quorum (`QuorumMetadataLog` over
`tierlog.raft.raft_client.RaftClient`): the active controller appends one batch per operation, committed once
a majority of the voters hold it (docs/quorum.md). Every controller runs on the quorum, a lone one too (a
single voter is a majority by itself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tierlog.controller.errors import NotControllerError
from tierlog.metadata.loader import MetadataBatches
from tierlog.metadata.records import MetadataRecord, decode_record, encode_record
from tierlog.raft.messages import NO_EPOCH
from tierlog.raft.raft_client import NotLeaderError, RaftClient
from tierlog.raft.raft_log import RaftLog
from tierlog.raft.snapshot import MAX_BATCH_SIZE_BYTES
from tierlog.records.codec import decode_batches


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """A snapshot of the metadata log: the records that rebuild the image of the log below `end_offset`
    (`ClusterMetadata.from_snapshot`). docs/quorum.md#snapshots."""

    records: list[MetadataRecord]
    end_offset: int


class MetadataLog(Protocol):
    @property
    def end_offset(self) -> int:
        """The offset the next record gets."""
        ...

    def latest_snapshot(self) -> MetadataSnapshot | None:
        """The snapshot the log starts at, if any: the image is that snapshot's, then `records_from` its end."""
        ...

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        """Durably append the records of one operation, all or none; returns the offset of the first."""
        ...

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]: ...


class QuorumMetadataLog:
    """The active controller's view of the quorum's log (docs/quorum.md#active-controller): appends go through the
    Raft client, which replicates them, and reads come from this voter's own log, which is all committed while
    it is the active leader (the only time a `Controller` exists). `on_append` wakes whatever drives the client
    (RaftManager.poke), so the new batch is sent to the followers at once."""

    def __init__(self, client: RaftClient, on_append: Callable[[], None]) -> None:
        self._client = client
        self._on_append = on_append

    @property
    def end_offset(self) -> int:
        return self._client.log.end_offset

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        """Append the records of one operation as one batch; NotControllerError once this node is not the active
        leader (nothing is appended then)."""
        if not records:
            raise ValueError("a metadata batch needs at least one record")
        try:
            first_offset = self._client.append([encode_record(record) for record in records], now_ms)
        except NotLeaderError as e:
            raise NotControllerError(f"this controller is no longer the active one: {e}") from e
        self._on_append()
        return first_offset

    def latest_snapshot(self) -> MetadataSnapshot | None:
        return read_metadata_snapshot(self._client.log)

    def records_from(self, start_offset: int) -> list[tuple[int, MetadataRecord]]:
        found: list[tuple[int, MetadataRecord]] = []
        offset = start_offset
        log = self._client.log
        # A read stops at the end of a segment; keep reading until the end of the log.
        while offset < log.end_offset:
            data = log.read(offset, MAX_BATCH_SIZE_BYTES)
            if not data:
                break
            batches = decode_metadata_batches(data)
            # The batch holding `offset` comes whole, so it may start before it.
            found.extend(r for r in batches.records if r[0] >= offset)
            offset = batches.next_offset
        return found


def decode_metadata_batches(data: bytes, start_offset: int = 0) -> MetadataBatches:
    """(offset, record) for every record of the complete batches in `data` (a Fetch response may end in a
    partial batch, which is left for the next fetch) but control batches (the Raft leader's LeaderChangeMessage:
    docs/quorum.md#the-log); ValueError for anything else that is not a metadata batch. With no whole batch in
    `data`, `next_offset` is `start_offset` and `last_epoch` NO_EPOCH."""
    decoded: list[tuple[int, MetadataRecord]] = []
    next_offset, last_epoch = start_offset, NO_EPOCH
    for batch in decode_batches(data):
        next_offset, last_epoch = batch.header.last_offset + 1, batch.header.partition_leader_epoch
        if batch.header.is_control:
            continue
        for record in batch.records:
            if record.value is None:
                raise ValueError(f"metadata record at offset {record.offset} has no value")
            decoded.append((record.offset, decode_record(record.value)))
    return MetadataBatches(decoded, next_offset, last_epoch)


def read_metadata_snapshot(log: RaftLog) -> MetadataSnapshot | None:
    """The latest snapshot of a quorum's metadata log, decoded: what a node loads before replaying the log after
    it (the controller when it becomes active, a broker on a controller node, a restarted node)."""
    snapshot = log.latest_snapshot()
    if snapshot is None:
        return None
    return MetadataSnapshot([decode_record(value) for value in snapshot.values], snapshot.snapshot_id.offset)
