"""The broker's lifecycle as an asyncio task: carries the registration and heartbeats of the deterministic
`BrokerLifecycleManager` (metadata/lifecycle.py) to the controller and the answers back, and sends the controlled
shutdown request when the broker stops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from tierlog.controller.controller import HeartbeatResult
from tierlog.metadata.lifecycle import BrokerHeartbeatRequest, BrokerLifecycleManager, BrokerRegistrationRequest
from tierlog.metadata.records import Endpoint
from tierlog.server.clock import carry_requests, now_ms
from tierlog.server.controller_channel import (
    ControllerChannel,
    ControllerUnavailableError,
    HeartbeatRefusedError,
    RegistrationError,
)
from tierlog.server.metadata_loader import MetadataLoaderTask

logger = logging.getLogger(__name__)

CONTROLLED_SHUTDOWN_TIMEOUT_S = 5.0


class BrokerLifecycleTask:
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
        self.manager = BrokerLifecycleManager(
            broker_id,
            uuid.uuid4(),
            cluster_id,
            endpoints,
            rack,
            loader.loader,
            heartbeat_interval_ms=heartbeat_interval_ms,
        )
        self.unfenced = asyncio.Event()
        self._channel = channel
        self._loader = loader

    @property
    def broker_epoch(self) -> int:
        return self.manager.broker_epoch

    async def run(self) -> None:
        await carry_requests(self.manager.poll, self._send)

    async def _send(self, request: BrokerRegistrationRequest | BrokerHeartbeatRequest) -> None:
        if isinstance(request, BrokerRegistrationRequest):
            await self._register(request)
        else:
            await self._heartbeat(request)
        # Only an answer changes whether we are fenced.
        if self.manager.fenced:
            self.unfenced.clear()
        else:
            self.unfenced.set()

    async def _register(self, request: BrokerRegistrationRequest) -> None:
        try:
            broker_epoch = await self._channel.register_broker(
                request.broker_id, request.incarnation_id, request.cluster_id, list(request.endpoints), request.rack
            )
        except ControllerUnavailableError as e:
            self.manager.on_request_failed(str(e), now_ms())
        except RegistrationError as e:
            self.manager.on_registration_refused(e.error_name, now_ms())
        else:
            if self.manager.on_registration_response(broker_epoch, now_ms()):
                self._loader.publish()

    async def _heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        try:
            result = await self._send_heartbeat(request)
        except ControllerUnavailableError as e:
            self.manager.on_request_failed(str(e), now_ms())
        except HeartbeatRefusedError as e:
            self.manager.on_heartbeat_refused(e.error_name, now_ms())
        else:
            self.manager.on_heartbeat_response(result.is_fenced, now_ms())

    async def _send_heartbeat(self, request: BrokerHeartbeatRequest) -> HeartbeatResult:
        return await self._channel.heartbeat(
            request.broker_id,
            request.broker_epoch,
            request.current_metadata_offset,
            request.want_fence,
            request.want_shut_down,
        )

    async def controlled_shutdown(self) -> None:
        """Ask the controller to move our leaderships away before we stop (bounded: a dead controller must
        not keep a broker from stopping)."""
        request = self.manager.controlled_shutdown_request()
        if request is None:
            return
        try:
            async with asyncio.timeout(CONTROLLED_SHUTDOWN_TIMEOUT_S):
                await self._send_heartbeat(request)
        except Exception as e:
            logger.warning("[Broker id=%d] controlled shutdown request failed: %s", request.broker_id, e)
