"""Snapshots of the replicated log (KIP-630): Kafka's `.checkpoint` files in the partition directory.

A snapshot holds the state the log's records build up to its end offset (exclusive), so the log below that
offset may go and a replica too far behind loads the snapshot instead of replaying what is gone. Its id is
(end offset, epoch of the record before it) and its file `<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`
in the log's directory (Kafka's Snapshots.filenameFromSnapshotId). The file holds record batches as a segment
does, with offsets from 0 and the snapshot's epoch stamped on each (Kafka's RecordsSnapshotWriter): a control
batch holding the SnapshotHeaderRecord (control type 3), the data batches, and a control batch holding the
SnapshotFooterRecord (type 4), so a reader can tell a whole snapshot from one cut short.

A snapshot is written as `.checkpoint.part`, fsynced, renamed to `.checkpoint` and the directory fsynced, so a
`.checkpoint` file is always whole; the `.part` a crash leaves behind is deleted when the directory is next
opened (Kafka's KafkaMetadataLog.recoverSnapshots). docs/quorum.md#snapshots.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord
from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord
from kio.serial import entity_writer
from kio.static.primitive import i16, i64

from tierlog.protocol.tolerant_reader import tolerant_entity_reader
from tierlog.raft.messages import OffsetAndEpoch
from tierlog.records.codec import build_batch, decode_batch
from tierlog.records.record_batch import InvalidRecordError, batch_size_at
from tierlog.storage.checkpoints import fsync_directory

SNAPSHOT_SUFFIX = ".checkpoint"
PARTIAL_SUFFIX = ".checkpoint.part"
_SNAPSHOT_FILE_NAME = re.compile(r"(\d{20})-(\d{10})\.checkpoint")
# ControlRecordType ids, in a control record's key (version int16 0, type int16).
SNAPSHOT_HEADER_TYPE = 3
SNAPSHOT_FOOTER_TYPE = 4
# KRaft's largest batch (KafkaRaftClient.MAX_BATCH_SIZE_BYTES), of the log (one controller operation is one batch)
# and of snapshots alike.
MAX_BATCH_SIZE_BYTES = 8 * 1024 * 1024
_Entity = TypeVar("_Entity", SnapshotHeaderRecord, SnapshotFooterRecord)


class CorruptSnapshotError(ValueError):
    """A `.checkpoint` file that is not a whole snapshot."""


def snapshot_file_name(snapshot_id: OffsetAndEpoch) -> str:
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> OffsetAndEpoch | None:
    """The id of a finished snapshot's file name; None for any other name (a `.part` included)."""
    match = _SNAPSHOT_FILE_NAME.fullmatch(name)
    return None if match is None else OffsetAndEpoch(int(match[1]), int(match[2]))


@dataclass(frozen=True, slots=True)
class Snapshot:
    snapshot_id: OffsetAndEpoch
    # The timestamp of the last record of the log the snapshot holds (the header's LastContainedLogTimestamp).
    last_contained_log_timestamp: int
    # The values of the data records, in order (for the metadata log: metadata.records.encode_record's).
    values: list[bytes]


