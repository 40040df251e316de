"""What the local servers of tierlog.testing (a broker, the S3 server) share: one child process at a time, its
output appended to a log file, and that log's tail, which is where the reason of a failure is."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

# From <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1


def with_log_tail(reason: str, log_file: Path, tail: str) -> str:
    """`reason`, followed by the last lines of the process's log (or that the log is empty)."""
    return f"{reason}; last lines of {log_file}:\n{tail}" if tail else f"{reason}; {log_file} is empty"


class LocalProcess(ABC):
    """A child process whose stdout and stderr are appended to `log_file`, so the log keeps every incarnation
    across restarts (which is what a crash test reads). Leaving a `with` block stops it."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @abstractmethod
    def stop(self, timeout_s: float = 15.0) -> int | None: ...

    def _spawn(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        start_new_session: bool,
        cwd: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        header: str = "",
    ) -> None:
        """Start `command` with no stdin, its output appended to the log after `header`."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        # The child gets its own copy of the descriptor, so ours is closed at once.
        with self.log_file.open("ab") as log_handle:
            if header:
                log_handle.write(header.encode())
                log_handle.flush()
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_handle,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=start_new_session,
                preexec_fn=preexec_fn,
            )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when we die, however we die (SIGKILL, SIGTERM's default
    action, os._exit), which no exit hook survives.

    The kernel ties this to the *thread* that forks, so it is only set up from the main thread, whose end
    is the process's end; a server started from another thread relies on stop() and the exit hook. The
    function runs between fork and exec, so it only calls prctl through a pointer resolved here."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return set_parent_death_signal
