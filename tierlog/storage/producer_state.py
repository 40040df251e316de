"""Kafka's ProducerStateManager: per producer id, the epoch and the last batches an idempotent producer wrote.

Invariants kept here, as in Kafka:
- a producer's entry holds its epoch and up to NUM_BATCHES_TO_RETAIN of its latest batches (sequence range,
  offsets, timestamp): the producer may have that many requests in flight, so a retry of any of them is
  recognised as a duplicate and answered with the offsets it was first written at;
- `map_end_offset` is the offset up to which the entries reflect the log (exclusive); a snapshot file
  `<map end offset, 20 digits>.snapshot` holds the entries as of its offset, so recovery loads the latest
  snapshot and replays only the batch headers after it;
- producers live until `producer.id.expiration.ms` after their last write, not until their batches leave the
  log (KIP-360), so deleting segments removes only their snapshots; a producer with an ongoing transaction
  never expires here (the transaction coordinator aborts it after its timeout);
- transactions (docs/transactions.md#producer-state): a producer's first transactional batch opens its
  transaction at that batch's offset (`current_txn_first_offset`), its COMMIT or ABORT marker closes it. The
  open ones are the ongoing transactions; closed ones whose marker is not yet below the high watermark are
  the unreplicated ones. The first unstable offset is the lowest first offset of either: nothing at or
  after it may be read by a read_committed consumer.
Nothing here reads a clock: `now_ms` comes in as an argument.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from crc32c import crc32c

from tierlog.common import TopicPartition
from tierlog.records.control_batch import ControlRecordType, EndTxnMarker, read_end_txn_marker
from tierlog.records.record_batch import NO_PRODUCER_ID, RecordBatchHeader
from tierlog.storage.checkpoints import atomic_write_bytes
from tierlog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
PRODUCER_SNAPSHOT_FILE_SUFFIX = ".snapshot"
PRODUCER_SNAPSHOT_VERSION = 1

# Kafka's ProducerSnapshot (version 1, not flexible): version int16 | crc uint32 | entry count int32 | entries.
# The CRC32C covers everything after the crc field.
_SNAPSHOT_HEADER = struct.Struct(">hIi")
_CRC_START = 6
# ProducerId int64, Epoch int16, LastSequence int32, LastOffset int64, OffsetDelta int32, Timestamp int64,
# CoordinatorEpoch int32, CurrentTxnFirstOffset int64.
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")

logger = logging.getLogger(__name__)


class CorruptSnapshotError(Exception):
    """Kafka's CorruptSnapshotException: a snapshot file that cannot be read; it is deleted and the state
    rebuilt from the log."""


class AppendOrigin(Enum):
    """Who appends: a client's batches get every check; a coordinator's (transaction markers, transactional
    offset commits) the producer and coordinator epochs' but no sequence checks; the leader's batches on a
    follower only a warning for an old epoch."""

    CLIENT = "client"
    COORDINATOR = "coordinator"
    REPLICATION = "replication"


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from Int32 max to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def last_sequence_of(header: RecordBatchHeader) -> int:
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return increment_sequence(header.base_sequence, header.last_offset_delta)


def end_txn_marker_of(records: bytes | bytearray | memoryview, header: RecordBatchHeader) -> EndTxnMarker | None:
    """The transaction marker of a producer's control batch at `header.position` in `records`; None for a data
    batch or a control batch the log cleaner emptied (docs/transactions.md#producer-state)."""
    if not header.is_control or header.producer_id == NO_PRODUCER_ID or header.records_count == 0:
        return None
    with memoryview(records) as view:
        return read_end_txn_marker(view[header.position : header.position + header.size_in_bytes], header)


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """Kafka's CompletedTxn: a producer's transaction from its first offset to its marker at `last_offset`."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(slots=True)
class TxnMetadata:
    """Kafka's TxnMetadata: a transaction's first offset, and its marker's offset once it has one."""

    producer_id: int
    first_offset: int
    last_offset: int | None = None


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Kafka's BatchMetadata: one batch a producer wrote."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class ProducerStateEntry:
    """Kafka's ProducerStateEntry: a producer's epoch and its latest batches, oldest first."""

    __slots__ = (
        "batch_metadata",
        "coordinator_epoch",
        "current_txn_first_offset",
        "last_timestamp",
        "producer_epoch",
        "producer_id",
    )

    def __init__(
        self,
        producer_id: int,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        coordinator_epoch: int = -1,
        last_timestamp: int = -1,
        batch_metadata: Iterable[BatchMetadata] = (),
        current_txn_first_offset: int | None = None,
    ) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.coordinator_epoch = coordinator_epoch
        self.last_timestamp = last_timestamp
        self.batch_metadata: deque[BatchMetadata] = deque(batch_metadata, maxlen=NUM_BATCHES_TO_RETAIN)
        # The offset of the producer's first batch in its ongoing transaction; None outside a transaction.
        self.current_txn_first_offset = current_txn_first_offset

    @property
    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def first_seq(self) -> int:
        return self.batch_metadata[0].first_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batch_metadata[-1].offset_delta if self.batch_metadata else 0

    def copy(self, *, with_batches: bool = True) -> ProducerStateEntry:
        return ProducerStateEntry(
            self.producer_id,
            self.producer_epoch,
            self.coordinator_epoch,
            self.last_timestamp,
            self.batch_metadata if with_batches else (),
            self.current_txn_first_offset,
        )

    def add_batch(
        self, producer_epoch: int, last_seq: int, last_offset: int, offset_delta: int, timestamp: int
    ) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self.batch_metadata.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        # A new epoch starts a new sequence space: the old epoch's batches can no longer be duplicates.
        if self.producer_epoch == producer_epoch:
            return False
        self.batch_metadata.clear()
        self.producer_epoch = producer_epoch
        return True

    def update(self, next_entry: ProducerStateEntry) -> None:
        self.maybe_update_producer_epoch(next_entry.producer_epoch)
        self.batch_metadata.extend(next_entry.batch_metadata)
        self.coordinator_epoch = next_entry.coordinator_epoch
        self.current_txn_first_offset = next_entry.current_txn_first_offset
        self.last_timestamp = next_entry.last_timestamp

    def end_transaction(self, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> None:
        """A marker: the transaction is over, the marker's epochs are the producer's and coordinator's."""
        self.maybe_update_producer_epoch(producer_epoch)
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = None
        self.last_timestamp = timestamp

    def find_duplicate_batch(self, header: RecordBatchHeader) -> BatchMetadata | None:
        """The retained batch with the same epoch and exactly the same sequence range, if any."""
        if header.producer_epoch != self.producer_epoch:
            return None
        first_seq, last_seq = header.base_sequence, last_sequence_of(header)
        for metadata in self.batch_metadata:
            if metadata.first_seq == first_seq and metadata.last_seq == last_seq:
                return metadata
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateEntry):
            return NotImplemented
        return (
            self.producer_id,
            self.producer_epoch,
            self.coordinator_epoch,
            self.last_timestamp,
            list(self.batch_metadata),
            self.current_txn_first_offset,
        ) == (
            other.producer_id,
            other.producer_epoch,
            other.coordinator_epoch,
            other.last_timestamp,
            list(other.batch_metadata),
            other.current_txn_first_offset,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(producer_id={self.producer_id}, producer_epoch={self.producer_epoch}, "
            f"current_txn_first_offset={self.current_txn_first_offset}, coordinator_epoch={self.coordinator_epoch}, "
            f"last_timestamp={self.last_timestamp}, batch_metadata={list(self.batch_metadata)})"
        )


class ProducerAppendInfo:
    """Kafka's ProducerAppendInfo: validates one producer's batches of an append against its state after the
    last successful append, and accumulates the entry that `ProducerStateManager.update` installs once the
    batches are written. Nothing changes if a check fails."""

    def __init__(
        self, topic_partition: TopicPartition, producer_id: int, current_entry: ProducerStateEntry, origin: AppendOrigin
    ) -> None:
        self.topic_partition = topic_partition
        self.producer_id = producer_id
        self._current_entry = current_entry
        self._origin = origin
        self.updated_entry = current_entry.copy(with_batches=False)
        # The transactions this append opens, installed as ongoing by ProducerStateManager.update.
        self.started_transactions: list[TxnMetadata] = []

    def append(
        self, header: RecordBatchHeader, first_offset: int, last_offset: int, marker: EndTxnMarker | None = None
    ) -> CompletedTxn | None:
        """Check a batch written at [first_offset, last_offset] and add it to the updated entry. A control batch
        comes with its marker (None for one the log cleaner emptied: its transaction is gone from the log);
        the transaction the marker ends is returned, if it wrote anything here."""
        if header.is_control:
            if marker is None:
                return None
            return self.append_end_txn_marker(marker, header.producer_epoch, first_offset, header.max_timestamp)
        self.append_data_batch(header, first_offset, last_offset)
        return None

    def append_data_batch(self, header: RecordBatchHeader, first_offset: int, last_offset: int) -> None:
        epoch = header.producer_epoch
        self._check_producer_epoch(epoch, first_offset)
        if self._origin is AppendOrigin.CLIENT:
            self._check_sequence(epoch, header.base_sequence, first_offset)
        updated = self.updated_entry
        offset_delta = last_offset - first_offset
        updated.add_batch(epoch, last_sequence_of(header), last_offset, offset_delta, header.max_timestamp)
        in_transaction = updated.current_txn_first_offset is not None
        if in_transaction and not header.is_transactional:
            raise InvalidTxnStateError(
                f"Expected transactional write from producer {self.producer_id} at offset {first_offset} in "
                f"partition {self.topic_partition}"
            )
        if not in_transaction and header.is_transactional:
            updated.current_txn_first_offset = first_offset
            self.started_transactions.append(TxnMetadata(self.producer_id, first_offset))

    def append_end_txn_marker(
        self, marker: EndTxnMarker, producer_epoch: int, offset: int, timestamp: int
    ) -> CompletedTxn | None:
        """Kafka's appendEndTxnMarker (docs/transactions.md#marker-checks): the producer's epoch may not go back
        and the coordinator's neither; a marker ending no transaction here completes nothing."""
        self._check_producer_epoch(producer_epoch, offset)
        self._check_coordinator_epoch(marker, offset)
        updated = self.updated_entry
        completed = None
        if updated.current_txn_first_offset is not None:
            completed = CompletedTxn(
                self.producer_id,
                updated.current_txn_first_offset,
                offset,
                marker.control_type == ControlRecordType.ABORT,
            )
        updated.end_transaction(producer_epoch, marker.coordinator_epoch, timestamp)
        return completed

    def _check_coordinator_epoch(self, marker: EndTxnMarker, offset: int) -> None:
        current = self.updated_entry.coordinator_epoch
        if current <= marker.coordinator_epoch:
            return
        if self._origin is AppendOrigin.REPLICATION:
            logger.info(
                "Detected invalid coordinator epoch for producerId %d at offset %d in partition %s: %d is older "
                "than previously known coordinator epoch %d",
                self.producer_id,
                offset,
                self.topic_partition,
                marker.coordinator_epoch,
                current,
            )
            return
        raise TransactionCoordinatorFencedError(
            f"Invalid coordinator epoch for producerId {self.producer_id} at offset {offset} in partition "
            f"{self.topic_partition}: {marker.coordinator_epoch} (zombie), {current} (current)"
        )

    def _check_producer_epoch(self, producer_epoch: int, offset: int) -> None:
        current = self.updated_entry.producer_epoch
        if producer_epoch >= current:
            return
        message = (
            f"Epoch of producer {self.producer_id} at offset {offset} in {self.topic_partition} is {producer_epoch}, "
            f"which is smaller than the last seen epoch {current}"
        )
        if self._origin is AppendOrigin.REPLICATION:
            # The leader accepted it; a follower copies the log as it is.
            logger.warning(message)
            return
        raise InvalidProducerEpochError(message)

    def _check_sequence(self, producer_epoch: int, append_first_seq: int, offset: int) -> None:
        updated, current = self.updated_entry, self._current_entry
        if producer_epoch != updated.producer_epoch:
            if append_first_seq != 0 and updated.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"Invalid sequence number for new epoch of producer {self.producer_id} at offset {offset} in "
                    f"partition {self.topic_partition}: {producer_epoch} (request epoch), {append_first_seq} "
                    f"(seq. number), {updated.producer_epoch} (current producer epoch)"
                )
            return
        if not updated.is_empty:
            current_last_seq = updated.last_seq
        elif producer_epoch == current.producer_epoch:
            current_last_seq = current.last_seq
        else:
            current_last_seq = NO_SEQUENCE
        # A producer whose state is gone (expired, or its batches removed) may continue at any sequence.
        if current.producer_epoch == NO_PRODUCER_EPOCH or _in_sequence(current_last_seq, append_first_seq):
            return
        raise OutOfOrderSequenceError(
            f"Out of order sequence number for producer {self.producer_id} at offset {offset} in partition "
            f"{self.topic_partition}: {append_first_seq} (incoming seq. number), {current_last_seq} (current end "
            "sequence number)"
        )


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True, slots=True)
class ProducerStateManagerConfig:
    """Kafka's ProducerStateManagerConfig (broker setting producer.id.expiration.ms)."""

    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS


