"""Kafka's LogSegment: one `.log` file of record batches with its `.index`, `.timeindex` and `.txnindex`.

A segment with base offset B lives in `{B:020d}.log`, `{B:020d}.index` and `{B:020d}.timeindex` (and
`{B:020d}.txnindex` once it holds an aborted transaction's marker); B is at or
below every offset in it and above every offset of earlier segments. The log file stays open for the
segment's lifetime (O_APPEND for writes, `os.pread` for reads, so neither disturbs the other) and its size
is tracked in memory: an append is one `write` and never reads the file back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from tierlog.records.record_batch import (
    LOG_OVERHEAD,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    InvalidRecordError,
    RecordBatchHeader,
    batch_size_at,
    validate_batch,
)
from tierlog.storage.errors import CorruptIndexError, KafkaStorageError, LogSegmentOffsetOverflowError
from tierlog.storage.file_records import (
    BatchPosition,
    FetchDataInfo,
    FileSlice,
    TimestampAndOffset,
    largest_timestamp_after,
    last_batch_boundary,
    scan_batches,
    search_for_offset,
    search_for_timestamp,
)
from tierlog.storage.offset_index import OffsetIndex
from tierlog.storage.producer_state import AppendOrigin, end_txn_marker_of
from tierlog.storage.time_index import TimeIndex, TimestampOffset
from tierlog.storage.transaction_index import TXN_INDEX_FILE_SUFFIX, AbortedTxn, TransactionIndex

if TYPE_CHECKING:
    from tierlog.storage.leader_epoch_cache import LeaderEpochFileCache
    from tierlog.storage.log_config import LogConfig
    from tierlog.storage.producer_state import CompletedTxn, ProducerStateManager

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
DELETED_FILE_SUFFIX = ".deleted"
CLEANED_FILE_SUFFIX = ".cleaned"
SWAP_FILE_SUFFIX = ".swap"

# Recovery reads the log in chunks of this size (or one batch, if larger) to check CRCs.
_RECOVERY_READ_SIZE = 4 * 1024 * 1024


def filename_prefix_from_offset(offset: int) -> str:
    return f"{offset:020d}"


def log_file_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{LOG_FILE_SUFFIX}{suffix}"


def offset_index_file_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{INDEX_FILE_SUFFIX}{suffix}"


def time_index_file_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{TIME_INDEX_FILE_SUFFIX}{suffix}"


def txn_index_file_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{TXN_INDEX_FILE_SUFFIX}{suffix}"


def offset_from_file_name(name: str) -> int:
    """The base offset a segment file's name starts with; ValueError if it does not start with digits."""
    return int(name[: name.index(".")])


