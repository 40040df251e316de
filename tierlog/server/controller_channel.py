"""How a broker talks to the controller: in-process on the controller's own node, over the Kafka protocol
from every other node. Both offer the same calls, so the broker is written once.

Remote calls use two connections, because a connection serves one request at a time and the metadata
fetch long-polls: one for the metadata log, one for every other RPC.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import (
    PartitionFetch,
    allocate_producer_ids_request,
    alter_partition_request,
    broker_heartbeat_request,
    broker_registration_request,
    fetch_request,
)
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.common import TopicPartition
from tierlog.controller.controller import HeartbeatResult
from tierlog.controller.metadata_log import METADATA_TOPIC, decode_metadata_batches
from tierlog.metadata.image import PartitionRegistration
from tierlog.metadata.records import Endpoint, MetadataRecord
from tierlog.protocol.errors import error_code
from tierlog.replication.partition import AlterPartitionProposal
from tierlog.replication.replica_manager import error_name_of
from tierlog.server.clock import now_ms
from tierlog.server.controller_server import ControllerServer

logger = logging.getLogger(__name__)

METADATA_FETCH_MAX_BYTES = 8 * 1024 * 1024


class ControllerUnavailableError(Exception):
    """The controller could not be reached or did not answer in time; the caller retries."""


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    registration: PartitionRegistration | None
    error: str | None


class ControllerChannel(Protocol):
    async def register_broker(
        self, broker_id: int, incarnation_id: uuid.UUID, cluster_id: str, endpoints: list[Endpoint], rack: str | None
    ) -> int: ...

    async def heartbeat(
        self, broker_id: int, broker_epoch: int, current_metadata_offset: int, want_fence: bool, want_shut_down: bool
    ) -> HeartbeatResult: ...

    async def alter_partition(
        self, broker_id: int, broker_epoch: int, proposal: AlterPartitionProposal
    ) -> AlterPartitionResult: ...

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range: ...

    async def fetch_metadata(
        self, broker_id: int, offset: int, max_wait_ms: int
    ) -> tuple[list[tuple[int, MetadataRecord]], int]:
        """Records from `offset` (waiting up to max_wait_ms for some) and the log's end offset."""
        ...

    async def forward(self, body: Any) -> Any:
        """An admin request (a kio request entity) this broker cannot decide, answered by the controller."""
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


class LocalControllerChannel:
    """The controller runs in this process: calls go straight to it."""

    def __init__(self, server: ControllerServer) -> None:
        self._server = server

    async def register_broker(
        self, broker_id: int, incarnation_id: uuid.UUID, cluster_id: str, endpoints: list[Endpoint], rack: str | None
    ) -> int:
        try:
            return self._server.controller.register_broker(
                broker_id, str(incarnation_id), cluster_id, endpoints, rack, now_ms()
            )
        except Exception as e:
            raise RegistrationError(error_name_of(e)) from e

    async def heartbeat(
        self, broker_id: int, broker_epoch: int, current_metadata_offset: int, want_fence: bool, want_shut_down: bool
    ) -> HeartbeatResult:
        try:
            return self._server.controller.heartbeat(
                broker_id, broker_epoch, current_metadata_offset, want_fence, want_shut_down, now_ms()
            )
        except Exception as e:
            raise HeartbeatRefusedError(error_name_of(e)) from e

    async def alter_partition(
        self, broker_id: int, broker_epoch: int, proposal: AlterPartitionProposal
    ) -> AlterPartitionResult:
        try:
            registration = self._server.controller.alter_partition(
                broker_id,
                broker_epoch,
                proposal.topic_id,
                proposal.topic_partition.partition,
                proposal.leader_epoch,
                proposal.partition_epoch,
                list(proposal.new_isr),
            )
        except Exception as e:
            return AlterPartitionResult(None, error_name_of(e))
        return AlterPartitionResult(registration, None)

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        return self._server.controller.allocate_producer_id_block(broker_id)

    async def fetch_metadata(
        self, broker_id: int, offset: int, max_wait_ms: int
    ) -> tuple[list[tuple[int, MetadataRecord]], int]:
        return await self._server.fetch_records(offset, max_wait_ms)

    async def forward(self, body: Any) -> Any:
        raise AssertionError("the controller's own node decides admin requests itself")

    async def close(self) -> None:
        return None


