"""A Fetch request's way into the ReplicaManager: Kafka's KafkaApis.handleFetchRequest without the wire.

The request names who fetches (a follower by its replica id, a consumer as -1), how long and for how many bytes
it may wait, and per partition where it reads and what it knows of the leader's epochs; the ReplicaManager
reads, records a follower's position and parks what cannot be answered yet. A request of a fetch session reads
every partition of the session and answers only those with something new (docs/performance.md#fetch-sessions).
The asyncio shell decodes a wire request into a `FetchRequestData` and the simulator hands one over as it is:
both answer through this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tierlog.replication.fetch_session import FetchManager, FetchRequestPartition, PartitionAnswer
from tierlog.replication.fetcher import FetchRequestData
from tierlog.replication.replica_manager import (
    DelayedFetch,
    DelayedRemoteFetch,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
)
from tierlog.storage.file_records import FileSlice


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """A Fetch answer: the session error (None if none) and session id, then each partition answered with the
    request it answers (a partition of an unknown topic id has topic "")."""

    error: str | None
    session_id: int
    partitions: list[tuple[FetchRequestPartition, FetchPartitionResult]]


# The topics, of those named, the fetcher may read (the shell's authorizer); None: all of them.
ReadableTopics = Callable[[set[str]], set[str]]


def fetch_messages_for_request(
    replica_manager: ReplicaManager,
    fetch_manager: FetchManager,
    request: FetchRequestData,
    now_ms: int,
    respond: Callable[[FetchAnswer], None],
    *,
    fetch_max_bytes: int,
    readable_topics: ReadableTopics | None = None,
) -> DelayedFetch | DelayedRemoteFetch | None:
    """Answer `request` through `respond`, at once or when its wait (or its read of the remote tier) ends;
    returns the parked fetch, whose deadline the caller arms a timer for. `fetch_max_bytes` is the broker's
    fetch.max.bytes, which caps what one request may ask for. A partition of an unknown topic id is answered
    UNKNOWN_TOPIC_ID, one of a topic not readable TOPIC_AUTHORIZATION_FAILED, after those read (as Kafka)."""
    context = fetch_manager.new_context(
        uses_topic_ids=request.uses_topic_ids,
        session_id=request.session_id,
        session_epoch=request.session_epoch,
        is_follower=request.replica_id >= 0,
        fetch_data=request.partitions,
        forgotten=request.forgotten,
        now_ms=now_ms,
    )
    requested = context.partitions()
    # By topic id, "" is an id this broker does not know; by name, a name like any other.
    named = {p.topic_partition.topic for p in requested if p.topic_partition.topic or not request.uses_topic_ids}
    readable = named if readable_topics is None else readable_topics(named)
    to_read = {p.topic_partition: p for p in requested if p.topic_partition.topic in readable}
    refused = [
        (p, FetchPartitionResult(p.topic_partition, _refusal(p, named), None))
        for p in requested
        if p.topic_partition.topic not in readable
    ]

    def answer(results: list[FetchPartitionResult]) -> None:
        answered = [(to_read[r.topic_partition], r) for r in results] + refused
        session, sent = context.answer([(p, _partition_answer(r)) for p, r in answered], now_ms)
        kept = [item for item, send in zip(answered, sent, strict=True) if send]
        respond(FetchAnswer(session.error, session.session_id, kept))

    params = FetchParams(
        replica_id=request.replica_id,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=min(request.max_bytes, fetch_max_bytes),
        isolation_level=request.isolation_level,
    )
    infos = [
        (
            p.topic_partition,
            PartitionFetchInfo(
                p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset
            ),
        )
        for p in to_read.values()
    ]
    return replica_manager.fetch_messages(params, infos, now_ms, answer)


def _refusal(partition: FetchRequestPartition, named: set[str]) -> str:
    """Why a partition is not read: its topic id names no topic, or its topic may not be read."""
    return "TOPIC_AUTHORIZATION_FAILED" if partition.topic_partition.topic in named else "UNKNOWN_TOPIC_ID"


def _partition_answer(result: FetchPartitionResult) -> PartitionAnswer:
    read = result.read
    if read is None:
        return PartitionAnswer(0, -1, -1, result.error, diverging=False)
    records = read.records
    size = 0 if records is None else records.size if isinstance(records, FileSlice) else len(records)
    return PartitionAnswer(
        size, read.high_watermark, read.log_start_offset, result.error, diverging=read.diverging_epoch is not None
    )
