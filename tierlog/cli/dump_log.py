"""`tierlog dump-log`: print segment and index files the way Kafka's kafka-dump-log.sh (DumpLogSegments,
Kafka 3.9) does, line for line, so output can be compared with a Kafka broker's files by eye or by diff.

The .log walk reads batch by batch and decodes records only with --print-data-log. Where Kafka would stop
with an exception (a length below any batch's minimum, an old magic, a truncated header), this reports the
rest of the file as invalid bytes, as Kafka does for a partial batch at the end, instead of crashing.

Files go by Kafka's local names (00000000000000000000.log) and by the names their copies have in the remote
tier (00000000000000000000-<segment id>.log, see tiered/fsspec_storage.py), whose leader-epoch checkpoint
objects (.leader_epoch_checkpoint, the broker's leader-epoch-checkpoint as of the segment's end) are printed
too, one epoch per line; Kafka's tool has no such file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from crc32c import crc32c

from tierlog.raft.snapshot import SNAPSHOT_SUFFIX, parse_snapshot_file_name
from tierlog.records.codec import Record, decode_records
from tierlog.records.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CURRENT_MAGIC,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    CompressionType,
    InvalidRecordError,
    RecordBatchHeader,
    TimestampType,
    read_header,
)
from tierlog.storage.checkpoints import LEADER_EPOCH_CHECKPOINT_FILENAME, LeaderEpochCheckpointFile
from tierlog.storage.producer_state import PRODUCER_SNAPSHOT_FILE_SUFFIX, CorruptSnapshotError, read_snapshot
from tierlog.storage.transaction_index import ABORTED_TXN_VERSION, TXN_INDEX_FILE_SUFFIX, parse_aborted_txns
from tierlog.tiered.remote_storage_manager import IndexType

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
REMOTE_LEADER_EPOCH_SUFFIX = IndexType.LEADER_EPOCH.value
# A local file's name is its base offset; a remote object's adds the segment's id (a UUID).
_OFFSET_NAME = re.compile(r"(\d+)(-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?")

# Kafka's FileLogInputStream stops when not even the magic byte of the next batch is in the file.
HEADER_SIZE_UP_TO_MAGIC = MAGIC_OFFSET + 1
DELETE_HORIZON_FLAG_MASK = 0x40
RECORD_INDENT = "|"

_OFFSET_INDEX_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_INDEX_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_INT32_MAX = 2**31 - 1

# Kafka's ControlRecordType ids.
_CONTROL_RECORD_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_TIMESTAMP_TYPE_NAMES = {TimestampType.CREATE_TIME: "CreateTime", TimestampType.LOG_APPEND_TIME: "LogAppendTime"}


def dump_log(path: Path, *, print_data_log: bool, out: TextIO) -> None:
    """Print one .log, .index, .timeindex, .txnindex, .snapshot or metadata .checkpoint file as
    `kafka-dump-log.sh --files path` would, or a leader-epoch checkpoint."""
    out.write(f"Dumping {path}\n")
    if path.suffix == LOG_FILE_SUFFIX:
        out.write(f"Log starting offset: {_base_offset(path)}\n")
        _dump_batches(path, print_data_log, out)
    elif path.suffix == SNAPSHOT_SUFFIX:
        snapshot_id = parse_snapshot_file_name(path.name)
        if snapshot_id is None:
            raise ValueError(
                f"{path.name} is not named like a snapshot, <end offset, 20 digits>-<epoch, 10 digits>.checkpoint"
            )
        out.write(f"Snapshot end offset: {snapshot_id.offset}, epoch: {snapshot_id.epoch}\n")
        _dump_batches(path, print_data_log, out)
    elif path.suffix == INDEX_FILE_SUFFIX:
        _dump_offset_index(path, out)
    elif path.suffix == TIME_INDEX_FILE_SUFFIX:
        _dump_time_index(path, out)
    elif path.suffix == TXN_INDEX_FILE_SUFFIX:
        _dump_txn_index(path, out)
    elif path.suffix == PRODUCER_SNAPSHOT_FILE_SUFFIX:
        _dump_producer_snapshot(path, out)
    elif path.suffix == REMOTE_LEADER_EPOCH_SUFFIX or path.name == LEADER_EPOCH_CHECKPOINT_FILENAME:
        for entry in LeaderEpochCheckpointFile(path).read():
            out.write(f"epoch: {entry.epoch} startOffset: {entry.start_offset}\n")
    else:
        out.write(f"Ignoring unknown file {path}\n")


def _base_offset(path: Path) -> int:
    match = _OFFSET_NAME.fullmatch(path.name.split(".")[0])
    if match is None:
        raise ValueError(
            f"{path.name} is not named after its base offset, like 00000000000000000000.log (or, in the remote "
            "tier, 00000000000000000000-<segment id>.log)"
        )
    return int(match.group(1))


def _dump_batches(path: Path, print_data_log: bool, out: TextIO) -> None:
    with open(path, "rb") as f:
        valid_bytes = 0
        for header, batch in _file_batches(f):
            out.write(_batch_line(header, batch) + "\n")
            if print_data_log:
                _dump_records(header, batch, out)
            valid_bytes += header.size_in_bytes
        trailing_bytes = f.seek(0, os.SEEK_END) - valid_bytes
    if trailing_bytes > 0:
        out.write(f"Found {trailing_bytes} invalid bytes at the end of {path.name}\n")


def _file_batches(f: BinaryIO) -> Iterator[tuple[RecordBatchHeader, bytes]]:
    """Each batch of a segment file with its bytes, until the first one that is partial or unreadable."""
    position = 0
    while True:
        f.seek(position)
        head = f.read(HEADER_SIZE_UP_TO_MAGIC)
        if len(head) < HEADER_SIZE_UP_TO_MAGIC:
            return
        size = _INT32.unpack_from(head, LENGTH_OFFSET)[0] + LOG_OVERHEAD
        # Kafka raises on a length below any record's minimum and would print a v0/v1 batch; neither can
        # be a tierlog batch, so both end the walk like a partial batch.
        if head[MAGIC_OFFSET] != CURRENT_MAGIC or size < RECORD_BATCH_OVERHEAD:
            return
        batch = head + f.read(size - HEADER_SIZE_UP_TO_MAGIC)
        if len(batch) < size:
            return
        yield dataclasses.replace(read_header(batch), position=position), batch
        position += size


def _batch_line(header: RecordBatchHeader, batch: bytes) -> str:
    codec = header.attributes & COMPRESSION_CODEC_MASK
    codec_name = CompressionType(codec).name.lower() if codec <= CompressionType.ZSTD else f"unknown({codec})"
    delete_horizon = (
        f"OptionalLong[{header.base_timestamp}]"
        if header.attributes & DELETE_HORIZON_FLAG_MASK
        else "OptionalLong.empty"
    )
    is_valid = crc32c(batch[ATTRIBUTES_OFFSET:]) == header.crc
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count} "
        f"baseSequence: {header.base_sequence} "
        f"lastSequence: {_sequence(header.base_sequence, header.last_offset_delta)} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {_bool(header.is_transactional)} isControl: {_bool(header.is_control)} "
        f"deleteHorizonMs: {delete_horizon} position: {header.position} "
        f"{_TIMESTAMP_TYPE_NAMES[header.timestamp_type]}: {header.max_timestamp} "
        f"size: {header.size_in_bytes} magic: {header.magic} compresscodec: {codec_name} "
        f"crc: {header.crc} isvalid: {_bool(is_valid)}"
    )


def _dump_records(header: RecordBatchHeader, batch: bytes, out: TextIO) -> None:
    try:
        records = decode_records(batch, header)
    except InvalidRecordError as e:
        # Kafka's tool dies here with a stack trace; one line keeps the rest of the file readable.
        out.write(f"{RECORD_INDENT} {e}\n")
        return
    timestamp_name = _TIMESTAMP_TYPE_NAMES[header.timestamp_type]
    for record in records:
        header_keys = ",".join(key for key, _ in record.headers)
        line = (
            f"{RECORD_INDENT} offset: {record.offset} {timestamp_name}: {record.timestamp} "
            f"keySize: {_size(record.key)} valueSize: {_size(record.value)} "
            f"sequence: {_sequence(header.base_sequence, record.offset - header.base_offset)} "
            f"headerKeys: [{header_keys}]"
        )
        if header.is_control:
            line += _control_record_text(record)
        else:
            # Kafka's default StringDecoder: UTF-8 with replacement characters; absent key/value not shown.
            if record.key is not None:
                line += f" key: {record.key.decode('utf-8', 'replace')}"
            if record.value is not None:
                line += f" payload: {record.value.decode('utf-8', 'replace')}"
        out.write(line + "\n")


def _control_record_text(record: Record) -> str:
    key = record.key or b""
    type_id = _INT16.unpack_from(key, 2)[0] if len(key) >= 4 else -1
    name = _CONTROL_RECORD_TYPES.get(type_id, "UNKNOWN")
    value = record.value or b""
    if name in ("ABORT", "COMMIT") and len(value) >= 6:
        return f" endTxnMarker: {name} coordinatorEpoch: {_INT32.unpack_from(value, 2)[0]}"
    # SnapshotHeaderRecord/SnapshotFooterRecord v0, in Kafka's JSON converters' form.
    if name == "SNAPSHOT_HEADER" and len(value) >= 10:
        version, timestamp = struct.unpack_from(">hq", value)
        return f' SnapshotHeader {{"version":{version},"lastContainedLogTimestamp":{timestamp}}}'
    if name == "SNAPSHOT_FOOTER" and len(value) >= 2:
        return f' SnapshotFooter {{"version":{_INT16.unpack_from(value)[0]}}}'
    return f" controlType: {name}({type_id})"


def _dump_offset_index(path: Path, out: TextIO) -> None:
    base_offset = _base_offset(path)
    entries = list(_index_entries(path, _OFFSET_INDEX_ENTRY))
    if not entries:
        out.write(f"{path} is empty.\n")
        return
    for i, (relative_offset, position) in enumerate(entries):
        # A preallocated Kafka index is zero-filled after its last entry: the first zero entry ends it.
        if i > 0 and relative_offset == 0:
            return
        out.write(f"offset: {base_offset + relative_offset} position: {position}\n")


def _dump_time_index(path: Path, out: TextIO) -> None:
    base_offset = _base_offset(path)
    for i, (timestamp, relative_offset) in enumerate(_index_entries(path, _TIME_INDEX_ENTRY)):
        if i > 0 and relative_offset == 0:
            return
        out.write(f"timestamp: {timestamp} offset: {base_offset + relative_offset}\n")


def _dump_txn_index(path: Path, out: TextIO) -> None:
    """Kafka's dumpTxnIndex: one line per aborted transaction."""
    for txn in parse_aborted_txns(path.read_bytes(), path):
        out.write(
            f"version: {ABORTED_TXN_VERSION} producerId: {txn.producer_id} firstOffset: {txn.first_offset} "
            f"lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}\n"
        )


