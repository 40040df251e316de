"""Snapshot files are Kafka's (KIP-630): named `<end offset>-<epoch>.checkpoint`, a header control batch, the data
batches and a footer control batch; written atomically, so a torn write is never taken for a snapshot."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import (
    ClusterIdRecord,
    Endpoint,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    decode_record,
    encode_record,
)
from tierlog.raft import snapshot
from tierlog.raft.messages import OffsetAndEpoch
from tierlog.raft.snapshot import (
    CorruptSnapshotError,
    SnapshotStore,
    parse_snapshot_file_name,
    snapshot_file_name,
)
from tierlog.records.codec import decode_batches

SNAPSHOT_ID = OffsetAndEpoch(1234, 7)
NOW_MS = 1_700_000_000_000


def test_a_snapshot_file_is_named_after_its_end_offset_and_epoch_as_kafka_names_it() -> None:
    assert snapshot_file_name(SNAPSHOT_ID) == "00000000000000001234-0000000007.checkpoint"
    assert parse_snapshot_file_name("00000000000000001234-0000000007.checkpoint") == SNAPSHOT_ID
    for other in ("00000000000000001234-0000000007.checkpoint.part", "00000000000000000000.log", "quorum-state"):
        assert parse_snapshot_file_name(other) is None


def test_a_snapshot_is_a_header_batch_the_data_batches_and_a_footer_batch(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = store.write(SNAPSHOT_ID, [b"one", b"two", b"three"], last_contained_log_timestamp=42, now_ms=NOW_MS)
    assert path == tmp_path / "00000000000000001234-0000000007.checkpoint"
    batches = list(decode_batches(path.read_bytes()))
    assert [batch.header.is_control for batch in batches] == [True, False, True]
    # RecordsSnapshotWriter: offsets from 0, the snapshot's epoch stamped on every batch.
    assert [record.offset for batch in batches for record in batch.records] == [0, 1, 2, 3, 4]
    assert {batch.header.partition_leader_epoch for batch in batches} == {7}
    (header,) = batches[0].records
    # Control record key: version 0, type 3 (SNAPSHOT_HEADER); value: SnapshotHeaderRecord v0 (Version int16,
    # LastContainedLogTimestamp int64, no tagged fields).
    assert header.key == b"\x00\x00\x00\x03"
    assert header.value == b"\x00\x00" + (42).to_bytes(8, "big") + b"\x00"
    assert [record.value for record in batches[1].records] == [b"one", b"two", b"three"]
    (footer,) = batches[2].records
    assert footer.key == b"\x00\x00\x00\x04"
    assert footer.value == b"\x00\x00\x00"
    read = store.read(SNAPSHOT_ID)
    assert (read.snapshot_id, read.last_contained_log_timestamp, read.values) == (
        SNAPSHOT_ID,
        42,
        [b"one", b"two", b"three"],
    )


def test_data_beyond_the_largest_batch_is_split_into_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "MAX_BATCH_SIZE_BYTES", 10)
    values = [b"abcd", b"efgh", b"ijkl", b"0123456789abcdef", b"x"]
    path = SnapshotStore(tmp_path).write(SNAPSHOT_ID, values, 0, NOW_MS)
    batches = list(decode_batches(path.read_bytes()))
    assert [[r.value for r in b.records] for b in batches[1:-1]] == [
        [b"abcd", b"efgh"],
        [b"ijkl"],
        [b"0123456789abcdef"],
        [b"x"],
    ]
    assert SnapshotStore(tmp_path).read(SNAPSHOT_ID).values == values


def test_a_snapshot_being_written_is_only_a_part_file_until_frozen(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    writer = store.writer(SNAPSHOT_ID)
    writer.append(b"partial bytes")
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000001234-0000000007.checkpoint.part"]
    assert store.latest_id() is None
    assert SnapshotStore(tmp_path).ids == []
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_torn_part_file_left_by_a_crash_is_ignored_and_deleted_at_open(tmp_path: Path) -> None:
    SnapshotStore(tmp_path).write(OffsetAndEpoch(10, 1), [b"a"], 0, NOW_MS)
    (tmp_path / "00000000000000000020-0000000001.checkpoint.part").write_bytes(b"\x00\x00torn")
    store = SnapshotStore(tmp_path)
    assert store.ids == [OffsetAndEpoch(10, 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000010-0000000001.checkpoint"]


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        (lambda data: data[:-5], r"ends inside a batch"),
        (lambda data: data[: _footer_position(data)], r"has no SnapshotFooterRecord: it was cut short"),
        (lambda data: data[:30] + bytes([data[30] ^ 0xFF]) + data[31:], r"has CRC"),
        (lambda data: data[_first_batch_size(data) :], r"does not start with a SnapshotHeaderRecord"),
        (lambda data: data + data[_footer_position(data) :], r"has batches after its footer"),
    ],
    ids=["torn batch", "no footer", "bad crc", "no header", "after footer"],
)
def test_a_damaged_snapshot_is_refused_naming_the_fault(
    tmp_path: Path, damage: Callable[[bytes], bytes], complaint: str
) -> None:
    store = SnapshotStore(tmp_path)
    path = store.write(SNAPSHOT_ID, [b"one", b"two"], 0, NOW_MS)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(
        CorruptSnapshotError, match=r"^snapshot 00000000000000001234-0000000007.checkpoint.*" + complaint
    ):
        store.read(SNAPSHOT_ID)


def _first_batch_size(data: bytes) -> int:
    return int.from_bytes(data[8:12], "big") + 12


def _footer_position(data: bytes) -> int:
    position = 0
    positions = []
    while position < len(data):
        positions.append(position)
        position += int.from_bytes(data[position + 8 : position + 12], "big") + 12
    return positions[-1]


def test_a_snapshot_fetched_in_chunks_is_the_same_snapshot(tmp_path: Path) -> None:
    """FetchSnapshot: the leader sends the file in chunks (cut anywhere, even inside a batch); the follower
    appends them to a `.part` and freezes it."""
    leader = SnapshotStore(tmp_path / "leader")
    leader.write(SNAPSHOT_ID, [bytes([n]) * 100 for n in range(50)], 5, NOW_MS)
    follower = SnapshotStore(tmp_path / "follower")
    writer = follower.writer(SNAPSHOT_ID)
    size = leader.size(SNAPSHOT_ID)
    while writer.size < size:
        writer.append(leader.read_chunk(SNAPSHOT_ID, writer.size, 333))
    writer.freeze()
    assert follower.ids == [SNAPSHOT_ID]
    assert follower.path(SNAPSHOT_ID).read_bytes() == leader.path(SNAPSHOT_ID).read_bytes()
    assert follower.read(SNAPSHOT_ID) == leader.read(SNAPSHOT_ID)


def test_snapshots_are_ordered_by_offset_then_epoch_and_older_ones_deleted(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for snapshot_id in (OffsetAndEpoch(30, 2), OffsetAndEpoch(10, 1), OffsetAndEpoch(30, 3), OffsetAndEpoch(20, 2)):
        store.write(snapshot_id, [b"v"], 0, NOW_MS)
    expected = [OffsetAndEpoch(10, 1), OffsetAndEpoch(20, 2), OffsetAndEpoch(30, 2), OffsetAndEpoch(30, 3)]
    assert store.ids == expected
    assert SnapshotStore(tmp_path).ids == expected
    assert store.latest_id() == OffsetAndEpoch(30, 3)
    assert store.delete_before(OffsetAndEpoch(30, 2)) == expected[:2]
    assert store.ids == expected[2:]
    assert SnapshotStore(tmp_path).ids == expected[2:]


def test_a_metadata_image_survives_a_snapshot_file(tmp_path: Path) -> None:
    topic_id = uuid.UUID(int=5)
    image = ClusterMetadata()
    for offset, record in enumerate(
        [
            ClusterIdRecord("MkU3OEVBNTcwNTJENDM2Qk"),
            RegisterBrokerRecord(1, "inc", 1, (Endpoint("PLAINTEXT", "h", 9092),), None, False),
            TopicRecord("events", topic_id),
            PartitionRecord(topic_id, 0, (1,), (1,), 1, 0, 0),
        ]
    ):
        image.apply(offset, record)
    snapshot_id = OffsetAndEpoch(image.offset + 1, 1)
    store = SnapshotStore(tmp_path)
    store.write(snapshot_id, [encode_record(r) for r in image.snapshot_records()], NOW_MS, NOW_MS)
    loaded = SnapshotStore(tmp_path).read(snapshot_id)
    assert ClusterMetadata.from_snapshot([decode_record(v) for v in loaded.values], snapshot_id.offset) == image
