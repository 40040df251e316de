"""The transaction coordinator's asyncio shell: `__transaction_state`, its loading, appends, the timer and the
marker channel (docs/transactions.md#coordinator-shell).

The rules live in `tierlog.coordinator.transaction`; this wires them to the broker as Kafka's
TransactionStateManager and TransactionMarkerChannelManager do:
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

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tierlog.client.security import ClientSecurity
from tierlog.common import TopicPartition
from tierlog.config import KafkaConfig
from tierlog.coordinator.transaction.transaction_coordinator import (
    AppendCallback,
    TransactionConfig,
    TransactionCoordinator,
    TxnMarkerRequest,
)
from tierlog.metadata.image import ClusterMetadata
from tierlog.records.codec import build_batch, decode_batches
from tierlog.replication.replica_manager import AppendResult, ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.server.producer_id_manager import ProducerIdManager
from tierlog.server.transaction_marker_channel import TransactionMarkerChannel, WriteLocal

logger = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"

CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[str | None]]
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
        self._replica_manager = replica_manager
        self._image = image
        self._create_topic = create_topic
        self._arm_purgatory_timer = arm_purgatory_timer
        self._request_timeout_ms = config.get_int("request.timeout.ms")
        self._load_buffer_size = config.get_int("transaction.state.log.load.buffer.size")
        self.coordinator = TransactionCoordinator(
            transaction_config(config), self._append, self._send_markers, producer_ids.next_id
        )
        self.markers = TransactionMarkerChannel(
            config.node_id,
            image,
            lambda: config.inter_broker_listener_name,
            security,
            self._request_timeout_ms,
            self._still_owned,
            self._on_markers_written,
            write_local_markers,
        )
        # The __transaction_state partitions this broker leads, with their leader epoch (the coordinator epoch).
        self._leading: dict[int, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: int | None = None
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._creating: asyncio.Task[None] | None = None
        self._creation_error: str | None = None
        self._stopped = False

    @property
    def num_partitions(self) -> int:
        return self.config.get_int("transaction.state.log.num.partitions")

    # The topic

    def topic_ready(self) -> str | None:
        """None when __transaction_state exists; otherwise start creating it (once at a time) and return why
        clients must retry (COORDINATOR_NOT_AVAILABLE meanwhile, as Kafka)."""
        if TRANSACTION_STATE_TOPIC in self._image().topics:
            return None
        if not self._stopped and (self._creating is None or self._creating.done()):
            self._creating = asyncio.create_task(self._create_state_topic(), name="create-transaction-state")
        return self._creation_error or f"{TRANSACTION_STATE_TOPIC} is being created"

    async def _create_state_topic(self) -> None:
        config = self.config
        configs = {
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "min.insync.replicas": str(transaction_state_min_isr(config)),
            "segment.bytes": str(config.get_int("transaction.state.log.segment.bytes")),
            "unclean.leader.election.enable": "false",
        }
        replication_factor = config.internal_topic_replication_factor("transaction.state.log.replication.factor")
        try:
            error = await self._create_topic(TRANSACTION_STATE_TOPIC, self.num_partitions, replication_factor, configs)
        except Exception as e:  # the controller may be away; the next FindCoordinator tries again
            error = str(e)
        if error not in (None, "TOPIC_ALREADY_EXISTS"):
            self._creation_error = (
                f"cannot create {TRANSACTION_STATE_TOPIC} with {self.num_partitions} partitions and replication "
                f"factor {replication_factor} (transaction.state.log.num.partitions, "
                f"transaction.state.log.replication.factor): {error}"
            )
            logger.warning("%s", self._creation_error)

    def leader_of(self, transactional_id: str) -> int:
        """The broker leading the transactional id's partition, or -1 (no such topic or no leader yet)."""
        topic = self._image().topics.get(TRANSACTION_STATE_TOPIC)
        partition = self.coordinator.partition_for(transactional_id)
        if topic is None or partition >= len(topic.partitions):
            return -1
        return topic.partitions[partition].leader

    # Appends

    def _append(self, partition: int, records: list[Record], now: int, on_done: AppendCallback) -> None:
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, partition)
        batch = bytearray(build_batch([(key, value, (), now) for key, value in records]))

        def respond(results: dict[TopicPartition, AppendResult]) -> None:
            result = results.get(tp)
            on_done("UNKNOWN_TOPIC_OR_PARTITION" if result is None else result.error, now_ms())
            self._rearm()

        try:
            delayed = self._replica_manager.append_records({tp: batch}, -1, self._request_timeout_ms, now, respond)
        except Exception as e:
            logger.warning("appending to %s failed: %s", tp, e)
            on_done("UNKNOWN_SERVER_ERROR", now_ms())
            return
        if delayed is not None:
            self._arm_purgatory_timer(delayed.deadline_ms)

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
            self._rearm()

    # Leadership of __transaction_state partitions

    def on_metadata(self, image: ClusterMetadata) -> None:
        """After ReplicaManager applied `image`: load the partitions this broker now leads (or leads in a newer
        epoch), drop the others."""
        if self._stopped:
            return
        leading: dict[int, int] = {}
        topic = image.topics.get(TRANSACTION_STATE_TOPIC)
        if topic is not None:
            for index in range(len(topic.partitions)):
                partition = self._replica_manager.partitions.get(TopicPartition(TRANSACTION_STATE_TOPIC, index))
                if partition is not None and partition.is_leader:
                    leading[index] = partition.leader_epoch
        for index, epoch in list(self._leading.items()):
            if leading.get(index) != epoch:
                self._resign(index, epoch)
        for index, epoch in leading.items():
            if self._leading.get(index) != epoch:
                self._leading[index] = epoch
                if self.coordinator.on_election(index, epoch):
                    self._loads[index] = asyncio.create_task(self._load(index, epoch), name=f"load-txn-state-{index}")
        self._rearm()

    def _resign(self, index: int, epoch: int) -> None:
        del self._leading[index]
        task = self._loads.pop(index, None)
        if task is not None:
            task.cancel()
        self.coordinator.on_resignation(index, epoch)
        logger.info("resigned as transaction coordinator of %s-%d (epoch %d)", TRANSACTION_STATE_TOPIC, index, epoch)

    async def _load(self, index: int, epoch: int) -> None:
        """Read the partition from its log start to its log end offset and replay it; its transactional ids
        answer COORDINATOR_LOAD_IN_PROGRESS until then. Yields between reads so the broker keeps serving."""
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, index)
        records: list[Record] = []
        try:
            log = self._replica_manager.get_partition(tp).log
            offset, end = log.log_start_offset, log.log_end_offset
            while offset < end:
                data = log.read(offset, self._load_buffer_size, end, True).records
                if data is None:
                    break
                for batch in decode_batches(data.read_bytes()):
                    if batch.header.is_control:
                        continue
                    for record in batch.records:
                        if record.offset >= offset and record.key is not None:
                            records.append((record.key, record.value))
                    offset = max(offset, batch.header.last_offset + 1)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The partition stays loading (COORDINATOR_LOAD_IN_PROGRESS) rather than serving partial state.
            logger.exception("loading %s failed", tp)
            return
        finally:
            if self._loads.get(index) is asyncio.current_task():
                del self._loads[index]
        self.coordinator.complete_load(index, epoch, records, now_ms())
        logger.info("loaded %s (coordinator epoch %d): %d records", tp, epoch, len(records))
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
        self._timer_deadline = deadline
        self._timer = asyncio.get_running_loop().call_later(max(0.0, (deadline - now_ms()) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_deadline = None
        try:
            self.coordinator.on_timer(now_ms())
        except Exception:
            logger.exception("transaction coordinator timer failed")
        self._rearm()

    def after_call(self) -> None:
        """Handlers call this after every call into the core: deadlines may have moved earlier."""
        self._rearm()

    async def stop(self) -> None:
        """At shutdown: no more timers, loads or markers."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._loads.values():
            task.cancel()
        if self._creating is not None:
            self._creating.cancel()
        await self.markers.stop()
        for index, epoch in list(self._leading.items()):
            self._resign(index, epoch)
