"""The shared ProducerIdManager: blocks from the controller, prefetched at 90%, never an id twice."""

from __future__ import annotations

import asyncio

import pytest

from tierlog.server.controller_channel import ControllerUnavailableError
from tierlog.server.producer_id_manager import ProducerIdManager


class Controller:
    def __init__(self, block_size: int = 10) -> None:
        self.block_size = block_size
        self.next_start = 0
        self.requests = 0
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def allocate(self) -> range:
        self.requests += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        block = range(self.next_start, self.next_start + self.block_size)
        self.next_start += self.block_size
        return block


def test_ids_are_unique_across_blocks_and_the_next_block_is_asked_for_at_90_percent() -> None:
    async def main() -> None:
        controller = Controller(block_size=10)
        manager = ProducerIdManager(controller.allocate)
        assert manager.next_id() is None  # no block yet: the core answers COORDINATOR_LOAD_IN_PROGRESS
        await asyncio.sleep(0)
        ids = [manager.next_id() for _ in range(9)]
        assert ids == list(range(9))
        await asyncio.sleep(0)  # the 9th id (90%) started the prefetch
        assert controller.requests == 2
        ids += [manager.next_id() for _ in range(11)]
        assert ids == list(range(20))
        assert len(set(ids)) == 20

    asyncio.run(main())


def test_generate_waits_for_a_block_and_reports_the_controllers_refusal() -> None:
    async def main() -> None:
        controller = Controller()
        manager = ProducerIdManager(controller.allocate)
        assert await manager.generate(1.0) == 0
        refusing = Controller()
        refusing.fail = ControllerUnavailableError("producer ids refused: UNKNOWN_SERVER_ERROR")
        failing = ProducerIdManager(refusing.allocate)
        with pytest.raises(ControllerUnavailableError):
            await failing.generate(1.0)
        stalled = Controller()
        stalled.gate = asyncio.Event()
        waiting = ProducerIdManager(stalled.allocate)
        with pytest.raises(TimeoutError):
            await waiting.generate(0.05)
        stalled.gate.set()
        assert await waiting.generate(1.0) == 0
        waiting.stop()

    asyncio.run(main())
