"""A quorum of real Raft cores on real logs in a test's tmp_path, wired by a tiny deterministic network.

Each message takes one virtual millisecond; links can be cut (both ways or one way), nodes stopped (kill -9:
their in-flight requests fail, their files stay) and restarted from their files, or their disks wiped. Time
only moves through `run_for`, which polls every core whenever it is due.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlog.raft.messages import (
    RaftRequest,
)
from tierlog.raft.quorum_state import QUORUM_STATE_FILE, FileQuorumStateStore
from tierlog.raft.raft_client import RaftClient, RaftConfig
from tierlog.raft.raft_log import METADATA_PARTITION, RaftLog

START_MS = 1_000_000
CONFIG = RaftConfig()


@dataclass(order=True)
class _Event:
    time_ms: int
    sequence: int
    action: Callable[[], None] = field(compare=False)


class Quorum:
    def __init__(self, root: Path, voters: list[int], seed: int = 0, config: RaftConfig = CONFIG) -> None:
        self.root = root
        self.voters = voters
        self.config = config
        self.now = START_MS
        self._rng = random.Random(seed)
        self._events: list[_Event] = []
        self._sequence = 0
        self.cut: set[tuple[int, int]] = set()
        self.nodes: dict[int, RaftClient | None] = {}
        # Requests delivered to each node and not yet answered: killing it fails them, as a closed connection.
        self._unanswered: dict[int, dict[int, Callable[[], None]]] = {}
        # Every (epoch, leader) ever seen: at most one leader per epoch.
        self.leaders: dict[int, int] = {}
        for voter in voters:
            self.start(voter)

    # Nodes

    def _dir(self, node: int) -> Path:
        return self.root / f"node-{node}"

    def start(self, node: int) -> RaftClient:
        directory = self._dir(node)
        log = RaftLog(directory, self.now)
        store = FileQuorumStateStore(directory / str(METADATA_PARTITION) / QUORUM_STATE_FILE, frozenset(self.voters))
        client = RaftClient(node, self.voters, log, store, self.config, self.now, random.Random(f"{node}"))
        self.nodes[node] = client
        self._note_leaders()
        return client

    def kill(self, node: int) -> None:
        for fail in self._unanswered.pop(node, {}).values():
            self._at(self.now + 1, fail)
        client = self.nodes[node]
        if client is not None:
            client.log.close()
        self.nodes[node] = None

    def wipe(self, node: int) -> None:
        """The node lost its disk: the log and the quorum-state file are gone."""
        self.kill(node)
        shutil.rmtree(self._dir(node))

    def client(self, node: int) -> RaftClient:
        client = self.nodes[node]
        assert client is not None, f"node {node} is down"
        return client

    # The network

    def _at(self, time_ms: int, action: Callable[[], None]) -> None:
        self._sequence += 1
        self._events.append(_Event(time_ms, self._sequence, action))

    def _linked(self, source: int, target: int) -> bool:
        return (source, target) not in self.cut

    def isolate(self, node: int) -> None:
        for other in self.voters:
            if other != node:
                self.cut |= {(node, other), (other, node)}

    def heal(self) -> None:
        self.cut.clear()

    def _send(self, source: int, destination: int, request: RaftRequest) -> None:
        sender = self.nodes[source]
        incarnation = sender

        def fail() -> None:
            if self.nodes[source] is incarnation and incarnation is not None:
                incarnation.on_response(destination, request, None, self.now)

        def deliver() -> None:
            target = self.nodes[destination]
            if target is None or not self._linked(source, destination):
                self._at(self.now + self.config.request_timeout_ms, fail)
                return
            self._sequence += 1
            key = self._sequence
            self._unanswered.setdefault(destination, {})[key] = fail
            target.handle(request, self.now, lambda response: reply(key, response))

        def reply(key: int, response: Any) -> None:
            if self._unanswered.get(destination, {}).pop(key, None) is None:
                return

            def arrive() -> None:
                if self.nodes[source] is not incarnation or incarnation is None:
                    return
                if not self._linked(destination, source):
                    self._at(self.now + self.config.request_timeout_ms, fail)
                    return
                incarnation.on_response(destination, request, response, self.now)

            self._at(self.now + 1, arrive)

        if not self._linked(source, destination):
            self._at(self.now + self.config.request_timeout_ms, fail)
        else:
            self._at(self.now + 1, deliver)

    # Time

    def run_for(self, duration_ms: int) -> None:
        end = self.now + duration_ms
        while self.now <= end:
            for node, client in self.nodes.items():
                if client is not None:
                    for outbound in client.poll(self.now):
                        self._send(node, outbound.destination, outbound.request)
            self._note_leaders()
            due = sorted(e for e in self._events if e.time_ms <= self.now)
            self._events = [e for e in self._events if e.time_ms > self.now]
            for event in due:
                event.action()
            self._note_leaders()
            if not due:
                self.now += 1

    def _note_leaders(self) -> None:
        for node, client in self.nodes.items():
            if client is not None and client.is_leader:
                existing = self.leaders.setdefault(client.epoch, node)
                assert existing == node, f"two leaders in epoch {client.epoch}: {existing} and {node}"

    def run_until(self, condition: Callable[[], bool], limit_ms: int = 30_000) -> int:
        """Run until `condition` holds; the virtual time it took. Fails after `limit_ms`."""
        start = self.now
        while not condition():
            assert self.now - start < limit_ms, f"not reached within {limit_ms} virtual ms"
            self.run_for(1)
        return self.now - start

    def wait_for_active_leader(self, limit_ms: int = 30_000) -> RaftClient:
        """Run until one voter is the active leader; that voter."""
        self.run_until(lambda: self.active_leader() is not None, limit_ms)
        leader = self.active_leader()
        assert leader is not None
        return leader

    # Questions

    def active_leader(self) -> RaftClient | None:
        active = [c for c in self.nodes.values() if c is not None and c.is_active_leader()]
        return active[0] if len(active) == 1 else None

    def append(self, *values: bytes) -> int:
        leader = self.active_leader()
        assert leader is not None
        return leader.append(list(values), self.now)

    def committed_on(self, node: int) -> bytes:
        client = self.client(node)
        return client.read_committed(0, 1 << 30)
