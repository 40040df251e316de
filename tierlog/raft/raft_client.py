"""KafkaRaftClient without I/O: one voter of the controller quorum (KIP-595, with KIP-996's pre-vote).

The shell (server/raft_manager.py over sockets, sim/controller_node.py over the simulated network) feeds it
what arrives (requests through `handle_*`, responses through `on_response`) with the time, asks `poll` for the
requests to send and `next_wakeup_ms` for when to poll again; nothing here reads a clock, sleeps or opens a
socket. Fetches that find nothing new are parked (long polling) and answered from `poll` or as soon as an
append or a high-watermark move brings something.

States (Kafka's): unattached (no leader known in the epoch), prospective (pre-voting, KIP-996), candidate,
leader, follower, resigned (a leader that gave up its epoch). docs/quorum.md states every rule; the anchors
below name the section each piece implements.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from tierlog.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    Outbound,
    QuorumInfo,
    RaftFetchRequest,
    RaftFetchResponse,
    RaftRequest,
    RaftResponse,
    ReplicaState,
    VoteRequest,
    VoteResponse,
)
from tierlog.raft.quorum_state import ElectionState, QuorumStateStore
from tierlog.raft.raft_log import RaftLog
from tierlog.raft.snapshot import SnapshotWriter

UNATTACHED = "unattached"
PROSPECTIVE = "prospective"
CANDIDATE = "candidate"
LEADER = "leader"
FOLLOWER = "follower"
RESIGNED = "resigned"

NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"
UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"
INCONSISTENT_VOTER_SET = "INCONSISTENT_VOTER_SET"
SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND"
POSITION_OUT_OF_RANGE = "POSITION_OUT_OF_RANGE"
# A leader that has not heard from a majority for this many fetch timeouts resigns (Kafka's check quorum).
CHECK_QUORUM_TIMEOUT_FACTOR = 1.5
_FOREVER = 2**63 - 1


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


@dataclass(slots=True)
class _Replica:
    """What the leader knows of one replica that fetches from it."""

    end_offset: int = 0
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    # The high watermark the last answer to this replica carried: a newer one is news worth answering at once.
    sent_high_watermark: int = -1


@dataclass(slots=True)
class _ParkedFetch:
    request: RaftFetchRequest
    respond: Callable[[RaftFetchResponse], None]
    deadline_ms: int


@dataclass(slots=True)
class _CommitWaiter:
    offset: int
    deadline_ms: int
    on_ready: Callable[[], None]


@dataclass(slots=True)
class _Election:
    """Votes (or pre-votes) asked for in one round and the answers so far."""

    granted: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)


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
        """A voter of `voters`. The election state is read from `store` (and written back before every vote
        and epoch change); an epoch in the log above the stored one wins (the state file was lost)."""
        if node_id not in voters:
            raise ValueError(f"node {node_id} is not one of the voters {sorted(voters)}")
        self.node_id = node_id
        self.voters = frozenset(voters)
        self._log = log
        self._store = store
        self._config = config
        self._rng = rng
        self._state = UNATTACHED
        self._epoch = 0
        self._leader_id: int | None = None
        self._voted_id: int | None = None
        self._high_watermark: int | None = None
        # Timers: the election (unattached, prospective, candidate, resigned), the leader's silence (follower),
        # the leader's check quorum.
        self._election_deadline_ms = _FOREVER
        self._fetch_deadline_ms = _FOREVER
        self._check_quorum_deadline_ms = _FOREVER
        # A follower whose leader announced its resignation grants pre-votes at once.
        self._leader_resigned = False
        self._election = _Election()
        # Leader only.
        self._epoch_start_offset = -1
        self._replicas: dict[int, _Replica] = {}
        self._observers: dict[int, _Replica] = {}
        self._heard_since_check: set[int] = set()
        # Voters that still need a BeginQuorumEpoch (leader) or an EndQuorumEpoch (resigned).
        self._to_notify: set[int] = set()
        self._preferred_successors: tuple[int, ...] = ()
        # Requests on the wire, by destination, and when a destination may be sent to again after a failure.
        self._in_flight: dict[int, RaftRequest] = {}
        self._retry_at_ms: dict[int, int] = {}
        self._parked: list[_ParkedFetch] = []
        self._commit_waiters: list[_CommitWaiter] = []
        # Follower only: the leader's snapshot being fetched, when the leader's log no longer reaches back to this
        # log's end (docs/quorum.md#snapshots).
        self._snapshot_download: SnapshotWriter | None = None
        self._restore(now_ms)

    def _restore(self, now_ms: int) -> None:
        stored = self._store.read() or ElectionState(0)
        if self._log.last_epoch > stored.epoch:
            # The state file is older than the log (lost, or never written): the log's epoch is the floor.
            self._become_unattached(self._log.last_epoch, now_ms)
            return
        self._epoch, self._voted_id = stored.epoch, stored.voted_id
        if stored.leader_id == self.node_id:
            # A leader cannot take up its epoch again after a restart (its followers' progress is gone): it
            # resigns it, as Kafka's does.
            self._leader_id = self.node_id
            self._become_resigned(now_ms)
        elif stored.leader_id is not None:
            self._leader_id = stored.leader_id
            self._state = FOLLOWER
            self._fetch_deadline_ms = now_ms + self._config.fetch_timeout_ms
        else:
            self._state = UNATTACHED
            self._arm_election_timer(now_ms)
        if self.voters == {self.node_id}:
            self._become_candidate(now_ms)

    # The quorum as this replica sees it

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_id(self) -> int | None:
        """The leader of the current epoch, if known."""
        return self._leader_id

    @property
    def is_leader(self) -> bool:
        return self._state == LEADER

    @property
    def state_name(self) -> str:
        """unattached, prospective, candidate, leader, follower or resigned."""
        return self._state

    @property
    def voted_id(self) -> int | None:
        return self._voted_id

    @property
    def high_watermark(self) -> int | None:
        """The end of the committed log (exclusive), None until known (a restarted voter learns it from the
        leader). Never goes back within one incarnation."""
        return self._high_watermark

    @property
    def log(self) -> RaftLog:
        return self._log

    def is_active_leader(self) -> bool:
        """The leader, with its epoch's LeaderChangeMessage committed: everything in its log is committed, so
        the controller may be built from it and start writing (Kafka's handleLeaderChange)."""
        return (
            self._state == LEADER
            and self._high_watermark is not None
            and self._high_watermark > self._epoch_start_offset
        )

    # Transitions (docs/quorum.md#states). Every change of epoch, vote or leader is durable before it is acted on.

    def _persist(self) -> None:
        self._store.write(ElectionState(self._epoch, self._leader_id, self._voted_id))

    def _leave_state(self) -> None:
        was_leader = self._state in (LEADER, RESIGNED)
        self._election = _Election()
        self._election_deadline_ms = self._fetch_deadline_ms = self._check_quorum_deadline_ms = _FOREVER
        self._leader_resigned = False
        self._to_notify = set()
        self._abort_snapshot_download()
        # Requests of the old state stay in flight (one per destination, always) until answered or failed; their
        # answers no longer count.
        self._retry_at_ms.clear()
        if was_leader:
            self._replicas.clear()
            self._observers.clear()
            self._epoch_start_offset = -1

    def _become_unattached(self, epoch: int, now_ms: int) -> None:
        self._leave_state()
        self._state = UNATTACHED
        self._epoch, self._leader_id, self._voted_id = epoch, None, None
        self._persist()
        self._arm_election_timer(now_ms)
        self._state_changed()

    def _become_follower(self, epoch: int, leader_id: int, now_ms: int) -> None:
        voted_id = self._voted_id if epoch == self._epoch else None
        self._leave_state()
        self._state = FOLLOWER
        self._epoch, self._leader_id, self._voted_id = epoch, leader_id, voted_id
        self._persist()
        self._fetch_deadline_ms = now_ms + self._config.fetch_timeout_ms
        self._state_changed()

    def _become_prospective(self, now_ms: int) -> None:
        """Ask for pre-votes (docs/quorum.md#pre-vote): nothing durable changes, the leader (if one is known)
        stays known, and only a majority of pre-votes lets this voter bump the epoch."""
        leader_id = self._leader_id if self._state in (FOLLOWER, PROSPECTIVE) else None
        self._leave_state()
        self._state = PROSPECTIVE
        self._leader_id = leader_id
        self._election = _Election(granted={self.node_id})
        self._arm_election_timer(now_ms)
        if self._has_majority(self._election.granted):
            self._become_candidate(now_ms)

    def _become_candidate(self, now_ms: int) -> None:
        self._leave_state()
        self._state = CANDIDATE
        self._epoch, self._leader_id, self._voted_id = self._epoch + 1, None, self.node_id
        self._persist()
        self._election = _Election(granted={self.node_id})
        self._arm_election_timer(now_ms)
        if self._has_majority(self._election.granted):
            self._become_leader(now_ms)
        else:
            self._state_changed()

    def _become_leader(self, now_ms: int) -> None:
        granting = sorted(self._election.granted)
        self._leave_state()
        self._state = LEADER
        self._leader_id = self.node_id
        self._persist()
        self._epoch_start_offset = self._log.append_leader_change(
            self.node_id, sorted(self.voters), granting, self._epoch, now_ms
        )
        self._replicas = {voter: _Replica() for voter in self.voters}
        self._replicas[self.node_id].end_offset = self._log.end_offset
        self._to_notify = set(self.voters) - {self.node_id}
        # A leader that is a majority alone (one voter) has nobody to hear from: check quorum never fails it.
        alone = self._has_majority({self.node_id})
        self._check_quorum_deadline_ms = _FOREVER if alone else now_ms + self._check_quorum_timeout_ms()
        self._update_leader_high_watermark(now_ms)
        self._state_changed()

    def _become_resigned(self, now_ms: int) -> None:
        """Give up the epoch (shutdown, or no majority heard from): no more appends; the voters are told to
        elect another (EndQuorumEpoch), the most caught-up first (docs/quorum.md#resignation)."""
        progress = {voter: replica.end_offset for voter, replica in self._replicas.items()}
        self._leave_state()
        self._state = RESIGNED
        others = [voter for voter in self.voters if voter != self.node_id]
        self._preferred_successors = tuple(sorted(others, key=lambda voter: (-progress.get(voter, 0), voter)))
        self._to_notify = set(others)
        self._arm_election_timer(now_ms)
        self._state_changed()

    def _state_changed(self) -> None:
        """Parked fetches and commit waiters learn of the change now (a deposed leader answers its parked fetches
        with where the leadership went; a controller waiting for a commit must hear it may never come)."""
        self._complete_parked(force=self._state != LEADER)
        self._complete_commit_waiters(force=True)

    def _observe(self, epoch: int, leader_id: int, now_ms: int, *, from_leader: bool = True) -> bool:
        """A message showed `epoch` (and its leader, or NO_LEADER). Move to a newer epoch, or follow a leader
        learnt of in this one. True if the message is from an older epoch and must be ignored.

        A prospective voter that knows the leader of its epoch follows it again only on word from the leader
        itself (`from_leader`): another voter's rejection naming that leader only says that voter still hears
        from it, and following on that would keep two voters cut off from a dead leader rejecting each other."""
        leader = None if leader_id == NO_LEADER else leader_id
        if epoch < self._epoch:
            return True
        if epoch > self._epoch:
            if leader is not None and leader != self.node_id:
                self._become_follower(epoch, leader, now_ms)
            else:
                self._become_unattached(epoch, now_ms)
        elif (
            leader is not None
            and leader != self.node_id
            and self._state in (UNATTACHED, PROSPECTIVE, CANDIDATE)
            and (from_leader or self._state != PROSPECTIVE or self._leader_id != leader)
        ):
            self._become_follower(epoch, leader, now_ms)
        return False

    # Time

    def _arm_election_timer(self, now_ms: int) -> None:
        timeout = self._config.election_timeout_ms
        self._election_deadline_ms = now_ms + timeout + self._rng.randrange(timeout + 1)

    def _backoff_ms(self) -> int:
        return self._rng.randrange(1, max(self._config.election_backoff_max_ms, 1) + 1)

    def _check_quorum_timeout_ms(self) -> int:
        return int(self._config.fetch_timeout_ms * CHECK_QUORUM_TIMEOUT_FACTOR)

    def poll(self, now_ms: int) -> list[Outbound]:
        """Run the timers due by `now_ms` (elections, fetch timeout, check quorum, parked fetches' waits) and
        return the requests to send now. At most one request is in flight per destination."""
        state = self._state
        if state in (UNATTACHED, PROSPECTIVE, CANDIDATE, RESIGNED) and now_ms >= self._election_deadline_ms:
            # A lost or stalled election, a leader that never appeared, a resignation done: ask for pre-votes.
            self._become_prospective(now_ms)
        elif state == FOLLOWER and now_ms >= self._fetch_deadline_ms:
            self._become_prospective(now_ms)
        elif state == LEADER and now_ms >= self._check_quorum_deadline_ms:
            self._become_resigned(now_ms)
        self._complete_parked(now_ms=now_ms)
        self._complete_commit_waiters(now_ms=now_ms)
        # A backoff that has run out is over: left in place it would keep next_wakeup_ms in the past.
        self._retry_at_ms = {destination: at for destination, at in self._retry_at_ms.items() if at > now_ms}
        return [Outbound(destination, request) for destination, request in self._requests_due(now_ms)]

    def _requests_due(self, now_ms: int) -> list[tuple[int, RaftRequest]]:
        due: list[tuple[int, RaftRequest]] = []

        def may_send(destination: int) -> bool:
            return destination not in self._in_flight and self._retry_at_ms.get(destination, 0) <= now_ms

        if self._state in (FOLLOWER, PROSPECTIVE) and self._leader_id is not None and may_send(self._leader_id):
            # A prospective voter keeps fetching from the leader it knew: if that leader answers, the outage was
            # on this side and it follows again.
            download = self._snapshot_download
            due.append((self._leader_id, self._fetch_request() if download is None else self._fetch_snapshot_request()))
        if self._state in (PROSPECTIVE, CANDIDATE):
            pre_vote = self._state == PROSPECTIVE
            answered = self._election.granted | self._election.rejected
            for voter in sorted(self.voters - answered):
                if may_send(voter):
                    due.append((voter, self._vote_request(pre_vote)))
        if self._state == LEADER:
            for voter in sorted(self._to_notify):
                if may_send(voter):
                    due.append((voter, BeginQuorumEpochRequest(self.node_id, self._epoch, voter_id=voter)))
        if self._state == RESIGNED:
            for voter in sorted(self._to_notify):
                if may_send(voter):
                    due.append((voter, EndQuorumEpochRequest(self.node_id, self._epoch, self._preferred_successors)))
        for destination, request in due:
            self._in_flight[destination] = request
        return due

    def _fetch_request(self) -> RaftFetchRequest:
        end_offset = self._log.end_offset
        return RaftFetchRequest(
            replica_id=self.node_id,
            current_leader_epoch=self._epoch,
            fetch_offset=end_offset,
            last_fetched_epoch=self._log.epoch_of_offset_before(end_offset),
            max_wait_ms=self._config.fetch_max_wait_ms,
        )

    def _vote_request(self, pre_vote: bool) -> VoteRequest:
        # A pre-vote asks about the epoch this voter would campaign in (docs/quorum.md#pre-vote).
        return VoteRequest(
            candidate_id=self.node_id,
            candidate_epoch=self._epoch + 1 if pre_vote else self._epoch,
            last_offset_epoch=self._log.last_epoch,
            last_offset=self._log.end_offset,
            pre_vote=pre_vote,
        )

    def next_wakeup_ms(self) -> int:
        """When `poll` has something to do next unless a message arrives first."""
        times = [self._election_deadline_ms, self._fetch_deadline_ms, self._check_quorum_deadline_ms]
        times.extend(fetch.deadline_ms for fetch in self._parked)
        times.extend(waiter.deadline_ms for waiter in self._commit_waiters)
        times.extend(self._retry_at_ms.values())
        return min(times)

    def on_response(self, source: int, request: RaftRequest, response: RaftResponse | None, now_ms: int) -> None:
        """The response to a request `poll` returned, or None when it failed or timed out."""
        if self._in_flight.get(source) is not request:
            return  # the request of a state this replica has left, or a duplicate answer
        del self._in_flight[source]
        if response is None:
            self._retry_at_ms[source] = now_ms + self._config.retry_backoff_ms
            return
        if isinstance(request, VoteRequest) and isinstance(response, VoteResponse):
            self._on_vote_response(source, request, response, now_ms)
        elif isinstance(request, RaftFetchRequest) and isinstance(response, RaftFetchResponse):
            self._on_fetch_response(source, request, response, now_ms)
        elif isinstance(request, FetchSnapshotRequest) and isinstance(response, FetchSnapshotResponse):
            self._on_fetch_snapshot_response(source, request, response, now_ms)
        elif isinstance(request, BeginQuorumEpochRequest | EndQuorumEpochRequest) and isinstance(
            response, BeginQuorumEpochResponse | EndQuorumEpochResponse
        ):
            if self._observe(response.leader_epoch, response.leader_id, now_ms):
                return
            notifying = LEADER if isinstance(request, BeginQuorumEpochRequest) else RESIGNED
            if self._state != notifying or request.leader_epoch != self._epoch:
                return
            if response.error is None:
                self._to_notify.discard(source)
            else:
                self._retry_at_ms[source] = now_ms + self._config.retry_backoff_ms
        else:
            raise TypeError(f"no response handler for {type(response).__name__} to {type(request).__name__}")

    def _on_vote_response(self, source: int, request: VoteRequest, response: VoteResponse, now_ms: int) -> None:
        if self._observe(response.leader_epoch, response.leader_id, now_ms, from_leader=False):
            return
        asked_epoch = self._epoch + 1 if request.pre_vote else self._epoch
        expected_state = PROSPECTIVE if request.pre_vote else CANDIDATE
        if self._state != expected_state or request.candidate_epoch != asked_epoch:
            return
        if response.vote_granted:
            self._election.granted.add(source)
        else:
            self._election.rejected.add(source)
        if self._has_majority(self._election.granted):
            if request.pre_vote:
                self._become_candidate(now_ms)
            else:
                self._become_leader(now_ms)
        elif len(self._election.rejected) > len(self.voters) - self._majority():
            # Lost: no majority is left to win. Try again after a random backoff rather than a whole timeout.
            self._election_deadline_ms = min(self._election_deadline_ms, now_ms + self._backoff_ms())

    def _on_fetch_response(
        self, source: int, request: RaftFetchRequest, response: RaftFetchResponse, now_ms: int
    ) -> None:
        if self._observe(response.leader_epoch, response.leader_id, now_ms):
            return
        if response.error is not None:
            self._retry_at_ms[source] = now_ms + self._config.retry_backoff_ms
            return
        if response.leader_id != source or self._leader_id != source:
            return
        if self._state == PROSPECTIVE:
            # The leader answers: it is alive and reachable, so follow it again.
            self._become_follower(self._epoch, source, now_ms)
        if self._state != FOLLOWER:
            return
        self._fetch_deadline_ms = now_ms + self._config.fetch_timeout_ms
        self._leader_resigned = False
        if request.fetch_offset != self._log.end_offset:
            return  # the log changed since this fetch was sent; the next one starts from its end
        if response.snapshot_id is not None:
            # The leader's log starts past this one's end: fetch its snapshot first (docs/quorum.md#snapshots).
            self._snapshot_download = self._log.begin_snapshot_download(response.snapshot_id)
            return
        if response.diverging_epoch is not None:
            # The leader's log differs from here on (docs/quorum.md#divergence): drop the tail and fetch again.
            self._log.truncate_to(min(response.diverging_epoch.offset, self._log.end_offset))
            return
        if response.records:
            self._log.append_fetched(response.records, now_ms)
        if response.high_watermark >= 0:
            self._advance_high_watermark(min(response.high_watermark, self._log.end_offset))

    # Snapshots (docs/quorum.md#snapshots)

    def _fetch_snapshot_request(self) -> FetchSnapshotRequest:
        download = self._snapshot_download
        assert download is not None
        return FetchSnapshotRequest(
            replica_id=self.node_id,
            current_leader_epoch=self._epoch,
            snapshot_id=download.snapshot_id,
            position=download.size,
        )

    def _on_fetch_snapshot_response(
        self, source: int, request: FetchSnapshotRequest, response: FetchSnapshotResponse, now_ms: int
    ) -> None:
        if self._observe(response.leader_epoch, response.leader_id, now_ms):
            return
        download = self._snapshot_download
        if self._state != FOLLOWER or self._leader_id != source or download is None:
            return
        if download.snapshot_id != request.snapshot_id or download.size != request.position:
            return  # an answer for a download given up since
        if response.error in (SNAPSHOT_NOT_FOUND, POSITION_OUT_OF_RANGE) or (
            response.error is None
            and (response.snapshot_id != request.snapshot_id or response.position != download.size)
        ):
            # The leader moved on to a newer snapshot: fetch again, which names it.
            self._abort_snapshot_download()
            return
        if response.error is not None:
            self._retry_at_ms[source] = now_ms + self._config.retry_backoff_ms
            return
        self._fetch_deadline_ms = now_ms + self._config.fetch_timeout_ms
        download.append(response.data)
        if download.size < response.size:
            return
        download.freeze()
        self._snapshot_download = None
        self._log.install_snapshot(download.snapshot_id, now_ms)
        # The leader snapshots committed state only.
        self._advance_high_watermark(download.snapshot_id.offset)

    def _abort_snapshot_download(self) -> None:
        if self._snapshot_download is not None:
            self._snapshot_download.abort()
            self._snapshot_download = None

    def create_snapshot(
        self, snapshot_id: OffsetAndEpoch, values: Iterable[bytes], last_contained_log_timestamp: int, now_ms: int
    ) -> bool:
        """Snapshot the committed state the records below `snapshot_id.offset` build (their values, e.g. a
        metadata image's records) and start the log there; any voter may, for its own log. False if the high
        watermark is not known yet, a snapshot is being fetched or the log starts there already (`values`, which
        may be a generator, is then not iterated)."""
        if self._high_watermark is None or self._snapshot_download is not None:
            return False
        return self._log.create_snapshot(
            snapshot_id, values, last_contained_log_timestamp, self._high_watermark, now_ms
        )

    # Requests from other replicas

    def handle(self, request: RaftRequest, now_ms: int, respond: Callable[[RaftResponse], None]) -> None:
        """Any request of another replica, answered through `respond` (a Fetch may be answered later, in a poll or
        when an append or a commit brings it something); the shells carry every request through here."""
        if isinstance(request, RaftFetchRequest):
            self.handle_fetch(request, now_ms, respond)
        elif isinstance(request, VoteRequest):
            respond(self.handle_vote(request, now_ms))
        elif isinstance(request, BeginQuorumEpochRequest):
            respond(self.handle_begin_quorum_epoch(request, now_ms))
        elif isinstance(request, EndQuorumEpochRequest):
            respond(self.handle_end_quorum_epoch(request, now_ms))
        else:
            respond(self.handle_fetch_snapshot(request, now_ms))

    def _has_majority(self, voters: set[int]) -> bool:
        return len(voters & self.voters) >= self._majority()

    def _majority(self) -> int:
        return len(self.voters) // 2 + 1

    def _log_is_up_to_date(self, last_offset_epoch: int, last_offset: int) -> bool:
        """Raft's election restriction: a vote only for a log at least as complete as this one, so a committed
        record (on a majority) is on every possible winner (docs/quorum.md#elections)."""
        return (last_offset_epoch, last_offset) >= (self._log.last_epoch, self._log.end_offset)

    def _hears_from_leader(self, now_ms: int) -> bool:
        if self._state == LEADER:
            return True
        return self._state == FOLLOWER and not self._leader_resigned and now_ms < self._fetch_deadline_ms

    def handle_vote(self, request: VoteRequest, now_ms: int) -> VoteResponse:
        if request.candidate_id not in self.voters:
            return self._vote_response(False, INCONSISTENT_VOTER_SET)
        if request.candidate_epoch < self._epoch:
            return self._vote_response(False, FENCED_LEADER_EPOCH)
        log_ok = self._log_is_up_to_date(request.last_offset_epoch, request.last_offset)
        if request.pre_vote:
            # Nothing changes here for a pre-vote; it is refused while a leader is heard from, so a voter cut
            # off from a healthy leader cannot disrupt it (docs/quorum.md#pre-vote).
            return self._vote_response(log_ok and not self._hears_from_leader(now_ms))
        if request.candidate_epoch > self._epoch:
            self._become_unattached(request.candidate_epoch, now_ms)
        # One vote per epoch, and none while a leader of the epoch is known (docs/quorum.md#elections).
        granted = (
            self._state in (UNATTACHED, PROSPECTIVE)
            and self._leader_id is None
            and self._voted_id in (None, request.candidate_id)
            and log_ok
        )
        if granted and (self._voted_id is None or self._state != UNATTACHED):
            self._leave_state()
            self._state = UNATTACHED
            self._voted_id = request.candidate_id
            self._persist()
            self._arm_election_timer(now_ms)
        return self._vote_response(granted)

    def _vote_response(self, granted: bool, error: str | None = None) -> VoteResponse:
        return VoteResponse(error, self._leader_id_or_none(), self._epoch, granted)

    def _leader_id_or_none(self) -> int:
        return NO_LEADER if self._leader_id is None else self._leader_id

    def handle_begin_quorum_epoch(self, request: BeginQuorumEpochRequest, now_ms: int) -> BeginQuorumEpochResponse:
        if request.leader_id not in self.voters:
            return BeginQuorumEpochResponse(INCONSISTENT_VOTER_SET, self._leader_id_or_none(), self._epoch)
        if request.leader_epoch < self._epoch:
            return BeginQuorumEpochResponse(FENCED_LEADER_EPOCH, self._leader_id_or_none(), self._epoch)
        self._observe(request.leader_epoch, request.leader_id, now_ms)
        if self._state == FOLLOWER and self._leader_id == request.leader_id:
            self._fetch_deadline_ms = max(self._fetch_deadline_ms, now_ms + self._config.fetch_timeout_ms)
        return BeginQuorumEpochResponse(None, self._leader_id_or_none(), self._epoch)

    def handle_end_quorum_epoch(self, request: EndQuorumEpochRequest, now_ms: int) -> EndQuorumEpochResponse:
        if request.leader_epoch < self._epoch:
            return EndQuorumEpochResponse(FENCED_LEADER_EPOCH, self._leader_id_or_none(), self._epoch)
        self._observe(request.leader_epoch, request.leader_id, now_ms)
        if self._state == FOLLOWER and self._leader_id == request.leader_id:
            # Elect a successor now rather than after a fetch timeout; the most caught-up voters go first
            # (Kafka's binary exponential backoff by place in the preferred successors).
            self._leader_resigned = True
            successors = list(request.preferred_successors)
            place = successors.index(self.node_id) if self.node_id in successors else len(successors)
            delay = (
                0
                if place == 0
                else min(
                    self._config.retry_backoff_ms * 2**place + self._rng.randrange(self._config.retry_backoff_ms + 1),
                    self._config.election_backoff_max_ms,
                )
            )
            self._fetch_deadline_ms = min(self._fetch_deadline_ms, now_ms + delay)
        return EndQuorumEpochResponse(None, self._leader_id_or_none(), self._epoch)

    def handle_fetch(
        self, request: RaftFetchRequest, now_ms: int, respond: Callable[[RaftFetchResponse], None]
    ) -> None:
        """Answer through `respond`: at once, or (nothing new at the fetch offset, and a wait asked for) when
        an append or a high-watermark move brings something or the wait ends (in a later `poll`). A voter's
        fetch offset counts towards the high watermark; an observer (a broker) gets committed records only."""
        error = self._leader_only_error(request.current_leader_epoch)
        if error is not None:
            respond(self._fetch_error(error))
            return
        # Where the fetcher must go first (the leader's snapshot, or back to where its log diverges), or None when
        # its log matches this one up to the fetch offset. A parked fetch never needs one later: only a leader
        # parks, its log only grows, and it snapshots only below the high watermark, where no parked fetch is.
        reset = self._fetch_reset(request)
        if request.replica_id in self.voters:
            self._record_voter_fetch(request, now_ms, matches=reset is None)
        else:
            replica = self._observers.setdefault(request.replica_id, _Replica())
            replica.end_offset, replica.last_fetch_ms = request.fetch_offset, now_ms
        response = reset or self._fetch_answer(request, waited_out=request.max_wait_ms <= 0)
        if response is not None:
            respond(response)
            return
        self._parked.append(_ParkedFetch(request, respond, now_ms + request.max_wait_ms))

    def _leader_only_error(self, request_epoch: int) -> str | None:
        if request_epoch >= 0 and request_epoch < self._epoch:
            return FENCED_LEADER_EPOCH
        if request_epoch > self._epoch:
            return UNKNOWN_LEADER_EPOCH
        if self._state != LEADER:
            return NOT_LEADER_OR_FOLLOWER
        return None

    def _fetch_error(self, error: str) -> RaftFetchResponse:
        return RaftFetchResponse(error, self._leader_id_or_none(), self._epoch, log_start_offset=self._log.start_offset)

    def _record_voter_fetch(self, request: RaftFetchRequest, now_ms: int, *, matches: bool) -> None:
        replica = self._replicas[request.replica_id]
        # A fetch offset is durable on the voter (it fsyncs before fetching on), and counts once the voter's log
        # matches this one up to it.
        if matches:
            replica.end_offset = request.fetch_offset
        replica.last_fetch_ms = now_ms
        if request.fetch_offset >= self._log.end_offset:
            replica.last_caught_up_ms = now_ms
        self._to_notify.discard(request.replica_id)
        self._heard_from(request.replica_id, now_ms)
        self._update_leader_high_watermark(now_ms)

    def _heard_from(self, voter: int, now_ms: int) -> None:
        """Check quorum (docs/quorum.md#check-quorum): a majority heard from puts off the leader's resignation."""
        self._heard_since_check.add(voter)
        if self._has_majority(self._heard_since_check | {self.node_id}):
            self._heard_since_check.clear()
            self._check_quorum_deadline_ms = now_ms + self._check_quorum_timeout_ms()

    def _diverging_epoch(self, request: RaftFetchRequest) -> OffsetAndEpoch | None:
        if request.fetch_offset == 0 or request.last_fetched_epoch < 0:
            return None
        end = self._log.end_offset_for_epoch(request.last_fetched_epoch)
        if end.epoch != request.last_fetched_epoch or end.offset < request.fetch_offset:
            return end
        return None

    def _fetch_reset(self, request: RaftFetchRequest) -> RaftFetchResponse | None:
        """The answer sending the fetcher to the leader's snapshot or to where its log diverges, if it must go."""
        snapshot_id = self._log.snapshot_to_fetch(request.fetch_offset, request.last_fetched_epoch)
        if snapshot_id is not None:
            return RaftFetchResponse(
                None,
                self.node_id,
                self._epoch,
                high_watermark=self._wire_high_watermark(),
                log_start_offset=self._log.start_offset,
                snapshot_id=snapshot_id,
            )
        diverging = self._diverging_epoch(request)
        if diverging is not None:
            return RaftFetchResponse(
                None,
                self.node_id,
                self._epoch,
                high_watermark=self._wire_high_watermark(),
                log_start_offset=self._log.start_offset,
                diverging_epoch=diverging,
            )
        return None

    def _replica_of(self, replica_id: int) -> _Replica:
        if replica_id in self._replicas:
            return self._replicas[replica_id]
        return self._observers.setdefault(replica_id, _Replica())

    def _fetch_answer(self, request: RaftFetchRequest, *, waited_out: bool) -> RaftFetchResponse | None:
        """The records from the fetch offset and the high watermark; None while there are no records and no high
        watermark newer than the one this fetcher last got, unless its wait is over (long polling)."""
        observer = request.replica_id not in self.voters
        records = b""
        if request.fetch_offset < self._log.end_offset:
            if observer:
                # Observers (brokers) only ever see committed records (docs/quorum.md#observers).
                if self._high_watermark is not None and request.fetch_offset < self._high_watermark:
                    records = self._log.read(request.fetch_offset, request.max_bytes, self._high_watermark)
            else:
                records = self._log.read(request.fetch_offset, request.max_bytes)
        high_watermark = self._wire_high_watermark()
        replica = self._replica_of(request.replica_id)
        if not records and high_watermark <= replica.sent_high_watermark and not waited_out:
            return None
        replica.sent_high_watermark = high_watermark
        return RaftFetchResponse(
            None,
            self.node_id,
            self._epoch,
            high_watermark=high_watermark,
            log_start_offset=self._log.start_offset,
            records=records,
        )

    def _wire_high_watermark(self) -> int:
        return -1 if self._high_watermark is None else self._high_watermark

    def handle_fetch_snapshot(self, request: FetchSnapshotRequest, now_ms: int) -> FetchSnapshotResponse:
        """A chunk of the leader's snapshot, from the requested position (docs/quorum.md#snapshots)."""
        error = self._leader_only_error(request.current_leader_epoch)
        if error is not None:
            return FetchSnapshotResponse(error, self._leader_id_or_none(), self._epoch)
        snapshots = self._log.snapshots
        if not snapshots.contains(request.snapshot_id):
            return FetchSnapshotResponse(SNAPSHOT_NOT_FOUND, self.node_id, self._epoch)
        size = snapshots.size(request.snapshot_id)
        if not 0 <= request.position < size:
            return FetchSnapshotResponse(POSITION_OUT_OF_RANGE, self.node_id, self._epoch)
        if request.replica_id in self.voters:
            # A voter busy fetching a snapshot is heard from, as Kafka's check quorum counts it.
            self._heard_from(request.replica_id, now_ms)
        data = snapshots.read_chunk(request.snapshot_id, request.position, max(request.max_bytes, 1))
        return FetchSnapshotResponse(None, self.node_id, self._epoch, request.snapshot_id, size, request.position, data)

    def describe_quorum(self, now_ms: int) -> QuorumInfo | None:
        """DescribeQuorum's answer; None when this replica is not the leader (NOT_LEADER_OR_FOLLOWER)."""
        if self._state != LEADER:
            return None
        self._replicas[self.node_id].end_offset = self._log.end_offset
        self._replicas[self.node_id].last_fetch_ms = now_ms
        self._replicas[self.node_id].last_caught_up_ms = now_ms

        def states(replicas: dict[int, _Replica]) -> tuple[ReplicaState, ...]:
            return tuple(
                ReplicaState(replica_id, r.end_offset, r.last_fetch_ms, r.last_caught_up_ms)
                for replica_id, r in sorted(replicas.items())
            )

        return QuorumInfo(
            leader_id=self.node_id,
            leader_epoch=self._epoch,
            high_watermark=self._wire_high_watermark(),
            current_voters=states(self._replicas),
            observers=states(self._observers),
        )

    # The leader's writes and the high watermark

    def append(self, values: Sequence[bytes], now_ms: int) -> int:
        """Append one batch of records (the values of one controller operation) and return the offset of the
        first; they are committed once the high watermark passes them. NotLeaderError on any replica that
        is not the active leader."""
        if not self.is_active_leader():
            raise NotLeaderError(f"node {self.node_id} is not the active leader of epoch {self._epoch}")
        first_offset = self._log.append_values(values, self._epoch, now_ms)
        self._replicas[self.node_id].end_offset = self._log.end_offset
        self._update_leader_high_watermark(now_ms)
        self._complete_parked()
        return first_offset

    def _update_leader_high_watermark(self, now_ms: int) -> None:
        """The largest offset a majority of voters has, once it covers a record of this epoch (Raft commits an
        earlier term's records only through one of its own): docs/quorum.md#high-watermark."""
        if self._state != LEADER:
            return
        self._replicas[self.node_id].end_offset = self._log.end_offset
        offsets = sorted((replica.end_offset for replica in self._replicas.values()), reverse=True)
        majority_end = offsets[self._majority() - 1]
        if majority_end > self._epoch_start_offset:
            self._advance_high_watermark(majority_end)

    def _advance_high_watermark(self, offset: int) -> None:
        if self._high_watermark is not None and offset <= self._high_watermark:
            return
        self._high_watermark = offset
        self._complete_parked()
        self._complete_commit_waiters()

    def resign(self, now_ms: int) -> None:
        """Graceful shutdown of a leader: stop accepting appends and tell the voters (EndQuorumEpoch, sent by
        the next polls) to elect another at once."""
        if self._state == LEADER:
            self._become_resigned(now_ms)

    # Parked fetches and commit waiters

    def _complete_parked(self, *, force: bool = False, now_ms: int | None = None) -> None:
        if not self._parked:
            return
        waiting: list[_ParkedFetch] = []
        done: list[tuple[_ParkedFetch, RaftFetchResponse]] = []
        for fetch in self._parked:
            if force or self._state != LEADER:
                done.append((fetch, self._fetch_error(NOT_LEADER_OR_FOLLOWER)))
                continue
            waited_out = now_ms is not None and now_ms >= fetch.deadline_ms
            response = self._fetch_answer(fetch.request, waited_out=waited_out)
            if response is None:
                waiting.append(fetch)
            else:
                done.append((fetch, response))
        self._parked = waiting
        for fetch, response in done:
            fetch.respond(response)

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from `offset`, none at or past the high watermark. Below the log start the records are
        only in the latest snapshot (`log.latest_snapshot()`): OffsetOutOfRangeError."""
        if self._high_watermark is None or offset >= self._high_watermark:
            return b""
        return self._log.read(offset, max_bytes, self._high_watermark)

    def wait_for_commit(self, offset: int, max_wait_ms: int, now_ms: int, on_ready: Callable[[], None]) -> None:
        """Call `on_ready` once the high watermark is past `offset`, or when `max_wait_ms` has passed (in a
        later `poll`), or at once if there is no wait. Also called early when the epoch or leadership changes."""
        if max_wait_ms <= 0 or (self._high_watermark is not None and self._high_watermark > offset):
            on_ready()
            return
        self._commit_waiters.append(_CommitWaiter(offset, now_ms + max_wait_ms, on_ready))

    def _complete_commit_waiters(self, *, force: bool = False, now_ms: int | None = None) -> None:
        if not self._commit_waiters:
            return
        high_watermark = -1 if self._high_watermark is None else self._high_watermark
        done: list[_CommitWaiter] = []
        waiting: list[_CommitWaiter] = []
        for waiter in self._commit_waiters:
            expired = now_ms is not None and now_ms >= waiter.deadline_ms
            (done if force or expired or high_watermark > waiter.offset else waiting).append(waiter)
        self._commit_waiters = waiting
        for waiter in done:
            waiter.on_ready()
