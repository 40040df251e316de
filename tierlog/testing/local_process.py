"""What the local servers of tierlog.testing (a broker, the S3 server) share: one child process at a time, its
output appended to a log file, and that log's tail, which is where the reason of a failure is."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType


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
