"""Test helpers for the remote tier: a RemoteStorageManager over a dict, and real segments to put in it.

The fake keeps every uploaded file's bytes under (segment id, suffix), counts calls, records the ranges read,
can fail the next calls of a method, and can hold fetches at a gate so tests control how threads interleave.
Segments come from a real Log (small segment.bytes and index.interval.bytes, so the uploaded indexes have
entries), uploaded the way the RemoteLogManager copies rolled segments.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from storage_helpers import T0, TP, log_config, open_log

from tierlog.records.codec import RecordSpec, build_batch
from tierlog.records.record_batch import CompressionType
from tierlog.storage.log import Log
from tierlog.tiered.remote_storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)

TOPIC_ID = uuid.UUID(int=0x7013)
LOG_SUFFIX = ".log"
# How long a gated fetch waits for the test to open the gate before failing the test instead of hanging.
GATE_TIMEOUT_S = 10.0


class FakeRemoteStorageManager:
    def __init__(self) -> None:
        self.objects: dict[tuple[uuid.UUID, str], bytes] = {}
        self.calls: Counter[str] = Counter()
        # (segment id, start, end) of every fetch_log_segment, as asked (before clamping).
        self.log_reads: list[tuple[uuid.UUID, int, int]] = []
        # While set, fetches wait until the gate opens; `fetch_started` tells the test one is waiting.
        self.gate: threading.Event | None = None
        self.fetch_started = threading.Event()
        self._failures: dict[str, list[RemoteStorageError]] = {}
        self._lock = threading.Lock()

    def fail_next(self, method: str, error: RemoteStorageError, times: int = 1) -> None:
        """Make the next `times` calls of `method` raise `error`."""
        with self._lock:
            self._failures.setdefault(method, []).extend([error] * times)

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        self._enter("copy_log_segment_data")
        segment_id = metadata.segment_id.id
        files = {
            LOG_SUFFIX: data.log_segment.read_bytes(),
            IndexType.OFFSET.value: data.offset_index.read_bytes(),
            IndexType.TIMESTAMP.value: data.time_index.read_bytes(),
            IndexType.LEADER_EPOCH.value: data.leader_epoch_checkpoint,
        }
        if data.transaction_index is not None:
            files[IndexType.TRANSACTION.value] = data.transaction_index.read_bytes()
        with self._lock:
            self.objects.update({(segment_id, suffix): content for suffix, content in files.items()})

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int) -> bytes:
        self._enter("fetch_log_segment")
        with self._lock:
            self.log_reads.append((metadata.segment_id.id, start_position, end_position))
        return self._object(metadata, LOG_SUFFIX)[start_position:end_position]

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        self._enter("fetch_index")
        return self._object(metadata, index_type.value)

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._enter("delete_log_segment_data")
        with self._lock:
            for key in [key for key in self.objects if key[0] == metadata.segment_id.id]:
                del self.objects[key]

    def close(self) -> None:
        self._enter("close")

    def _enter(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1
            pending = self._failures.get(method)
            error = pending.pop(0) if pending else None
        gate = self.gate
        if gate is not None and method.startswith("fetch"):
            self.fetch_started.set()
            if not gate.wait(GATE_TIMEOUT_S):
                raise AssertionError(f"{method} waited {GATE_TIMEOUT_S}s for the test to open the gate")
        if error is not None:
            raise error

    def _object(self, metadata: RemoteLogSegmentMetadata, suffix: str) -> bytes:
        with self._lock:
            content = self.objects.get((metadata.segment_id.id, suffix))
        if content is None:
            raise RemoteResourceNotFoundError(f"No {suffix} object for remote segment {metadata.segment_id.id}")
        return content


def batch(
    timestamps: Sequence[int], *, value_size: int = 16, compression: CompressionType = CompressionType.NONE
) -> bytearray:
    """A producer's batch of one record per timestamp (base offset 0: the leader assigns offsets)."""
    records: list[RecordSpec] = [
        (b"k", bytes([index % 256]) * value_size, (), timestamp) for index, timestamp in enumerate(timestamps)
    ]
    return bytearray(build_batch(records, compression=compression))


def build_log(
    directory: Path,
    batches: Sequence[bytearray],
    *,
    segment_bytes: int,
    index_interval_bytes: int,
    epoch: int = 0,
) -> Log:
    """A Log holding `batches` (appended one per append, as leader in `epoch`), its active segment rolled so
    that every segment is complete and can be uploaded."""
    log = open_log(directory, log_config(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes))
    for records in batches:
        log.append_as_leader(bytearray(records), epoch, T0)
    log.roll(T0)
    return log


def upload_log(log: Log, rsm: FakeRemoteStorageManager) -> list[RemoteLogSegmentMetadata]:
    """Copy every non-empty rolled segment of `log` to `rsm`, as the RemoteLogManager does, and return their
    metadata in offset order."""
    uploaded = []
    segments = log.segments
    for segment, next_segment in itertools.pairwise(segments):
        if segment.size == 0:
            continue
        epoch = log.leader_epoch_cache.epoch_for_offset(segment.base_offset)
        txn_index = segment.txn_index.path if segment.txn_index.path.exists() else None
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, TP), uuid.uuid4()),
            start_offset=segment.base_offset,
            end_offset=next_segment.base_offset - 1,
            max_timestamp_ms=segment.max_timestamp_so_far,
            broker_id=0,
            event_timestamp_ms=T0,
            segment_size_in_bytes=segment.size,
            segment_leader_epochs=((0 if epoch is None else epoch, segment.base_offset),),
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            has_txn_index=txn_index is not None,
        )
        rsm.copy_log_segment_data(
            metadata,
            LogSegmentData(
                log_segment=segment.log_path,
                offset_index=segment.offset_index.path,
                time_index=segment.time_index.path,
                transaction_index=txn_index,
                producer_snapshot=None,
                leader_epoch_checkpoint=b"",
            ),
        )
        uploaded.append(metadata)
    return uploaded