def producer_snapshot_file(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{PRODUCER_SNAPSHOT_FILE_SUFFIX}"


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """A snapshot file's bytes, exactly as Kafka's ProducerStateManager.writeSnapshot lays them out."""
    body = [
        _SNAPSHOT_ENTRY.pack(
            entry.producer_id,
            entry.producer_epoch,
            entry.last_seq,
            entry.last_data_offset,
            entry.last_offset_delta,
            entry.last_timestamp,
            entry.coordinator_epoch,
            -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
        )
        for entry in entries
    ]
    tail = struct.pack(">i", len(body)) + b"".join(body)
    return struct.pack(">hI", PRODUCER_SNAPSHOT_VERSION, crc32c(tail)) + tail


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Kafka's readSnapshot; raises CorruptSnapshotError for a bad version, CRC or layout."""
    if len(data) < _SNAPSHOT_HEADER.size:
        raise CorruptSnapshotError(f"Snapshot is {len(data)} bytes, shorter than its header")
    version, crc, count = _SNAPSHOT_HEADER.unpack_from(data)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"Snapshot contained an unknown file version {version}")
    computed = crc32c(data[_CRC_START:])
    if crc != computed:
        raise CorruptSnapshotError(
            f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. Computed crc: {computed}"
        )
    if count < 0 or len(data) != _SNAPSHOT_HEADER.size + count * _SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(f"Snapshot failed schema validation: {count} entries in {len(data)} bytes")
    entries = []
    for fields in _SNAPSHOT_ENTRY.iter_unpack(data[_SNAPSHOT_HEADER.size :]):
        producer_id, epoch, seq, offset, offset_delta, timestamp, coordinator_epoch, txn_first_offset = fields
        batches = [BatchMetadata(seq, offset, offset_delta, timestamp)] if offset >= 0 else []
        entries.append(
            ProducerStateEntry(
                producer_id,
                epoch,
                coordinator_epoch,
                timestamp,
                batches,
                txn_first_offset if txn_first_offset >= 0 else None,
            )
        )
    return entries


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    return decode_snapshot(path.read_bytes())