def _dump_producer_snapshot(path: Path, out: TextIO) -> None:
    """Kafka's dumpProducerIdSnapshot: one line per producer; a corrupt file's reason goes to stderr."""
    try:
        entries = read_snapshot(path)
    except CorruptSnapshotError as e:
        print(e, file=sys.stderr)
        return
    for entry in entries:
        # Kafka prints its Java OptionalLong.
        txn_first_offset = entry.current_txn_first_offset
        txn = "OptionalLong.empty" if txn_first_offset is None else f"OptionalLong[{txn_first_offset}]"
        line = (
            f"producerId: {entry.producer_id} producerEpoch: {entry.producer_epoch} coordinatorEpoch: "
            f"{entry.coordinator_epoch} currentTxnFirstOffset: {txn} "
            f"lastTimestamp: {entry.last_timestamp} "
        )
        if entry.batch_metadata:
            batch = entry.batch_metadata[0]
            line += (
                f"firstSequence: {batch.first_seq} lastSequence: {batch.last_seq} lastOffset: {batch.last_offset} "
                f"offsetDelta: {batch.offset_delta} timestamp: {batch.timestamp}"
            )
        out.write(line + "\n")


def _index_entries(path: Path, entry: struct.Struct) -> Iterator[tuple[int, int]]:
    data = path.read_bytes()
    # A partial entry at the end (a crash mid-append) is ignored, as Kafka rounds the size down.
    yield from entry.iter_unpack(data[: len(data) - len(data) % entry.size])


def _sequence(base_sequence: int, offset_delta: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: producer sequences wrap at Integer.MAX_VALUE to 0."""
    if base_sequence < 0:
        return -1
    if base_sequence > _INT32_MAX - offset_delta:
        return offset_delta - (_INT32_MAX - base_sequence) - 1
    return base_sequence + offset_delta


def _size(data: bytes | None) -> int:
    return -1 if data is None else len(data)


def _bool(value: bool) -> str:
    return "true" if value else "false"