class RemoteControllerChannel:
    """The controller is another node, reached with Kafka's controller APIs."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        request_timeout_ms: int,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        self._address = (host, port)
        self._security = security
        self._client_id = client_id
        self._timeout_s = request_timeout_ms / 1000
        self._rpc: KafkaConnection | None = None
        self._fetch: KafkaConnection | None = None
        self._rpc_lock = asyncio.Lock()

    async def _send(self, which: str, request: Any, timeout_s: float) -> Any:
        connection = getattr(self, which)
        try:
            if connection is None:
                host, port = self._address
                connection = await KafkaConnection.open(
                    host, port, client_id=self._client_id, timeout_s=min(self._timeout_s, 5.0), security=self._security
                )
                setattr(self, which, connection)
            return await connection.send(request, timeout_s=timeout_s)
        except KafkaConnectionError as e:
            setattr(self, which, None)
            if connection is not None:
                await connection.close()
            raise ControllerUnavailableError(f"controller {self._address[0]}:{self._address[1]}: {e}") from e

    async def _rpc_call(self, request: Any) -> Any:
        async with self._rpc_lock:
            return await self._send("_rpc", request, self._timeout_s)

    async def register_broker(
        self, broker_id: int, incarnation_id: uuid.UUID, cluster_id: str, endpoints: list[Endpoint], rack: str | None
    ) -> int:
        request = broker_registration_request(broker_id, incarnation_id, cluster_id, endpoints, rack)
        response = await self._rpc_call(request)
        if response.error_code != error_code(None):
            raise RegistrationError(response.error_code.name.upper())
        return int(response.broker_epoch)

    async def heartbeat(
        self, broker_id: int, broker_epoch: int, current_metadata_offset: int, want_fence: bool, want_shut_down: bool
    ) -> HeartbeatResult:
        response = await self._rpc_call(
            broker_heartbeat_request(
                broker_id,
                broker_epoch,
                current_metadata_offset,
                want_fence=want_fence,
                want_shut_down=want_shut_down,
            )
        )
        if response.error_code != error_code(None):
            raise HeartbeatRefusedError(response.error_code.name.upper())
        return HeartbeatResult(
            is_caught_up=response.is_caught_up,
            is_fenced=response.is_fenced,
            should_shut_down=response.should_shut_down,
        )

    async def alter_partition(
        self, broker_id: int, broker_epoch: int, proposal: AlterPartitionProposal
    ) -> AlterPartitionResult:
        request = alter_partition_request(
            broker_id,
            broker_epoch,
            proposal.topic_id,
            proposal.topic_partition.partition,
            leader_epoch=proposal.leader_epoch,
            partition_epoch=proposal.partition_epoch,
            new_isr=proposal.new_isr,
        )
        response = await self._rpc_call(request)
        if response.error_code != error_code(None):
            return AlterPartitionResult(None, response.error_code.name.upper())
        p = response.topics[0].partitions[0]
        if p.error_code != error_code(None):
            return AlterPartitionResult(None, p.error_code.name.upper())
        # The response carries no replica list: the registration is only read for ISR and epochs.
        return AlterPartitionResult(
            PartitionRegistration(
                replicas=[],
                isr=list(p.isr),
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
            ),
            None,
        )

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        response = await self._rpc_call(allocate_producer_ids_request(broker_id, broker_epoch))
        if response.error_code != error_code(None):
            raise ControllerUnavailableError(f"producer ids refused: {response.error_code.name.upper()}")
        return range(response.producer_id_start, response.producer_id_start + response.producer_id_len)

    async def fetch_metadata(
        self, broker_id: int, offset: int, max_wait_ms: int
    ) -> tuple[list[tuple[int, MetadataRecord]], int]:
        request = fetch_request(
            [PartitionFetch(TopicPartition(METADATA_TOPIC, 0), offset, METADATA_FETCH_MAX_BYTES)],
            replica_id=broker_id,
            max_wait_ms=max_wait_ms,
            max_bytes=METADATA_FETCH_MAX_BYTES,
        )
        if max_wait_ms > 0:
            response = await self._send("_fetch", request, self._timeout_s + max_wait_ms / 1000)
        else:
            # A quick look (how far has the controller written?) must not queue behind a parked long poll.
            response = await self._rpc_call(request)
        partition = response.responses[0].partitions[0]
        if partition.error_code != error_code(None):
            raise ControllerUnavailableError(f"metadata fetch failed: {partition.error_code.name.upper()}")
        records = decode_metadata_batches(bytes(partition.records or b"")).records
        return [(o, r) for o, r in records if o >= offset], int(partition.high_watermark)

    async def forward(self, body: Any) -> Any:
        return await self._rpc_call(body)

    async def close(self) -> None:
        for which in ("_rpc", "_fetch"):
            connection = getattr(self, which)
            setattr(self, which, None)
            if connection is not None:
                await connection.close()
