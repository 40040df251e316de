"""ForwardingManager (Kafka's class of that name): a request only the controller decides goes to the controller.

On the controller's own node it is decided in this process by `ControllerApis`; elsewhere it is sent over the
controller channel. Either way it is answered once this broker's metadata shows the controller's change, so
a client that creates a topic and then produces to it finds it on the broker it asked.
"""

from __future__ import annotations

import logging
from typing import Any

from tierlog.protocol.codec import Request
from tierlog.server.controller_apis import ControllerApis
from tierlog.server.controller_channel import ControllerChannel, ControllerUnavailableError
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
        """The controller's answer to `request`, once this broker's metadata shows its result."""
        if self._controller_apis is not None:
            response = await self._controller_apis.handle(request)
        else:
            try:
                response = await self._channel.forward(request.body)
            except ControllerUnavailableError as e:
                logger.warning("forwarding %s to the controller failed: %s", type(request.body).__name__, e)
                raise
        await self.sync_metadata()
        return response

    async def sync_metadata(self) -> None:
        """After the controller changed something: wait (bounded) until this broker's metadata shows it."""
        try:
            _, end_offset = await self._channel.fetch_metadata(self._node_id, self._loader.image.offset + 1, 0)
        except ControllerUnavailableError:
            return
        await self._loader.wait_until_offset(end_offset - 1, METADATA_PROPAGATION_TIMEOUT_S)
