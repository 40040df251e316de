"""The controller as a simulated node: the real `Controller` over a real metadata log on the simulated disk.

It serves what brokers ask over the network (registration, heartbeats, AlterPartition, long-polling metadata
fetches, which wait on the core's `WakingMetadataLog` as the asyncio shell's do), fences brokers whose session
expired and runs the core's leader balancing passes when they are due (auto.leader.rebalance.enable). A crash
loses the session deadlines, the parked fetches and the pending balancing pass; the metadata log is fsynced on
every append, so a restart replays everything committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.errors import ControllerError
from tierlog.controller.metadata_log import CONTROLLER_EPOCH, DiskMetadataLog, WakingMetadataLog
from tierlog.metadata.lifecycle import BrokerHeartbeatRequest, BrokerRegistrationRequest
from tierlog.metadata.loader import MetadataBatches, MetadataFetchRequest
from tierlog.metadata.records import MetadataRecord
from tierlog.replication.alter_partition_manager import AlterPartitionRequest
from tierlog.sim.world import Node, Respond, Simulation

FENCE_CHECK_INTERVAL_MS = 100


class RecordingMetadataLog(DiskMetadataLog):
    """The metadata log, with every record also kept in memory so fetches need not read the disk."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.records: list[tuple[int, MetadataRecord]] = super().records_from(0)

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        first = super().append(records, now_ms)
        self.records.extend((first + i, record) for i, record in enumerate(records))
        return first


class SimController(Node):
    def __init__(self, sim: Simulation, data_dir: Path, config: ControllerConfig, cluster_id: str) -> None:
        super().__init__(sim, "controller")
        self._data_dir = data_dir
        self._config = config
        self._cluster_id = cluster_id
        self.controller: Controller | None = None
        self._metadata_log: WakingMetadataLog | None = None
        self._recording_log: RecordingMetadataLog | None = None
        # The due time of the balancing pass a timer is armed for, so each pass gets one timer.
        self._armed_balance_ms: int | None = None
        # Leaders the balancing passes moved back to their preferred replicas, over every incarnation.
        self.leaders_balanced = 0

    def on_start(self) -> None:
        self._recording_log = RecordingMetadataLog(self._data_dir)
        self._metadata_log = WakingMetadataLog(self._recording_log)
        self.controller = Controller(
            self._metadata_log, self._config, self.sim.now, self._cluster_id, new_uuid=self.sim.new_uuid
        )
        self._armed_balance_ms = None
        self.every(FENCE_CHECK_INTERVAL_MS, self._fence_stale_brokers)
        self._arm_leader_balance()

    def on_crash(self) -> None:
        if self._metadata_log is not None:
            self._metadata_log.close()
        self._metadata_log = None
        self._recording_log = None
        self.controller = None

    @property
    def records(self) -> list[tuple[int, MetadataRecord]]:
        assert self._recording_log is not None
        return self._recording_log.records

    def _fence_stale_brokers(self) -> None:
        assert self.controller is not None
        self.controller.fence_stale_brokers(self.sim.now)
        self._arm_leader_balance()

    def _arm_leader_balance(self) -> None:
        """After anything that may have changed the metadata: a timer for the controller's next balancing pass,
        if one is due and no timer waits for it yet (a due pass stays due until it runs)."""
        assert self.controller is not None
        due = self.controller.next_leader_balance_ms()
        if due is None or due == self._armed_balance_ms:
            return
        self._armed_balance_ms = due
        self.after(due - self.sim.now, self._balance_leaders)

    def _balance_leaders(self) -> None:
        assert self.controller is not None
        self._armed_balance_ms = None
        self.leaders_balanced += self.controller.balance_partition_leaders(self.sim.now)
        self._arm_leader_balance()

    # Requests (each runs on this node when the message arrives)

    def _decide(self, respond: Respond, decision: Callable[[Controller], object]) -> None:
        """Answer with the controller's decision, or with the name of the error it refused the request with."""
        assert self.controller is not None
        try:
            result = decision(self.controller)
        except ControllerError as error:
            respond(error.error_name)
            return
        self._arm_leader_balance()
        respond(result)

    def register(self, request: BrokerRegistrationRequest, respond: Respond) -> None:
        self._decide(
            respond,
            lambda c: c.register_broker(
                request.broker_id,
                str(request.incarnation_id),
                request.cluster_id,
                request.endpoints,
                request.rack,
                self.sim.now,
            ),
        )

    def heartbeat(self, request: BrokerHeartbeatRequest, respond: Respond) -> None:
        self._decide(
            respond,
            lambda c: c.heartbeat(
                request.broker_id,
                request.broker_epoch,
                request.current_metadata_offset,
                request.want_fence,
                request.want_shut_down,
                self.sim.now,
            ),
        )

    def alter_partition(self, request: AlterPartitionRequest, respond: Respond) -> None:
        p = request.proposal
        self._decide(
            respond,
            lambda c: c.alter_partition(
                request.broker_id,
                request.broker_epoch,
                p.topic_id,
                p.topic_partition.partition,
                p.leader_epoch,
                p.partition_epoch,
                p.new_isr,
            ),
        )

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> None:
        """An admin's CreateTopics, handed straight to the controller (the run's set-up, not under test)."""
        assert self.controller is not None
        self.controller.create_topic(name, partitions, replication_factor, configs)
        self._arm_leader_balance()

    def allocate_producer_id(self, respond: Respond) -> None:
        """InitProducerId, as a broker would answer it from a block the controller handed out."""
        assert self.controller is not None
        respond(self.controller.allocate_producer_id_block().start)
        self._arm_leader_balance()

    def fetch_metadata(self, request: MetadataFetchRequest, respond: Respond) -> None:
        """Batches from the offset asked for, with the log's end offset: at once if there are any, else when the
        next commit comes or the wait ends (KRaft's long-polling Fetch)."""
        metadata_log = self._metadata_log
        assert metadata_log is not None

        def answer() -> None:
            # One controller, no control batches: a record's offset is its place in the log.
            records = self.records[request.offset :]
            respond(
                (MetadataBatches(records, max(request.offset, len(self.records)), CONTROLLER_EPOCH), len(self.records))
            )

        deadline = metadata_log.wait_for_records(request.offset, request.max_wait_ms, self.sim.now, answer)
        if deadline is not None:
            self.after(deadline - self.sim.now, lambda: metadata_log.expire(self.sim.now))
