"""Checkpoint files: Kafka's byte formats, atomic replacement, clear errors for damaged files."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tierlog.common import TopicPartition
from tierlog.storage import checkpoints
from tierlog.storage.checkpoints import (
    HIGH_WATERMARK_FILENAME,
    LEADER_EPOCH_CHECKPOINT_FILENAME,
    LOG_START_OFFSET_CHECKPOINT_FILENAME,
    PARTITION_METADATA_FILENAME,
    RECOVERY_POINT_CHECKPOINT_FILENAME,
    CheckpointFileError,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    PartitionMetadataFile,
    atomic_write_text,
    kafka_uuid_from_str,
    kafka_uuid_to_str,
)
from tierlog.storage.epoch_entry import EpochEntry


def test_file_names_are_kafkas() -> None:
    assert HIGH_WATERMARK_FILENAME == "replication-offset-checkpoint"
    assert RECOVERY_POINT_CHECKPOINT_FILENAME == "recovery-point-offset-checkpoint"
    assert LOG_START_OFFSET_CHECKPOINT_FILENAME == "log-start-offset-checkpoint"
    assert LEADER_EPOCH_CHECKPOINT_FILENAME == "leader-epoch-checkpoint"
    assert PARTITION_METADATA_FILENAME == "partition.metadata"


# --- atomic_write_text ----------------------------------------------------------------------------


def test_atomic_write_creates_and_replaces_without_leaving_tmp(tmp_path: Path) -> None:
    path = tmp_path / "f"
    atomic_write_text(path, "one\n")
    atomic_write_text(path, "two\n")
    assert path.read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_atomic_write_overwrites_a_tmp_left_by_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "f"
    (tmp_path / "f.tmp").write_text("half-written garbage that is longer than the new text")
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert not (tmp_path / "f.tmp").exists()


def test_crash_before_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / HIGH_WATERMARK_FILENAME
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("t", 0): 5})

    def crash(src: object, dst: object) -> None:
        raise OSError("power loss")

    monkeypatch.setattr(checkpoints.os, "replace", crash)
    with pytest.raises(OSError, match="power loss"):
        checkpoint.write({TopicPartition("t", 0): 9})
    monkeypatch.undo()
    # The reader only ever looks at the real name, so the fully written .tmp is ignored.
    assert (tmp_path / f"{HIGH_WATERMARK_FILENAME}.tmp").exists()
    assert checkpoint.read() == {TopicPartition("t", 0): 5}
    checkpoint.write({TopicPartition("t", 0): 9})
    assert checkpoint.read() == {TopicPartition("t", 0): 9}
    assert not (tmp_path / f"{HIGH_WATERMARK_FILENAME}.tmp").exists()


def test_atomic_write_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(checkpoints.os, "fsync", record)
    atomic_write_text(tmp_path / "f", "x")
    assert len(synced) == 2


# --- OffsetCheckpointFile -------------------------------------------------------------------------


def test_offset_checkpoint_format_is_byte_exact(tmp_path: Path) -> None:
    path = tmp_path / RECOVERY_POINT_CHECKPOINT_FILENAME
    OffsetCheckpointFile(path).write({TopicPartition("orders", 0): 42, TopicPartition("orders", 3): 0})
    assert path.read_bytes() == b"0\n2\norders 0 42\norders 3 0\n"


def test_offset_checkpoint_empty_mapping(tmp_path: Path) -> None:
    checkpoint = OffsetCheckpointFile(tmp_path / LOG_START_OFFSET_CHECKPOINT_FILENAME)
    checkpoint.write({})
    assert checkpoint.path.read_bytes() == b"0\n0\n"
    assert checkpoint.read() == {}


def test_offset_checkpoint_round_trip_with_dashes_and_dots(tmp_path: Path) -> None:
    offsets = {
        TopicPartition("my-topic", 0): 100,
        TopicPartition("my.topic-v2", 11): 2**62,
        TopicPartition("__consumer_offsets", 49): 7,
        TopicPartition("a-1", 1): 0,
    }
    checkpoint = OffsetCheckpointFile(tmp_path / HIGH_WATERMARK_FILENAME)
    checkpoint.write(offsets)
    assert checkpoint.read() == offsets
    assert "my.topic-v2 11 4611686018427387904\n" in checkpoint.path.read_text()


def test_offset_checkpoint_missing_file_reads_empty(tmp_path: Path) -> None:
    assert OffsetCheckpointFile(tmp_path / "absent").read() == {}


@pytest.mark.parametrize("text", ["", "0\n", "0"])
def test_offset_checkpoint_cut_before_count_reads_empty(tmp_path: Path, text: str) -> None:
    # Kafka creates checkpoint files empty, and reads a file without a count line as empty.
    path = tmp_path / "cp"
    path.write_text(text)
    assert OffsetCheckpointFile(path).read() == {}


def test_offset_checkpoint_reads_a_file_without_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_text("0\n1\nt 0 5")
    assert OffsetCheckpointFile(path).read() == {TopicPartition("t", 0): 5}


def assert_refused(file: OffsetCheckpointFile | PartitionMetadataFile, text: str, needle: str) -> None:
    """Reading `text` from `file` fails with a CheckpointFileError naming the file and saying `needle`."""
    file.path.write_text(text)
    with pytest.raises(CheckpointFileError) as info:
        file.read()
    assert str(file.path) in str(info.value)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("1\n0\n", "line 1: unrecognised version 1"),
        ("x\n0\n", "line 1: expected an integer"),
        ("0\ntwo\n", "line 2: expected an integer"),
        ("0\n2\nt 0 1\n", "expected 2 entries but found 1"),
        ("0\n1\nt 0 1\nt 1 2\n", "expected 1 entries but found 2"),
        ("0\n2\nt 0 1\nt 1\n", "line 4: malformed entry 't 1'"),
        ("0\n1\nt zero 1\n", "line 3: malformed entry"),
        ("0\n1\nt 0 1 9\n", "line 3: malformed entry"),
        ("0\n1\n\n", "line 3: malformed entry"),
    ],
)
def test_offset_checkpoint_malformed_names_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    assert_refused(OffsetCheckpointFile(tmp_path / HIGH_WATERMARK_FILENAME), text, needle)


def test_checkpoint_error_is_an_os_error(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(b"0\n1\n\xff 0 1\n")
    with pytest.raises(OSError, match="not UTF-8"):
        OffsetCheckpointFile(path).read()


# --- LeaderEpochCheckpointFile --------------------------------------------------------------------


def test_leader_epoch_checkpoint_format_is_byte_exact(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    LeaderEpochCheckpointFile(path).write([EpochEntry(0, 0), EpochEntry(1, 100), EpochEntry(3, 250)])
    assert path.read_bytes() == b"0\n3\n0 0\n1 100\n3 250\n"


def test_leader_epoch_checkpoint_round_trip_and_missing(tmp_path: Path) -> None:
    checkpoint = LeaderEpochCheckpointFile(tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME)
    assert checkpoint.read() == []
    entries = [EpochEntry(2, 30), EpochEntry(3, 50), EpochEntry(4, 70)]
    checkpoint.write(entries)
    assert checkpoint.read() == entries
    checkpoint.write([])
    assert checkpoint.read() == []


def test_leader_epoch_checkpoint_malformed(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILENAME
    path.write_text("0\n1\n3\n")
    with pytest.raises(CheckpointFileError, match="line 3: malformed entry '3'"):
        LeaderEpochCheckpointFile(path).read()


# --- Kafka Uuid -----------------------------------------------------------------------------------


def test_kafka_uuid_string_matches_kafka() -> None:
    # Kafka: new Uuid(0x0001020304050607L, 0x08090a0b0c0d0e0fL).toString()
    u = uuid.UUID(bytes=bytes(range(16)))
    assert kafka_uuid_to_str(u) == "AAECAwQFBgcICQoLDA0ODw"
    assert kafka_uuid_from_str("AAECAwQFBgcICQoLDA0ODw") == u
    # Kafka's ONE_UUID and METADATA_TOPIC_ID (0, 1).
    assert kafka_uuid_to_str(uuid.UUID(int=1)) == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_kafka_uuid_uses_the_url_safe_alphabet() -> None:
    u = uuid.UUID(bytes=b"\xfb\xff\xbf" * 5 + b"\xfb")
    assert kafka_uuid_to_str(u) == "-_-_-_-_-_-_-_-_-_-_-w"
    assert kafka_uuid_from_str("-_-_-_-_-_-_-_-_-_-_-w") == u


def test_kafka_uuid_round_trip_random() -> None:
    for _ in range(100):
        u = uuid.uuid4()
        assert kafka_uuid_from_str(kafka_uuid_to_str(u)) == u


def test_kafka_uuid_accepts_padding_like_javas_decoder() -> None:
    assert kafka_uuid_from_str("AAECAwQFBgcICQoLDA0ODw==") == uuid.UUID(bytes=bytes(range(16)))


@pytest.mark.parametrize(
    "bad", ["", "AAECAwQFBgcICQoLDA0O", "AAECAwQFBgcICQoLDA0ODwAA", "AAECAwQFBgcICQoLDA0OD+", "not a uuid"]
)
def test_kafka_uuid_rejects_bad_strings(bad: str) -> None:
    with pytest.raises(ValueError):
        kafka_uuid_from_str(bad)


# --- PartitionMetadataFile ------------------------------------------------------------------------


def test_partition_metadata_format_is_byte_exact(tmp_path: Path) -> None:
    path = tmp_path / PARTITION_METADATA_FILENAME
    PartitionMetadataFile(path).write(uuid.UUID(bytes=bytes(range(16))))
    assert path.read_bytes() == b"version: 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw"


def test_partition_metadata_round_trip_and_missing(tmp_path: Path) -> None:
    metadata = PartitionMetadataFile(tmp_path / PARTITION_METADATA_FILENAME)
    assert metadata.read() is None
    topic_id = uuid.uuid4()
    metadata.write(topic_id)
    assert metadata.read() == topic_id


def test_partition_metadata_reads_kafka_variants(tmp_path: Path) -> None:
    path = tmp_path / PARTITION_METADATA_FILENAME
    path.write_text("version: 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw\n")
    assert PartitionMetadataFile(path).read() == uuid.UUID(bytes=bytes(range(16)))
    # A newer version is read as long as the fields are there (Kafka's downgrade rule).
    path.write_text("version: 1\ntopic_id:   AAECAwQFBgcICQoLDA0ODw")
    assert PartitionMetadataFile(path).read() == uuid.UUID(bytes=bytes(range(16)))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "line 1"),
        ("version 0\ntopic_id: AAECAwQFBgcICQoLDA0ODw", "line 1"),
        ("version: zero\ntopic_id: AAECAwQFBgcICQoLDA0ODw", "line 1"),
        ("version: -1\ntopic_id: AAECAwQFBgcICQoLDA0ODw", "unrecognised version -1"),
        ("version: 0\n", "line 2"),
        ("version: 0\ntopicid: AAECAwQFBgcICQoLDA0ODw", "line 2"),
        ("version: 0\ntopic_id: AAEC", "line 2"),
        ("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", "zero topic id"),
    ],
)
def test_partition_metadata_malformed(tmp_path: Path, text: str, needle: str) -> None:
    assert_refused(PartitionMetadataFile(tmp_path / PARTITION_METADATA_FILENAME), text, needle)