def write_snapshot(path: Path, entries: Iterable[ProducerStateEntry]) -> None:
    """Written atomically: a crash leaves the previous snapshot or this one, never a torn file."""
    atomic_write_bytes(path, encode_snapshot(entries))


def list_snapshot_offsets(directory: Path) -> list[int]:
    offsets = []
    for path in directory.iterdir():
        name = path.name
        if name.endswith(PRODUCER_SNAPSHOT_FILE_SUFFIX) and name[:1].isdigit() and path.is_file():
            offsets.append(int(name[: -len(PRODUCER_SNAPSHOT_FILE_SUFFIX)]))
    return sorted(offsets)


class ProducerStateManager:
    def __init__(
        self,
        topic_partition: TopicPartition,
        log_dir: Path,
        config: ProducerStateManagerConfig | None = None,
    ) -> None:
        self.topic_partition = topic_partition
        self.log_dir = log_dir
        self.config = config or ProducerStateManagerConfig()
        self._producers: dict[int, ProducerStateEntry] = {}
        # Transactions by first offset, each dict in ascending key order: those without a marker yet, and those
        # whose marker is at or above the high watermark.
        self._ongoing_txns: dict[int, TxnMetadata] = {}
        self._unreplicated_txns: dict[int, TxnMetadata] = {}
        self._snapshots: list[int] = list_snapshot_offsets(log_dir)
        self._last_map_offset = 0
        self._last_snap_offset = 0

    # State

    @property
    def map_end_offset(self) -> int:
        return self._last_map_offset

    @property
    def active_producers(self) -> dict[int, ProducerStateEntry]:
        return dict(self._producers)

    @property
    def is_empty(self) -> bool:
        return not self._producers and not self._unreplicated_txns

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction without a marker or whose marker is not yet below the
        high watermark; None if there is none (docs/transactions.md#lso)."""
        firsts = [next(iter(txns)) for txns in (self._ongoing_txns, self._unreplicated_txns) if txns]
        return min(firsts) if firsts else None

    @property
    def ongoing_transactions(self) -> list[TxnMetadata]:
        return list(self._ongoing_txns.values())

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The last stable offset once `completed` is: the first offset of the earliest other producer's
        ongoing transaction, or just past the marker (Kafka's lastStableOffset(CompletedTxn), the value an
        aborted transaction's index entry records). Transactions that begin after the marker do not count:
        a follower appending many batches at once has them installed already, and Kafka, counting them,
        records a later LSO than its leader did, with which a search of the index stops too early
        (docs/transactions.md#txn-index)."""
        for txn in self._ongoing_txns.values():
            if txn.first_offset > completed.last_offset:
                break
            if txn.producer_id != completed.producer_id:
                return txn.first_offset
        return completed.last_offset + 1

    def complete_txn(self, completed: CompletedTxn) -> None:
        """The marker of `completed` is in the log: its transaction waits for the high watermark to pass it."""
        txn = self._ongoing_txns.pop(completed.first_offset, None)
        if txn is None:
            raise ValueError(
                f"Attempted to complete transaction {completed} on partition {self.topic_partition} which was not "
                "started"
            )
        txn.last_offset = completed.last_offset
        _insert_sorted(self._unreplicated_txns, completed.first_offset, txn)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        self._remove_unreplicated_transactions(high_watermark)

    def _remove_unreplicated_transactions(self, offset: int) -> None:
        for first_offset, txn in list(self._unreplicated_txns.items()):
            if txn.last_offset is not None and txn.last_offset < offset:
                del self._unreplicated_txns[first_offset]

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def prepare_update(self, producer_id: int, origin: AppendOrigin) -> ProducerAppendInfo:
        current = self._producers.get(producer_id) or ProducerStateEntry(producer_id)
        return ProducerAppendInfo(self.topic_partition, producer_id, current, origin)

    def update(self, append_info: ProducerAppendInfo) -> None:
        if append_info.producer_id == NO_PRODUCER_ID:
            raise ValueError(
                f"Invalid producer id {append_info.producer_id} passed to update for {self.topic_partition}"
            )
        current = self._producers.get(append_info.producer_id)
        if current is None:
            self._producers[append_info.producer_id] = append_info.updated_entry
        else:
            current.update(append_info.updated_entry)
        for txn in append_info.started_transactions:
            _insert_sorted(self._ongoing_txns, txn.first_offset, txn)

    def update_map_end_offset(self, offset: int) -> None:
        self._last_map_offset = offset

    def load_producer_entry(self, entry: ProducerStateEntry) -> None:
        self._producers[entry.producer_id] = entry
        if entry.current_txn_first_offset is not None:
            offset = entry.current_txn_first_offset
            _insert_sorted(self._ongoing_txns, offset, TxnMetadata(entry.producer_id, offset))

    def _is_producer_expired(self, now_ms: int, entry: ProducerStateEntry) -> bool:
        return (
            entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp >= self.config.producer_id_expiration_ms
        )

    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle for producer.id.expiration.ms, except those in a transaction; returns how many."""
        expired = [pid for pid, entry in self._producers.items() if self._is_producer_expired(now_ms, entry)]
        for pid in expired:
            del self._producers[pid]
        return len(expired)

    # Snapshots

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    @property
    def latest_snapshot_offset(self) -> int | None:
        return self._snapshots[-1] if self._snapshots else None

    def fetch_snapshot(self, offset: int) -> Path | None:
        """The snapshot file at exactly `offset`, if there is one (tiered storage copies it with the segment
        that ends just below it)."""
        return producer_snapshot_file(self.log_dir, offset) if offset in self._snapshots else None

    def take_snapshot(self) -> Path | None:
        """Write the entries at the map end offset, unless a snapshot is already there."""
        if self._last_map_offset <= self._last_snap_offset:
            return None
        offset = self._last_map_offset
        path = producer_snapshot_file(self.log_dir, offset)
        write_snapshot(path, self._producers.values())
        if offset not in self._snapshots:
            self._snapshots.append(offset)
            self._snapshots.sort()
        self._last_snap_offset = offset
        return path

    def remove_stray_snapshots(self, segment_base_offsets: Iterable[int]) -> None:
        """Kafka's removeStraySnapshots: delete snapshots that match no segment's base offset, except the
        latest one if it is past every segment base (the one a clean shutdown writes at the LEO)."""
        bases = set(segment_base_offsets)
        self._snapshots = list_snapshot_offsets(self.log_dir)
        strays = [offset for offset in self._snapshots if offset not in bases]
        keep = strays[-1] if strays and (not bases or strays[-1] > max(bases)) else None
        for offset in strays:
            if offset != keep:
                self._remove_and_delete_snapshot(offset)

    def delete_snapshots_before(self, offset: int) -> None:
        for snapshot in [s for s in self._snapshots if s < offset]:
            self._remove_and_delete_snapshot(snapshot)

    def remove_and_delete_snapshot(self, offset: int) -> None:
        self._remove_and_delete_snapshot(offset)

    def _remove_and_delete_snapshot(self, offset: int) -> None:
        if offset in self._snapshots:
            self._snapshots.remove(offset)
        producer_snapshot_file(self.log_dir, offset).unlink(missing_ok=True)

    # Truncation and loading

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> None:
        """Drop snapshots outside (log start, log end] and, unless the entries already end at `log_end_offset`,
        reload them from the latest remaining snapshot; the caller replays the log from `map_end_offset`."""
        for offset in list(self._snapshots):
            if offset > log_end_offset or offset <= log_start_offset:
                self._remove_and_delete_snapshot(offset)
        if log_end_offset != self._last_map_offset:
            self._producers.clear()
            self._ongoing_txns.clear()
            # The offset truncated to is at or below the high watermark: every marker left is below it too.
            self._unreplicated_txns.clear()
            self._load_from_snapshot(log_start_offset, now_ms)
        else:
            self.on_log_start_offset_incremented(log_start_offset)

    def _load_from_snapshot(self, log_start_offset: int, now_ms: int) -> None:
        while self._snapshots:
            offset = self._snapshots[-1]
            path = producer_snapshot_file(self.log_dir, offset)
            try:
                entries = read_snapshot(path)
            except (CorruptSnapshotError, FileNotFoundError) as e:
                logger.warning("Failed to load producer snapshot from '%s': %s", path, e)
                self._remove_and_delete_snapshot(offset)
                continue
            for entry in entries:
                if not self._is_producer_expired(now_ms, entry):
                    self.load_producer_entry(entry)
            self._last_snap_offset = self._last_map_offset = offset
            return
        self._last_snap_offset = self._last_map_offset = log_start_offset

    def load_snapshot_bytes(self, data: bytes, offset: int, now_ms: int) -> None:
        """Kafka's BuildingRemoteLogAuxState: adopt a snapshot fetched from the remote tier as this log's state
        at `offset`, written here under its offset and loaded. Raises CorruptSnapshotError for an unreadable
        one, before anything changes."""
        entries = decode_snapshot(data)
        self.truncate_fully_and_start_at(offset)
        target = producer_snapshot_file(self.log_dir, offset)
        write_snapshot(target, entries)
        self._snapshots = [offset]
        for entry in entries:
            if not self._is_producer_expired(now_ms, entry):
                self.load_producer_entry(entry)
        self._last_snap_offset = self._last_map_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """Producers outlive their batches (they expire by time), so only the offsets move, and transactions
        whose marker went with the removed offsets are no longer unreplicated."""
        self._remove_unreplicated_transactions(log_start_offset)
        self._last_map_offset = max(self._last_map_offset, log_start_offset)
        latest = self.latest_snapshot_offset
        self._last_snap_offset = latest if latest is not None else log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._producers.clear()
        self._ongoing_txns.clear()
        self._unreplicated_txns.clear()
        for snapshot in list(self._snapshots):
            self._remove_and_delete_snapshot(snapshot)
        self._last_snap_offset = 0
        self._last_map_offset = offset

    # Replay

    def load_producers_from_batches(self, batches: Iterable[tuple[RecordBatchHeader, EndTxnMarker | None]]) -> None:
        """Kafka's loadProducersFromRecords: rebuild entries and transactions from batches already in the log,
        each with its marker if it is a control batch (no checks but the epochs', as for replication)."""
        updated: dict[int, ProducerAppendInfo] = {}
        completed: list[CompletedTxn] = []
        for header, marker in batches:
            producer_id = header.producer_id
            if producer_id == NO_PRODUCER_ID:
                continue
            info = updated.get(producer_id)
            if info is None:
                info = updated[producer_id] = self.prepare_update(producer_id, AppendOrigin.REPLICATION)
            txn = info.append(header, header.base_offset, header.last_offset, marker)
            if txn is not None:
                completed.append(txn)
        for info in updated.values():
            self.update(info)
        for txn in completed:
            self.complete_txn(txn)


def _insert_sorted(txns: dict[int, TxnMetadata], first_offset: int, txn: TxnMetadata) -> None:
    """Add to a dict kept in ascending key order; appends come in offset order, so a re-sort is rare (a snapshot's
    entries load in producer order)."""
    last = next(reversed(txns), None)
    txns[first_offset] = txn
    if last is not None and first_offset < last:
        ordered = sorted(txns.items())
        txns.clear()
        txns.update(ordered)
