"""The controller: the only writer of cluster metadata.

Every change is validated first, applied to a copy of the image, persisted, and only then made visible,
so a crash never leaves a half-made topic behind. A single node is both broker and controller for now;
the replication issue puts brokers and a metadata log behind this same interface.
"""

from __future__ import annotations

import base64
import copy
import re
import uuid
from collections.abc import Callable, Mapping, Sequence

from tierlog.controller.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicDeletionDisabledError,
    TopicExistsError,
    UnknownTopicError,
)
from tierlog.controller.metadata import ClusterMetadata, MetadataStore, PartitionRegistration, TopicMetadata
from tierlog.storage.log_config import validate_topic_config

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_PARTITIONS = 100_000
PRODUCER_ID_BLOCK_SIZE = 1000


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


class Controller:
    def __init__(self, store: MetadataStore, node_ids: Callable[[], Sequence[int]]) -> None:
        self._store = store
        self._node_ids = node_ids
        loaded = store.load()
        if loaded is None:
            loaded = ClusterMetadata(cluster_id=_new_cluster_id())
            store.save(loaded)
        self._show(loaded)

    def _commit(self, changed: ClusterMetadata) -> None:
        self._store.save(changed)
        self._show(changed)

    def _show(self, metadata: ClusterMetadata) -> None:
        self.metadata = metadata
        self._topics_by_id = {topic.topic_id: topic for topic in metadata.topics.values()}

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        """Fetch v13+ names topics by id; the index is rebuilt on every (rare) metadata change."""
        return self._topics_by_id.get(topic_id)

    def topic(self, name: str) -> TopicMetadata | None:
        return self.metadata.topics.get(name)

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
    ) -> TopicMetadata:
        validate_topic_name(name)
        if name in self.metadata.topics:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        colliding = [t for t in self.metadata.topics if t.replace(".", "_") == name.replace(".", "_")]
        if colliding:
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {colliding[0]}")
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"Number of partitions must be larger than 0 (got {num_partitions}).")
        nodes = sorted(self._node_ids())
        if replication_factor < 1:
            raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
        if replication_factor > len(nodes):
            raise InvalidReplicationFactorError(
                f"Unable to replicate the partition {replication_factor} time(s): "
                f"The target replication factor of {replication_factor} cannot be reached because only "
                f"{len(nodes)} broker(s) are registered."
            )
        for key, value in configs.items():
            try:
                validate_topic_config(key, value)
            except ValueError as e:
                raise InvalidConfigError(str(e)) from None
        topic = TopicMetadata(
            name=name,
            topic_id=uuid.uuid4(),
            partitions=[_assign(p, replication_factor, nodes) for p in range(num_partitions)],
            configs=dict(configs),
        )
        if not validate_only:
            changed = copy.deepcopy(self.metadata)
            changed.topics[name] = topic
            self._commit(changed)
        return topic

    def delete_topic(self, name: str, *, deletion_enabled: bool = True) -> TopicMetadata:
        if not deletion_enabled:
            raise TopicDeletionDisabledError("Topic deletion is disabled (delete.topic.enable=false).")
        topic = self.metadata.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        changed = copy.deepcopy(self.metadata)
        del changed.topics[name]
        self._commit(changed)
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
        nodes = sorted(self._node_ids())
        replication_factor = len(topic.partitions[0].replicas)
        changed = copy.deepcopy(self.metadata)
        grown = changed.topics[name]
        grown.partitions.extend(_assign(p, replication_factor, nodes) for p in range(current, total))
        if not validate_only:
            self._commit(changed)
        return grown

    def alter_topic_configs(
        self, name: str, new_configs: Mapping[str, str], *, validate_only: bool = False
    ) -> TopicMetadata:
        """Replace the topic's overrides with `new_configs` (the caller has applied SET/DELETE/APPEND)."""
        topic = self.metadata.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        for key, value in new_configs.items():
            try:
                validate_topic_config(key, value)
            except ValueError as e:
                raise InvalidConfigError(str(e)) from None
        changed = copy.deepcopy(self.metadata)
        changed.topics[name].configs = dict(new_configs)
        if not validate_only:
            self._commit(changed)
        return changed.topics[name]

    def allocate_producer_id_block(self) -> range:
        """A block of producer ids no other broker or earlier run ever receives: the block is persisted as
        taken before it is handed out, so a crash can only skip ids, never reuse them."""
        changed = copy.deepcopy(self.metadata)
        start = changed.next_producer_id
        changed.next_producer_id = start + PRODUCER_ID_BLOCK_SIZE
        self._commit(changed)
        return range(start, start + PRODUCER_ID_BLOCK_SIZE)


def _assign(partition: int, replication_factor: int, nodes: Sequence[int]) -> PartitionRegistration:
    """Round-robin replica placement starting at a different broker for each partition, as Kafka's
    StripedReplicaPlacer does for a single rack; the first replica is the preferred leader."""
    replicas = [nodes[(partition + i) % len(nodes)] for i in range(replication_factor)]
    return PartitionRegistration(replicas=replicas, isr=list(replicas), leader=replicas[0])


def _new_cluster_id() -> str:
    # Kafka's cluster ids are random UUIDs in URL-safe base64 without padding (22 characters).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
