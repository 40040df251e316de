"""Checkpoint files in Kafka's text formats, byte for byte, so Kafka's own tools read ours and vice versa.

Mirrors Kafka's CheckpointFile (version line, count line, one entry per line), OffsetCheckpointFile,
LeaderEpochCheckpointFile and PartitionMetadataFile. Every write goes through `atomic_write_text`: a crash
leaves either the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from tierlog.common import TopicPartition
from tierlog.storage.epoch_entry import EpochEntry

# In each log dir's root (Kafka's ReplicaManager.HighWatermarkFilename and LogManager's constants).
HIGH_WATERMARK_FILENAME = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT_FILENAME = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILENAME = "log-start-offset-checkpoint"
# In each partition directory.
LEADER_EPOCH_CHECKPOINT_FILENAME = "leader-epoch-checkpoint"
PARTITION_METADATA_FILENAME = "partition.metadata"

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0

_T = TypeVar("_T")
_KAFKA_UUID = re.compile(r"[A-Za-z0-9_-]{22}(==)?")
_PARTITION_METADATA_SEPARATOR = re.compile(r":\s+")


class CheckpointFileError(OSError):
    """A checkpoint file that exists but cannot be parsed.

    An OSError, as Kafka raises IOException here: to the broker an unreadable checkpoint is a failed log
    directory, not a programming error.
    """


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` durably: write `<path>.tmp`, fsync it, rename it over `path`, fsync the
    directory so the rename itself survives a power loss (Kafka's Utils.atomicMoveWithFallback)."""
    tmp = path.with_name(path.name + ".tmp")
    # "wb" truncates a .tmp left behind by a crash in an earlier write.
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make the creations, renames and deletions of files in `directory` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def kafka_uuid_to_str(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes without padding (22 characters)."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode("ascii")


def kafka_uuid_from_str(s: str) -> uuid.UUID:
    """Kafka's Uuid.fromString; raises ValueError for anything that is not 16 base64url-encoded bytes."""
    if not _KAFKA_UUID.fullmatch(s):
        raise ValueError(f"{s!r} is not a base64url-encoded 16-byte Kafka Uuid")
    return uuid.UUID(bytes=base64.urlsafe_b64decode(s[:22] + "=="))


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointFileError(f"checkpoint file {path} is not UTF-8 text: {e}") from e


class _CheckpointFile(ABC, Generic[_T]):
    """Kafka's CheckpointFile<T>: `0`, the entry count, then one formatted entry per line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @abstractmethod
    def _format_entry(self, entry: _T) -> str: ...

    @abstractmethod
    def _parse_entry(self, fields: list[str]) -> _T:
        """Build an entry from a line's whitespace-separated fields; raise ValueError if they do not fit."""

    def _read_entries(self) -> list[_T]:
        text = _read_text(self.path)
        if text is None:
            return []
        lines = text.splitlines()
        # Like Kafka, a file cut short before its count line reads as empty (Kafka creates checkpoint files
        # empty and fills them later).
        if not lines:
            return []
        version = self._parse_int(lines[0], 1)
        if version != CHECKPOINT_VERSION:
            raise CheckpointFileError(
                f"checkpoint file {self.path} line 1: unrecognised version {version}, expected {CHECKPOINT_VERSION}"
            )
        if len(lines) < 2:
            return []
        expected = self._parse_int(lines[1], 2)
        entries = []
        for number, line in enumerate(lines[2:], start=3):
            try:
                entries.append(self._parse_entry(line.split()))
            except ValueError as e:
                raise CheckpointFileError(f"checkpoint file {self.path} line {number}: malformed entry {line!r}") from e
        if len(entries) != expected:
            raise CheckpointFileError(
                f"checkpoint file {self.path}: expected {expected} entries but found {len(entries)}"
            )
        return entries

    def _write_entries(self, entries: Sequence[_T]) -> None:
        lines = [str(CHECKPOINT_VERSION), str(len(entries))]
        lines.extend(self._format_entry(entry) for entry in entries)
        atomic_write_text(self.path, "".join(line + "\n" for line in lines))

    def _parse_int(self, line: str, number: int) -> int:
        try:
            return int(line.strip())
        except ValueError as e:
            raise CheckpointFileError(
                f"checkpoint file {self.path} line {number}: expected an integer, got {line!r}"
            ) from e

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"


class OffsetCheckpointFile(_CheckpointFile[tuple[TopicPartition, int]]):
    """`topic partition offset` per line: high watermarks, recovery points, log start offsets."""

    def read(self) -> dict[TopicPartition, int]:
        return dict(self._read_entries())

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._write_entries(list(offsets.items()))

    def _format_entry(self, entry: tuple[TopicPartition, int]) -> str:
        tp, offset = entry
        return f"{tp.topic} {tp.partition} {offset}"

    def _parse_entry(self, fields: list[str]) -> tuple[TopicPartition, int]:
        if len(fields) != 3:
            raise ValueError(f"expected 3 fields, got {len(fields)}")
        topic, partition, offset = fields
        return TopicPartition(topic, int(partition)), int(offset)


class LeaderEpochCheckpointFile(_CheckpointFile[EpochEntry]):
    """`epoch startOffset` per line, oldest epoch first."""

    def read(self) -> list[EpochEntry]:
        return self._read_entries()

    def write(self, entries: Sequence[EpochEntry]) -> None:
        self._write_entries(entries)

    def _format_entry(self, entry: EpochEntry) -> str:
        return f"{entry.epoch} {entry.start_offset}"

    def _parse_entry(self, fields: list[str]) -> EpochEntry:
        if len(fields) != 2:
            raise ValueError(f"expected 2 fields, got {len(fields)}")
        return EpochEntry(int(fields[0]), int(fields[1]))


class PartitionMetadataFile:
    """`version: 0` and `topic_id: <Kafka Uuid>`, which ties a partition directory to its topic's id so a
    directory left over from a deleted topic of the same name is recognised."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> uuid.UUID | None:
        text = _read_text(self.path)
        if text is None:
            return None
        lines = text.splitlines()
        version = self._field(lines, 0, "version")
        try:
            parsed_version = int(version)
        except ValueError as e:
            raise self._malformed(lines, 0) from e
        # Kafka accepts any version >= 0 so that a downgraded broker still reads a newer file.
        if parsed_version < PARTITION_METADATA_VERSION:
            raise CheckpointFileError(f"partition metadata file {self.path}: unrecognised version {version}")
        try:
            topic_id = kafka_uuid_from_str(self._field(lines, 1, "topic_id"))
        except ValueError as e:
            raise self._malformed(lines, 1) from e
        if topic_id.int == 0:
            raise CheckpointFileError(f"partition metadata file {self.path}: zero topic id")
        return topic_id

    def write(self, topic_id: uuid.UUID) -> None:
        # No newline after the id: Kafka's PartitionMetadata.encode writes none.
        atomic_write_text(
            self.path,
            f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {kafka_uuid_to_str(topic_id)}",
        )

    def _field(self, lines: list[str], index: int, key: str) -> str:
        parts = _PARTITION_METADATA_SEPARATOR.split(lines[index], maxsplit=1) if index < len(lines) else []
        if len(parts) != 2 or parts[0] != key:
            raise self._malformed(lines, index)
        return parts[1]

    def _malformed(self, lines: list[str], index: int) -> CheckpointFileError:
        line = lines[index] if index < len(lines) else None
        return CheckpointFileError(f"partition metadata file {self.path} line {index + 1}: malformed line {line!r}")

    def __repr__(self) -> str:
        return f"PartitionMetadataFile({str(self.path)!r})"
