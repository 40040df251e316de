"""The wall clock, read only by the shell: the core receives the time as `now_ms` arguments."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
