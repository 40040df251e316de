"""The controller: the only writer of cluster metadata (KRaft's QuorumController, with a single voter).

Every operation validates against the current image, turns the change into metadata records, appends them to
the metadata log (fsynced) and only then applies them to `self.metadata`, so a crash never leaves a change
half made or visible without being durable, and a restarted controller rebuilds the same image by replaying
the log. Nothing here reads a clock: time comes in as `now_ms`, and the shell calls `fence_stale_brokers` on
a timer (`next_session_deadline_ms` says when) and `balance_partition_leaders` when `next_leader_balance_ms`
says (auto.leader.rebalance.enable).
"""

from __future__ import annotations

import hmac
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scramp import ScramMechanism

from tierlog.common import TopicPartition
from tierlog.config_def import INT32_MAX, parse_config_value
from tierlog.controller.errors import (
    BrokerIdNotRegisteredError,
    ControllerError,
    FencedLeaderEpochError,
    InconsistentClusterIdError,
    IneligibleReplicaError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NoReassignmentInProgressError,
    NotLeaderOrFollowerError,
    StaleBrokerEpochError,
    TopicDeletionDisabledError,
    TopicExistsError,
    UnknownTopicError,
    UnknownTopicIdError,
)
from tierlog.controller.metadata_log import MetadataLog
from tierlog.metadata.image import (
    NO_LEADER,
    BrokerRegistration,
    ClusterMetadata,
    IsrChange,
    PartitionRegistration,
    TopicMetadata,
    partition_record,
)
from tierlog.metadata.records import (
    RESOURCE_BROKER,
    SCRAM_MECHANISM_NAMES,
    BrokerRegistrationChangeRecord,
    ClusterIdRecord,
    ConfigRecord,
    Endpoint,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
)
from tierlog.raft.raft_log import METADATA_TOPIC
from tierlog.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tierlog.security.acl_filter import AclBindingFilter, binding_of, record_of
from tierlog.security.principal import KafkaPrincipal
from tierlog.storage.checkpoints import kafka_uuid_to_str
from tierlog.storage.log_config import TOPIC_CONFIGS, validate_topic_config

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_PARTITIONS = 100_000
PRODUCER_ID_BLOCK_SIZE = 1000
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
# ElectLeaders' election types (KIP-460).
PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1
# PartitionChangeBuilder's elections: ONLINE keeps a leader that may still lead, else takes the first replica
# that may; PREFERRED tries the first replica before the current leader; UNCLEAN is ONLINE that, failing a
# replica of the ISR, takes any live replica.
_ONLINE, _PREFERRED, _UNCLEAN = "online", "preferred", "unclean"
# Kafka's ReplicationControlManager.MAX_ELECTIONS_PER_IMBALANCE: one balancing pass elects at most this many
# leaders, and the next pass follows at once (after `_IMMEDIATE_BALANCE_DELAY_MS`, as QuorumController lets
# other work in between) rather than a whole check interval later.
MAX_ELECTIONS_PER_IMBALANCE = 1000
_IMMEDIATE_BALANCE_DELAY_MS = 10
# The hash of each SCRAM mechanism (by Kafka's ScramMechanism type id; scramp's, which the SASL server verifies
# with), and the iteration counts Kafka accepts for both (ScramMechanism.minIterations,
# ScramControlManager.MAX_ITERATIONS).
_SCRAM_HASHES = {mechanism: ScramMechanism(name).hf for mechanism, name in SCRAM_MECHANISM_NAMES.items()}
MIN_SCRAM_ITERATIONS = 4096
MAX_SCRAM_ITERATIONS = 16384


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate: [a-zA-Z0-9._-], at most 249 characters, not '.' or '..'."""
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError('Topic name cannot be "." or ".."')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    # broker.session.timeout.ms: a broker without a heartbeat for this long is fenced.
    session_timeout_ms: int = 9000
    # unclean.leader.election.enable, the default for topics without an override.
    unclean_leader_election_enable: bool = False
    # remote.log.storage.system.enable: topics may ask for the remote tier only where brokers have it.
    remote_storage_system_enable: bool = False
    # leader.imbalance.check.interval.seconds in ms, or None when auto.leader.rebalance.enable is false.
    leader_imbalance_check_interval_ms: int | None = 300_000


@dataclass(frozen=True, slots=True)
class PartitionElectionResult:
    """One partition's answer to ElectLeaders: error None when a new leader was elected."""

    partition: int
    error: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ScramCredentialUpsertion:
    """A credential to set, as AlterUserScramCredentials carries it: the client salts and hashes the password
    (SaltedPassword = Hi(password, salt, iterations)), so the password itself never reaches the cluster."""

    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class ScramCredentialDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ScramAlterationResult:
    """One user's answer to AlterUserScramCredentials: error None when its alteration was made."""

    user: str
    error: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool


class Controller:
    def __init__(
        self,
        metadata_log: MetadataLog,
        config: ControllerConfig,
        now_ms: int,
        cluster_id: str | None = None,
        *,
        new_uuid: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        """`new_uuid` makes the cluster and topic ids: the simulator gives one its seed decides."""
        self.metadata_log = metadata_log
        self._config = config
        self._new_uuid = new_uuid
        self._now_ms = now_ms
        # When the next leader balancing pass is due (QuorumController's deferred maybeBalancePartitionLeaders):
        # set by the first change that leaves some partition led by another than its preferred replica.
        self._leader_balance_due_ms: int | None = None
        # The latest snapshot, then the log after it (docs/quorum.md#snapshots).
        snapshot = metadata_log.latest_snapshot()
        self.metadata = (
            ClusterMetadata()
            if snapshot is None
            else ClusterMetadata.from_snapshot(snapshot.records, snapshot.end_offset)
        )
        for offset, record in metadata_log.records_from(self.metadata.offset + 1):
            self.metadata.apply(offset, record)
        if not self.metadata.cluster_id:
            # The first active controller of a cluster writes its id (docs/quorum.md#active-controller); the log is
            # not empty then, as a Raft leader's first batch is its LeaderChangeMessage. Kafka's cluster ids are
            # random Uuids in their string form (base64url, 22 characters).
            self._commit([ClusterIdRecord(cluster_id or kafka_uuid_to_str(new_uuid()))])
        elif cluster_id and cluster_id != self.metadata.cluster_id:
            raise InconsistentClusterIdError(
                f"The metadata log belongs to cluster {self.metadata.cluster_id}, not {cluster_id}"
            )
        # When each broker last heartbeated died with the previous process, so every registered broker gets
        # a whole session to reach the new one, as a newly elected Kafka controller grants.
        self._session_deadlines = {broker_id: now_ms + config.session_timeout_ms for broker_id in self.metadata.brokers}
        # A controller taking over schedules a pass for the imbalance its predecessor left, as Kafka's does when
        # it becomes active.
        self._schedule_leader_balance(self.partition_leaders_imbalanced())

    def topic(self, name: str) -> TopicMetadata | None:
        return self.metadata.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        return self.metadata.topic_by_id(topic_id)

    def _advance_clock(self, now_ms: int) -> None:
        # Operations that are not given the time (the admin APIs, AlterPartition) stamp their records with the
        # latest time the controller was given, as the storage layer dates truncations.
        self._now_ms = max(self._now_ms, now_ms)

    def _commit(self, records: Sequence[MetadataRecord]) -> None:
        """Write ahead: the records are durable before the image shows them."""
        if not records:
            return
        first_offset = self.metadata_log.append(records, self._now_ms)
        for index, record in enumerate(records):
            self.metadata.apply(first_offset + index, record)
        # While no pass is due every partition has its preferred leader, so only a partition these records
        # touch can have left it: no scan of every partition on every commit (AlterPartition, heartbeats).
        self._schedule_leader_balance(
            any(isinstance(r, PartitionRecord) and r.leader != r.replicas[0] for r in records)
        )

    # Brokers

    def register_broker(
        self,
        broker_id: int,
        incarnation_id: str,
        cluster_id: str,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        now_ms: int,
    ) -> int:
        """Returns the broker epoch. A new registration starts fenced: the broker is unfenced by the heartbeat
        that shows it has replayed the metadata log up to its own registration."""
        self._advance_clock(now_ms)
        # An empty cluster id comes from a broker whose log dirs are fresh: it joins whichever cluster this is.
        if cluster_id and cluster_id != self.metadata.cluster_id:
            raise InconsistentClusterIdError(
                f"Expected cluster ID {self.metadata.cluster_id}, but got cluster ID {cluster_id}"
            )
        existing = self.metadata.brokers.get(broker_id)
        if existing is not None and existing.incarnation_id == incarnation_id:
            # A retry whose response was lost: the same process must keep the same epoch.
            self._session_deadlines[broker_id] = now_ms + self._config.session_timeout_ms
            return existing.broker_epoch
        records: list[MetadataRecord] = []
        if existing is not None and not existing.fenced:
            # The previous process is gone; its leaderships and ISR places must not wait for its session to end.
            records.extend(self._fence_records(existing, controlled_shutdown=False))
        broker_epoch = self.metadata_log.end_offset + len(records)
        records.append(
            RegisterBrokerRecord(
                broker_id=broker_id,
                incarnation_id=incarnation_id,
                broker_epoch=broker_epoch,
                endpoints=tuple(endpoints),
                rack=rack,
                fenced=True,
            )
        )
        self._commit(records)
        self._session_deadlines[broker_id] = now_ms + self._config.session_timeout_ms
        return broker_epoch

    def heartbeat(
        self,
        broker_id: int,
        broker_epoch: int,
        current_metadata_offset: int,
        want_fence: bool,
        want_shut_down: bool,
        now_ms: int,
    ) -> HeartbeatResult:
        self._advance_clock(now_ms)
        broker = self._registered(broker_id, broker_epoch)
        self._session_deadlines[broker_id] = now_ms + self._config.session_timeout_ms
        is_caught_up = current_metadata_offset >= broker.broker_epoch
        if want_shut_down:
            # Controlled shutdown: leaderships move now, while the broker can still serve the handover.
            if not broker.in_controlled_shutdown:
                self._commit(self._fence_records(broker, controlled_shutdown=True))
            return HeartbeatResult(is_caught_up=is_caught_up, is_fenced=True, should_shut_down=True)
        if want_fence:
            if not broker.fenced:
                self._commit(self._fence_records(broker, controlled_shutdown=False))
        elif broker.fenced and is_caught_up and not broker.in_controlled_shutdown:
            self._commit(self._unfence_records(broker))
        return HeartbeatResult(
            is_caught_up=is_caught_up, is_fenced=self.metadata.brokers[broker_id].fenced, should_shut_down=False
        )

    def fence_stale_brokers(self, now_ms: int) -> list[int]:
        """Fence every unfenced broker whose session has expired; returns their ids."""
        self._advance_clock(now_ms)
        stale = [
            broker_id
            for broker_id, broker in sorted(self.metadata.brokers.items())
            if not broker.fenced and self._session_deadlines[broker_id] <= now_ms
        ]
        # One operation per broker, as Kafka fences them: each sees the partitions the previous one left.
        for broker_id in stale:
            self._commit(self._fence_records(self.metadata.brokers[broker_id], controlled_shutdown=False))
        return stale

    def next_session_deadline_ms(self) -> int | None:
        """When `fence_stale_brokers` next has work, if no heartbeat comes first; None with no unfenced broker."""
        deadlines = [
            self._session_deadlines[broker_id]
            for broker_id, broker in self.metadata.brokers.items()
            if not broker.fenced
        ]
        return min(deadlines, default=None)

    def unregister_broker(self, broker_id: int) -> None:
        """Kafka's unregisterBroker (`kafka-cluster.sh unregister`, KIP-500): the broker leaves every ISR and
        leadership as when it is fenced, then its registration is removed. The partitions that list it keep it
        among their replicas: moving them off it is a reassignment's job (docs/reassignment.md#unregister)."""
        broker = self.metadata.brokers.get(broker_id)
        if broker is None:
            raise BrokerIdNotRegisteredError(f"Broker ID {broker_id} is not currently registered")
        records: list[MetadataRecord] = list(self._leave_isrs(broker_id))
        records.append(UnregisterBrokerRecord(broker_id=broker_id, broker_epoch=broker.broker_epoch))
        self._commit(records)
        self._session_deadlines.pop(broker_id, None)

    def _registered(self, broker_id: int, broker_epoch: int) -> BrokerRegistration:
        broker = self.metadata.brokers.get(broker_id)
        if broker is None:
            raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
        if broker.broker_epoch != broker_epoch:
            raise StaleBrokerEpochError(
                f"Expected broker epoch {broker.broker_epoch} for broker {broker_id}, but got {broker_epoch}"
            )
        return broker

    def _live_brokers(self) -> set[int]:
        """The brokers that may lead, join an ISR or receive new replicas."""
        return {
            broker_id
            for broker_id, broker in self.metadata.brokers.items()
            if not broker.fenced and not broker.in_controlled_shutdown
        }

    def _fence_records(self, broker: BrokerRegistration, *, controlled_shutdown: bool) -> list[MetadataRecord]:
        """Fence `broker`: it leaves every ISR (except as the last member, which keeps the partition's
        committed data on record) and its leaderships go to other replicas."""
        broker_id = broker.broker_id
        records: list[MetadataRecord] = [
            BrokerRegistrationChangeRecord(
                broker_id=broker_id,
                broker_epoch=broker.broker_epoch,
                fenced=True,
                in_controlled_shutdown=True if controlled_shutdown else None,
            )
        ]
        records.extend(self._leave_isrs(broker_id))
        return records

    def _leave_isrs(self, broker_id: int) -> list[PartitionRecord]:
        """Kafka's generateLeaderAndIsrUpdates with a broker to remove: it leaves every ISR it is in (except as
        the last member, which keeps the partition's committed data on record), may lead nothing, and each change
        completes a reassignment it allows (docs/reassignment.md#completion)."""
        live = self._live_brokers() - {broker_id}
        changes = []
        for topic in self.metadata.topics.values():
            election = self._election(topic.configs)
            for partition_id, current in enumerate(topic.partitions):
                if broker_id not in current.isr:
                    continue
                change = _partition_change(
                    topic.topic_id,
                    partition_id,
                    current,
                    acceptable=live,
                    isr=[r for r in current.isr if r != broker_id],
                    election=election,
                )
                if change is not None:
                    changes.append(change)
        return changes

    def _unfence_records(self, broker: BrokerRegistration) -> list[MetadataRecord]:
        records: list[MetadataRecord] = [
            BrokerRegistrationChangeRecord(
                broker_id=broker.broker_id, broker_epoch=broker.broker_epoch, fenced=False, in_controlled_shutdown=None
            )
        ]
        live = self._live_brokers() | {broker.broker_id}
        for topic in self.metadata.topics.values():
            records.extend(self._elect_leaderless(topic, topic.configs, live))
        return records

    def _elect_leaderless(
        self,
        topic: TopicMetadata,
        configs: Mapping[str, str],
        live: Collection[int],
        cluster_defaults: Mapping[str, str] | None = None,
    ) -> list[PartitionRecord]:
        """Leaders for the offline partitions of `topic` that `live` brokers can now lead (with `configs` as the
        topic's overrides and `cluster_defaults` as the dynamic broker defaults, when those are changing)."""
        election = self._election(configs, cluster_defaults)
        changes = []
        for partition_id, current in enumerate(topic.partitions):
            if current.leader != NO_LEADER:
                continue
            change = _partition_change(topic.topic_id, partition_id, current, acceptable=live, election=election)
            if change is not None:
                changes.append(change)
        return changes

    def _unclean_enabled(
        self, topic_configs: Mapping[str, str], cluster_defaults: Mapping[str, str] | None = None
    ) -> bool:
        """The topic's unclean.leader.election.enable, else the cluster-wide dynamic broker default, else the
        controller's own setting (the precedence of DynamicBrokerConfig)."""
        if cluster_defaults is None:
            cluster_defaults = self.metadata.broker_configs.get("", {})
        value = topic_configs.get(UNCLEAN_LEADER_ELECTION_ENABLE)
        if value is None:
            value = cluster_defaults.get(UNCLEAN_LEADER_ELECTION_ENABLE)
        if value is None:
            return self._config.unclean_leader_election_enable
        return bool(parse_config_value(TOPIC_CONFIGS[UNCLEAN_LEADER_ELECTION_ENABLE], value))

    def _election(self, topic_configs: Mapping[str, str], cluster_defaults: Mapping[str, str] | None = None) -> str:
        """How a partition of this topic elects a leader when it must: UNCLEAN where unclean election is enabled."""
        return _UNCLEAN if self._unclean_enabled(topic_configs, cluster_defaults) else _ONLINE

    # Partitions

    def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic_id: uuid.UUID,
        partition: int,
        leader_epoch: int,
        partition_epoch: int,
        new_isr: Sequence[int],
    ) -> PartitionRegistration:
        """A leader's ISR change, compare-and-set against the registration it last saw; returns the
        registration now in force. Only the partition epoch bumps: the leader is unchanged."""
        (outcome,) = self.alter_partitions(
            broker_id, broker_epoch, [IsrChange(topic_id, partition, leader_epoch, partition_epoch, new_isr)]
        )
        if isinstance(outcome, ControllerError):
            raise outcome
        return outcome

    def alter_partitions(
        self, broker_id: int, broker_epoch: int, changes: Sequence[IsrChange]
    ) -> list[PartitionRegistration | ControllerError]:
        """An AlterPartition request's ISR changes, each decided as `alter_partition` decides one, in order, and
        committed together as one batch, as Kafka's ReplicationControlManager.alterPartition answers a whole
        request with one ControllerResult: one metadata commit and one publish on every broker for any number of
        partitions (docs/replication.md#alter-partition). Each change's outcome, in the order of `changes`: the
        registration now in force, or the error that refused it. NotControllerError, raised for the whole request,
        commits none."""
        outcomes: list[PartitionRegistration | ControllerError | None] = []
        records: list[MetadataRecord] = []
        pending: set[tuple[uuid.UUID, int]] = set()
        for change in changes:
            key = (change.topic_id, change.partition)
            if key in pending:
                # The same partition twice: the second is decided against what the first committed.
                self._commit(records)
                records, pending = [], set()
            try:
                record = self._isr_change_record(broker_id, broker_epoch, change)
            except ControllerError as e:
                outcomes.append(e)
                continue
            if record is not None:
                records.append(record)
            pending.add(key)
            outcomes.append(None)
        self._commit(records)
        return [
            self.metadata.topic_by_id(change.topic_id).partitions[change.partition]  # type: ignore[union-attr]
            if outcome is None
            else outcome
            for change, outcome in zip(changes, outcomes, strict=True)
        ]

    def _isr_change_record(self, broker_id: int, broker_epoch: int, change: IsrChange) -> MetadataRecord | None:
        """The record of one ISR change, None if it changes nothing; raises the error that refuses it."""
        partition, leader_epoch, partition_epoch = change.partition, change.leader_epoch, change.partition_epoch
        broker = self.metadata.brokers.get(broker_id)
        if broker is None or broker.broker_epoch != broker_epoch:
            raise StaleBrokerEpochError(f"Broker {broker_id} epoch {broker_epoch} is not its current registration")
        topic = self.metadata.topic_by_id(change.topic_id)
        if topic is None:
            raise UnknownTopicIdError(f"Topic id {change.topic_id} does not exist")
        if not 0 <= partition < len(topic.partitions):
            raise UnknownTopicError(f"Partition {topic.name}-{partition} does not exist")
        current = topic.partitions[partition]
        if leader_epoch != current.leader_epoch:
            raise FencedLeaderEpochError(
                f"Leader epoch {leader_epoch} of {topic.name}-{partition} is not the current {current.leader_epoch}"
            )
        if broker_id != current.leader:
            raise NotLeaderOrFollowerError(f"Broker {broker_id} is not the leader of {topic.name}-{partition}")
        if partition_epoch != current.partition_epoch:
            raise InvalidUpdateVersionError(
                f"Partition epoch {partition_epoch} of {topic.name}-{partition} is not the current "
                f"{current.partition_epoch}"
            )
        isr = list(change.new_isr)
        if len(set(isr)) != len(isr):
            raise InvalidRequestError(f"The new ISR {isr} of {topic.name}-{partition} has duplicates")
        if broker_id not in isr:
            raise IneligibleReplicaError(f"The new ISR {isr} of {topic.name}-{partition} lacks its leader")
        live = self._live_brokers()
        ineligible = [r for r in isr if r not in current.replicas or r not in live]
        if ineligible:
            raise IneligibleReplicaError(
                f"Replicas {ineligible} of the new ISR {isr} of {topic.name}-{partition} are not live replicas"
            )
        # The current ISR again (a retry whose response was lost) is no change: the registration comes back
        # as it is, epochs and all. An ISR that now holds every target replica completes the partition's
        # reassignment, which may move its leadership (docs/reassignment.md#completion).
        return _partition_change(
            change.topic_id,
            partition,
            current,
            acceptable=live,
            isr=isr,
            election=self._election(topic.configs),
        )

    # Elections on request (ElectLeaders) and leader balancing (auto.leader.rebalance.enable)

    def elect_leaders(
        self, election_type: int, partitions: Mapping[str, Sequence[int]] | None
    ) -> dict[str, list[PartitionElectionResult]]:
        """KIP-460's ElectLeaders, as Kafka's ReplicationControlManager.electLeaders: a PREFERRED election gives
        each partition back to its preferred replica (the first of its replicas) if that one is in the ISR and
        live; an UNCLEAN one gives a leaderless partition a leader even outside the ISR, whatever
        unclean.leader.election.enable says (the operator asked for it). `partitions` None means every
        partition of every topic, and then partitions that needed no election are left out of the answer.
        Every election is committed at once, each with a new leader epoch."""
        if election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
            raise InvalidRequestError(f"Unknown election type {election_type}")
        requested: dict[str, Sequence[int]]
        if partitions is None:
            requested = {name: range(len(topic.partitions)) for name, topic in sorted(self.metadata.topics.items())}
        else:
            requested = {name: list(dict.fromkeys(ids)) for name, ids in partitions.items()}
        records: list[MetadataRecord] = []
        results: dict[str, list[PartitionElectionResult]] = {}
        for name, partition_ids in requested.items():
            topic_results = results.setdefault(name, [])
            for partition_id in partition_ids:
                change, result = self._elect_on_request(name, partition_id, election_type)
                if change is not None:
                    records.append(change)
                if partitions is not None or result.error != "ELECTION_NOT_NEEDED":
                    topic_results.append(result)
        self._commit(records)
        return results

    def _elect_on_request(
        self, name: str, partition_id: int, election_type: int
    ) -> tuple[PartitionRecord | None, PartitionElectionResult]:
        topic = self.metadata.topics.get(name)
        if topic is None:
            return None, PartitionElectionResult(partition_id, "UNKNOWN_TOPIC_OR_PARTITION", f"No such topic as {name}")
        if not 0 <= partition_id < len(topic.partitions):
            return None, PartitionElectionResult(
                partition_id, "UNKNOWN_TOPIC_OR_PARTITION", f"No such partition as {name}-{partition_id}"
            )
        current = topic.partitions[partition_id]
        preferred = election_type == PREFERRED_ELECTION
        not_needed = (current.leader == current.replicas[0]) if preferred else (current.leader != NO_LEADER)
        if not_needed:
            return None, PartitionElectionResult(
                partition_id, "ELECTION_NOT_NEEDED", "Leader election not needed for topic partition."
            )
        change = _partition_change(
            topic.topic_id,
            partition_id,
            current,
            acceptable=self._live_brokers(),
            election=_PREFERRED if preferred else _UNCLEAN,
        )
        if change is None:
            if preferred:
                return None, PartitionElectionResult(
                    partition_id, "PREFERRED_LEADER_NOT_AVAILABLE", "The preferred leader was not available."
                )
            return None, PartitionElectionResult(
                partition_id, "ELIGIBLE_LEADERS_NOT_AVAILABLE", "Eligible topic partition leaders are not available."
            )
        return change, PartitionElectionResult(partition_id)

    # Reassignments (KIP-455; docs/reassignment.md)

    def alter_partition_reassignments(
        self, targets: Mapping[TopicPartition, Sequence[int] | None]
    ) -> dict[TopicPartition, ControllerError | None]:
        """Kafka's ReplicationControlManager.alterPartitionReassignments: move each partition to its target
        replicas (the first the preferred leader), or cancel its reassignment in progress where the target is
        None. One answer per partition, None where it was accepted (docs/reassignment.md#validation); the accepted
        changes are committed together. Nothing but these records holds a reassignment, so a new or rebuilt
        controller carries it on (docs/reassignment.md#failover)."""
        records: list[MetadataRecord] = []
        results: dict[TopicPartition, ControllerError | None] = {}
        for tp, target in targets.items():
            try:
                change = self._reassignment_change(tp, target)
            except ControllerError as e:
                results[tp] = e
                continue
            if change is not None:
                records.append(change)
            results[tp] = None
        self._commit(records)
        return results

    def _reassignment_change(self, tp: TopicPartition, target: Sequence[int] | None) -> PartitionRecord | None:
        topic = self.metadata.topics.get(tp.topic)
        if topic is None:
            raise UnknownTopicError(f"Unable to find a topic named {tp.topic}.")
        if not 0 <= tp.partition < len(topic.partitions):
            raise UnknownTopicError(f"Unable to find partition {tp.topic}:{tp.partition}.")
        current = topic.partitions[tp.partition]
        live = self._live_brokers()
        if target is None:
            # docs/reassignment.md#cancel
            if not current.is_reassigning:
                raise NoReassignmentInProgressError("No partition reassignment is in progress for the topic partition.")
            replicas = [r for r in current.replicas if r not in current.adding_replicas]
            isr = [r for r in current.isr if r not in current.adding_replicas]
            election = self._election(topic.configs)
            if not isr:
                if election != _UNCLEAN:
                    raise InvalidReplicaAssignmentError(
                        f"Unable to revert partition assignment for {tp.topic}:{tp.partition} because it would "
                        f"require an unclean leader election."
                    )
                isr = replicas[:1]
            return _partition_change(
                topic.topic_id,
                tp.partition,
                current,
                acceptable=live,
                isr=isr,
                replicas=replicas,
                adding=[],
                removing=[],
                election=election,
            )
        self._validate_reassignment_target(target)
        # docs/reassignment.md#start: against the replicas now listed, those of a reassignment in progress
        # included, so a new target replaces it (docs/reassignment.md#replace).
        removing = sorted(set(current.replicas) - set(target))
        adding = sorted(set(target) - set(current.replicas))
        return _partition_change(
            topic.topic_id,
            tp.partition,
            current,
            acceptable=live,
            replicas=[*target, *removing],
            adding=adding,
            removing=removing,
        )

    def _validate_reassignment_target(self, target: Sequence[int]) -> None:
        """Kafka's validateManualPartitionAssignment: not empty, each broker registered (fenced or not) and
        named once; checked in broker id order, as Kafka reports the first offender
        (docs/reassignment.md#validation)."""
        if not target:
            raise InvalidReplicaAssignmentError("The manual partition assignment includes an empty replica list.")
        previous = None
        for broker_id in sorted(target):
            if broker_id not in self.metadata.brokers:
                raise InvalidReplicaAssignmentError(
                    f"The manual partition assignment includes broker {broker_id}, but no such broker is registered."
                )
            if broker_id == previous:
                raise InvalidReplicaAssignmentError(
                    f"The manual partition assignment includes the broker {broker_id} more than once."
                )
            previous = broker_id

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, PartitionRegistration]:
        """The reassignments in progress among `partitions` (every partition when None), as Kafka's
        listPartitionReassignments: partitions unknown or not reassigning are left out, without an error
        (docs/reassignment.md#list)."""
        if partitions is None:
            partitions = [
                TopicPartition(name, index)
                for name, topic in sorted(self.metadata.topics.items())
                for index in range(len(topic.partitions))
            ]
        ongoing = {}
        for tp in partitions:
            topic = self.metadata.topics.get(tp.topic)
            if topic is None or not 0 <= tp.partition < len(topic.partitions):
                continue
            registration = topic.partitions[tp.partition]
            if registration.is_reassigning:
                ongoing[tp] = registration
        return ongoing

    def partition_leaders_imbalanced(self) -> bool:
        """Whether some partition is led by another than its preferred replica (or by none)."""
        return any(p.leader != p.replicas[0] for topic in self.metadata.topics.values() for p in topic.partitions)

    def next_leader_balance_ms(self) -> int | None:
        """When `balance_partition_leaders` is due; None while every partition has its preferred leader or
        auto.leader.rebalance.enable is off."""
        return self._leader_balance_due_ms

    def balance_partition_leaders(self, now_ms: int) -> int:
        """Kafka's maybeBalancePartitionLeaders: a preferred election for every partition not led by its
        preferred replica, at most MAX_ELECTIONS_PER_IMBALANCE of them; returns how many leaders moved.
        leader.imbalance.per.broker.percentage plays no part, as in Kafka's KRaft controller: one partition
        off its preferred replica is imbalance enough."""
        self._advance_clock(now_ms)
        live = self._live_brokers()
        records: list[MetadataRecord] = []
        for topic in self.metadata.topics.values():
            for partition_id, current in enumerate(topic.partitions):
                if len(records) >= MAX_ELECTIONS_PER_IMBALANCE:
                    break
                if current.leader == current.replicas[0]:
                    continue
                change = _partition_change(topic.topic_id, partition_id, current, acceptable=live, election=_PREFERRED)
                if change is not None:
                    records.append(change)
        self._commit(records)
        # Still imbalanced (a preferred replica not back in the ISR yet): look again an interval later, or at
        # once when this pass hit its cap.
        self._leader_balance_due_ms = None
        self._schedule_leader_balance(
            self.partition_leaders_imbalanced(), at_once=len(records) >= MAX_ELECTIONS_PER_IMBALANCE
        )
        return len(records)

    def _schedule_leader_balance(self, imbalanced: bool, *, at_once: bool = False) -> None:
        """As QuorumController after every write: if leaders are imbalanced and no pass is due yet, one is
        due a check interval from now (or at once after a pass that hit its cap)."""
        interval_ms = self._config.leader_imbalance_check_interval_ms
        if interval_ms is None or self._leader_balance_due_ms is not None or not imbalanced:
            return
        self._leader_balance_due_ms = self._now_ms + (_IMMEDIATE_BALANCE_DELAY_MS if at_once else interval_ms)

    # Topics

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicMetadata:
        """`assignments` (CreateTopics' manual replica assignment) lists each partition's replicas, preferred
        leader first; without it replicas are placed round-robin over the live brokers."""
        validate_topic_name(name)
        if name == METADATA_TOPIC:
            raise InvalidTopicError(f"Topic name {name} is reserved for the metadata log")
        if name in self.metadata.topics:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        colliding = [t for t in self.metadata.topics if t.replace(".", "_") == name.replace(".", "_")]
        if colliding:
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {colliding[0]}")
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"Number of partitions must be larger than 0 (got {num_partitions}).")
        if replication_factor < 1:
            raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
        self._validate_configs(name, configs)
        topic_id = self._new_uuid()
        if assignments:
            partitions = self._manual_assignment(assignments)
        else:
            nodes = self._placement_nodes(replication_factor)
            partitions = [_assign(p, replication_factor, nodes) for p in range(num_partitions)]
        if validate_only:
            return TopicMetadata(name=name, topic_id=topic_id, partitions=partitions, configs=dict(configs))
        records: list[MetadataRecord] = [TopicRecord(name=name, topic_id=topic_id)]
        records.extend(partition_record(topic_id, p, registration) for p, registration in enumerate(partitions))
        records.extend(ConfigRecord(name, key, value) for key, value in sorted(configs.items()))
        self._commit(records)
        return self.metadata.topics[name]

    def delete_topic(self, name: str, *, deletion_enabled: bool = True) -> TopicMetadata:
        if not deletion_enabled:
            raise TopicDeletionDisabledError("Topic deletion is disabled (delete.topic.enable=false).")
        topic = self.metadata.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        self._commit([RemoveTopicRecord(topic.topic_id)])
        return topic

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicMetadata:
        topic = self.metadata.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        current = len(topic.partitions)
        if total < current:
            raise InvalidPartitionsError(
                f"Topic currently has {current} partitions, which is higher than the requested {total}."
            )
        if total == current:
            raise InvalidPartitionsError(f"Topic already has {current} partitions.")
        if total > MAX_PARTITIONS:
            raise InvalidPartitionsError(f"Too many partitions requested: {total}.")
        replication_factor = len(topic.partitions[0].replicas)
        nodes = self._placement_nodes(replication_factor)
        added = [_assign(p, replication_factor, nodes) for p in range(current, total)]
        if validate_only:
            return TopicMetadata(
                name=name, topic_id=topic.topic_id, partitions=[*topic.partitions, *added], configs=dict(topic.configs)
            )
        self._commit(
            [partition_record(topic.topic_id, p, registration) for p, registration in enumerate(added, start=current)]
        )
        return self.metadata.topics[name]

    def _validate_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        """Each value on its own, then Kafka's tiered-storage rules (KIP-405): the remote tier needs the
        brokers' remote.log.storage.system.enable, and compacted and internal topics are never tiered."""
        _validate_configs(configs)
        if configs.get("remote.storage.enable", "false").strip().lower() != "true":
            return
        if not self._config.remote_storage_system_enable:
            raise InvalidConfigError(
                "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote "
                "log storage (set remote.log.storage.system.enable=true on the brokers)."
            )
        if "compact" in configs.get("cleanup.policy", "delete"):
            raise InvalidConfigError("Remote log storage is unsupported for the compacted topics")
        if topic.startswith("__"):
            raise InvalidConfigError(f"Remote log storage is unsupported for the internal topic {topic}")

    def alter_topic_configs(
        self, name: str, new_configs: Mapping[str, str], *, validate_only: bool = False
    ) -> TopicMetadata:
        """Replace the topic's overrides with `new_configs` (the caller has applied SET/DELETE/APPEND)."""
        topic = self.metadata.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        self._validate_configs(name, new_configs)
        if validate_only:
            return TopicMetadata(
                name=name, topic_id=topic.topic_id, partitions=list(topic.partitions), configs=dict(new_configs)
            )
        records: list[MetadataRecord] = [
            ConfigRecord(name, key, value)
            for key, value in sorted(new_configs.items())
            if topic.configs.get(key) != value
        ]
        records.extend(ConfigRecord(name, key, None) for key in sorted(topic.configs) if key not in new_configs)
        # Enabling unclean election is how an operator brings an offline partition back: do it at once.
        records.extend(self._elect_leaderless(topic, new_configs, self._live_brokers()))
        self._commit(records)
        return topic

    def alter_broker_configs(
        self, resource_name: str, new_configs: Mapping[str, str], *, validate_only: bool = False
    ) -> None:
        """Replace the dynamic configs of a broker (`resource_name` its id) or of every broker ("" for the
        cluster-wide default) with `new_configs`. The receiving broker has validated them (Kafka's
        ConfigAdminManager); the controller checks only the resource name, as Kafka's
        ControllerConfigurationValidator does."""
        if resource_name and not (resource_name.isdigit() and int(resource_name) <= INT32_MAX):
            raise InvalidRequestError(f"Node id must be an integer, but it is: {resource_name}")
        if validate_only:
            return
        current = self.metadata.broker_configs.get(resource_name, {})
        records: list[MetadataRecord] = [
            ConfigRecord(resource_name, key, value, RESOURCE_BROKER)
            for key, value in sorted(new_configs.items())
            if current.get(key) != value
        ]
        records.extend(
            ConfigRecord(resource_name, key, None, RESOURCE_BROKER) for key in sorted(current) if key not in new_configs
        )
        # Turning on unclean election cluster-wide brings offline partitions back at once, as a topic's does.
        if not resource_name and UNCLEAN_LEADER_ELECTION_ENABLE in new_configs:
            live = self._live_brokers()
            for topic in self.metadata.topics.values():
                records.extend(self._elect_leaderless(topic, topic.configs, live, new_configs))
        self._commit(records)

    def allocate_producer_id_block(self, broker_id: int = -1) -> range:
        """A block of producer ids no other broker or earlier run ever receives: the block is durably taken
        before it is handed out, so a crash can only skip ids, never reuse them."""
        start = self.metadata.next_producer_id
        self._commit([ProducerIdsRecord(broker_id, start + PRODUCER_ID_BLOCK_SIZE)])
        return range(start, start + PRODUCER_ID_BLOCK_SIZE)

    # SCRAM credentials (docs/security.md#scram-credentials)

    def alter_user_scram_credentials(
        self, upsertions: Sequence[ScramCredentialUpsertion], deletions: Sequence[ScramCredentialDeletion]
    ) -> list[ScramAlterationResult]:
        """Kafka's ScramControlManager.alterCredentials: one result per user named. A user altered twice in one
        request (whatever the mechanisms) gets DUPLICATE_RESOURCE and none of its alterations; the valid
        alterations of the other users are committed together, as one batch."""
        errors: dict[str, ScramAlterationResult] = {}
        valid_deletions: dict[str, ScramCredentialDeletion] = {}
        valid_upsertions: dict[str, ScramCredentialUpsertion] = {}
        for deletion in deletions:
            if deletion.name in errors:
                continue
            if valid_deletions.pop(deletion.name, None) is not None:
                errors[deletion.name] = _altered_twice(deletion.name)
                continue
            error = self._scram_deletion_error(deletion)
            if error is None:
                valid_deletions[deletion.name] = deletion
            else:
                errors[deletion.name] = error
        for upsertion in upsertions:
            if upsertion.name in errors:
                continue
            if (
                valid_deletions.pop(upsertion.name, None) is not None
                or valid_upsertions.pop(upsertion.name, None) is not None
            ):
                errors[upsertion.name] = _altered_twice(upsertion.name)
                continue
            error = _scram_upsertion_error(upsertion)
            if error is None:
                valid_upsertions[upsertion.name] = upsertion
            else:
                errors[upsertion.name] = error
        records: list[MetadataRecord] = [
            RemoveUserScramCredentialRecord(d.name, d.mechanism) for d in valid_deletions.values()
        ]
        records.extend(_scram_credential_record(u) for u in valid_upsertions.values())
        self._commit(records)
        return [
            *(ScramAlterationResult(name) for name in (*valid_deletions, *valid_upsertions)),
            *errors.values(),
        ]

    def _scram_deletion_error(self, deletion: ScramCredentialDeletion) -> ScramAlterationResult | None:
        error = _scram_name_and_mechanism_error(deletion.name, deletion.mechanism)
        if error is not None:
            return error
        if (deletion.name, SCRAM_MECHANISM_NAMES[deletion.mechanism]) not in self.metadata.scram_credentials:
            return ScramAlterationResult(
                deletion.name, "RESOURCE_NOT_FOUND", "Attempt to delete a user credential that does not exist"
            )
        return None

    # ACLs (Kafka's AclControlManager; docs/security.md#authorizer)

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[ControllerError | None]:
        """One result per binding: None when it was created or already existed (an ACL is stored once), else
        why it is invalid. The valid ones are created together."""
        existing = {binding_of(record) for record in self.metadata.acls.values()}
        taken_ids = set(self.metadata.acls)
        records: list[MetadataRecord] = []
        results: list[ControllerError | None] = []
        for binding in bindings:
            try:
                validate_new_acl(binding)
            except InvalidRequestError as e:
                results.append(e)
                continue
            if binding not in existing:
                existing.add(binding)
                acl_id = self._new_uuid()
                while acl_id in taken_ids:
                    acl_id = self._new_uuid()
                taken_ids.add(acl_id)
                records.append(record_of(acl_id, binding))
            results.append(None)
        self._commit(records)
        return results

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[list[AclBinding] | ControllerError]:
        """For each filter the ACLs it matched, all of them removed together (an ACL matched by several filters
        is listed under each); an invalid filter gets its error and removes nothing."""
        removed: dict[uuid.UUID, None] = {}
        results: list[list[AclBinding] | ControllerError] = []
        for acl_filter in filters:
            if acl_filter.pattern.is_unknown():
                results.append(InvalidRequestError("Unknown patternFilter."))
                continue
            if acl_filter.entry.is_unknown():
                results.append(InvalidRequestError("Unknown entryFilter."))
                continue
            matched = []
            for acl_id, record in self.metadata.acls.items():
                binding = binding_of(record)
                if acl_filter.matches(binding):
                    matched.append(binding)
                    removed[acl_id] = None
            results.append(matched)
        self._commit([RemoveAccessControlEntryRecord(acl_id) for acl_id in removed])
        return results

    def _manual_assignment(self, assignments: Sequence[Sequence[int]]) -> list[PartitionRegistration]:
        live = self._live_brokers()
        partitions = []
        for index, replicas in enumerate(assignments):
            if not replicas or len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignmentError(
                    f"Partition {index} has an empty or duplicated replica list {list(replicas)}."
                )
            if len(replicas) != len(assignments[0]):
                raise InvalidReplicaAssignmentError("All partitions must have the same number of replicas.")
            missing = [r for r in replicas if r not in live]
            if missing:
                raise InvalidReplicaAssignmentError(
                    f"The manual partition assignment includes broker(s) {missing} that are not registered "
                    f"and unfenced."
                )
            partitions.append(PartitionRegistration(replicas=list(replicas), isr=list(replicas), leader=replicas[0]))
        return partitions

    def _placement_nodes(self, replication_factor: int) -> list[int]:
        nodes = sorted(self._live_brokers())
        if replication_factor > len(nodes):
            raise InvalidReplicationFactorError(
                f"Unable to replicate the partition {replication_factor} time(s): "
                f"The target replication factor of {replication_factor} cannot be reached because only "
                f"{len(nodes)} broker(s) are registered."
            )
        return nodes