class SnapshotWriter:
    """A snapshot being written: bytes appended (the batches `snapshot_batches` builds, or a leader's snapshot
    as FetchSnapshot brings it, chunk by chunk), then `freeze` makes it a snapshot of the store."""

    def __init__(self, store: SnapshotStore, snapshot_id: OffsetAndEpoch) -> None:
        self.snapshot_id = snapshot_id
        self._store = store
        self._part = store.directory / (snapshot_file_name(snapshot_id)[: -len(SNAPSHOT_SUFFIX)] + PARTIAL_SUFFIX)
        # "wb" truncates a `.part` an earlier attempt left behind.
        self._file: BinaryIO | None = open(self._part, "wb")  # noqa: SIM115 - closed by freeze or abort
        self.size = 0

    def append(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError(f"snapshot {self.snapshot_id} is already frozen or aborted")
        self._file.write(data)
        self.size += len(data)

    def freeze(self) -> Path:
        """fsync the file, rename it into place and fsync the directory: from now on it is a snapshot of the
        store. Returns its path."""
        if self._file is None:
            raise ValueError(f"snapshot {self.snapshot_id} is already frozen or aborted")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        path = self._store.path(self.snapshot_id)
        os.replace(self._part, path)
        fsync_directory(self._store.directory)
        self._store.add(self.snapshot_id)
        return path

    def abort(self) -> None:
        """Give up the snapshot (a download the leader changed under): the `.part` goes."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._part.unlink(missing_ok=True)


class SnapshotStore:
    """The snapshots in one log directory. Opening it deletes the `.part` files a crash left behind."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        ids: list[OffsetAndEpoch] = []
        for path in directory.iterdir():
            if path.name.endswith(PARTIAL_SUFFIX):
                path.unlink()
            elif (snapshot_id := parse_snapshot_file_name(path.name)) is not None:
                ids.append(snapshot_id)
        self._ids = sorted(ids, key=_order)

    @property
    def ids(self) -> list[OffsetAndEpoch]:
        """Every snapshot's id, oldest first."""
        return list(self._ids)

    def latest_id(self) -> OffsetAndEpoch | None:
        return self._ids[-1] if self._ids else None

    def path(self, snapshot_id: OffsetAndEpoch) -> Path:
        return self.directory / snapshot_file_name(snapshot_id)

    def contains(self, snapshot_id: OffsetAndEpoch) -> bool:
        return snapshot_id in self._ids

    def size(self, snapshot_id: OffsetAndEpoch) -> int:
        return self.path(snapshot_id).stat().st_size

    def read_chunk(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the file from `position`: FetchSnapshot's answer, which may end inside a batch."""
        with open(self.path(snapshot_id), "rb") as f:
            f.seek(position)
            return f.read(max_bytes)

    def read(self, snapshot_id: OffsetAndEpoch) -> Snapshot:
        """The snapshot's records; CorruptSnapshotError if the file is not a whole snapshot."""
        return parse_snapshot(snapshot_id, self.path(snapshot_id).read_bytes())

    def writer(self, snapshot_id: OffsetAndEpoch) -> SnapshotWriter:
        return SnapshotWriter(self, snapshot_id)

    def write(
        self, snapshot_id: OffsetAndEpoch, values: Iterable[bytes], last_contained_log_timestamp: int, now_ms: int
    ) -> Path:
        """Write and freeze the snapshot of these record values."""
        writer = self.writer(snapshot_id)
        try:
            for batch in snapshot_batches(snapshot_id, values, last_contained_log_timestamp, now_ms):
                writer.append(batch)
        except BaseException:
            writer.abort()
            raise
        return writer.freeze()

    def add(self, snapshot_id: OffsetAndEpoch) -> None:
        if snapshot_id not in self._ids:
            self._ids = sorted([*self._ids, snapshot_id], key=_order)

    def delete_before(self, snapshot_id: OffsetAndEpoch) -> list[OffsetAndEpoch]:
        """Delete every snapshot older than `snapshot_id` (the log start has passed them); returns their ids."""
        doomed = [other for other in self._ids if _order(other) < _order(snapshot_id)]
        for other in doomed:
            self.path(other).unlink(missing_ok=True)
        if doomed:
            fsync_directory(self.directory)
        self._ids = [other for other in self._ids if other not in doomed]
        return doomed


def _order(snapshot_id: OffsetAndEpoch) -> tuple[int, int]:
    # Kafka's OffsetAndEpoch.compareTo: by offset, then epoch.
    return snapshot_id.offset, snapshot_id.epoch


def snapshot_batches(
    snapshot_id: OffsetAndEpoch, values: Iterable[bytes], last_contained_log_timestamp: int, now_ms: int
) -> Iterator[bytes]:
    """The batches of a snapshot file: header control batch, data batches of at most MAX_BATCH_SIZE_BYTES of
    values each (at least one record), footer control batch; offsets from 0, the snapshot's epoch on each."""
    header = SnapshotHeaderRecord(version=i16(0), last_contained_log_timestamp=i64(last_contained_log_timestamp))
    next_offset = 0

    def batch(records: list[bytes], control_type: int | None = None) -> bytes:
        nonlocal next_offset
        key = None if control_type is None else _control_key(control_type)
        data = build_batch(
            [(key, value, [], now_ms) for value in records],
            base_offset=next_offset,
            partition_leader_epoch=snapshot_id.epoch,
            control=control_type is not None,
        )
        next_offset += len(records)
        return data

    yield batch([_encode(SnapshotHeaderRecord, header)], SNAPSHOT_HEADER_TYPE)
    pending: list[bytes] = []
    pending_size = 0
    for value in values:
        if pending and pending_size + len(value) > MAX_BATCH_SIZE_BYTES:
            yield batch(pending)
            pending, pending_size = [], 0
        pending.append(value)
        pending_size += len(value)
    if pending:
        yield batch(pending)
    yield batch([_encode(SnapshotFooterRecord, SnapshotFooterRecord(version=i16(0)))], SNAPSHOT_FOOTER_TYPE)


def parse_snapshot(snapshot_id: OffsetAndEpoch, data: bytes) -> Snapshot:
    """The records of a snapshot file's bytes: whole, CRC-valid batches, the header first and the footer last;
    CorruptSnapshotError naming what is wrong otherwise."""
    name = snapshot_file_name(snapshot_id)
    header: SnapshotHeaderRecord | None = None
    footer_seen = False
    values: list[bytes] = []
    position = 0
    while position < len(data):
        size = batch_size_at(data, position)
        if size is None or size > len(data) - position:
            raise CorruptSnapshotError(f"snapshot {name} ends inside a batch at byte {position}")
        if footer_seen:
            raise CorruptSnapshotError(f"snapshot {name} has batches after its footer")
        try:
            batch = decode_batch(data, position)
        except InvalidRecordError as e:
            raise CorruptSnapshotError(f"snapshot {name}: {e}") from None
        position += size
        if batch.header.is_control:
            for record in batch.records:
                control_type = _control_type(name, record.key)
                if control_type == SNAPSHOT_HEADER_TYPE and header is None and not values:
                    header = _decode(name, SnapshotHeaderRecord, record.value)
                elif control_type == SNAPSHOT_FOOTER_TYPE and header is not None:
                    _decode(name, SnapshotFooterRecord, record.value)
                    footer_seen = True
                elif control_type in (SNAPSHOT_HEADER_TYPE, SNAPSHOT_FOOTER_TYPE):
                    raise CorruptSnapshotError(f"snapshot {name} has a header or footer out of place")
                # Other control records (Kafka's KRaftVersionRecord, VotersRecord) carry nothing tierlog uses.
            continue
        if header is None:
            raise CorruptSnapshotError(f"snapshot {name} does not start with a SnapshotHeaderRecord")
        for record in batch.records:
            if record.value is None:
                raise CorruptSnapshotError(f"snapshot {name} has a record without a value at {record.offset}")
            values.append(record.value)
    if header is None:
        raise CorruptSnapshotError(f"snapshot {name} has no SnapshotHeaderRecord")
    if not footer_seen:
        raise CorruptSnapshotError(f"snapshot {name} has no SnapshotFooterRecord: it was cut short")
    return Snapshot(snapshot_id, int(header.last_contained_log_timestamp), values)


def _control_key(control_type: int) -> bytes:
    return (0).to_bytes(2, "big") + control_type.to_bytes(2, "big")


def _control_type(name: str, key: bytes | None) -> int:
    if key is None or len(key) < 4:
        raise CorruptSnapshotError(f"snapshot {name} has a control record without a control key")
    return int.from_bytes(key[2:4], "big", signed=True)


def _encode(entity_type: type[SnapshotHeaderRecord] | type[SnapshotFooterRecord], entity: object) -> bytes:
    out = io.BytesIO()
    entity_writer(entity_type)(out, entity)
    return out.getvalue()


def _decode(name: str, entity_type: type[_Entity], value: bytes | None) -> _Entity:
    try:
        entity, _ = tolerant_entity_reader(entity_type)(memoryview(value or b""), 0)
    except ValueError as e:
        raise CorruptSnapshotError(f"snapshot {name} has an unreadable {entity_type.__name__}: {e}") from None
    return entity
