"""The broker's view of the cluster: it follows the controller's metadata log and folds every record into
its own `ClusterMetadata` image (the same `apply` the controller uses).

The image is published to the replica manager only once the broker has caught up with the log at least to
its own registration: a restarted broker must never act on the leaderships it held before it died, which
the controller has moved away by then (the registration of a new incarnation fences the old one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierlog.metadata.image import ClusterMetadata
from tierlog.server.controller_channel import ControllerChannel, ControllerUnavailableError

logger = logging.getLogger(__name__)

METADATA_FETCH_WAIT_MS = 500
RETRY_BACKOFF_S = 0.2


class MetadataLoader:
    def __init__(self, broker_id: int, channel: ControllerChannel, publish: Callable[[ClusterMetadata], None]) -> None:
        self.broker_id = broker_id
        self.image = ClusterMetadata(cluster_id="")
        self._channel = channel
        self._publish = publish
        # Offset the image must reach before the first publish (the broker's registration record).
        self._publish_from_offset: int | None = None
        self._high_watermark = 0
        self._changed = asyncio.Condition()

    async def run(self) -> None:
        while True:
            try:
                records, self._high_watermark = await self._channel.fetch_metadata(
                    self.broker_id, self.image.offset + 1, METADATA_FETCH_WAIT_MS
                )
            except ControllerUnavailableError as e:
                logger.debug("[Broker id=%d] metadata fetch failed: %s", self.broker_id, e)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            for offset, record in records:
                self.image.apply(offset, record)
            if records:
                self._maybe_publish()
            async with self._changed:
                self._changed.notify_all()

    def _maybe_publish(self) -> None:
        caught_up = self.image.offset + 1 >= self._high_watermark
        if not caught_up or self._publish_from_offset is None or self.image.offset < self._publish_from_offset:
            return
        try:
            self._publish(self.image)
        except Exception:
            logger.exception("[Broker id=%d] applying metadata at offset %d failed", self.broker_id, self.image.offset)

    def allow_publishing_from(self, offset: int) -> None:
        self._publish_from_offset = offset
        self._maybe_publish()

    async def wait_until_offset(self, offset: int, timeout_s: float) -> bool:
        """Wait until the image holds `offset`; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: self.image.offset >= offset)
        except TimeoutError:
            return False
        return True