def _altered_twice(name: str) -> ScramAlterationResult:
    return ScramAlterationResult(
        name, "DUPLICATE_RESOURCE", "A user credential cannot be altered twice in the same request"
    )


def _scram_name_and_mechanism_error(name: str, mechanism: int) -> ScramAlterationResult | None:
    if not name:
        return ScramAlterationResult(name, "UNACCEPTABLE_CREDENTIAL", "Username must not be empty")
    if mechanism not in SCRAM_MECHANISM_NAMES:
        return ScramAlterationResult(name, "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism")
    return None


def _scram_upsertion_error(upsertion: ScramCredentialUpsertion) -> ScramAlterationResult | None:
    error = _scram_name_and_mechanism_error(upsertion.name, upsertion.mechanism)
    if error is not None:
        return error
    if upsertion.iterations < MIN_SCRAM_ITERATIONS:
        return ScramAlterationResult(upsertion.name, "UNACCEPTABLE_CREDENTIAL", "Too few iterations")
    if upsertion.iterations > MAX_SCRAM_ITERATIONS:
        return ScramAlterationResult(upsertion.name, "UNACCEPTABLE_CREDENTIAL", "Too many iterations")
    # Kafka fails an empty one only when its HMAC refuses the empty key, as an unknown server error.
    if not upsertion.salted_password:
        return ScramAlterationResult(upsertion.name, "UNACCEPTABLE_CREDENTIAL", "Salted password must not be empty")
    return None


