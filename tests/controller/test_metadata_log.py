"""The metadata log: one fsynced batch per operation, readable back as records or raw batches, and a tail
torn by a crash is cut off on reopen while everything before it survives."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierlog.controller.metadata_log import (
    CONTROLLER_EPOCH,
    METADATA_TOPIC,
    METADATA_TOPIC_ID,
    DiskMetadataLog,
    WakingMetadataLog,
    decode_metadata_batches,
)
from tierlog.metadata.loader import MetadataBatches
from tierlog.metadata.records import ClusterIdRecord, ConfigRecord, ProducerIdsRecord, TopicRecord, encode_record
from tierlog.raft.messages import NO_EPOCH
from tierlog.raft.raft_log import RaftLog
from tierlog.records.codec import build_batch, decode_batches

NOW = 1_700_000_000_000
TOPIC_ID = uuid.UUID(int=42)
FIRST = [ClusterIdRecord("c"), TopicRecord("events", TOPIC_ID)]
SECOND = [ConfigRecord("events", "retention.ms", "5"), ProducerIdsRecord(1, 1000), ProducerIdsRecord(2, 2000)]


def segment_file(log_dir: Path) -> Path:
    return log_dir / f"{METADATA_TOPIC}-0" / "00000000000000000000.log"


def test_metadata_topic_constants_are_kafkas() -> None:
    assert METADATA_TOPIC == "__cluster_metadata"
    assert str(METADATA_TOPIC_ID) == "00000000-0000-0000-0000-000000000001"


def test_append_returns_the_first_offset_and_records_read_back_from_any_offset(tmp_path: Path) -> None:
    log = DiskMetadataLog(tmp_path)
    assert log.end_offset == 0
    assert log.records_from(0) == []
    assert log.append(FIRST, NOW) == 0
    assert log.append(SECOND, NOW + 1) == 2
    assert log.end_offset == 5
    assert log.records_from(0) == list(enumerate([*FIRST, *SECOND]))
    # Offset 3 is inside the second batch: the batch comes whole from disk, the records before 3 do not.
    assert log.records_from(3) == [(3, SECOND[1]), (4, SECOND[2])]
    assert log.records_from(5) == []
    with pytest.raises(ValueError, match="at least one record"):
        log.append([], NOW)
    log.close()


def test_each_append_is_one_batch_stamped_with_the_controller_epoch(tmp_path: Path) -> None:
    log = DiskMetadataLog(tmp_path)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW + 1)
    batches = list(decode_batches(segment_file(tmp_path).read_bytes()))
    assert [(b.header.base_offset, b.header.records_count) for b in batches] == [(0, 2), (2, 3)]
    assert {b.header.partition_leader_epoch for b in batches} == {CONTROLLER_EPOCH}
    assert [r.timestamp for r in batches[1].records] == [NOW + 1] * 3
    assert all(r.key is None for b in batches for r in b.records)
    log.close()


def test_read_serves_raw_batches_that_brokers_decode(tmp_path: Path) -> None:
    log = DiskMetadataLog(tmp_path)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    assert log.read(5, 1000) is None
    first_only = log.read(0, 1)  # smaller than a batch: the first batch comes regardless
    assert first_only is not None
    assert decode_metadata_batches(first_only.read_bytes()) == MetadataBatches(
        list(enumerate(FIRST)), 2, CONTROLLER_EPOCH
    )
    whole = log.read(0, 1 << 20)
    assert whole is not None
    data = whole.read_bytes()
    assert decode_metadata_batches(data) == MetadataBatches(list(enumerate([*FIRST, *SECOND])), 5, CONTROLLER_EPOCH)
    # A Fetch response may end in part of a batch: it waits for the next fetch.
    assert decode_metadata_batches(data[:-3]) == MetadataBatches(list(enumerate(FIRST)), 2, CONTROLLER_EPOCH)
    assert decode_metadata_batches(data[:10], start_offset=7) == MetadataBatches([], 7, NO_EPOCH)
    log.close()


def test_control_batches_are_skipped_but_counted_in_the_next_offset(tmp_path: Path) -> None:
    raft_log = RaftLog(tmp_path, NOW)
    raft_log.append_leader_change(1, [1, 2, 3], [1, 2], 1, NOW)
    raft_log.append_values([encode_record(r) for r in FIRST], 1, NOW)
    raft_log.append_leader_change(2, [1, 2, 3], [2, 3], 2, NOW)
    assert decode_metadata_batches(raft_log.read(0, 1 << 20)) == MetadataBatches([(1, FIRST[0]), (2, FIRST[1])], 4, 2)
    raft_log.close()


def test_decode_metadata_batches_refuses_records_that_are_not_metadata() -> None:
    with pytest.raises(ValueError, match="offset 0 has no value"):
        decode_metadata_batches(build_batch([(b"k", None, [], NOW)]))
    with pytest.raises(ValueError, match="not JSON"):
        decode_metadata_batches(build_batch([(None, b"hello", [], NOW)]))


def test_decode_metadata_batches_skips_the_quorums_control_batches(tmp_path: Path) -> None:
    """A quorum's log opens each epoch with a LeaderChangeMessage control batch, which holds no metadata."""
    log = RaftLog(tmp_path, NOW)
    log.append_leader_change(1, [1, 2, 3], [1, 2], epoch=1, now_ms=NOW)
    log.append_values([encode_record(r) for r in FIRST], epoch=1, now_ms=NOW)
    log.append_leader_change(2, [1, 2, 3], [2, 3], epoch=2, now_ms=NOW)
    log.append_values([encode_record(SECOND[0])], epoch=2, now_ms=NOW)
    assert decode_metadata_batches(log.read(0, 1 << 20)).records == [(1, FIRST[0]), (2, FIRST[1]), (4, SECOND[0])]
    log.close()


