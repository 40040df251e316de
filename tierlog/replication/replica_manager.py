"""ReplicaManager: every partition replica on this broker, and the produce and fetch paths across them.

It turns the controller's metadata image into local Partitions (creating and deleting logs to match) and
their roles: leaders serve produce and fetch, followers are handed to one `ReplicaFetcher` per leader broker
(`fetchers`; the shell runs a task per entry). Requests that cannot be answered yet wait in a purgatory: a
fetch until enough bytes arrive or its wait ends (DelayedFetch), an acks=all produce until the HW passes its
records or its timeout (DelayedProduce), a consumer's fetch of an offset only the remote tier holds until
the remote read answers or `remote.fetch.max.wait.ms` passes (DelayedRemoteFetch). The remote read itself
runs in the shell (`AsyncRemoteRead`), which calls back with its result. Replicas move between the broker's
log dirs through future logs the shell steps (`move_future_logs`, docs/replication.md#log-dir-moves).

It holds the broker's two replication throttles (docs/replication.md#throttles): `leader_quota` for what its
leaders serve to followers, `follower_quota` for what its fetchers fetch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.metadata.image import BrokerRegistration, ClusterMetadata, PartitionRegistration
from tierlog.records.record_batch import InvalidRecordError
from tierlog.records.validation import RecordError, RecordValidationError
from tierlog.replication.errors import InvalidRequiredAcksError, UnknownTopicOrPartitionError
from tierlog.replication.fetcher import FetcherConfig, ReplicaFetcher
from tierlog.replication.partition import (
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    NO_EPOCH,
    READ_COMMITTED,
    AlterPartitionProposal,
    LogReadResult,
    OffsetAndEpoch,
    Partition,
    RemoteFetchInfo,
)
from tierlog.replication.purgatory import DelayedOperation, DelayedOperationPurgatory
from tierlog.replication.replication_quota import ReplicationQuotaConfig, ReplicationQuotaManager
from tierlog.replication.trace import TraceSink, ignore_trace
from tierlog.storage.leader_epoch_cache import UNDEFINED_EPOCH
from tierlog.storage.log import Log, LogAppendInfo
from tierlog.storage.log_config import FOLLOWER_THROTTLED_REPLICAS, LEADER_THROTTLED_REPLICAS
from tierlog.storage.log_manager import FUTURE_DIR_SUFFIX, LogManager
from tierlog.storage.producer_state import AppendOrigin
from tierlog.storage.transaction_index import AbortedTxn

CONSUMER_REPLICA_ID = -1
# The longest file name a file system takes: a future log's directory name must fit (Kafka's KAFKA-4893 check).
MAX_DIR_NAME_LENGTH = 255
# Kafka's remote.fetch.max.wait.ms default.
DEFAULT_REMOTE_FETCH_MAX_WAIT_MS = 500
logger = logging.getLogger(__name__)


def error_name_of(error: Exception) -> str:
    """The Kafka error name a failure maps to. An exception without one is a broker bug: it is logged with
    its traceback and answered UNKNOWN_SERVER_ERROR for that partition only, as Kafka does."""
    if isinstance(error, InvalidRecordError):
        return "CORRUPT_MESSAGE" if error.corrupt else "INVALID_RECORD"
    name = getattr(error, "error_name", None)
    if name is None:
        logger.error("unexpected error", exc_info=error)
        return "UNKNOWN_SERVER_ERROR"
    return name


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: str | None
    info: LogAppendInfo | None = None
    log_start_offset: int = -1
    message: str | None = None
    # The refused records of a batch LogValidator failed one by one (the produce response's record_errors).
    record_errors: tuple[RecordError, ...] = ()


ProduceResponder = Callable[[dict[TopicPartition, AppendResult]], None]


@dataclass(frozen=True, slots=True)
class FetchParams:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int


@dataclass(frozen=True, slots=True)
class PartitionFetchInfo:
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = NO_EPOCH
    last_fetched_epoch: int = NO_EPOCH
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchPartitionResult:
    topic_partition: TopicPartition
    error: str | None
    read: LogReadResult | None


FetchResponder = Callable[[list[FetchPartitionResult]], None]


class DelayedFetch(DelayedOperation):
    """A fetch waiting for `min_bytes` (or an error, or a diverging epoch) on any of its partitions, or for
    its deadline. Its re-reads never update a follower's fetch state: the fetch was recorded when it came, and
    the partitions the leader throttled for it then stay throttled (they answer no records) until it completes.

    Created right after a read found it unanswerable. A wake-up re-reads only if something that read depends
    on moved (Kafka's tryComplete compares offsets instead of reading): an append wakes a consumer's fetch,
    but a consumer reads only below the HW (a read_committed one below the LSO: docs/transactions.md#fetch),
    which a replicated partition's append does not move."""

    def __init__(
        self,
        deadline_ms: int,
        replica_manager: ReplicaManager,
        params: FetchParams,
        infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]],
        respond: FetchResponder,
        throttled: frozenset[TopicPartition] = frozenset(),
    ) -> None:
        super().__init__(deadline_ms)
        self._replica_manager = replica_manager
        self._params = params
        self._infos = infos
        self._respond = respond
        self._throttled = throttled
        self._results: list[FetchPartitionResult] | None = None
        self._positions_read = self._positions()

    def _positions(self) -> list[tuple[object, ...] | None]:
        """Per partition, everything its read depends on: which replica and role, epochs (fencing, diverging,
        replica set), the readable end (LEO for a follower, HW for a consumer, LSO for a read_committed one) and
        the log start."""
        from_follower = self._params.replica_id >= 0
        read_committed = self._params.isolation_level == READ_COMMITTED
        positions: list[tuple[object, ...] | None] = []
        for tp, _ in self._infos:
            p = self._replica_manager.partitions.get(tp)
            if p is None:
                positions.append(None)
                continue
            log = p.log
            if from_follower:
                end = log.log_end_offset
            elif read_committed:
                end = log.last_stable_offset
            else:
                end = log.high_watermark
            positions.append((p, p.leader_id, p.leader_epoch, p.partition_epoch, end, log.log_start_offset))
        return positions

    def try_complete(self) -> bool:
        positions = self._positions()
        if positions == self._positions_read:
            return False
        self._positions_read = positions
        results = self._replica_manager.read_from_local_log(self._params, self._infos, self._throttled)
        if _can_answer(results, self._params.min_bytes):
            self._results = results
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        results = self._results
        if results is None:
            results = self._replica_manager.read_from_local_log(self._params, self._infos, self._throttled)
        self._respond(results)


