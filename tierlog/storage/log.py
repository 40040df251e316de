"""Kafka's UnifiedLog (local part): the segments of one partition replica and its offsets.

Invariants kept here, as in Kafka:
- segments are sorted by base offset, never empty, and the last one (the active segment) takes appends;
- log start offset <= local log start offset <= high watermark <= log end offset (LEO), and the recovery
  point <= LEO; the two starts differ only when tiered storage holds the offsets between them (KIP-405:
  Rx = log start, Lx = local log start, and the highest offset in remote storage Ry stays below the HW);
- every batch below the recovery point has been fsynced, so recovery after a crash starts there;
- a segment removed from the log lingers as `*.deleted` for file.delete.delay.ms, so a FileSlice handed to
  a fetch response stays readable while it is sent;
- transactions (docs/transactions.md#storage): the last stable offset (LSO) is min(first unstable offset, HW),
  and each ABORT marker that ends a transaction with records here adds an entry to its segment's `.txnindex`.
Nothing here reads a clock: every time comes in as `now_ms`. Truncations carry no time, so a segment they
create is dated by the latest time the log was given.
"""

from __future__ import annotations

import os
import shutil
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tierlog.common import TopicPartition
from tierlog.records.codec import Compression, decode_raw_records, recompress_batch
from tierlog.records.control_batch import EndTxnMarker
from tierlog.records.record_batch import (
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    InvalidRecordError,
    RecordBatchHeader,
    TimestampType,
    iter_batches,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from tierlog.records.validation import validate_records
from tierlog.storage.checkpoints import LEADER_EPOCH_CHECKPOINT_FILENAME, LeaderEpochCheckpointFile
from tierlog.storage.errors import (
    CorruptIndexError,
    InvalidTimestampError,
    KafkaStorageError,
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    OffsetsOutOfOrderError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from tierlog.storage.file_records import (
    FetchDataInfo,
    FileSlice,
    TimestampAndOffset,
    offset_of_timestamp_in_batch,
    scan_batches,
)
from tierlog.storage.leader_epoch_cache import LeaderEpochFileCache
from tierlog.storage.log_config import LONG_MAX, LogConfig
from tierlog.storage.producer_state import (
    AppendOrigin,
    BatchMetadata,
    CompletedTxn,
    ProducerAppendInfo,
    ProducerStateManager,
    ProducerStateManagerConfig,
    end_txn_marker_of,
)
from tierlog.storage.segment import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    LogSegment,
    log_file_path,
    offset_from_file_name,
)
from tierlog.storage.transaction_index import AbortedTxn

# ListOffsets special timestamps (Kafka's ListOffsetsRequest).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5

_TMP_FILE_SUFFIX = ".tmp"
_INDEX_SUFFIXES = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, ".txnindex")


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    """Kafka's LogAppendInfo: what an append wrote. `log_append_time` is -1 unless LogAppendTime stamped it."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int
    records_count: int
    valid_bytes: int


class Log:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        topic_partition: TopicPartition,
        segments: list[LogSegment],
        leader_epoch_cache: LeaderEpochFileCache,
        *,
        log_start_offset: int,
        recovery_point: int,
        high_watermark: int,
        now_ms: int,
        producer_state_manager: ProducerStateManager,
        remote_log_enabled: bool = False,
    ) -> None:
        self._dir = directory
        self._config = config
        self._topic_partition = topic_partition
        self._segments = segments
        self._base_offsets = [segment.base_offset for segment in segments]
        self._leader_epoch_cache = leader_epoch_cache
        self._producer_state_manager = producer_state_manager
        self._next_offset = segments[-1].read_next_offset()
        self._remote_log_enabled = remote_log_enabled
        self._local_log_start_offset = max(log_start_offset, segments[0].base_offset)
        # With a remote tier the log starts where the remote tier starts, below the first local segment.
        self._log_start_offset = (
            min(log_start_offset, self._local_log_start_offset)
            if remote_log_enabled
            else (self._local_log_start_offset)
        )
        # Ry: the highest offset copied to the remote tier in this log's lineage; the RemoteLogManager (leader)
        # or the remote log metadata (follower) moves it. -1 until known.
        self._highest_offset_in_remote_storage = -1
        self._recovery_point = min(max(recovery_point, self._local_log_start_offset), self._next_offset)
        self._high_watermark = min(max(high_watermark, self._local_log_start_offset), self._next_offset)
        self._now_ms = now_ms
        self._last_flush_ms = now_ms
        # Kafka flushes the previous segment on a scheduler thread right after a roll; here the shell's
        # flush timer does it (flush_if_due), so a crash recovers little more than the active segment.
        self._pending_flush_offset: int | None = None
        # (offset, segment base offset, position) of the last max_offset a read translated, usually the HW.
        self._max_offset_metadata: tuple[int, int, int] | None = None
        self._deleted_segments: list[tuple[LogSegment, int]] = []
        # The lowest offset truncated to since the log cleaner last asked: its checkpoint must not pass it.
        self._truncation_point: int | None = None
        # Written at the log's first change, not here (docs/performance.md#many-partitions).
        leader_epoch_cache.truncate_from_end(self._next_offset, flush=False)
        leader_epoch_cache.truncate_from_start(self._log_start_offset, flush=False)

    # Loading (Kafka's LogLoader)

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        topic_partition: TopicPartition,
        recovery_point: int,
        log_start_offset: int,
        high_watermark: int,
        had_clean_shutdown: bool,
        now_ms: int,
        remote_log_enabled: bool = False,
        producer_state_config: ProducerStateManagerConfig | None = None,
    ) -> Log:
        """Load a partition directory: drop leftovers of interrupted operations, rebuild missing or corrupt
        indexes and, after an unclean shutdown, validate every batch from the recovery point on."""
        dir.mkdir(parents=True, exist_ok=True)
        leader_epoch_cache = LeaderEpochFileCache(LeaderEpochCheckpointFile(dir / LEADER_EPOCH_CHECKPOINT_FILENAME))
        swap_files = _remove_temp_files_and_collect_swap_files(dir)
        _complete_swaps(dir, swap_files, config, now_ms)
        recoverer = _SegmentRecoverer(
            dir, topic_partition, log_start_offset, leader_epoch_cache, producer_state_config, now_ms
        )
        segments = _load_segment_files(dir, config, recoverer, now_ms)
        if not had_clean_shutdown:
            _recover_from(segments, recovery_point, recoverer)
        if segments and segments[-1].read_next_offset() < log_start_offset:
            # DeleteRecords moved the log start past everything that survived: Kafka starts over there.
            for segment in segments:
                segment.delete()
            segments.clear()
        if not segments:
            segments.append(LogSegment.open(dir, log_start_offset, config, now_ms))
        log_end_offset = segments[-1].read_next_offset()
        producer_state_manager = ProducerStateManager(topic_partition, dir, producer_state_config)
        # Kafka's LogLoader: snapshots without a segment are leftovers, except the one a clean shutdown took.
        producer_state_manager.remove_stray_snapshots(segment.base_offset for segment in segments)
        log = cls(
            dir,
            config,
            topic_partition,
            segments,
            leader_epoch_cache,
            log_start_offset=log_start_offset,
            # A recovered log is not yet flushed: the recovery point only moves when a flush makes it true.
            recovery_point=log_end_offset if had_clean_shutdown else recovery_point,
            high_watermark=high_watermark,
            now_ms=now_ms,
            producer_state_manager=producer_state_manager,
            remote_log_enabled=remote_log_enabled,
        )
        log._rebuild_producer_state(log_end_offset, reload_from_clean_shutdown=had_clean_shutdown)
        producer_state_manager.on_high_watermark_updated(log.high_watermark)
        return log

    # State

    @property
    def topic_partition(self) -> TopicPartition:
        return self._topic_partition

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def local_log_start_offset(self) -> int:
        return self._local_log_start_offset

    @property
    def remote_log_enabled(self) -> bool:
        return self._remote_log_enabled

    @property
    def highest_offset_in_remote_storage(self) -> int:
        return self._highest_offset_in_remote_storage

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction not yet decided (no marker) or whose marker is not yet
        below the HW, never below the log start; None without one (Kafka's firstUnstableOffset)."""
        offset = self._producer_state_manager.first_unstable_offset
        return None if offset is None else max(offset, self._log_start_offset)

    @property
    def last_stable_offset(self) -> int:
        """Kafka's UnifiedLog.lastStableOffset: the first unstable offset if below the HW, else the HW. A
        read_committed consumer reads below it (docs/transactions.md#lso)."""
        offset = self.first_unstable_offset
        return offset if offset is not None and offset < self._high_watermark else self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def leader_epoch_cache(self) -> LeaderEpochFileCache:
        return self._leader_epoch_cache

    @property
    def latest_epoch(self) -> int | None:
        return self._leader_epoch_cache.latest_epoch

    @property
    def producer_state_manager(self) -> ProducerStateManager:
        return self._producer_state_manager

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def update_config(self, config: LogConfig, remote_log_enabled: bool) -> None:
        """Takes effect for later appends and retention; existing segments keep their index settings."""
        self._config = config
        self._remote_log_enabled = remote_log_enabled

    def update_highest_offset_in_remote_storage(self, offset: int) -> None:
        """Record that the remote tier holds this log's offsets up to `offset` (inclusive). Never moves
        back: a segment deleted by remote retention was below it anyway."""
        if offset <= self._highest_offset_in_remote_storage:
            return
        if offset >= self._high_watermark:
            # Ly >= Ry: only segments below the LSO (here the HW) are ever copied.
            raise KafkaStorageError(
                f"Highest offset in remote storage {offset} of {self._topic_partition} would reach the high "
                f"watermark {self._high_watermark}"
            )
        self._highest_offset_in_remote_storage = offset
        self._check_offsets(remote_end=True)

    # Append

    def append_as_leader(
        self, records: bytearray, leader_epoch: int, now_ms: int, origin: AppendOrigin = AppendOrigin.CLIENT
    ) -> LogAppendInfo:
        """Validate every batch, recompress those whose codec is not the topic's compression.type, then
        assign offsets from the LEO and stamp the leader epoch in place (the CRC does not cover either) and
        append. Nothing is written unless every batch is valid. A client's batches get every check; a
        coordinator's (transaction markers, transactional offset commits) no sequence checks and may be
        control batches (docs/transactions.md#append-origin)."""
        self._now_ms = now_ms
        config = self._config
        headers = list(iter_batches(records))
        for header in headers:
            self._validate_batch(header, origin)
            self._validate_records(records, header, now_ms)
        compression = config.compression
        if compression is not None and any(_needs_recompression(header, compression) for header in headers):
            records, headers = self._recompress(records, headers, compression)
        self._check_append_size(len(records))
        log_append_time = config.log_append_time
        producer_appends, completed_txns, duplicate = self._analyze_and_validate_producer_state(
            records, headers, origin, self._next_offset
        )
        if duplicate is not None:
            # Kafka's UnifiedLog.append: a retried batch is not written again; the producer gets the offsets
            # it was first written at (and an acks=all produce waits for the HW to pass those).
            return LogAppendInfo(
                duplicate.first_offset,
                duplicate.last_offset,
                duplicate.timestamp,
                duplicate.last_offset,
                duplicate.timestamp if log_append_time else NO_TIMESTAMP,
                0,
                0,
            )
        first_offset = offset = self._next_offset
        max_timestamp, offset_of_max_timestamp, records_count = NO_TIMESTAMP, -1, 0
        for header in headers:
            position = header.position
            set_base_offset(records, position, offset)
            set_partition_leader_epoch(records, position, leader_epoch)
            last_offset = offset + header.last_offset_delta
            if log_append_time:
                set_log_append_time(records, position, now_ms)
                timestamp = now_ms
            else:
                timestamp = header.max_timestamp
            if timestamp > max_timestamp:
                max_timestamp, offset_of_max_timestamp = timestamp, last_offset
            records_count += header.records_count
            offset = last_offset + 1
        if self._leader_epoch_cache.latest_epoch != leader_epoch:
            self._leader_epoch_cache.assign(leader_epoch, first_offset)
        self._append(
            records,
            first_offset,
            offset - 1,
            max_timestamp,
            offset_of_max_timestamp,
            now_ms,
            producer_appends,
            completed_txns,
        )
        return LogAppendInfo(
            first_offset,
            offset - 1,
            max_timestamp,
            offset_of_max_timestamp,
            now_ms if log_append_time else NO_TIMESTAMP,
            records_count,
            len(records),
        )

    def _validate_batch(self, header: RecordBatchHeader, origin: AppendOrigin) -> None:
        """Kafka's LogValidator checks that need only the batch header; all but the size are for clients only."""
        config = self._config
        if header.size_in_bytes > config.max_message_bytes:
            raise RecordTooLargeError(
                f"The batch at position {header.position} is {header.size_in_bytes} bytes, larger than "
                f"max.message.bytes ({config.max_message_bytes}) of partition {self._topic_partition}"
            )
        if origin is not AppendOrigin.CLIENT:
            return
        if header.base_offset != 0:
            # The producer's base offset is a placeholder the leader overwrites; anything else is a bug or
            # an attempt to choose offsets.
            raise InvalidRecordError(
                f"The baseOffset of the record batch in the append to {self._topic_partition} should be 0, "
                f"but it is {header.base_offset}",
                corrupt=False,
            )
        if header.records_count != header.last_offset_delta + 1:
            raise InvalidRecordError(
                f"Inconsistent batch offset range [0, {header.last_offset_delta}] and count of records "
                f"{header.records_count} in topic partition {self._topic_partition}",
                corrupt=False,
            )
        if header.is_control:
            raise InvalidRecordError(
                f"Clients are not allowed to write control records in topic partition {self._topic_partition}",
                corrupt=False,
            )
        if header.producer_id != NO_PRODUCER_ID and header.base_sequence < 0:
            raise InvalidRecordError(
                f"Invalid sequence number {header.base_sequence} in record batch with producerId "
                f"{header.producer_id} in topic partition {self._topic_partition}",
                corrupt=False,
            )

    def _validate_records(self, records: bytearray, header: RecordBatchHeader, now_ms: int) -> None:
        """LogValidator's record checks: keys on a compacted topic, timestamps on a CreateTime one. The records
        are decoded only when a check needs them: on a compacted topic; when the header shows a timestamp out
        of range, to name the records at fault; and when message.timestamp.before.max.ms is set, since the
        header bounds the records' timestamps from above (maxTimestamp) but not from below (baseTimestamp is
        the first record's, and a producer may give the records of a batch any timestamps)."""
        config = self._config
        timestamp_bounds = None
        if not config.log_append_time:
            if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
                raise InvalidTimestampError(
                    f"Invalid timestamp type in batch at position {header.position} of partition "
                    f"{self._topic_partition}: producers may not set LogAppendTime"
                )
            low = now_ms - config.message_timestamp_before_max_ms
            high = now_ms + config.message_timestamp_after_max_ms
            if config.message_timestamp_before_max_ms != LONG_MAX or any(
                t != NO_TIMESTAMP and not low <= t <= high for t in (header.base_timestamp, header.max_timestamp)
            ):
                timestamp_bounds = (low, high)
        if not config.compact and timestamp_bounds is None:
            return
        batch = memoryview(records)[header.position : header.position + header.size_in_bytes]
        validate_records(
            decode_raw_records(batch, header),
            str(self._topic_partition),
            compacted=config.compact,
            timestamp_bounds=timestamp_bounds,
        )

    def _recompress(
        self, records: bytearray, headers: list[RecordBatchHeader], compression: Compression
    ) -> tuple[bytearray, list[RecordBatchHeader]]:
        """Kafka's LogValidator for a topic whose compression.type is a codec: a batch in another codec is
        rebuilt in the topic's codec and level (`recompress_batch`), a batch already in it is kept as sent
        (a codec's level is not visible in a batch, so it is never changed). A rebuilt batch larger than
        max.message.bytes is refused, as UnifiedLog.append checks the batches LogValidator rebuilt."""
        converted = bytearray()
        converted_headers = []
        with memoryview(records) as view:
            for header in headers:
                batch = view[header.position : header.position + header.size_in_bytes]
                position = len(converted)
                if not _needs_recompression(header, compression):
                    converted += batch
                else:
                    rebuilt = recompress_batch(batch, header, compression)
                    if len(rebuilt) > self._config.max_message_bytes:
                        raise RecordTooLargeError(
                            f"Message batch size is {len(rebuilt)} bytes in append to partition "
                            f"{self._topic_partition} which exceeds the maximum configured size of "
                            f"{self._config.max_message_bytes}."
                        )
                    converted += rebuilt
                converted_headers.append(read_header(converted, position))
        return converted, converted_headers

    def append_as_follower(self, records: bytes | bytearray | memoryview, now_ms: int) -> LogAppendInfo:
        """Append batches whose offsets and epochs the leader assigned; the epoch cache learns each new
        epoch from the batches' partitionLeaderEpoch."""
        self._now_ms = now_ms
        headers = list(iter_batches(records))
        first_offset = next_offset = headers[0].base_offset
        max_timestamp, offset_of_max_timestamp, records_count = NO_TIMESTAMP, -1, 0
        for header in headers:
            if header.base_offset < next_offset:
                raise OffsetsOutOfOrderError(
                    f"Out of order offsets found in append to {self._topic_partition}: batch at offset "
                    f"{header.base_offset} follows offset {next_offset - 1}"
                )
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max_timestamp = header.max_timestamp, header.last_offset
            records_count += header.records_count
            next_offset = header.last_offset + 1
        last_offset = next_offset - 1
        if first_offset < self._next_offset:
            raise UnexpectedAppendOffsetError(
                f"Unexpected offset in append to {self._topic_partition}. First offset {first_offset} is less "
                f"than the next offset {self._next_offset}. Last offset in append: {last_offset}. Log start "
                f"offset = {self._log_start_offset}",
                first_offset,
                last_offset,
            )
        self._check_append_size(len(records))
        producer_appends, completed_txns, _ = self._analyze_and_validate_producer_state(
            records, headers, AppendOrigin.REPLICATION
        )
        cache = self._leader_epoch_cache
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch != NO_PARTITION_LEADER_EPOCH and epoch != cache.latest_epoch:
                cache.assign(epoch, header.base_offset)
        self._append(
            records,
            first_offset,
            last_offset,
            max_timestamp,
            offset_of_max_timestamp,
            now_ms,
            producer_appends,
            completed_txns,
        )
        return LogAppendInfo(
            first_offset,
            last_offset,
            max_timestamp,
            offset_of_max_timestamp,
            NO_TIMESTAMP,
            records_count,
            len(records),
        )

    def _analyze_and_validate_producer_state(
        self,
        records: bytes | bytearray | memoryview,
        headers: list[RecordBatchHeader],
        origin: AppendOrigin,
        first_offset: int | None = None,
    ) -> tuple[list[ProducerAppendInfo], list[CompletedTxn], BatchMetadata | None]:
        """Kafka's analyzeAndValidateProducerState: check every idempotent or transactional batch and every
        marker against its producer's state (raising before anything is written) and collect the updates to
        apply once the batches are written, with the transactions the markers complete; or, for a client's
        retry of a batch the log already holds, that batch. Offsets are those the batches will get: from
        `first_offset` on for a leader, the stamped ones for a follower."""
        updated: dict[int, ProducerAppendInfo] = {}
        completed: list[CompletedTxn] = []
        offset = first_offset
        for header in headers:
            base_offset = header.base_offset if offset is None else offset
            last_offset = base_offset + header.last_offset_delta
            if offset is not None:
                offset = last_offset + 1
            producer_id = header.producer_id
            if producer_id == NO_PRODUCER_ID:
                continue
            if origin is AppendOrigin.CLIENT:
                entry = self._producer_state_manager.last_entry(producer_id)
                duplicate = entry.find_duplicate_batch(header) if entry is not None else None
                if duplicate is not None:
                    return [], [], duplicate
            info = updated.get(producer_id)
            if info is None:
                info = updated[producer_id] = self._producer_state_manager.prepare_update(producer_id, origin)
            txn = info.append(header, base_offset, last_offset, end_txn_marker_of(records, header))
            if txn is not None:
                completed.append(txn)
        return list(updated.values()), completed, None

    def _check_append_size(self, size: int) -> None:
        if size > self._config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"Message batch size is {size} bytes in append to partition {self._topic_partition}, which "
                f"exceeds the maximum configured segment size of {self._config.segment_bytes}."
            )

    def _append(
        self,
        records: bytes | bytearray | memoryview,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        offset_of_max_timestamp: int,
        now_ms: int,
        producer_appends: list[ProducerAppendInfo],
        completed_txns: list[CompletedTxn],
    ) -> None:
        # The epoch checkpoint is right before the log grows: a crash must not find new records with a file
        # that still holds entries the load dropped (LeaderEpochFileCache).
        self._leader_epoch_cache.flush_if_stale()
        segment = self._maybe_roll(len(records), max_timestamp, first_offset, last_offset, now_ms)
        segment.append(last_offset, max_timestamp, offset_of_max_timestamp, records)
        self._next_offset = last_offset + 1
        producer_state = self._producer_state_manager
        for info in producer_appends:
            producer_state.update(info)
        for txn in completed_txns:
            segment.complete_txn(producer_state, txn)
        producer_state.update_map_end_offset(self._next_offset)
        if self._next_offset - self._recovery_point >= self._config.flush_messages:
            self.flush()
            self._last_flush_ms = now_ms
        self._check_offsets()

    # Roll

    def _maybe_roll(
        self, messages_size: int, max_timestamp: int, first_offset: int, last_offset: int, now_ms: int
    ) -> LogSegment:
        config = self._config
        # Kafka's LogConfig.maxSegmentMs: compaction lag bounds the age of a compacted topic's segment.
        max_segment_ms = config.segment_ms
        if config.compact and config.max_compaction_lag_ms > 0:
            max_segment_ms = min(max_segment_ms, config.max_compaction_lag_ms)
        segment = self._segments[-1]
        if segment.should_roll(
            max_segment_bytes=config.segment_bytes,
            max_segment_ms=max_segment_ms,
            max_timestamp_in_messages=max_timestamp,
            max_offset_in_messages=last_offset,
            messages_size=messages_size,
            now_ms=now_ms,
        ):
            return self.roll(now_ms, first_offset)
        return segment

    def roll(self, now_ms: int, expected_next_offset: int | None = None) -> LogSegment:
        """Start a new active segment at max(expected_next_offset, LEO); a no-op on an empty active segment
        that already starts there."""
        self._now_ms = now_ms
        new_offset = self._next_offset if expected_next_offset is None else max(expected_next_offset, self._next_offset)
        active = self._segments[-1]
        if active.base_offset == new_offset and active.size == 0:
            return active
        if active.base_offset >= new_offset:
            raise KafkaStorageError(
                f"Trying to roll a new log segment for {self._topic_partition} with start offset {new_offset} "
                f"while the active segment starts at {active.base_offset}"
            )
        active.on_become_inactive()
        segment = LogSegment.open(self._dir, new_offset, self._config, now_ms)
        self._segments.append(segment)
        self._base_offsets.append(new_offset)
        # Kafka's roll: a snapshot aligned with the new segment lets recovery start there, and is what the
        # remote tier stores with the segment just closed.
        self._producer_state_manager.update_map_end_offset(new_offset)
        self._producer_state_manager.take_snapshot()
        self._pending_flush_offset = new_offset
        return segment

    # Read

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None, min_one_message: bool) -> FetchDataInfo:
        """Whole batches from the one holding `start_offset`, up to `max_bytes` (the first batch regardless
        with `min_one_message`), none holding an offset at or past `max_offset` (exclusive; the HW for
        consumers, None for no bound). A batch that starts below `start_offset` comes whole; clients skip."""
        log_end_offset = self._next_offset
        if self._log_start_offset <= start_offset < self._local_log_start_offset:
            raise OffsetMovedToTieredStorageError(
                f"Offset {start_offset} of partition {self._topic_partition} is in the remote tier: the local "
                f"log starts at {self._local_log_start_offset} and the log at {self._log_start_offset}."
            )
        if not self._local_log_start_offset <= start_offset <= log_end_offset:
            raise OffsetOutOfRangeError(
                f"Received request for offset {start_offset} for partition {self._topic_partition}, but we "
                f"only have log segments from {self._local_log_start_offset} up to {log_end_offset}."
            )
        upper = log_end_offset if max_offset is None else min(max_offset, log_end_offset)
        if start_offset >= upper:
            return FetchDataInfo(start_offset, None)
        if upper == log_end_offset:
            active = self._segments[-1]
            max_base, max_position = active.base_offset, active.size
        else:
            max_base, max_position = self._offset_metadata(upper)
        segments = self._segments
        for index in range(self._floor_index(start_offset), len(segments)):
            segment = segments[index]
            if segment.base_offset > max_base:
                break
            segment_max = max_position if segment.base_offset == max_base else segment.size
            info = segment.read(start_offset, max_bytes, segment_max, min_one_message)
            if info is not None:
                return info
        return FetchDataInfo(start_offset, None)

    def _offset_metadata(self, offset: int) -> tuple[int, int]:
        """(segment base offset, position) of the batch holding `offset`: where a read must stop."""
        cached = self._max_offset_metadata
        if cached is not None and cached[0] == offset:
            return cached[1], cached[2]
        segment = self._segments[self._floor_index(offset)]
        batch = segment.translate_offset(offset)
        position = segment.size if batch is None else batch.position
        self._max_offset_metadata = (offset, segment.base_offset, position)
        return segment.base_offset, position

    def _floor_index(self, offset: int) -> int:
        return max(bisect_right(self._base_offsets, offset) - 1, 0)

    def fetch_offset_by_timestamp(self, target_timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets: the first offset whose timestamp is >= the target, with its batch's leader epoch;
        or one of Kafka's special targets (-1 latest, -2 earliest, -3 max timestamp, -4 earliest local,
        -5 latest tiered)."""
        cache = self._leader_epoch_cache
        if target_timestamp == EARLIEST_TIMESTAMP:
            # The first cached epoch describes the log start only if it starts at or before it.
            earliest = cache.earliest_entry
            epoch = earliest.epoch if earliest is not None and earliest.start_offset <= self._log_start_offset else None
            return TimestampAndOffset(NO_TIMESTAMP, self._log_start_offset, epoch)
        if target_timestamp == EARLIEST_LOCAL_TIMESTAMP:
            local_start = self._local_log_start_offset
            return TimestampAndOffset(NO_TIMESTAMP, local_start, cache.epoch_for_offset(local_start))
        if target_timestamp == LATEST_TIMESTAMP:
            return TimestampAndOffset(NO_TIMESTAMP, self._next_offset, cache.latest_epoch)
        if target_timestamp == LATEST_TIERED_TIMESTAMP:
            highest = self._highest_offset_in_remote_storage
            if highest < 0:
                return TimestampAndOffset(NO_TIMESTAMP, -1, NO_PARTITION_LEADER_EPOCH)
            return TimestampAndOffset(NO_TIMESTAMP, highest, cache.epoch_for_offset(highest))
        if target_timestamp == MAX_TIMESTAMP:
            return self._max_timestamp_offset()
        # Unlike Kafka, which searches only the first segment whose largest timestamp reaches the target, skip
        # segments below the log start and keep looking when a segment's match lies below it.
        for segment in self._segments[self._floor_index(self._local_log_start_offset) :]:
            if segment.largest_timestamp >= target_timestamp:
                found = segment.find_offset_by_timestamp(target_timestamp, self._local_log_start_offset)
                if found is not None:
                    return found
        return None

    def _max_timestamp_offset(self) -> TimestampAndOffset | None:
        segment = max(self._segments, key=lambda s: s.max_timestamp_so_far)
        largest = segment.max_timestamp_and_offset_so_far
        if largest.timestamp < 0:
            return None
        position = segment.offset_index.lookup(largest.offset).position
        for batch in scan_batches(segment.file.fileno(), position, segment.size):
            if batch.max_timestamp == largest.timestamp:
                return offset_of_timestamp_in_batch(segment.file.fileno(), batch, largest.timestamp)
        return None

    # Offsets

    def update_high_watermark(self, high_watermark: int) -> int:
        """Set the HW, clamped to [local log start, LEO]; returns the value set."""
        old_high_watermark = self._high_watermark
        self._high_watermark = min(max(high_watermark, self._local_log_start_offset), self._next_offset)
        # A follower sets its HW on every fetch response, mostly unchanged; markers are appended at or above the
        # HW, so only a rising HW can pass one.
        if self._high_watermark > old_high_watermark:
            self._producer_state_manager.on_high_watermark_updated(self._high_watermark)
        self._check_offsets()
        return self._high_watermark

    def maybe_increment_log_start_offset(self, new_log_start_offset: int) -> bool:
        """DeleteRecords (and retention): move the log start up; it may never pass the HW."""
        if new_log_start_offset > self._high_watermark:
            raise OffsetOutOfRangeError(
                f"Cannot increment the log start offset to {new_log_start_offset} of partition "
                f"{self._topic_partition} since it is larger than the high watermark {self._high_watermark}"
            )
        if new_log_start_offset <= self._log_start_offset:
            return False
        self._log_start_offset = new_log_start_offset
        self._local_log_start_offset = max(self._local_log_start_offset, new_log_start_offset)
        self._recovery_point = max(self._recovery_point, self._local_log_start_offset)
        self._leader_epoch_cache.truncate_from_start(new_log_start_offset)
        self._producer_state_manager.on_log_start_offset_incremented(new_log_start_offset)
        self._check_offsets()
        return True

    def _increment_local_log_start_offset(self, new_local_log_start_offset: int) -> None:
        """Local retention with a remote tier: the local log shrinks, the log (and its epoch history, which
        followers and remote retention still need) keeps starting in the remote tier."""
        self._local_log_start_offset = max(self._local_log_start_offset, new_local_log_start_offset)
        self._recovery_point = max(self._recovery_point, self._local_log_start_offset)
        self._check_offsets()

    def _check_offsets(self, *, remote_end: bool = False) -> None:
        """Raise KafkaStorageError unless Rx <= Lx <= Ly <= Lz (log start, local log start, HW, LEO), and,
        with `remote_end`, Ry < Ly (the highest offset in remote storage below the HW). Integer comparisons
        only: it runs on every append.

        Ry < Ly is checked only where Ry is set: a follower's HW may go down (docs/replication.md#follower-hw:
        it adopts a new leader's lower HW) below an Ry learned under the old leader's, which is no error, so the
        methods a follower runs meanwhile (append, HW update, log start moves, retention, truncation) check only the
        first chain."""
        log_start, local_start = self._log_start_offset, self._local_log_start_offset
        high_watermark, log_end = self._high_watermark, self._next_offset
        if not log_start <= local_start <= high_watermark <= log_end:
            raise KafkaStorageError(
                f"Offsets of {self._topic_partition} break log start <= local log start <= high watermark <= "
                f"log end offset (Rx <= Lx <= Ly <= Lz): {log_start}, {local_start}, {high_watermark}, {log_end}"
            )
        remote_end_offset = self._highest_offset_in_remote_storage
        if remote_end and remote_end_offset >= high_watermark:
            raise KafkaStorageError(
                f"Highest offset in remote storage {remote_end_offset} of {self._topic_partition} is not below "
                f"the high watermark {high_watermark} (Ry < Ly)"
            )

    # Truncation

    def truncate_to(self, target_offset: int) -> bool:
        """Remove every offset >= target (a batch holding it goes whole); True if anything was removed."""
        if target_offset < 0:
            raise ValueError(
                f"Cannot truncate partition {self._topic_partition} to a negative offset ({target_offset})"
            )
        if target_offset >= self._next_offset:
            # A leader that assigned its epoch but appended nothing leaves an entry at the LEO to drop.
            self._leader_epoch_cache.truncate_from_end(self._next_offset)
            return False
        if self._segments[0].base_offset > target_offset:
            self.truncate_fully_and_start_at(target_offset)
            return True
        cut = self._floor_index(target_offset) + 1
        self._remove_and_delete_segments(self._segments[cut:])
        self._segments[-1].truncate_to(target_offset)
        self._next_offset = target_offset
        self._leader_epoch_cache.truncate_from_end(target_offset)
        self._log_start_offset = min(target_offset, self._log_start_offset)
        self._local_log_start_offset = min(target_offset, self._local_log_start_offset)
        # Offsets from the target on will hold other records (an unclean election's truncation may reach
        # below Ry): they count as copied only once the remote tier holds them in this lineage again.
        self._highest_offset_in_remote_storage = min(self._highest_offset_in_remote_storage, target_offset - 1)
        self._high_watermark = min(self._high_watermark, self._next_offset)
        self._recovery_point = min(self._recovery_point, target_offset)
        self._pending_flush_offset = None
        self._max_offset_metadata = None
        self._truncated(target_offset)
        self._rebuild_producer_state(target_offset, reload_from_clean_shutdown=False)
        # Kafka's truncateTo ends with a HW update: the replayed transactions whose markers are below the HW are
        # replicated, not unstable.
        self._producer_state_manager.on_high_watermark_updated(self._high_watermark)
        self._check_offsets()
        return True

    def truncate_fully_and_start_at(self, new_offset: int, log_start_offset: int | None = None) -> None:
        """Drop every segment and restart the log, empty, at `new_offset` (the new local log start). The log
        start is `log_start_offset` when the offsets below `new_offset` live in the remote tier (a follower
        that built its state from there), else `new_offset` too."""
        self._remove_and_delete_segments(list(self._segments))
        self._segments.append(LogSegment.open(self._dir, new_offset, self._config, self._now_ms))
        self._base_offsets.append(new_offset)
        self._leader_epoch_cache.clear_and_flush()
        self._producer_state_manager.truncate_fully_and_start_at(new_offset)
        self._next_offset = new_offset
        self._local_log_start_offset = new_offset
        self._log_start_offset = new_offset if log_start_offset is None else min(log_start_offset, new_offset)
        self._highest_offset_in_remote_storage = min(self._highest_offset_in_remote_storage, new_offset - 1)
        self._high_watermark = new_offset
        self._recovery_point = new_offset
        self._pending_flush_offset = None
        self._max_offset_metadata = None
        self._truncated(new_offset)
        self._check_offsets(remote_end=True)

    def _truncated(self, offset: int) -> None:
        self._truncation_point = offset if self._truncation_point is None else min(self._truncation_point, offset)

    def take_truncation_point(self) -> int | None:
        """The lowest offset the log was truncated to since the last call (Kafka's maybeTruncateCheckpoint
        hook: the log cleaner lowers its checkpoint there), or None."""
        point, self._truncation_point = self._truncation_point, None
        return point

    # Compaction (Kafka's LocalLog.replaceSegments)

    def replace_segments(self, new_segment: LogSegment, old_segments: list[LogSegment]) -> None:
        """Swap the log cleaner's `.cleaned` segment in for `old_segments` (consecutive closed segments, the
        first with the new segment's base offset), crash-safely: rename it `.swap`, rename the old segments
        `.deleted` (removed file.delete.delay.ms later, so reads already handed out finish), then drop the
        `.swap` suffix. Log.open completes a swap a crash interrupted after the `.swap` rename and undoes
        one interrupted before it (`_remove_temp_files_and_collect_swap_files`, `_complete_swaps`)."""
        segments = self._segments
        first = next((i for i, segment in enumerate(segments) if segment is old_segments[0]), None)
        if (
            first is None
            or segments[first : first + len(old_segments)] != old_segments
            or first + len(old_segments) >= len(segments)
            or new_segment.base_offset != old_segments[0].base_offset
        ):
            raise KafkaStorageError(
                f"Cannot replace segments {[s.base_offset for s in old_segments]} of {self._topic_partition}: "
                "they are not consecutive closed segments of the log"
            )
        new_segment.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
        self._segments = [*segments[:first], new_segment, *segments[first + len(old_segments) :]]
        self._base_offsets = [segment.base_offset for segment in self._segments]
        delete_at_ms = self._now_ms + self._config.file_delete_delay_ms
        for segment in old_segments:
            segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
            self._deleted_segments.append((segment, delete_at_ms))
        new_segment.change_file_suffixes(SWAP_FILE_SUFFIX, "")
        _fsync_dir(self._dir)
        # Batch positions below the HW moved.
        self._max_offset_metadata = None
        # Kafka's deleteProducerSnapshots: a replaced segment's snapshot goes unless the new one took its name.
        for segment in old_segments[1:]:
            self._producer_state_manager.remove_and_delete_snapshot(segment.base_offset)

    # Retention

    def delete_old_segments(self, now_ms: int) -> int:
        """Kafka's deleteOldSegments: segments wholly below the log start; then, if cleanup.policy has
        delete, segments beyond retention.bytes and segments older than retention.ms. Only segments below
        the HW go. With a remote tier the local.retention.* settings apply instead, and a segment goes only
        once it is copied (docs/tiered-storage.md#local-retention); the remote tier's own retention moves the
        log start. Returns the number of segments deleted."""
        self._now_ms = now_ms
        deleted = self._delete_old_segments(
            lambda segment, next_segment: (
                next_segment is not None and next_segment.base_offset <= self._log_start_offset
            ),
            now_ms,
            below_log_start=True,
        )
        if self._config.delete:
            deleted += self._delete_retention_size_breached_segments(now_ms)
            deleted += self._delete_retention_ms_breached_segments(now_ms)
        return deleted

    @property
    def _local_retention_bytes(self) -> int:
        return self._local_retention(self._config.local_retention_bytes, self._config.retention_bytes)

    @property
    def _local_retention_ms(self) -> int:
        return self._local_retention(self._config.local_retention_ms, self._config.retention_ms)

    def _local_retention(self, local_retention: int, retention: int) -> int:
        """A local.retention.* setting applies with a remote tier; its default, -2, means the retention.* one."""
        return local_retention if self._remote_log_enabled and local_retention != -2 else retention

    def _delete_retention_size_breached_segments(self, now_ms: int) -> int:
        retention_bytes = self._local_retention_bytes
        size = self.size_in_bytes
        if retention_bytes < 0 or size < retention_bytes:
            return 0
        excess = size - retention_bytes

        def breached(segment: LogSegment, next_segment: LogSegment | None) -> bool:
            nonlocal excess
            if excess - segment.size < 0:
                return False
            excess -= segment.size
            return True

        return self._delete_old_segments(breached, now_ms)

    def _delete_retention_ms_breached_segments(self, now_ms: int) -> int:
        retention_ms = self._local_retention_ms
        if retention_ms < 0:
            return 0
        return self._delete_old_segments(
            lambda segment, next_segment: now_ms - segment.largest_timestamp > retention_ms, now_ms
        )

    def _delete_old_segments(
        self,
        predicate: Callable[[LogSegment, LogSegment | None], bool],
        now_ms: int,
        below_log_start: bool = False,
    ) -> int:
        segments = self._segments
        deletable: list[LogSegment] = []
        for index, segment in enumerate(segments):
            next_segment = segments[index + 1] if index + 1 < len(segments) else None
            upper_bound = next_segment.base_offset if next_segment is not None else self._next_offset
            is_last_and_empty = next_segment is None and segment.size == 0
            # A local segment is the only copy of its offsets until the remote tier holds them.
            copied = (
                below_log_start
                or not self._remote_log_enabled
                or (upper_bound - 1 <= self._highest_offset_in_remote_storage)
            )
            # Nothing at or above the HW goes, so the log start never passes the HW.
            if (
                copied
                and self._high_watermark >= upper_bound
                and predicate(segment, next_segment)
                and not is_last_and_empty
            ):
                deletable.append(segment)
            else:
                break
        if not deletable:
            return 0
        if len(deletable) == len(segments):
            # The log keeps at least one segment: an expired active segment is rolled, then deleted.
            self.roll(now_ms)
        new_start = self._segments[len(deletable)].base_offset
        if self._remote_log_enabled:
            self._increment_local_log_start_offset(new_start)
        else:
            self.maybe_increment_log_start_offset(new_start)
        self._remove_and_delete_segments(deletable)
        # Kafka's deleteProducerSnapshots: the snapshot named after a deleted segment goes with it.
        for segment in deletable:
            self._producer_state_manager.remove_and_delete_snapshot(segment.base_offset)
        return len(deletable)

    def _remove_and_delete_segments(self, segments: list[LogSegment]) -> None:
        """Take segments out of the log and rename them `*.deleted`; remove_deleted_segments removes them
        file.delete.delay.ms later, so reads already handed out can finish."""
        if not segments:
            return
        doomed = {id(segment) for segment in segments}
        self._segments = [segment for segment in self._segments if id(segment) not in doomed]
        self._base_offsets = [segment.base_offset for segment in self._segments]
        delete_at_ms = self._now_ms + self._config.file_delete_delay_ms
        for segment in segments:
            segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
            self._deleted_segments.append((segment, delete_at_ms))

    def remove_deleted_segments(self, now_ms: int) -> int:
        """Close and remove the `*.deleted` segments whose delay has passed; returns how many."""
        due = [segment for segment, delete_at_ms in self._deleted_segments if delete_at_ms <= now_ms]
        self._deleted_segments = [entry for entry in self._deleted_segments if entry[1] > now_ms]
        for segment in due:
            segment.delete()
        return len(due)

    # Producer state

    def _rebuild_producer_state(self, last_offset: int, *, reload_from_clean_shutdown: bool) -> None:
        _rebuild_producer_state(
            self._producer_state_manager,
            self._segments,
            self._log_start_offset,
            last_offset,
            reload_from_clean_shutdown=reload_from_clean_shutdown,
            now_ms=self._now_ms,
        )

    def fetch_upper_bound_offset(self, fetch_offset: int, records: FileSlice) -> int:
        """The offset after the last batch of a local read: the aborted transactions a read_committed reader is told
        of are those that start below it (Kafka's LogSegment.fetchUpperBoundOffset, which may overshoot to the next
        index entry; this is exact). The scan starts at the offset index entry before the slice's end, so it reads
        few headers."""
        # The read came from the segment holding `fetch_offset` or, past its last batch, a later one.
        for segment in self._segments[self._floor_index(fetch_offset) :]:
            if segment.file is not records.file:
                continue
            end = records.position + records.size
            start = max(records.position, segment.offset_index.floor_position(end - 1))
            last_offset = None
            for batch in scan_batches(segment.file.fileno(), start, end):
                last_offset = batch.last_offset
            if last_offset is not None:
                return last_offset + 1
        return self._next_offset

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, upper_bound_offset) from the local segments' txn
        indexes: from the segment holding `start_offset` on, until a search is complete (Kafka's LocalLog
        collectAbortedTransactions; docs/transactions.md#txn-index)."""
        aborted: list[AbortedTxn] = []
        for segment in self._segments[self._floor_index(start_offset) :]:
            result = segment.txn_index.collect_aborted_txns(start_offset, upper_bound_offset)
            aborted.extend(result.aborted)
            if result.is_complete:
                break
        return aborted

    def remove_expired_producers(self, now_ms: int) -> int:
        """Kafka's PeriodicProducerExpirationCheck: forget producers idle for producer.id.expiration.ms."""
        return self._producer_state_manager.remove_expired_producers(now_ms)

    def delete_snapshots_after_recovery_point_checkpoint(self) -> int:
        """Kafka's deleteSnapshotsAfterRecoveryPointCheckpoint: keep the snapshots of the last two segments
        (truncation rebuilds from there) and from the recovery point's segment on (recovery replays from
        there); with a remote tier also those of segments not yet copied, which the copy takes along.
        Returns the lowest offset kept."""
        active = self._segments[-1]
        two_segments_min_offset = self._segments[-2].base_offset if len(self._segments) > 1 else active.base_offset
        index = bisect_right(self._base_offsets, self._recovery_point - 1) - 1
        recovery_point_offset = self._segments[index].base_offset if index >= 0 else self._recovery_point
        min_offset_to_retain = min(recovery_point_offset, two_segments_min_offset)
        if self._remote_log_enabled:
            min_offset_to_retain = min(min_offset_to_retain, self._highest_offset_in_remote_storage + 1)
        self._producer_state_manager.delete_snapshots_before(min_offset_to_retain)
        return min_offset_to_retain

    def fetch_producer_snapshot(self, offset: int) -> Path | None:
        return self._producer_state_manager.fetch_snapshot(offset)

    def load_producer_snapshot(self, data: bytes) -> None:
        """Adopt the producer state of a snapshot taken at the LEO elsewhere (the remote tier's copy, for a
        log that restarts where the remote tier ends)."""
        self._producer_state_manager.load_snapshot_bytes(data, self._next_offset, self._now_ms)

    # Durability

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync the segments holding offsets from the recovery point up to `up_to_offset` (exclusive; the
        whole log by default) and the directory, then advance the recovery point there."""
        offset = self._next_offset if up_to_offset is None else min(up_to_offset, self._next_offset)
        if up_to_offset is not None and offset <= self._recovery_point:
            return
        first = self._floor_index(self._recovery_point)
        for segment in self._segments[first:]:
            if up_to_offset is not None and segment.base_offset >= offset:
                break
            segment.flush()
        _fsync_dir(self._dir)
        self._recovery_point = max(self._recovery_point, offset)

    def flush_if_due(self, now_ms: int) -> None:
        """Periodic flushing: the segments rolled since the last call (Kafka's post-roll flush), and the whole
        log when flush.ms has passed since its last flush (never, by default: the OS writes back)."""
        self._now_ms = now_ms
        if self._pending_flush_offset is not None:
            offset, self._pending_flush_offset = self._pending_flush_offset, None
            self.flush(offset)
        if now_ms - self._last_flush_ms >= self._config.flush_ms:
            self.flush()
            self._last_flush_ms = now_ms

    def close(self) -> None:
        """Snapshot the producer state at the LEO (so the next start need not replay the log), then close
        every file; `*.deleted` segments are removed now, since nothing can read them any more."""
        self._producer_state_manager.take_snapshot()
        for segment, _ in self._deleted_segments:
            segment.delete()
        self._deleted_segments.clear()
        for segment in self._segments:
            segment.close()

    def close_handlers(self) -> None:
        """Close every file, of the `*.deleted` segments as of the live ones, without writing: for a log whose
        directory was renamed for deletion."""
        for segment in [*(deleted for deleted, _ in self._deleted_segments), *self._segments]:
            segment.close_handlers()
        self._deleted_segments.clear()

    def delete(self) -> None:
        """Close the log and remove its directory."""
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"Log(dir={str(self._dir)!r}, log_start_offset={self._log_start_offset}, "
            f"high_watermark={self._high_watermark}, log_end_offset={self._next_offset})"
        )


def _needs_recompression(header: RecordBatchHeader, compression: Compression) -> bool:
    """A batch not in the topic's codec is rebuilt in it, except an uncompressed control batch (Kafka's LogValidator:
    markers are not compressed unless written compressed)."""
    if header.is_control and header.compression_type == CompressionType.NONE:
        return False
    return header.compression_type != compression.type


def _rebuild_producer_state(
    producer_state: ProducerStateManager,
    segments: list[LogSegment],
    log_start_offset: int,
    last_offset: int,
    *,
    reload_from_clean_shutdown: bool,
    now_ms: int,
) -> None:
    """Kafka's UnifiedLog.rebuildProducerState: reload the latest snapshot at or below `last_offset` and
    replay the batches after it, snapshotting at the last two segments' bases and at the end.

    With no snapshot after a clean shutdown (a log written before producer state was kept) Kafka skips
    the scan and writes empty snapshots instead; so does this."""
    offsets_to_snapshot = {segment.base_offset for segment in segments[-2:]} | {last_offset}
    if producer_state.latest_snapshot_offset is None and reload_from_clean_shutdown:
        for offset in sorted(offsets_to_snapshot):
            producer_state.update_map_end_offset(offset)
            producer_state.take_snapshot()
        return
    # Nothing was known before a truncation, and truncating cannot add producers: skip the replay.
    was_empty = producer_state.is_empty and producer_state.map_end_offset >= last_offset
    producer_state.truncate_and_reload(log_start_offset, last_offset, now_ms)
    if last_offset > producer_state.map_end_offset and not was_empty:
        bases = [segment.base_offset for segment in segments]
        first = max(bisect_right(bases, producer_state.map_end_offset) - 1, 0)
        for segment in segments[first:]:
            if segment.base_offset >= last_offset:
                break
            start = max(segment.base_offset, producer_state.map_end_offset, log_start_offset)
            producer_state.update_map_end_offset(start)
            if segment.base_offset in offsets_to_snapshot:
                producer_state.take_snapshot()
            producer_state.load_producers_from_batches(_producer_batches(segment, start, last_offset))
    producer_state.update_map_end_offset(last_offset)
    producer_state.take_snapshot()


def _producer_batches(
    segment: LogSegment, start_offset: int, end_offset: int
) -> Iterator[tuple[RecordBatchHeader, EndTxnMarker | None]]:
    """The segment's batches holding offsets in [start_offset, end_offset) as producer state needs them: the
    header (producer id, epoch, base sequence, last offset delta, max timestamp, attributes) and, for a
    control batch, its marker. Only control batches are read whole."""
    batch = segment.translate_offset(start_offset)
    if batch is None:
        return
    fd = segment.file.fileno()
    position, size = batch.position, segment.size
    while size - position >= RECORD_BATCH_OVERHEAD:
        header = read_header(os.pread(fd, RECORD_BATCH_OVERHEAD, position))
        if header.base_offset >= end_offset:
            return
        marker = None
        if header.is_control and header.producer_id != NO_PRODUCER_ID:
            data = os.pread(fd, header.size_in_bytes, position)
            marker = end_txn_marker_of(data, read_header(data))
        yield header, marker
        position += header.size_in_bytes


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_temp_files_and_collect_swap_files(directory: Path) -> list[Path]:
    """Kafka's removeTempFilesAndCollectSwapFiles: delete `.deleted`, `.cleaned` and `.tmp` leftovers and
    return the `.swap` files of a compaction or split that completed but was not yet renamed into place."""
    swap_files: list[Path] = []
    cleaned_offsets: list[int] = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if not path.is_file():
            continue
        if name.endswith((DELETED_FILE_SUFFIX, _TMP_FILE_SUFFIX)):
            path.unlink()
        elif name.endswith(CLEANED_FILE_SUFFIX):
            cleaned_offsets.append(offset_from_file_name(name))
            path.unlink()
        elif name.endswith(SWAP_FILE_SUFFIX):
            swap_files.append(path)
    # KAFKA-6264: swap files at or above a `.cleaned` file belong to a split that never completed.
    min_cleaned = min(cleaned_offsets, default=None)
    valid: list[Path] = []
    for path in swap_files:
        if min_cleaned is not None and offset_from_file_name(path.name) >= min_cleaned:
            path.unlink()
        else:
            valid.append(path)
    return valid


def _complete_swaps(directory: Path, swap_files: list[Path], config: LogConfig, now_ms: int) -> None:
    """Kafka's LogLoader swap recovery: delete the segment files a swapped-in segment replaces, then
    rename every swap file into place."""
    replaced: list[tuple[int, int]] = []
    for path in swap_files:
        if path.name.endswith(LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX):
            segment = LogSegment.open(
                directory,
                offset_from_file_name(path.name),
                config,
                now_ms,
                file_already_exists=True,
                file_suffix=SWAP_FILE_SUFFIX,
            )
            replaced.append((segment.base_offset, segment.read_next_offset()))
            segment.close()
    if replaced:
        low = min(start for start, _ in replaced)
        high = max(end for _, end in replaced)
        for path in directory.iterdir():
            name = path.name
            if (
                path.is_file()
                and name[:1].isdigit()
                and not name.endswith(SWAP_FILE_SUFFIX)
                and low <= offset_from_file_name(name) < high
            ):
                path.unlink()
    for path in swap_files:
        os.replace(path, path.with_name(path.name[: -len(SWAP_FILE_SUFFIX)]))


class _SegmentRecoverer:
    """Kafka's LogLoader.recoverSegment: a segment is recovered with the producer state as of its base offset,
    rebuilt from the snapshots and the segments before it, so that the transactions it ends (some begun in
    earlier segments) get their txn index entries and it learns the transactions still open at its end; a
    snapshot at its end then spares the next segment's recovery a replay."""

    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        log_start_offset: int,
        leader_epoch_cache: LeaderEpochFileCache,
        producer_state_config: ProducerStateManagerConfig | None,
        now_ms: int,
    ) -> None:
        self._dir = directory
        self._topic_partition = topic_partition
        self._log_start_offset = log_start_offset
        self.leader_epoch_cache = leader_epoch_cache
        self._producer_state_config = producer_state_config
        self._now_ms = now_ms

    def recover(self, segment: LogSegment, earlier_segments: list[LogSegment]) -> int:
        """Recover `segment` (see LogSegment.recover); returns the number of bytes truncated."""
        producer_state = ProducerStateManager(self._topic_partition, self._dir, self._producer_state_config)
        _rebuild_producer_state(
            producer_state,
            [*earlier_segments, segment],
            self._log_start_offset,
            segment.base_offset,
            reload_from_clean_shutdown=False,
            now_ms=self._now_ms,
        )
        truncated = segment.recover(self.leader_epoch_cache, producer_state)
        producer_state.take_snapshot()
        return truncated


