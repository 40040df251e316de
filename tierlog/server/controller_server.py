"""The controller's shell on a controller node (process.roles contains controller, the node is a voter of
controller.quorum.voters): the quorum's Raft shell, and the controller while this node is the active one.

The `RaftManager` (server/raft_manager.py) replicates `__cluster_metadata-0` among the voters. When its core says
this node became the active leader (its epoch's LeaderChangeMessage committed: the whole local log is
committed), a `Controller` is built by replaying that log, and its timers start: fencing brokers whose session
ran out, balancing leaders when a pass is due (auto.leader.rebalance.enable). When leadership is lost, both go
and the Controller is thrown away; it is rebuilt from the log if this node leads again
(docs/quorum.md#active-controller). Every controller node, active or not, also folds its committed log into its
**standby image** and snapshots it when due (`MetadataSnapshotter`, docs/quorum.md#snapshots): a controller that is
not the active one answers SCRAM logins and ACL checks from that image. The rules live in
`tierlog.controller.controller.Controller`; the requests brokers and clients send the controller are answered by
`ControllerApis` (server/controller_apis.py), each only once what it wrote is committed.
"""

from __future__ import annotations

import asyncio
import logging

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import MetadataSnapshot, QuorumMetadataLog, read_metadata_snapshot
from tierlog.controller.metadata_snapshots import MetadataSnapshotter, SnapshotConfig
from tierlog.metadata.image import ClusterMetadata
from tierlog.server.clock import now_ms
from tierlog.server.raft_manager import RaftManager

logger = logging.getLogger(__name__)

# The longest a controller's answer waits for its records to commit. A leader that cannot reach a majority
# resigns within 1.5 x controller.quorum.fetch.timeout.ms, which ends the wait sooner (NOT_CONTROLLER); this
# only bounds a wait nothing else ends. Kafka's request.timeout.ms default.
COMMIT_TIMEOUT_S = 30.0
# The most a committed-metadata read returns at once (KRaft's largest batch).
METADATA_READ_MAX_BYTES = 8 * 1024 * 1024


class ControllerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.raft = RaftManager(config)
        # The controller, while this node is the active one; None otherwise.
        self.controller: Controller | None = None
        # Folds the committed log and snapshots it; made once the metadata log is open.
        self._snapshotter: MetadataSnapshotter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Set on every change the Raft shell reports (leader, epoch, high watermark), for whoever waits on one.
        self._changed = asyncio.Event()
        self._leader_balance_interval_ms = (
            config.get_int("leader.imbalance.check.interval.seconds") * 1000
            if config.get_bool("auto.leader.rebalance.enable")
            else None
        )

    async def start(self) -> None:
        self.raft.add_listener(self._on_quorum_change)
        await self.raft.start()
        self._snapshotter = MetadataSnapshotter(
            self.raft.client,
            SnapshotConfig(
                max_bytes_between_snapshots=self.config.get_int("metadata.log.max.record.bytes.between.snapshots"),
                max_interval_ms=self.config.get_int("metadata.log.max.snapshot.interval.ms"),
            ),
            now_ms(),
        )
        self.raft.add_listener(self._snapshot_if_due)
        self._on_quorum_change()

    @property
    def standby_image(self) -> ClusterMetadata:
        """The metadata this node's committed log holds (the latest snapshot and the committed records after it)."""
        if self._snapshotter is None:
            raise RuntimeError("the controller server has not started")
        return self._snapshotter.image

    @property
    def security_image(self) -> ClusterMetadata:
        """The active controller's metadata while this node is the active one, else the standby image: what this
        node's controller listeners check logins and ACLs against."""
        return self.controller.metadata if self.controller is not None else self.standby_image

    async def stop(self) -> None:
        tasks = self._deactivate()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.raft.stop()

    # Leadership

    @property
    def leader_id(self) -> int | None:
        """The quorum's leader as this voter knows it (a hint for where the active controller is)."""
        return self.raft.client.leader_id

    def _on_quorum_change(self) -> None:
        active = self.raft.client.is_active_leader()
        if active and self.controller is None:
            self._activate()
        elif not active and self.controller is not None:
            self._deactivate()
        self._changed.set()
        self._changed = asyncio.Event()

    def _snapshot_if_due(self) -> None:
        """Fold in what was just committed and snapshot when due (a listener: called after the core's events)."""
        assert self._snapshotter is not None  # listening only once started
        snapshot_id = self._snapshotter.poll(now_ms())
        if snapshot_id is not None:
            logger.info(
                "[Controller id=%d] wrote the metadata snapshot at offset %d (epoch %d); the log now starts there",
                self.config.node_id,
                snapshot_id.offset,
                snapshot_id.epoch,
            )

    def _activate(self) -> None:
        self.controller = Controller(
            QuorumMetadataLog(self.raft.client, self.raft.poke),
            ControllerConfig(
                session_timeout_ms=self.config.get_int("broker.session.timeout.ms"),
                unclean_leader_election_enable=self.config.get_bool("unclean.leader.election.enable"),
                remote_storage_system_enable=self.config.remote_storage_system_enable,
                leader_imbalance_check_interval_ms=self._leader_balance_interval_ms,
            ),
            now_ms(),
        )
        self._tasks = [asyncio.create_task(self._expire_sessions(self.controller), name="controller-sessions")]
        if self._leader_balance_interval_ms is not None:
            self._tasks.append(
                asyncio.create_task(
                    self._balance_leaders(self.controller, self._leader_balance_interval_ms),
                    name="controller-leader-balance",
                )
            )
        logger.info(
            "[Controller id=%d] active in epoch %d: metadata log at offset %d, cluster id %s",
            self.config.node_id,
            self.raft.client.epoch,
            self.controller.metadata_log.end_offset,
            self.controller.metadata.cluster_id,
        )

    def _deactivate(self) -> list[asyncio.Task[None]]:
        """Drop the controller and cancel its timers; returns the tasks, still winding down."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if self.controller is not None:
            self.controller = None
            logger.info(
                "[Controller id=%d] no longer active (epoch %d, leader %s)",
                self.config.node_id,
                self.raft.client.epoch,
                self.raft.client.leader_id,
            )
        return tasks

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return at the next change of leader, epoch or high watermark, or after `timeout_s`."""
        changed = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            pass

    async def wait_for_commit(self, controller: Controller) -> bool:
        """True once everything `controller` has written is committed; False if it stopped being the active
        controller first (the answer is then NOT_CONTROLLER: docs/quorum.md#active-controller)."""
        if self.controller is not controller:
            return False
        committed = await self.raft.wait_for_commit(controller.metadata_log.end_offset - 1, COMMIT_TIMEOUT_S)
        return committed and self.controller is controller

    # The controller's timers, each for one controller: a new one starts its own.

    async def _expire_sessions(self, controller: Controller) -> None:
        """Fence brokers when their sessions run out. Heartbeats only push deadlines later and a new session
        ends a whole timeout from now, so sleeping until the earliest deadline known now misses none."""
        timeout_ms = self.config.get_int("broker.session.timeout.ms")
        while True:
            deadline = controller.next_session_deadline_ms()
            delay_ms = timeout_ms if deadline is None else deadline - now_ms()
            await asyncio.sleep(max(delay_ms, 1) / 1000)
            try:
                fenced = controller.fence_stale_brokers(now_ms())
            except Exception:
                logger.exception("[Controller id=%d] fencing stale brokers failed", self.config.node_id)
                continue
            if fenced:
                logger.info(
                    "[Controller id=%d] fenced brokers %s: no heartbeat within the session", self.config.node_id, fenced
                )

    async def _balance_leaders(self, controller: Controller, interval_ms: int) -> None:
        """Run the controller's leader balancing passes when due. A pass only becomes due through a change to
        the metadata log, so with none due this waits for the next change (or an interval, to look again)."""
        while True:
            due = controller.next_leader_balance_ms()
            if due is None:
                await self.wait_for_change(interval_ms / 1000)
                continue
            await asyncio.sleep(max(due - now_ms(), 0) / 1000)
            try:
                moved = controller.balance_partition_leaders(now_ms())
            except Exception:
                logger.exception("[Controller id=%d] balancing partition leaders failed", self.config.node_id)
                continue
            if moved:
                logger.info(
                    "[Controller id=%d] moved %d partition leader(s) back to their preferred replicas",
                    self.config.node_id,
                    moved,
                )

    # The metadata log, for the broker on this node (in-process) and the other voters and brokers (Fetch).

    async def read_committed(self, offset: int, max_wait_ms: int) -> tuple[bytes | MetadataSnapshot, int]:
        """Whole committed batches from `offset`, waiting up to `max_wait_ms` for the high watermark to pass
        it, and the high watermark (0 while unknown). A follower's committed log is the leader's, so the broker
        on any voter reads its own node's (docs/quorum.md#observers). Below the log start the records are only in
        the latest snapshot, which is returned instead (docs/quorum.md#snapshots)."""
        client = self.raft.client
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def on_ready() -> None:
            if not ready.done():
                ready.set_result(None)

        client.wait_for_commit(offset, max_wait_ms, now_ms(), on_ready)
        # The core answers a wait that ends on time in a later poll, which this arranges.
        self.raft.poke()
        await ready
        high_watermark = client.high_watermark
        if high_watermark is None:
            return b"", 0
        if offset < client.log.start_offset:
            # Checked after the wait: a snapshot taken meanwhile may have moved the log start past `offset`.
            snapshot = read_metadata_snapshot(client.log)
            assert snapshot is not None  # a log starts past 0 only at a snapshot
            return snapshot, high_watermark
        return client.read_committed(offset, METADATA_READ_MAX_BYTES), high_watermark