class LogSegment:
    def __init__(
        self,
        file: BinaryIO,
        log_path: Path,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        txn_index: TransactionIndex,
        base_offset: int,
        index_interval_bytes: int,
        created_ms: int,
    ) -> None:
        self._file = file
        self._fd = file.fileno()
        self.log_path = log_path
        self.offset_index = offset_index
        self.time_index = time_index
        self.txn_index = txn_index
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self._created_ms = created_ms
        self._size = os.fstat(self._fd).st_size
        self._bytes_since_last_index_entry = 0
        # Max timestamp of the first batch, the reference of time-based rolling; loaded on first use.
        self._rolling_based_timestamp: int | None = None
        # Largest batch max timestamp and the last offset of its batch; read from the time index on first use.
        self._max_timestamp_and_offset: TimestampOffset | None = None

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        now_ms: int,
        *,
        file_already_exists: bool = False,
        file_suffix: str = "",
    ) -> LogSegment:
        """Open a segment's files. A new segment starts empty, replacing any leftover files of that name."""
        log_path = log_file_path(directory, base_offset, file_suffix)
        file: BinaryIO = open(log_path, "a+b", buffering=0)  # noqa: SIM115 - owned by the segment
        offset_index = OffsetIndex(
            offset_index_file_path(directory, base_offset, file_suffix), base_offset, config.segment_index_bytes
        )
        time_index = TimeIndex(
            time_index_file_path(directory, base_offset, file_suffix), base_offset, config.segment_index_bytes
        )
        txn_index = TransactionIndex(txn_index_file_path(directory, base_offset, file_suffix), base_offset)
        if not file_already_exists:
            os.ftruncate(file.fileno(), 0)
            offset_index.reset()
            time_index.reset()
            txn_index.reset()
        return cls(
            file, log_path, offset_index, time_index, txn_index, base_offset, config.index_interval_bytes, now_ms
        )

    @property
    def file(self) -> BinaryIO:
        return self._file

    @property
    def size(self) -> int:
        return self._size

    @property
    def max_timestamp_and_offset_so_far(self) -> TimestampOffset:
        if self._max_timestamp_and_offset is None:
            self._max_timestamp_and_offset = self.time_index.last_entry
        return self._max_timestamp_and_offset

    @property
    def max_timestamp_so_far(self) -> int:
        return self.max_timestamp_and_offset_so_far.timestamp

    @property
    def last_modified_ms(self) -> int:
        return os.stat(self.log_path).st_mtime_ns // 1_000_000

    @property
    def largest_timestamp(self) -> int:
        """The largest batch timestamp, or, for a segment without timestamps, when its file last changed
        (Kafka's choice: retention then ages such a segment by its last write)."""
        largest = self.max_timestamp_so_far
        return largest if largest >= 0 else self.last_modified_ms

    def sanity_check(self) -> None:
        """Raise CorruptIndexError if an index file is missing, malformed, or points past the log."""
        for index in (self.offset_index, self.time_index):
            if not index.path.exists():
                raise CorruptIndexError(f"Index file {index.path} does not exist")
            index.sanity_check()
        self.txn_index.sanity_check()
        if self.offset_index.last_position >= max(self._size, 1):
            raise CorruptIndexError(
                f"Index file {self.offset_index.path} points to position {self.offset_index.last_position} "
                f"beyond the end of its log ({self._size} bytes)"
            )

    def append(
        self,
        largest_offset: int,
        largest_timestamp: int,
        offset_of_max_timestamp: int,
        records: bytes | bytearray | memoryview,
    ) -> None:
        """Append whole batches whose offsets are already assigned, adding an index entry for the append
        once index.interval.bytes have been written since the previous one."""
        size = len(records)
        if not size:
            return
        position = self._size
        if position == 0:
            self._rolling_based_timestamp = largest_timestamp
        if not self.offset_index.can_append_offset(largest_offset):
            raise LogSegmentOffsetOverflowError(
                f"Detected offset overflow at offset {largest_offset} in segment {self.log_path}"
            )
        try:
            self._write(records, position)
            self._size = position + size
            max_so_far = self.max_timestamp_and_offset_so_far
            if largest_timestamp > max_so_far.timestamp:
                max_so_far = self._max_timestamp_and_offset = TimestampOffset(
                    largest_timestamp, offset_of_max_timestamp
                )
            if self._bytes_since_last_index_entry > self.index_interval_bytes:
                self.offset_index.append(largest_offset, position)
                self.time_index.maybe_append(max_so_far.timestamp, max_so_far.offset)
                self._bytes_since_last_index_entry = 0
            self._bytes_since_last_index_entry += size
        except OSError as e:
            raise KafkaStorageError(f"Error while appending to {self.log_path}: {e}") from e

    def _write(self, records: bytes | bytearray | memoryview, position: int) -> None:
        try:
            written = os.write(self._fd, records)
            if written < len(records):
                view = memoryview(records)
                while written < len(view):
                    written += os.write(self._fd, view[written:])
        except OSError:
            # Leave no torn batch behind for later appends to follow.
            os.ftruncate(self._fd, position)
            raise

    def translate_offset(self, offset: int, starting_position: int = 0) -> BatchPosition | None:
        """The first batch whose last offset is >= `offset`, searched from the index's lower bound."""
        position = max(self.offset_index.lookup(offset).position, starting_position)
        return search_for_offset(self._fd, offset, position, self._size)

    def read(
        self, start_offset: int, max_size: int, max_position: int | None = None, min_one_message: bool = False
    ) -> FetchDataInfo | None:
        """Whole batches from the one holding `start_offset`, at most `max_size` bytes and none at or past
        `max_position` (a batch boundary); with `min_one_message` the first batch comes even if larger.
        None if no batch here ends at or after `start_offset`."""
        if max_size < 0:
            raise ValueError(f"Invalid max size {max_size} for log read from segment {self.log_path}")
        batch = self.translate_offset(start_offset)
        if batch is None:
            return None
        end = self._size if max_position is None else max_position
        wanted = max(max_size, batch.size) if min_one_message else max_size
        limit = min(batch.position + wanted, end)
        if limit < end:
            # Cut back to a batch boundary; the index skips most of the headers between.
            scan_from = max(batch.position, self.offset_index.floor_position(limit))
            limit = last_batch_boundary(self._fd, scan_from, limit)
        size = limit - batch.position
        return FetchDataInfo(start_offset, FileSlice(self._file, batch.position, size) if size > 0 else None)

    def recover(
        self, leader_epoch_cache: LeaderEpochFileCache | None = None, producer_state: ProducerStateManager | None = None
    ) -> int:
        """Validate every batch (CRC included), rebuild the indexes, and truncate the log at the first
        invalid or torn batch. Returns the number of bytes truncated. With `producer_state` (as of this
        segment's base offset) every batch updates it, and each aborted transaction a marker here ends goes
        into the rebuilt txn index (docs/transactions.md#recovery)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.txn_index.reset()
        max_so_far = TimestampOffset(NO_TIMESTAMP, self.base_offset)
        valid_bytes = 0
        last_index_entry = 0
        next_offset = self.base_offset
        buffer = b""
        buffer_start = 0
        while self._size - valid_bytes >= LOG_OVERHEAD:
            if valid_bytes + LOG_OVERHEAD > buffer_start + len(buffer):
                buffer, buffer_start = os.pread(self._fd, _RECOVERY_READ_SIZE, valid_bytes), valid_bytes
            size = batch_size_at(buffer, valid_bytes - buffer_start)
            if size is None or size < RECORD_BATCH_OVERHEAD or valid_bytes + size > self._size:
                break
            if valid_bytes + size > buffer_start + len(buffer):
                buffer, buffer_start = os.pread(self._fd, max(size, _RECOVERY_READ_SIZE), valid_bytes), valid_bytes
            try:
                header = validate_batch(buffer, valid_bytes - buffer_start)
            except InvalidRecordError:
                break
            # baseOffset is outside the CRC, so a damaged one is caught only by offsets going backwards.
            if header.base_offset < next_offset or not self.offset_index.can_append_offset(header.last_offset):
                break
            if header.max_timestamp > max_so_far.timestamp:
                max_so_far = TimestampOffset(header.max_timestamp, header.last_offset)
            if valid_bytes - last_index_entry > self.index_interval_bytes and not self.offset_index.is_full:
                self.offset_index.append(header.last_offset, valid_bytes)
                self.time_index.maybe_append(max_so_far.timestamp, max_so_far.offset, skip_full_check=True)
                last_index_entry = valid_bytes
            valid_bytes += size
            next_offset = header.last_offset + 1
            epoch = header.partition_leader_epoch
            if leader_epoch_cache is not None and epoch >= 0:
                latest = leader_epoch_cache.latest_epoch
                if latest is None or epoch > latest:
                    leader_epoch_cache.assign(epoch, header.base_offset)
            if producer_state is not None:
                try:
                    self._update_producer_state(producer_state, buffer, header)
                except InvalidRecordError:
                    # Kafka's recover: a batch whose marker cannot be read ends the valid part after it.
                    break
        truncated = self._size - valid_bytes
        if truncated:
            os.ftruncate(self._fd, valid_bytes)
            self._size = valid_bytes
        # A cleanly closed segment ends its time index with its largest timestamp; recovery does the same.
        self.time_index.maybe_append(max_so_far.timestamp, max_so_far.offset, skip_full_check=True)
        self._max_timestamp_and_offset = max_so_far
        self._rolling_based_timestamp = None
        self._bytes_since_last_index_entry = valid_bytes - last_index_entry
        return truncated

    def _update_producer_state(
        self, producer_state: ProducerStateManager, buffer: bytes, header: RecordBatchHeader
    ) -> None:
        """Kafka's LogSegment.updateProducerState: replay one recovered batch, indexing the transaction its
        marker aborts."""
        if header.producer_id != NO_PRODUCER_ID:
            info = producer_state.prepare_update(header.producer_id, AppendOrigin.REPLICATION)
            marker = end_txn_marker_of(buffer, header)
            completed = info.append(header, header.base_offset, header.last_offset, marker)
            producer_state.update(info)
            if completed is not None:
                self.complete_txn(producer_state, completed)
        producer_state.update_map_end_offset(header.last_offset + 1)

    def complete_txn(self, producer_state: ProducerStateManager, txn: CompletedTxn) -> None:
        """A marker in this segment completed `txn` (Kafka's updateTxnIndex, then completeTxn): an aborted one
        goes into the txn index with the LSO as it is once the transaction is complete."""
        if txn.is_aborted:
            last_stable_offset = producer_state.last_stable_offset(txn)
            self.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, last_stable_offset))
        producer_state.complete_txn(txn)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch ending at or after `offset` (a batch holding it goes whole) and the index
        entries for them. Returns the number of log bytes removed."""
        batch = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        truncated = 0
        if batch is not None:
            truncated = self._size - batch.position
            os.ftruncate(self._fd, batch.position)
            self._size = batch.position
        if self._size == 0:
            self._rolling_based_timestamp = None
        self._bytes_since_last_index_entry = 0
        if self.max_timestamp_so_far >= 0:
            self._max_timestamp_and_offset = self._read_largest_timestamp()
        return truncated

    def _read_largest_timestamp(self) -> TimestampOffset:
        last_entry = self.time_index.last_entry
        position = self.offset_index.lookup(last_entry.offset).position
        timestamp, offset = largest_timestamp_after(self._fd, position, self._size)
        if timestamp > last_entry.timestamp:
            return TimestampOffset(timestamp, offset)
        return last_entry

    def read_next_offset(self) -> int:
        """The offset after the last batch: a scan from the last index entry (Kafka's readNextOffset)."""
        next_offset = self.base_offset
        for batch in scan_batches(self._fd, self.offset_index.last_position, self._size):
            next_offset = batch.last_offset + 1
        return next_offset

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> TimestampAndOffset | None:
        """The first record at or after `starting_offset` whose timestamp is >= `timestamp`."""
        indexed = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(indexed.offset, starting_offset)).position
        return search_for_timestamp(self._fd, timestamp, position, self._size, starting_offset)

    def should_roll(
        self,
        *,
        max_segment_bytes: int,
        max_segment_ms: int,
        max_timestamp_in_messages: int,
        max_offset_in_messages: int,
        messages_size: int,
        now_ms: int,
    ) -> bool:
        """Kafka's LogSegment.shouldRoll with no roll jitter."""
        size = self._size
        return (
            size > max_segment_bytes - messages_size
            or (size > 0 and self.time_waited_for_roll(now_ms, max_timestamp_in_messages) > max_segment_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or not self.offset_index.can_append_offset(max_offset_in_messages)
        )

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """Age of the segment for segment.ms: from its first batch's timestamp to the new batch's, or from
        its creation to now when the first batch has no timestamp."""
        if self._rolling_based_timestamp is None and self._size:
            first = next(scan_batches(self._fd, 0, self._size), None)
            if first is not None:
                self._rolling_based_timestamp = first.max_timestamp
        if self._rolling_based_timestamp is not None and self._rolling_based_timestamp >= 0:
            return message_timestamp - self._rolling_based_timestamp
        return now_ms - self._created_ms

    def on_become_inactive(self) -> None:
        """Kafka's onBecomeInactiveSegment: end the time index with the segment's largest timestamp, which
        retention reads after a restart."""
        largest = self.max_timestamp_and_offset_so_far
        self.time_index.maybe_append(largest.timestamp, largest.offset, skip_full_check=True)

    def flush(self) -> None:
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the segment's files (e.g. to `.deleted`); the open handle keeps serving reads."""
        self.log_path = _rename(self.log_path, old_suffix, new_suffix)
        for index in (self.offset_index, self.time_index, self.txn_index):
            index.rename_to(_replace_suffix(index.path, old_suffix, new_suffix))

    def close(self) -> None:
        if self._max_timestamp_and_offset is not None:
            self.on_become_inactive()
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        self._file.close()

    def close_handlers(self) -> None:
        """Close the files without writing anything (Kafka's closeHandlers), for a segment whose
        directory was renamed or removed."""
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        self._file.close()

    def delete(self) -> None:
        """Close the segment and remove its files."""
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self._file.close()
        self.log_path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self._size}, path={str(self.log_path)!r})"


def _replace_suffix(path: Path, old_suffix: str, new_suffix: str) -> Path:
    if not path.name.endswith(old_suffix):
        raise ValueError(f"{path} does not end with {old_suffix!r}")
    return path.with_name(path.name[: len(path.name) - len(old_suffix)] + new_suffix)


def _rename(path: Path, old_suffix: str, new_suffix: str) -> Path:
    target = _replace_suffix(path, old_suffix, new_suffix)
    os.replace(path, target)
    return target
