"""Kafka's log cleaner (LogCleaner, Cleaner, LogCleanerManager): compaction of `cleanup.policy=compact` logs.

A pass picks the dirtiest compacted log (`grab_filthiest_compacted_log`), cleans it (`CleaningTask.run`) and
swaps the result in (`complete`). The middle step only reads closed segments through descriptors of its own
and writes new `.cleaned` files, so the shell may run it on a worker thread; the other two touch the Log and
run on the event loop. Nothing here reads a clock or starts a thread.

The rules, as in Kafka:
- the dirty part of a log runs from the `cleaner-offset-checkpoint` entry (clamped to the log start) to the
  first uncleanable offset: the segment holding min(last stable offset, active segment, first segment younger
  than min.compaction.lag.ms); a log is cleaned once its dirty bytes exceed
  min.cleanable.dirty.ratio of it, or at once when max.compaction.lag.ms has passed for its oldest dirty
  record;
- the offset map holds key -> latest offset over the dirty part, bounded by log.cleaner.dedupe.buffer.size;
  when it fills, this pass cleans only up to the last offset it mapped;
- every closed segment from the log start up to that offset is rewritten, in groups that fit segment.bytes:
  a record stays iff its offset is >= the map's offset for its key; offsets never change, batches keep their
  base offset, last offset delta, producer fields, leader epoch, codec and record timestamps; a batch left
  without records goes unless it is its producer's last (kept empty, for idempotence);
- transactions (docs/transactions.md#compaction): the batches of aborted transactions go (their keys are not
  mapped either); a transaction marker stays while a batch of its transaction does, then gets a delete
  horizon and goes at the first cleaning at or after it (cleaned_transactions.py); the cleaned segment's
  transaction index holds the aborted transactions whose markers it keeps;
- a tombstone's batch gets a delete horizon (now + delete.retention.ms) when first cleaned (KIP-534) and the
  tombstone is removed by the first cleaning at or after it;
- the new segment is written as `.cleaned`, renamed `.swap`, the old ones renamed `.deleted`, then `.swap`
  renamed into place (Log.replace_segments); Log.open completes or undoes a swap a crash interrupted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tierlog.common import TopicPartition
from tierlog.records.codec import RawRecord, decode_raw_records, encode_raw_batch
from tierlog.records.record_batch import (
    NO_PRODUCER_ID,
    RecordBatchHeader,
    batch_size_at,
    read_header,
    validate_batch,
)
from tierlog.storage.checkpoints import OffsetCheckpointFile
from tierlog.storage.cleaned_transactions import CleanedTransactionMetadata
from tierlog.storage.file_records import scan_batches
from tierlog.storage.log_config import LogConfig
from tierlog.storage.offset_map import BYTES_PER_ENTRY, OffsetMap
from tierlog.storage.segment import CLEANED_FILE_SUFFIX, LogSegment
from tierlog.storage.transaction_index import AbortedTxn

if TYPE_CHECKING:
    from tierlog.storage.log import Log
    from tierlog.storage.log_manager import LogManager

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT_FILENAME = "cleaner-offset-checkpoint"
INT32_MAX = 2**31 - 1
_OFFSET_INDEX_ENTRY_SIZE = 8
_TIME_INDEX_ENTRY_SIZE = 12


class LogCleaningAbortedError(Exception):
    """The clean was given up: the broker is stopping, or the log changed under it. Nothing was swapped."""


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """Kafka's CleanerConfig, from the broker's log.cleaner.* settings (Kafka's defaults)."""

    num_threads: int = 1
    dedupe_buffer_size: int = 134_217_728
    dedupe_buffer_load_factor: float = 0.9
    io_buffer_size: int = 524_288
    backoff_ms: int = 15_000
    enable_cleaner: bool = True

    @property
    def offset_map_memory(self) -> int:
        """Each cleaner thread's share of the dedupe buffer, capped at 2 GiB as Kafka caps it."""
        return min(self.dedupe_buffer_size // self.num_threads, INT32_MAX)


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A compacted log and its cleanable range: [first_dirty_offset, first_uncleanable_offset)."""

    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int

    @property
    def topic_partition(self) -> TopicPartition:
        return self.log.topic_partition

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def need_compaction_now(self) -> bool:
        return self.max_compaction_delay_ms > 0


@dataclass(slots=True)
class CleanerStats:
    """What one clean did (Kafka's CleanerStats), for the log line and the /metrics counters."""

    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    messages_written: int = 0
    invalid_messages: int = 0
    segments_cleaned: int = 0


def _segments_overlapping(log: Log, start: int, end: int) -> list[LogSegment]:
    """Kafka's LogSegments.values(from, to): the segment holding `start` and every later one below `end`."""
    if start >= end:
        return []
    segments = log.segments
    result = []
    for index, segment in enumerate(segments):
        next_base = segments[index + 1].base_offset if index + 1 < len(segments) else None
        if segment.base_offset >= end:
            break
        if next_base is not None and next_base <= start:
            continue
        result.append(segment)
    return result


def cleanable_offsets(log: Log, last_clean_offset: int | None, now_ms: int) -> tuple[int, int, bool]:
    """Kafka's LogCleanerManager.cleanableOffsets: (first dirty offset, first uncleanable offset, whether the
    checkpoint must be rewritten because it was out of the log's range)."""
    log_start_offset = log.log_start_offset
    first_dirty = log_start_offset if last_clean_offset is None else last_clean_offset
    force_update = False
    if first_dirty < log_start_offset:
        first_dirty, force_update = log_start_offset, last_clean_offset is not None
    elif first_dirty > log.log_end_offset:
        # Ahead of the log end: the tail was lost (a crash, a truncation the cleaner missed); clean it all.
        logger.warning(
            "The last checkpoint dirty offset for partition %s is %d, which is larger than the log end offset %d. "
            "Resetting to the log start offset %d.",
            log.topic_partition,
            first_dirty,
            log.log_end_offset,
            log_start_offset,
        )
        first_dirty, force_update = log_start_offset, True
    active = log.active_segment
    # Never past an undecided transaction (docs/transactions.md#compaction): whether its batches stay is unknown.
    candidates = [log.last_stable_offset, active.base_offset]
    min_compaction_lag_ms = max(log.config.min_compaction_lag_ms, 0)
    if min_compaction_lag_ms > 0:
        for segment in _segments_overlapping(log, first_dirty, active.base_offset):
            if segment.largest_timestamp > now_ms - min_compaction_lag_ms:
                candidates.append(segment.base_offset)
                break
    return first_dirty, min(candidates), force_update


def calculate_cleanable_bytes(log: Log, first_dirty_offset: int, uncleanable_offset: int) -> tuple[int, int]:
    """Kafka's calculateCleanableBytes: the first uncleanable offset rounded down to its segment's base, and
    the bytes of the segments from the first dirty one up to it."""
    segments = log.segments
    first_uncleanable_segment = segments[-1]
    for index, segment in enumerate(segments[:-1]):
        if segments[index + 1].base_offset > uncleanable_offset:
            first_uncleanable_segment = segment
            break
    first_uncleanable = first_uncleanable_segment.base_offset
    cleanable = _segments_overlapping(log, min(first_dirty_offset, first_uncleanable), first_uncleanable)
    return first_uncleanable, sum(segment.size for segment in cleanable)


def max_compaction_delay(log: Log, first_dirty_offset: int, now_ms: int) -> int:
    """Kafka's maxCompactionDelay: how far past max.compaction.lag.ms the oldest dirty batch is (0 if not)."""
    dirty = _segments_overlapping(log, first_dirty_offset, log.active_segment.base_offset)
    timestamps = [t for t in (_first_batch_timestamp(segment) for segment in dirty) if t > 0]
    earliest = min(timestamps, default=None)
    clean_until = now_ms - max(log.config.max_compaction_lag_ms, 0)
    return clean_until - earliest if earliest is not None and earliest < clean_until else 0


def _first_batch_timestamp(segment: LogSegment) -> int:
    first = next(scan_batches(segment.file.fileno(), 0, segment.size), None)
    return -1 if first is None else first.max_timestamp


class LogCleanerManager:
    """Which logs need cleaning, which are being cleaned, and the `cleaner-offset-checkpoint` of each log
    dir (where each compacted log's clean part ends)."""

    def __init__(self, log_dirs: Sequence[Path]) -> None:
        self._log_dirs = [Path(d) for d in log_dirs]
        # tp -> (log dir, offset where the clean part ends)
        self._checkpoints: dict[TopicPartition, tuple[Path, int]] = {}
        for log_dir in self._log_dirs:
            for tp, offset in OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT_FILENAME).read().items():
                self._checkpoints[tp] = (log_dir, offset)
        # The Log each checkpoint describes (an entry read from the file is adopted by the first log seen
        # for it), so a topic deleted and created again under the same name starts dirty.
        self._owners: dict[TopicPartition, Log] = {}
        self.in_progress: set[TopicPartition] = set()
        # Kafka's uncleanable partitions: a clean failed on bad data; skipped until the broker restarts.
        self.uncleanable: set[TopicPartition] = set()
        self.dirtiest_log_cleanable_ratio = 0.0
        self.max_compaction_delay_ms = 0

    def checkpoint(self, tp: TopicPartition) -> int | None:
        entry = self._checkpoints.get(tp)
        return None if entry is None else entry[1]

    def _last_clean_offset(self, log: Log) -> int | None:
        tp = log.topic_partition
        owner = self._owners.get(tp)
        self._owners[tp] = log
        if owner is not None and owner is not log and self._checkpoints.pop(tp, None) is not None:
            self._write_checkpoint_file(log.dir.parent)
        truncated_to = log.take_truncation_point()
        checkpoint = self.checkpoint(tp)
        if truncated_to is not None and checkpoint is not None and checkpoint > truncated_to:
            # Kafka's maybeTruncateCheckpoint: the offsets from the truncation point on are new and dirty.
            self._update_checkpoint(log, checkpoint := truncated_to)
        return checkpoint

    def grab_filthiest_compacted_log(self, logs: Sequence[Log], now_ms: int) -> LogToClean | None:
        """The compacted log with the largest dirty ratio among those over min.cleanable.dirty.ratio or past
        max.compaction.lag.ms, marked in progress; None if no log needs cleaning."""
        dirty: list[LogToClean] = []
        for log in logs:
            tp = log.topic_partition
            # Kafka refuses remote storage on compacted topics: a copied segment must never change.
            if not log.config.compact or log.remote_log_enabled or tp in self.in_progress or tp in self.uncleanable:
                continue
            first_dirty, uncleanable, force_update = cleanable_offsets(log, self._last_clean_offset(log), now_ms)
            if force_update:
                self._update_checkpoint(log, first_dirty)
            first_uncleanable, cleanable_bytes = calculate_cleanable_bytes(log, first_dirty, uncleanable)
            clean_bytes = sum(segment.size for segment in _segments_overlapping(log, -1, first_dirty))
            candidate = LogToClean(
                log,
                first_dirty,
                first_uncleanable,
                clean_bytes,
                cleanable_bytes,
                max_compaction_delay(log, first_dirty, now_ms),
            )
            if candidate.total_bytes > 0:
                dirty.append(candidate)
        self.dirtiest_log_cleanable_ratio = max((ltc.cleanable_ratio for ltc in dirty), default=0.0)
        self.max_compaction_delay_ms = max((ltc.max_compaction_delay_ms for ltc in dirty), default=0)
        cleanable = [
            ltc
            for ltc in dirty
            if (ltc.need_compaction_now and ltc.cleanable_bytes > 0)
            or ltc.cleanable_ratio > ltc.log.config.min_cleanable_dirty_ratio
        ]
        if not cleanable:
            return None
        filthiest = max(cleanable, key=lambda ltc: ltc.cleanable_ratio)
        self.in_progress.add(filthiest.topic_partition)
        return filthiest

    def done_cleaning(self, log: Log, end_offset: int) -> None:
        """The clean of `log` is swapped in up to `end_offset`: checkpoint it and release the log."""
        self.in_progress.discard(log.topic_partition)
        self._owners[log.topic_partition] = log
        self._update_checkpoint(log, end_offset)

    def abort_cleaning(self, tp: TopicPartition) -> None:
        self.in_progress.discard(tp)

    def _update_checkpoint(self, log: Log, offset: int) -> None:
        self._checkpoints[log.topic_partition] = (log.dir.parent, offset)
        self._write_checkpoint_file(log.dir.parent)

    def _write_checkpoint_file(self, log_dir: Path) -> None:
        entries = {tp: offset for tp, (directory, offset) in self._checkpoints.items() if directory == log_dir}
        OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT_FILENAME).write(entries)

    def remove_deleted_logs(self, log_manager: LogManager) -> None:
        """Forget the checkpoints of partitions no longer on this broker (Kafka updates the file when a log
        is deleted)."""
        live = {log.topic_partition for log in log_manager.all_logs()}
        gone = [tp for tp in self._checkpoints if tp not in live]
        for tp in gone:
            log_dir, _ = self._checkpoints.pop(tp)
            self._owners.pop(tp, None)
            self._write_checkpoint_file(log_dir)


# The clean itself


@dataclass(frozen=True, slots=True)
class _SegmentSource:
    """A segment as the worker reads it: a descriptor of its own (valid even after the segment is renamed
    `.deleted` or closed) and the size it had when the clean began."""

    base_offset: int
    size: int
    fd: int
    last_modified_ns: int
    offset_index_bytes: int
    time_index_bytes: int


@dataclass(slots=True)
class CleanedGroup:
    old_segments: list[LogSegment]
    old_sizes: list[int]
    new_segment: LogSegment


@dataclass(slots=True)
class CleanResult:
    end_offset: int
    groups: list[CleanedGroup]
    stats: CleanerStats

    def discard(self) -> None:
        """Remove the `.cleaned` segments of a clean that will not be swapped in."""
        for group in self.groups:
            group.new_segment.delete()
        self.groups.clear()


@dataclass
class CleaningTask:
    """One clean of one log, prepared on the event loop (`prepare`), run anywhere (`run`)."""

    to_clean: LogToClean
    directory: Path
    config: LogConfig
    cleaner_config: CleanerConfig
    now_ms: int
    segments: list[LogSegment]
    sources: list[_SegmentSource]
    # producer id -> (last offset of its last data batch, or None if it has none; its epoch), for each
    # producer the log's producer state still holds (Kafka's lastRecordsOfActiveProducers): the batches
    # compaction keeps even when it empties them.
    last_batches: dict[int, tuple[int | None, int]]
    # The aborted transactions overlapping each source's offsets, and the dirty range's (for the offset map):
    # read from the transaction indexes on the event loop, before the clean runs elsewhere.
    source_aborted_txns: list[list[AbortedTxn]]
    dirty_aborted_txns: list[AbortedTxn]
    stats: CleanerStats = field(default_factory=CleanerStats)

    @classmethod
    def prepare(cls, to_clean: LogToClean, cleaner_config: CleanerConfig, now_ms: int) -> CleaningTask:
        log = to_clean.log
        sources: list[_SegmentSource] = []
        segments = log.segments
        cleanable: list[LogSegment] = []
        try:
            for segment in segments[:-1]:
                if segment.base_offset >= to_clean.first_uncleanable_offset:
                    break
                fd = os.open(segment.log_path, os.O_RDONLY)
                sources.append(
                    _SegmentSource(
                        segment.base_offset,
                        segment.size,
                        fd,
                        os.fstat(fd).st_mtime_ns,
                        segment.offset_index.entries * _OFFSET_INDEX_ENTRY_SIZE,
                        segment.time_index.entries * _TIME_INDEX_ENTRY_SIZE,
                    )
                )
                cleanable.append(segment)
        except OSError:
            for source in sources:
                os.close(source.fd)
            raise
        last_batches = {
            producer_id: (entry.last_data_offset if entry.last_data_offset >= 0 else None, entry.producer_epoch)
            for producer_id, entry in log.producer_state_manager.active_producers.items()
        }
        # Every source has a next segment (the active one is never cleaned): its range ends there. One search
        # over all of them finds every transaction overlapping any one's range (a search stops only where no
        # later aborted transaction can start inside its range), so each is a filter of it.
        ends = [segments[index + 1].base_offset for index in range(len(cleanable))]
        aborted = log.collect_aborted_transactions(cleanable[0].base_offset, ends[-1]) if cleanable else []
        source_aborted_txns = [
            _overlapping(aborted, segment.base_offset, end) for segment, end in zip(cleanable, ends, strict=True)
        ]
        dirty_aborted_txns = _overlapping(aborted, to_clean.first_dirty_offset, to_clean.first_uncleanable_offset)
        return cls(
            to_clean,
            log.dir,
            log.config,
            cleaner_config,
            now_ms,
            cleanable,
            sources,
            last_batches,
            source_aborted_txns,
            dirty_aborted_txns,
        )

    def close(self) -> None:
        for source in self.sources:
            os.close(source.fd)
        self.sources = []

    def run(self, check_done: Callable[[], None]) -> CleanResult:
        """Kafka's Cleaner.doClean: map the dirty range, then rewrite the segments below the mapped end into
        `.cleaned` segments. `check_done` (called before each batch) raises LogCleaningAbortedError to stop."""
        try:
            offset_map = OffsetMap(self.cleaner_config.offset_map_memory)
            if self._build_offset_map(offset_map, check_done):
                # Kafka's OffsetMap.put moves latestOffset too, so a map full in mid-batch still advances.
                end_offset = offset_map.latest_offset + 1
            else:
                # The whole dirty range is mapped: all of it is clean after this pass, gaps at its end
                # included (a replica of a compacted log may lack the offsets below the next segment).
                end_offset = self.to_clean.first_uncleanable_offset
            groups: list[CleanedGroup] = []
            # One walk over the log's front across all groups: a transaction may span segments.
            transactions = CleanedTransactionMetadata()
            try:
                for indexes in group_segments_by_size(
                    [s for s in self.sources if s.base_offset < end_offset],
                    self.config.segment_bytes,
                    self.config.segment_index_bytes,
                    self.to_clean.first_uncleanable_offset,
                ):
                    check_done()
                    group = [self.sources[i] for i in indexes]
                    new_segment = self._clean_segments(indexes, offset_map, transactions, check_done)
                    groups.append(
                        CleanedGroup(
                            [self.segments[i] for i in indexes], [source.size for source in group], new_segment
                        )
                    )
            except BaseException:
                CleanResult(end_offset, groups, self.stats).discard()
                raise
            return CleanResult(end_offset, groups, self.stats)
        finally:
            self.close()

    def _build_offset_map(self, offset_map: OffsetMap, check_done: Callable[[], None]) -> bool:
        """Kafka's buildOffsetMap: key -> latest offset from the first dirty offset up to the first
        uncleanable one, stopping where the map is full; whether it filled."""
        start = self.to_clean.first_dirty_offset
        end = self.to_clean.first_uncleanable_offset
        max_desired_size = int(offset_map.slots * self.cleaner_config.dedupe_buffer_load_factor)
        stats = self.stats
        transactions = CleanedTransactionMetadata()
        transactions.add_aborted_transactions(self.dirty_aborted_txns)
        for index, source in enumerate(self.sources):
            next_base = self.sources[index + 1].base_offset if index + 1 < len(self.sources) else end
            if next_base <= start or source.base_offset >= end:
                continue
            check_done()
            for header, batch in _read_batches(source, self.cleaner_config.io_buffer_size):
                check_done()
                stats.map_bytes_read += header.size_in_bytes
                # A marker's key is no record key, and an aborted batch's keys must not hide earlier values.
                if header.is_control:
                    transactions.on_control_batch_read(header, decode_raw_records(batch, header))
                    aborted = True
                else:
                    aborted = transactions.on_batch_read(header)
                if header.last_offset < start:
                    continue
                if aborted:
                    stats.map_messages_read += header.records_count
                    offset_map.update_latest_offset(header.last_offset)
                    continue
                for record in decode_raw_records(batch, header):
                    offset = header.base_offset + record.offset_delta
                    stats.map_messages_read += 1
                    if record.key is not None and offset >= start:
                        if offset_map.size >= max_desired_size:
                            return True
                        offset_map.put(record.key, offset)
                offset_map.update_latest_offset(header.last_offset)
        return False

    def _clean_segments(
        self,
        indexes: list[int],
        offset_map: OffsetMap,
        transactions: CleanedTransactionMetadata,
        check_done: Callable[[], None],
    ) -> LogSegment:
        """Kafka's cleanSegments: one `.cleaned` segment holding what the group (indexes into the sources) keeps."""
        config = self.config
        group = [self.sources[i] for i in indexes]
        cleaned = LogSegment.open(
            self.directory, group[0].base_offset, config, self.now_ms, file_suffix=CLEANED_FILE_SUFFIX
        )
        transactions.cleaned_index = cleaned.txn_index
        try:
            writer = _SegmentWriter(cleaned, config.index_interval_bytes)
            for index, source in zip(indexes, group, strict=True):
                check_done()
                transactions.add_aborted_transactions(self.source_aborted_txns[index])
                for header, batch in _read_batches(source, self.cleaner_config.io_buffer_size):
                    check_done()
                    self.stats.bytes_read += header.size_in_bytes
                    kept = self._filter_batch(header, batch, offset_map, transactions)
                    if kept is not None:
                        writer.add(kept)
                self.stats.segments_cleaned += 1
            writer.finish()
            self.stats.bytes_written += cleaned.size
            cleaned.on_become_inactive()
            cleaned.flush()
            # Kafka keeps the last replaced segment's modification time, which time-based retention reads.
            os.utime(cleaned.log_path, ns=(group[-1].last_modified_ns, group[-1].last_modified_ns))
        except BaseException:
            cleaned.delete()
            raise
        return cleaned

    def _filter_batch(
        self,
        header: RecordBatchHeader,
        batch: bytes,
        offset_map: OffsetMap,
        transactions: CleanedTransactionMetadata,
    ) -> bytes | None:
        """MemoryRecords.filterTo with Kafka's cleaner filter for one batch: its bytes unchanged, rebuilt with
        the records kept, an empty batch for a producer's last one, or None."""
        records = decode_raw_records(batch, header)
        self.stats.messages_read += len(records)
        horizon = header.delete_horizon_ms
        if header.is_control:
            # A marker rides on the tombstone horizon: discardable once its transaction has no batch left, it
            # first gets a delete horizon and goes at the first cleaning at or after it.
            discardable_marker = transactions.on_control_batch_read(header, records)
            discard_records = discardable_marker and horizon is not None and horizon <= self.now_ms
            retained = [] if discard_records else records
        else:
            discardable_marker = False
            discard_records = transactions.on_batch_read(header)
            retained = (
                []
                if discard_records
                else [record for record in records if self._should_retain(header, record, offset_map, horizon)]
            )
        self.stats.messages_written += len(retained)
        if retained:
            needs_horizon = horizon is None and (discardable_marker or any(record.value is None for record in retained))
            if len(retained) == len(records) and not needs_horizon:
                return batch
            if needs_horizon:
                horizon = self.now_ms + self.config.delete_retention_ms
            return encode_raw_batch(header, retained, delete_horizon_ms=horizon)
        if header.producer_id != NO_PRODUCER_ID and self._is_last_batch_of_producer(header):
            # The batch carries the producer's last sequence and epoch: without it a retried produce would
            # fail with OUT_OF_ORDER_SEQUENCE_NUMBER, or a zombie would not be fenced, once producer state is
            # rebuilt from the log.
            return encode_raw_batch(header, [], delete_horizon_ms=None)
        return None

    def _is_last_batch_of_producer(self, header: RecordBatchHeader) -> bool:
        """Kafka's isBatchLastRecordOfProducer: the batch holding a live producer's last data offset, or, for
        a producer with none, a marker of its current epoch."""
        last = self.last_batches.get(header.producer_id)
        if last is None:
            return False
        last_data_offset, producer_epoch = last
        if last_data_offset is not None:
            return header.last_offset == last_data_offset
        return header.is_control and header.producer_epoch == producer_epoch

    def _should_retain(
        self, header: RecordBatchHeader, record: RawRecord, offset_map: OffsetMap, horizon: int | None
    ) -> bool:
        """Kafka's Cleaner.shouldRetainRecord."""
        offset = header.base_offset + record.offset_delta
        if offset > offset_map.latest_offset:
            return True
        if record.key is None:
            self.stats.invalid_messages += 1
            return False
        if offset < offset_map.get(record.key):
            return False
        return record.value is not None or horizon is None or self.now_ms < horizon


def _overlapping(txns: Sequence[AbortedTxn], start_offset: int, end_offset: int) -> list[AbortedTxn]:
    """The transactions with an offset in [start_offset, end_offset) (from their first record to their marker)."""
    return [txn for txn in txns if txn.last_offset >= start_offset and txn.first_offset < end_offset]


class _SegmentWriter:
    """Appends kept batches to the cleaned segment in chunks of index.interval.bytes, so its index is as
    dense as one written by appends."""

    def __init__(self, segment: LogSegment, chunk_bytes: int) -> None:
        self._segment = segment
        self._chunk_bytes = max(chunk_bytes, 1)
        self._pending = bytearray()
        self._largest_offset = -1
        self._max_timestamp = -1
        self._offset_of_max_timestamp = -1

    def add(self, batch: bytes) -> None:
        header = read_header(batch)
        if not self._pending or header.max_timestamp > self._max_timestamp:
            self._max_timestamp, self._offset_of_max_timestamp = header.max_timestamp, header.last_offset
        self._pending += batch
        self._largest_offset = header.last_offset
        if len(self._pending) >= self._chunk_bytes:
            self.finish()

    def finish(self) -> None:
        if self._pending:
            self._segment.append(
                self._largest_offset, self._max_timestamp, self._offset_of_max_timestamp, self._pending
            )
            self._pending = bytearray()


def group_segments_by_size(
    segments: Sequence[_SegmentSource], max_size: int, max_index_size: int, first_uncleanable_offset: int
) -> list[list[int]]:
    """Kafka's groupSegmentsBySize: consecutive segments (as indexes into `segments`) whose log and index
    sizes fit one segment and whose offsets fit the 32-bit relative offsets of one index."""
    groups: list[list[int]] = []
    index = 0
    while index < len(segments):
        group = [index]
        log_size = segments[index].size
        offset_index_size = segments[index].offset_index_bytes
        time_index_size = segments[index].time_index_bytes
        index += 1
        while index < len(segments):
            candidate = segments[index]
            last_offset = (
                segments[index + 1].base_offset - 1 if index + 1 < len(segments) else first_uncleanable_offset - 1
            )
            if not (
                log_size + candidate.size <= max_size
                and offset_index_size + candidate.offset_index_bytes <= max_index_size
                and time_index_size + candidate.time_index_bytes <= max_index_size
                and (candidate.size == 0 or last_offset - segments[group[0]].base_offset <= INT32_MAX)
            ):
                break
            group.append(index)
            log_size += candidate.size
            offset_index_size += candidate.offset_index_bytes
            time_index_size += candidate.time_index_bytes
            index += 1
        groups.append(group)
    return groups


def _read_batches(source: _SegmentSource, buffer_size: int) -> Iterator[tuple[RecordBatchHeader, bytes]]:
    """Every batch of the segment (up to its size when the clean began), CRC checked, read in chunks of
    log.cleaner.io.buffer.size (or one batch, if larger)."""
    position = 0
    buffer = b""
    buffer_start = 0
    while position < source.size:
        remaining = source.size - position
        relative = position - buffer_start
        size = batch_size_at(buffer, relative)
        if size is None or relative + size > len(buffer):
            buffer, buffer_start, relative = os.pread(source.fd, min(buffer_size, remaining), position), position, 0
            size = batch_size_at(buffer, 0)
            if size is not None and len(buffer) < size <= remaining:
                buffer = os.pread(source.fd, size, position)
            if size is None or size > len(buffer):
                raise LogCleaningAbortedError(
                    f"segment {source.base_offset} changed under the cleaner at position {position}"
                )
        header = validate_batch(buffer, relative)
        yield header, buffer[relative : relative + header.size_in_bytes]
        position += header.size_in_bytes


class LogCleaner:
    """Kafka's LogCleaner without its threads: `grab` (event loop) -> `CleaningTask.run` (anywhere) ->
    `complete` (event loop). `clean_filthiest_log` does all three in one call."""

    def __init__(self, config: CleanerConfig, log_manager: LogManager) -> None:
        if int(config.offset_map_memory // BYTES_PER_ENTRY * config.dedupe_buffer_load_factor) < 1:
            raise ValueError(
                f"log.cleaner.dedupe.buffer.size {config.dedupe_buffer_size} is too small for "
                f"{config.num_threads} cleaner thread(s): each needs room for at least one key"
            )
        self.config = config
        self.log_manager = log_manager
        self.manager = LogCleanerManager(log_manager.log_dirs)
        self.totals = CleanerStats()
        self.cleanings = 0
        self.aborted = 0

    def grab(self, now_ms: int) -> CleaningTask | None:
        """The next clean to run, prepared (its segments opened), or None if no log needs cleaning."""
        self.manager.remove_deleted_logs(self.log_manager)
        to_clean = self.manager.grab_filthiest_compacted_log(self.log_manager.all_logs(), now_ms)
        if to_clean is None:
            return None
        try:
            return CleaningTask.prepare(to_clean, self.config, now_ms)
        except OSError:
            self.manager.abort_cleaning(to_clean.topic_partition)
            raise

    def unchanged(self, task: CleaningTask, result: CleanResult | None = None) -> bool:
        """Whether the log the task cleans is still the broker's, with the cleaned segments as they were
        (retention, truncation or deletion since `grab` make the clean stale)."""
        log = task.to_clean.log
        if self.log_manager.get_log(log.topic_partition) is not log:
            return False
        current = {id(segment): segment.size for segment in log.segments[:-1]}
        if result is None:
            return all(current.get(id(segment)) is not None for segment in task.segments)
        return all(
            current.get(id(segment)) == size
            for group in result.groups
            for segment, size in zip(group.old_segments, group.old_sizes, strict=True)
        )

    def complete(self, task: CleaningTask, result: CleanResult) -> bool:
        """Swap the cleaned segments in and advance the checkpoint; if the log changed meanwhile, discard
        them and leave the log as it is. Returns whether the clean took effect."""
        log = task.to_clean.log
        if not self.unchanged(task, result):
            logger.info("Log cleaning of %s aborted: the log changed while it was cleaned", log.topic_partition)
            self.abort(task, result)
            return False
        for group in result.groups:
            log.replace_segments(group.new_segment, group.old_segments)
        self.manager.done_cleaning(log, result.end_offset)
        self.cleanings += 1
        stats, totals = result.stats, self.totals
        for name in CleanerStats.__slots__:
            setattr(totals, name, getattr(totals, name) + getattr(stats, name))
        logger.info(
            "Cleaned log %s up to offset %d: %d segment(s), %d of %d message(s) kept, %d -> %d bytes",
            log.topic_partition,
            result.end_offset,
            stats.segments_cleaned,
            stats.messages_written,
            stats.messages_read,
            stats.bytes_read,
            stats.bytes_written,
        )
        return True

    def abort(self, task: CleaningTask, result: CleanResult | None = None, *, uncleanable: bool = False) -> None:
        """Give the clean up: remove what it wrote and release the log (for good, with `uncleanable`)."""
        task.close()
        if result is not None:
            result.discard()
        tp = task.to_clean.topic_partition
        self.manager.abort_cleaning(tp)
        self.aborted += 1
        if uncleanable:
            self.manager.uncleanable.add(tp)

    def clean_filthiest_log(self, now_ms: int, check_done: Callable[[], None] = lambda: None) -> bool:
        """One whole pass on the calling thread; whether a log was cleaned."""
        task = self.grab(now_ms)
        if task is None:
            return False
        try:
            result = task.run(check_done)
        except BaseException:
            self.abort(task)
            raise
        return self.complete(task, result)
