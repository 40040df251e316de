"""The controller's shell on a `process.roles=broker,controller` node: the metadata log and the session timer.

The rules live in `tierlog.controller.controller.Controller`; this module only runs it: it wakes metadata
fetches parked here when the log grows and fences brokers whose session ran out. The requests brokers and
clients send the controller are answered by `ControllerApis` (server/controller_apis.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import DiskMetadataLog
from tierlog.metadata.records import MetadataRecord
from tierlog.server.clock import now_ms
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)


class _WakingMetadataLog(DiskMetadataLog):
    """The metadata log that wakes the fetches parked on it whenever it grows: every controller operation
    appends through here, so no caller has to remember to announce it."""

    def __init__(self, log_dir: Path, on_append: Callable[[], None]) -> None:
        super().__init__(log_dir)
        self._on_append = on_append

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        first_offset = super().append(records, now_ms)
        self._on_append()
        return first_offset


class ControllerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._grown = asyncio.Event()
        self._session_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.metadata_log = _WakingMetadataLog(self.config.metadata_log_dir, self._wake_fetches)
        self.controller = Controller(
            self.metadata_log,
            ControllerConfig(
                session_timeout_ms=self.config.get_int("broker.session.timeout.ms"),
                unclean_leader_election_enable=self.config.get_bool("unclean.leader.election.enable"),
                remote_storage_system_enable=self.config.remote_storage_system_enable,
            ),
            now_ms(),
        )
        self._session_task = asyncio.create_task(self._expire_sessions(), name="controller-sessions")
        logger.info(
            "[Controller id=%d] started: metadata log at offset %d, cluster id %s",
            self.config.node_id,
            self.metadata_log.end_offset,
            self.controller.metadata.cluster_id,
        )

    async def stop(self) -> None:
        if self._session_task is None:
            return  # never started (the broker failed before)
        self._session_task.cancel()
        await asyncio.gather(self._session_task, return_exceptions=True)
        self._wake_fetches()
        self.metadata_log.close()

    def _wake_fetches(self) -> None:
        self._grown.set()
        self._grown = asyncio.Event()

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

    # The metadata log, for brokers on this node (in-process) and elsewhere (Fetch).

    async def wait_for_records(self, offset: int, max_wait_ms: int) -> None:
        """Return when the log holds `offset`, or after `max_wait_ms`."""
        if self.metadata_log.end_offset > offset or max_wait_ms <= 0:
            return
        grown = self._grown
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_ms / 1000):
                await grown.wait()

    async def fetch_records(self, offset: int, max_wait_ms: int) -> tuple[list[tuple[int, MetadataRecord]], int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.records_from(offset), self.metadata_log.end_offset

    async def read_metadata_log(self, offset: int, max_bytes: int, max_wait_ms: int) -> tuple[FileSlice | None, int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.read(offset, max_bytes), self.metadata_log.end_offset
