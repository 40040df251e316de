"""The transaction coordinator's asyncio shell: `__transaction_state`, its loading, appends, the timer and the
marker channel (docs/transactions.md#coordinator-shell).

The rules live in `tierlog.coordinator.transaction`; this wires them to the broker as Kafka's
TransactionStateManager and TransactionMarkerChannelManager do, through the machinery both coordinators share
(`tierlog.server.coordinator_runtime`):
- `__transaction_state` is created on the first FindCoordinator for a transactional id (Kafka's
  transaction.state.log.* settings; compacted, uncompressed);
- its writes are one batch per call appended with acks=all through ReplicaManager, answered when the HW passes
  the batch or `request.timeout.ms` ends;
- when the broker becomes leader of a `__transaction_state` partition (coordinator epoch = its leader epoch) its
  records are read from the local log and replayed; when it stops leading it, the partition's transactions are
  dropped (Kafka's onElection / onResignation);
- the core's earliest deadline is kept armed on the event loop;
- markers go out through `TransactionMarkerChannel`, and the core learns when a transaction's are all written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tierlog.client.security import ClientSecurity
from tierlog.config import KafkaConfig
from tierlog.coordinator.transaction.transaction_coordinator import (
    AppendCallback,
    TransactionConfig,
    TransactionCoordinator,
    TxnMarkerRequest,
)
from tierlog.metadata.image import ClusterMetadata
from tierlog.records.codec import DecodedBatch, build_batch
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.server.coordinator_runtime import CoordinatorRuntime, CreateTopic, InternalTopic
from tierlog.server.producer_id_manager import ProducerIdManager
from tierlog.server.transaction_marker_channel import TransactionMarkerChannel, WriteLocal

logger = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"

Record = tuple[bytes, bytes | None]


def transaction_config(config: KafkaConfig) -> TransactionConfig:
    return TransactionConfig(
        transactional_id_expiration_ms=config.get_int("transactional.id.expiration.ms"),
        transaction_max_timeout_ms=config.get_int("transaction.max.timeout.ms"),
        transaction_state_log_num_partitions=config.get_int("transaction.state.log.num.partitions"),
        transaction_abort_timed_out_transaction_cleanup_interval_ms=config.get_int(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms"
        ),
        transaction_remove_expired_transaction_cleanup_interval_ms=config.get_int(
            "transaction.remove.expired.transaction.cleanup.interval.ms"
        ),
    )


def transaction_state_min_isr(config: KafkaConfig) -> int:
    """transaction.state.log.min.isr as set, else 1 on a standalone node (whose replication factor is 1, as
    Kafka's single-node server.properties sets both) and Kafka's default of 2 otherwise."""
    name = "transaction.state.log.min.isr"
    if name in config.originals or not config.is_standalone:
        return config.get_int(name)
    return 1


def decode_state_batch(batch: DecodedBatch, offset: int) -> list[Record]:
    """A `__transaction_state` batch's records from `offset` on, as key and value; control batches carry none."""
    if batch.header.is_control:
        return []
    return [
        (record.key, record.value) for record in batch.records if record.offset >= offset and record.key is not None
    ]


class TransactionCoordinatorService:
    def __init__(
        self,
        config: KafkaConfig,
        replica_manager: ReplicaManager,
        image: Callable[[], ClusterMetadata],
        create_topic: CreateTopic,
        arm_purgatory_timer: Callable[[int], None],
        producer_ids: ProducerIdManager,
        security: ClientSecurity,
        write_local_markers: WriteLocal,
    ) -> None:
        self.config = config
        request_timeout_ms = config.get_int("request.timeout.ms")
        self.coordinator = TransactionCoordinator(
            transaction_config(config), self._append, self._send_markers, producer_ids.next_id
        )
        self._runtime = CoordinatorRuntime(
            TRANSACTION_STATE_TOPIC,
            "transaction coordinator",
            replica_manager,
            image,
            create_topic,
            self._state_topic,
            arm_purgatory_timer,
            request_timeout_ms,
            config.get_int("transaction.state.log.load.buffer.size"),
            self.coordinator.next_deadline_ms,
            self.coordinator.on_timer,
        )
        self.markers = TransactionMarkerChannel(
            config.node_id,
            image,
            lambda: config.inter_broker_listener_name,
            security,
            request_timeout_ms,
            self._still_owned,
            self._on_markers_written,
            write_local_markers,
        )
        # The __transaction_state partitions this broker leads, with their leader epoch (the coordinator epoch).
        self._leading: dict[int, int] = {}

    @property
    def num_partitions(self) -> int:
        return self.config.get_int("transaction.state.log.num.partitions")

    # The topic

    def topic_ready(self) -> str | None:
        """None when __transaction_state exists; otherwise start creating it (once at a time) and return why
        clients must retry (COORDINATOR_NOT_AVAILABLE meanwhile, as Kafka)."""
        return self._runtime.topic_ready("create-transaction-state")

    def _state_topic(self) -> InternalTopic:
        config = self.config
        return InternalTopic(
            num_partitions=self.num_partitions,
            replication_factor=config.internal_topic_replication_factor("transaction.state.log.replication.factor"),
            configs={
                "cleanup.policy": "compact",
                "compression.type": "uncompressed",
                "min.insync.replicas": str(transaction_state_min_isr(config)),
                "segment.bytes": str(config.get_int("transaction.state.log.segment.bytes")),
                "unclean.leader.election.enable": "false",
            },
            settings="transaction.state.log.num.partitions, transaction.state.log.replication.factor",
        )

    def leader_of(self, transactional_id: str) -> int:
        """The broker leading the transactional id's partition, or -1 (no such topic or no leader yet)."""
        return self._runtime.leader_of(self.coordinator.partition_for(transactional_id))

    # Appends

    def _append(self, partition: int, records: list[Record], now: int, on_done: AppendCallback) -> None:
        batch = bytearray(build_batch([(key, value, (), now) for key, value in records]))
        self._runtime.append(partition, batch, now, on_done)

    # Markers

    def _send_markers(self, request: TxnMarkerRequest) -> None:
        self.markers.add(request)

    def _still_owned(self, transactional_id: str, coordinator_epoch: int) -> bool:
        return self.coordinator.coordinator_epoch(self.coordinator.partition_for(transactional_id)) == coordinator_epoch

    def _on_markers_written(self, request: TxnMarkerRequest) -> None:
        try:
            self.coordinator.on_markers_written(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.coordinator_epoch,
                now_ms(),
            )
        finally:
            self._runtime.rearm()

    # Leadership of __transaction_state partitions

    def on_metadata(self, image: ClusterMetadata) -> None:
        """After ReplicaManager applied `image`: load the partitions this broker now leads (or leads in a newer
        epoch), drop the others."""
        runtime = self._runtime
        if runtime.stopped:
            return
        leading = runtime.leading_partitions(image)
        for index, epoch in list(self._leading.items()):
            if leading.get(index) != epoch:
                self._resign(index, epoch)
        for index, epoch in leading.items():
            if self._leading.get(index) != epoch:
                self._leading[index] = epoch
                if self.coordinator.on_election(index, epoch):
                    runtime.load(
                        index, "load-txn-state", decode_state_batch, self._completer(index, epoch), follow_log_end=False
                    )
        runtime.rearm()

    def _completer(self, index: int, epoch: int) -> Callable[[list[Record]], None]:
        """Hands a loaded partition's records to the core; its transactional ids answer
        COORDINATOR_LOAD_IN_PROGRESS until then."""

        def complete(records: list[Record]) -> None:
            self.coordinator.complete_load(index, epoch, records, now_ms())
            logger.info(
                "loaded %s-%d (coordinator epoch %d): %d records", TRANSACTION_STATE_TOPIC, index, epoch, len(records)
            )

        return complete

    def _resign(self, index: int, epoch: int) -> None:
        del self._leading[index]
        self._runtime.cancel_load(index)
        self.coordinator.on_resignation(index, epoch)
        logger.info("resigned as transaction coordinator of %s-%d (epoch %d)", TRANSACTION_STATE_TOPIC, index, epoch)

    # Timers

    def after_call(self) -> None:
        """Handlers call this after every call into the core: deadlines may have moved earlier."""
        self._runtime.rearm()

    async def stop(self) -> None:
        """At shutdown: no more timers, loads or markers."""
        self._runtime.stop()
        await self.markers.stop()
        for index, epoch in list(self._leading.items()):
            self._resign(index, epoch)
