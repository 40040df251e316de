"""What a node (a broker, a dedicated controller) checks before it starts, and the one-line error it stops with."""

from __future__ import annotations

import os
from pathlib import Path


class StartupError(Exception):
    """The node cannot start (a port in use, a log directory it cannot use); one line for a person."""


def reason_of(error: OSError) -> str:
    """An OSError as a person reads it ("Address already in use"), without asyncio's restatement of the address."""
    return os.strerror(error.errno) if error.errno else str(error)


def prepare_log_dir(log_dir: Path) -> None:
    """Create a missing log directory (as Kafka's LogManager does) and check that it can be written, before
    anything is written into any of them."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StartupError(f"cannot use log directory {log_dir}: {reason_of(e)}") from None
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise StartupError(f"cannot use log directory {log_dir}: it is not writable")
