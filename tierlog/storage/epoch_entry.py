"""EpochEntry: one (leader epoch, start offset) pair of a partition's leader epoch history, as Kafka's
org.apache.kafka.storage.internals.log.EpochEntry; kept by LeaderEpochFileCache, written by its checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int
