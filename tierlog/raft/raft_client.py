"""KafkaRaftClient without I/O: one voter (or observer) of the controller quorum (KIP-595, KIP-996 pre-vote).

The shell (server/raft_manager.py over sockets, sim/controller_node.py over the simulated network) feeds it
what arrives (requests through `handle_*`, responses through `on_response`) with the time, asks `poll` for the
requests to send and `next_wakeup_ms` for when to poll again; nothing here reads a clock, sleeps or opens a
socket. Fetches that find nothing new are parked (long polling) and answered from `poll` or as soon as an
append or a high-watermark move brings something.

States (Kafka's): unattached (no leader known in the epoch), prospective (pre-voting: KIP-996), candidate,
leader, follower, resigned (a leader that gave up). docs/quorum.md states every rule.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tierlog.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Outbound,
    QuorumInfo,
    RaftFetchRequest,
    RaftFetchResponse,
    RaftRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
)
from tierlog.raft.quorum_state import QuorumStateStore
from tierlog.raft.raft_log import RaftLog


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """The controller.quorum.* settings, under Kafka's names and defaults."""

    # controller.quorum.election.timeout.ms: a candidate (or a voter with no leader) starts an election after a
    # random wait between this and twice this.
    election_timeout_ms: int = 1000
    # controller.quorum.fetch.timeout.ms: a follower that has not fetched from its leader for this long starts
    # an election; a leader that has not heard from a majority for 1.5x this resigns (check quorum).
    fetch_timeout_ms: int = 2000
    # controller.quorum.election.backoff.max.ms: the longest pause before a lost election is tried again.
    election_backoff_max_ms: int = 1000
    # controller.quorum.request.timeout.ms: a request with no response by then has failed.
    request_timeout_ms: int = 2000
    # controller.quorum.retry.backoff.ms: the pause before a failed request is sent again.
    retry_backoff_ms: int = 20
    # How long a fetch waits at the leader for records (KafkaRaftClient's fetchMaxWaitMs).
    fetch_max_wait_ms: int = 500


class NotLeaderError(Exception):
    """An append on a replica that is not the leader (Kafka's NotLeaderException): the caller answers
    NOT_CONTROLLER."""


class RaftClient:
    def __init__(
        self,
        node_id: int,
        voters: Collection[int],
        log: RaftLog,
        store: QuorumStateStore,
        config: RaftConfig,
        now_ms: int,
        rng: random.Random,
    ) -> None:
        """A voter when `node_id` is in `voters`. The election state is read from `store` (and written back
        before every vote and epoch change); an epoch in the log above the stored one wins (the state file
        was lost)."""
        raise NotImplementedError

    # The quorum as this replica sees it

    @property
    def epoch(self) -> int:
        raise NotImplementedError

    @property
    def leader_id(self) -> int | None:
        """The leader of the current epoch, if known."""
        raise NotImplementedError

    @property
    def is_leader(self) -> bool:
        raise NotImplementedError

    @property
    def state_name(self) -> str:
        """unattached, prospective, candidate, leader, follower or resigned."""
        raise NotImplementedError

    @property
    def high_watermark(self) -> int | None:
        """The end of the committed log (exclusive), None until known (a restarted voter learns it from the
        leader). Never goes back within one incarnation."""
        raise NotImplementedError

    @property
    def log(self) -> RaftLog:
        raise NotImplementedError

    def is_active_leader(self) -> bool:
        """The leader, with its epoch's LeaderChangeMessage committed: everything in its log is committed, so
        the controller may be built from it and start writing (Kafka's handleLeaderChange)."""
        raise NotImplementedError

    # Time

    def poll(self, now_ms: int) -> list[Outbound]:
        """Run the timers due by `now_ms` (elections, fetch timeout, check quorum, parked fetches' waits) and
        return the requests to send now. At most one request is in flight per destination."""
        raise NotImplementedError

    def next_wakeup_ms(self) -> int:
        """When `poll` has something to do next unless a message arrives first."""
        raise NotImplementedError

    def on_response(self, source: int, request: RaftRequest, response: RaftResponse | None, now_ms: int) -> None:
        """The response to a request `poll` returned, or None when it failed or timed out."""
        raise NotImplementedError

    # Requests from other replicas

    def handle_vote(self, request: VoteRequest, now_ms: int) -> VoteResponse:
        raise NotImplementedError

    def handle_begin_quorum_epoch(self, request: BeginQuorumEpochRequest, now_ms: int) -> BeginQuorumEpochResponse:
        raise NotImplementedError

    def handle_end_quorum_epoch(self, request: EndQuorumEpochRequest, now_ms: int) -> EndQuorumEpochResponse:
        raise NotImplementedError

    def handle_fetch(
        self, request: RaftFetchRequest, now_ms: int, respond: Callable[[RaftFetchResponse], None]
    ) -> None:
        """Answer through `respond`: at once, or (nothing new at the fetch offset, and a wait asked for) when
        an append or a high-watermark move brings something or the wait ends (in a later `poll`). A voter's
        fetch offset counts towards the high watermark; an observer (a broker) gets committed records only."""
        raise NotImplementedError

    def handle_fetch_snapshot(self, request: FetchSnapshotRequest, now_ms: int) -> FetchSnapshotResponse:
        raise NotImplementedError

    def describe_quorum(self, now_ms: int) -> QuorumInfo | None:
        """DescribeQuorum's answer; None when this replica is not the leader (NOT_LEADER_OR_FOLLOWER)."""
        raise NotImplementedError

    # The leader's writes

    def append(self, values: Sequence[bytes], now_ms: int) -> int:
        """Append one batch of records (the values of one controller operation) and return the offset of the
        first; they are committed once the high watermark passes them. NotLeaderError on any replica that
        is not the active leader."""
        raise NotImplementedError

    def resign(self, now_ms: int) -> None:
        """Graceful shutdown of a leader: stop accepting appends and tell the voters (EndQuorumEpoch, sent by
        the next polls) to elect another at once."""
        raise NotImplementedError

    # Committed records, for the controller and this node's broker

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from `offset`, none at or past the high watermark."""
        raise NotImplementedError

    def wait_for_commit(self, offset: int, max_wait_ms: int, now_ms: int, on_ready: Callable[[], None]) -> None:
        """Call `on_ready` once the high watermark is past `offset`, or when `max_wait_ms` has passed (in a
        later `poll`), or at once if there is no wait."""
        raise NotImplementedError
