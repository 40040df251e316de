"""How a broker talks to the controller quorum (docs/quorum.md#active-controller).

Only the active controller decides; the broker knows the voters' controller listeners (controller.quorum.voters,
or controller.quorum.bootstrap.servers) and keeps a guess of which one is active. A call goes to the guess; an
answer NOT_CONTROLLER or NOT_LEADER_OR_FOLLOWER, a connection that fails or a request that times out moves the
guess to the leader the answer names, else to the next voter, and the call is tried again after
controller.quorum.retry.backoff.ms, until the caller's timeout. On a voter's own node (broker,controller) a call
is decided in this process while the local controller is the active one, and only then answered, once what it
wrote is committed.

The broker follows the metadata log as an observer of the quorum, receiving committed batches only: from the
leader over the network, or on a voter's own node from its own log's committed part (a follower's high
watermark is committed too), without the network. When the offset it fetches from is gone from the leader's log
(below the log start, docs/quorum.md#snapshots), the answer names the leader's latest snapshot, which the broker
downloads with FetchSnapshot and loads before fetching the log after it; on a voter's node the local snapshot is
read.

Remote calls use two connections, because a connection serves one request at a time and the metadata
fetch long-polls: one for the metadata log, one for every other RPC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.raft_requests import InvalidRaftMessageError, raft_request, raft_response_of
from tierlog.client.requests import (
    CONSUMER_REPLICA_ID,
    allocate_producer_ids_request,
    alter_partition_request,
    broker_heartbeat_request,
    broker_registration_request,
)
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.common import TopicPartition
from tierlog.controller.controller import Controller, HeartbeatResult
from tierlog.controller.errors import NotControllerError
from tierlog.controller.metadata_log import MetadataSnapshot, decode_metadata_batches
from tierlog.metadata.image import PartitionRegistration
from tierlog.metadata.loader import MetadataBatches, MetadataFetchRequest
from tierlog.metadata.records import Endpoint, decode_record
from tierlog.protocol.errors import error_code
from tierlog.raft.messages import (
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    RaftFetchRequest,
    RaftFetchResponse,
)
from tierlog.raft.snapshot import CorruptSnapshotError, parse_snapshot
from tierlog.replication.alter_partition_manager import AlterPartitionAnswer
from tierlog.replication.partition import AlterPartitionProposal
from tierlog.replication.replica_manager import error_name_of
from tierlog.server.clock import now_ms
from tierlog.server.controller_server import ControllerServer

logger = logging.getLogger(__name__)

METADATA_FETCH_MAX_BYTES = 8 * 1024 * 1024
# Kafka's NOT_CONTROLLER (41): the request reached a controller that is not the active one.
NOT_CONTROLLER = error_code("NOT_CONTROLLER")
# A metadata fetch sent to a voter that is not the leader, or with an epoch the leader does not have: the answer
# names the leader and its epoch (the Fetch response's CurrentLeader).
FETCH_LEADER_ERRORS = frozenset(("NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH"))

T = TypeVar("T")


class ControllerUnavailableError(Exception):
    """No active controller could be reached or answered in time; the caller retries."""


class ControllerChannel(Protocol):
    async def register_broker(
        self, broker_id: int, incarnation_id: uuid.UUID, cluster_id: str, endpoints: list[Endpoint], rack: str | None
    ) -> int: ...

    async def heartbeat(
        self, broker_id: int, broker_epoch: int, current_metadata_offset: int, want_fence: bool, want_shut_down: bool
    ) -> HeartbeatResult: ...

    async def alter_partition(
        self, broker_id: int, broker_epoch: int, proposals: Sequence[AlterPartitionProposal]
    ) -> dict[TopicPartition, AlterPartitionAnswer]:
        """One AlterPartition request for all `proposals`: each partition's answer (a partition the controller
        left out has none)."""
        ...

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range: ...

    async def fetch_metadata(
        self, broker_id: int, request: MetadataFetchRequest
    ) -> tuple[MetadataBatches | MetadataSnapshot, int]:
        """Committed batches from the request's offset (waiting up to its max wait for some) and the high
        watermark."""
        ...

    async def high_watermark(self, broker_id: int, position: MetadataFetchRequest) -> int:
        """The end of the committed metadata log as the active controller knows it now; `position` is where the
        broker's next fetch starts."""
        ...

    async def forward(self, body: Any) -> Any:
        """An admin request (a kio request entity) this broker cannot decide, answered by the active
        controller."""
        ...

    async def close(self) -> None: ...


