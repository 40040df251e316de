"""The group coordinator's asyncio shell: `__consumer_offsets` appends, partition loading, and the one timer.

The rules live in `tierlog.coordinator.group`; this wires them to the broker through the machinery both
coordinators share (`tierlog.server.coordinator_runtime`), keeping what is the group coordinator's own:
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

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

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
from tierlog.records.codec import DecodedBatch, build_batch
from tierlog.records.control_batch import ControlRecordType, control_record_type
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.server.coordinator_runtime import CoordinatorRuntime, CreateTopic, InternalTopic
from tierlog.server.metrics import ScrapeCollector, ScrapedMetric

logger = logging.getLogger(__name__)

GROUP_METADATA_TOPIC = "__consumer_offsets"


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


def decode_offsets_batch(batch: DecodedBatch, offset: int) -> list[LoadEntry]:
    """A `__consumer_offsets` batch as the core replays it, from `offset` on: a transaction's records and its
    COMMIT or ABORT marker as such (docs/transactions.md#offsets-load), the others as key and value."""
    header = batch.header
    if header.is_control:
        if batch.records and header.last_offset >= offset:
            type_id = control_record_type(batch.records[0].key)
            if type_id in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
                return [TxnMarker(header.producer_id, type_id == ControlRecordType.COMMIT)]
        return []
    entries: list[LoadEntry] = []
    for record in batch.records:
        if record.offset < offset or record.key is None:
            continue
        if header.is_transactional:
            entries.append(TxnRecord(header.producer_id, record.key, record.value))
        else:
            entries.append((record.key, record.value))
    return entries


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
        self._runtime = CoordinatorRuntime(
            GROUP_METADATA_TOPIC,
            "group coordinator",
            replica_manager,
            image,
            create_topic,
            self._offsets_topic,
            arm_purgatory_timer,
            config.get_int("offsets.commit.timeout.ms"),
            config.get_int("offsets.load.buffer.size"),
            self.coordinator.next_deadline_ms,
            self.coordinator.on_timer,
        )
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
        return self._runtime.topic_ready("create-consumer-offsets")

    def _offsets_topic(self) -> InternalTopic:
        return InternalTopic(
            num_partitions=self.num_partitions,
            replication_factor=self.config.internal_topic_replication_factor("offsets.topic.replication.factor"),
            configs={
                "cleanup.policy": "compact",
                "compression.type": "producer",
                "segment.bytes": str(self.config.get_int("offsets.topic.segment.bytes")),
            },
            settings="offsets.topic.num.partitions, offsets.topic.replication.factor",
        )

    def leader_of(self, group_id: str) -> int:
        """The broker leading the group's partition, or -1 (no such topic or no leader yet)."""
        return self._runtime.leader_of(self.coordinator.partition_for(group_id))

    # Appends

    def _append(
        self,
        partition: int,
        records: list[Record],
        now: int,
        on_done: AppendCallback,
        producer: TxnProducer | None = None,
    ) -> None:
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
        # A coordinator's write (CoordinatorRuntime.append): a transactional batch's sequence is not checked.
        self._runtime.append(partition, batch, now, on_done)

    # Leadership of __consumer_offsets partitions

    def on_metadata(self, image: ClusterMetadata) -> None:
        """After ReplicaManager applied `image`: load the partitions this broker now leads, drop the others.
        Loading reads the log end offset again before each read, so a marker appended meanwhile is replayed
        too: the core is told of it only once it is loaded (docs/transactions.md#offsets-load)."""
        runtime = self._runtime
        if runtime.stopped:
            return
        leading = runtime.leading_partitions(image)
        now = now_ms()
        for index in self.coordinator.owned_partitions() - set(leading):
            runtime.cancel_load(index)
            self.coordinator.on_resignation(index, now)
            logger.info("resigned as coordinator of %s-%d", GROUP_METADATA_TOPIC, index)
        for index, epoch in leading.items():
            if self.coordinator.on_election(index, epoch):
                runtime.load(
                    index, "load-offsets", decode_offsets_batch, self._completer(index, epoch), follow_log_end=True
                )
        runtime.rearm()

    def _completer(self, index: int, epoch: int) -> Callable[[list[LoadEntry]], None]:
        return lambda entries: self.coordinator.complete_load(index, epoch, entries, now_ms())

    # Transactions

    def complete_transaction(self, offsets_partition: int, producer_id: int, committed: bool) -> None:
        """WriteTxnMarkers appended the producer's marker to `offsets_partition` of __consumer_offsets: its
        offsets pending there become committed, or are dropped (docs/transactions.md#offsets-pending)."""
        self.coordinator.complete_transaction(offsets_partition, producer_id, committed)
        self._runtime.rearm()

    # Timers

    def after_call(self) -> None:
        """Handlers call this after every call into the core: deadlines may have moved earlier."""
        self._runtime.rearm()

    def cleanup_group_metadata(self) -> None:
        removed = self.coordinator.cleanup_group_metadata(now_ms())
        if removed:
            logger.info("removed %d expired offsets", removed)
        self._runtime.rearm()

    def stop(self) -> None:
        """At shutdown: no more timers or loads; parked members are answered by the broker's own drain."""
        self._runtime.stop()
        now = now_ms()
        for index in self.coordinator.owned_partitions():
            self.coordinator.on_resignation(index, now)
