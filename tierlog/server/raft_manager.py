"""KafkaRaftManager: the asyncio shell around the Raft core (`tierlog.raft.raft_client.RaftClient`) on a
controller node (process.roles contains controller).

It opens the metadata log and the quorum-state file, carries the core's requests to the other voters over their
controller listeners (one connection per voter, Kafka's Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch and
FetchSnapshot), hands the requests other voters send (through ControllerApis) to the core, and polls the core
whenever it is due. Whoever needs to know about leadership (ControllerServer) registers a listener.

The driver is one task: poll the core, start a send for every request it returns, sleep until the core's next
wakeup or a poke (an append, a handled request, a response). Each send is its own task, so a voter that does not
answer delays nobody else; the core keeps at most one request in flight per voter, which is what one connection
per voter carries. docs/quorum.md#the-shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.raft_requests import InvalidRaftMessageError, raft_request, raft_response_of
from tierlog.config import KafkaConfig
from tierlog.raft.messages import (
    NO_LEADER,
    EndQuorumEpochRequest,
    Outbound,
    RaftFetchRequest,
    RaftFetchResponse,
    RaftRequest,
    RaftResponse,
)
from tierlog.raft.quorum_state import QUORUM_STATE_FILE, FileQuorumStateStore
from tierlog.raft.raft_client import RaftClient, RaftConfig
from tierlog.raft.raft_log import METADATA_PARTITION, RaftLog
from tierlog.server.clock import now_ms

logger = logging.getLogger(__name__)

# How long a resigning leader waits at shutdown for the voters to take its EndQuorumEpoch.
RESIGN_WAIT_S = 1.0


class RaftManager:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        # A node without controller.quorum.voters is the one voter of its own quorum (the standalone broker).
        self.voter_addresses = config.quorum_voters
        self.voters = frozenset(self.voter_addresses) or frozenset({self.node_id})
        self.raft_config = RaftConfig(
            election_timeout_ms=config.get_int("controller.quorum.election.timeout.ms"),
            fetch_timeout_ms=config.get_int("controller.quorum.fetch.timeout.ms"),
            election_backoff_max_ms=config.get_int("controller.quorum.election.backoff.max.ms"),
            request_timeout_ms=config.get_int("controller.quorum.request.timeout.ms"),
            retry_backoff_ms=config.get_int("controller.quorum.retry.backoff.ms"),
        )
        self._request_timeout_s = self.raft_config.request_timeout_ms / 1000
        self._security = config.controller_client_security()
        self._client: RaftClient | None = None
        self._log: RaftLog | None = None
        self._listeners: list[Callable[[], None]] = []
        self._wakeup = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._connections: dict[int, KafkaConnection] = {}
        self._sends: dict[asyncio.Task[None], Outbound] = {}
        self._unreachable: set[int] = set()
        # The voters that acknowledged this node's resignation, while it stops.
        self._resignation_heard_by: set[int] = set()
        self._resignation_heard = asyncio.Event()
        # Fetches the core parked, answered through their future when it responds (or at stop).
        self._parked_fetches: set[asyncio.Future[RaftResponse]] = set()
        # wait_for_commit callers, told False at stop.
        self._commit_waiters: set[asyncio.Future[bool]] = set()
        self._seen: tuple[int, int | None, str, bool, int | None] | None = None
        self._stopping = False

    @property
    def client(self) -> RaftClient:
        """The core; call `poke()` after anything that may have given it something to send."""
        if self._client is None:
            raise RuntimeError("the Raft manager has not started")
        return self._client

    async def start(self) -> None:
        """Open the log and the quorum-state file and start the driver task."""
        log_dir = self.config.metadata_log_dir
        started_ms = now_ms()
        self._log = RaftLog(log_dir, started_ms)
        store = FileQuorumStateStore(log_dir / str(METADATA_PARTITION) / QUORUM_STATE_FILE, self.voters)
        self._client = RaftClient(
            self.node_id, self.voters, self._log, store, self.raft_config, started_ms, random.Random()
        )
        self._seen = self._state()
        self._driver = asyncio.create_task(self._drive(), name="raft-manager")
        logger.info(
            "[RaftManager id=%d] started: voters %s, metadata log end offset %d, epoch %d",
            self.node_id,
            sorted(self.voters),
            self._log.end_offset,
            self._client.epoch,
        )

    async def stop(self) -> None:
        """Resign if leader (EndQuorumEpoch, bounded wait), stop the driver, close the log."""
        if self._client is None or self._stopping:
            return
        self._stopping = True
        client = self._client
        if client.is_leader:
            client.resign(now_ms())
            self.poke()
            # The driver sends the EndQuorumEpochs and retries those that fail (a connection to a voter that
            # restarted fails once); every other voter acknowledging ends the wait early.
            others = self.voters - {self.node_id}
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESIGN_WAIT_S):
                    while not others <= self._resignation_heard_by:
                        self._resignation_heard.clear()
                        await self._resignation_heard.wait()
        tasks = [task for task in (self._driver, *self._sends) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Whoever still waits learns that this node stops answering (Kafka's answer while shutting down).
        for fetch in self._parked_fetches:
            if not fetch.done():
                fetch.set_result(self._shutting_down(client))
        for waiter in self._commit_waiters:
            if not waiter.done():
                waiter.set_result(False)
        for connection in self._connections.values():
            await connection.close()
        self._connections.clear()
        if self._log is not None:
            self._log.close()
        logger.info("[RaftManager id=%d] stopped in epoch %d", self.node_id, client.epoch)

    def poke(self) -> None:
        """Wake the driver: poll the core now (after an append, or a request handled)."""
        self._wakeup.set()

    def add_listener(self, on_change: Callable[[], None]) -> None:
        """`on_change` runs (on the event loop) after every poll or handled message that changed the epoch, the
        leader, whether this node is the active leader, or the high watermark (also on any other change of the
        Raft state: follower to prospective, say)."""
        self._listeners.append(on_change)

    async def handle(self, request: RaftRequest) -> RaftResponse:
        """A request from another voter (or, for Fetch, a broker), already decoded by ControllerApis: the core's
        answer (a Fetch may wait at most its max wait)."""
        client = self.client
        if self._stopping and isinstance(request, RaftFetchRequest):
            return self._shutting_down(client)
        answered: asyncio.Future[RaftResponse] = asyncio.get_running_loop().create_future()

        def respond(response: RaftResponse) -> None:
            if not answered.done():
                answered.set_result(response)

        # A parked fetch is answered when the core answers it, or at stop.
        self._parked_fetches.add(answered)
        try:
            client.handle(request, now_ms(), respond)
            self._after_core_call()
            return await answered
        finally:
            self._parked_fetches.discard(answered)

    async def wait_for_commit(self, offset: int, timeout_s: float) -> bool:
        """True once the high watermark is past `offset` in the epoch this node was in when called; False on
        timeout or if the epoch moves on first: a leader that lost its leadership may have lost its uncommitted
        records with it (the caller answers NOT_CONTROLLER)."""
        client = self.client
        epoch = client.epoch
        if self._committed(offset, epoch):
            return True
        if self._stopping:
            return False
        committed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def on_ready() -> None:
            if not committed.done():
                committed.set_result(self._committed(offset, epoch))

        self._commit_waiters.add(committed)
        try:
            client.wait_for_commit(offset, round(timeout_s * 1000), now_ms(), on_ready)
            self._after_core_call()
            return await committed
        finally:
            self._commit_waiters.discard(committed)

    @staticmethod
    def _shutting_down(client: RaftClient) -> RaftFetchResponse:
        """Kafka's answer to a fetch while the node shuts down."""
        return RaftFetchResponse(
            "BROKER_NOT_AVAILABLE", NO_LEADER if client.leader_id is None else client.leader_id, client.epoch
        )

    def _committed(self, offset: int, epoch: int) -> bool:
        high_watermark = self.client.high_watermark
        return self.client.epoch == epoch and high_watermark is not None and high_watermark > offset

    # The driver

    async def _drive(self) -> None:
        while True:
            try:
                self._poll()
                delay_ms = self.client.next_wakeup_ms() - now_ms()
            except Exception:
                # A failing core must not stop the quorum's clock: the next poll may succeed.
                logger.exception("[RaftManager id=%d] polling the Raft client failed", self.node_id)
                delay_ms = self.raft_config.retry_backoff_ms
            # Only what happens from here on (nothing ran since the poll) needs another poll before the wakeup. Even a
            # wakeup that is already due waits for the loop once: the sends and the requests must run too.
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay_ms, 0) / 1000):
                    await self._wakeup.wait()

    def _poll(self) -> None:
        for out in self.client.poll(now_ms()):
            task = asyncio.create_task(self._send(out), name=f"raft-send-{out.destination}")
            self._sends[task] = out
            task.add_done_callback(self._sends.pop)
        self._after_core_call()

    async def _send(self, out: Outbound) -> None:
        """Carry one request to its voter and its response (None: failed or timed out) back to the core."""
        response: RaftResponse | None = None
        try:
            async with asyncio.timeout(self._request_timeout_s):
                connection = await self._connection(out.destination)
                reply = await connection.send(raft_request(out.request), timeout_s=self._request_timeout_s)
            response = raft_response_of(out.request, reply)
        except (KafkaConnectionError, TimeoutError, InvalidRaftMessageError) as e:
            await self._drop_connection(out.destination)
            # Once per outage, not once per retry (every controller.quorum.retry.backoff.ms).
            if out.destination not in self._unreachable:
                self._unreachable.add(out.destination)
                logger.warning(
                    "[RaftManager id=%d] voter %d does not answer (%s); retrying",
                    self.node_id,
                    out.destination,
                    str(e) or "no response in time",
                )
        else:
            if out.destination in self._unreachable:
                self._unreachable.discard(out.destination)
                logger.info("[RaftManager id=%d] voter %d answers again", self.node_id, out.destination)
        if isinstance(out.request, EndQuorumEpochRequest):
            if response is not None:
                self._resignation_heard_by.add(out.destination)
                self._resignation_heard.set()
        elif self._stopping:
            return  # only the resignation is still carried while stopping
        self.client.on_response(out.destination, out.request, response, now_ms())
        self._after_core_call()

    async def _connection(self, voter: int) -> KafkaConnection:
        connection = self._connections.get(voter)
        if connection is not None and not connection.closed:
            return connection
        address = self.voter_addresses.get(voter)
        if address is None:
            raise KafkaConnectionError(f"voter {voter} has no address in controller.quorum.voters")
        host, port = address
        connection = await KafkaConnection.open(
            host,
            port,
            client_id=f"raft-client-{self.node_id}",
            timeout_s=self._request_timeout_s,
            security=self._security,
        )
        self._connections[voter] = connection
        return connection

    async def _drop_connection(self, voter: int) -> None:
        connection = self._connections.pop(voter, None)
        if connection is not None:
            await connection.close()

    # Telling the others

    def _state(self) -> tuple[int, int | None, str, bool, int | None]:
        client = self.client
        return client.epoch, client.leader_id, client.state_name, client.is_active_leader(), client.high_watermark

    def _after_core_call(self) -> None:
        """After anything the core did: the driver recomputes its wakeup, and a change reaches the listeners."""
        self._wakeup.set()
        state = self._state()
        if state == self._seen:
            return
        previous, self._seen = self._seen, state
        epoch, leader_id, state_name, active, _ = state
        if previous is None or previous[:4] != state[:4]:
            logger.info(
                "[RaftManager id=%d] epoch %d, leader %s, %s",
                self.node_id,
                epoch,
                "unknown" if leader_id is None else leader_id,
                "active leader" if active else state_name,
            )
        for on_change in self._listeners:
            try:
                on_change()
            except Exception:
                logger.exception("[RaftManager id=%d] a leadership listener failed", self.node_id)
