"""The cluster metadata image: topics, their ids, partition registrations and config overrides.

Names follow KRaft (`PartitionRegistration`): replicas, ISR, leader, leader epoch and a partition epoch
that every change bumps, so later AlterPartition requests can be compare-and-set against it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tierlog.storage.checkpoints import atomic_write_text

NO_LEADER = -1


@dataclass(slots=True)
class PartitionRegistration:
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0


@dataclass(slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionRegistration]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def is_internal(self) -> bool:
        return self.name.startswith("__")


@dataclass(slots=True)
class ClusterMetadata:
    cluster_id: str
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    # Start of the next block of producer ids handed to a broker (KRaft's ProducerIdsRecord).
    next_producer_id: int = 0

    def to_json(self) -> str:
        topics = [
            {**asdict(t), "topic_id": str(t.topic_id)} for t in sorted(self.topics.values(), key=lambda t: t.name)
        ]
        document = {
            "version": 0,
            "cluster_id": self.cluster_id,
            "next_producer_id": self.next_producer_id,
            "topics": topics,
        }
        return json.dumps(document, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterMetadata:
        data: dict[str, Any] = json.loads(text)
        topics = {}
        for t in data["topics"]:
            topics[t["name"]] = TopicMetadata(
                name=t["name"],
                topic_id=uuid.UUID(t["topic_id"]),
                partitions=[PartitionRegistration(**p) for p in t["partitions"]],
                configs=dict(t["configs"]),
            )
        return cls(cluster_id=data["cluster_id"], topics=topics, next_producer_id=data["next_producer_id"])


class MetadataStore(Protocol):
    """Durable home of the metadata image; a replicated metadata log can stand in for the file."""

    def load(self) -> ClusterMetadata | None: ...

    def save(self, metadata: ClusterMetadata) -> None: ...


class FileMetadataStore:
    """The whole image as one JSON document, replaced atomically on every change (metadata is small and
    changes rarely, so rewriting it is cheaper than keeping a log of deltas)."""

    FILE_NAME = "__tierlog_metadata.json"

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / self.FILE_NAME

    def load(self) -> ClusterMetadata | None:
        if not self.path.exists():
            return None
        try:
            return ClusterMetadata.from_json(self.path.read_text())
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path} is not a valid tierlog metadata file: {e}") from None

    def save(self, metadata: ClusterMetadata) -> None:
        atomic_write_text(self.path, metadata.to_json())
