"""The group coordinator's asyncio shell: `__consumer_offsets` appends, partition loading, and the one timer.

The rules live in `tierlog.coordinator.group`; this wires them to the broker:
- writes are one batch per call appended to the group's partition with acks=all through ReplicaManager,
  answered when the HW passes the batch or `offsets.commit.timeout.ms` ends (Kafka's appendForGroup); a
  transaction's offsets are the producer's transactional batch;
- when the broker becomes leader of a `__consumer_offsets` partition its records are read from the local
  log (up to the log end offset, `offsets.load.buffer.size` bytes at a time) and replayed; on becoming a
  follower its groups are dropped (Kafka's onElection / onResignation); transactional batches and markers
  are replayed as such;
- WriteTxnMarkers calls `complete_transaction` once a marker is in a partition;
- the core's earliest deadline is kept armed on the event loop (no polling).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.coordinator.group.group_coordinator import (
    AppendCallback,
    GroupConfig,
    GroupCoordinator,
    LoadEntry,
    Record,
    TxnMarker,
    TxnProducer,
    TxnRecord,
)
from tierlog.metadata.image import ClusterMetadata
from tierlog.records.codec import build_batch, decode_batches
from tierlog.records.control_batch import ControlRecordType, control_record_type
from tierlog.replication.replica_manager import AppendResult, ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.server.metrics import ScrapeCollector, ScrapedMetric
from tierlog.storage.producer_state import AppendOrigin

logger = logging.getLogger(__name__)

GROUP_METADATA_TOPIC = "__consumer_offsets"

CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[str | None]]


def group_config(config: KafkaConfig) -> GroupConfig:
    return GroupConfig(
        offsets_topic_num_partitions=config.get_int("offsets.topic.num.partitions"),
        group_min_session_timeout_ms=config.get_int("group.min.session.timeout.ms"),
        group_max_session_timeout_ms=config.get_int("group.max.session.timeout.ms"),
        group_initial_rebalance_delay_ms=config.get_int("group.initial.rebalance.delay.ms"),
        group_max_size=config.get_int("group.max.size"),
        offset_metadata_max_bytes=config.get_int("offset.metadata.max.bytes"),
        offsets_retention_ms=config.get_int("offsets.retention.minutes") * 60 * 1000,
    )


class GroupCoordinatorService:
    def __init__(
        self,
        config: KafkaConfig,
        replica_manager: ReplicaManager,
        image: Callable[[], ClusterMetadata],
        create_topic: CreateTopic,
        arm_purgatory_timer: Callable[[int], None],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.coordinator = GroupCoordinator(group_config(config), self._append)
        self._replica_manager = replica_manager
        self._image = image
        self._create_topic = create_topic
        self._arm_purgatory_timer = arm_purgatory_timer
        self._commit_timeout_ms = config.get_int("offsets.commit.timeout.ms")
        self._load_buffer_size = config.get_int("offsets.load.buffer.size")
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: int | None = None
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._creating: asyncio.Task[None] | None = None
        # Why the last creation of __consumer_offsets failed, for the clients that keep asking.
        self._creation_error: str | None = None
        self._stopped = False
        if registry is not None:
            self._register_metrics(registry)

    def _register_metrics(self, registry: CollectorRegistry) -> None:
        """Kafka's GroupMetadataManager metrics (NumGroups<State>, NumOffsets, OffsetCommits), read at scrape."""
        coordinator = self.coordinator
        registry.register(
            ScrapeCollector(
                [
                    ScrapedMetric(
                        "gauge",
                        "kafka_coordinator_group_groupmetadatamanager_numgroups",
                        "Groups this broker coordinates, by state.",
                        ("state",),
                    ).callback(
                        lambda: [
                            ({"state": state}, float(n)) for state, n in coordinator.group_counts_by_state().items()
                        ]
                    ),
                    ScrapedMetric(
                        "gauge",
                        "kafka_coordinator_group_groupmetadatamanager_numoffsets",
                        "Committed offsets held by the groups this broker coordinates.",
                    ).callback(lambda: float(sum(len(g.offsets) for g in coordinator.groups.values()))),
                    ScrapedMetric(
                        "counter",
                        "kafka_coordinator_group_groupmetadatamanager_offsetcommits_total",
                        "Offsets committed through this broker (one per partition of a successful OffsetCommit).",
                    ).callback(lambda: float(coordinator.offset_commits)),
                ]
            )
        )

    @property
    def num_partitions(self) -> int:
        return self.coordinator.config.offsets_topic_num_partitions

    # The topic

    def topic_ready(self) -> str | None:
        """None when __consumer_offsets exists; otherwise start creating it (once at a time) and return why
        clients must retry, as Kafka's FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile."""
        if GROUP_METADATA_TOPIC in self._image().topics:
            return None
        if not self._stopped and (self._creating is None or self._creating.done()):
            self._creating = asyncio.create_task(self._create_offsets_topic(), name="create-consumer-offsets")
        return self._creation_error or f"{GROUP_METADATA_TOPIC} is being created"

    async def _create_offsets_topic(self) -> None:
        configs = {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            "segment.bytes": str(self.config.get_int("offsets.topic.segment.bytes")),
        }
        replication_factor = self.config.internal_topic_replication_factor("offsets.topic.replication.factor")
        try:
            error = await self._create_topic(GROUP_METADATA_TOPIC, self.num_partitions, replication_factor, configs)
        except Exception as e:  # the controller may be away; the next FindCoordinator tries again
            error = str(e)
        if error not in (None, "TOPIC_ALREADY_EXISTS"):
            self._creation_error = (
                f"cannot create {GROUP_METADATA_TOPIC} with {self.num_partitions} partitions and replication "
                f"factor {replication_factor} (offsets.topic.num.partitions, offsets.topic.replication.factor): "
                f"{error}"
            )
            logger.warning("%s", self._creation_error)

    def leader_of(self, group_id: str) -> int:
        """The broker leading the group's partition, or -1 (no such topic or no leader yet)."""
        topic = self._image().topics.get(GROUP_METADATA_TOPIC)
        partition = self.coordinator.partition_for(group_id)
        if topic is None or partition >= len(topic.partitions):
            return -1
        return topic.partitions[partition].leader

    # Appends

    def _append(
        self,
        partition: int,
        records: list[Record],
        now: int,
        on_done: AppendCallback,
        producer: TxnProducer | None = None,
    ) -> None:
        tp = TopicPartition(GROUP_METADATA_TOPIC, partition)
        specs = [(key, value, (), now) for key, value in records]
        if producer is None:
            batch = bytearray(build_batch(specs))
        else:
            # Kafka's storeOffsets with a producer id: the producer's transactional batch, base sequence 0
            # (docs/transactions.md#offsets-batch).
            batch = bytearray(
                build_batch(
                    specs,
                    producer_id=producer.producer_id,
                    producer_epoch=producer.producer_epoch,
                    base_sequence=0,
                    transactional=True,
                )
            )

        def respond(results: dict[TopicPartition, AppendResult]) -> None:
            result = results.get(tp)
            on_done("UNKNOWN_TOPIC_OR_PARTITION" if result is None else result.error, now_ms())
            self._rearm()

        try:
            # Kafka's appendForGroup: a coordinator's write (a transactional batch's sequence is not checked).
            delayed = self._replica_manager.append_records(
                {tp: batch}, -1, self._commit_timeout_ms, now, respond, origin=AppendOrigin.COORDINATOR
            )
        except Exception as e:
            logger.warning("appending to %s failed: %s", tp, e)
            on_done("UNKNOWN_SERVER_ERROR", now_ms())
            return
        if delayed is not None:
            self._arm_purgatory_timer(delayed.deadline_ms)

    # Leadership of __consumer_offsets partitions

    def on_metadata(self, image: ClusterMetadata) -> None:
        """After ReplicaManager applied `image`: load the partitions this broker now leads, drop the others."""
        if self._stopped:
            return
        leading: dict[int, int] = {}
        topic = image.topics.get(GROUP_METADATA_TOPIC)
        if topic is not None:
            for index in range(len(topic.partitions)):
                partition = self._replica_manager.partitions.get(TopicPartition(GROUP_METADATA_TOPIC, index))
                if partition is not None and partition.is_leader:
                    leading[index] = partition.leader_epoch
        now = now_ms()
        for index in self.coordinator.owned_partitions() - set(leading):
            task = self._loads.pop(index, None)
            if task is not None:
                task.cancel()
            self.coordinator.on_resignation(index, now)
            logger.info("resigned as coordinator of %s-%d", GROUP_METADATA_TOPIC, index)
        for index, epoch in leading.items():
            if self.coordinator.on_election(index, epoch):
                self._loads[index] = asyncio.create_task(self._load(index, epoch), name=f"load-offsets-{index}")
        self._rearm()

    async def _load(self, index: int, epoch: int) -> None:
        """Read the partition from its log start to its log end offset and replay it; the groups answer
        COORDINATOR_LOAD_IN_PROGRESS until then. Yields between reads so the broker keeps serving. The log end
        offset is read again before each read (Kafka's loadGroupsAndOffsets), so a marker appended meanwhile
        is replayed too: the core is told of it only once it is loaded (docs/transactions.md#offsets-load)."""
        tp = TopicPartition(GROUP_METADATA_TOPIC, index)
        entries: list[LoadEntry] = []
        try:
            log = self._replica_manager.get_partition(tp).log
            offset = log.log_start_offset
            while offset < (end := log.log_end_offset):
                data = log.read(offset, self._load_buffer_size, end, True).records
                if data is None:
                    break
                for batch in decode_batches(data.read_bytes()):
                    header = batch.header
                    if header.is_control:
                        if batch.records and header.last_offset >= offset:
                            type_id = control_record_type(batch.records[0].key)
                            if type_id in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
                                committed = type_id == ControlRecordType.COMMIT
                                entries.append(TxnMarker(header.producer_id, committed))
                    else:
                        for record in batch.records:
                            if record.offset < offset or record.key is None:
                                continue
                            if header.is_transactional:
                                entries.append(TxnRecord(header.producer_id, record.key, record.value))
                            else:
                                entries.append((record.key, record.value))
                    offset = max(offset, header.last_offset + 1)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The partition stays loading (COORDINATOR_LOAD_IN_PROGRESS) rather than serving partial state.
            logger.exception("loading %s failed", tp)
            return
        finally:
            self._loads.pop(index, None)
        self.coordinator.complete_load(index, epoch, entries, now_ms())
        self._rearm()

    # Transactions

    def complete_transaction(self, offsets_partition: int, producer_id: int, committed: bool) -> None:
        """WriteTxnMarkers appended the producer's marker to `offsets_partition` of __consumer_offsets: its
        offsets pending there become committed, or are dropped (docs/transactions.md#offsets-pending)."""
        self.coordinator.complete_transaction(offsets_partition, producer_id, committed)
        self._rearm()

    # Timers

    def _rearm(self) -> None:
        """Keep one timer armed at the core's earliest deadline."""
        if self._stopped:
            return
        deadline = self.coordinator.next_deadline_ms()
        if deadline is None or (self._timer_deadline is not None and self._timer_deadline <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_deadline = deadline
        self._timer = loop.call_later(max(0.0, (deadline - now_ms()) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_deadline = None
        try:
            self.coordinator.on_timer(now_ms())
        except Exception:
            logger.exception("group coordinator timer failed")
        self._rearm()

    def after_call(self) -> None:
        """Handlers call this after every call into the core: deadlines may have moved earlier."""
        self._rearm()

    def cleanup_group_metadata(self) -> None:
        removed = self.coordinator.cleanup_group_metadata(now_ms())
        if removed:
            logger.info("removed %d expired offsets", removed)
        self._rearm()

    def stop(self) -> None:
        """At shutdown: no more timers or loads; parked members are answered by the broker's own drain."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._loads.values():
            task.cancel()
        if self._creating is not None:
            self._creating.cancel()
        now = now_ms()
        for index in self.coordinator.owned_partitions():
            self.coordinator.on_resignation(index, now)
