"""FsspecRemoteStorageManager against the three remote tiers it serves with one code path: a directory
(file://), fsspec's in-process store (memory://) and a real S3 server (SeaweedFS on 127.0.0.1, s3://)."""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.testing.local_s3 import LocalS3Server
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.remote_storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)
from tierlog.tiered.segment_metadata import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition

TOPIC_ID = uuid.UUID("5f2b9d0e-6a1c-4a53-9c51-0c7a7e3b1f42")
TP = TopicPartition("orders", 3)
RSM_PREFIX = "rsm.config."
# How long a call may take to fail once the S3 server is gone: connection refused is immediate, and the
# manager allows one retry after a short backoff.
OUTAGE_FAILURE_BOUND_S = 10.0


def segment_metadata(
    start_offset: int = 0, end_offset: int = 99, segment_id: uuid.UUID | None = None
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, TP), segment_id or uuid.uuid4()),
        start_offset=start_offset,
        end_offset=end_offset,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_000,
        segment_size_in_bytes=0,
        segment_leader_epochs=((0, start_offset),),
    )


@dataclass
class SegmentFiles:
    """A segment as the broker hands it to copy: real record batches in the log, index-shaped bytes."""

    data: LogSegmentData
    log: bytes
    files: dict[IndexType, bytes]


def write_segment(
    directory: Path, start_offset: int = 0, *, batches: int = 20, with_optional: bool = True, value_size: int = 100
) -> SegmentFiles:
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{start_offset:020d}"
    log = b"".join(
        build_batch(
            [(b"k", bytes([i % 256]) * value_size, [], 1_700_000_000_000 + i)] * 5,
            base_offset=start_offset + 5 * i,
            partition_leader_epoch=0,
        )
        for i in range(batches)
    )
    # Different segments get different index bytes, so a mix-up between them cannot go unnoticed.
    rng = random.Random(f"{directory.name}-{start_offset}-{value_size}")
    files = {
        IndexType.OFFSET: rng.randbytes(8 * 40),
        IndexType.TIMESTAMP: rng.randbytes(12 * 40),
        IndexType.LEADER_EPOCH: f"0\n1\n0 {start_offset}\n".encode(),
    }
    if with_optional:
        files[IndexType.TRANSACTION] = rng.randbytes(34 * 3)
        files[IndexType.PRODUCER_SNAPSHOT] = rng.randbytes(50)
    paths: dict[IndexType, Path] = {}
    for index_type, content in files.items():
        if index_type is not IndexType.LEADER_EPOCH:
            paths[index_type] = directory / f"{name}{index_type.value}"
            paths[index_type].write_bytes(content)
    log_path = directory / f"{name}.log"
    log_path.write_bytes(log)
    data = LogSegmentData(
        log_segment=log_path,
        offset_index=paths[IndexType.OFFSET],
        time_index=paths[IndexType.TIMESTAMP],
        transaction_index=paths.get(IndexType.TRANSACTION),
        producer_snapshot=paths.get(IndexType.PRODUCER_SNAPSHOT),
        leader_epoch_checkpoint=files[IndexType.LEADER_EPOCH],
    )
    return SegmentFiles(data, log, files)


def expected_names(metadata: RemoteLogSegmentMetadata, suffixes: list[str]) -> list[str]:
    directory = f"{TP.topic}-{TP.partition}-{TOPIC_ID}"
    return sorted(f"{directory}/{metadata.start_offset:020d}-{metadata.segment_id.id}{suffix}" for suffix in suffixes)


def s3_manager(server: LocalS3Server, bucket: str, prefix: str) -> FsspecRemoteStorageManager:
    """Built as a broker builds it: from its `rsm.config.*` properties with the prefix stripped."""
    props = server.rsm_properties(bucket, prefix=prefix)
    return FsspecRemoteStorageManager.from_config({k.removeprefix(RSM_PREFIX): v for k, v in props.items()})


@pytest.fixture(params=["file", "memory", "s3"])
def rsm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FsspecRemoteStorageManager]:
    """A manager on an empty root of each kind. The S3 server is only started for the s3 runs."""
    unique = f"{request.node.name}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")
    if request.param == "file":
        manager = FsspecRemoteStorageManager((tmp_path / "remote").as_uri())
    elif request.param == "memory":
        manager = FsspecRemoteStorageManager(f"memory://{unique}")
    else:
        server: LocalS3Server = request.getfixturevalue("s3_server")
        manager = s3_manager(server, request.getfixturevalue("s3_bucket"), prefix=unique)
    try:
        yield manager
    finally:
        manager.close()
        if request.param == "memory":
            # fsspec's memory store is one dict for the whole process: leave nothing in it for later tests.
            with contextlib.suppress(FileNotFoundError):
                fsspec.filesystem("memory").rm(f"/{unique}", recursive=True)


