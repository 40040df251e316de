"""What every index file of a segment shares (offset, time and transaction indexes): a file written by appends
through one descriptor, opened by the first write and closed by a flush."""

from __future__ import annotations

import os
from pathlib import Path


class IndexFile:
    path: Path
    _fd: int | None
    _file_size: int

    def _read_file(self, path: Path) -> bytes:
        """Take `path` as this index's file and return its bytes (none when it does not exist yet: an index
        file is created by its first entry)."""
        self.path = path
        self._fd = None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        self._file_size = len(data)
        return data

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def _append_bytes(self, data: bytes) -> None:
        os.write(self._open(), data)
        self._file_size += len(data)

    def _truncate_file(self, size: int) -> None:
        os.ftruncate(self._open(), size)
        self._file_size = size

    def flush(self) -> None:
        """fsync the file. The handle is closed afterwards: flushes come on roll or shutdown, after which
        a segment rarely takes another index write, so it is not worth holding a descriptor for."""
        if self._fd is not None:
            os.fsync(self._fd)
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def rename_to(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path
