"""The wall clock, read only by the shell: the core receives the time as `now_ms` arguments."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from tierlog.common import Idle

_Request = TypeVar("_Request")


def now_ms() -> int:
    return int(time.time() * 1000)


async def carry_requests(
    poll: Callable[[int], _Request | Idle], send: Callable[[_Request], Awaitable[None]]
) -> NoReturn:
    """Carry the requests of a state machine of the core, one at a time: ask it (`poll`) for the next one at the
    wall clock's time, wait while it is idle, and hand each request to `send`, which reports the outcome to it."""
    while True:
        action = poll(now_ms())
        if isinstance(action, Idle):
            await asyncio.sleep(max(0, action.until_ms - now_ms()) / 1000)
        else:
            await send(action)
