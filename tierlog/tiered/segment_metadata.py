"""KIP-405's remote log segment metadata: what the RemoteLogMetadataManager stores for each remote segment.

Mirrors Kafka's org.apache.kafka.server.log.remote.storage.RemoteLogSegment{Id,Metadata,MetadataUpdate,State}.
The events are serialised as JSON records of `__remote_log_metadata` (Kafka uses its own binary message
format there; nothing outside the brokers reads that topic, so readable JSON costs nothing).
"""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass, replace

from tierlog.common import TopicPartition


class RemoteLogSegmentState(enum.IntEnum):
    """Kafka's states and ids. Allowed moves: STARTED -> FINISHED -> DELETE_STARTED -> DELETE_FINISHED, and
    STARTED -> DELETE_STARTED (a copy abandoned half-way is cleaned up)."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


_ALLOWED_TRANSITIONS = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: {
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
    },
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: {RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED},
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: set(),
}


def is_valid_transition(current: RemoteLogSegmentState, target: RemoteLogSegmentState) -> bool:
    return target in _ALLOWED_TRANSITIONS[current]


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    topic_partition: TopicPartition

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.topic_partition}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """A remote segment's identity. The random `id` keeps two copies of the same offsets (made by leaders
    of different epochs, or a retried copy) from overwriting each other's objects."""

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @property
    def topic_partition(self) -> TopicPartition:
        return self.topic_id_partition.topic_partition


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """One remote segment. `end_offset` is inclusive. `segment_leader_epochs` is the segment's own slice of
    the leader-epoch history: (epoch, first offset of that epoch within the segment), ascending; the first
    entry starts at `start_offset`. `has_txn_index` False: the copy uploaded no transaction index, so a
    read_committed read need not fetch one (docs/transactions.md#tiered-txn-index); True when it did, or for
    a segment described before tierlog recorded it."""

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    has_txn_index: bool = True

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"Invalid remote segment offsets [{self.start_offset}, {self.end_offset}]")
        if not self.segment_leader_epochs:
            raise ValueError("A remote segment needs at least one leader epoch")

    @property
    def topic_partition(self) -> TopicPartition:
        return self.segment_id.topic_partition

    @property
    def leader_epochs(self) -> list[int]:
        return [epoch for epoch, _ in self.segment_leader_epochs]

    def epoch_end_offset(self, epoch: int) -> int | None:
        """The last offset of `epoch` within this segment, or None if the segment holds none of it."""
        epochs = self.segment_leader_epochs
        for index, (entry_epoch, _) in enumerate(epochs):
            if entry_epoch == epoch:
                return epochs[index + 1][1] - 1 if index + 1 < len(epochs) else self.end_offset
        return None

    def with_update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        if update.segment_id != self.segment_id:
            raise ValueError(f"Update for {update.segment_id} applied to {self.segment_id}")
        return replace(
            self, state=update.state, event_timestamp_ms=update.event_timestamp_ms, broker_id=update.broker_id
        )


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    state: RemoteLogSegmentState
    broker_id: int

    @property
    def topic_partition(self) -> TopicPartition:
        return self.segment_id.topic_partition


RemoteLogMetadataEvent = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate


def encode_event(event: RemoteLogMetadataEvent) -> bytes:
    segment_id = event.segment_id
    fields: dict[str, object] = {
        "type": "segment" if isinstance(event, RemoteLogSegmentMetadata) else "update",
        "topic_id": str(segment_id.topic_id_partition.topic_id),
        "topic": segment_id.topic_partition.topic,
        "partition": segment_id.topic_partition.partition,
        "segment_id": str(segment_id.id),
        "state": event.state.name,
        "broker_id": event.broker_id,
        "event_timestamp_ms": event.event_timestamp_ms,
    }
    if isinstance(event, RemoteLogSegmentMetadata):
        fields.update(
            start_offset=event.start_offset,
            end_offset=event.end_offset,
            max_timestamp_ms=event.max_timestamp_ms,
            segment_size_in_bytes=event.segment_size_in_bytes,
            segment_leader_epochs=[list(entry) for entry in event.segment_leader_epochs],
            has_txn_index=event.has_txn_index,
        )
    return json.dumps(fields, separators=(",", ":")).encode()


def decode_event(value: bytes) -> RemoteLogMetadataEvent:
    """Raises ValueError (or KeyError/TypeError) on a record that is not one of ours."""
    fields = json.loads(value)
    segment_id = RemoteLogSegmentId(
        TopicIdPartition(uuid.UUID(fields["topic_id"]), TopicPartition(fields["topic"], int(fields["partition"]))),
        uuid.UUID(fields["segment_id"]),
    )
    state = RemoteLogSegmentState[fields["state"]]
    if fields["type"] == "update":
        return RemoteLogSegmentMetadataUpdate(
            segment_id, int(fields["event_timestamp_ms"]), state, int(fields["broker_id"])
        )
    if fields["type"] != "segment":
        raise ValueError(f"Unknown remote log metadata record type {fields['type']!r}")
    return RemoteLogSegmentMetadata(
        segment_id=segment_id,
        start_offset=int(fields["start_offset"]),
        end_offset=int(fields["end_offset"]),
        max_timestamp_ms=int(fields["max_timestamp_ms"]),
        broker_id=int(fields["broker_id"]),
        event_timestamp_ms=int(fields["event_timestamp_ms"]),
        segment_size_in_bytes=int(fields["segment_size_in_bytes"]),
        segment_leader_epochs=tuple((int(e), int(o)) for e, o in fields["segment_leader_epochs"]),
        state=state,
        has_txn_index=bool(fields.get("has_txn_index", True)),
    )
