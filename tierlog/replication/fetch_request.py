"""A Fetch request's way into the ReplicaManager: Kafka's KafkaApis.handleFetchRequest without the wire.

The request names who fetches (a follower by its replica id, a consumer as -1), how long and for how many bytes
it may wait, and per partition where it reads and what it knows of the leader's epochs; the ReplicaManager
reads, records a follower's position and parks what cannot be answered yet. The asyncio shell decodes a wire
request into a `FetchRequestData` and the simulator hands one over as it is: both answer through this.
"""

from __future__ import annotations

from tierlog.replication.fetcher import FetchRequestData
from tierlog.replication.replica_manager import (
    DelayedFetch,
    DelayedRemoteFetch,
    FetchParams,
    FetchResponder,
    PartitionFetchInfo,
    ReplicaManager,
)


def fetch_messages_for_request(
    replica_manager: ReplicaManager,
    request: FetchRequestData,
    now_ms: int,
    respond: FetchResponder,
    *,
    fetch_max_bytes: int,
) -> DelayedFetch | DelayedRemoteFetch | None:
    """Answer `request` through `respond`, at once or when its wait (or its read of the remote tier) ends;
    returns the parked fetch, whose deadline the caller arms a timer for. `fetch_max_bytes` is the broker's
    fetch.max.bytes, which caps what one request may ask for."""
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
        for p in request.partitions
    ]
    return replica_manager.fetch_messages(params, infos, now_ms, respond)