# -- round trips -------------------------------------------------------------------------------------------


def test_copied_segment_is_fetched_back_byte_for_byte(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    segment = write_segment(tmp_path / "local", start_offset=100)
    metadata = segment_metadata(100, 199)
    rsm.copy_log_segment_data(metadata, segment.data)

    size = len(segment.log)
    assert rsm.fetch_log_segment(metadata, 0, size) == segment.log
    assert rsm.fetch_log_segment(metadata, 10, 250) == segment.log[10:250]
    for index_type in IndexType:
        assert rsm.fetch_index(metadata, index_type) == segment.files[index_type], index_type


def test_fetch_range_is_clamped_to_the_segment_size(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    segment = write_segment(tmp_path / "local")
    metadata = segment_metadata()
    rsm.copy_log_segment_data(metadata, segment.data)

    size = len(segment.log)
    assert rsm.fetch_log_segment(metadata, size - 7, size + 1000) == segment.log[-7:]
    # Starting at or past the end reads nothing (S3 itself answers 416 there).
    assert rsm.fetch_log_segment(metadata, size, size + 1000) == b""
    assert rsm.fetch_log_segment(metadata, size + 5, size + 1000) == b""
    assert rsm.fetch_log_segment(metadata, 3, 3) == b""
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(metadata, 10, 5)


def test_objects_are_named_like_kafkas_local_tiered_storage(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    segment = write_segment(tmp_path / "local", start_offset=1234)
    metadata = segment_metadata(1234, 1333)
    rsm.copy_log_segment_data(metadata, segment.data)

    assert rsm.list_segment_objects() == expected_names(metadata, [".log", *(t.value for t in IndexType)])
    assert rsm.list_segment_objects()[0].startswith(
        "orders-3-5f2b9d0e-6a1c-4a53-9c51-0c7a7e3b1f42/00000000000000001234-"
    )


def test_absent_optional_indexes_are_not_uploaded_and_fetch_raises_not_found(
    rsm: FsspecRemoteStorageManager, tmp_path: Path
) -> None:
    segment = write_segment(tmp_path / "local", with_optional=False)
    metadata = segment_metadata()
    rsm.copy_log_segment_data(metadata, segment.data)

    suffixes = [".log", IndexType.OFFSET.value, IndexType.TIMESTAMP.value, IndexType.LEADER_EPOCH.value]
    assert rsm.list_segment_objects() == expected_names(metadata, suffixes)
    for index_type in (IndexType.TRANSACTION, IndexType.PRODUCER_SNAPSHOT):
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.fetch_index(metadata, index_type)


def test_empty_index_files_round_trip(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    # A small segment can have an empty offset index (fewer bytes than index.interval.bytes).
    segment = write_segment(tmp_path / "local", batches=1)
    segment.data.offset_index.write_bytes(b"")
    metadata = segment_metadata()
    rsm.copy_log_segment_data(metadata, segment.data)

    assert rsm.fetch_index(metadata, IndexType.OFFSET) == b""
    assert rsm.fetch_log_segment(metadata, 0, 1 << 20) == segment.log


def test_copies_of_the_same_offsets_with_different_segment_ids_do_not_collide(
    rsm: FsspecRemoteStorageManager, tmp_path: Path
) -> None:
    # Two leaders (or a retried copy) upload offsets 0..99, each under its own segment id.
    first = write_segment(tmp_path / "leader-1", value_size=10)
    second = write_segment(tmp_path / "leader-2", value_size=30)
    first_metadata, second_metadata = segment_metadata(), segment_metadata()
    rsm.copy_log_segment_data(first_metadata, first.data)
    rsm.copy_log_segment_data(second_metadata, second.data)

    assert rsm.fetch_log_segment(first_metadata, 0, 1 << 20) == first.log
    assert rsm.fetch_log_segment(second_metadata, 0, 1 << 20) == second.log
    assert rsm.fetch_index(first_metadata, IndexType.OFFSET) == first.files[IndexType.OFFSET]
    assert rsm.fetch_index(second_metadata, IndexType.OFFSET) == second.files[IndexType.OFFSET]
    assert len(rsm.list_segment_objects()) == 12

    rsm.delete_log_segment_data(first_metadata)
    assert rsm.fetch_log_segment(second_metadata, 0, 1 << 20) == second.log
    assert rsm.list_segment_objects() == expected_names(second_metadata, [".log", *(t.value for t in IndexType)])


def test_delete_removes_every_object_and_is_idempotent(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    segment = write_segment(tmp_path / "local")
    metadata = segment_metadata()
    rsm.copy_log_segment_data(metadata, segment.data)

    rsm.delete_log_segment_data(metadata)
    # Flat listing: a prefix left empty (SeaweedFS keeps reporting it as a directory) is not an object.
    assert rsm.list_segment_objects() == []
    rsm.delete_log_segment_data(metadata)
    rsm.delete_log_segment_data(segment_metadata())  # never copied at all
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_log_segment(metadata, 0, 100)
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_log_segment(metadata, 0, 0)
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_index(metadata, IndexType.OFFSET)


def test_segment_larger_than_one_upload_part_streams_in_parts(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    # Above 16 MiB s3fs switches from one PUT to a multipart upload of 8 MiB parts.
    segment = write_segment(tmp_path / "local", batches=2)
    big = random.Random(7).randbytes(17 * 1024 * 1024 + 123)
    segment.data.log_segment.write_bytes(big)
    metadata = segment_metadata()
    rsm.copy_log_segment_data(metadata, segment.data)

    assert rsm.fetch_log_segment(metadata, 0, len(big)) == big
    middle = 8 * 1024 * 1024 - 10
    assert rsm.fetch_log_segment(metadata, middle, middle + 20) == big[middle : middle + 20]


def test_concurrent_fetches_from_8_threads(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    segments = []
    for n in range(4):
        segment = write_segment(tmp_path / f"local-{n}", start_offset=100 * n, batches=40)
        metadata = segment_metadata(100 * n, 100 * n + 99)
        rsm.copy_log_segment_data(metadata, segment.data)
        segments.append((metadata, segment))

    def worker(seed: int) -> int:
        rng = random.Random(seed)
        checked = 0
        for _ in range(25):
            metadata, segment = rng.choice(segments)
            if rng.random() < 0.25:
                index_type = rng.choice([IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.LEADER_EPOCH])
                assert rsm.fetch_index(metadata, index_type) == segment.files[index_type]
            else:
                start = rng.randrange(len(segment.log))
                end = start + rng.randrange(1, 4096)
                assert rsm.fetch_log_segment(metadata, start, end) == segment.log[start:end]
            checked += 1
        return checked

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(worker, range(8), timeout=60))
    assert results == [25] * 8


def test_concurrent_copies_and_deletes_from_8_threads(rsm: FsspecRemoteStorageManager, tmp_path: Path) -> None:
    def copy_and_delete(n: int) -> RemoteLogSegmentMetadata:
        segment = write_segment(tmp_path / f"local-{n}", start_offset=100 * n, batches=5)
        metadata = segment_metadata(100 * n, 100 * n + 99)
        rsm.copy_log_segment_data(metadata, segment.data)
        assert rsm.fetch_log_segment(metadata, 0, 1 << 20) == segment.log
        if n % 2:
            rsm.delete_log_segment_data(metadata)
        return metadata

    with ThreadPoolExecutor(max_workers=8) as pool:
        kept = [metadata for n, metadata in enumerate(pool.map(copy_and_delete, range(8), timeout=60)) if n % 2 == 0]
    suffixes = [".log", *(t.value for t in IndexType)]
    assert rsm.list_segment_objects() == sorted(name for m in kept for name in expected_names(m, suffixes))


# -- failures ----------------------------------------------------------------------------------------------


def test_copy_of_a_missing_local_file_raises_remote_storage_error(
    rsm: FsspecRemoteStorageManager, tmp_path: Path
) -> None:
    segment = write_segment(tmp_path / "local")
    segment.data.log_segment.unlink()
    metadata = segment_metadata()
    with pytest.raises(RemoteStorageError) as raised:
        rsm.copy_log_segment_data(metadata, segment.data)
    assert not isinstance(raised.value, RemoteResourceNotFoundError)
    # The indexes went up before the log, which never did: the segment does not look complete.
    assert not any(name.endswith(".log") for name in rsm.list_segment_objects())
    rsm.delete_log_segment_data(metadata)
    assert rsm.list_segment_objects() == []


def test_closed_manager_refuses_calls(rsm: FsspecRemoteStorageManager) -> None:
    rsm.close()
    rsm.close()
    with pytest.raises(RemoteStorageError, match="closed"):
        rsm.fetch_index(segment_metadata(), IndexType.OFFSET)


def test_s3_outage_raises_remote_storage_error_quickly_and_calls_work_after_restart(
    s3_server: LocalS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    segment = write_segment(tmp_path / "local")
    metadata = segment_metadata()
    with s3_manager(s3_server, s3_bucket, prefix=f"outage-{uuid.uuid4().hex[:8]}") as rsm:
        rsm.copy_log_segment_data(metadata, segment.data)
        s3_server.kill()
        try:
            calls = {
                "fetch_log_segment": lambda: rsm.fetch_log_segment(metadata, 0, 100),
                "fetch_index": lambda: rsm.fetch_index(metadata, IndexType.OFFSET),
                "copy_log_segment_data": lambda: rsm.copy_log_segment_data(segment_metadata(), segment.data),
                "delete_log_segment_data": lambda: rsm.delete_log_segment_data(metadata),
                "list_segment_objects": rsm.list_segment_objects,
            }
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(RemoteStorageError) as raised:
                    call()
                elapsed = time.monotonic() - started
                assert elapsed < OUTAGE_FAILURE_BOUND_S, f"{name} took {elapsed:.1f}s to fail"
                # An outage is not a missing object: the caller must retry, not give up on the segment.
                assert not isinstance(raised.value, RemoteResourceNotFoundError), name
                assert "\n" not in str(raised.value)
        finally:
            s3_server.restart()
        # Same endpoint, same data, same manager: it reconnects by itself.
        assert rsm.fetch_log_segment(metadata, 0, 1 << 20) == segment.log
        assert rsm.fetch_index(metadata, IndexType.OFFSET) == segment.files[IndexType.OFFSET]


def test_s3_server_that_stops_answering_fails_calls_after_the_read_timeout_not_a_hang(
    s3_server: LocalS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # A frozen server accepts connections and never answers: only the read timeout ends the call. It is
    # shortened here (the default is S3_READ_TIMEOUT_S per attempt) to keep the test fast.
    segment = write_segment(tmp_path / "local")
    metadata = segment_metadata()
    options = {
        "endpoint_url": s3_server.endpoint_url,
        "key": s3_server.access_key,
        "secret": s3_server.secret_key,
        "config_kwargs": {"read_timeout": 1, "connect_timeout": 1},
    }
    url = f"s3://{s3_bucket}/frozen-{uuid.uuid4().hex[:8]}"
    with FsspecRemoteStorageManager(url, options) as rsm:
        rsm.copy_log_segment_data(metadata, segment.data)
        s3_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RemoteStorageError, match=r"[Tt]imeout"):
                rsm.fetch_log_segment(metadata, 0, 100)
            assert time.monotonic() - started < OUTAGE_FAILURE_BOUND_S
        finally:
            s3_server.resume()
        assert rsm.fetch_log_segment(metadata, 0, 100) == segment.log[:100]


def test_missing_bucket_is_a_remote_storage_error(s3_server: LocalS3Server, tmp_path: Path) -> None:
    # No auto-created buckets: a mistyped bucket fails the copy instead of scattering data.
    segment = write_segment(tmp_path / "local")
    with s3_manager(s3_server, "no-such-bucket", prefix="x") as rsm, pytest.raises(RemoteStorageError):
        rsm.copy_log_segment_data(segment_metadata(), segment.data)


def test_check_access_passes_with_the_brokers_settings_and_names_each_wrong_one(
    s3_server: LocalS3Server, s3_bucket: str
) -> None:
    with s3_manager(s3_server, s3_bucket, prefix="nothing-copied-yet") as rsm:
        rsm.check_access()
    props = {k.removeprefix(RSM_PREFIX): v for k, v in s3_server.rsm_properties(s3_bucket, prefix="x").items()}
    wrong = {
        "wrong secret": ({**props, "aws.secret.access.key": "wrong"}, PermissionError),
        "no such bucket": ({**props, "url": "s3://no-such-bucket/x"}, FileNotFoundError),
    }
    for case, (settings, cause) in wrong.items():
        with FsspecRemoteStorageManager.from_config(settings) as rsm, pytest.raises(RemoteStorageError) as raised:
            rsm.check_access()
        assert isinstance(raised.value.__cause__, cause), (case, raised.value)
        assert "check bucket s3://" in str(raised.value), case


# -- configuration -----------------------------------------------------------------------------------------


def test_from_config_requires_the_url_setting() -> None:
    with pytest.raises(ValueError, match=r"rsm\.config\.url"):
        FsspecRemoteStorageManager.from_config({})
    with pytest.raises(ValueError, match=r"rsm\.config\.url"):
        FsspecRemoteStorageManager.from_config({"url": "  "})


@pytest.mark.parametrize("url", ["hdfs://namenode/tierlog", "/absolute/path/without/scheme", "gs://bucket/x"])
def test_unsupported_url_scheme_is_refused_with_the_setting_named(url: str) -> None:
    with pytest.raises(ValueError, match=r"rsm\.config\.url") as raised:
        FsspecRemoteStorageManager.from_config({"url": url})
    assert "\n" not in str(raised.value)


def test_from_config_on_file_url_ignores_s3_settings(tmp_path: Path) -> None:
    segment = write_segment(tmp_path / "local")
    metadata = segment_metadata()
    props = {"url": (tmp_path / "remote").as_uri(), "s3.region": "eu-west-1", "aws.access.key.id": "ignored"}
    with FsspecRemoteStorageManager.from_config(props) as rsm:
        rsm.copy_log_segment_data(metadata, segment.data)
        assert rsm.fetch_log_segment(metadata, 0, 1 << 20) == segment.log
    assert (tmp_path / "remote" / f"{TP}-{TOPIC_ID}").is_dir()
