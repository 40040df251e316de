"""Kafka's ReplicaFetcherThread as an asyncio task: carries the requests of the deterministic `ReplicaFetcher`
(replication/fetcher.py), which decides what to fetch, what to truncate and what to append, to a leader broker
and its answers back.

One task per leader broker; all of this broker's follower partitions led by it share its Fetch requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tierlog.client.connection import KafkaConnection, KafkaConnectionError
from tierlog.client.requests import (
    PartitionFetch,
    fetch_request,
    list_offsets_request,
    offset_for_leader_epoch_request,
)
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.common import Idle, TopicPartition
from tierlog.metadata.records import Endpoint
from tierlog.protocol.errors import error_code
from tierlog.replication.fetch_session import FETCH_SESSION_ERRORS
from tierlog.replication.fetcher import (
    EpochEndOffsetRequest,
    FetchRequestData,
    FetchResponsePartition,
    ListOffsetsRequest,
    RemoteLogAuxStateRequest,
    ReplicaFetcher,
)
from tierlog.server.clock import now_ms

logger = logging.getLogger(__name__)

# (partition, leader epoch, offset) -> (end offset of the remote segment holding it, epoch history to there,
# the producer snapshot taken at its end if the remote tier has one).
RemoteLogAuxState = Callable[[TopicPartition, int, int], Awaitable[tuple[int, list[tuple[int, int]], bytes | None]]]
_NO_ERROR = error_code(None)


class _LeaderRefusedError(Exception):
    """The leader answered a partition's ListOffsets or OffsetForLeaderEpoch with an error."""

    def __init__(self, error_name: str) -> None:
        super().__init__(error_name)
        self.error_name = error_name


