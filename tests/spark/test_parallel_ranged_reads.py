"""A direct read gets a chunk of a remote segment as several ranged GETs at once (fetch_in_parallel_ranges):
the parts must reassemble into exactly the bytes one GET returns, wherever the ranges cut the record batches,
and however the last range ends (short, or past the object's end). Against a directory and a real S3 server."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch, decode_batches
from tierlog.spark.remote_tier import RemoteSegmentSlice, fetch_in_parallel_ranges, iter_slice_chunks
from tierlog.testing.local_s3 import LocalS3Server
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_storage_manager import LogSegmentData
from tierlog.tiered.segment_metadata import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition

TOPIC = "events"
BATCHES = 40
RECORDS_PER_BATCH = 3


def segment_log() -> bytes:
    """Record batches of uneven sizes, so no range size lines up with the batch boundaries."""
    return b"".join(
        build_batch(
            [(b"k", bytes([i % 251]) * (17 + 13 * (i % 7)), [], 1_700_000_000_000 + i)] * RECORDS_PER_BATCH,
            base_offset=RECORDS_PER_BATCH * i,
            partition_leader_epoch=0,
        )
        for i in range(BATCHES)
    )


@pytest.fixture(params=["file", "s3"])
def stored_segment(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[FsspecRemoteStorageManager, RemoteLogSegmentMetadata, bytes]:
    if request.param == "s3":
        server: LocalS3Server = request.getfixturevalue("s3_server")
        config = {
            key.removeprefix("rsm.config."): value
            for key, value in server.rsm_properties(request.getfixturevalue("s3_bucket"), prefix=tmp_path.name).items()
        }
        rsm = FsspecRemoteStorageManager.from_config(config)
    else:
        rsm = FsspecRemoteStorageManager(f"file://{tmp_path / 'remote'}")
    log = segment_log()
    files = tmp_path / "segment"
    files.mkdir()
    (files / "log").write_bytes(log)
    # An all-zero offset index: every slice starts reading at the segment's first byte.
    (files / "index").write_bytes(bytes(8 * 4))
    (files / "timeindex").write_bytes(b"")
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TopicIdPartition(uuid.uuid4(), TopicPartition(TOPIC, 0)), uuid.uuid4()),
        start_offset=0,
        end_offset=BATCHES * RECORDS_PER_BATCH - 1,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_000,
        segment_size_in_bytes=len(log),
        segment_leader_epochs=((0, 0),),
    )
    rsm.copy_log_segment_data(
        metadata,
        LogSegmentData(files / "log", files / "index", files / "timeindex", None, None, b"0\n1\n0 0\n"),
    )
    yield rsm, metadata, log
    rsm.close()


def test_parallel_ranges_reassemble_to_the_bytes_of_one_get(
    stored_segment: tuple[FsspecRemoteStorageManager, RemoteLogSegmentMetadata, bytes],
) -> None:
    rsm, metadata, log = stored_segment
    size = len(log)
    cases = [
        (0, size, 1000),  # ranges cutting batches, the last one short
        (0, size, size // 4),
        (0, size, size),  # one range: a plain GET
        (123, size - 77, 333),  # starting and ending mid-batch
        (0, size + 5000, 1024),  # the last ranges past the object's end, as when its metadata says more
        (size - 10, size + 3000, 1000),  # one short part, then nothing
        (size, size + 2048, 1024),  # entirely past the end
        (5, 5, 100),  # nothing asked
    ]
    for start, end, range_bytes in cases:
        expected = rsm.fetch_log_segment(metadata, start, end)
        assert expected == log[start:end]
        got = fetch_in_parallel_ranges(rsm, metadata, start, end, range_bytes)
        assert got == expected, f"[{start}, {end}) in ranges of {range_bytes}"


def test_chunks_read_as_parallel_ranges_hold_the_same_whole_batches_as_single_gets(
    stored_segment: tuple[FsspecRemoteStorageManager, RemoteLogSegmentMetadata, bytes],
) -> None:
    rsm, metadata, log = stored_segment
    end = BATCHES * RECORDS_PER_BATCH
    for start_offset, end_offset, chunks in [(0, end, 4), (10, end - 20, 3), (end - 1, end, 1)]:
        piece = RemoteSegmentSlice(TOPIC, 0, start_offset, end_offset, metadata)
        whole = list(iter_slice_chunks(rsm, piece, chunk_bytes=len(log), range_bytes=len(log)))
        # Chunks and ranges that end inside batches: cut batches are read again whole with the next chunk.
        pieces = list(iter_slice_chunks(rsm, piece, chunk_bytes=2500, range_bytes=700))
        assert len(pieces) >= chunks
        assert b"".join(pieces) == b"".join(whole)
        for chunk in pieces:
            assert [b.header.base_offset for b in decode_batches(chunk)], "every chunk holds whole batches"
        offsets = [r.offset for chunk in pieces for b in decode_batches(chunk) for r in b.records]
        first_batch = start_offset - start_offset % RECORDS_PER_BATCH
        last_batch = (end_offset - 1) - (end_offset - 1) % RECORDS_PER_BATCH
        assert offsets == list(range(first_batch, last_batch + RECORDS_PER_BATCH))
