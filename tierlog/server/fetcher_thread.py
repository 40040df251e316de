"""Kafka's ReplicaFetcherThread as an asyncio task: moves bytes between a leader broker and the
deterministic `ReplicaFetcher` that decides what to fetch, what to truncate and what to append.

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
from tierlog.common import TopicPartition
from tierlog.metadata.records import Endpoint
from tierlog.protocol.errors import error_code
from tierlog.replication.fetcher import FetchRequestData, FetchResponsePartition, ReplicaFetcher
from tierlog.server.clock import now_ms

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
EARLIEST_LOCAL_TIMESTAMP = -4

# (partition, leader epoch, offset) -> (end offset of the remote segment holding it, epoch history to there,
# the producer snapshot taken at its end if the remote tier has one).
RemoteLogAuxState = Callable[[TopicPartition, int, int], Awaitable[tuple[int, list[tuple[int, int]], bytes | None]]]
IDLE_POLL_S = 0.1
_NO_ERROR = error_code(None)


class FetcherThread:
    def __init__(
        self,
        fetcher: ReplicaFetcher,
        leader_endpoint: Callable[[int], Endpoint | None],
        *,
        client_id: str,
        request_timeout_ms: int,
        remote_log_aux_state: RemoteLogAuxState | None = None,
    ) -> None:
        self.fetcher = fetcher
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
        for tp in self.fetcher.offset_lookups():
            await self._reset_offsets(tp)
        for tp in self.fetcher.remote_aux_state_builds():
            if not self.fetcher.is_delayed(tp, now_ms()):
                await self._build_remote_log_aux_state(tp)
        request = self.fetcher.build_fetch_request(now_ms())
        if request is None:
            await self._idle()
            return
        connection = await self._connect()
        response = await connection.send(
            self._fetch_request(request), timeout_s=self._timeout_s + request.max_wait_ms / 1000
        )
        if response.error_code != _NO_ERROR:
            raise KafkaConnectionError(f"fetch failed: {response.error_code.name}")
        self.fetcher.process_fetch_response(_response_partitions(response), now_ms())

    async def _idle(self) -> None:
        wake_at = self.fetcher.next_wakeup_ms()
        delay = IDLE_POLL_S if wake_at is None else max(0.0, min(IDLE_POLL_S, (wake_at - now_ms()) / 1000))
        self.wakeup.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
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
                endpoint.host, endpoint.port, client_id=self._client_id, timeout_s=min(self._timeout_s, 5.0)
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
        )

    async def _build_remote_log_aux_state(self, tp: TopicPartition) -> None:
        """BuildingRemoteLogAuxState (docs/tiered-storage.md#follower-rebuild): the leader's earliest local
        offset L and its epoch e (ListOffsets -4), the epoch of L - 1 (OffsetForLeaderEpoch e - 1 tells whether
        L - 1 still belongs to an earlier epoch), then the remote segment holding L - 1 and its epoch history."""
        if self._remote_log_aux_state is None:
            self.fetcher.on_remote_log_aux_state_failed(tp, "this broker has no remote tier configured", now_ms())
            return
        offsets = await self._list_offsets(tp, (EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP))
        if offsets is None:
            return
        (local_start, local_start_epoch), (log_start, _) = offsets
        previous_offset = local_start - 1
        target_epoch = local_start_epoch
        if local_start_epoch > 0:
            earlier = await self._epoch_end_offset(tp, local_start_epoch - 1)
            if earlier is None:
                return
            earlier_epoch, earlier_end = earlier
            # Epoch e - 1 may have no records (a gap): the answer names the epoch that really holds L - 1.
            if earlier_end > previous_offset:
                target_epoch = earlier_epoch
        try:
            end_offset, epochs, producer_snapshot = await self._remote_log_aux_state(tp, target_epoch, previous_offset)
        except Exception as e:
            self.fetcher.on_remote_log_aux_state_failed(tp, str(e), now_ms())
            return
        logger.info(
            "[ReplicaFetcher leader=%d] %s: built remote log state up to %d (leader log start %d, local start %d)",
            self.fetcher.source_broker_id,
            tp,
            end_offset,
            log_start,
            local_start,
        )
        self.fetcher.on_remote_log_aux_state(tp, end_offset + 1, log_start, epochs, now_ms(), producer_snapshot)

    async def _list_offsets(self, tp: TopicPartition, timestamps: tuple[int, ...]) -> list[tuple[int, int]] | None:
        """(offset, leader epoch) per timestamp from the leader, asking as a replica; None after an error."""
        connection = await self._connect()
        answers = []
        for timestamp in timestamps:
            request = list_offsets_request(tp, timestamp, replica_id=self.fetcher.config.replica_id)
            response = await connection.send(request, timeout_s=self._timeout_s)
            partition = response.topics[0].partitions[0]
            if partition.error_code != _NO_ERROR:
                logger.info(
                    "[ReplicaFetcher leader=%d] %s: ListOffsets failed with %s",
                    self.fetcher.source_broker_id,
                    tp,
                    partition.error_code.name,
                )
                self.fetcher.on_fetch_failed(now_ms())
                return None
            answers.append((int(partition.offset), int(partition.leader_epoch)))
        return answers

    async def _epoch_end_offset(self, tp: TopicPartition, epoch: int) -> tuple[int, int] | None:
        request = offset_for_leader_epoch_request(tp, epoch, replica_id=self.fetcher.config.replica_id)
        connection = await self._connect()
        response = await connection.send(request, timeout_s=self._timeout_s)
        answer = response.topics[0].partitions[0]
        if answer.error_code != _NO_ERROR:
            self.fetcher.on_remote_log_aux_state_failed(tp, f"OffsetForLeaderEpoch: {answer.error_code.name}", now_ms())
            return None
        return int(answer.leader_epoch), int(answer.end_offset)

    async def _reset_offsets(self, tp: TopicPartition) -> None:
        """OFFSET_OUT_OF_RANGE: ask the leader for its log start and end (ListOffsets as a replica, so the
        end is its LEO, not its HW) and let the fetcher decide where to restart."""
        offsets = await self._list_offsets(tp, (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP))
        if offsets is not None:
            self.fetcher.on_leader_offsets(tp, offsets[0][0], offsets[1][0], now_ms())


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