class FetcherThread:
    def __init__(
        self,
        fetcher: ReplicaFetcher,
        leader_endpoint: Callable[[int], Endpoint | None],
        *,
        client_id: str,
        request_timeout_ms: int,
        remote_log_aux_state: RemoteLogAuxState | None = None,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        self.fetcher = fetcher
        self._security = security
        self._leader_endpoint = leader_endpoint
        self._client_id = client_id
        self._timeout_s = request_timeout_ms / 1000
        self._remote_log_aux_state = remote_log_aux_state
        self._connection: KafkaConnection | None = None
        self._address: tuple[str, int] | None = None
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.fetcher.source_broker_id}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self._disconnect()

    async def _run(self) -> None:
        while True:
            try:
                await self._do_work()
            except asyncio.CancelledError:
                raise
            except KafkaConnectionError as e:
                logger.info("[ReplicaFetcher leader=%d] %s", self.fetcher.source_broker_id, e)
                self.fetcher.on_fetch_failed(now_ms())
                await self._disconnect()
            except Exception:
                logger.exception("[ReplicaFetcher leader=%d] unexpected error", self.fetcher.source_broker_id)
                self.fetcher.on_fetch_failed(now_ms())
                await self._disconnect()

    async def _do_work(self) -> None:
        fetcher = self.fetcher
        action = fetcher.poll(now_ms())
        if isinstance(action, Idle):
            await self._idle(action.until_ms)
        elif isinstance(action, FetchRequestData):
            connection = await self._connect()
            response = await connection.send(
                self._fetch_request(action), timeout_s=self._timeout_s + action.max_wait_ms / 1000
            )
            error = None if response.error_code == _NO_ERROR else response.error_code.name.upper()
            if error in FETCH_SESSION_ERRORS:
                fetcher.on_fetch_session_error(error, now_ms())
            elif error is not None:
                raise KafkaConnectionError(f"fetch failed: {error}")
            else:
                fetcher.process_fetch_response(_response_partitions(response), now_ms(), session_id=response.session_id)
        elif isinstance(action, ListOffsetsRequest):
            tp = action.topic_partition
            try:
                answers = await self._list_offsets(tp, action.timestamps)
            except _LeaderRefusedError as e:
                fetcher.on_list_offsets_failed(tp, e.error_name, now_ms())
            else:
                fetcher.on_list_offsets(tp, answers, now_ms())
        elif isinstance(action, EpochEndOffsetRequest):
            tp = action.topic_partition
            try:
                epoch, end_offset = await self._epoch_end_offset(tp, action.leader_epoch)
            except _LeaderRefusedError as e:
                fetcher.on_epoch_end_offset_failed(tp, e.error_name, now_ms())
            else:
                fetcher.on_epoch_end_offset(tp, epoch, end_offset, now_ms())
        else:
            await self._read_remote_log_aux_state(action)

    async def _idle(self, until_ms: int) -> None:
        self.wakeup.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0, until_ms - now_ms()) / 1000):
                await self.wakeup.wait()

    async def _connect(self) -> KafkaConnection:
        endpoint = self._leader_endpoint(self.fetcher.source_broker_id)
        if endpoint is None:
            raise KafkaConnectionError(f"no endpoint known for broker {self.fetcher.source_broker_id}")
        address = (endpoint.host, endpoint.port)
        if self._connection is not None and address != self._address:
            await self._disconnect()
        if self._connection is None:
            self._connection = await KafkaConnection.open(
                endpoint.host,
                endpoint.port,
                client_id=self._client_id,
                timeout_s=min(self._timeout_s, 5.0),
                security=self._security,
            )
            self._address = address
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def _fetch_request(self, data: FetchRequestData) -> Any:
        return fetch_request(
            [
                PartitionFetch(
                    p.topic_partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    current_leader_epoch=p.current_leader_epoch,
                    last_fetched_epoch=p.last_fetched_epoch,
                    log_start_offset=p.log_start_offset,
                )
                for p in data.partitions
            ],
            replica_id=data.replica_id,
            max_wait_ms=data.max_wait_ms,
            min_bytes=data.min_bytes,
            max_bytes=data.max_bytes,
            session_id=data.session_id,
            session_epoch=data.session_epoch,
            forgotten=[TopicPartition(topic, partition) for topic, partition in data.forgotten],
        )

    async def _read_remote_log_aux_state(self, request: RemoteLogAuxStateRequest) -> None:
        tp = request.topic_partition
        if self._remote_log_aux_state is None:
            self.fetcher.on_remote_log_aux_state_failed(tp, "this broker has no remote tier configured", now_ms())
            return
        try:
            end_offset, epochs, producer_snapshot = await self._remote_log_aux_state(
                tp, request.leader_epoch, request.offset
            )
        except Exception as e:
            self.fetcher.on_remote_log_aux_state_failed(tp, str(e), now_ms())
            return
        self.fetcher.on_remote_log_aux_state(tp, end_offset, epochs, producer_snapshot, now_ms())

    async def _list_offsets(self, tp: TopicPartition, timestamps: tuple[int, ...]) -> list[tuple[int, int]]:
        """(offset, leader epoch) per timestamp from the leader, asking as a replica."""
        connection = await self._connect()
        answers = []
        for timestamp in timestamps:
            request = list_offsets_request(tp, timestamp, replica_id=self.fetcher.config.replica_id)
            response = await connection.send(request, timeout_s=self._timeout_s)
            partition = response.topics[0].partitions[0]
            if partition.error_code != _NO_ERROR:
                raise _LeaderRefusedError(partition.error_code.name)
            answers.append((int(partition.offset), int(partition.leader_epoch)))
        return answers

    async def _epoch_end_offset(self, tp: TopicPartition, epoch: int) -> tuple[int, int]:
        request = offset_for_leader_epoch_request(tp, epoch, replica_id=self.fetcher.config.replica_id)
        connection = await self._connect()
        response = await connection.send(request, timeout_s=self._timeout_s)
        answer = response.topics[0].partitions[0]
        if answer.error_code != _NO_ERROR:
            raise _LeaderRefusedError(answer.error_code.name)
        return int(answer.leader_epoch), int(answer.end_offset)


def _response_partitions(response: Any) -> list[FetchResponsePartition]:
    partitions = []
    for topic in response.responses:
        for p in topic.partitions:
            diverging = p.diverging_epoch
            partitions.append(
                FetchResponsePartition(
                    topic_partition=TopicPartition(topic.topic, p.partition_index),
                    error=None if p.error_code == _NO_ERROR else p.error_code.name.upper(),
                    high_watermark=int(p.high_watermark),
                    log_start_offset=int(p.log_start_offset),
                    diverging_epoch=(
                        (int(diverging.epoch), int(diverging.end_offset))
                        if diverging is not None and diverging.epoch >= 0
                        else None
                    ),
                    records=p.records,
                )
            )
    return partitions
