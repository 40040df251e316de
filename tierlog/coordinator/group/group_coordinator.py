"""Kafka's classic GroupCoordinator and GroupMetadataManager as one deterministic state machine.

Requests come in as method calls with `now_ms`; parked JoinGroup/SyncGroup requests and offset commits are
answered through callbacks. Writes to `__consumer_offsets` go through the injected `append` (the shell
appends with acks=all and calls back once the HW passes the records, or with the error). Deadlines
(heartbeat expiry, join completion, the initial rebalance delay, the SyncGroup round, pending members) are
kept on the groups; the shell arms one timer at `next_deadline_ms()` and calls `on_timer(now_ms)`.

A broker coordinates the groups of the `__consumer_offsets` partitions it leads: `on_election` marks a
partition loading (requests answer COORDINATOR_LOAD_IN_PROGRESS), `complete_load` replays the partition's
records (latest value per key wins, a null value deletes) and serves its groups, `on_resignation` drops
them (parked requests answer NOT_COORDINATOR).

Offsets committed in a transaction (TxnOffsetCommit) are written as the producer's transactional batch and held
per producer until `complete_transaction` reports its marker (docs/transactions.md#offsets).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tierlog.common import TopicPartition
from tierlog.coordinator.group.group_metadata import (
    DelayedJoin,
    GroupMetadata,
    GroupState,
    PositionedOffset,
    keep_latest,
)
from tierlog.coordinator.group.member_metadata import (
    JoinCallback,
    JoinGroupResult,
    MemberMetadata,
    SyncCallback,
    SyncGroupResult,
)
from tierlog.coordinator.group.records import (
    CorruptRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    partition_for,
)

logger = logging.getLogger(__name__)

UNKNOWN_MEMBER_ID = ""
# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member parked in JoinGroup cannot heartbeat.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000

Record = tuple[bytes, bytes | None]
# on_done(error name or None, the time the append completed).
AppendCallback = Callable[[str | None, int], None]
CommitCallback = Callable[[dict[TopicPartition, str | None]], None]


@dataclass(frozen=True, slots=True)
class TxnProducer:
    """The transactional producer whose batch the coordinator writes (docs/transactions.md#offsets-batch)."""

    producer_id: int
    producer_epoch: int


class Append(Protocol):
    """Appends `records` as one batch to partition `partition` of __consumer_offsets and calls `on_done`; with
    `producer`, a transactional batch of that producer."""

    def __call__(
        self,
        partition: int,
        records: list[Record],
        now_ms: int,
        on_done: AppendCallback,
        producer: TxnProducer | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A record of a transactional batch read back at load: pending until its producer's marker."""

    producer_id: int
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT or ABORT marker read back at load."""

    producer_id: int
    committed: bool


# What a load replays, in log order: plain records, transactional records and markers.
LoadEntry = Record | TxnRecord | TxnMarker


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The broker settings the coordinator obeys, with Kafka's defaults."""

    offsets_topic_num_partitions: int = 50
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2**31 - 1
    offset_metadata_max_bytes: int = 4096
    offsets_retention_ms: int = 10080 * 60 * 1000


class _Api(enum.Enum):
    JOIN_GROUP = enum.auto()
    SYNC_GROUP = enum.auto()
    HEARTBEAT = enum.auto()
    LEAVE_GROUP = enum.auto()
    OFFSET_COMMIT = enum.auto()
    OFFSET_FETCH = enum.auto()
    DESCRIBE_GROUP = enum.auto()
    DELETE_GROUP = enum.auto()
    OFFSET_DELETE = enum.auto()
    TXN_OFFSET_COMMIT = enum.auto()


# Kafka lets these name the empty group id (clients that commit without a group.id did so once).
_EMPTY_GROUP_ID_ALLOWED = frozenset({_Api.OFFSET_COMMIT, _Api.OFFSET_FETCH, _Api.DESCRIBE_GROUP, _Api.DELETE_GROUP})


class JoinArgs(NamedTuple):
    """What a JoinGroup says about the member, carried through the join paths unchanged."""

    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]


class _PartitionState(enum.Enum):
    LOADING = enum.auto()
    ONLINE = enum.auto()


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: str | None
    state: str = ""
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupOverview:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    error: str | None = None


NO_OFFSET = FetchedOffset(-1, -1, "")
UNSTABLE_OFFSET = FetchedOffset(-1, -1, "", "UNSTABLE_OFFSET_COMMIT")


def store_group_error(error: str | None) -> str | None:
    """Kafka's storeGroup mapping of an append error to what JoinGroup/SyncGroup members see."""
    if error in ("UNKNOWN_TOPIC_OR_PARTITION", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"):
        return "COORDINATOR_NOT_AVAILABLE"
    if error == "REQUEST_TIMED_OUT":
        return "COORDINATOR_NOT_AVAILABLE"
    if error in ("NOT_LEADER_OR_FOLLOWER", "KAFKA_STORAGE_ERROR"):
        return "NOT_COORDINATOR"
    if error in ("MESSAGE_TOO_LARGE", "RECORD_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_FETCH_SIZE"):
        return "UNKNOWN_SERVER_ERROR"
    return error


def store_offsets_error(error: str | None) -> str | None:
    """Kafka's storeOffsets mapping: a commit too large to append is INVALID_COMMIT_OFFSET_SIZE."""
    if error in ("MESSAGE_TOO_LARGE", "RECORD_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_FETCH_SIZE"):
        return "INVALID_COMMIT_OFFSET_SIZE"
    return store_group_error(error)


class GroupCoordinator:
    def __init__(self, config: GroupConfig, append: Append, new_uuid: Callable[[], str] | None = None) -> None:
        self.config = config
        self._append = append
        # Member ids are `<client.id>-<uuid>`; tests inject a deterministic source.
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self._partitions: dict[int, tuple[_PartitionState, int]] = {}
        self.groups: dict[str, GroupMetadata] = {}
        # The position of the next write (PositionedOffset).
        self._next_position = 0
        # The groups each producer has offsets pending in (Kafka's openGroupsForProducer).
        self._producer_groups: dict[int, set[str]] = {}
        self.offset_commits = 0

    # Partitions (loading and unloading)

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.offsets_topic_num_partitions)

    def on_election(self, partition: int, leader_epoch: int) -> bool:
        """This broker became leader of `partition`: its groups answer COORDINATOR_LOAD_IN_PROGRESS until
        `complete_load`. False when the partition is already loading or served (nothing to do)."""
        current = self._partitions.get(partition)
        if current is not None:
            return False
        self._partitions[partition] = (_PartitionState.LOADING, leader_epoch)
        return True

    def is_loading(self, partition: int) -> bool:
        state = self._partitions.get(partition)
        return state is not None and state[0] is _PartitionState.LOADING

    def owned_partitions(self) -> set[int]:
        return set(self._partitions)

    def complete_load(self, partition: int, leader_epoch: int, entries: Iterable[LoadEntry], now_ms: int) -> None:
        """Replay the partition's records in offset order and serve its groups. Ignored when the partition
        was resigned (or re-elected at another epoch) while it was read. A transaction's offsets stay pending
        until its marker: applied at COMMIT, dropped at ABORT (docs/transactions.md#offsets-load)."""
        if self._partitions.get(partition) != (_PartitionState.LOADING, leader_epoch):
            return
        offsets: dict[str, dict[TopicPartition, PositionedOffset]] = {}
        pending: dict[int, dict[str, dict[TopicPartition, PositionedOffset]]] = {}
        values: dict[str, GroupMetadataValue] = {}
        for entry in entries:
            position = self._take_position()
            if isinstance(entry, TxnMarker):
                ended = pending.pop(entry.producer_id, {})
                if entry.committed:
                    for group_id, group_pending in ended.items():
                        group_offsets = offsets.setdefault(group_id, {})
                        for tp, offset in group_pending.items():
                            keep_latest(group_offsets, tp, offset)
                continue
            if isinstance(entry, TxnRecord):
                producer_id: int | None = entry.producer_id
                key_bytes, value_bytes = entry.key, entry.value
            else:
                producer_id = None
                key_bytes, value_bytes = entry
            try:
                key = decode_key(key_bytes)
                if isinstance(key, OffsetCommitKey):
                    tp = TopicPartition(key.topic, key.partition)
                    if value_bytes is None:
                        # A tombstone deletes the committed offset and any pending one.
                        offsets.get(key.group, {}).pop(tp, None)
                        for producer_pending in pending.values():
                            producer_pending.get(key.group, {}).pop(tp, None)
                        continue
                    offset = PositionedOffset(position, decode_offset_commit_value(value_bytes))
                    if producer_id is None:
                        offsets.setdefault(key.group, {})[tp] = offset
                    else:
                        pending.setdefault(producer_id, {}).setdefault(key.group, {})[tp] = offset
                elif isinstance(key, GroupMetadataKey):
                    if value_bytes is None:
                        values.pop(key.group, None)
                    else:
                        values[key.group] = decode_group_metadata_value(value_bytes)
            except CorruptRecordError as e:
                # Kafka fails the load on a record it cannot read; skipping one keeps every other group served.
                logger.error("skipping an unreadable __consumer_offsets-%d record: %s", partition, e)
        self._partitions[partition] = (_PartitionState.ONLINE, leader_epoch)
        pending_by_group: dict[str, dict[int, dict[TopicPartition, PositionedOffset]]] = {}
        for producer_id, producer_pending in pending.items():
            for group_id, group_pending in producer_pending.items():
                if group_pending:
                    pending_by_group.setdefault(group_id, {})[producer_id] = group_pending
        with_offsets = {g for g, o in offsets.items() if o}
        for group_id in sorted(set(values) | with_offsets | set(pending_by_group)):
            if self.partition_for(group_id) != partition:
                continue
            value = values.get(group_id)
            if value is not None:
                group = GroupMetadata.from_value(group_id, value, now_ms)
            else:
                group = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
            group.offsets = dict(offsets.get(group_id, {}))
            group.pending_txn_offsets = pending_by_group.get(group_id, {})
            for producer_id in group.pending_txn_offsets:
                self._producer_groups.setdefault(producer_id, set()).add(group_id)
            for member in group.members.values():
                self._schedule_heartbeat(member, now_ms)
            self.groups[group_id] = group
        loaded = sum(1 for g in self.groups.values() if self.partition_for(g.group_id) == partition)
        logger.info("loaded %d groups of __consumer_offsets-%d", loaded, partition)

    def _take_position(self) -> int:
        self._next_position += 1
        return self._next_position

    def on_resignation(self, partition: int, now_ms: int) -> None:
        """Another broker leads `partition` now: drop its groups; parked members answer NOT_COORDINATOR."""
        if self._partitions.pop(partition, None) is None:
            return
        for group_id, group in list(self.groups.items()):
            if self.partition_for(group_id) != partition:
                continue
            del self.groups[group_id]
            for producer_id in group.pending_txn_offsets:
                self._forget_producer_group(producer_id, group_id)
            previous = group.state
            group.transition_to(GroupState.DEAD, now_ms)
            group.delayed_join = None
            group.sync_deadline_ms = None
            for member in group.members.values():
                member.heartbeat_deadline_ms = None
                if previous is GroupState.PREPARING_REBALANCE:
                    group.maybe_invoke_join_callback(member, JoinGroupResult(member.member_id, "NOT_COORDINATOR"))
                group.maybe_invoke_sync_callback(member, SyncGroupResult("NOT_COORDINATOR"))

    def _validate(self, group_id: str | None, api: _Api) -> str | None:
        if group_id is None or (not group_id and api not in _EMPTY_GROUP_ID_ALLOWED):
            return "INVALID_GROUP_ID"
        state = self._partitions.get(self.partition_for(group_id))
        if state is None:
            return "NOT_COORDINATOR"
        if state[0] is _PartitionState.LOADING:
            return "COORDINATOR_LOAD_IN_PROGRESS"
        return None

    # JoinGroup

    def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        require_known_member_id: bool,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        error = self._validate(group_id, _Api.JOIN_GROUP)
        if error is None and not (
            self.config.group_min_session_timeout_ms <= session_timeout_ms <= self.config.group_max_session_timeout_ms
        ):
            error = "INVALID_SESSION_TIMEOUT"
        if error is not None:
            respond(JoinGroupResult(member_id, error))
            return
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self.groups.get(group_id)
        if group is None:
            if not is_unknown:
                respond(JoinGroupResult(member_id, "UNKNOWN_MEMBER_ID"))
                return
            group = self.groups[group_id] = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
        if not self._accept_joining_member(group, member_id):
            respond(JoinGroupResult(member_id, "GROUP_MAX_SIZE_REACHED"))
            return
        if group.is_in(GroupState.DEAD):
            # The group was unloaded or deleted under us: the client looks up the coordinator again.
            respond(JoinGroupResult(member_id, "COORDINATOR_NOT_AVAILABLE"))
            return
        if not group.supports_protocols(protocol_type, {name for name, _ in protocols}):
            respond(JoinGroupResult(member_id, "INCONSISTENT_GROUP_PROTOCOL"))
            return
        args = JoinArgs(client_id, client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols)
        if is_unknown:
            self._new_member_join(group, group_instance_id, require_known_member_id, args, now_ms, respond)
        else:
            self._current_member_join(group, member_id, group_instance_id, args, now_ms, respond)

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        max_size = self.config.group_max_size
        if group.is_in(GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return (
                group.has(member_id) and group.get(member_id).is_awaiting_join
            ) or group.num_awaiting_join() < max_size
        return group.has(member_id) or len(group.members) < max_size

    def _new_member_join(
        self,
        group: GroupMetadata,
        group_instance_id: str | None,
        require_known_member_id: bool,
        args: JoinArgs,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        client_id = args.client_id
        new_member_id = f"{client_id}-{self._new_uuid()}"
        if group_instance_id is not None:
            old_member_id = group.static_members.get(group_instance_id)
            if old_member_id is not None:
                self._update_static_member_and_rebalance(
                    group, old_member_id, new_member_id, group_instance_id, args, now_ms, respond
                )
            else:
                self._add_member_and_rebalance(group, new_member_id, group_instance_id, args, now_ms, respond)
        elif require_known_member_id:
            # KIP-394: hand out the id first, so a client that times out and retries does not leave a
            # defunct member behind; the id expires unless it joins within the session timeout.
            group.pending_members[new_member_id] = now_ms + args.session_timeout_ms
            respond(JoinGroupResult(new_member_id, "MEMBER_ID_REQUIRED"))
        else:
            self._add_member_and_rebalance(group, new_member_id, None, args, now_ms, respond)

    def _current_member_join(
        self,
        group: GroupMetadata,
        member_id: str,
        group_instance_id: str | None,
        args: JoinArgs,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        protocols = args.protocols
        if group.is_pending_member(member_id):
            self._add_member_and_rebalance(group, member_id, group_instance_id, args, now_ms, respond)
            return
        if group.is_static_member_fenced(group_instance_id, member_id):
            respond(JoinGroupResult(member_id, "FENCED_INSTANCE_ID"))
            return
        if not group.has(member_id) or (
            group_instance_id is not None and not group.has_static_member(group_instance_id)
        ):
            respond(JoinGroupResult(member_id, "UNKNOWN_MEMBER_ID"))
            return
        member = group.get(member_id)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._update_member_and_rebalance(group, member, args, now_ms, respond)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.matches(protocols):
                # The member lost our JoinGroup answer: give it the current generation again.
                respond(self._join_result(group, member, skip_assignment=False))
            else:
                self._update_member_and_rebalance(group, member, args, now_ms, respond)
        elif group.is_in(GroupState.STABLE):
            if group.is_leader(member_id) or not member.matches(protocols):
                # A leader's rejoin forces a rebalance: that is how it reacts to changes (e.g. new partitions)
                # that do not change any member's metadata.
                self._update_member_and_rebalance(group, member, args, now_ms, respond)
            else:
                respond(self._join_result(group, member, skip_assignment=False, leader_members=False))
        else:
            respond(JoinGroupResult(member_id, "UNKNOWN_MEMBER_ID"))

    def _join_result(
        self, group: GroupMetadata, member: MemberMetadata, skip_assignment: bool, leader_members: bool = True
    ) -> JoinGroupResult:
        is_leader = group.is_leader(member.member_id)
        return JoinGroupResult(
            member_id=member.member_id,
            error=None,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            skip_assignment=skip_assignment,
            members=group.current_member_metadata() if is_leader and leader_members else (),
        )

    def _add_member_and_rebalance(
        self,
        group: GroupMetadata,
        member_id: str,
        group_instance_id: str | None,
        args: JoinArgs,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        client_id, client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols = args
        member = MemberMetadata(
            member_id=member_id,
            group_instance_id=group_instance_id,
            client_id=client_id,
            client_host=client_host,
            rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms,
            protocol_type=protocol_type,
            supported_protocols=list(protocols),
            is_new=True,
        )
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        member.awaiting_join = respond
        group.add(member)
        # A parked new member cannot heartbeat; it is dropped if the join does not complete in time.
        self._schedule_heartbeat(member, now_ms, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, now_ms, f"adding new member {member_id}")
        self._try_complete_join(group, now_ms)

    def _update_member_and_rebalance(
        self,
        group: GroupMetadata,
        member: MemberMetadata,
        args: JoinArgs,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        self._update_member(group, member, args, respond)
        self._maybe_prepare_rebalance(group, now_ms, f"member {member.member_id} rejoined")
        self._try_complete_join(group, now_ms)

    def _update_member(
        self,
        group: GroupMetadata,
        member: MemberMetadata,
        args: JoinArgs,
        respond: JoinCallback | None,
    ) -> None:
        member.rebalance_timeout_ms = args.rebalance_timeout_ms
        member.session_timeout_ms = args.session_timeout_ms
        member.supported_protocols = list(args.protocols)
        # Kafka overwrites a parked callback; answering it lets a client that retried on another connection
        # never leave a request hanging.
        group.maybe_invoke_join_callback(member, JoinGroupResult(member.member_id, "REBALANCE_IN_PROGRESS"))
        member.awaiting_join = respond

    def _update_static_member_and_rebalance(
        self,
        group: GroupMetadata,
        old_member_id: str,
        new_member_id: str,
        group_instance_id: str,
        args: JoinArgs,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        current_leader = group.leader_id
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat(member, now_ms)
        old = (member.rebalance_timeout_ms, member.session_timeout_ms, list(member.supported_protocols))
        self._update_member(group, member, args, respond)
        if group.is_in(GroupState.STABLE):
            if group.protocol_name == group.select_protocol():
                # The replacement changes nothing the members agreed on: persist the new member id and answer
                # without a rebalance. The old leader id is returned so the new member does not assign.
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                generation = group.generation_id

                def stored(error: str | None, done_ms: int) -> None:
                    if self.groups.get(group.group_id) is not group:
                        return
                    error = store_group_error(error)
                    if error is not None and group.has(new_member_id):
                        member.rebalance_timeout_ms, member.session_timeout_ms, member.supported_protocols = old
                        member.awaiting_join = None
                        group.replace_static_member(group_instance_id, new_member_id, old_member_id)
                        self._schedule_heartbeat(member, done_ms)
                        respond(
                            JoinGroupResult(
                                UNKNOWN_MEMBER_ID,
                                error,
                                generation_id=group.generation_id,
                                protocol_type=group.protocol_type,
                                protocol_name=group.protocol_name,
                                leader_id=current_leader or "",
                            )
                        )
                        return
                    if not (group.is_in(GroupState.STABLE) and group.generation_id == generation):
                        # A rebalance began meanwhile: the member is answered when it completes.
                        return
                    group.maybe_invoke_join_callback(
                        member,
                        JoinGroupResult(
                            member_id=new_member_id,
                            error=error,
                            generation_id=generation,
                            protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader_id=current_leader or "",
                        ),
                    )
                    self._schedule_heartbeat(member, done_ms)

                self._store_group(group, assignment, now_ms, stored)
            else:
                self._maybe_prepare_rebalance(group, now_ms, f"static member {group_instance_id} changed protocols")
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, now_ms, f"static member {group_instance_id} rejoined")
        self._try_complete_join(group, now_ms)

    # Rebalance

    def _maybe_prepare_rebalance(self, group: GroupMetadata, now_ms: int, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, now_ms, reason)

    def _prepare_rebalance(self, group: GroupMetadata, now_ms: int, reason: str) -> None:
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, "REBALANCE_IN_PROGRESS")
        group.sync_deadline_ms = None
        rebalance_timeout = group.rebalance_timeout_ms()
        if group.is_in(GroupState.EMPTY):
            delay = self.config.group_initial_rebalance_delay_ms
            group.delayed_join = DelayedJoin(
                now_ms + delay, initial=True, delay_ms=delay, remaining_ms=max(rebalance_timeout - delay, 0)
            )
        else:
            group.delayed_join = DelayedJoin(now_ms + rebalance_timeout)
        group.transition_to(GroupState.PREPARING_REBALANCE, now_ms)
        logger.info(
            "preparing to rebalance group %s in state PreparingRebalance with old generation %d: %s",
            group.group_id,
            group.generation_id,
            reason,
        )

    def _try_complete_join(self, group: GroupMetadata, now_ms: int) -> None:
        join = group.delayed_join
        if (
            group.is_in(GroupState.PREPARING_REBALANCE)
            and join is not None
            and not join.initial
            and group.has_all_members_joined()
        ):
            self._complete_join(group, now_ms)

    def _expire_join(self, group: GroupMetadata, now_ms: int) -> None:
        join = group.delayed_join
        assert join is not None
        if join.initial and group.new_member_added and join.remaining_ms != 0:
            # Members are still arriving at an Empty group's first rebalance: wait another delay, within the
            # rebalance timeout.
            group.new_member_added = False
            delay = min(join.delay_ms, join.remaining_ms)
            group.delayed_join = DelayedJoin(
                now_ms + delay, initial=True, delay_ms=join.delay_ms, remaining_ms=max(join.remaining_ms - delay, 0)
            )
            return
        self._complete_join(group, now_ms)

    def _complete_join(self, group: GroupMetadata, now_ms: int) -> None:
        group.delayed_join = None
        for member in group.not_yet_rejoined_members():
            if not member.is_static:
                group.remove(member.member_id)
        if group.is_in(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait another rebalance timeout for session expiry to remove the silent members.
            logger.error("group %s could not complete rebalance because no members rejoined", group.group_id)
            group.delayed_join = DelayedJoin(now_ms + group.rebalance_timeout_ms())
            return
        group.init_next_generation(now_ms)
        if group.is_in(GroupState.EMPTY):
            logger.info("group %s with generation %d is now empty", group.group_id, group.generation_id)
            self._store_group(group, {}, now_ms, lambda error, done_ms: None)
            return
        logger.info(
            "stabilized group %s generation %d with %d members",
            group.group_id,
            group.generation_id,
            len(group.members),
        )
        for member in group.members.values():
            group.maybe_invoke_join_callback(member, self._join_result(group, member, skip_assignment=False))
            self._schedule_heartbeat(member, now_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: str) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error, None)

    def _propagate_assignment(self, group: GroupMetadata, error: str | None, now_ms: int | None) -> None:
        for member in group.members.values():
            result = SyncGroupResult(
                error,
                group.protocol_type if error is None else None,
                group.protocol_name if error is None else None,
                member.assignment if error is None else b"",
            )
            if group.maybe_invoke_sync_callback(member, result) and now_ms is not None:
                self._schedule_heartbeat(member, now_ms)

    # SyncGroup

    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        now_ms: int,
        respond: SyncCallback,
    ) -> None:
        error = self._validate(group_id, _Api.SYNC_GROUP)
        if error == "COORDINATOR_LOAD_IN_PROGRESS":
            # Kafka: the member rejoins once the group is loaded, rather than waiting on a loading coordinator.
            error = "REBALANCE_IN_PROGRESS"
        if error is not None:
            respond(SyncGroupResult(error))
            return
        group = self.groups.get(group_id)
        if group is None:
            respond(SyncGroupResult("UNKNOWN_MEMBER_ID"))
            return
        if group.is_in(GroupState.DEAD):
            respond(SyncGroupResult("COORDINATOR_NOT_AVAILABLE"))
        elif (member_error := group.member_error(member_id, group_instance_id, generation_id)) is not None:
            respond(SyncGroupResult(member_error))
        elif (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            respond(SyncGroupResult("INCONSISTENT_GROUP_PROTOCOL"))
        elif group.is_in(GroupState.EMPTY):
            respond(SyncGroupResult("UNKNOWN_MEMBER_ID"))
        elif group.is_in(GroupState.PREPARING_REBALANCE):
            respond(SyncGroupResult("REBALANCE_IN_PROGRESS"))
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            member = group.get(member_id)
            group.maybe_invoke_sync_callback(member, SyncGroupResult("REBALANCE_IN_PROGRESS"))
            member.awaiting_sync = respond
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                self._store_leader_assignment(group, generation_id, assignments, now_ms)
        else:
            self._remove_pending_sync_member(group, member_id)
            member = group.get(member_id)
            respond(SyncGroupResult(None, group.protocol_type, group.protocol_name, member.assignment))
            self._schedule_heartbeat(member, now_ms)

    def _store_leader_assignment(
        self, group: GroupMetadata, generation_id: int, assignments: dict[str, bytes], now_ms: int
    ) -> None:
        # Members the leader left out get an empty assignment; ids it invented are ignored.
        assignment = {member_id: assignments.get(member_id, b"") for member_id in group.members}

        def stored(error: str | None, done_ms: int) -> None:
            # Another member may have joined meanwhile: only this generation's CompletingRebalance completes.
            if self.groups.get(group.group_id) is not group:
                return
            if not (group.is_in(GroupState.COMPLETING_REBALANCE) and group.generation_id == generation_id):
                return
            error = store_group_error(error)
            if error is not None:
                self._reset_and_propagate_assignment_error(group, error)
                self._maybe_prepare_rebalance(group, done_ms, "error storing the group assignment")
                return
            for member_id, member in group.members.items():
                member.assignment = assignment.get(member_id, b"")
            self._propagate_assignment(group, None, done_ms)
            group.transition_to(GroupState.STABLE, done_ms)

        self._store_group(group, assignment, now_ms, stored)

    def _remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and not group.pending_sync_members:
            group.sync_deadline_ms = None

    def _expire_sync(self, group: GroupMetadata, now_ms: int) -> None:
        group.sync_deadline_ms = None
        if not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE) or not group.pending_sync_members:
            return
        missing = sorted(group.pending_sync_members)
        for member_id in missing:
            group.remove(member_id)
        self._prepare_rebalance(group, now_ms, f"removing {missing} on pending sync request expiration")
        self._try_complete_join(group, now_ms)

    # Heartbeat and LeaveGroup

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int
    ) -> str | None:
        error = self._validate(group_id, _Api.HEARTBEAT)
        if error == "COORDINATOR_LOAD_IN_PROGRESS":
            return None  # Kafka answers a loading coordinator's heartbeats blindly.
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return "UNKNOWN_MEMBER_ID"
        if group.is_in(GroupState.DEAD):
            return "COORDINATOR_NOT_AVAILABLE"
        member_error = group.member_error(member_id, group_instance_id, generation_id)
        if member_error is not None:
            return member_error
        if group.is_in(GroupState.EMPTY):
            return "UNKNOWN_MEMBER_ID"
        self._schedule_heartbeat(group.get(member_id), now_ms)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return "REBALANCE_IN_PROGRESS"
        return None

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> tuple[str | None, list[str | None]]:
        """(top-level error, one error per leaving (member id, group instance id))."""
        error = self._validate(group_id, _Api.LEAVE_GROUP)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        if group is None:
            return None, ["UNKNOWN_MEMBER_ID"] * len(members)
        if group.is_in(GroupState.DEAD):
            return "COORDINATOR_NOT_AVAILABLE", []
        errors: list[str | None] = []
        for member_id, group_instance_id in members:
            if member_id == UNKNOWN_MEMBER_ID:
                # Admin removal of a static member by its instance id.
                current = group.static_members.get(group_instance_id) if group_instance_id is not None else None
                if current is None:
                    errors.append("UNKNOWN_MEMBER_ID")
                else:
                    self._remove_member_and_update_group(group, group.get(current), now_ms, "left the group")
                    errors.append(None)
            elif group.is_pending_member(member_id):
                self._remove_pending_member(group, member_id, now_ms)
                errors.append(None)
            elif group.is_static_member_fenced(group_instance_id, member_id):
                errors.append("FENCED_INSTANCE_ID")
            elif group.has(member_id):
                self._remove_member_and_update_group(group, group.get(member_id), now_ms, "left the group")
                errors.append(None)
            else:
                errors.append("UNKNOWN_MEMBER_ID")
        return None, errors

    def _remove_pending_member(self, group: GroupMetadata, member_id: str, now_ms: int) -> None:
        group.pending_members.pop(member_id, None)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group, now_ms)

    def _remove_member_and_update_group(
        self, group: GroupMetadata, member: MemberMetadata, now_ms: int, reason: str
    ) -> None:
        # A new member parked in JoinGroup may time out: answer it, so a client still alive joins again.
        group.maybe_invoke_join_callback(member, JoinGroupResult(UNKNOWN_MEMBER_ID, "UNKNOWN_MEMBER_ID"))
        group.remove(member.member_id)
        member.heartbeat_deadline_ms = None
        logger.info("member %s of group %s %s", member.member_id, group.group_id, reason)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, now_ms, f"member {member.member_id} {reason}")
        self._try_complete_join(group, now_ms)

    def _schedule_heartbeat(self, member: MemberMetadata, now_ms: int, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline_ms = now_ms + (member.session_timeout_ms if timeout_ms is None else timeout_ms)

    def _expire_heartbeat(self, group: GroupMetadata, member: MemberMetadata, now_ms: int) -> None:
        member.heartbeat_deadline_ms = None
        if not member.is_new and (member.is_awaiting_join or member.is_awaiting_sync):
            # A member parked in a rebalance needs no heartbeat; completing the rebalance re-arms it.
            return
        self._remove_member_and_update_group(group, member, now_ms, "failed: no heartbeat within its session timeout")

    # Timers

    def next_deadline_ms(self) -> int | None:
        deadlines = []
        for group in self.groups.values():
            if group.delayed_join is not None:
                deadlines.append(group.delayed_join.deadline_ms)
            if group.sync_deadline_ms is not None:
                deadlines.append(group.sync_deadline_ms)
            deadlines.extend(group.pending_members.values())
            deadlines.extend(
                m.heartbeat_deadline_ms for m in group.members.values() if m.heartbeat_deadline_ms is not None
            )
        return min(deadlines, default=None)

    def on_timer(self, now_ms: int) -> None:
        """Everything whose deadline is at or before `now_ms`, group by group."""
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending_members.items()):
                if deadline <= now_ms:
                    self._remove_pending_member(group, member_id, now_ms)
            for member in list(group.members.values()):
                deadline = member.heartbeat_deadline_ms
                if deadline is not None and deadline <= now_ms and group.has(member.member_id):
                    self._expire_heartbeat(group, member, now_ms)
            if group.delayed_join is not None and group.delayed_join.deadline_ms <= now_ms:
                self._expire_join(group, now_ms)
            if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
                self._expire_sync(group, now_ms)

    # Offsets

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        now_ms: int,
        respond: CommitCallback,
    ) -> None:
        def fail(error: str) -> None:
            respond(dict.fromkeys(offsets, error))

        error = self._validate(group_id, _Api.OFFSET_COMMIT)
        if error is not None:
            fail(error)
            return
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # A commit from an older generation of a group this coordinator no longer has.
                fail("ILLEGAL_GENERATION")
                return
            # A consumer that assigns partitions itself and only stores offsets here.
            group = self.groups[group_id] = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
        error = self._validate_offset_commit(group, generation_id, member_id, group_instance_id)
        if error is not None:
            fail(error)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            # Valid member and generation, but the assignment is not out yet: let the client rejoin gracefully.
            fail("REBALANCE_IN_PROGRESS")
        else:
            if group.is_in(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                self._schedule_heartbeat(group.get(member_id), now_ms)
            self._store_offsets(group, offsets, now_ms, respond)

    @staticmethod
    def _validate_offset_commit(
        group: GroupMetadata, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> str | None:
        if group.is_in(GroupState.DEAD):
            return "COORDINATOR_NOT_AVAILABLE"
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            return group.member_error(member_id, group_instance_id, generation_id)
        if not group.is_in(GroupState.EMPTY):
            # Only members may commit for a group with members.
            return "UNKNOWN_MEMBER_ID"
        return None

    def commit_transactional_offsets(
        self,
        group_id: str,
        producer: TxnProducer,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        now_ms: int,
        respond: CommitCallback,
    ) -> None:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): the offsets are written to the group's partition in
        a transactional batch of `producer` and stay pending until its transaction ends
        (docs/transactions.md#offsets)."""
        error = self._validate(group_id, _Api.TXN_OFFSET_COMMIT)
        if error is not None:
            respond(dict.fromkeys(offsets, error))
            return
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
        error = self._validate_txn_offset_commit(group, generation_id, member_id, group_instance_id)
        if error is not None:
            respond(dict.fromkeys(offsets, error))
            return
        self._store_offsets(group, offsets, now_ms, respond, producer)

    @staticmethod
    def _validate_txn_offset_commit(
        group: GroupMetadata, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> str | None:
        """KIP-447's fencing (docs/transactions.md#offsets-fencing): a request that names a member or a
        generation must come from the current member at the current generation; one that names neither (v0-v2,
        or a producer outside the group) is accepted in any state."""
        if group.is_in(GroupState.DEAD):
            return "COORDINATOR_NOT_AVAILABLE"
        if generation_id < 0 and group.is_in(GroupState.EMPTY):
            return None
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            if group_instance_id is not None:
                current = group.static_members.get(group_instance_id)
                if current is None:
                    return "UNKNOWN_MEMBER_ID"
                if current != member_id:
                    return "FENCED_INSTANCE_ID"
            if not group.has(member_id):
                return "UNKNOWN_MEMBER_ID"
            if generation_id != group.generation_id:
                return "ILLEGAL_GENERATION"
        return None

    def _store_offsets(
        self,
        group: GroupMetadata,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        now_ms: int,
        respond: CommitCallback,
        producer: TxnProducer | None = None,
    ) -> None:
        too_large = {
            tp for tp, o in offsets.items() if len(o.metadata.encode()) > self.config.offset_metadata_max_bytes
        }
        valid = {tp: o for tp, o in offsets.items() if tp not in too_large}
        errors: dict[TopicPartition, str | None] = dict.fromkeys(too_large, "OFFSET_METADATA_TOO_LARGE")
        if not valid:
            respond(errors)
            return
        position = self._take_position()
        staged = {tp: PositionedOffset(position, o) for tp, o in valid.items()}
        if producer is None:
            group.pending_offset_commits.update(staged)
        else:
            group.prepare_txn_offset_commit(producer.producer_id, staged)
            self._producer_groups.setdefault(producer.producer_id, set()).add(group.group_id)
        records: list[Record] = [
            (
                encode_offset_commit_key(OffsetCommitKey(group.group_id, tp.topic, tp.partition)),
                encode_offset_commit_value(o),
            )
            for tp, o in valid.items()
        ]

        def appended(error: str | None, done_ms: int) -> None:
            error = store_offsets_error(error)
            current = self.groups.get(group.group_id) is group and not group.is_in(GroupState.DEAD)
            if producer is not None:
                if error is not None and current:
                    for tp in staged:
                        group.fail_pending_txn_offset_commit(producer.producer_id, tp, position)
                    if producer.producer_id not in group.pending_txn_offsets:
                        self._forget_producer_group(producer.producer_id, group.group_id)
            else:
                for tp, offset in staged.items():
                    pending = group.pending_offset_commits.get(tp)
                    # A commit whose partition was deleted meanwhile stays deleted, as its tombstone follows it.
                    if error is None and current and pending is not None:
                        group.materialize(tp, offset)
                    if pending is not None and pending.position == position:
                        del group.pending_offset_commits[tp]
            # A group unloaded or deleted meanwhile still gets success, as in Kafka: the record is committed
            # to the partition, so whichever coordinator loads it next has the offset.
            if error is None:
                self.offset_commits += len(valid)
            errors.update(dict.fromkeys(valid, error))
            respond(errors)

        self._append(self.partition_for(group.group_id), records, now_ms, appended, producer)

    def complete_transaction(self, offsets_partition: int, producer_id: int, committed: bool) -> None:
        """The producer's COMMIT or ABORT marker is written to `offsets_partition`: its pending offsets in that
        partition's groups become committed, or are dropped (Kafka's handleTxnCompletion)."""
        for group_id in list(self._producer_groups.get(producer_id, ())):
            if self.partition_for(group_id) != offsets_partition:
                continue
            group = self.groups.get(group_id)
            if group is not None and not group.is_in(GroupState.DEAD):
                group.complete_pending_txn_offset_commit(producer_id, committed)
            self._forget_producer_group(producer_id, group_id)

    def _forget_producer_group(self, producer_id: int, group_id: str) -> None:
        groups = self._producer_groups.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self._producer_groups[producer_id]

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None, require_stable: bool = False
    ) -> tuple[str | None, dict[TopicPartition, FetchedOffset]]:
        """(group error, offsets); `partitions` None means every partition the group committed. With
        `require_stable` (KIP-447), a partition with a commit or transaction pending answers
        UNSTABLE_OFFSET_COMMIT (docs/transactions.md#offsets-stable)."""
        error = self._validate(group_id, _Api.OFFSET_FETCH)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return None, dict.fromkeys(partitions or (), NO_OFFSET)
        if partitions is None:
            partitions = sorted(group.offsets, key=lambda tp: (tp.topic, tp.partition))
        fetched = {}
        for tp in partitions:
            o = group.offset(tp)
            if require_stable and group.has_pending_offset_commit(tp):
                fetched[tp] = UNSTABLE_OFFSET
            else:
                fetched[tp] = NO_OFFSET if o is None else FetchedOffset(o.offset, o.leader_epoch, o.metadata)
        return None, fetched

    def delete_offsets(
        self, group_id: str, partitions: list[TopicPartition], now_ms: int
    ) -> tuple[str | None, dict[TopicPartition, str | None]]:
        error = self._validate(group_id, _Api.OFFSET_DELETE)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return "GROUP_ID_NOT_FOUND", {}
        errors: dict[TopicPartition, str | None] = {}
        if group.is_in(GroupState.EMPTY):
            eligible = list(partitions)
        elif group.protocol_type == "consumer":
            eligible = [tp for tp in partitions if not group.is_subscribed_to_topic(tp.topic)]
            errors.update({tp: "GROUP_SUBSCRIBED_TO_TOPIC" for tp in partitions if tp not in eligible})
        else:
            return "NON_EMPTY_GROUP", {}
        self._remove_offsets(group, eligible, now_ms)
        errors.update(dict.fromkeys(eligible, None))
        return None, errors

    def _remove_offsets(self, group: GroupMetadata, partitions: Iterable[TopicPartition], now_ms: int) -> None:
        """Drop offsets now and append their tombstones without waiting (Kafka's cleanupGroupMetadata); a
        group that ends Empty without offsets is dead and gets a tombstone too."""
        producers = set(group.pending_txn_offsets)
        records: list[Record] = [
            (encode_offset_commit_key(OffsetCommitKey(group.group_id, tp.topic, tp.partition)), None)
            for tp in group.remove_offsets(partitions)
        ]
        for producer_id in producers - group.pending_txn_offsets.keys():
            self._forget_producer_group(producer_id, group.group_id)
        if group.is_in(GroupState.EMPTY) and not group.has_offsets():
            group.transition_to(GroupState.DEAD, now_ms)
        if group.is_in(GroupState.DEAD):
            if self.groups.get(group.group_id) is group:
                del self.groups[group.group_id]
            records.append((encode_group_metadata_key(GroupMetadataKey(group.group_id)), None))
        if records:
            self._append(self.partition_for(group.group_id), records, now_ms, lambda error, done_ms: None)

    def cleanup_group_metadata(self, now_ms: int) -> int:
        """Offsets retention (offsets.retention.minutes), run every offsets.retention.check.interval.ms;
        the number of offsets removed."""
        removed = 0
        for group in list(self.groups.values()):
            expired = group.expired_offsets(now_ms, self.config.offsets_retention_ms)
            removed += len(expired)
            idle = group.is_in(GroupState.EMPTY) and not group.has_offsets() and not group.pending_members
            if expired or idle:
                self._remove_offsets(group, expired, now_ms)
        return removed

    # Groups

    def list_groups(self, states: set[str], types: set[str]) -> tuple[str | None, list[GroupOverview]]:
        loading = any(state is _PartitionState.LOADING for state, _ in self._partitions.values())
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        groups = [
            GroupOverview(g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if (not wanted_states or g.state.value.lower() in wanted_states)
            and (not wanted_types or "classic" in wanted_types)
        ]
        return ("COORDINATOR_LOAD_IN_PROGRESS" if loading else None), groups

    def describe_group(self, group_id: str) -> GroupDescription:
        error = self._validate(group_id, _Api.DESCRIBE_GROUP)
        if error is not None:
            return GroupDescription(group_id, error)
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, None, GroupState.DEAD.value)
        stable = group.is_in(GroupState.STABLE)
        protocol = group.protocol_name if stable and group.protocol_name is not None else ""
        return GroupDescription(
            group_id,
            None,
            group.state.value,
            group.protocol_type or "",
            protocol,
            tuple(
                MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(protocol) if stable else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            ),
        )

    def delete_groups(self, group_ids: list[str], now_ms: int) -> dict[str, str | None]:
        results: dict[str, str | None] = {}
        for group_id in group_ids:
            error = self._validate(group_id, _Api.DELETE_GROUP)
            group = self.groups.get(group_id) if error is None else None
            if error is not None:
                results[group_id] = error
            elif group is None or group.is_in(GroupState.DEAD):
                results[group_id] = "GROUP_ID_NOT_FOUND"
            elif not group.is_in(GroupState.EMPTY):
                results[group_id] = "NON_EMPTY_GROUP"
            else:
                group.transition_to(GroupState.DEAD, now_ms)
                self._remove_offsets(group, group.all_offset_partitions(), now_ms)
                results[group_id] = None
        return results

    def _store_group(
        self, group: GroupMetadata, assignment: dict[str, bytes], now_ms: int, on_done: AppendCallback
    ) -> None:
        key = encode_group_metadata_key(GroupMetadataKey(group.group_id))
        value = encode_group_metadata_value(group.to_value(assignment))
        self._append(self.partition_for(group.group_id), [(key, value)], now_ms, on_done)

    def group_counts_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys((s.value for s in GroupState if s is not GroupState.DEAD), 0)
        for group in self.groups.values():
            counts[group.state.value] = counts.get(group.state.value, 0) + 1
        return counts
