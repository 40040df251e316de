"""A TransactionCoordinator driven step by step: explicit now_ms, an in-memory __transaction_state, markers and
answers collected."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from group_harness import T0, Appends

from tierlog.common import TopicPartition
from tierlog.coordinator.transaction.records import decode_key, decode_value
from tierlog.coordinator.transaction.transaction_coordinator import (
    InitProducerIdResult,
    ProducerIdAndEpoch,
    TransactionConfig,
    TransactionCoordinator,
    TxnMarkerRequest,
)
from tierlog.coordinator.transaction.transaction_metadata import TransactionMetadata

PARTITIONS = 4
TIMEOUT_MS = 60_000
FIRST_PRODUCER_ID = 1000
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
TP2 = TopicPartition("other", 0)

__all__ = ["T0", "Harness"]
# What `Harness.end` returns while the EndTxn is not answered yet (None is an answer: success).
NO_ANSWER = object()


@dataclass
class Answers:
    init: list[InitProducerIdResult] = field(default_factory=list)
    add: list[dict[TopicPartition, str | None]] = field(default_factory=list)
    end: list[str | None] = field(default_factory=list)


class Harness:
    def __init__(self, **overrides: int) -> None:
        settings: dict[str, int] = {"transaction_state_log_num_partitions": PARTITIONS}
        settings.update(overrides)
        self.config = TransactionConfig(**settings)  # type: ignore[arg-type]
        self.appends = Appends()
        self.appends.clock = lambda: self.now
        self.markers: list[TxnMarkerRequest] = []
        self.producer_ids = itertools.count(FIRST_PRODUCER_ID)
        self.producer_ids_available = True
        self.coordinator = TransactionCoordinator(self.config, self.appends, self.markers.append, self._next_id)
        self.answers = Answers()
        self.now = T0
        self.epoch = 0
        for partition in range(PARTITIONS):
            self.coordinator.on_election(partition, self.epoch)
            self.coordinator.complete_load(partition, self.epoch, [], self.now)

    def _next_id(self) -> int | None:
        return next(self.producer_ids) if self.producer_ids_available else None

    def advance(self, ms: int) -> None:
        """Move the clock and fire every deadline passed on the way, in order, as the shell's timer would."""
        target = self.now + ms
        while (deadline := self.coordinator.next_deadline_ms()) is not None and deadline <= target:
            self.now = max(self.now, deadline)
            self.coordinator.on_timer(self.now)
        self.now = target

    # Requests, answered into self.answers; each returns the last answer when it came at once.

    def init(
        self, txn_id: str | None, timeout_ms: int = TIMEOUT_MS, expected: tuple[int, int] | None = None
    ) -> InitProducerIdResult | None:
        before = len(self.answers.init)
        self.coordinator.handle_init_producer_id(
            txn_id,
            timeout_ms,
            None if expected is None else ProducerIdAndEpoch(*expected),
            self.now,
            self.answers.init.append,
        )
        return self.answers.init[-1] if len(self.answers.init) > before else None

    def add(self, txn_id: str, pid: int, epoch: int, *partitions: TopicPartition) -> dict | None:
        before = len(self.answers.add)
        self.coordinator.handle_add_partitions(txn_id, pid, epoch, partitions, self.now, self.answers.add.append)
        return self.answers.add[-1] if len(self.answers.add) > before else None

    def end(self, txn_id: str, pid: int, epoch: int, commit: bool) -> str | object | None:
        before = len(self.answers.end)
        self.coordinator.handle_end_txn(txn_id, pid, epoch, commit, self.now, self.answers.end.append)
        return self.answers.end[-1] if len(self.answers.end) > before else NO_ANSWER

    def write_markers(self, request: TxnMarkerRequest | None = None) -> None:
        """The shell's marker channel: every partition of the (last) request got its marker."""
        request = request or self.markers[-1]
        self.coordinator.on_markers_written(
            request.transactional_id, request.producer_id, request.producer_epoch, request.coordinator_epoch, self.now
        )

    def metadata(self, txn_id: str) -> TransactionMetadata:
        partition = self.coordinator.partition_for(txn_id)
        return self.coordinator._partitions[partition].transactions[txn_id]

    def producer_ids_of(self, txn_id: str) -> tuple[int, int]:
        md = self.metadata(txn_id)
        return md.producer_id, md.producer_epoch

    def has(self, txn_id: str) -> bool:
        partition = self.coordinator.partition_for(txn_id)
        return txn_id in self.coordinator._partitions[partition].transactions

    def logged(self, txn_id: str) -> list:
        """Every value written for `txn_id`, decoded (None for a tombstone), in order."""
        partition = self.coordinator.partition_for(txn_id)
        return [
            None if value is None else decode_value(value)
            for key, value in self.appends.log.get(partition, [])
            if decode_key(key) == txn_id
        ]

    def begin(self, txn_id: str, *partitions: TopicPartition) -> tuple[int, int]:
        """InitProducerId then AddPartitions: an ongoing transaction; returns (producer id, epoch)."""
        result = self.init(txn_id)
        assert result is not None and result.error is None, result
        answer = self.add(txn_id, result.producer_id, result.producer_epoch, *(partitions or (TP0,)))
        assert answer is not None and set(answer.values()) == {None}, answer
        return result.producer_id, result.producer_epoch

    def reload(self) -> TransactionCoordinator:
        """A new coordinator (a failover): loads every partition from what was appended, at the next epoch."""
        self.epoch += 1
        self.markers.clear()
        coordinator = TransactionCoordinator(self.config, self.appends, self.markers.append, self._next_id)
        for partition in range(PARTITIONS):
            coordinator.on_election(partition, self.epoch)
            coordinator.complete_load(partition, self.epoch, self.appends.log.get(partition, []), self.now)
        self.coordinator = coordinator
        return coordinator
