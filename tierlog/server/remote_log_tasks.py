"""The RemoteLogManager's shell (KIP-405, docs/tiered-storage.md): timers and worker threads around the
decisions in tiered/remote_log_manager.py.

Every `remote.log.manager.task.interval.ms`, for each partition with the remote tier on:
- leaders copy rolled segments below the LSO, each with its transaction index (metadata COPY_SEGMENT_STARTED,
  the data through the RemoteStorageManager on a copier thread, then COPY_SEGMENT_FINISHED) and expire remote
  segments (their log start moves first, then DELETE_SEGMENT_STARTED, the objects, DELETE_SEGMENT_FINISHED);
- followers learn from the remote log metadata how far the remote tier reaches, so their local retention
  may delete what is copied.
Consumers' fetches below the local log start (the ReplicaManager's DelayedRemoteFetch; with read_committed,
the aborted transactions of the range read too), ListOffsets by timestamp and followers'
BuildingRemoteLogAuxState read the remote tier on the reader threads of `RemoteStorageReaderThreadPool`,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tierlog.common import TopicPartition
from tierlog.records.record_batch import complete_batches, read_header
from tierlog.replication import trace
from tierlog.replication.errors import NotLeaderOrFollowerError
from tierlog.replication.partition import Partition, RemoteFetchInfo
from tierlog.replication.replica_manager import RemoteLogReadResult, ReplicaManager, error_name_of
from tierlog.server.clock import now_ms
from tierlog.server.remote_log_metadata_topic import TopicBasedRemoteLogMetadataManager
from tierlog.storage.errors import OffsetOutOfRangeError
from tierlog.storage.file_records import TimestampAndOffset
from tierlog.storage.log import Log
from tierlog.storage.producer_state import CorruptSnapshotError, decode_snapshot
from tierlog.storage.transaction_index import AbortedTxn
from tierlog.tiered.remote_index_cache import RemoteIndexCache
from tierlog.tiered.remote_log_manager import (
    copy_candidates,
    epochs_in_range,
    highest_remote_offset,
    is_within_lineage,
    parse_epoch_checkpoint,
    plan_remote_expiration,
    segment_data,
)
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataCache, RemoteLogMetadataStore
from tierlog.tiered.remote_log_reader import DEFAULT_CHUNK_CACHE_BYTES, DEFAULT_PREFETCH_BYTES, RemoteLogReader
from tierlog.tiered.remote_storage_manager import (
    IndexType,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)
from tierlog.tiered.remote_transactions import AbortedTxnSearch
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
# Ranged reads of remote chunks in flight at once (docs/performance.md#remote-reads).
CHUNK_LOADER_THREADS = 8


@dataclass(slots=True)
class RemoteLogStats:
    """Counters for /metrics (Kafka's RemoteCopy*/RemoteFetch*/RemoteDelete* broker topic metrics)."""

    copy_bytes: int = 0
    copy_segments: int = 0
    copy_errors: int = 0
    fetch_bytes: int = 0
    fetch_requests: int = 0
    fetch_errors: int = 0
    delete_segments: int = 0
    delete_errors: int = 0


class RemoteStorageReaderThreadPool:
    """The remote tier's readers (Kafka's remote storage reader thread pool, `remote.log.reader.threads`):
    consumers' fetches below the local log start, started by the ReplicaManager (`async_read`, Kafka's
    RemoteLogManager.asyncRead), and the RemoteLogManager's reads of remote indexes (`run`)."""

    def __init__(
        self,
        store: RemoteLogMetadataStore,
        rsm: RemoteStorageManager,
        stats: RemoteLogStats,
        log_of: Callable[[TopicPartition], Log | None],
        *,
        index_cache_dir: Path,
        index_cache_bytes: int,
        reader_threads: int,
        chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE_BYTES,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    ) -> None:
        self._store = store
        self._stats = stats
        self._log_of = log_of
        self.index_cache = RemoteIndexCache(index_cache_dir, rsm, index_cache_bytes)
        self._chunk_loaders = ThreadPoolExecutor(CHUNK_LOADER_THREADS, thread_name_prefix="remote-chunk-loader")
        self.reader = RemoteLogReader(
            rsm,
            self.index_cache,
            cache_bytes=chunk_cache_bytes,
            prefetch_bytes=prefetch_bytes,
            loader=self._chunk_loaders,
        )
        self._threads = ThreadPoolExecutor(reader_threads, thread_name_prefix="remote-log-reader")
        self._tasks: set[asyncio.Task[Any]] = set()

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._chunk_loaders.shutdown(wait=False, cancel_futures=True)
        self.index_cache.close()

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """`function(*args)` on a reader thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)

    def async_read(
        self, tp: TopicPartition, info: RemoteFetchInfo, on_done: Callable[[RemoteLogReadResult], None]
    ) -> Callable[[], None]:
        """Read `info` of `tp` and call `on_done` with the records, or the error the partition is answered with:
        KAFKA_STORAGE_ERROR when the remote tier fails (clients retry it). Returns what cancels the read."""
        task = asyncio.create_task(self._read(tp, info), name=f"remote-read-{tp}")
        self._tasks.add(task)

        def done(task: asyncio.Task[RemoteLogReadResult]) -> None:
            self._tasks.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            if error is None:
                on_done(task.result())
            elif isinstance(error, RemoteStorageError):
                logger.warning("remote read of %s failed: %s", tp, error)
                on_done(RemoteLogReadResult(None, "KAFKA_STORAGE_ERROR"))
            else:
                on_done(RemoteLogReadResult(None, error_name_of(error)))

        task.add_done_callback(done)

        def cancel() -> None:
            task.cancel()

        return cancel

    async def _read(self, tp: TopicPartition, info: RemoteFetchInfo) -> RemoteLogReadResult:
        """A consumer's fetch below the local log start (Kafka's RemoteLogReader), with the aborted transactions
        of what it returns for a read_committed one. Raises OffsetOutOfRangeError if no remote segment of this
        log's lineage holds the offset, RemoteStorageError if the remote tier fails."""
        metadata = self.remote_segment(TopicIdPartition(info.topic_id, tp), info.leader_epoch, info.fetch_offset)
        if metadata is None:
            raise OffsetOutOfRangeError(
                f"Received request for offset {info.fetch_offset} for leader epoch {info.leader_epoch} of {tp}, "
                "which is in no remote segment"
            )
        self._stats.fetch_requests += 1
        try:
            result = await self.run(self.reader.read, metadata, info.fetch_offset, info.max_bytes, info.min_one_message)
        except RemoteStorageError:
            self._stats.fetch_errors += 1
            raise
        self._stats.fetch_bytes += len(result.records)
        self._read_ahead_next_segment(tp, metadata, result.next_position)
        if not info.read_committed:
            return RemoteLogReadResult(result.records)
        try:
            aborted = await self._aborted_transactions(tp, metadata, result.records)
        except RemoteStorageError:
            self._stats.fetch_errors += 1
            raise
        return RemoteLogReadResult(result.records, aborted_transactions=aborted)

    def _read_ahead_next_segment(
        self, tp: TopicPartition, metadata: RemoteLogSegmentMetadata, next_position: int | None
    ) -> None:
        """The reader reads ahead within the segment; a read that ends within `prefetch_bytes` of its end also
        starts loading the head of the next remote segment, and its offset index, while the answer is written
        (docs/performance.md#remote-reads)."""
        left = 0 if next_position is None else metadata.segment_size_in_bytes - next_position
        if left >= self.reader.prefetch_bytes:
            return
        log = self._log_of(tp)
        cache = self._store.cache(metadata.segment_id.topic_id_partition)
        if log is None or cache is None:
            return
        next_offset = metadata.end_offset + 1
        epoch = log.leader_epoch_cache.epoch_for_offset(next_offset)
        following = None if epoch is None else cache.remote_log_segment_metadata(epoch, next_offset)
        if following is None:
            return
        self.reader.prefetch(following, 0, self.reader.prefetch_bytes - left)
        # The next read looks its fetch offset up in the segment's offset index first: one more GET, not waited for.
        warm = asyncio.create_task(self.run(self.index_cache.lookup_offset, following, next_offset))
        self._tasks.add(warm)
        warm.add_done_callback(_discard_quietly(self._tasks))

    async def _aborted_transactions(
        self, tp: TopicPartition, metadata: RemoteLogSegmentMetadata, records: bytes
    ) -> list[AbortedTxn]:
        """The aborted transactions overlapping the batches read (docs/transactions.md#tiered-read): from the
        transaction indexes of the segment and of each following remote segment of the log's lineage (fetched on
        a reader thread), then, if those do not complete the search, from the local log."""
        positions = [position for position, _ in complete_batches(records)]
        if not positions:
            return []
        # Kafka bounds the search by the offset index entry past the bytes read; the batches' own last offset
        # is a tighter bound of the same range.
        search = AbortedTxnSearch(
            read_header(records, positions[0]).base_offset, read_header(records, positions[-1]).last_offset + 1
        )
        log = self._log_of(tp)
        if log is None:
            raise NotLeaderOrFollowerError(f"{tp} left this broker during its remote read")
        cache = self._store.cache(metadata.segment_id.topic_id_partition)
        segment: RemoteLogSegmentMetadata | None = metadata
        while segment is not None:
            entries = await self.run(self.index_cache.aborted_txns, segment) if segment.has_txn_index else []
            if search.add(entries):
                break
            # Kafka's findNextSegmentMetadata: the copied segment holding the next offset in that offset's epoch.
            next_offset = segment.end_offset + 1
            epoch = log.leader_epoch_cache.epoch_for_offset(next_offset)
            segment = None if cache is None or epoch is None else cache.remote_log_segment_metadata(epoch, next_offset)
        return search.with_local(log.collect_aborted_transactions)

    def remote_segment(
        self, partition: TopicIdPartition, leader_epoch: int | None, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        """The copied segment holding `offset` in `leader_epoch`, as this broker's remote log metadata has it."""
        cache = self._store.cache(partition)
        if cache is None or leader_epoch is None:
            return None
        return cache.remote_log_segment_metadata(leader_epoch, offset)


class RemoteLogTasks:
    def __init__(
        self,
        broker_id: int,
        replica_manager: ReplicaManager,
        rlmm: TopicBasedRemoteLogMetadataManager,
        rsm: RemoteStorageManager,
        readers: RemoteStorageReaderThreadPool,
        stats: RemoteLogStats,
        *,
        task_interval_ms: int,
        copier_threads: int,
    ) -> None:
        self._broker_id = broker_id
        self._replica_manager = replica_manager
        self.rlmm = rlmm
        self.rsm = rsm
        self._readers = readers
        self._interval_s = task_interval_ms / 1000
        self._copier = ThreadPoolExecutor(copier_threads, thread_name_prefix="remote-log-copier")
        self._copying: set[uuid.UUID] = set()
        self._busy: set[TopicPartition] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self.stats = stats

    @property
    def reader(self) -> RemoteLogReader:
        return self._readers.reader

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="remote-log-manager")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._copier.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        await self.rlmm.ready.wait()
        while True:
            self.run_once()
            await asyncio.sleep(self._interval_s)

    def run_once(self) -> None:
        """One round over every tiered partition; a partition still busy from the last round is skipped."""
        for tp, partition in list(self._replica_manager.partitions.items()):
            if not partition.log.remote_log_enabled or tp in self._busy:
                continue
            if partition.is_leader:
                self._busy.add(tp)
                task = asyncio.create_task(self._lead(tp, partition), name=f"remote-log-{tp}")
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            else:
                self._learn_remote_end(partition)

    # Leader

    async def _lead(self, tp: TopicPartition, partition: Partition) -> None:
        try:
            await self._copy_segments(tp, partition)
            await self._expire_segments(tp, partition)
        except asyncio.CancelledError:
            raise
        except (RemoteStorageError, OSError, TimeoutError) as e:
            logger.warning("[RemoteLogManager broker=%d] %s: %s; retrying next round", self._broker_id, tp, e)
        except Exception:
            logger.exception("[RemoteLogManager broker=%d] %s: unexpected error", self._broker_id, tp)
        finally:
            self._busy.discard(tp)

    def _still_leading(self, partition: Partition, leader_epoch: int) -> bool:
        return partition.is_leader and partition.leader_epoch == leader_epoch

    async def _copy_segments(self, tp: TopicPartition, partition: Partition) -> None:
        log = partition.log
        topic_id = partition.topic_id
        leader_epoch = partition.leader_epoch
        self._learn_remote_end(partition)
        # Below the LSO (docs/transactions.md#tiered): a copied segment's transactions are all decided.
        for candidate in copy_candidates(log, log.highest_offset_in_remote_storage, log.last_stable_offset):
            if not self._still_leading(partition, leader_epoch):
                return  # the new leader copies from its own log
            segment = candidate.segment
            entries = log.leader_epoch_cache.epoch_entries()
            data = segment_data(log, candidate)
            metadata = RemoteLogSegmentMetadata(
                segment_id=RemoteLogSegmentId(TopicIdPartition(topic_id, tp), uuid.uuid4()),
                start_offset=segment.base_offset,
                end_offset=candidate.end_offset,
                max_timestamp_ms=segment.max_timestamp_so_far,
                broker_id=self._broker_id,
                event_timestamp_ms=now_ms(),
                segment_size_in_bytes=segment.size,
                segment_leader_epochs=epochs_in_range(entries, segment.base_offset, candidate.end_offset),
                has_txn_index=data.transaction_index is not None,
            )
            await self.rlmm.publish(metadata)
            self._copying.add(metadata.segment_id.id)
            try:
                await self._on_copier_thread(self.rsm.copy_log_segment_data, metadata, data)
            except Exception:
                # (Cancelled at shutdown: the COPY_SEGMENT_STARTED left behind expires as an abandoned copy.)
                self.stats.copy_errors += 1
                await self._abandon_copy(metadata)
                raise
            finally:
                self._copying.discard(metadata.segment_id.id)
            # A leader that lost leadership mid-copy still finishes it (docs/tiered-storage.md#copy): the copy
            # is complete, and a duplicate of the new leader's is tolerated and expired later.
            await self.rlmm.publish(self._update(metadata, RemoteLogSegmentState.COPY_SEGMENT_FINISHED))
            self.stats.copy_bytes += metadata.segment_size_in_bytes
            self.stats.copy_segments += 1
            partition.update_remote_log_end(candidate.end_offset, f"copied {metadata.segment_id.id}", now_ms())

    async def _abandon_copy(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Best effort: remove what a failed copy uploaded; what remains is expired with the log later."""
        try:
            await self.rlmm.publish(self._update(metadata, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
            await self._on_copier_thread(self.rsm.delete_log_segment_data, metadata)
            await self.rlmm.publish(self._update(metadata, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
        except Exception as e:
            logger.info("[RemoteLogManager broker=%d] cleaning up a failed copy failed too: %s", self._broker_id, e)

    async def _expire_segments(self, tp: TopicPartition, partition: Partition) -> None:
        cache = self.cache_of(partition)
        if cache is None:
            return
        leader_epoch = partition.leader_epoch
        log = partition.log
        plan = plan_remote_expiration(log, cache, now_ms(), frozenset(self._copying))
        # Readers are turned away from the segments before their objects go.
        if (
            plan.new_log_start_offset is not None
            and self._still_leading(partition, leader_epoch)
            and partition.increment_log_start_offset(
                plan.new_log_start_offset, trace.REMOTE_EXPIRE, "remote retention", now_ms()
            )
        ):
            self._replica_manager.fetch_purgatory.check_and_complete(tp)
        for deletion in plan.deletions:
            if not self._still_leading(partition, leader_epoch):
                return
            segment = deletion.segment
            logger.info(
                "[RemoteLogManager broker=%d] %s: deleting remote segment %s [%d, %d]: %s",
                self._broker_id,
                tp,
                segment.segment_id.id,
                segment.start_offset,
                segment.end_offset,
                deletion.reason,
            )
            try:
                if segment.state != RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
                    await self.rlmm.publish(self._update(segment, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
                await self._on_copier_thread(self.rsm.delete_log_segment_data, segment)
                self._readers.index_cache.remove(segment.segment_id.id)
                self._readers.reader.forget_segment(segment.segment_id.id)
                await self.rlmm.publish(self._update(segment, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
                self.stats.delete_segments += 1
            except RemoteStorageError:
                self.stats.delete_errors += 1
                raise  # a delete stuck half-way is retried next round (it stays DELETE_SEGMENT_STARTED)

    def _update(
        self, metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState
    ) -> RemoteLogSegmentMetadataUpdate:
        return RemoteLogSegmentMetadataUpdate(metadata.segment_id, now_ms(), state, self._broker_id)

    def _learn_remote_end(self, partition: Partition) -> None:
        """Ry from the remote log metadata, within this log's lineage: how followers learn what their local
        retention may delete, and how a new leader learns where copying stands."""
        log = partition.log
        highest = highest_remote_offset(
            log.leader_epoch_cache.epoch_entries(), log.log_end_offset, self.cache_of(partition)
        )
        partition.update_remote_log_end(highest, "remote log metadata", now_ms())

    # Reads

    def _remote_segment(
        self, tp: TopicPartition, leader_epoch: int | None, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        partition = self._replica_manager.partitions.get(tp)
        if partition is None:
            return None
        return self._readers.remote_segment(TopicIdPartition(partition.topic_id, tp), leader_epoch, offset)

    async def find_offset_by_timestamp(self, partition: Partition, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets by timestamp over the remote tier: the first offset at or after the log start whose
        timestamp is >= `timestamp`, among remote segments of this log's lineage; None if none."""
        log = partition.log
        cache = self.cache_of(partition)
        if cache is None:
            return None
        entries = log.leader_epoch_cache.epoch_entries()
        segments = [
            s
            for s in cache.list_remote_log_segments()
            if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
            and is_within_lineage(s, entries, log.log_end_offset)
            and s.end_offset >= log.log_start_offset
        ]
        if not segments:
            return None
        return await self._readers.run(
            self._readers.reader.find_offset_by_timestamp, segments, timestamp, log.log_start_offset
        )

    async def remote_log_aux_state(
        self, tp: TopicPartition, leader_epoch: int, offset: int
    ) -> tuple[int, list[tuple[int, int]], bytes | None]:
        """For a follower's BuildingRemoteLogAuxState: the remote segment holding `offset` (the leader's local
        log start - 1) in `leader_epoch`, as (its end offset, the epoch history up to its end, the producer
        snapshot copied with it, or None if there is none or it is unreadable)."""
        metadata = self._remote_segment(tp, leader_epoch, offset)
        if metadata is None:
            raise RemoteStorageError(
                f"no remote segment of {tp} holds offset {offset} in epoch {leader_epoch} (yet): the remote "
                "log metadata may still be replicating"
            )
        checkpoint = await self._readers.run(self.rsm.fetch_index, metadata, IndexType.LEADER_EPOCH)
        try:
            snapshot: bytes | None = await self._readers.run(
                self.rsm.fetch_index, metadata, IndexType.PRODUCER_SNAPSHOT
            )
        except RemoteResourceNotFoundError:
            snapshot = None
        if snapshot is not None:
            try:
                decode_snapshot(snapshot)
            except CorruptSnapshotError as e:
                # As Kafka's loadFromSnapshot: a corrupt snapshot is dropped and the follower starts with no
                # producer state, rather than never catching up.
                logger.warning(
                    "[RemoteLogManager broker=%d] %s: producer snapshot of %s ignored: %s",
                    self._broker_id,
                    tp,
                    metadata.segment_id.id,
                    e,
                )
                snapshot = None
        return metadata.end_offset, parse_epoch_checkpoint(checkpoint), snapshot

    # Helpers

    def cache_of(self, partition: Partition) -> RemoteLogMetadataCache | None:
        return self.rlmm.store.cache(TopicIdPartition(partition.topic_id, partition.topic_partition))

    async def _on_copier_thread(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._copier, function, *args)


def _discard_quietly(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("remote read-ahead failed: %s", task.exception())

    return done
