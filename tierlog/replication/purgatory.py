"""Kafka's DelayedOperationPurgatory, without timers or threads.

A delayed operation (a fetch waiting for bytes, a produce waiting for the HW) watches one or more keys
(partitions). Whoever changes a key calls `check_and_complete(key)`; the shell calls `expire(now_ms)` when
the earliest deadline (`next_deadline_ms()`) passes. Each operation completes exactly once, either because
`try_complete` found it satisfiable or because it expired.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar


class DelayedOperation(ABC):
    def __init__(self, deadline_ms: int) -> None:
        self.deadline_ms = deadline_ms
        self.completed = False

    @abstractmethod
    def try_complete(self) -> bool:
        """Complete (via force_complete) if the operation can be satisfied now; return whether it did."""

    @abstractmethod
    def on_complete(self) -> None:
        """Build and hand over the response; called exactly once."""

    def force_complete(self) -> bool:
        if self.completed:
            return False
        self.completed = True
        self.on_complete()
        return True


Op = TypeVar("Op", bound=DelayedOperation)


class DelayedOperationPurgatory(Generic[Op]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._watchers: dict[Hashable, list[Op]] = {}
        self._deadlines: list[tuple[int, int, Op]] = []
        self._sequence = itertools.count()

    def try_complete_else_watch(self, operation: Op, keys: Iterable[Hashable]) -> bool:
        """Complete at once if possible, else watch every key until completion or the deadline."""
        if operation.try_complete():
            return True
        self.watch(operation, keys)
        return False

    def watch(self, operation: Op, keys: Iterable[Hashable]) -> None:
        """Watch every key until completion or the deadline, without trying first: for a caller that has
        just found the operation unsatisfiable and would only repeat that work."""
        for key in keys:
            self._watchers.setdefault(key, []).append(operation)
        heapq.heappush(self._deadlines, (operation.deadline_ms, next(self._sequence), operation))

    def check_and_complete(self, key: Hashable) -> int:
        """Something changed for `key`: try every operation watching it. Returns how many completed."""
        watching = self._watchers.pop(key, None)
        if not watching:
            return 0
        completed = 0
        still_waiting = []
        for operation in watching:
            if operation.completed:
                continue
            if operation.try_complete():
                completed += 1
            else:
                still_waiting.append(operation)
        if still_waiting:
            self._watchers.setdefault(key, []).extend(still_waiting)
        return completed

    def expire(self, now_ms: int) -> int:
        """Complete every operation whose deadline is at or before now. Returns how many expired."""
        expired = 0
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, _, operation = heapq.heappop(self._deadlines)
            if not operation.completed:
                operation.force_complete()
                expired += 1
        if expired:
            self._purge_completed()
        return expired

    def next_deadline_ms(self) -> int | None:
        while self._deadlines and self._deadlines[0][2].completed:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def watched(self) -> int:
        """Operations still waiting (the purgatory size metric)."""
        return sum(1 for *_, op in self._deadlines if not op.completed)

    def _purge_completed(self) -> None:
        for key in list(self._watchers):
            remaining = [op for op in self._watchers[key] if not op.completed]
            if remaining:
                self._watchers[key] = remaining
            else:
                del self._watchers[key]
