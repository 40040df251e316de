"""The metadata log on a one-voter quorum: one fsynced batch per operation, readable back as records from any
offset, and a tail torn by a crash is cut off on reopen while everything before it survives; brokers decode
its raw batches, skipping the quorum's control batches."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from controller_helpers import SingleVoterMetadataLog

from tierlog.controller.metadata_log import decode_metadata_batches
from tierlog.metadata.loader import MetadataBatches
from tierlog.metadata.records import (
    ClusterIdRecord,
    ConfigRecord,
    MetadataRecord,
    ProducerIdsRecord,
    TopicRecord,
    encode_record,
)
from tierlog.raft.messages import NO_EPOCH
from tierlog.raft.raft_log import METADATA_TOPIC, METADATA_TOPIC_ID, RaftLog
from tierlog.records.codec import build_batch, decode_batches

NOW = 1_700_000_000_000
TOPIC_ID = uuid.UUID(int=42)
FIRST = [ClusterIdRecord("c"), TopicRecord("events", TOPIC_ID)]
SECOND = [ConfigRecord("events", "retention.ms", "5"), ProducerIdsRecord(1, 1000), ProducerIdsRecord(2, 2000)]
# A one-voter quorum's log opens with its leader's LeaderChangeMessage: the operations' records start after it.
FIRST_OFFSET = 1
EPOCH = 1


def segment_file(log_dir: Path) -> Path:
    return log_dir / f"{METADATA_TOPIC}-0" / "00000000000000000000.log"


def records_at(first_offset: int, records: Sequence[MetadataRecord]) -> list[tuple[int, MetadataRecord]]:
    return list(enumerate(records, start=first_offset))


def test_metadata_topic_constants_are_kafkas() -> None:
    assert METADATA_TOPIC == "__cluster_metadata"
    assert str(METADATA_TOPIC_ID) == "00000000-0000-0000-0000-000000000001"


def test_append_returns_the_first_offset_and_records_read_back_from_any_offset(tmp_path: Path) -> None:
    log = SingleVoterMetadataLog(tmp_path, NOW)
    assert log.end_offset == FIRST_OFFSET
    assert log.records_from(0) == []
    assert log.append(FIRST, NOW) == FIRST_OFFSET
    assert log.append(SECOND, NOW + 1) == FIRST_OFFSET + 2
    assert log.end_offset == FIRST_OFFSET + 5
    assert log.records_from(0) == records_at(FIRST_OFFSET, [*FIRST, *SECOND])
    # The second record of the second batch: the batch comes whole from disk, the records before it do not.
    assert log.records_from(FIRST_OFFSET + 3) == records_at(FIRST_OFFSET + 3, SECOND[1:])
    assert log.records_from(FIRST_OFFSET + 5) == []
    log.close()


def test_each_append_is_one_batch_stamped_with_the_leaders_epoch(tmp_path: Path) -> None:
    log = SingleVoterMetadataLog(tmp_path, NOW)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW + 1)
    batches = [b for b in decode_batches(segment_file(tmp_path).read_bytes()) if not b.header.is_control]
    assert [(b.header.base_offset, b.header.records_count) for b in batches] == [(1, 2), (3, 3)]
    assert {b.header.partition_leader_epoch for b in batches} == {EPOCH}
    assert [r.timestamp for r in batches[1].records] == [NOW + 1] * 3
    assert all(r.key is None for b in batches for r in b.records)
    log.close()


def test_brokers_decode_whole_batches_and_leave_a_partial_one_for_the_next_fetch(tmp_path: Path) -> None:
    log = SingleVoterMetadataLog(tmp_path, NOW)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    data = log.client.log.read(0, 1 << 20)
    assert decode_metadata_batches(data) == MetadataBatches(records_at(FIRST_OFFSET, [*FIRST, *SECOND]), 6, EPOCH)
    # A Fetch response may end in part of a batch: it waits for the next fetch.
    assert decode_metadata_batches(data[:-3]) == MetadataBatches(records_at(FIRST_OFFSET, FIRST), 3, EPOCH)
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
    log = SingleVoterMetadataLog(tmp_path, NOW)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    log.close()
    reopened = SingleVoterMetadataLog(tmp_path, NOW + 1)
    # The voter leads a new epoch, which opens with a LeaderChangeMessage of its own.
    assert reopened.end_offset == FIRST_OFFSET + 6
    assert reopened.records_from(0) == records_at(FIRST_OFFSET, [*FIRST, *SECOND])
    assert reopened.append([ProducerIdsRecord(3, 3000)], NOW) == FIRST_OFFSET + 6
    reopened.close()


@pytest.mark.parametrize("garbage", [b"\x00" * 7, b"\xde\xad\xbe\xef" * 40])
def test_a_torn_tail_is_truncated_and_earlier_records_survive(tmp_path: Path, garbage: bytes) -> None:
    log = SingleVoterMetadataLog(tmp_path, NOW)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    # kill -9 after the OS took part of a third batch: never closed, the tail is half written.
    with segment_file(tmp_path).open("ab") as f:
        f.write(garbage)
    reopened = SingleVoterMetadataLog(tmp_path, NOW + 1)
    # The new epoch's LeaderChangeMessage follows the cut directly.
    batches = decode_batches(segment_file(tmp_path).read_bytes())
    layout = [(b.header.base_offset, b.header.is_control) for b in batches]
    assert layout == [(0, True), (1, False), (3, False), (6, True)]
    assert reopened.records_from(0) == records_at(FIRST_OFFSET, [*FIRST, *SECOND])
    end = reopened.end_offset
    assert end == FIRST_OFFSET + 6
    assert reopened.append([ProducerIdsRecord(3, 3000)], NOW) == end
    assert reopened.records_from(end) == [(end, ProducerIdsRecord(3, 3000))]
    reopened.close()


def test_a_torn_last_batch_is_dropped_whole(tmp_path: Path) -> None:
    log = SingleVoterMetadataLog(tmp_path, NOW)
    log.append(FIRST, NOW)
    log.append(SECOND, NOW)
    with segment_file(tmp_path).open("r+b") as f:
        f.truncate(segment_file(tmp_path).stat().st_size - 5)
    reopened = SingleVoterMetadataLog(tmp_path, NOW + 1)
    assert reopened.records_from(0) == records_at(FIRST_OFFSET, FIRST)
    assert reopened.end_offset == FIRST_OFFSET + 3
    reopened.close()