def _scram_credential_record(upsertion: ScramCredentialUpsertion) -> UserScramCredentialRecord:
    """RFC 5802's keys, derived here as Kafka's controller does: StoredKey = H(HMAC(SaltedPassword, "Client
    Key")), ServerKey = HMAC(SaltedPassword, "Server Key")."""
    digest = _SCRAM_HASHES[upsertion.mechanism]
    client_key = hmac.digest(upsertion.salted_password, b"Client Key", digest)
    return UserScramCredentialRecord(
        name=upsertion.name,
        mechanism=upsertion.mechanism,
        salt=upsertion.salt,
        stored_key=digest(client_key).digest(),
        server_key=hmac.digest(upsertion.salted_password, b"Server Key", digest),
        iterations=upsertion.iterations,
    )


def validate_new_acl(binding: AclBinding) -> None:
    """Kafka's checks of a new ACL (AclApis.handleCreateAcls, then AclControlManager.validateNewAcl, with their
    messages), then the principal's form, which Kafka's tools check before sending (an ACL for "alice" could
    never match anyone)."""
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
        raise InvalidRequestError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not pattern.name:
        raise InvalidRequestError("Invalid empty resource name")
    if pattern.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidRequestError(f"Invalid resourceType {pattern.resource_type.name}")
    if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidRequestError(f"Invalid patternType {pattern.pattern_type.name}")
    if entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidRequestError(f"Invalid operation {entry.operation.name}")
    if entry.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise InvalidRequestError(f"Invalid permissionType {entry.permission_type.name}")
    try:
        KafkaPrincipal.parse(entry.principal)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None