def _load_segment_files(
    directory: Path, config: LogConfig, recoverer: _SegmentRecoverer, now_ms: int
) -> list[LogSegment]:
    """Open every segment, deleting index files without a log and rebuilding missing or corrupt indexes."""
    segments: list[LogSegment] = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if not path.is_file() or not name[:1].isdigit():
            continue
        if name.endswith(_INDEX_SUFFIXES):
            if not log_file_path(directory, offset_from_file_name(name)).exists():
                path.unlink()
        elif name.endswith(LOG_FILE_SUFFIX):
            segment = LogSegment.open(directory, offset_from_file_name(name), config, now_ms, file_already_exists=True)
            try:
                segment.sanity_check()
            except CorruptIndexError:
                # Files are visited in name order, that is offset order: `segments` holds the earlier ones.
                recoverer.recover(segment, segments)
            segments.append(segment)
    return segments


def _recover_from(segments: list[LogSegment], recovery_point: int, recoverer: _SegmentRecoverer) -> None:
    """Kafka's recoverLog: validate each segment from the one holding the recovery point on; the first that
    loses bytes is truncated there and every later segment is deleted."""
    bases = [segment.base_offset for segment in segments]
    start = max(bisect_right(bases, recovery_point) - 1, 0)
    for index in range(start, len(segments)):
        if recoverer.recover(segments[index], segments[:index]) > 0:
            for segment in segments[index + 1 :]:
                segment.delete()
            del segments[index + 1 :]
            return