def _can_answer(results: Sequence[FetchPartitionResult], min_bytes: int) -> bool:
    if any(r.error or (r.read is not None and r.read.diverging_epoch is not None) for r in results):
        return True
    return sum(r.read.size for r in results if r.read is not None) >= min_bytes


@dataclass(frozen=True, slots=True)
class RemoteLogReadResult:
    """What a remote read gave: the records, or the Kafka error name the partition is answered with; for a
    read_committed read, the aborted transactions overlapping the records (None for read_uncommitted)."""

    records: bytes | None
    error: str | None = None
    aborted_transactions: list[AbortedTxn] | None = None


# The shell's remote read (Kafka's RemoteLogManager.asyncRead): starts reading the partition from the remote
# tier, off the event loop, and calls back on it with the result; the function it returns cancels the read.
AsyncRemoteRead = Callable[[TopicPartition, RemoteFetchInfo, Callable[[RemoteLogReadResult], None]], Callable[[], None]]


class DelayedRemoteFetch(DelayedOperation):
    """A consumer's fetch whose first partition with data lives only in the remote tier (Kafka's
    DelayedRemoteFetch): answered when that partition's remote read is, or at `remote.fetch.max.wait.ms`, when
    the read is cancelled and the partition answered empty (the consumer simply fetches again). Kafka serves
    one remote partition per fetch: any other partition whose offset is remote is answered empty."""

    def __init__(
        self,
        deadline_ms: int,
        results: Sequence[FetchPartitionResult],
        remote_partition: TopicPartition,
        respond: FetchResponder,
    ) -> None:
        super().__init__(deadline_ms)
        self._results = results
        self._remote_partition = remote_partition
        self._respond = respond
        self.remote_result: RemoteLogReadResult | None = None
        self.cancel_read: Callable[[], None] = lambda: None

    def try_complete(self) -> bool:
        return self.remote_result is not None and self.force_complete()

    def on_complete(self) -> None:
        remote = self.remote_result
        if remote is None:
            self.cancel_read()
        answered = []
        for result in self._results:
            read = result.read
            if read is None or read.remote_fetch is None:
                answered.append(result)
                continue
            empty = dataclasses.replace(read, remote_fetch=None)
            if result.topic_partition != self._remote_partition or remote is None:
                answered.append(dataclasses.replace(result, read=empty))
            elif remote.error is not None:
                answered.append(FetchPartitionResult(result.topic_partition, remote.error, None))
            else:
                # The records are bytes read from the remote tier, not a slice of a local segment.
                read = dataclasses.replace(
                    empty, records=remote.records, aborted_transactions=_remote_aborted_transactions(read, remote)
                )
                answered.append(dataclasses.replace(result, read=read))
        self._respond(answered)