def test_records_survive_reopening(tmp_path: Path) -> None:
    log = DiskMetadataLog(tmp_path)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    log.close()
    reopened = DiskMetadataLog(tmp_path)
    assert reopened.end_offset == 5
    assert reopened.records_from(0) == list(enumerate([*FIRST, *SECOND]))
    assert reopened.append([ProducerIdsRecord(3, 3000)], NOW) == 5
    reopened.close()


@pytest.mark.parametrize("garbage", [b"\x00" * 7, b"\xde\xad\xbe\xef" * 40])
def test_a_torn_tail_is_truncated_and_earlier_records_survive(tmp_path: Path, garbage: bytes) -> None:
    log = DiskMetadataLog(tmp_path)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    size = segment_file(tmp_path).stat().st_size
    # kill -9 after the OS took part of a third batch: never closed, the tail is half written.
    with segment_file(tmp_path).open("ab") as f:
        f.write(garbage)
    reopened = DiskMetadataLog(tmp_path)
    assert segment_file(tmp_path).stat().st_size == size
    assert reopened.end_offset == 5
    assert reopened.records_from(0) == list(enumerate([*FIRST, *SECOND]))
    assert reopened.append([ProducerIdsRecord(3, 3000)], NOW) == 5
    assert reopened.records_from(5) == [(5, ProducerIdsRecord(3, 3000))]
    reopened.close()


def test_a_torn_last_batch_is_dropped_whole(tmp_path: Path) -> None:
    log = DiskMetadataLog(tmp_path)
    log.append(FIRST, NOW)
    first_size = segment_file(tmp_path).stat().st_size
    log.append(SECOND, NOW)
    with segment_file(tmp_path).open("r+b") as f:
        f.truncate(segment_file(tmp_path).stat().st_size - 5)
    reopened = DiskMetadataLog(tmp_path)
    assert segment_file(tmp_path).stat().st_size == first_size
    assert reopened.records_from(0) == list(enumerate(FIRST))
    assert reopened.end_offset == 2
    reopened.close()


def test_a_fetch_of_records_the_log_holds_is_answered_at_once(tmp_path: Path) -> None:
    log = WakingMetadataLog(DiskMetadataLog(tmp_path))
    log.append(FIRST, NOW)
    answered: list[str] = []
    assert log.wait_for_records(1, 500, NOW, lambda: answered.append("at once")) is None
    assert log.wait_for_records(2, 0, NOW, lambda: answered.append("no wait")) is None
    assert answered == ["at once", "no wait"]


def test_a_parked_fetch_is_answered_by_the_next_append_or_when_its_wait_ends(tmp_path: Path) -> None:
    log = WakingMetadataLog(DiskMetadataLog(tmp_path))
    log.append(FIRST, NOW)
    answered: list[str] = []
    assert log.wait_for_records(2, 500, NOW, lambda: answered.append("append")) == NOW + 500
    assert log.wait_for_records(2, 100, NOW, lambda: answered.append("expired")) == NOW + 100
    log.expire(NOW + 99)
    assert answered == []
    log.expire(NOW + 100)
    assert answered == ["expired"]
    log.append(SECOND, NOW + 200)
    assert answered == ["expired", "append"]
    log.expire(NOW + 1000)
    assert answered == ["expired", "append"]
