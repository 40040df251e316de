"""The broker's one source of producer ids, shared by idempotent and transactional InitProducerId.

As Kafka's RPCProducerIdManager: ids come in blocks the controller hands out (AllocateProducerIds), so no id is
ever given twice across the cluster or across restarts; the next block is asked for once 90% of the current one
is used, so the transaction coordinator (which cannot wait: its core is synchronous) rarely finds none ready
(docs/transactions.md#producer-ids).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tierlog.server.clock import now_ms

logger = logging.getLogger(__name__)

# Kafka's RPCProducerIdManager: prefetch at 90% of the block, wait RETRY_BACKOFF_MS after a failed request.
PREFETCH_FRACTION = 0.9
RETRY_BACKOFF_MS = 50

AllocateBlock = Callable[[], Awaitable[range]]


class ProducerIdManager:
    def __init__(self, allocate: AllocateBlock) -> None:
        self._allocate = allocate
        self._current: range = range(0)
        self._next_index = 0
        self._prefetched: range | None = None
        self._fetching: asyncio.Task[None] | None = None
        self._backoff_until_ms = 0
        self._last_error: BaseException | None = None

    def next_id(self) -> int | None:
        """A fresh producer id, or None while no block is at hand (one is being asked for: retry later)."""
        if self._next_index >= len(self._current) and self._prefetched is not None:
            self._current, self._next_index, self._prefetched = self._prefetched, 0, None
        if self._next_index < len(self._current):
            producer_id = self._current[self._next_index]
            self._next_index += 1
            if self._next_index >= PREFETCH_FRACTION * len(self._current):
                self._maybe_fetch()
            return producer_id
        self._maybe_fetch()
        return None

    async def generate(self, timeout_s: float) -> int:
        """A fresh producer id, waiting up to `timeout_s` for a block when none is at hand; the controller's error
        (or TimeoutError) when the block cannot be had."""
        async with asyncio.timeout(timeout_s):
            while True:
                producer_id = self.next_id()
                if producer_id is not None:
                    return producer_id
                fetching = self._fetching
                if fetching is None or fetching.done():
                    # Backing off after a failed request: that failure is the answer.
                    raise self._last_error or RuntimeError("no producer id block")
                await asyncio.shield(fetching)
                if self._prefetched is None and self._last_error is not None:
                    raise self._last_error

    def _maybe_fetch(self) -> None:
        if self._prefetched is not None or (self._fetching is not None and not self._fetching.done()):
            return
        if now_ms() < self._backoff_until_ms:
            return
        self._fetching = asyncio.get_running_loop().create_task(self._fetch(), name="allocate-producer-ids")

    async def _fetch(self) -> None:
        try:
            block = await self._allocate()
        except Exception as e:
            logger.warning("cannot allocate a producer id block: %s", e)
            self._last_error = e
            self._backoff_until_ms = now_ms() + RETRY_BACKOFF_MS
        else:
            self._last_error = None
            self._prefetched = block

    def stop(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()
