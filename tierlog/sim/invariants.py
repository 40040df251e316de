"""What must hold in every simulated run (docs/simulation.md#invariants), checked while it runs and once it
has converged.

During the run, after every event (cheap checks) and every `COMMITTED_CHECK_INTERVAL_MS` (log scans):
- a leader's HW never moves backwards within one leader epoch;
- the controller's leader epochs never go backwards, and a partition never changes leader without a new epoch;
- every replica's leader-epoch cache has strictly increasing epochs and non-decreasing start offsets;
- below its HW, every replica holds the very batches every other replica held there (no offset holds
  different records on different replicas below the HW);
- consumers never read at or above the HW they were sent, never skip an offset, and never see two
  different records at one offset.
After the faults stop and every broker is back, once every ISR is whole and every replica caught up:
- every replica's log is the leader's, batch for batch, and so are the epochs of its leader-epoch cache that
  hold records (a leader records its epoch when elected, a follower only once a batch of it arrives);
- every acknowledged write (acks=all, min.insync.replicas respected) is in the log at the offset it was
  acknowledged with;
- every record a consumer read is still there, at the offset it was read at;
- no value of an idempotent producer is in the log twice (it resends the same batch until acknowledged).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from tierlog.common import TopicPartition
from tierlog.records.codec import decode_batches
from tierlog.records.record_batch import RecordBatchHeader, read_header
from tierlog.replication.partition import Partition
from tierlog.storage.log import Log

COMMITTED_CHECK_INTERVAL_MS = 250
# (base offset, last offset, partition leader epoch, CRC): batches are replicated byte for byte.
BatchIdentity = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    detail: str
    at_ms: int

    def __str__(self) -> str:
        return f"[t={self.at_ms}] {self.rule}: {self.detail}"


@dataclass(slots=True)
class History:
    """What the clients were told, and every rule found broken."""

    now_ms: int = 0
    invocations: int = 0
    # Values sent by idempotent producers: each must be in the log at most once.
    idempotent_values: set[str] = field(default_factory=set)
    acked: dict[tuple[TopicPartition, int], str] = field(default_factory=dict)
    reads: dict[tuple[TopicPartition, int], str] = field(default_factory=dict)
    read_count: int = 0
    violations: list[Violation] = field(default_factory=list)

    def violation(self, rule: str, detail: str) -> None:
        if any(v.rule == rule and v.detail == detail for v in self.violations[-10:]):
            return  # the same finding again, e.g. a consumer retrying against the same short log
        self.violations.append(Violation(rule, detail, self.now_ms))

    def invoked(self, value: str, *, idempotent: bool) -> None:
        self.invocations += 1
        if idempotent:
            self.idempotent_values.add(value)

    def acknowledged(self, tp: TopicPartition, offset: int, value: str, now_ms: int) -> None:
        earlier = self.acked.get((tp, offset))
        if earlier is not None and earlier != value:
            self.violation(
                "acknowledged write lost", f"{tp} offset {offset} acknowledged for {earlier!r}, then for {value!r}"
            )
        self.acked[(tp, offset)] = value

    def read(
        self, consumer: str, tp: TopicPartition, offset: int, value: str, high_watermark: int, expected: int
    ) -> None:
        self.read_count += 1
        if offset != expected:
            self.violation("poll skip", f"{consumer} read {tp} offset {offset} after {expected - 1}")
        if offset >= high_watermark:
            self.violation("read above the HW", f"{consumer} read {tp} offset {offset} with HW {high_watermark}")
        earlier = self.reads.get((tp, offset))
        if earlier is not None and earlier != value:
            self.violation("inconsistent reads", f"{tp} offset {offset} was read as {earlier!r} and later as {value!r}")
        self.reads[(tp, offset)] = value


def log_batches(log: Log, start: int, end: int) -> Iterator[RecordBatchHeader]:
    """Headers of the batches wholly below `end`, from the one holding `start`."""
    offset = start
    while offset < end:
        data = log.read(offset, 1 << 20, max_offset=end, min_one_message=False).records
        if data is None:
            return
        buffer = data.read_bytes()
        position = 0
        while position < len(buffer):
            header = read_header(buffer, position)
            if header.last_offset >= end:
                return
            yield header
            position += header.size_in_bytes
            offset = header.next_offset


def identity(header: RecordBatchHeader) -> BatchIdentity:
    return (header.base_offset, header.last_offset, header.partition_leader_epoch, header.crc)


def _epochs_with_records(log: Log) -> list[tuple[int, int]]:
    return [
        (e.epoch, e.start_offset) for e in log.leader_epoch_cache.epoch_entries() if e.start_offset < log.log_end_offset
    ]


def log_values(log: Log) -> dict[int, str]:
    """Offset -> value of every record in the local log."""
    values: dict[int, str] = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=None, min_one_message=True).records
        if data is None:
            break
        for batch in decode_batches(data.read_bytes()):
            for record in batch.records:
                values[record.offset] = record.value.decode() if record.value is not None else ""
            offset = batch.header.next_offset
    return values


@dataclass(slots=True)
class ClusterChecker:
    history: History
    # Per partition, the batches some replica held below its HW: every replica must agree with them.
    committed: dict[TopicPartition, dict[int, BatchIdentity]] = field(default_factory=dict)
    # Per (broker, incarnation, partition): how far its log was compared with `committed`.
    verified: dict[tuple[int, int, TopicPartition], int] = field(default_factory=dict)
    # Per (broker, incarnation, partition, leader epoch): the highest HW seen while leading.
    leader_high_watermarks: dict[tuple[int, int, TopicPartition, int], int] = field(default_factory=dict)
    # Per partition: (leader epoch, leader) last seen in the controller's image.
    controller_leaders: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)

    def check_partition_step(self, broker_id: int, incarnation: int, partition: Partition) -> None:
        """Cheap rules for one replica, after every event."""
        tp = partition.topic_partition
        log = partition.log
        if log.high_watermark > log.log_end_offset:
            self.history.violation("HW above LEO", f"broker {broker_id} {tp}: HW {log.high_watermark} > LEO")
        entries = log.leader_epoch_cache.epoch_entries()
        for previous, entry in itertools.pairwise(entries):
            if entry.epoch <= previous.epoch or entry.start_offset < previous.start_offset:
                self.history.violation(
                    "leader-epoch cache out of order", f"broker {broker_id} {tp}: {previous} then {entry}"
                )
        if partition.is_leader:
            key = (broker_id, incarnation, tp, partition.leader_epoch)
            highest = self.leader_high_watermarks.get(key, -1)
            if log.high_watermark < highest:
                self.history.violation(
                    "leader HW moved backwards",
                    f"broker {broker_id} {tp} epoch {partition.leader_epoch}: HW {highest} -> {log.high_watermark}",
                )
            else:
                self.leader_high_watermarks[key] = log.high_watermark

    def check_controller_step(self, tp: TopicPartition, leader: int, leader_epoch: int) -> None:
        last = self.controller_leaders.get(tp)
        if last is not None:
            last_epoch, last_leader = last
            if leader_epoch < last_epoch:
                self.history.violation("leader epoch went backwards", f"{tp}: epoch {last_epoch} -> {leader_epoch}")
            elif leader_epoch == last_epoch and leader != last_leader:
                self.history.violation(
                    "leader changed without a new epoch", f"{tp} epoch {leader_epoch}: {last_leader} -> {leader}"
                )
        self.controller_leaders[tp] = (leader_epoch, leader)

    def check_committed(self, broker_id: int, incarnation: int, partition: Partition) -> None:
        """Compare the replica's batches below its HW with what every replica held there before."""
        tp = partition.topic_partition
        log = partition.log
        key = (broker_id, incarnation, tp)
        start = max(self.verified.get(key, 0), log.log_start_offset)
        committed = self.committed.setdefault(tp, {})
        end = start
        for header in log_batches(log, start, log.high_watermark):
            batch = identity(header)
            known = committed.setdefault(header.base_offset, batch)
            if known != batch:
                self.history.violation(
                    "replicas disagree below the HW",
                    f"broker {broker_id} {tp} holds batch {batch} where another replica held {known} "
                    f"(HW {log.high_watermark})",
                )
            end = header.next_offset
        self.verified[key] = max(end, start)

    def check_converged(self, tp: TopicPartition, leader: Partition, replicas: list[Partition]) -> None:
        """After convergence: every replica is the leader's copy; acknowledged and read records are there."""
        leader_log = leader.log
        expected = [
            identity(h) for h in log_batches(leader_log, leader_log.log_start_offset, leader_log.log_end_offset)
        ]
        for replica in replicas:
            log = replica.log
            found = [identity(h) for h in log_batches(log, leader_log.log_start_offset, log.log_end_offset)]
            if found != expected:
                first = next((i for i, (a, b) in enumerate(zip(found, expected, strict=False)) if a != b), None)
                self.history.violation(
                    "replicas differ after convergence",
                    f"{tp} broker {replica.local_broker_id}: {len(found)} batches vs the leader's {len(expected)}, "
                    f"first difference at batch #{first}",
                )
            # A leader records its epoch when elected, a follower once a batch of that epoch arrives, so
            # only the epochs that hold records must agree.
            epochs = _epochs_with_records(log)
            if epochs != _epochs_with_records(leader_log):
                self.history.violation(
                    "leader-epoch caches differ",
                    f"{tp} broker {replica.local_broker_id}: {epochs} vs the leader's "
                    f"{_epochs_with_records(leader_log)}",
                )
        values = log_values(leader_log)
        seen: dict[str, int] = {}
        for offset, value in sorted(values.items()):
            if value in self.history.idempotent_values:
                if value in seen:
                    self.history.violation(
                        "idempotent write duplicated", f"{tp}: {value!r} at offsets {seen[value]} and {offset}"
                    )
                seen[value] = offset
        for offset, value, found_value in _not_in_log(self.history.acked, tp, values):
            self.history.violation(
                "acknowledged write lost",
                f"{tp} offset {offset} was acknowledged for {value!r}; the log holds {found_value!r} "
                f"(log {leader_log.log_start_offset}..{leader_log.log_end_offset})",
            )
        for offset, value, found_value in _not_in_log(self.history.reads, tp, values):
            self.history.violation(
                "a record read is gone", f"{tp} offset {offset} was read as {value!r}; the log holds {found_value!r}"
            )


def _not_in_log(
    told: Mapping[tuple[TopicPartition, int], str], tp: TopicPartition, values: Mapping[int, str]
) -> Iterator[tuple[int, str, str | None]]:
    """Each record of `tp` that clients were told is at an offset (acknowledged or read) where the log holds
    another value or none: its offset, its value and the log's, by offset."""
    for (told_tp, offset), value in sorted(told.items()):
        if told_tp == tp and values.get(offset) != value:
            yield offset, value, values.get(offset)