def _partition_change(
    topic_id: uuid.UUID,
    partition_id: int,
    current: PartitionRegistration,
    *,
    acceptable: Collection[int],
    isr: Sequence[int] | None = None,
    replicas: Sequence[int] | None = None,
    adding: Sequence[int] | None = None,
    removing: Sequence[int] | None = None,
    election: str = _ONLINE,
) -> PartitionRecord | None:
    """Kafka's PartitionChangeBuilder.build: the record moving `current` to the targets given (the rest as they
    are), None if nothing changes. In order: a reassignment the target ISR allows completes; a leader is elected
    among the `acceptable` brokers (those live) by `election`; the leader epoch bumps on a new leader and when a
    replica leaves the assignment (so the removed one stops following); the partition epoch on every change. An
    empty ISR is never written (Kafka without ELR): its last member keeps the committed data on record."""
    target_isr = list(current.isr if isr is None else isr)
    target_replicas = list(current.replicas if replicas is None else replicas)
    target_adding = list(current.adding_replicas if adding is None else adding)
    target_removing = list(current.removing_replicas if removing is None else removing)
    completed = _completed_reassignment(target_replicas, target_adding, target_removing, target_isr)
    if completed is not None:
        target_replicas, target_isr = completed
        target_adding, target_removing = [], []
    leader, unclean = _elect_leader(current.leader, target_replicas, target_isr, acceptable, election)
    if unclean and leader != current.leader:
        # Its log is the truth from now on: it is the whole ISR.
        target_isr = [leader]
    if not target_isr:
        target_isr = list(current.isr)
    replica_removed = not set(current.replicas) <= set(target_replicas)
    changed = PartitionRegistration(
        replicas=target_replicas,
        isr=target_isr,
        leader=leader,
        leader_epoch=current.leader_epoch + 1 if leader != current.leader or replica_removed else current.leader_epoch,
        partition_epoch=current.partition_epoch + 1,
        adding_replicas=target_adding,
        removing_replicas=target_removing,
    )
    if (changed.replicas, changed.isr, changed.leader, changed.adding_replicas, changed.removing_replicas) == (
        current.replicas,
        current.isr,
        current.leader,
        current.adding_replicas,
        current.removing_replicas,
    ):
        return None
    return partition_record(topic_id, partition_id, changed)


