"""One classic group: Kafka's GroupMetadata (states, members, generation, protocol, committed offsets).

States and their valid previous states (Kafka's GroupState):

    Empty               <- PreparingRebalance
    PreparingRebalance  <- Stable, CompletingRebalance, Empty
    CompletingRebalance <- PreparingRebalance
    Stable              <- CompletingRebalance
    Dead                <- any state
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from tierlog.common import TopicPartition
from tierlog.coordinator.group.member_metadata import (
    JoinGroupMember,
    JoinGroupResult,
    MemberMetadata,
    SyncGroupResult,
)
from tierlog.coordinator.group.records import GroupMetadataValue, MemberMetadataValue, OffsetAndMetadata

CONSUMER_PROTOCOL_TYPE = "consumer"

_Result = TypeVar("_Result", JoinGroupResult, SyncGroupResult)


class PositionedOffset(NamedTuple):
    """An offset and where its commit record sits in `__consumer_offsets` (Kafka's CommitRecordMetadataAndOffset):
    the position orders a transaction's offsets against plain commits of the same partition
    (docs/transactions.md#offsets-order). Positions count appends, and at load the replayed records, which is
    the log's order: the shell appends each write to the leader's log before it returns."""

    position: int
    offset: OffsetAndMetadata


def keep_latest(offsets: dict[TopicPartition, PositionedOffset], tp: TopicPartition, offset: PositionedOffset) -> None:
    """Store `offset` for `tp` unless a later record (a higher position) already is there."""
    current = offsets.get(tp)
    if current is None or current.position < offset.position:
        offsets[tp] = offset


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


class IllegalGroupStateTransition(RuntimeError):
    pass


@dataclass(slots=True)
class DelayedJoin:
    """The pending completion of PreparingRebalance. An initial delayed join (Kafka's InitialDelayedJoin, for
    a group that was Empty) never completes early and extends itself while new members keep arriving."""

    deadline_ms: int
    initial: bool = False
    delay_ms: int = 0
    remaining_ms: int = 0


class GroupMetadata:
    def __init__(self, group_id: str, state: GroupState, now_ms: int) -> None:
        self.group_id = group_id
        self.state = state
        self.current_state_timestamp = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        # Members that got MEMBER_ID_REQUIRED and have not joined yet, with their expiry deadline.
        self.pending_members: dict[str, int] = {}
        self.static_members: dict[str, str] = {}
        self.pending_sync_members: set[str] = set()
        self.new_member_added = False
        self.delayed_join: DelayedJoin | None = None
        # Deadline of the SyncGroup round of the current generation (Kafka's DelayedSync).
        self.sync_deadline_ms: int | None = None
        # Topics the consumer members subscribe to (None: unknown, e.g. a subscription that does not parse).
        self.subscribed_topics: set[str] | None = None
        self.offsets: dict[TopicPartition, PositionedOffset] = {}
        # Commits appended but not yet acknowledged, by partition; the latest position wins.
        self.pending_offset_commits: dict[TopicPartition, PositionedOffset] = {}
        # Offsets committed in transactions not yet ended, by producer id (docs/transactions.md#offsets-pending).
        self.pending_txn_offsets: dict[int, dict[TopicPartition, PositionedOffset]] = {}

    def __repr__(self) -> str:
        return f"GroupMetadata({self.group_id!r}, {self.state.value}, generation {self.generation_id})"

    # State

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS_STATES[state]:
            raise IllegalGroupStateTransition(
                f"group {self.group_id} cannot go from {self.state.value} to {state.value}"
            )
        self.state = state
        self.current_state_timestamp = now_ms

    def can_rebalance(self) -> bool:
        return GroupState.PREPARING_REBALANCE in _next_states(self.state)

    # Members

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_members

    def has_static_member(self, group_instance_id: str | None) -> bool:
        return group_instance_id is not None and group_instance_id in self.static_members

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        """A known instance id presented with another member id: an older (zombie) instance."""
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def member_error(self, member_id: str, group_instance_id: str | None, generation_id: int) -> str | None:
        """What a SyncGroup, Heartbeat or member's OffsetCommit earns unless it comes from a current member at
        the current generation: FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION; None if it does."""
        if self.is_static_member_fenced(group_instance_id, member_id):
            return "FENCED_INSTANCE_ID"
        if not self.has(member_id):
            return "UNKNOWN_MEMBER_ID"
        if generation_id != self.generation_id:
            return "ILLEGAL_GENERATION"
        return None

    def add(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.pending_members.pop(member.member_id, None)
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        instance_id = member.group_instance_id if member is not None else None
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        self.pending_sync_members.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> MemberMetadata:
        """A static member came back with a new member id: the old id is fenced, the member keeps its place
        (and its assignment); a parked request of the old id is answered FENCED_INSTANCE_ID."""
        member = self.members.pop(old_member_id)
        self.maybe_invoke_join_callback(member, JoinGroupResult(old_member_id, "FENCED_INSTANCE_ID"))
        self.maybe_invoke_sync_callback(member, SyncGroupResult("FENCED_INSTANCE_ID"))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return member

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.is_awaiting_join)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join() and not self.pending_members

    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Kafka: a leader that did not rejoin is replaced by any member that did; False when none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                self.leader_id = member_id
                return True
        return False

    def maybe_invoke_join_callback(self, member: MemberMetadata, result: JoinGroupResult) -> bool:
        callback, member.awaiting_join = member.awaiting_join, None
        return _answer(callback, result)

    def maybe_invoke_sync_callback(self, member: MemberMetadata, result: SyncGroupResult) -> bool:
        callback, member.awaiting_sync = member.awaiting_sync, None
        return _answer(callback, result)

    # Protocols

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        candidates = members[0].protocols()
        for member in members[1:]:
            candidates &= member.protocols()
        return candidates

    def supports_protocols(self, protocol_type: str, protocols: set[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and bool(self.candidate_protocols() & protocols)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that all members support; most votes wins
        (ties go to the name first in sorted order, so the choice is deterministic)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"members of group {self.group_id} share no protocol")
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return min(votes, key=lambda name: (-votes[name], name))

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def _compute_subscribed_topics(self) -> set[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if self.protocol_name is None:
            return set() if not self.members else None
        topics: set[str] = set()
        for member in self.members.values():
            subscribed = subscription_topics(member.metadata(self.protocol_name))
            if subscribed is None:
                return None
            topics |= subscribed
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        # Unknown subscriptions count as subscribed: never delete offsets a member may be using.
        return self.subscribed_topics is None or topic in self.subscribed_topics

    def current_member_metadata(self) -> tuple[JoinGroupMember, ...]:
        assert self.protocol_name is not None
        return tuple(
            JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    # Persistence

    def to_value(self, assignment: dict[str, bytes]) -> GroupMetadataValue:
        """The GroupMetadataValue Kafka's storeGroup writes for this generation."""
        protocol = self.protocol_name
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation_id,
            protocol=protocol,
            leader=self.leader_id,
            current_state_timestamp=self.current_state_timestamp,
            members=tuple(
                MemberMetadataValue(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms,
                    subscription=m.metadata(protocol) if protocol is not None else b"",
                    assignment=assignment.get(m.member_id, b""),
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_value(cls, group_id: str, value: GroupMetadataValue, now_ms: int) -> GroupMetadata:
        """Kafka's GroupMetadata.loadGroup: Empty without members, else Stable at the stored generation."""
        group = cls(group_id, GroupState.EMPTY if not value.members else GroupState.STABLE, now_ms)
        if value.current_state_timestamp >= 0:
            group.current_state_timestamp = value.current_state_timestamp
        group.protocol_type = value.protocol_type or None
        group.generation_id = value.generation
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        for m in value.members:
            member = MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout,
                session_timeout_ms=m.session_timeout,
                protocol_type=value.protocol_type,
                supported_protocols=[(value.protocol or "", m.subscription)],
                assignment=m.assignment,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
        if group.leader_id is not None and group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group._compute_subscribed_topics()
        return group

    # Offsets

    def has_offsets(self) -> bool:
        return bool(self.offsets) or bool(self.pending_offset_commits) or bool(self.pending_txn_offsets)

    def offset(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        committed = self.offsets.get(tp)
        return committed.offset if committed is not None else None

    def materialize(self, tp: TopicPartition, committed: PositionedOffset) -> None:
        """Make `committed` the partition's offset unless a later record already is
        (docs/transactions.md#offsets-order)."""
        keep_latest(self.offsets, tp, committed)

    def has_pending_txn_offset(self, tp: TopicPartition) -> bool:
        return any(tp in offsets for offsets in self.pending_txn_offsets.values())

    def has_pending_offset_commit(self, tp: TopicPartition) -> bool:
        """A plain commit not yet acknowledged or a transaction not yet ended holds an offset for `tp`: what
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT (docs/transactions.md#offsets-stable)."""
        return tp in self.pending_offset_commits or self.has_pending_txn_offset(tp)

    def prepare_txn_offset_commit(self, producer_id: int, offsets: dict[TopicPartition, PositionedOffset]) -> None:
        self.pending_txn_offsets.setdefault(producer_id, {}).update(offsets)

    def fail_pending_txn_offset_commit(self, producer_id: int, tp: TopicPartition, position: int) -> None:
        """The append of a transactional commit failed: the client retries, perhaps at another coordinator."""
        pending = self.pending_txn_offsets.get(producer_id)
        if pending is None or tp not in pending or pending[tp].position != position:
            return
        del pending[tp]
        if not pending:
            del self.pending_txn_offsets[producer_id]

    def complete_pending_txn_offset_commit(self, producer_id: int, committed: bool) -> None:
        """The producer's marker is written: its offsets become the group's (committed) or are dropped."""
        pending = self.pending_txn_offsets.pop(producer_id, {})
        if committed:
            for tp, offset in pending.items():
                self.materialize(tp, offset)

    def remove_offsets(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget the partitions' offsets, committed and pending, as their tombstone does at load (Kafka's
        OffsetMetadataManager.replay); the partitions that need a tombstone (docs/transactions.md#offsets-delete)."""
        removed = []
        for tp in partitions:
            self.pending_offset_commits.pop(tp, None)
            had_pending_txn = False
            for producer_id, pending in list(self.pending_txn_offsets.items()):
                if pending.pop(tp, None) is not None:
                    had_pending_txn = True
                    if not pending:
                        del self.pending_txn_offsets[producer_id]
            if self.offsets.pop(tp, None) is not None or had_pending_txn:
                removed.append(tp)
        return removed

    def all_offset_partitions(self) -> set[TopicPartition]:
        """Every partition with a committed offset or one pending in a transaction."""
        partitions = set(self.offsets)
        for pending in self.pending_txn_offsets.values():
            partitions |= pending.keys()
        return partitions

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Kafka's removeExpiredOffsets rules: an Empty group's offsets expire `retention_ms` after it became
        Empty; a Stable consumer group's offsets of topics nobody subscribes to expire `retention_ms` after
        their commit; a standalone (no protocol) group's offsets likewise. An explicit expire timestamp wins.
        An offset with a commit or a transaction pending does not expire (docs/transactions.md#offsets-delete)."""
        # The time retention counts from: when the group became Empty, or else (None) each offset's commit.
        empty_since: int | None = None
        if self.protocol_type is not None and self.is_in(GroupState.EMPTY):
            subscribed: set[str] = set()
            empty_since = self.current_state_timestamp
        elif (
            self.protocol_type == CONSUMER_PROTOCOL_TYPE
            and self.subscribed_topics is not None
            and self.is_in(GroupState.STABLE)
        ):
            subscribed = self.subscribed_topics
        elif self.protocol_type is None:
            subscribed = set()
        else:
            return []
        expired = []
        for tp, (_, offset) in self.offsets.items():
            if tp.topic in subscribed or self.has_pending_offset_commit(tp):
                continue
            if offset.expire_timestamp >= 0:
                if now_ms >= offset.expire_timestamp:
                    expired.append(tp)
            elif now_ms - (offset.commit_timestamp if empty_since is None else empty_since) >= retention_ms:
                expired.append(tp)
        return expired


def _answer(callback: Callable[[_Result], None] | None, result: _Result) -> bool:
    """Answer a parked request, if there is one; True when there was."""
    if callback is None:
        return False
    callback(result)
    return True


def _next_states(state: GroupState) -> set[GroupState]:
    return {target for target, previous in _VALID_PREVIOUS_STATES.items() if state in previous}


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription (any version: all start with version int16 and the
    topics array of int16-length strings); None when the bytes do not parse."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        if not 0 <= count <= len(metadata):
            return None
        pos = 6
        topics = set()
        for _ in range(count):
            (n,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
