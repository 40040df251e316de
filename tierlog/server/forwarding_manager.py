"""ForwardingManager (Kafka's class of that name): a request only the controller decides goes to the controller.

On a controller's own node it is decided in this process by `ControllerApis` while that controller is the
quorum's active one; otherwise it is sent over the controller channel, to the active controller (as is a
client's request when leadership moved while it was being decided here). Either way it is answered once this
broker's metadata shows the controller's change, so a client that creates a topic and then produces to it finds
it on the broker it asked.
"""

from __future__ import annotations

import logging
from typing import Any

from tierlog.metadata.loader import MetadataFetchRequest
from tierlog.protocol.codec import Request
from tierlog.server.controller_apis import ControllerApis
from tierlog.server.controller_channel import NOT_CONTROLLER, ControllerChannel, ControllerUnavailableError, error_codes
from tierlog.server.metadata_loader import MetadataLoaderTask

logger = logging.getLogger(__name__)

# How long a request waits for this broker's metadata to show the change the controller made.
METADATA_PROPAGATION_TIMEOUT_S = 5.0


class ForwardingManager:
    def __init__(
        self,
        node_id: int,
        channel: ControllerChannel,
        loader: MetadataLoaderTask,
        controller_apis: ControllerApis | None,
    ) -> None:
        self._node_id = node_id
        self._channel = channel
        self._loader = loader
        # Set on the controller's own node.
        self._controller_apis = controller_apis

    async def forward(self, request: Request) -> Any:
        """The active controller's answer to `request`, once this broker's metadata shows its result."""
        apis = self._controller_apis
        response = None
        if apis is not None and (apis.is_active() or apis.reached_as_controller()):
            response = await apis.handle(request)
            if NOT_CONTROLLER in error_codes(response) and not apis.reached_as_controller():
                # Leadership moved while a client's request was decided here: the active controller decides it.
                response = None
        if response is None:
            try:
                response = await self._channel.forward(request.body)
            except ControllerUnavailableError as e:
                logger.warning("forwarding %s to the controller failed: %s", type(request.body).__name__, e)
                raise
        await self.sync_metadata()
        return response

    async def sync_metadata(self) -> None:
        """After the controller changed something: wait (bounded) until this broker's metadata shows it."""
        loader = self._loader.loader
        position = MetadataFetchRequest(loader.fetch_offset, loader.last_fetched_epoch, 0)
        try:
            high_watermark = await self._channel.high_watermark(self._node_id, position)
        except ControllerUnavailableError:
            return
        await self._loader.wait_until_fetched(high_watermark, METADATA_PROPAGATION_TIMEOUT_S)