def _elect_leader(
    current_leader: int, replicas: Sequence[int], isr: Sequence[int], acceptable: Collection[int], election: str
) -> tuple[int, bool]:
    """(leader, whether the election was unclean). A clean leader is in the target ISR and acceptable, and is
    looked for in the order of the target replicas: during a reassignment the target replicas first, then those
    being removed (docs/reassignment.md#elections)."""

    def may_lead(replica: int) -> bool:
        return replica in isr and replica in acceptable

    candidates = (replicas[0], current_leader, *replicas[1:]) if election == _PREFERRED else (current_leader, *replicas)
    for candidate in candidates:
        if may_lead(candidate):
            return candidate, False
    if election == _UNCLEAN:
        for replica in replicas:
            if replica in acceptable:
                return replica, True
    return NO_LEADER, False


def _completed_reassignment(
    replicas: Sequence[int], adding: Sequence[int], removing: Sequence[int], isr: Sequence[int]
) -> tuple[list[int], list[int]] | None:
    """Kafka's PartitionReassignmentReplicas.maybeCompleteReassignment: (replicas, ISR) once the reassignment in
    progress is complete, i.e. the ISR without the removed replicas is not empty and holds every target replica;
    None otherwise (docs/reassignment.md#completion)."""
    if not adding and not removing:
        return None
    target_isr = [r for r in isr if r not in removing]
    target_replicas = [r for r in replicas if r not in removing]
    if not target_isr or not target_replicas or not set(target_replicas) <= set(target_isr):
        return None
    return target_replicas, target_isr


def _assign(partition: int, replication_factor: int, nodes: Sequence[int]) -> PartitionRegistration:
    """Round-robin replica placement starting at a different broker for each partition, as Kafka's
    StripedReplicaPlacer does for a single rack; the first replica is the preferred leader."""
    replicas = [nodes[(partition + i) % len(nodes)] for i in range(replication_factor)]
    return PartitionRegistration(replicas=replicas, isr=list(replicas), leader=replicas[0])


def _validate_configs(configs: Mapping[str, str]) -> None:
    for key, value in configs.items():
        try:
            validate_topic_config(key, value)
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None
