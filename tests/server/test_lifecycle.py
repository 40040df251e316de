"""The broker's lifecycle task against a scripted controller: registration, unfencing and re-registration over
the controller channel (the rules themselves: tests/metadata/test_broker_lifecycle_manager.py)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tierlog.controller.controller import HeartbeatResult
from tierlog.metadata.records import Endpoint
from tierlog.server.controller_channel import HeartbeatRefusedError
from tierlog.server.lifecycle import BrokerLifecycleTask
from tierlog.server.metadata_loader import MetadataLoaderTask


class ScriptedController:
    """Answers heartbeats from a script; counts registrations, handing out a new epoch each time."""

    def __init__(self, heartbeats: list[HeartbeatResult | Exception]) -> None:
        self.heartbeats = heartbeats
        self.registrations: list[uuid.UUID] = []

    async def register_broker(self, broker_id: int, incarnation_id: uuid.UUID, *_: Any) -> int:
        self.registrations.append(incarnation_id)
        return 10 * len(self.registrations)

    async def heartbeat(self, broker_id: int, broker_epoch: int, *_: Any) -> HeartbeatResult:
        answer = self.heartbeats.pop(0) if self.heartbeats else HeartbeatResult(True, False, False)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def fetch_metadata(self, *_: Any) -> tuple[list[Any], int]:
        await asyncio.sleep(3600)
        return [], 0


def run_until_unfenced(controller: ScriptedController) -> BrokerLifecycleTask:
    async def main() -> BrokerLifecycleTask:
        loader = MetadataLoaderTask(1, controller, lambda image: None)
        lifecycle = BrokerLifecycleTask(
            1,
            [Endpoint("PLAINTEXT", "127.0.0.1", 9092)],
            None,
            controller,
            loader,
            50,
            "",
        )
        task = asyncio.create_task(lifecycle.run())
        try:
            async with asyncio.timeout(5):
                await lifecycle.unfenced.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return lifecycle

    return asyncio.run(main())


def test_a_broker_is_unfenced_once_the_controller_says_so() -> None:
    controller = ScriptedController([HeartbeatResult(False, True, False), HeartbeatResult(True, False, False)])
    lifecycle = run_until_unfenced(controller)
    assert (len(controller.registrations), lifecycle.broker_epoch, lifecycle.manager.fenced) == (1, 10, False)


def test_a_stale_broker_epoch_makes_the_broker_register_again_with_the_same_incarnation() -> None:
    controller = ScriptedController([HeartbeatRefusedError("STALE_BROKER_EPOCH")])
    lifecycle = run_until_unfenced(controller)
    assert len(controller.registrations) == 2
    assert controller.registrations[0] == controller.registrations[1] == lifecycle.manager.incarnation_id
    assert lifecycle.broker_epoch == 20


def test_other_heartbeat_refusals_are_retried_without_registering_again() -> None:
    controller = ScriptedController([HeartbeatRefusedError("UNKNOWN_SERVER_ERROR")])
    run_until_unfenced(controller)
    assert len(controller.registrations) == 1
