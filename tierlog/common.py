"""Value types shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        # Also the partition's directory name inside a log dir, as in Kafka.
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse_dir_name(cls, name: str) -> TopicPartition:
        """Split a `topic-N` directory name; raises ValueError for anything else."""
        topic, sep, partition = name.rpartition("-")
        if not sep or not topic or not partition.isdigit():
            raise ValueError(f"not a partition directory name: {name!r}")
        return cls(topic, int(partition))


@dataclass(frozen=True, slots=True)
class Idle:
    """What a state machine of the core answers when asked for its next request and it has none: nothing to send
    before `until_ms` (epoch ms) unless an event (a response, new metadata) changes that first."""

    until_ms: int
