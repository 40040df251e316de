"""The cluster metadata image: brokers, topics, their ids, partition registrations, config overrides, SCRAM
credentials and ACLs.

The image is the fold of the metadata log: `ClusterMetadata.apply` is the only way it changes, and the
controller and every broker call it with the same records, so their images agree at the same offset.
Names follow KRaft (`BrokerRegistration`, `PartitionRegistration`): a partition's leader epoch bumps on every
leader change and its partition epoch on every change, so AlterPartition can compare-and-set against it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tierlog.metadata.records import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    SCRAM_MECHANISM_NAMES,
    AccessControlEntryRecord,
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

NO_LEADER = -1
_SCRAM_MECHANISMS = {name: mechanism for mechanism, name in SCRAM_MECHANISM_NAMES.items()}


@dataclass(frozen=True, slots=True)
class IsrChange:
    """One partition of an AlterPartition request: the ISR its leader proposes, against the registration it saw."""

    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: Sequence[int]


@dataclass(slots=True)
class PartitionRegistration:
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    # A reassignment in progress (KIP-455, docs/reassignment.md); both empty when none is.
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)


@dataclass(slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionRegistration]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def is_internal(self) -> bool:
        return self.name.startswith("__")


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's SCRAM credential for one mechanism (RFC 5802): what the server keeps instead of the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(slots=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: str
    # The offset of the RegisterBrokerRecord: requests carrying another epoch come from an older incarnation.
    broker_epoch: int
    endpoints: list[Endpoint]
    rack: str | None
    fenced: bool = True
    in_controlled_shutdown: bool = False


@dataclass(slots=True)
class ClusterMetadata:
    cluster_id: str = ""
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    # Dynamic broker configs by resource name: a broker id, or "" for the cluster-wide default.
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # SCRAM credentials by (user name, mechanism name: "SCRAM-SHA-256" or "SCRAM-SHA-512").
    scram_credentials: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)
    # The ACLs by id, as the metadata log holds them (the authorizer indexes them: tierlog/security/authorizer.py).
    acls: dict[uuid.UUID, AccessControlEntryRecord] = field(default_factory=dict)
    # Start of the next block of producer ids handed to a broker.
    next_producer_id: int = 0
    # Offset of the last record applied; -1 before the first.
    offset: int = -1
    # Derived from `topics`, so it takes no part in equality.
    _topics_by_id: dict[uuid.UUID, TopicMetadata] = field(default_factory=dict, init=False, repr=False, compare=False)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        return self._topics_by_id.get(topic_id)

    def unfenced_broker_ids(self) -> list[int]:
        return sorted(broker_id for broker_id, broker in self.brokers.items() if not broker.fenced)

    def endpoint_of(self, broker_id: int, listener_name: str) -> Endpoint | None:
        broker = self.brokers.get(broker_id)
        if broker is None:
            return None
        return next((e for e in broker.endpoints if e.name == listener_name), None)

    def apply(self, offset: int, record: MetadataRecord) -> None:
        """Fold the record at `offset` into the image. A record that does not fit the image (an unknown
        topic or broker) means the log and the image have diverged: ValueError, and the image is unchanged."""
        if offset <= self.offset:
            raise ValueError(f"metadata record at offset {offset} applied after offset {self.offset}")
        self._fold(record, f"at offset {offset}")
        self.offset = offset

    @classmethod
    def from_snapshot(cls, records: Iterable[MetadataRecord], end_offset: int) -> ClusterMetadata:
        """The image a snapshot's records rebuild: that of the log up to `end_offset` (exclusive), the snapshot's
        end. ValueError if a record does not fit, as in `apply`. docs/quorum.md#snapshots."""
        image = cls()
        for position, record in enumerate(records):
            image._fold(record, f"{position} of the snapshot at offset {end_offset}")
        image.offset = end_offset - 1
        return image

    def snapshot_records(self) -> list[MetadataRecord]:
        """The records whose replay into an empty image (`from_snapshot`) rebuilds this one exactly: what a
        snapshot of the metadata log holds (Kafka's MetadataImage.write). docs/quorum.md#snapshots."""
        records: list[MetadataRecord] = []
        if self.cluster_id:
            records.append(ClusterIdRecord(self.cluster_id))
        for broker in sorted(self.brokers.values(), key=lambda b: b.broker_id):
            records.append(
                RegisterBrokerRecord(
                    broker_id=broker.broker_id,
                    incarnation_id=broker.incarnation_id,
                    broker_epoch=broker.broker_epoch,
                    endpoints=tuple(broker.endpoints),
                    rack=broker.rack,
                    fenced=broker.fenced,
                )
            )
            if broker.in_controlled_shutdown:
                records.append(BrokerRegistrationChangeRecord(broker.broker_id, broker.broker_epoch, None, True))
        for resource_name, configs in sorted(self.broker_configs.items()):
            records.extend(
                ConfigRecord(resource_name, name, value, RESOURCE_BROKER) for name, value in sorted(configs.items())
            )
        for topic in sorted(self.topics.values(), key=lambda t: t.name):
            records.append(TopicRecord(topic.name, topic.topic_id))
            records.extend(
                partition_record(topic.topic_id, partition_id, partition)
                for partition_id, partition in enumerate(topic.partitions)
            )
            records.extend(
                ConfigRecord(topic.name, name, value, RESOURCE_TOPIC) for name, value in sorted(topic.configs.items())
            )
        if self.next_producer_id:
            # No broker took this block in the snapshot: Kafka's ProducerIdsImage writes broker id -1 too.
            records.append(ProducerIdsRecord(broker_id=-1, next_producer_id=self.next_producer_id))
        for (user, mechanism_name), credential in sorted(self.scram_credentials.items()):
            records.append(
                UserScramCredentialRecord(
                    name=user,
                    mechanism=_SCRAM_MECHANISMS[mechanism_name],
                    salt=credential.salt,
                    stored_key=credential.stored_key,
                    server_key=credential.server_key,
                    iterations=credential.iterations,
                )
            )
        records.extend(self.acls[acl_id] for acl_id in sorted(self.acls))
        return records

    def _fold(self, record: MetadataRecord, where: str) -> None:
        if isinstance(record, ClusterIdRecord):
            self.cluster_id = record.cluster_id
        elif isinstance(record, RegisterBrokerRecord):
            self.brokers[record.broker_id] = BrokerRegistration(
                broker_id=record.broker_id,
                incarnation_id=record.incarnation_id,
                broker_epoch=record.broker_epoch,
                endpoints=list(record.endpoints),
                rack=record.rack,
                fenced=record.fenced,
            )
        elif isinstance(record, BrokerRegistrationChangeRecord):
            self._apply_broker_change(record)
        elif isinstance(record, UnregisterBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            if broker is None or broker.broker_epoch != record.broker_epoch:
                raise ValueError(
                    f"UnregisterBrokerRecord {where} for broker {record.broker_id} epoch {record.broker_epoch}, "
                    f"but its registration is {broker}"
                )
            del self.brokers[record.broker_id]
        elif isinstance(record, TopicRecord):
            if record.name in self.topics or record.topic_id in self._topics_by_id:
                raise ValueError(f"TopicRecord {where}: topic {record.name} or id {record.topic_id} exists")
            topic = TopicMetadata(name=record.name, topic_id=record.topic_id, partitions=[])
            self.topics[record.name] = topic
            self._topics_by_id[record.topic_id] = topic
        elif isinstance(record, PartitionRecord):
            self._apply_partition(record)
        elif isinstance(record, ConfigRecord):
            self._apply_config(where, record)
        elif isinstance(record, RemoveTopicRecord):
            removed = self._topics_by_id.pop(record.topic_id, None)
            if removed is None:
                raise ValueError(f"RemoveTopicRecord {where} for unknown topic id {record.topic_id}")
            del self.topics[removed.name]
        elif isinstance(record, ProducerIdsRecord):
            self.next_producer_id = record.next_producer_id
        elif isinstance(record, UserScramCredentialRecord):
            self.scram_credentials[(record.name, _scram_mechanism(where, record))] = ScramCredential(
                salt=record.salt,
                stored_key=record.stored_key,
                server_key=record.server_key,
                iterations=record.iterations,
            )
        elif isinstance(record, RemoveUserScramCredentialRecord):
            key = (record.name, _scram_mechanism(where, record))
            if self.scram_credentials.pop(key, None) is None:
                raise ValueError(f"RemoveUserScramCredentialRecord {where} for unknown credential {key}")
        elif isinstance(record, AccessControlEntryRecord):
            if record.id in self.acls:
                raise ValueError(f"AccessControlEntryRecord {where}: ACL id {record.id} exists")
            self.acls[record.id] = record
        elif isinstance(record, RemoveAccessControlEntryRecord):
            if self.acls.pop(record.id, None) is None:
                raise ValueError(f"RemoveAccessControlEntryRecord {where} for unknown ACL id {record.id}")
        else:
            raise ValueError(f"unknown metadata record {where}: {record!r}")

    def _apply_config(self, where: str, record: ConfigRecord) -> None:
        if record.resource_type == RESOURCE_BROKER:
            configs = self.broker_configs.setdefault(record.resource_name, {})
        elif record.resource_type == RESOURCE_TOPIC:
            topic = self.topics.get(record.resource_name)
            if topic is None:
                raise ValueError(f"ConfigRecord {where} for unknown topic {record.resource_name}")
            configs = topic.configs
        else:
            raise ValueError(f"ConfigRecord {where} for resource type {record.resource_type}")
        if record.value is None:
            configs.pop(record.name, None)
        else:
            configs[record.name] = record.value
        if record.resource_type == RESOURCE_BROKER and not configs:
            del self.broker_configs[record.resource_name]

    def dynamic_broker_configs(self, broker_id: int) -> tuple[dict[str, str], dict[str, str]]:
        """(cluster-wide defaults, this broker's own): the two dynamic layers of a broker's configuration."""
        return dict(self.broker_configs.get("", {})), dict(self.broker_configs.get(str(broker_id), {}))

    def _apply_broker_change(self, record: BrokerRegistrationChangeRecord) -> None:
        broker = self.brokers.get(record.broker_id)
        if broker is None or broker.broker_epoch != record.broker_epoch:
            raise ValueError(
                f"BrokerRegistrationChangeRecord for broker {record.broker_id} epoch {record.broker_epoch}, "
                f"but its registration is {broker}"
            )
        if record.fenced is not None:
            broker.fenced = record.fenced
        if record.in_controlled_shutdown is not None:
            broker.in_controlled_shutdown = record.in_controlled_shutdown

    def _apply_partition(self, record: PartitionRecord) -> None:
        topic = self._topics_by_id.get(record.topic_id)
        if topic is None:
            raise ValueError(f"PartitionRecord for unknown topic id {record.topic_id}")
        # A new registration object on every change: whoever holds the previous one keeps a consistent view.
        registration = PartitionRegistration(
            replicas=list(record.replicas),
            isr=list(record.isr),
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            adding_replicas=list(record.adding_replicas),
            removing_replicas=list(record.removing_replicas),
        )
        if record.partition_id < len(topic.partitions):
            topic.partitions[record.partition_id] = registration
        elif record.partition_id == len(topic.partitions):
            topic.partitions.append(registration)
        else:
            raise ValueError(
                f"PartitionRecord for {topic.name}-{record.partition_id}, but the topic has "
                f"{len(topic.partitions)} partitions"
            )


def partition_record(topic_id: uuid.UUID, partition_id: int, registration: PartitionRegistration) -> PartitionRecord:
    """The record that gives a partition this registration (whole, as tierlog writes every change)."""
    return PartitionRecord(
        topic_id=topic_id,
        partition_id=partition_id,
        replicas=tuple(registration.replicas),
        isr=tuple(registration.isr),
        leader=registration.leader,
        leader_epoch=registration.leader_epoch,
        partition_epoch=registration.partition_epoch,
        adding_replicas=tuple(registration.adding_replicas),
        removing_replicas=tuple(registration.removing_replicas),
    )


def _scram_mechanism(where: str, record: UserScramCredentialRecord | RemoveUserScramCredentialRecord) -> str:
    name = SCRAM_MECHANISM_NAMES.get(record.mechanism)
    if name is None:
        raise ValueError(f"{type(record).__name__} {where} for unknown SCRAM mechanism {record.mechanism}")
    return name
