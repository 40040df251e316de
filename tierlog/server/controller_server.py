"""The controller's shell on a `process.roles=broker,controller` node: the metadata log, the session timer,
and the controller APIs brokers call (BrokerRegistration, BrokerHeartbeat, AlterPartition,
AllocateProducerIds, Fetch of `__cluster_metadata`).

The rules live in `tierlog.controller.controller.Controller`, and brokers' metadata fetches wait on the
`WakingMetadataLog` (both in controller/); this module only turns requests into calls on them, arms the timers
of parked fetches, and fences brokers whose session ran out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tierlog.config import KafkaConfig
from tierlog.controller.controller import Controller, ControllerConfig
from tierlog.controller.metadata_log import METADATA_TOPIC, DiskMetadataLog, WakingMetadataLog
from tierlog.metadata.records import Endpoint, MetadataRecord
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.replication.replica_manager import error_name_of
from tierlog.server.clock import now_ms
from tierlog.server.entities import NO_THROTTLE, response_schema
from tierlog.storage.file_records import FileSlice

logger = logging.getLogger(__name__)

API_ALTER_PARTITION = 56
API_BROKER_REGISTRATION = 62
API_BROKER_HEARTBEAT = 63
API_ALLOCATE_PRODUCER_IDS = 67
CONTROLLER_APIS = (API_ALTER_PARTITION, API_BROKER_REGISTRATION, API_BROKER_HEARTBEAT, API_ALLOCATE_PRODUCER_IDS)


class ControllerServer:
    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._session_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.metadata_log = WakingMetadataLog(DiskMetadataLog(self.config.metadata_log_dir))
        self.controller = Controller(
            self.metadata_log,
            ControllerConfig(
                session_timeout_ms=self.config.get_int("broker.session.timeout.ms"),
                unclean_leader_election_enable=self.config.get_bool("unclean.leader.election.enable"),
                remote_storage_system_enable=self.config.remote_storage_system_enable,
            ),
            now_ms(),
        )
        self._session_task = asyncio.create_task(self._expire_sessions(), name="controller-sessions")
        logger.info(
            "[Controller id=%d] started: metadata log at offset %d, cluster id %s",
            self.config.node_id,
            self.metadata_log.end_offset,
            self.controller.metadata.cluster_id,
        )

    async def stop(self) -> None:
        if self._session_task is None:
            return  # never started (the broker failed before)
        self._session_task.cancel()
        await asyncio.gather(self._session_task, return_exceptions=True)
        # Parked metadata fetches are answered now rather than when their wait would end.
        self.metadata_log.expire(2**63 - 1)
        self.metadata_log.close()

    async def _expire_sessions(self) -> None:
        """Fence brokers when their sessions run out. Heartbeats only push deadlines later and a new session
        ends a whole timeout from now, so sleeping until the earliest deadline known now misses none."""
        timeout_ms = self.config.get_int("broker.session.timeout.ms")
        while True:
            deadline = self.controller.next_session_deadline_ms()
            delay_ms = timeout_ms if deadline is None else deadline - now_ms()
            await asyncio.sleep(max(delay_ms, 1) / 1000)
            try:
                fenced = self.controller.fence_stale_brokers(now_ms())
            except Exception:
                logger.exception("[Controller id=%d] fencing stale brokers failed", self.config.node_id)
                continue
            if fenced:
                logger.info(
                    "[Controller id=%d] fenced brokers %s: no heartbeat within the session", self.config.node_id, fenced
                )

    # The metadata log, for brokers on this node (in-process) and elsewhere (Fetch).

    async def wait_for_records(self, offset: int, max_wait_ms: int) -> None:
        """Return when the log holds `offset`, or after `max_wait_ms`."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def on_ready() -> None:
            if not ready.done():
                ready.set_result(None)

        deadline = self.metadata_log.wait_for_records(offset, max_wait_ms, now_ms(), on_ready)
        if deadline is not None:
            # The event loop's clock and the wall clock may disagree by a millisecond: expire at the deadline.
            loop.call_later(
                max(0, deadline - now_ms()) / 1000, lambda: self.metadata_log.expire(max(now_ms(), deadline))
            )
        await ready

    async def fetch_records(self, offset: int, max_wait_ms: int) -> tuple[list[tuple[int, MetadataRecord]], int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.records_from(offset), self.metadata_log.end_offset

    async def read_metadata_log(self, offset: int, max_bytes: int, max_wait_ms: int) -> tuple[FileSlice | None, int]:
        await self.wait_for_records(offset, max_wait_ms)
        return self.metadata_log.read(offset, max_bytes), self.metadata_log.end_offset

    def is_metadata_fetch(self, request: Request) -> bool:
        return any(_fetch_topic_name(t) == METADATA_TOPIC for t in request.body.topics)

    # Controller APIs

    async def handle(self, request: Request) -> Any:
        handler = {
            API_BROKER_REGISTRATION: self._broker_registration,
            API_BROKER_HEARTBEAT: self._broker_heartbeat,
            API_ALTER_PARTITION: self._alter_partition,
            API_ALLOCATE_PRODUCER_IDS: self._allocate_producer_ids,
        }[request.api_key]
        return handler(request)

    def _broker_registration(self, request: Request) -> Any:
        s = response_schema(request.api_key, request.api_version)
        body = request.body
        try:
            broker_epoch = self.controller.register_broker(
                body.broker_id,
                str(body.incarnation_id),
                body.cluster_id,
                [Endpoint(listener.name, listener.host, listener.port) for listener in body.listeners],
                body.rack,
                now_ms(),
            )
            error = None
        except Exception as e:
            broker_epoch, error = -1, error_name_of(e)
            logger.warning(
                "[Controller id=%d] refused registration of broker %d: %s", self.config.node_id, body.broker_id, e
            )
        return s.BrokerRegistrationResponse(
            throttle_time=NO_THROTTLE, error_code=error_code(error), broker_epoch=broker_epoch
        )

    def _broker_heartbeat(self, request: Request) -> Any:
        s = response_schema(request.api_key, request.api_version)
        body = request.body
        try:
            result = self.controller.heartbeat(
                body.broker_id,
                body.broker_epoch,
                body.current_metadata_offset,
                body.want_fence,
                body.want_shut_down,
                now_ms(),
            )
        except Exception as e:
            return s.BrokerHeartbeatResponse(
                throttle_time=NO_THROTTLE,
                error_code=error_code(error_name_of(e)),
                is_caught_up=False,
                is_fenced=True,
                should_shut_down=False,
            )
        return s.BrokerHeartbeatResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            is_caught_up=result.is_caught_up,
            is_fenced=result.is_fenced,
            should_shut_down=result.should_shut_down,
        )

    def _alter_partition(self, request: Request) -> Any:
        s = response_schema(request.api_key, request.api_version)
        body = request.body
        topics = []
        for topic in body.topics:
            partitions = []
            for p in topic.partitions:
                new_isr = [b.broker_id for b in p.new_isr_with_epochs]
                try:
                    registration = self.controller.alter_partition(
                        body.broker_id,
                        body.broker_epoch,
                        topic.topic_id,
                        p.partition_index,
                        p.leader_epoch,
                        p.partition_epoch,
                        new_isr,
                    )
                except Exception as e:
                    partitions.append(
                        s.PartitionData(
                            partition_index=p.partition_index,
                            error_code=error_code(error_name_of(e)),
                            leader_id=-1,
                            leader_epoch=-1,
                            isr=(),
                            leader_recovery_state=0,
                            partition_epoch=-1,
                        )
                    )
                    continue
                partitions.append(
                    s.PartitionData(
                        partition_index=p.partition_index,
                        error_code=error_code(None),
                        leader_id=registration.leader,
                        leader_epoch=registration.leader_epoch,
                        isr=tuple(registration.isr),
                        leader_recovery_state=0,
                        partition_epoch=registration.partition_epoch,
                    )
                )
            topics.append(s.TopicData(topic_id=topic.topic_id, partitions=tuple(partitions)))
        return s.AlterPartitionResponse(throttle_time=NO_THROTTLE, error_code=error_code(None), topics=tuple(topics))

    def _allocate_producer_ids(self, request: Request) -> Any:
        s = response_schema(request.api_key, request.api_version)
        block = self.controller.allocate_producer_id_block(request.body.broker_id)
        return s.AllocateProducerIdsResponse(
            throttle_time=NO_THROTTLE,
            error_code=error_code(None),
            producer_id_start=block.start,
            producer_id_len=len(block),
        )


def _fetch_topic_name(fetch_topic: Any) -> str | None:
    return getattr(fetch_topic, "topic", None)
