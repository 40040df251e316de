"""One partition replica on this broker: its log, its role, and the high-watermark rule (SPEC.md §1).

HW is the first offset not yet known to be on every member of the ISR; consumers read only below it.
The leader moves it with `maybe_increment_leader_hw` after every append and every change of the ISR:
    HW = max(HW, min(LEO of every ISR member))
and never while the ISR is smaller than min(min.insync.replicas, replica count) (Kafka 3.7+), so an
acknowledged acks=all write is never exposed before it is durable on enough replicas.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.controller.metadata import PartitionRegistration
from tierlog.replication.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)
from tierlog.storage.errors import PolicyViolationError
from tierlog.storage.file_records import FileSlice
from tierlog.storage.log import LATEST_TIMESTAMP, MAX_TIMESTAMP, Log, LogAppendInfo

NO_EPOCH = -1
READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class LogReadResult:
    records: FileSlice | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    log_end_offset: int

    @property
    def size(self) -> int:
        return self.records.size if self.records is not None else 0


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    timestamp: int
    leader_epoch: int


class Partition:
    def __init__(self, topic_partition: TopicPartition, topic_id: uuid.UUID, log: Log, local_broker_id: int) -> None:
        self.topic_partition = topic_partition
        self.topic_id = topic_id
        self.log = log
        self.local_broker_id = local_broker_id
        self.leader_id = -1
        self.leader_epoch = NO_EPOCH
        self.partition_epoch = NO_EPOCH
        self.replicas: list[int] = []
        self.isr: list[int] = []

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    def make_leader(self, registration: PartitionRegistration) -> None:
        """Adopt a registration naming this broker leader. A new leader epoch starts at our LEO (SPEC.md §2)."""
        new_epoch = registration.leader_epoch != self.leader_epoch or not self.is_leader
        self.leader_id = registration.leader
        self.leader_epoch = registration.leader_epoch
        self.partition_epoch = registration.partition_epoch
        self.replicas = list(registration.replicas)
        self.isr = list(registration.isr)
        if new_epoch:
            self.log.leader_epoch_cache.assign(self.leader_epoch, self.log.log_end_offset)
        self.maybe_increment_leader_hw()

    def maybe_increment_leader_hw(self) -> bool:
        """Apply the HW rule; returns whether HW moved (delayed fetches may then complete)."""
        if not self.is_leader:
            return False
        min_isr = min(self.log.config.min_insync_replicas, len(self.replicas))
        if len(self.isr) < min_isr:
            return False
        # Only the leader replica exists on a single broker; followers' LEOs join this minimum with replication.
        new_hw = self.log.log_end_offset
        if new_hw > self.log.high_watermark:
            self.log.update_high_watermark(new_hw)
            return True
        return False

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """KIP-320: a client that knows a newer epoch than ours is ahead of us; an older one is fenced."""
        if current_leader_epoch == NO_EPOCH:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic_partition}: request epoch {current_leader_epoch} is older than {self.leader_epoch}"
            )
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{self.topic_partition}: request epoch {current_leader_epoch} is newer than {self.leader_epoch}"
            )

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderOrFollowerError(f"this broker is not the leader of {self.topic_partition}")

    def append_records_to_leader(self, records: bytearray, required_acks: int, now_ms: int) -> LogAppendInfo:
        self._require_leader()
        min_isr = self.log.config.min_insync_replicas
        if required_acks == -1 and len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {len(self.isr)} is insufficient to satisfy the min.isr "
                f"requirement of {min_isr} for partition {self.topic_partition}"
            )
        info = self.log.append_as_leader(records, self.leader_epoch, now_ms)
        self.maybe_increment_leader_hw()
        return info

    def read_records(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        isolation_level: int,
        min_one_message: bool,
        current_leader_epoch: int,
    ) -> LogReadResult:
        self._require_leader()
        self.check_leader_epoch(current_leader_epoch)
        # Without transactions every offset below the HW is stable, so LSO == HW.
        last_stable_offset = self.log.high_watermark
        upper_bound = last_stable_offset if isolation_level == READ_COMMITTED else self.log.high_watermark
        data = self.log.read(fetch_offset, max_bytes, upper_bound, min_one_message)
        return LogReadResult(
            records=data.records,
            high_watermark=self.log.high_watermark,
            last_stable_offset=last_stable_offset,
            log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset,
        )

    def fetch_offset_for_timestamp(
        self, timestamp: int, *, isolation_level: int, current_leader_epoch: int, from_consumer: bool
    ) -> OffsetAndEpoch | None:
        """ListOffsets on the leader. Consumers never see offsets at or above the HW (the LEO for replicas)."""
        self._require_leader()
        self.check_leader_epoch(current_leader_epoch)
        upper = self.log.high_watermark if from_consumer else self.log.log_end_offset
        if timestamp == LATEST_TIMESTAMP:
            return OffsetAndEpoch(upper, -1, self.leader_epoch)
        found = self.log.fetch_offset_by_timestamp(timestamp)
        # A timestamp lookup may land on records consumers cannot see yet; the log start never does.
        searched = timestamp >= 0 or timestamp == MAX_TIMESTAMP
        if found is None or (searched and found.offset >= upper):
            return None
        epoch = NO_EPOCH if found.leader_epoch is None else found.leader_epoch
        return OffsetAndEpoch(found.offset, found.timestamp, epoch)

    def delete_records_on_leader(self, offset: int) -> int:
        """DeleteRecords: move the log start up to `offset` (-1 means the HW); returns the new low watermark."""
        self._require_leader()
        if not self.log.config.delete:
            raise PolicyViolationError(
                f"Records of partition {self.topic_partition} can not be deleted due to the configured policy"
            )
        target = self.log.high_watermark if offset == -1 else offset
        self.log.maybe_increment_log_start_offset(target)
        return self.log.log_start_offset