class RegistrationError(Exception):
    def __init__(self, error_name: str) -> None:
        super().__init__(f"the controller refused the registration: {error_name}")
        self.error_name = error_name


class HeartbeatRefusedError(Exception):
    def __init__(self, error_name: str) -> None:
        super().__init__(f"the controller refused the heartbeat: {error_name}")
        self.error_name = error_name


class QuorumControllerChannel:
    """The controller channel of a broker: to the active controller of the quorum, wherever it is."""

    def __init__(
        self,
        servers: Sequence[tuple[int | None, str, int]],
        *,
        local: ControllerServer | None,
        client_id: str,
        request_timeout_ms: int,
        quorum_request_timeout_ms: int,
        retry_backoff_ms: int,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        """`servers`: the voters' controller listeners, with their node ids when known (none on a standalone
        node, the one voter of its own quorum). `local`: this node's own controller (a voter's node), None on a
        broker-only node. `request_timeout_ms` bounds a call, over all
        its tries; `quorum_request_timeout_ms` (controller.quorum.request.timeout.ms) one try."""
        self._servers = list(servers)
        self._local = local
        self._security = security
        self._client_id = client_id
        self._timeout_s = request_timeout_ms / 1000
        self._try_timeout_s = quorum_request_timeout_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        # Index into `_servers` of the voter believed to be the active controller.
        self._guess = 0
        # The quorum's epoch as the last answer gave it: an observer's Fetch carries it (CurrentLeaderEpoch).
        self._leader_epoch = -1
        self._rpc: KafkaConnection | None = None
        self._fetch: KafkaConnection | None = None
        # The server each connection is open to.
        self._rpc_server: int | None = None
        self._fetch_server: int | None = None
        self._rpc_lock = asyncio.Lock()

    # Which voter to ask

    def _follow(self, leader_id: int | None) -> bool:
        """Guess the voter with node id `leader_id`; False if it is none of the known ones."""
        for index, (node_id, _, _) in enumerate(self._servers):
            if node_id is not None and node_id == leader_id:
                self._guess = index
                return True
        return False

    def _move_on(self, leader_id: int | None = None) -> None:
        """The guess was wrong: the leader an answer named, else the next voter."""
        if not self._servers:
            return
        current = self._guess
        if not self._follow(leader_id) or self._guess == current:
            self._guess = (current + 1) % len(self._servers)

    def _local_leader_hint(self) -> None:
        """On a voter's node, its Raft client knows the leader of the current epoch."""
        if self._local is not None:
            self._follow(self._local.leader_id)

    def _local_is_leader(self) -> bool:
        """This node leads the quorum but is not active yet (its LeaderChangeMessage is not committed)."""
        return self._local is not None and self._local.leader_id == self._local.config.node_id

    async def _pause(self, deadline: float, what: str) -> None:
        if asyncio.get_running_loop().time() + self._retry_backoff_s >= deadline:
            raise ControllerUnavailableError(f"no active controller answered {what} in time")
        await asyncio.sleep(self._retry_backoff_s)

    # Controller operations: in-process on the active controller's node, else over the network

    async def _decide(
        self,
        what: str,
        local: Callable[[Controller], T],
        request: Any,
        answer: Callable[[Any], T],
    ) -> T:
        """`local` on this node's controller while it is the active one, else `request` to the active
        controller, `answer` reading its response. Both raise NotControllerError for an answer from a controller
        that is not (or no longer) active, which moves on to another and tries again, until the call's timeout."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        while True:
            controller = self._local.controller if self._local is not None else None
            if controller is not None:
                try:
                    return await self._decide_here(controller, local)
                except NotControllerError:
                    pass
            elif self._servers and not self._local_is_leader():
                self._local_leader_hint()
                try:
                    return answer(await self._rpc_call(request, deadline))
                except ControllerUnavailableError as e:
                    logger.debug("%s: %s", what, e)
                    self._move_on()
                except NotControllerError:
                    self._move_on()
            await self._pause(deadline, what)

    async def _decide_here(self, controller: Controller, operation: Callable[[Controller], T]) -> T:
        """Run `operation` on the local active controller and answer once what it wrote is committed (a
        refusal too: it may rest on records not committed yet)."""
        assert self._local is not None
        refusal: Exception | None = None
        try:
            result = operation(controller)
        except NotControllerError:
            raise
        except Exception as e:
            refusal = e
        if not await self._local.wait_for_commit(controller):
            raise NotControllerError("the local controller lost its leadership before its records committed")
        if refusal is not None:
            raise refusal
        return result

    async def _rpc_call(self, request: Any, deadline: float) -> Any:
        remaining = deadline - asyncio.get_running_loop().time()
        async with self._rpc_lock:
            return await self._send("_rpc", request, min(self._try_timeout_s, max(remaining, 0.001)))

    async def _send(self, which: str, request: Any, timeout_s: float) -> Any:
        """`request` on connection `which` (`_rpc` or `_fetch`) to the guessed voter, opened or moved there as
        needed."""
        if not self._servers:
            raise ControllerUnavailableError("the local controller is not active yet")
        target = self._guess
        connection: KafkaConnection | None = getattr(self, which)
        if connection is not None and getattr(self, f"{which}_server") != target:
            setattr(self, which, None)
            await connection.close()
            connection = None
        node_id, host, port = self._servers[target]
        try:
            if connection is None:
                connection = await KafkaConnection.open(
                    host, port, client_id=self._client_id, timeout_s=min(timeout_s, 5.0), security=self._security
                )
                setattr(self, which, connection)
                setattr(self, f"{which}_server", target)
            return await connection.send(request, timeout_s=timeout_s)
        except KafkaConnectionError as e:
            setattr(self, which, None)
            if connection is not None:
                await connection.close()
            name = "controller" if node_id is None else f"controller {node_id}"
            raise ControllerUnavailableError(f"{name} at {host}:{port}: {e}") from e

    async def register_broker(
        self, broker_id: int, incarnation_id: uuid.UUID, cluster_id: str, endpoints: list[Endpoint], rack: str | None
    ) -> int:
        def local(controller: Controller) -> int:
            try:
                return controller.register_broker(broker_id, str(incarnation_id), cluster_id, endpoints, rack, now_ms())
            except NotControllerError:
                raise
            except Exception as e:
                raise RegistrationError(error_name_of(e)) from e

        def answer(response: Any) -> int:
            _raise_not_controller(response)
            if response.error_code != error_code(None):
                raise RegistrationError(response.error_code.name.upper())
            return int(response.broker_epoch)

        request = broker_registration_request(broker_id, incarnation_id, cluster_id, endpoints, rack)
        return await self._decide("the registration", local, request, answer)

    async def heartbeat(
        self, broker_id: int, broker_epoch: int, current_metadata_offset: int, want_fence: bool, want_shut_down: bool
    ) -> HeartbeatResult:
        def local(controller: Controller) -> HeartbeatResult:
            try:
                return controller.heartbeat(
                    broker_id, broker_epoch, current_metadata_offset, want_fence, want_shut_down, now_ms()
                )
            except NotControllerError:
                raise
            except Exception as e:
                raise HeartbeatRefusedError(error_name_of(e)) from e

        def answer(response: Any) -> HeartbeatResult:
            _raise_not_controller(response)
            if response.error_code != error_code(None):
                raise HeartbeatRefusedError(response.error_code.name.upper())
            return HeartbeatResult(
                is_caught_up=response.is_caught_up,
                is_fenced=response.is_fenced,
                should_shut_down=response.should_shut_down,
            )

        request = broker_heartbeat_request(
            broker_id, broker_epoch, current_metadata_offset, want_fence=want_fence, want_shut_down=want_shut_down
        )
        return await self._decide("the heartbeat", local, request, answer)

    async def alter_partition(
        self, broker_id: int, broker_epoch: int, proposals: Sequence[AlterPartitionProposal]
    ) -> dict[TopicPartition, AlterPartitionAnswer]:
        changes = [p.isr_change() for p in proposals]

        def local(controller: Controller) -> dict[TopicPartition, AlterPartitionAnswer]:
            outcomes = controller.alter_partitions(broker_id, broker_epoch, changes)
            return {
                p.topic_partition: AlterPartitionAnswer(None, error_name_of(outcome))
                if isinstance(outcome, Exception)
                else AlterPartitionAnswer(outcome, None)
                for p, outcome in zip(proposals, outcomes, strict=True)
            }

        def answer(response: Any) -> dict[TopicPartition, AlterPartitionAnswer]:
            _raise_not_controller(response)
            if response.error_code != error_code(None):
                refused = AlterPartitionAnswer(None, response.error_code.name.upper())
                return {p.topic_partition: refused for p in proposals}
            topic_names = {p.topic_id: p.topic_partition.topic for p in proposals}
            answers = {}
            for topic in response.topics:
                name = topic_names.get(topic.topic_id)
                if name is None:
                    continue
                for p in topic.partitions:
                    tp = TopicPartition(name, p.partition_index)
                    if p.error_code != error_code(None):
                        answers[tp] = AlterPartitionAnswer(None, p.error_code.name.upper())
                        continue
                    # The response carries no replica list: the registration is only read for ISR and epochs.
                    registration = PartitionRegistration(
                        replicas=[],
                        isr=list(p.isr),
                        leader=p.leader_id,
                        leader_epoch=p.leader_epoch,
                        partition_epoch=p.partition_epoch,
                    )
                    answers[tp] = AlterPartitionAnswer(registration, None)
            return answers

        request = alter_partition_request(broker_id, broker_epoch, changes)
        return await self._decide("AlterPartition", local, request, answer)

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        def answer(response: Any) -> range:
            _raise_not_controller(response)
            if response.error_code != error_code(None):
                raise ControllerUnavailableError(f"producer ids refused: {response.error_code.name.upper()}")
            return range(response.producer_id_start, response.producer_id_start + response.producer_id_len)

        return await self._decide(
            "AllocateProducerIds",
            lambda controller: controller.allocate_producer_id_block(broker_id),
            allocate_producer_ids_request(broker_id, broker_epoch),
            answer,
        )

    async def forward(self, body: Any) -> Any:
        """Sent to the active controller's listener, on this node too: ControllerApis decides it there."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        while True:
            self._local_leader_hint()
            try:
                response = await self._rpc_call(body, deadline)
                _raise_not_controller(response)
                return response
            except ControllerUnavailableError as e:
                logger.debug("forwarding %s: %s", type(body).__name__, e)
                self._move_on()
            except NotControllerError:
                self._move_on()
            await self._pause(deadline, type(body).__name__)

    # The metadata log

    async def fetch_metadata(
        self, broker_id: int, request: MetadataFetchRequest
    ) -> tuple[MetadataBatches | MetadataSnapshot, int]:
        if self._local is not None:
            data, high_watermark = await self._local.read_committed(request.offset, request.max_wait_ms)
            if isinstance(data, MetadataSnapshot):
                return data, high_watermark
            return _batches_from(data, request.offset), high_watermark
        answer = await self._fetch_from_leader(broker_id, request)
        if answer.snapshot_id is not None:
            return await self._fetch_snapshot(broker_id, answer.snapshot_id), answer.high_watermark
        return _batches_from(answer.records, request.offset), answer.high_watermark

    async def _fetch_snapshot(self, broker_id: int, snapshot_id: OffsetAndEpoch) -> MetadataSnapshot:
        """The leader's snapshot, downloaded chunk by chunk with FetchSnapshot and decoded. Any failure (the
        leader moved on to a newer snapshot: SNAPSHOT_NOT_FOUND) is ControllerUnavailableError, and the loader's
        next fetch names whichever snapshot the leader has then."""
        data = bytearray()
        while True:
            request = FetchSnapshotRequest(broker_id, self._leader_epoch, snapshot_id, len(data))
            answer = raft_response_of(request, await self._send("_fetch", raft_request(request), self._try_timeout_s))
            assert isinstance(answer, FetchSnapshotResponse)
            if answer.error is not None:
                raise ControllerUnavailableError(f"metadata snapshot fetch failed: {answer.error.upper()}")
            if answer.position != len(data) or (not answer.data and len(data) < answer.size):
                raise ControllerUnavailableError(f"metadata snapshot {snapshot_id} came back out of order")
            data += answer.data
            if len(data) >= answer.size:
                break
        try:
            snapshot = parse_snapshot(snapshot_id, bytes(data))
        except CorruptSnapshotError as e:
            raise ControllerUnavailableError(f"metadata snapshot {snapshot_id} is corrupt: {e}") from None
        return MetadataSnapshot([decode_record(value) for value in snapshot.values], snapshot_id.offset)

    async def high_watermark(self, broker_id: int, position: MetadataFetchRequest) -> int:
        if self._local is not None and self._local.controller is not None:
            _, high_watermark = await self._local.read_committed(position.offset, 0)
            return high_watermark
        # A voter's node asks as a consumer would: a fetch with a voter's id would be taken as its replication.
        replica_id = CONSUMER_REPLICA_ID if self._local is not None else broker_id
        look = dataclasses.replace(position, max_wait_ms=0)
        return (await self._fetch_from_leader(replica_id, look)).high_watermark

    async def _fetch_from_leader(self, replica_id: int, request: MetadataFetchRequest) -> RaftFetchResponse:
        """The observer's Fetch of the metadata log from the quorum's leader (docs/quorum.md#observers): an answer
        naming another leader or epoch is followed at once; a voter that cannot be reached is left for the next
        one; either way within one fetch's timeout."""
        deadline = asyncio.get_running_loop().time() + self._try_timeout_s + request.max_wait_ms / 1000
        while True:
            fetch = RaftFetchRequest(
                replica_id=replica_id,
                current_leader_epoch=self._leader_epoch,
                fetch_offset=request.offset,
                last_fetched_epoch=request.last_fetched_epoch,
                max_wait_ms=request.max_wait_ms,
                max_bytes=METADATA_FETCH_MAX_BYTES,
            )
            try:
                if request.max_wait_ms > 0:
                    reply = await self._send(
                        "_fetch", raft_request(fetch), self._try_timeout_s + request.max_wait_ms / 1000
                    )
                else:
                    # A quick look (how far is the log committed?) must not queue behind a parked long poll.
                    reply = await self._rpc_call(raft_request(fetch), deadline)
                answer = raft_response_of(fetch, reply)
            except ControllerUnavailableError:
                self._move_on()
                raise
            except InvalidRaftMessageError as e:
                self._move_on()
                raise ControllerUnavailableError(f"metadata fetch failed: {e}") from e
            assert isinstance(answer, RaftFetchResponse)
            if answer.leader_epoch >= 0:
                self._leader_epoch = answer.leader_epoch
            leader_id = answer.leader_id if answer.leader_id >= 0 else None
            if answer.error is None:
                self._follow(leader_id)
                return answer
            if answer.error not in FETCH_LEADER_ERRORS:
                raise ControllerUnavailableError(f"metadata fetch failed: {answer.error}")
            self._move_on(leader_id)
            await self._pause(deadline, "the metadata fetch")

    async def close(self) -> None:
        for which in ("_rpc", "_fetch"):
            connection = getattr(self, which)
            setattr(self, which, None)
            if connection is not None:
                await connection.close()


def _batches_from(data: bytes, offset: int) -> MetadataBatches:
    """The batches of a fetch from `offset`: the first may start before it (a batch comes whole)."""
    batches = decode_metadata_batches(data, offset)
    return dataclasses.replace(batches, records=[(o, r) for o, r in batches.records if o >= offset])


def _raise_not_controller(response: Any) -> None:
    """NotControllerError if any error code of `response` is NOT_CONTROLLER, as Kafka's broker-to-controller
    channel checks a response's error counts: the request reached a controller that is not the active one."""
    if NOT_CONTROLLER in error_codes(response):
        raise NotControllerError("the controller that answered is not the active one")


def error_codes(entity: Any) -> set[int]:
    """Every error code in a response entity, at any depth."""
    codes: set[int] = set()
    if dataclasses.is_dataclass(entity):
        for field in dataclasses.fields(entity):
            value = getattr(entity, field.name)
            if field.name == "error_code":
                codes.add(value)
            else:
                codes |= error_codes(value)
    elif isinstance(entity, tuple):
        for item in entity:
            codes |= error_codes(item)
    return codes
