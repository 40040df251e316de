"""ReplicaManager: every partition replica on this broker, and the produce and fetch paths across them.

It turns the controller's metadata image into local Partitions (creating and deleting logs to match),
appends produce data to leaders, and serves fetches, parking those that cannot be answered yet in the
fetch purgatory until enough bytes arrive or their wait ends (DelayedFetch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tierlog.common import TopicPartition
from tierlog.controller.metadata import ClusterMetadata
from tierlog.records.record_batch import InvalidRecordError
from tierlog.replication.errors import InvalidRequiredAcksError, UnknownTopicOrPartitionError
from tierlog.replication.partition import LogReadResult, OffsetAndEpoch, Partition
from tierlog.replication.purgatory import DelayedOperation, DelayedOperationPurgatory
from tierlog.storage.log import LogAppendInfo
from tierlog.storage.log_manager import LogManager

CONSUMER_REPLICA_ID = -1
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
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class FetchPartitionResult:
    topic_partition: TopicPartition
    error: str | None
    read: LogReadResult | None


FetchResponder = Callable[[list[FetchPartitionResult]], None]


class DelayedFetch(DelayedOperation):
    """A fetch waiting for `min_bytes` (or an error) on any of its partitions, or for its deadline."""

    def __init__(
        self,
        deadline_ms: int,
        replica_manager: ReplicaManager,
        params: FetchParams,
        infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]],
        respond: FetchResponder,
    ) -> None:
        super().__init__(deadline_ms)
        self._replica_manager = replica_manager
        self._params = params
        self._infos = infos
        self._respond = respond
        self._results: list[FetchPartitionResult] | None = None

    def try_complete(self) -> bool:
        results = self._replica_manager.read_from_local_log(self._params, self._infos)
        if any(r.error for r in results) or _accumulated_bytes(results) >= self._params.min_bytes:
            self._results = results
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        results = self._results
        if results is None:
            results = self._replica_manager.read_from_local_log(self._params, self._infos)
        self._respond(results)


def _accumulated_bytes(results: Sequence[FetchPartitionResult]) -> int:
    return sum(r.read.size for r in results if r.read is not None)


class ReplicaManager:
    def __init__(self, local_broker_id: int, log_manager: LogManager) -> None:
        self.local_broker_id = local_broker_id
        self.log_manager = log_manager
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory: DelayedOperationPurgatory[DelayedFetch] = DelayedOperationPurgatory("Fetch")

    def apply_metadata(self, metadata: ClusterMetadata, now_ms: int) -> None:
        """Make the local replicas match the image: open or create the logs of partitions assigned to us,
        take up leadership, delete the logs of partitions deleted since, and set aside (never delete) logs
        the metadata has never heard of."""
        wanted: set[TopicPartition] = set()
        for topic in metadata.topics.values():
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
                    partition = Partition(tp, topic.topic_id, log, self.local_broker_id)
                    self.partitions[tp] = partition
                else:
                    self.log_manager.update_topic_config(topic.name, topic.configs)
                if registration.leader == self.local_broker_id:
                    partition.make_leader(registration)
        for tp in set(self.partitions) - wanted:
            self._remove_partition(tp)
        for tp in {log.topic_partition for log in self.log_manager.all_logs()} - wanted:
            stray = self.log_manager.mark_stray(tp)
            logger.warning("partition %s is on disk but not in the cluster metadata: kept aside as %s", tp, stray)

    def _remove_partition(self, tp: TopicPartition) -> None:
        del self.partitions[tp]
        self.log_manager.delete_log(tp)
        # Waiting fetches of a deleted partition answer at once with UNKNOWN_TOPIC_OR_PARTITION.
        self.fetch_purgatory.check_and_complete(tp)

    def get_partition(self, tp: TopicPartition) -> Partition:
        partition = self.partitions.get(tp)
        if partition is None:
            raise UnknownTopicOrPartitionError(f"This server does not host this topic-partition: {tp}")
        return partition

    def append_records(
        self, entries: Mapping[TopicPartition, bytearray], required_acks: int, now_ms: int
    ) -> dict[TopicPartition, AppendResult]:
        results: dict[TopicPartition, AppendResult] = {}
        if required_acks not in (-1, 0, 1):
            raise InvalidRequiredAcksError(f"acks must be -1, 0 or 1, not {required_acks}")
        for tp, records in entries.items():
            try:
                partition = self.get_partition(tp)
                info = partition.append_records_to_leader(records, required_acks, now_ms)
            except Exception as error:  # every partition answers on its own; one bad batch fails only itself
                results[tp] = AppendResult(error=error_name_of(error), message=str(error))
                continue
            results[tp] = AppendResult(error=None, info=info, log_start_offset=partition.log.log_start_offset)
            self.fetch_purgatory.check_and_complete(tp)
        return results

    def read_from_local_log(
        self, params: FetchParams, infos: Sequence[tuple[TopicPartition, PartitionFetchInfo]]
    ) -> list[FetchPartitionResult]:
        """Read every partition of a fetch. The response is bounded by max_bytes across partitions, but the
        first partition with data may exceed it by one batch so a consumer always makes progress (KIP-74)."""
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
                )
            except Exception as error:
                results.append(FetchPartitionResult(tp, error_name_of(error), None))
                continue
            if read.size > 0:
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
    ) -> DelayedFetch | None:
        """Answer at once when there is an error, enough data or no wait; otherwise park the fetch.
        Returns the parked operation so the shell can arm a timer for its deadline."""
        results = self.read_from_local_log(params, infos)
        if (
            params.max_wait_ms <= 0
            or not infos
            or any(r.error for r in results)
            or _accumulated_bytes(results) >= params.min_bytes
        ):
            respond(results)
            return None
        delayed = DelayedFetch(now_ms + params.max_wait_ms, self, params, infos, respond)
        if self.fetch_purgatory.try_complete_else_watch(delayed, [tp for tp, _ in infos]):
            return None
        return delayed

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

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        low_watermark = self.get_partition(tp).delete_records_on_leader(offset)
        self.fetch_purgatory.check_and_complete(tp)
        return low_watermark
