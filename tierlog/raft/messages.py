"""The messages of KRaft's Raft protocol (KIP-595, with KIP-996's pre-vote), as the core sees them.

Each mirrors the Kafka request or response of the same name, one partition only (`__cluster_metadata-0`), so
the asyncio shell maps them one to one onto Kafka's wire schemas (Vote, BeginQuorumEpoch, EndQuorumEpoch,
Fetch, FetchSnapshot) and the simulator carries them as they are. Errors are Kafka's error names, None for
none. docs/quorum.md states the rules each message takes part in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kafka's "no leader" and "no epoch" on the wire.
NO_LEADER = -1
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """A candidate asking for a vote in `candidate_epoch`; with `pre_vote` a prospective candidate asking
    whether it would get one, which changes nothing on the voter (KIP-996). `last_offset` is the candidate's
    log end offset and `last_offset_epoch` the epoch of its last record."""

    candidate_id: int
    candidate_epoch: int
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool = False
    voter_id: int = NO_LEADER
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class VoteResponse:
    error: str | None
    leader_id: int
    leader_epoch: int
    vote_granted: bool


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    """A newly elected leader telling a voter about its epoch, so the voter starts fetching from it."""

    leader_id: int
    leader_epoch: int
    voter_id: int = NO_LEADER
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    error: str | None
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    """A leader resigning (shutting down, or no longer hearing from a majority): the voters should elect a new
    one at once, the `preferred_successors` (the most caught up first) before the others."""

    leader_id: int
    leader_epoch: int
    preferred_successors: tuple[int, ...] = ()
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    error: str | None
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RaftFetchRequest:
    """Fetch of the metadata log by a voter (replication) or an observer (a broker following the metadata).
    `last_fetched_epoch` is the epoch of the record before `fetch_offset` in the fetcher's log, so the leader
    can tell it where its log diverges (as KIP-320 followers do)."""

    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int = 8 * 1024 * 1024
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class RaftFetchResponse:
    error: str | None
    leader_id: int
    leader_epoch: int
    high_watermark: int = -1
    log_start_offset: int = 0
    # Set when the fetcher's log diverges from the leader's: truncate to `offset` (the end of `epoch` on the
    # leader) and fetch again.
    diverging_epoch: OffsetAndEpoch | None = None
    # Set when the records at the fetch offset are gone below the leader's log start: fetch this snapshot.
    snapshot_id: OffsetAndEpoch | None = None
    records: bytes = field(default=b"", repr=False)


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    replica_id: int
    current_leader_epoch: int
    snapshot_id: OffsetAndEpoch
    position: int
    max_bytes: int = 8 * 1024 * 1024
    cluster_id: str | None = None


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    error: str | None
    leader_id: int
    leader_epoch: int
    snapshot_id: OffsetAndEpoch | None = None
    size: int = 0
    position: int = 0
    data: bytes = field(default=b"", repr=False)


RaftRequest = VoteRequest | BeginQuorumEpochRequest | EndQuorumEpochRequest | RaftFetchRequest | FetchSnapshotRequest
RaftResponse = (
    VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse | RaftFetchResponse | FetchSnapshotResponse
)


@dataclass(frozen=True, slots=True)
class Outbound:
    """A request the core wants sent to voter `destination`; its response (or None when none came within
    controller.quorum.request.timeout.ms or the connection failed) goes back through `RaftClient.on_response`."""

    destination: int
    request: RaftRequest


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica's progress as the leader sees it (DescribeQuorum's ReplicaState)."""

    replica_id: int
    log_end_offset: int
    last_fetch_timestamp: int = -1
    last_caught_up_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class QuorumInfo:
    """What DescribeQuorum answers (from the leader only)."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    current_voters: tuple[ReplicaState, ...]
    observers: tuple[ReplicaState, ...]
