"""The controller's shell on a `process.roles=broker,controller` node: the metadata log and the controller's timers.

The rules live in `tierlog.controller.controller.Controller`, and brokers' metadata fetches wait on the
`WakingMetadataLog` (both in controller/); this module only runs them: it arms the timers of metadata fetches
parked there, fences brokers whose session ran out and balances leaders when the controller says a pass is due
(auto.leader.rebalance.enable). The requests brokers and clients send the controller are
answered by `ControllerApis` (server/controller_apis.py).
"""

from __future__ import annotations

import asyncio
import logging

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import DiskMetadataLog, WakingMetadataLog
from tierlog.metadata.records import MetadataRecord
from tierlog.server.clock import now_ms
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)


class ControllerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._session_task: asyncio.Task[None] | None = None
        self._balance_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        balance_interval_ms = (
            self.config.get_int("leader.imbalance.check.interval.seconds") * 1000
            if self.config.get_bool("auto.leader.rebalance.enable")
            else None
        )
        self.metadata_log = WakingMetadataLog(DiskMetadataLog(self.config.metadata_log_dir))
        self.controller = Controller(
            self.metadata_log,
            ControllerConfig(
                session_timeout_ms=self.config.get_int("broker.session.timeout.ms"),
                unclean_leader_election_enable=self.config.get_bool("unclean.leader.election.enable"),
                remote_storage_system_enable=self.config.remote_storage_system_enable,
                leader_imbalance_check_interval_ms=balance_interval_ms,
            ),
            now_ms(),
        )
        self._session_task = asyncio.create_task(self._expire_sessions(), name="controller-sessions")
        if balance_interval_ms is not None:
            self._balance_task = asyncio.create_task(
                self._balance_leaders(balance_interval_ms), name="controller-leader-balance"
            )
        logger.info(
            "[Controller id=%d] started: metadata log at offset %d, cluster id %s",
            self.config.node_id,
            self.metadata_log.end_offset,
            self.controller.metadata.cluster_id,
        )

    async def stop(self) -> None:
        if self._session_task is None:
            return  # never started (the broker failed before)
        tasks = [task for task in (self._session_task, self._balance_task) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Parked metadata fetches are answered now rather than when their wait would end.
        self.metadata_log.expire(2**63 - 1)
        self.metadata_log.close()

    async def _expire_sessions(self) -> None:
        """Fence brokers when their sessions run out. Heartbeats only push deadlines later and a new session
        ends a whole timeout from now, so sleeping until the earliest deadline known now misses none."""
        timeout_ms = self.config.get_int("broker.session.timeout.ms")
        while True:
            deadline = self.controller.next_session_deadline_ms()
            delay_ms = timeout_ms if deadline is None else deadline - now_ms()
            await asyncio.sleep(max(delay_ms, 1) / 1000)
            try:
                fenced = self.controller.fence_stale_brokers(now_ms())
            except Exception:
                logger.exception("[Controller id=%d] fencing stale brokers failed", self.config.node_id)
                continue
            if fenced:
                logger.info(
                    "[Controller id=%d] fenced brokers %s: no heartbeat within the session", self.config.node_id, fenced
                )

    async def _balance_leaders(self, interval_ms: int) -> None:
        """Run the controller's leader balancing passes when due. A pass only becomes due through a change to
        the metadata log, so with none due this waits for the next append (or an interval, to look again)."""
        while True:
            due = self.controller.next_leader_balance_ms()
            if due is None:
                await self.wait_for_records(self.metadata_log.end_offset, interval_ms)
                continue
            await asyncio.sleep(max(due - now_ms(), 0) / 1000)
            try:
                moved = self.controller.balance_partition_leaders(now_ms())
            except Exception:
                logger.exception("[Controller id=%d] balancing partition leaders failed", self.config.node_id)
                continue
            if moved:
                logger.info(
                    "[Controller id=%d] moved %d partition leader(s) back to their preferred replicas",
                    self.config.node_id,
                    moved,
                )

    # The metadata log, for brokers on this node (in-process) and elsewhere (Fetch).

    async def wait_for_records(self, offset: int, max_wait_ms: int) -> None:
        """Return when the log holds `offset`, or after `max_wait_ms`."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def on_ready() -> None:
            if not ready.done():
                ready.set_result(None)

        deadline = self.metadata_log.wait_for_records(offset, max_wait_ms, now_ms(), on_ready)
        if deadline is not None:
            # The event loop's clock and the wall clock may disagree by a millisecond: expire at the deadline.
            loop.call_later(
                max(0, deadline - now_ms()) / 1000, lambda: self.metadata_log.expire(max(now_ms(), deadline))
            )
        await ready

    async def fetch_records(self, offset: int, max_wait_ms: int) -> tuple[list[tuple[int, MetadataRecord]], int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.records_from(offset), self.metadata_log.end_offset

    async def read_metadata_log(self, offset: int, max_bytes: int, max_wait_ms: int) -> tuple[FileSlice | None, int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.read(offset, max_bytes), self.metadata_log.end_offset
