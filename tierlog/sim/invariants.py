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
- no value of an idempotent producer is in the log twice (it resends the same batch until acknowledged);
- no reassignment is left in progress, and no broker outside a partition's replicas holds a replica or a log of
  it (with `reassignments`, partitions move between brokers during the faults).

Transactions (with `SimConfig.transactions`, docs/simulation.md#transactions): a read_committed consumer never
sees a record of an aborted or undecided transaction, nor one at or beyond the LSO (or the HW) of the answer that
carried it; a replica's LSO never exceeds its HW and a leader's never moves back within its leader epoch. After
convergence no transaction is left open (every LSO is its HW), and a read_committed read of each partition from
its start holds every record of every committed transaction, in the order written, none of an aborted one, every
record the consumer read at the offset it read it, and each acknowledged marker at its offset.

The controller quorum (`QuorumChecker`, docs/quorum.md): at most one leader per epoch over the whole run; a
record once committed (below some voter's high watermark, or sent to a broker, which gets committed records only)
is never lost or changed on any voter below its high watermark nor in the converged log; every broker's metadata
is the committed log's, from its start, without gaps; and once a majority of voters is up and connected, an
active leader is among them within `liveness_bound_ms`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from tierlog.common import TopicPartition
from tierlog.controller.metadata_log import read_metadata_snapshot
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import MetadataRecord
from tierlog.raft.messages import RaftFetchResponse
from tierlog.raft.raft_log import RaftLog
from tierlog.records.codec import decode_batches
from tierlog.records.control_batch import ControlRecordType, control_record_type
from tierlog.records.record_batch import RecordBatchHeader, complete_batches, read_header
from tierlog.replication.partition import Partition
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.storage.log import Log
from tierlog.storage.transaction_index import AbortedTxn

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
    # Transactions: each transactional value's transaction, the values each wrote per partition in order, how
    # each was decided (True: commit; absent: not yet), the partitions whose marker was acknowledged, and what
    # the read_committed consumers read.
    txn_of_value: dict[str, str] = field(default_factory=dict)
    txn_writes: dict[str, dict[TopicPartition, list[str]]] = field(default_factory=dict)
    txn_decisions: dict[str, bool] = field(default_factory=dict)
    txn_markers: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    committed_reads: dict[tuple[TopicPartition, int], str] = field(default_factory=dict)

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

    def txn_written(self, txn: str, tp: TopicPartition, values: list[str]) -> None:
        """A transactional batch of `txn` to `tp` is about to be sent (its values in order)."""
        self.txn_writes.setdefault(txn, {}).setdefault(tp, []).extend(values)
        for value in values:
            self.txn_of_value[value] = txn
            self.invoked(value, idempotent=True)

    def txn_decided(self, txn: str, committed: bool) -> None:
        self.txn_decisions[txn] = committed

    def txn_marker_acknowledged(self, txn: str, tp: TopicPartition, offset: int) -> None:
        self.txn_markers.setdefault(txn, {})[tp] = offset

    def read_committed(
        self, consumer: str, tp: TopicPartition, offset: int, value: str, last_stable_offset: int, high_watermark: int
    ) -> None:
        """A record a read_committed consumer was handed, with the LSO and HW of the answer that carried it."""
        self.read_count += 1
        if offset >= last_stable_offset:
            self.violation(
                "read_committed beyond the LSO", f"{consumer} read {tp} offset {offset} with LSO {last_stable_offset}"
            )
        if offset >= high_watermark:
            self.violation("read above the HW", f"{consumer} read {tp} offset {offset} with HW {high_watermark}")
        txn = self.txn_of_value.get(value)
        if txn is not None and not self.txn_decisions.get(txn, False):
            what = "aborted" if txn in self.txn_decisions else "undecided"
            self.violation(
                f"read_committed saw an {what} transaction",
                f"{consumer} read {value!r} of {txn} at {tp} offset {offset}",
            )
        earlier = self.committed_reads.get((tp, offset))
        if earlier is not None and earlier != value:
            self.violation("inconsistent reads", f"{tp} offset {offset} was read as {earlier!r} and later as {value!r}")
        self.committed_reads[(tp, offset)] = value


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


def aborted_index(log: Log) -> list[AbortedTxn]:
    """Every entry of the log's `.txnindex` files, in segment order."""
    return [txn for segment in log.segments for txn in segment.txn_index.all_aborted_txns()]


def log_markers(log: Log) -> dict[int, bool]:
    """Offset -> COMMIT (True) or ABORT (False) of every transaction marker in the local log."""
    markers: dict[int, bool] = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=None, min_one_message=True).records
        if data is None:
            break
        for batch in decode_batches(data.read_bytes()):
            if batch.header.is_control and batch.records:
                type_id = control_record_type(batch.records[0].key)
                markers[batch.header.base_offset] = type_id == ControlRecordType.COMMIT
            offset = batch.header.next_offset
    return markers


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
    # Per (broker, incarnation, partition, leader epoch): the highest LSO seen while leading.
    leader_stable_offsets: dict[tuple[int, int, TopicPartition, int], int] = field(default_factory=dict)

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
        last_stable_offset = log.last_stable_offset
        if last_stable_offset > log.high_watermark:
            self.history.violation(
                "LSO above the HW", f"broker {broker_id} {tp}: LSO {last_stable_offset} > HW {log.high_watermark}"
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
            # A read_committed consumer has read up to the LSO: the leader must not take it back.
            highest = self.leader_stable_offsets.get(key, -1)
            if last_stable_offset < highest:
                self.history.violation(
                    "leader LSO moved backwards",
                    f"broker {broker_id} {tp} epoch {partition.leader_epoch}: LSO {highest} -> {last_stable_offset}",
                )
            else:
                self.leader_stable_offsets[key] = last_stable_offset

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

    def check_transactions_converged(
        self,
        tp: TopicPartition,
        leader: Partition,
        replicas: list[Partition],
        committed_read: list[tuple[int, str]],
        markers: Mapping[int, bool],
    ) -> None:
        """After convergence, with `committed_read` a read_committed read of the leader from its log start (offset,
        value) and `markers` its control batches (offset -> COMMIT or not): no transaction is left open, every
        committed transaction whose markers were acknowledged is there whole and in the order written, nothing of
        an aborted one is, every record a read_committed consumer read is there at its offset, and every
        acknowledged marker is at its offset with its transaction's decision. Every replica's aborted transaction
        index is the leader's, entry for entry (lastStableOffset included: docs/transactions.md#txn-index), whether it
        appended the markers as a follower, rebuilt them in a recovery or truncated them."""
        history = self.history
        log = leader.log
        expected = aborted_index(log)
        for replica in replicas:
            found = aborted_index(replica.log)
            if found != expected:
                first = next((i for i, (a, b) in enumerate(zip(found, expected, strict=False)) if a != b), None)
                detail = "" if first is None else f": {found[first]} where the leader has {expected[first]}"
                history.violation(
                    "aborted transaction indexes differ",
                    f"{tp} broker {replica.local_broker_id}: {len(found)} entries vs the leader's {len(expected)}"
                    + detail,
                )
        if log.last_stable_offset != log.high_watermark:
            history.violation(
                "transaction left open",
                f"{tp}: LSO {log.last_stable_offset} below HW {log.high_watermark} after every transaction ended",
            )
        offsets: dict[str, list[int]] = {}
        values = dict(committed_read)
        for offset, value in committed_read:
            offsets.setdefault(value, []).append(offset)
        for value, found in offsets.items():
            txn = history.txn_of_value.get(value)
            if txn is None:
                continue
            if len(found) > 1:
                history.violation("transactional write duplicated", f"{tp}: {value!r} at offsets {found}")
            if not history.txn_decisions.get(txn, False):
                what = "aborted" if txn in history.txn_decisions else "undecided"
                history.violation(
                    f"read_committed saw an {what} transaction", f"final read of {tp}: {value!r} of {txn} at {found}"
                )
        for txn, writes in sorted(history.txn_writes.items()):
            written = writes.get(tp, [])
            acknowledged = history.txn_markers.get(txn, {})
            if not history.txn_decisions.get(txn, False) or set(acknowledged) != set(writes) or not written:
                continue
            missing = [v for v in written if v not in offsets]
            if missing:
                history.violation(
                    "committed transaction lost",
                    f"{tp}: {len(missing)} of the {len(written)} records of {txn} are not read_committed, "
                    f"first {missing[0]!r} (marker acknowledged at {acknowledged[tp]})",
                )
                continue
            positions = [offsets[v][0] for v in written]
            if positions != sorted(positions):
                history.violation("committed transaction out of order", f"{tp}: {txn} at offsets {positions}")
        for (read_tp, offset), value in sorted(history.committed_reads.items()):
            if read_tp == tp and values.get(offset) != value:
                history.violation(
                    "a record read is gone",
                    f"{tp} offset {offset} was read_committed as {value!r}; the final read has {values.get(offset)!r}",
                )
        for txn, acknowledged in sorted(history.txn_markers.items()):
            offset = acknowledged.get(tp)
            if offset is not None and markers.get(offset) != history.txn_decisions.get(txn):
                history.violation(
                    "acknowledged marker lost",
                    f"{tp} offset {offset}: the marker of {txn} (commit: {history.txn_decisions.get(txn)}) is not "
                    f"there (found commit: {markers.get(offset)})",
                )

    def check_no_replica(self, broker_id: int, tp: TopicPartition, replica_manager: ReplicaManager | None) -> None:
        """After convergence: a broker the partition's replicas do not list holds no replica nor log of it (one
        a reassignment removed is deleted, docs/reassignment.md)."""
        if replica_manager is None:
            return
        if tp in replica_manager.partitions or replica_manager.log_manager.get_log(tp) is not None:
            self.history.violation("replica left behind", f"{tp} still on broker {broker_id}, not one of its replicas")


def _not_in_log(
    told: Mapping[tuple[TopicPartition, int], str], tp: TopicPartition, values: Mapping[int, str]
) -> Iterator[tuple[int, str, str | None]]:
    """Each record of `tp` that clients were told is at an offset (acknowledged or read) where the log holds
    another value or none: its offset, its value and the log's, by offset."""
    for (told_tp, offset), value in sorted(told.items()):
        if told_tp == tp and values.get(offset) != value:
            yield offset, value, values.get(offset)


def raft_log_batches(log: RaftLog, start: int, end: int) -> Iterator[RecordBatchHeader]:
    """Headers of the batches of a Raft log wholly below `end`, from the one holding `start`."""
    offset = start
    while offset < end:
        data = log.read(offset, 1 << 20, max_offset=end)
        headers = [read_header(data, position) for position, _ in complete_batches(data)]
        if not headers:
            return
        for header in headers:
            if header.last_offset >= end:
                return
            yield header
            offset = header.next_offset


@dataclass(slots=True)
class QuorumChecker:
    """The controller quorum's rules (docs/quorum.md), fed by the simulator with what each voter and each broker
    holds."""

    history: History
    # controller.quorum.*: within this much of a majority of voters being up and connected, one must lead.
    liveness_bound_ms: int
    # The voter that led each epoch.
    leaders: dict[int, int] = field(default_factory=dict)
    # Base offset -> the batch committed there: below some voter's high watermark, or sent to a broker.
    committed: dict[int, BatchIdentity] = field(default_factory=dict)
    # Per (voter, incarnation): how far its log below its high watermark was compared with `committed`.
    verified: dict[tuple[int, int], int] = field(default_factory=dict)
    # Per (voter, incarnation): the highest high watermark seen.
    high_watermarks: dict[tuple[int, int], int] = field(default_factory=dict)
    # Since when a majority of voters has been up and connected with none of them the active leader.
    leaderless_since_ms: int | None = None
    # End offset -> the records of the first snapshot seen ending there (written by a voter or loaded by a broker).
    snapshots: dict[int, list[MetadataRecord]] = field(default_factory=dict)
    # Per voter: the end offset of the latest snapshot of its log already checked.
    checked_snapshots: dict[int, int] = field(default_factory=dict)

    def check_voter_step(
        self, voter_id: int, incarnation: int, epoch: int, is_leader: bool, high_watermark: int | None
    ) -> None:
        """Cheap rules for one voter, after every event."""
        if is_leader:
            leader = self.leaders.setdefault(epoch, voter_id)
            if leader != voter_id:
                self.history.violation("two leaders in one epoch", f"voters {leader} and {voter_id} led epoch {epoch}")
        if high_watermark is not None:
            key = (voter_id, incarnation)
            highest = self.high_watermarks.get(key, -1)
            if high_watermark < highest:
                self.history.violation(
                    "quorum HW moved backwards", f"voter {voter_id}: high watermark {highest} -> {high_watermark}"
                )
            else:
                self.high_watermarks[key] = high_watermark

    def check_voter_log(self, voter_id: int, incarnation: int, log: RaftLog, high_watermark: int | None) -> None:
        """Record the batches below the voter's high watermark as committed; each must be the one committed there
        before."""
        if high_watermark is None:
            return
        key = (voter_id, incarnation)
        start = max(self.verified.get(key, 0), log.start_offset)
        end = start
        for header in raft_log_batches(log, start, high_watermark):
            self._committed(f"voter {voter_id} (HW {high_watermark})", identity(header))
            end = header.next_offset
        self.verified[key] = max(end, start)

    def check_voter_snapshot(self, voter_id: int, log: RaftLog) -> None:
        """The voter's latest snapshot (its own or fetched from the leader), once per snapshot."""
        snapshot_id = log.snapshots.latest_id()
        if snapshot_id is None or self.checked_snapshots.get(voter_id) == snapshot_id.offset:
            return
        snapshot = read_metadata_snapshot(log)
        assert snapshot is not None
        self.checked_snapshots[voter_id] = snapshot_id.offset
        self.check_snapshot(f"voter {voter_id}", snapshot.end_offset, snapshot.records)

    def check_snapshot(self, holder: str, end_offset: int, records: list[MetadataRecord]) -> None:
        """Every snapshot ending at one offset holds the same image: it is the committed log folded to there,
        whichever voter folded it and whoever fetched it."""
        known = self.snapshots.setdefault(end_offset, records)
        if known != records:
            self.history.violation(
                "snapshots at one offset differ",
                f"{holder}'s snapshot at offset {end_offset} ({len(records)} records) is not the one seen before "
                f"({len(known)} records)",
            )

    def check_observer_fetch(
        self, observer: str, fetch_offset: int, response: RaftFetchResponse, headers: list[RecordBatchHeader]
    ) -> None:
        """A broker's metadata: committed records only (below the leader's high watermark), from the offset it
        asked for without a gap, never an order to truncate (docs/quorum.md: observers read committed records)."""
        if response.diverging_epoch is not None:
            self.history.violation(
                "broker told to truncate its metadata", f"{observer} at {fetch_offset}: {response.diverging_epoch}"
            )
        expected = fetch_offset
        for header in headers:
            if not header.base_offset <= expected <= header.last_offset:
                self.history.violation(
                    "broker metadata has a gap",
                    f"{observer} fetched at {fetch_offset} and got a batch {header.base_offset}..{header.last_offset} "
                    f"where {expected} was next",
                )
            if header.last_offset >= response.high_watermark:
                self.history.violation(
                    "broker got uncommitted metadata",
                    f"{observer}: batch {header.base_offset}..{header.last_offset} with the leader's HW "
                    f"{response.high_watermark}",
                )
            self._committed(f"{observer} (from voter {response.leader_id})", identity(header))
            expected = header.next_offset

    def _committed(self, holder: str, batch: BatchIdentity) -> None:
        known = self.committed.setdefault(batch[0], batch)
        if known != batch:
            self.history.violation(
                "committed metadata changed", f"{holder} holds batch {batch} where {known} was committed"
            )

    def check_liveness(self, now_ms: int, majority_connected: bool, active_leader: bool) -> None:
        """Called regularly with whether a majority of voters is up and connected and whether one of them is the
        active leader."""
        if not majority_connected or active_leader:
            self.leaderless_since_ms = None
        elif self.leaderless_since_ms is None:
            self.leaderless_since_ms = now_ms
        elif now_ms - self.leaderless_since_ms > self.liveness_bound_ms:
            self.history.violation(
                "no active controller",
                f"a majority of voters up and connected for {now_ms - self.leaderless_since_ms} ms and none leads "
                f"(bound {self.liveness_bound_ms} ms)",
            )
            self.leaderless_since_ms = now_ms

    def check_converged(self, leader_id: int, logs: Mapping[int, RaftLog]) -> None:
        """After convergence: every voter's log is the leader's batch for batch, and it holds every batch ever
        committed."""
        leader_log = logs[leader_id]
        # Each voter's log starts at its own latest snapshot: compare from the latest start.
        start = max(log.start_offset for log in logs.values())
        expected = [identity(h) for h in raft_log_batches(leader_log, start, leader_log.end_offset)]
        for voter_id, log in logs.items():
            found = [identity(h) for h in raft_log_batches(log, start, log.end_offset)]
            if found != expected:
                self.history.violation(
                    "voters' logs differ after convergence",
                    f"voter {voter_id}: {len(found)} batches vs the leader's ({leader_id}) {len(expected)}",
                )
        held = {batch[0]: batch for batch in expected}
        for base_offset, batch in sorted(self.committed.items()):
            if base_offset >= start and held.get(base_offset) != batch:
                self.history.violation(
                    "committed metadata lost",
                    f"batch {batch} was committed; the converged log holds {held.get(base_offset)}",
                )

    def check_final_image(
        self,
        holder: str,
        image: ClusterMetadata,
        base: ClusterMetadata,
        committed_records: list[tuple[int, MetadataRecord]],
    ) -> None:
        """A broker's or a voter's image, whether it replayed the log or loaded a snapshot on the way, is the
        committed log's: `base` (the leader's latest snapshot, or empty) and the committed records after it,
        applied up to the image's offset. Compared as snapshot records: an image loaded from a snapshot ends at
        the snapshot's end, a replayed one at its last record, with the same content."""
        if image.offset < base.offset:
            # A replayed image's offset is its last metadata record's; only control batches (LeaderChangeMessages)
            # may follow that record up to the snapshot's end, so a whole image is the snapshot's.
            if image.snapshot_records() != base.snapshot_records():
                self.history.violation(
                    "metadata behind the log start",
                    f"{holder}'s image at offset {image.offset} lacks records of the snapshot ending at "
                    f"{base.offset + 1}",
                )
            return
        replayed = ClusterMetadata.from_snapshot(base.snapshot_records(), base.offset + 1)
        for offset, record in committed_records:
            if offset > image.offset:
                break
            replayed.apply(offset, record)
        if replayed.snapshot_records() != image.snapshot_records():
            self.history.violation(
                "metadata is not the committed log's",
                f"{holder}'s image at offset {image.offset} differs from the committed records replayed to there",
            )