def _remote_aborted_transactions(read: LogReadResult, remote: RemoteLogReadResult) -> tuple[AbortedTxn, ...] | None:
    """A read_committed remote read always answers a list, as a local one (Kafka's
    RemoteLogManager.addAbortedTransactions)."""
    assert read.remote_fetch is not None
    if not read.remote_fetch.read_committed:
        return None
    return tuple(remote.aborted_transactions or ())


class DelayedProduce(DelayedOperation):
    """An acks=all produce waiting until the HW of every appended partition passes its records (Kafka's
    DelayedProduce). The whole response is delivered once; partitions still waiting at the deadline answer
    REQUEST_TIMED_OUT."""

    def __init__(
        self,
        deadline_ms: int,
        replica_manager: ReplicaManager,
        results: dict[TopicPartition, AppendResult],
        required_offsets: dict[TopicPartition, int],
        respond: ProduceResponder,
    ) -> None:
        super().__init__(deadline_ms)
        self._replica_manager = replica_manager
        self._results = results
        self._pending = required_offsets
        self._respond = respond

    def try_complete(self) -> bool:
        for tp, required_offset in list(self._pending.items()):
            partition = self._replica_manager.partitions.get(tp)
            if partition is None:
                done, error = True, "UNKNOWN_TOPIC_OR_PARTITION"
            else:
                done, error = partition.check_enough_replicas_reached(required_offset)
            if done:
                del self._pending[tp]
                if error is not None:
                    self._results[tp] = AppendResult(error=error, message=f"{tp} before offset {required_offset}")
        if not self._pending:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        for tp, required_offset in self._pending.items():
            self._results[tp] = AppendResult(
                error="REQUEST_TIMED_OUT", message=f"the HW of {tp} did not reach {required_offset} in time"
            )
        self._respond(dict(self._results))


