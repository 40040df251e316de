"""The simulated world: a virtual clock with an event queue, nodes that crash, restart and pause, and a network
that delays, drops, duplicates and partitions messages.

Everything that happens is an event at a virtual millisecond; events at the same millisecond run in the order
they were scheduled, so a run depends on nothing but its seed. A node's events carry its incarnation: a
crashed node's timers and in-flight replies die with it, as a killed process's would. A paused node (SIGSTOP)
keeps its state; what reaches it meanwhile waits and runs, in order, when it resumes.
"""

from __future__ import annotations

import heapq
import itertools
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Action = Callable[[], None]
Respond = Callable[[Any], None]


class Simulation:
    def __init__(self, seed: int, start_ms: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        # Ids come from a stream of their own, so drawing one never shifts the fault schedule.
        self._ids = random.Random(f"{seed}/ids")
        self.now = start_ms
        self._queue: list[tuple[int, int, Action]] = []
        self._sequence = itertools.count()
        self.steps = 0

    def new_uuid(self) -> uuid.UUID:
        """A random (version 4) UUID that the seed decides: topic ids, cluster ids, directory names."""
        return uuid.UUID(int=self._ids.getrandbits(128), version=4)

    def at(self, time_ms: int, action: Action) -> None:
        heapq.heappush(self._queue, (max(time_ms, self.now), next(self._sequence), action))

    def after(self, delay_ms: int, action: Action) -> None:
        self.at(self.now + delay_ms, action)

    def run_until(self, end_ms: int, after_step: Callable[[], None] | None = None) -> None:
        """Run every event due up to `end_ms`, then leave the clock there."""
        while self._queue and self._queue[0][0] <= end_ms:
            time_ms, _, action = heapq.heappop(self._queue)
            self.now = time_ms
            action()
            self.steps += 1
            if after_step is not None:
                after_step()
        self.now = max(self.now, end_ms)


class Node:
    """A process of the simulated cluster. Subclasses start their timers in `on_start` and drop their
    volatile state in `on_crash`."""

    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name
        self.incarnation = 0
        self.up = False
        self.paused = False
        self._backlog: list[Action] = []

    def start(self) -> None:
        self.incarnation += 1
        self.up = True
        self.paused = False
        self.on_start()

    def crash(self) -> None:
        self.up = False
        self.paused = False
        self._backlog.clear()
        self.incarnation += 1
        self.on_crash()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        backlog, self._backlog = self._backlog, []
        for action in backlog:
            if not self.up or self.paused:
                break
            action()

    def on_start(self) -> None: ...

    def on_crash(self) -> None: ...

    def guarded(self, action: Action) -> Action:
        """`action` bound to this incarnation: it does nothing once the node has crashed since, and waits
        while the node is paused."""
        incarnation = self.incarnation

        def run() -> None:
            if not self.up or self.incarnation != incarnation:
                return
            if self.paused:
                self._backlog.append(run)
                return
            action()

        return run

    def after(self, delay_ms: int, action: Action) -> None:
        self.sim.after(delay_ms, self.guarded(action))

    def every(self, interval_ms: int, action: Action, *, first_ms: int | None = None) -> None:
        """Run `action` every `interval_ms` for as long as this incarnation lives."""

        def tick() -> None:
            action()
            self.after(interval_ms, tick)

        self.after(interval_ms if first_ms is None else first_ms, tick)


@dataclass(slots=True)
class NetworkConditions:
    """How the network treats each message: a uniform delay, a drop and a duplication probability."""

    min_delay_ms: int = 1
    max_delay_ms: int = 10
    drop: float = 0.0
    duplicate: float = 0.0


@dataclass(slots=True)
class Network:
    sim: Simulation
    conditions: NetworkConditions = field(default_factory=NetworkConditions)
    # Directed links that carry nothing, (from, to) node names, with how many faults cut each: overlapping
    # faults each restore only their own cut.
    cut: Counter[tuple[str, str]] = field(default_factory=Counter)
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0

    def cut_links(self, links: list[tuple[str, str]]) -> None:
        self.cut.update(links)

    def restore_links(self, links: list[tuple[str, str]]) -> None:
        self.cut.subtract(links)
        self.cut = +self.cut

    def heal(self) -> None:
        self.cut.clear()

    def send(self, source: Node, target: Node, deliver: Action, *, may_duplicate: bool = True) -> None:
        """Carry one message; it is lost if the link is cut when it is sent or when it arrives. Without
        `may_duplicate` it arrives at most once (a message whose second copy no retry of Kafka's could produce)."""
        self.sent += 1
        rng = self.sim.rng
        link = (source.name, target.name)
        if link in self.cut or rng.random() < self.conditions.drop:
            self.dropped += 1
            return
        copies = 1
        if rng.random() < self.conditions.duplicate and may_duplicate:
            copies = 2
            self.duplicated += 1
        for _ in range(copies):
            delay = rng.randint(self.conditions.min_delay_ms, self.conditions.max_delay_ms)

            def arrive() -> None:
                if link in self.cut:
                    self.dropped += 1
                    return
                deliver()

            self.sim.after(delay, target.guarded(arrive))

    def call(
        self,
        source: Node,
        target: Node,
        handle: Callable[[Respond], None],
        on_reply: Callable[[Any], None],
        on_failure: Action,
        timeout_ms: int,
        *,
        may_duplicate: bool = True,
    ) -> None:
        """A request from `source` handled on `target` (`handle` answers through its callback, now or later)
        and its reply; `on_failure` runs instead if no reply arrives within `timeout_ms`, as when a
        connection times out. Either callback runs at most once, and only in the caller's incarnation. Without
        `may_duplicate` the request is handled at most once."""
        finished = False
        incarnation = source.incarnation

        def finish(callback: Action) -> None:
            nonlocal finished
            if not finished and source.incarnation == incarnation:
                finished = True
                callback()

        def respond(reply: Any) -> None:
            self.send(target, source, lambda: finish(lambda: on_reply(reply)))

        # A request that reaches a restarted target finds its connection gone: `guarded` drops it.
        self.send(source, target, lambda: handle(respond), may_duplicate=may_duplicate)
        source.after(timeout_ms, lambda: finish(on_failure))
