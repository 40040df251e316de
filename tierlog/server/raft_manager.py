"""KafkaRaftManager: the asyncio shell around the Raft core (`tierlog.raft.raft_client.RaftClient`) on a
controller node (process.roles contains controller).

It opens the metadata log and the quorum-state file, carries the core's requests to the other voters over their
controller listeners (one connection per voter, Kafka's Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch and
FetchSnapshot), hands the requests other voters send (through ControllerApis) to the core, and polls the core
whenever it is due. Whoever needs to know about leadership (ControllerServer) registers a listener.
docs/quorum.md.
"""

from __future__ import annotations

from collections.abc import Callable

from tierlog.config import KafkaConfig
from tierlog.raft.messages import RaftRequest, RaftResponse
from tierlog.raft.raft_client import RaftClient


class RaftManager:
    def __init__(self, config: KafkaConfig) -> None:
        raise NotImplementedError

    @property
    def client(self) -> RaftClient:
        """The core; call `poke()` after anything that may have given it something to send."""
        raise NotImplementedError

    async def start(self) -> None:
        """Open the log and the quorum-state file and start the driver task."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Resign if leader (EndQuorumEpoch, bounded wait), stop the driver, close the log."""
        raise NotImplementedError

    def poke(self) -> None:
        """Wake the driver: poll the core now (after an append, or a request handled)."""
        raise NotImplementedError

    def add_listener(self, on_change: Callable[[], None]) -> None:
        """`on_change` runs (on the event loop) after every poll or handled message that changed the epoch, the
        leader, whether this node is the active leader, or the high watermark."""
        raise NotImplementedError

    async def handle(self, request: RaftRequest) -> RaftResponse:
        """A request from another voter (or, for Fetch, a broker), already decoded by ControllerApis: the core's
        answer (a Fetch may wait at most its max wait)."""
        raise NotImplementedError

    async def wait_for_commit(self, offset: int, timeout_s: float) -> bool:
        """True once the high watermark is past `offset`; False on timeout or if this node stops being the
        leader of the epoch it was in when called (the caller answers NOT_CONTROLLER)."""
        raise NotImplementedError