class ReplicaManager:
    def __init__(
        self,
        local_broker_id: int,
        log_manager: LogManager,
        *,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        fetcher_config: FetcherConfig | None = None,
        trace: TraceSink = ignore_trace,
        remote_read: AsyncRemoteRead | None = None,
        remote_fetch_max_wait_ms: int = DEFAULT_REMOTE_FETCH_MAX_WAIT_MS,
        replication_quota_config: ReplicationQuotaConfig | None = None,
    ) -> None:
        self.local_broker_id = local_broker_id
        self.log_manager = log_manager
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.fetcher_config = fetcher_config or FetcherConfig(replica_id=local_broker_id)
        self._trace = trace
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.fetch_purgatory: DelayedOperationPurgatory[DelayedFetch] = DelayedOperationPurgatory("Fetch")
        self.produce_purgatory: DelayedOperationPurgatory[DelayedProduce] = DelayedOperationPurgatory("Produce")
        self.remote_fetch_purgatory: DelayedOperationPurgatory[DelayedRemoteFetch] = DelayedOperationPurgatory(
            "RemoteFetch"
        )
        # None without a remote tier (remote.log.storage.system.enable=false).
        self._remote_read = remote_read
        # A dynamic broker config: the shell updates it when the broker's config changes.
        self.remote_fetch_max_wait_ms = remote_fetch_max_wait_ms
        quota_config = replication_quota_config or ReplicationQuotaConfig()
        # Their rates are dynamic broker configs: the shell updates them when the broker's config changes.
        self.leader_quota = ReplicationQuotaManager(quota_config, local_broker_id, LEADER_THROTTLED_REPLICAS)
        self.follower_quota = ReplicationQuotaManager(quota_config, local_broker_id, FOLLOWER_THROTTLED_REPLICAS)
        self.isr_shrinks = 0
        self.isr_expands = 0
        # Brokers that may join an ISR (docs/replication.md#isr-expand): registered, unfenced, not shutting down.
        self._eligible_brokers: set[int] = set()

    # Metadata

    def apply_metadata(self, metadata: ClusterMetadata, now_ms: int) -> None:
        """Make the local replicas match the image: open or create the logs of partitions assigned to us,
        take up leadership or follow (starting, moving or stopping fetchers), delete the logs of partitions
        deleted or moved off this broker since (docs/reassignment.md#removed-replicas), and set aside (never
        delete) logs on disk the metadata does not assign to this broker: stray logs, Kafka 3.8+'s rule. A
        new replica of a tiered partition starts at the leader's local log start
        (docs/reassignment.md#tiered-partitions)."""
        self._update_eligibility(metadata.brokers)
        topic_configs = {topic.name: topic.configs for topic in metadata.topics.values()}
        self.leader_quota.update_throttled_partitions(topic_configs)
        self.follower_quota.update_throttled_partitions(topic_configs)
        wanted: set[TopicPartition] = set()
        for topic in metadata.topics.values():
            self.log_manager.update_topic_config(topic.name, topic.configs)
            for index, registration in enumerate(topic.partitions):
                if self.local_broker_id not in registration.replicas:
                    continue
                tp = TopicPartition(topic.name, index)
                wanted.add(tp)
                partition = self.partitions.get(tp)
                if partition is None or partition.topic_id != topic.topic_id:
                    if partition is not None:
                        self._remove_partition(tp)
                    log = self.log_manager.get_or_create_log(tp, topic.topic_id, topic.configs, now_ms)
                    partition = Partition(
                        tp,
                        topic.topic_id,
                        log,
                        self.local_broker_id,
                        is_replica_eligible=self._is_replica_eligible,
                        replica_lag_time_max_ms=self.replica_lag_time_max_ms,
                        trace=self._trace,
                    )
                    self.partitions[tp] = partition
                before = (partition.leader_id, partition.leader_epoch, partition.partition_epoch)
                self._apply_role(partition, registration, now_ms)
                # A leader that became follower answers its waiting requests NOT_LEADER_OR_FOLLOWER, and a
                # committed ISR change may have moved the HW; an unchanged partition has nothing to wake.
                if (partition.leader_id, partition.leader_epoch, partition.partition_epoch) != before:
                    self._complete_delayed_requests(tp)
        for tp in set(self.partitions) - wanted:
            self._remove_partition(tp)
        for tp in {log.topic_partition for log in self.log_manager.all_logs()} - wanted:
            stray = self.log_manager.mark_stray(tp)
            logger.warning("partition %s is on disk but not assigned to this broker: kept aside as %s", tp, stray)
        for leader_id in [leader_id for leader_id, fetcher in self.fetchers.items() if not fetcher.partitions]:
            del self.fetchers[leader_id]

    def _update_eligibility(self, brokers: Mapping[int, BrokerRegistration]) -> None:
        self._eligible_brokers = {
            broker_id
            for broker_id, broker in brokers.items()
            if not broker.fenced and not broker.in_controlled_shutdown
        }

    def _is_replica_eligible(self, broker_id: int) -> bool:
        """Only a live, unfenced broker that is not shutting down may join an ISR (docs/replication.md#isr-expand)."""
        return broker_id in self._eligible_brokers

    def _apply_role(self, partition: Partition, registration: PartitionRegistration, now_ms: int) -> None:
        tp = partition.topic_partition
        if registration.leader == self.local_broker_id:
            partition.make_leader(registration, now_ms)
            self._stop_fetching(tp)
        elif partition.make_follower(registration, now_ms):
            self._stop_fetching(tp)
            # An offline partition (leader -1) has nobody to fetch from until a leader is elected.
            if registration.leader >= 0:
                fetcher = self.fetchers.get(registration.leader)
                if fetcher is None:
                    fetcher = ReplicaFetcher(
                        registration.leader, self.fetcher_config, self.partitions.get, self.follower_quota
                    )
                    self.fetchers[registration.leader] = fetcher
                fetcher.add_partition(tp, partition.topic_id, registration.leader_epoch, now_ms)

    def _stop_fetching(self, tp: TopicPartition) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove_partition(tp)

    def _remove_partition(self, tp: TopicPartition) -> None:
        del self.partitions[tp]
        self._stop_fetching(tp)
        self.log_manager.delete_log(tp)
        # Waiting requests of a deleted partition answer at once with UNKNOWN_TOPIC_OR_PARTITION.
        self._complete_delayed_requests(tp)

    def _complete_delayed_requests(self, tp: TopicPartition) -> None:
        self.fetch_purgatory.check_and_complete(tp)
        self.produce_purgatory.check_and_complete(tp)

    # Log dirs (docs/replication.md#log-dirs)

    def alter_replica_log_dirs(
        self, partition_dirs: Mapping[TopicPartition, str], now_ms: int
    ) -> dict[TopicPartition, str | None]:
        """Kafka's ReplicaManager.alterReplicaLogDirs: per partition, None when it is in (or on its way to) the
        log dir asked for, else the error. A log dir not in log.dirs is LOG_DIR_NOT_FOUND; a partition not on this
        broker is REPLICA_NOT_AVAILABLE, and is created in that dir when it comes. A move to another dir starts a
        future log there, which `move_future_logs` fills and swaps in; asking for the current dir stops a move in
        progress (its future log is deleted), as asking for a third dir restarts it there."""
        results: dict[TopicPartition, str | None] = {}
        for tp, path in partition_dirs.items():
            try:
                results[tp] = self._alter_replica_log_dir(tp, path, now_ms)
            except OSError as e:
                logger.warning("Unable to alter log dirs for %s: %s", tp, e)
                results[tp] = "KAFKA_STORAGE_ERROR"
        return results

    def _alter_replica_log_dir(self, tp: TopicPartition, path: str, now_ms: int) -> str | None:
        if len(f"{tp}.{'0' * 32}{FUTURE_DIR_SUFFIX}") > MAX_DIR_NAME_LENGTH:
            return "INVALID_TOPIC_EXCEPTION"  # "The topic name is too long."
        log_dir = self.log_manager.configured_log_dir(path)
        if log_dir is None:
            return "LOG_DIR_NOT_FOUND"
        partition = self.partitions.get(tp)
        future = self.log_manager.get_future_log(tp)
        if partition is not None and future is not None and future.dir.parent != log_dir:
            self.log_manager.delete_future_log(tp)
        self.log_manager.maybe_update_preferred_log_dir(tp, log_dir)
        if partition is None:
            return "REPLICA_NOT_AVAILABLE"
        if partition.log.dir.parent != log_dir and self.log_manager.get_future_log(tp) is None:
            self.log_manager.create_future_log(tp, now_ms)
            logger.info("moving %s from %s to %s", tp, partition.log.dir.parent, log_dir)
        return None

    def move_future_logs(self, now_ms: int, max_bytes: int) -> int:
        """One step of every move between log dirs (Kafka's ReplicaAlterLogDirsThread, the current log as the
        leader): each future log gives up what no longer matches the current log, takes up to `max_bytes` more of
        its batches, and replaces it once it holds everything (nothing appends between the check and the swap:
        the core runs one call at a time). Returns the bytes copied; `has_future_logs` says whether moves remain."""
        copied = 0
        for tp in self.log_manager.future_partitions():
            partition = self.partitions.get(tp)
            future = self.log_manager.get_future_log(tp)
            if partition is None or future is None:
                continue  # a future log loaded at startup waits for its partition's metadata
            copied += self._catch_up_future_log(partition, future, now_ms, max_bytes)
        return copied

    def has_future_logs(self) -> bool:
        return bool(self.log_manager.future_partitions())

    def _catch_up_future_log(self, partition: Partition, future: Log, now_ms: int, max_bytes: int) -> int:
        current = partition.log
        # As a follower's truncation, in rounds until the future log's latest epoch ends where the current log's
        # does: each round removes something, so it ends (Kafka's truncationCompleted=false, again).
        while (target := _future_truncation_offset(current, future)) < future.log_end_offset:
            if target < future.segments[0].base_offset:
                break
            future.truncate_to(target)
        if target < future.segments[0].base_offset or future.log_end_offset < current.local_log_start_offset:
            future.truncate_fully_and_start_at(current.segments[0].base_offset)
        copied = 0
        if future.log_end_offset < current.log_end_offset:
            records = current.read(future.log_end_offset, max_bytes, None, min_one_message=True).records
            if records is not None:
                data = records.read_bytes()
                future.append_as_follower(data, now_ms)
                copied = len(data)
        future.update_high_watermark(min(current.high_watermark, future.log_end_offset))
        if current.log_start_offset > future.log_start_offset:
            future.maybe_increment_log_start_offset(min(current.log_start_offset, future.high_watermark))
        if future.log_end_offset == current.log_end_offset:
            latest = current.leader_epoch_cache.latest_entry
            if latest is not None and future.leader_epoch_cache.latest_entry != latest:
                # A leader's epoch that starts at the log end (nothing written in it yet) has no batch to copy.
                future.leader_epoch_cache.assign(latest.epoch, latest.start_offset)
            partition.log = self.log_manager.replace_current_with_future_log(partition.topic_partition, now_ms)
            logger.info("%s moved to %s", partition.topic_partition, partition.log.dir.parent)
        return copied

    def get_partition(self, tp: TopicPartition) -> Partition:
        partition = self.partitions.get(tp)
        if partition is None:
            raise UnknownTopicOrPartitionError(f"This server does not host this topic-partition: {tp}")
        return partition

    # Produce

    def append_records(
        self,
        entries: Mapping[TopicPartition, bytearray],
        required_acks: int,
        timeout_ms: int,
        now_ms: int,
        respond: ProduceResponder,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> DelayedProduce | None:
        """Append to each partition's leader and answer through `respond`, exactly once: at once for acks 0
        and 1 or when nothing was appended, else when the HW of every appended partition passes its records
        (or `timeout_ms` passes). Returns the parked produce so the shell can arm a timer for its deadline.
        `origin` COORDINATOR: a coordinator's batches (transaction markers: docs/transactions.md#write-txn-markers)."""
        if required_acks not in (-1, 0, 1):
            raise InvalidRequiredAcksError(f"acks must be -1, 0 or 1, not {required_acks}")
        results: dict[TopicPartition, AppendResult] = {}
        required_offsets: dict[TopicPartition, int] = {}
        for tp, records in entries.items():
            try:
                partition = self.get_partition(tp)
                high_watermark = partition.log.high_watermark
                info = partition.append_records_to_leader(records, required_acks, now_ms, origin)
            except RecordValidationError as error:
                # As Kafka's ReplicaManager: the records at fault, and the log start offset of the partition.
                results[tp] = AppendResult(
                    error=error.error_name,
                    log_start_offset=partition.log.log_start_offset,
                    message=str(error),
                    record_errors=error.record_errors,
                )
                continue
            except Exception as error:  # every partition answers on its own; one bad batch fails only itself
                results[tp] = AppendResult(error=error_name_of(error), message=str(error))
                continue
            results[tp] = AppendResult(error=None, info=info, log_start_offset=partition.log.log_start_offset)
            required_offsets[tp] = info.last_offset + 1
            self.fetch_purgatory.check_and_complete(tp)
            if partition.log.high_watermark != high_watermark:
                self.produce_purgatory.check_and_complete(tp)
        if required_acks != -1 or not required_offsets:
            respond(results)
            return None
        delayed = DelayedProduce(now_ms + timeout_ms, self, results, required_offsets, respond)
        if self.produce_purgatory.try_complete_else_watch(delayed, list(required_offsets)):
            return None
        return delayed

    # Fetch

    def read_from_local_log(
        self,
        params: FetchParams,
        infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]],
        throttled: frozenset[TopicPartition] = frozenset(),
    ) -> list[FetchPartitionResult]:
        """Read every partition of a fetch. The response is bounded by max_bytes across partitions, but the
        first partition with data may exceed it by one batch so a consumer always makes progress (KIP-74).
        A `throttled` partition is read (its errors, epochs and offsets answer as usual) but answers no records,
        as Kafka's readFromLog for a follower the leader throttles."""
        results = []
        remaining = params.max_bytes
        min_one_message = True
        for tp, info in infos:
            try:
                partition = self.get_partition(tp)
                read = partition.read_records(
                    info.fetch_offset,
                    max(0, min(info.partition_max_bytes, remaining)),
                    isolation_level=params.isolation_level,
                    min_one_message=min_one_message,
                    current_leader_epoch=info.current_leader_epoch,
                    replica_id=params.replica_id,
                    last_fetched_epoch=info.last_fetched_epoch,
                )
            except Exception as error:
                results.append(FetchPartitionResult(tp, error_name_of(error), None))
                continue
            if tp in throttled:
                read = dataclasses.replace(read, records=None)
            if read.size > 0 or read.remote_fetch is not None:
                min_one_message = False
                remaining -= read.size
            results.append(FetchPartitionResult(tp, None, read))
        return results

    def fetch_messages(
        self,
        params: FetchParams,
        infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]],
        now_ms: int,
        respond: FetchResponder,
    ) -> DelayedFetch | DelayedRemoteFetch | None:
        """Answer at once when there is an error, a diverging epoch, enough data or no wait; otherwise park
        the fetch. A fetch of an offset only the remote tier holds waits for that read instead. A follower's
        fetch first records its position on the leader (its remote LEO), which may move the HW. Returns the
        parked operation so the shell can arm a timer for its deadline. A follower's fetch is throttled
        (docs/replication.md#throttles) by the leader quota as it arrives."""
        throttled: frozenset[TopicPartition] = frozenset()
        if params.replica_id >= 0:
            throttled = self._leader_throttled(params.replica_id, infos, now_ms)
            respond = self._recording_leader_quota(respond, now_ms)
        results = self.read_from_local_log(params, infos, throttled)
        if params.replica_id >= 0:
            self._update_follower_fetch_states(params.replica_id, infos, results, now_ms)
        remote = next((r for r in results if r.read is not None and r.read.remote_fetch is not None), None)
        if remote is not None and self._remote_read is not None:
            return self._fetch_remote(results, remote, now_ms, respond)
        if params.max_wait_ms <= 0 or not infos or remote is not None or _can_answer(results, params.min_bytes):
            respond(results)
            return None
        delayed = DelayedFetch(now_ms + params.max_wait_ms, self, params, infos, respond, throttled)
        # Just read and found unanswerable (recording a follower's position does not change what it reads):
        # watch without reading every partition again.
        self.fetch_purgatory.watch(delayed, [tp for tp, _ in infos])
        return delayed

    def _leader_throttled(
        self, replica_id: int, infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]], now_ms: int
    ) -> frozenset[TopicPartition]:
        """Kafka's shouldLeaderThrottle for each partition a follower fetches: throttled on this leader, the
        follower not in its ISR (an in-sync follower is never held back, so a throttle cannot shrink the ISR),
        and the leader quota exceeded."""
        quota = self.leader_quota
        candidates = [tp for tp, _ in infos if quota.is_throttled(tp)]
        if not candidates or not quota.is_quota_exceeded(now_ms):
            return frozenset()
        return frozenset(
            tp
            for tp in candidates
            if (partition := self.partitions.get(tp)) is not None and replica_id not in partition.isr
        )

    def _recording_leader_quota(self, respond: FetchResponder, now_ms: int) -> FetchResponder:
        """`respond`, counting first the records it sends of throttled partitions against the leader quota (as
        Kafka's handleFetchRequest, for in-sync followers too). A parked fetch counts them at its arrival time,
        which is at most replica.fetch.wait.max.ms earlier: the core reads no clock."""
        quota = self.leader_quota

        def respond_and_record(results: list[FetchPartitionResult]) -> None:
            sent = sum(r.read.size for r in results if r.read is not None and quota.is_throttled(r.topic_partition))
            if sent:
                quota.record(sent, now_ms)
            respond(results)

        return respond_and_record

    def _fetch_remote(
        self,
        results: list[FetchPartitionResult],
        remote: FetchPartitionResult,
        now_ms: int,
        respond: FetchResponder,
    ) -> DelayedRemoteFetch | None:
        """Start the remote read of the first partition that needs one and park the fetch until it answers
        (Kafka's processRemoteFetch)."""
        assert self._remote_read is not None and remote.read is not None and remote.read.remote_fetch is not None
        tp = remote.topic_partition
        delayed = DelayedRemoteFetch(now_ms + self.remote_fetch_max_wait_ms, results, tp, respond)

        def on_read(result: RemoteLogReadResult) -> None:
            delayed.remote_result = result
            self.remote_fetch_purgatory.check_and_complete(tp)

        delayed.cancel_read = self._remote_read(tp, remote.read.remote_fetch, on_read)
        if self.remote_fetch_purgatory.try_complete_else_watch(delayed, [tp]):
            return None
        return delayed

    def _update_follower_fetch_states(
        self,
        replica_id: int,
        infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]],
        results: Sequence[FetchPartitionResult],
        now_ms: int,
    ) -> None:
        for (tp, info), result in zip(infos, results, strict=True):
            read = result.read
            # A diverging follower's fetch offset is not its position in our log (docs/replication.md#diverging-epoch).
            if read is None or read.diverging_epoch is not None:
                continue
            partition = self.partitions[tp]
            if partition.update_follower_fetch_state(
                replica_id, info.fetch_offset, info.log_start_offset, now_ms, read.log_end_offset
            ):
                self._complete_delayed_requests(tp)

    def fetch_offset_for_timestamp(
        self,
        tp: TopicPartition,
        timestamp: int,
        *,
        isolation_level: int,
        current_leader_epoch: int,
        replica_id: int,
    ) -> OffsetAndEpoch | None:
        return self.get_partition(tp).fetch_offset_for_timestamp(
            timestamp,
            isolation_level=isolation_level,
            current_leader_epoch=current_leader_epoch,
            from_consumer=replica_id == CONSUMER_REPLICA_ID,
        )

    def delete_records(self, tp: TopicPartition, offset: int, now_ms: int) -> int:
        low_watermark = self.get_partition(tp).delete_records_on_leader(offset, now_ms)
        self.fetch_purgatory.check_and_complete(tp)
        return low_watermark

    # ISR

    def maybe_shrink_isr(self, now_ms: int) -> int:
        """Kafka's isr-expiration task (every replica.lag.time.max.ms / 2): returns the proposals made."""
        return sum(1 for partition in self.partitions.values() if partition.maybe_shrink_isr(now_ms))

    def take_alter_partition_proposals(self) -> list[AlterPartitionProposal]:
        """ISR changes to send to the controller, each handed out once."""
        proposals = []
        for partition in self.partitions.values():
            proposal = partition.take_alter_partition_proposal()
            if proposal is not None:
                proposals.append(proposal)
        return proposals

    def on_alter_partition_response(
        self, tp: TopicPartition, registration: PartitionRegistration | None, error: str | None, now_ms: int
    ) -> None:
        partition = self.partitions.get(tp)
        if partition is None:
            return
        isr_size, partition_epoch = len(partition.isr), partition.partition_epoch
        if partition.on_alter_partition_response(registration, error, now_ms):
            self._complete_delayed_requests(tp)
        if partition.partition_epoch != partition_epoch:
            if len(partition.isr) < isr_size:
                self.isr_shrinks += 1
            elif len(partition.isr) > isr_size:
                self.isr_expands += 1

    def under_replicated_partitions(self) -> int:
        return sum(1 for p in self.partitions.values() if p.is_leader and len(p.isr) < len(p.replicas))

    def describe_partitions(self) -> list[dict[str, object]]:
        return [self.partitions[tp].describe() for tp in sorted(self.partitions)]


def _future_truncation_offset(current: Log, future: Log) -> int:
    """Where the future log stops matching the current one, found as a follower finds it with its leader
    (docs/replication.md#truncation): the current log's end of the future log's latest epoch. The future log's
    LEO when they match; below its first offset when nothing can be trusted (start over)."""
    latest = future.leader_epoch_cache.latest_epoch
    if latest is None:
        return min(future.log_end_offset, current.log_end_offset)
    epoch, end = current.leader_epoch_cache.end_offset_for(latest, current.log_end_offset)
    if epoch == UNDEFINED_EPOCH:
        return -1
    if epoch != latest:
        # The current log has no such epoch: the future log matches up to the end of the one before it.
        end = min(end, future.leader_epoch_cache.end_offset_for(epoch, future.log_end_offset)[1])
    return min(end, future.log_end_offset, current.log_end_offset)
