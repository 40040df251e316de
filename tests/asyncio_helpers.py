"""Running a test's asyncio scenario under a deadline, so a hang fails that test instead of reaching pytest's
global timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TEST_DEADLINE_S = 20.0


def run_bounded(scenario: Callable[[], Awaitable[T]], deadline_s: float = TEST_DEADLINE_S) -> T:
    """`asyncio.run` of `scenario()`, failing with TimeoutError once `deadline_s` has passed."""

    async def bounded() -> T:
        async with asyncio.timeout(deadline_s):
            return await scenario()

    return asyncio.run(bounded())
