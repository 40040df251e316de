"""The broker's metadata loader as an asyncio task: carries the fetches of the deterministic `MetadataLoader`
(metadata/loader.py) to the controller and its answers back (committed batches, or the controller's snapshot when
the fetch offset is gone from its log), and publishes the image when the loader says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tierlog.controller.metadata_log import MetadataSnapshot
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.loader import MetadataFetchRequest, MetadataLoader
from tierlog.server.clock import carry_requests, now_ms
from tierlog.server.controller_channel import ControllerChannel, ControllerUnavailableError

logger = logging.getLogger(__name__)


class MetadataLoaderTask:
    def __init__(self, broker_id: int, channel: ControllerChannel, publish: Callable[[ClusterMetadata], None]) -> None:
        self.broker_id = broker_id
        self.loader = MetadataLoader()
        self._channel = channel
        self._publish = publish
        self._changed = asyncio.Condition()

    @property
    def image(self) -> ClusterMetadata:
        return self.loader.image

    async def run(self) -> None:
        await carry_requests(self.loader.poll, self._fetch)

    async def _fetch(self, request: MetadataFetchRequest) -> None:
        try:
            answer, high_watermark = await self._channel.fetch_metadata(self.broker_id, request)
        except ControllerUnavailableError as e:
            logger.debug("[Broker id=%d] metadata fetch failed: %s", self.broker_id, e)
            self.loader.on_fetch_failed(now_ms())
            return
        if isinstance(answer, MetadataSnapshot):
            loaded = self.loader.on_snapshot(answer.records, answer.end_offset, high_watermark)
            logger.info("[Broker id=%d] loaded the metadata snapshot at offset %d", self.broker_id, answer.end_offset)
        else:
            loaded = self.loader.on_records(answer, high_watermark)
        if loaded:
            self.publish()
        async with self._changed:
            self._changed.notify_all()

    def publish(self) -> None:
        """Hand the image to the broker (its replicas, fetchers, coordinators)."""
        try:
            self._publish(self.loader.image)
        except Exception:
            logger.exception(
                "[Broker id=%d] applying metadata at offset %d failed", self.broker_id, self.loader.image.offset
            )

    async def wait_until_fetched(self, offset: int, timeout_s: float) -> bool:
        """Wait until the loader has fetched (and applied) the log up to `offset`, exclusive; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: self.loader.fetch_offset >= offset)
        except TimeoutError:
            return False
        return True
