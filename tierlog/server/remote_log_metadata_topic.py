"""KIP-405's default RemoteLogMetadataManager: remote segment metadata kept in the internal topic
`__remote_log_metadata`, replicated like any other topic, and read back into memory by every broker.

Each broker produces its events (acks=all, to the metadata partition's leader) and consumes every
partition of the topic from the start into a RemoteLogMetadataStore. `publish` returns only once this
broker's own consumer has applied the event, so a copy task that goes on to read the store sees its own
writes (Kafka's TopicBasedRemoteLogMetadataManager waits the same way). Records are read up to the HW, so
what a broker acts on is what survives a leader change of the metadata partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tierlog.client.connection import ConnectionPool, KafkaConnectionError
from tierlog.client.requests import PartitionFetch, fetch_request, produce_request
from tierlog.client.security import PLAINTEXT, ClientSecurity
from tierlog.common import TopicPartition
from tierlog.metadata.image import ClusterMetadata
from tierlog.metadata.records import Endpoint
from tierlog.protocol.errors import error_code
from tierlog.records.codec import build_batch, decode_batches
from tierlog.server.clock import now_ms
from tierlog.tiered.remote_log_metadata_cache import (
    REMOTE_LOG_METADATA_TOPIC,
    RemoteLogMetadataStore,
    metadata_partition_for,
)
from tierlog.tiered.segment_metadata import RemoteLogMetadataEvent, decode_event, encode_event

logger = logging.getLogger(__name__)

# Kafka's rlmm.config.* names and defaults.
NUM_PARTITIONS_CONFIG = "remote.log.metadata.topic.num.partitions"
REPLICATION_FACTOR_CONFIG = "remote.log.metadata.topic.replication.factor"
RETENTION_MS_CONFIG = "remote.log.metadata.topic.retention.ms"
DEFAULTS = {NUM_PARTITIONS_CONFIG: "50", REPLICATION_FACTOR_CONFIG: "3", RETENTION_MS_CONFIG: "-1"}
_NO_ERROR = error_code(None)
_FETCH_WAIT_MS = 200
_RETRY_S = 0.1

CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[str | None]]


class RemoteLogMetadataUnavailableError(Exception):
    """The metadata topic cannot take or show the event yet (no leader, still loading). Retriable."""


class TopicBasedRemoteLogMetadataManager:
    def __init__(
        self,
        broker_id: int,
        settings: dict[str, str],
        image: Callable[[], ClusterMetadata],
        endpoint_of: Callable[[int], Endpoint | None],
        create_topic: CreateTopic,
        *,
        request_timeout_ms: int,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        values = {**DEFAULTS, **settings}
        self.num_partitions = int(values[NUM_PARTITIONS_CONFIG])
        self.replication_factor = int(values[REPLICATION_FACTOR_CONFIG])
        self._retention_ms = values[RETENTION_MS_CONFIG]
        self._broker_id = broker_id
        self._image = image
        self._endpoint_of = endpoint_of
        self._create_topic = create_topic
        self._timeout_ms = request_timeout_ms
        self._timeout_s = request_timeout_ms / 1000
        self.store = RemoteLogMetadataStore()
        # Next offset to read per metadata partition, and the HW each partition had when first read.
        self._positions: dict[int, int] = {}
        self._initial_ends: dict[int, int] = {}
        self.ready = asyncio.Event()
        self._progress = asyncio.Condition()
        self._connections = ConnectionPool(
            client_id=f"broker-{broker_id}-rlmm", security=security, connect_timeout_s=5.0
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="remote-log-metadata")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._connections.close()

    async def publish(self, event: RemoteLogMetadataEvent) -> None:
        """Append the event (acks=all) and wait until this broker's store has applied it."""
        partition = metadata_partition_for(event.segment_id.topic_id_partition, self.num_partitions)
        offset = await self._produce(partition, encode_event(event))
        async with asyncio.timeout(self._timeout_s), self._progress:
            await self._progress.wait_for(lambda: self._positions.get(partition, 0) > offset)

    async def _produce(self, partition: int, value: bytes) -> int:
        leader = self._leader_of(partition)
        body = produce_request(
            TopicPartition(REMOTE_LOG_METADATA_TOPIC, partition),
            build_batch([(None, value, (), now_ms())]),
            acks=-1,
            timeout_ms=self._timeout_ms,
        )
        response = await self._send(leader, body, self._timeout_s * 2)
        result = response.responses[0].partition_responses[0]
        if result.error_code != _NO_ERROR:
            raise RemoteLogMetadataUnavailableError(
                f"{REMOTE_LOG_METADATA_TOPIC}-{partition}: produce failed with {result.error_code.name}"
            )
        return int(result.base_offset)

    def _leader_of(self, partition: int) -> int:
        topic = self._image().topics.get(REMOTE_LOG_METADATA_TOPIC)
        registration = topic.partitions[partition] if topic is not None and partition < len(topic.partitions) else None
        if registration is None or registration.leader < 0:
            raise RemoteLogMetadataUnavailableError(f"{REMOTE_LOG_METADATA_TOPIC}-{partition} has no leader")
        return registration.leader

    async def _send(self, broker_id: int, body: Any, timeout_s: float) -> Any:
        endpoint = self._endpoint_of(broker_id)
        if endpoint is None:
            raise RemoteLogMetadataUnavailableError(f"no endpoint known for broker {broker_id}")
        return await self._connections.send(endpoint.host, endpoint.port, body, timeout_s=timeout_s)

    # Consuming

    async def _run(self) -> None:
        await self._ensure_topic()
        while True:
            try:
                await self._consume_once()
            except asyncio.CancelledError:
                raise
            except (KafkaConnectionError, RemoteLogMetadataUnavailableError, TimeoutError) as e:
                logger.debug("[RLMM broker=%d] %s", self._broker_id, e)
                await asyncio.sleep(_RETRY_S)
            except Exception:
                logger.exception("[RLMM broker=%d] unexpected error", self._broker_id)
                await asyncio.sleep(_RETRY_S)

    async def _ensure_topic(self) -> None:
        configs = {"cleanup.policy": "delete", "retention.ms": self._retention_ms}
        while REMOTE_LOG_METADATA_TOPIC not in self._image().topics:
            try:
                error = await self._create_topic(
                    REMOTE_LOG_METADATA_TOPIC, self.num_partitions, self.replication_factor, configs
                )
            except Exception as e:  # the controller may be away; Kafka retries likewise
                error = str(e)
            if error not in (None, "TOPIC_ALREADY_EXISTS"):
                logger.info(
                    "[RLMM broker=%d] cannot create %s yet: %s", self._broker_id, REMOTE_LOG_METADATA_TOPIC, error
                )
                await asyncio.sleep(1.0)
            else:
                await asyncio.sleep(_RETRY_S)

    async def _consume_once(self) -> None:
        by_leader: dict[int, list[int]] = {}
        topic = self._image().topics.get(REMOTE_LOG_METADATA_TOPIC)
        if topic is None:
            raise RemoteLogMetadataUnavailableError(f"{REMOTE_LOG_METADATA_TOPIC} is not in the metadata yet")
        for partition, registration in enumerate(topic.partitions):
            if registration.leader >= 0:
                by_leader.setdefault(registration.leader, []).append(partition)
        if not by_leader:
            raise RemoteLogMetadataUnavailableError(f"{REMOTE_LOG_METADATA_TOPIC} has no leaders yet")
        results = await asyncio.gather(
            *(self._fetch_from(leader, partitions) for leader, partitions in by_leader.items()),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if len(failures) == len(results):
            raise failures[0]

    async def _fetch_from(self, leader: int, partitions: list[int]) -> None:
        body = fetch_request(
            [
                PartitionFetch(TopicPartition(REMOTE_LOG_METADATA_TOPIC, p), self._positions.get(p, 0), 4 << 20)
                for p in partitions
            ],
            max_wait_ms=_FETCH_WAIT_MS,
            max_bytes=16 << 20,
        )
        response = await self._send(leader, body, self._timeout_s + _FETCH_WAIT_MS / 1000)
        for topic in response.responses:
            for p in topic.partitions:
                if p.error_code != _NO_ERROR:
                    # Leadership moving (retried next round); OFFSET_OUT_OF_RANGE would mean someone shortened
                    # the topic's retention (-1 by default), which loses metadata: say so.
                    if p.error_code == error_code("OFFSET_OUT_OF_RANGE"):
                        logger.error(
                            "[RLMM] %s-%d lost records below our position", REMOTE_LOG_METADATA_TOPIC, p.partition_index
                        )
                    continue
                await self._apply(p.partition_index, p.records or b"", int(p.high_watermark))

    async def _apply(self, partition: int, records: bytes | memoryview, high_watermark: int) -> None:
        position = self._positions.get(partition, 0)
        for batch in decode_batches(records):
            for record in batch.records:
                if record.offset < position or record.value is None:
                    continue
                try:
                    self.store.apply(decode_event(record.value))
                except (ValueError, KeyError, TypeError) as e:
                    logger.warning(
                        "[RLMM] skipping malformed record %s-%d@%d: %s",
                        REMOTE_LOG_METADATA_TOPIC,
                        partition,
                        record.offset,
                        e,
                    )
                position = record.offset + 1
        self._initial_ends.setdefault(partition, high_watermark)
        async with self._progress:
            self._positions[partition] = position
            self._progress.notify_all()
        if not self.ready.is_set() and self._caught_up():
            self.ready.set()
            logger.info(
                "[RLMM broker=%d] loaded remote log metadata from %s", self._broker_id, REMOTE_LOG_METADATA_TOPIC
            )

    def _caught_up(self) -> bool:
        if len(self._initial_ends) < self.num_partitions:
            return False
        return all(self._positions.get(p, 0) >= end for p, end in self._initial_ends.items())
