"""Kafka's BrokerLifecycleManager: register with the controller, heartbeat, and shut down in a controlled way.

A broker registers with a new incarnation id on every process start, which tells the controller that
whatever the previous process held is gone. It stays fenced (no leaderships, not eligible for any ISR)
until its metadata image has caught up with its own registration; heartbeats say how far it has read.
While fenced it heartbeats quickly so it is unfenced soon after it catches up.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from tierlog.metadata.records import Endpoint
from tierlog.server.controller_channel import (
    ControllerChannel,
    ControllerUnavailableError,
    HeartbeatRefusedError,
    RegistrationError,
)
from tierlog.server.metadata_loader import MetadataLoaderTask

logger = logging.getLogger(__name__)

FENCED_HEARTBEAT_INTERVAL_S = 0.1
RETRY_BACKOFF_S = 0.5
CONTROLLED_SHUTDOWN_TIMEOUT_S = 5.0
# Errors that mean the controller no longer knows this registration: register again.
_REREGISTER = ("STALE_BROKER_EPOCH", "BROKER_ID_NOT_REGISTERED")


class BrokerLifecycleManager:
    def __init__(
        self,
        broker_id: int,
        endpoints: list[Endpoint],
        rack: str | None,
        channel: ControllerChannel,
        loader: MetadataLoaderTask,
        heartbeat_interval_ms: int,
        cluster_id: str,
    ) -> None:
        self.broker_id = broker_id
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self.unfenced = asyncio.Event()
        self._endpoints = endpoints
        self._rack = rack
        self._channel = channel
        self._loader = loader
        self._interval_s = heartbeat_interval_ms / 1000
        self._cluster_id = cluster_id

    async def run(self) -> None:
        while True:
            if self.broker_epoch < 0:
                await self._register()
            try:
                result = await self._channel.heartbeat(
                    self.broker_id, self.broker_epoch, self._loader.image.offset, False, False
                )
            except ControllerUnavailableError as e:
                logger.debug("[Broker id=%d] heartbeat failed: %s", self.broker_id, e)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            except HeartbeatRefusedError as e:
                if e.error_name in _REREGISTER:
                    logger.warning("[Broker id=%d] %s: registering again", self.broker_id, e)
                    self.broker_epoch = -1
                else:
                    logger.warning("[Broker id=%d] %s; retrying", self.broker_id, e)
                    await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if result.is_fenced != self.fenced:
                self.fenced = result.is_fenced
                logger.info(
                    "[Broker id=%d] %s by the controller", self.broker_id, "fenced" if self.fenced else "unfenced"
                )
            if self.fenced:
                self.unfenced.clear()
            else:
                self.unfenced.set()
            await asyncio.sleep(FENCED_HEARTBEAT_INTERVAL_S if self.fenced else self._interval_s)

    async def _register(self) -> None:
        while True:
            try:
                self.broker_epoch = await self._channel.register_broker(
                    self.broker_id, self.incarnation_id, self._cluster_id, self._endpoints, self._rack
                )
            except ControllerUnavailableError as e:
                logger.info("[Broker id=%d] waiting for the controller: %s", self.broker_id, e)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            except RegistrationError as e:
                logger.error("[Broker id=%d] %s; retrying", self.broker_id, e)
                await asyncio.sleep(RETRY_BACKOFF_S * 4)
                continue
            logger.info("[Broker id=%d] registered with broker epoch %d", self.broker_id, self.broker_epoch)
            if self._loader.loader.allow_publishing_from(self.broker_epoch):
                self._loader.publish()
            return

    async def controlled_shutdown(self) -> None:
        """Ask the controller to move our leaderships away before we stop (bounded: a dead controller must
        not keep a broker from stopping)."""
        if self.broker_epoch < 0:
            return
        try:
            async with asyncio.timeout(CONTROLLED_SHUTDOWN_TIMEOUT_S):
                await self._channel.heartbeat(self.broker_id, self.broker_epoch, self._loader.image.offset, False, True)
        except Exception as e:
            logger.warning("[Broker id=%d] controlled shutdown request failed: %s", self.broker_id, e)
