"""The log-dir APIs `kafka-log-dirs.sh` and `kafka-reassign-partitions.sh` use (docs/replication.md#log-dirs):
DescribeLogDirs and AlterReplicaLogDirs, answered as Kafka's KafkaApis does, and the task that carries out the
moves between log dirs (Kafka's ReplicaAlterLogDirsThread). The replicas' state and the moves' steps are the
core's (LogManager, ReplicaManager); the size of each log dir's file system is read here, in the shell.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Any

from tierlog.common import TopicPartition
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.security.acl import AclOperation
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.clock import now_ms
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.storage.log_manager import LogDirDescription

API_ALTER_REPLICA_LOG_DIRS = 34
API_DESCRIBE_LOG_DIRS = 35

logger = logging.getLogger(__name__)


class LogDirApis:
    def __init__(self, replica_manager: ReplicaManager, auth: AuthHelper, moves: FutureLogMover) -> None:
        self.replica_manager = replica_manager
        self.auth = auth
        self._moves = moves
        self.handlers = {
            API_DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs,
            API_ALTER_REPLICA_LOG_DIRS: self.handle_alter_replica_log_dirs,
        }

    async def handle_alter_replica_log_dirs(self, request: Request) -> Any:
        """Kafka's handleAlterReplicaLogDirsRequest: ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED for
        every partition as the request names them (its getErrorResponse). A partition named twice takes the
        last dir named, and is answered once, its topic's partitions together."""
        s = response_schema(request.api_key, request.api_version)
        if not self.auth.authorize_cluster(AclOperation.ALTER):
            refused = error_code("CLUSTER_AUTHORIZATION_FAILED")
            return s.AlterReplicaLogDirsResponse(
                throttle_time=NO_THROTTLE,
                results=tuple(
                    s.AlterReplicaLogDirTopicResult(
                        topic_name=topic.name,
                        partitions=tuple(
                            s.AlterReplicaLogDirPartitionResult(partition_index=index, error_code=refused)
                            for index in topic.partitions
                        ),
                    )
                    for log_dir in request.body.dirs
                    for topic in log_dir.topics
                ),
            )
        partition_dirs = {
            TopicPartition(topic.name, index): log_dir.path
            for log_dir in request.body.dirs
            for topic in log_dir.topics
            for index in topic.partitions
        }
        errors = self.replica_manager.alter_replica_log_dirs(partition_dirs, now_ms())
        self._moves.wake()
        by_topic: dict[str, list[Any]] = {}
        for tp, error in errors.items():
            by_topic.setdefault(tp.topic, []).append(
                s.AlterReplicaLogDirPartitionResult(partition_index=tp.partition, error_code=error_code(error))
            )
        return s.AlterReplicaLogDirsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                s.AlterReplicaLogDirTopicResult(topic_name=topic, partitions=tuple(partitions))
                for topic, partitions in by_topic.items()
            ),
        )

    async def handle_describe_log_dirs(self, request: Request) -> Any:
        """Kafka's handleDescribeLogDirsRequest: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED with
        no log dirs (v3+ carries the error at the top; v1-2 have only the empty list)."""
        s = response_schema(request.api_key, request.api_version)
        if not self.auth.authorize_cluster(AclOperation.DESCRIBE):
            return s.DescribeLogDirsResponse(
                throttle_time=NO_THROTTLE, error_code=error_code("CLUSTER_AUTHORIZATION_FAILED"), results=()
            )
        partitions = None
        if request.body.topics is not None:
            partitions = {
                TopicPartition(topic.topic, index) for topic in request.body.topics for index in topic.partitions
            }
        results = []
        for log_dir in self.replica_manager.log_manager.describe_log_dirs(partitions):
            try:
                usage = shutil.disk_usage(log_dir.path)
            except OSError as e:
                # Kafka's offline log dir: listed with KAFKA_STORAGE_ERROR and nothing else.
                logger.warning("Unable to describe replica dirs for %s: %s", log_dir.path, e)
                results.append(
                    s.DescribeLogDirsResult(
                        error_code=error_code("KAFKA_STORAGE_ERROR"), log_dir=str(log_dir.path), topics=()
                    )
                )
                continue
            results.append(
                s.DescribeLogDirsResult(
                    error_code=error_code(None),
                    log_dir=str(log_dir.path),
                    topics=_topics(s, log_dir),
                    # Kafka's getTotalSpace and getUsableSpace (what a non-root user may still write).
                    total_bytes=usage.total,
                    usable_bytes=usage.free,
                )
            )
        return s.DescribeLogDirsResponse(throttle_time=NO_THROTTLE, error_code=error_code(None), results=tuple(results))


def _topics(s: ResponseSchema, log_dir: LogDirDescription) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = {}
    for replica in log_dir.replicas:
        by_topic.setdefault(replica.topic_partition.topic, []).append(
            s.DescribeLogDirsPartition(
                partition_index=replica.topic_partition.partition,
                partition_size=replica.size_bytes,
                offset_lag=replica.offset_lag,
                is_future_key=replica.is_future,
            )
        )
    return tuple(s.DescribeLogDirsTopic(name=topic, partitions=tuple(parts)) for topic, parts in by_topic.items())


class FutureLogMover:
    """Kafka's ReplicaAlterLogDirsThread as an asyncio task: while moves between log dirs remain, step them
    (`ReplicaManager.move_future_logs`, at most replica.fetch.max.bytes of each at a time, yielding to the event
    loop between steps); then wait until AlterReplicaLogDirs starts one."""

    def __init__(self, replica_manager: ReplicaManager, max_bytes: int, backoff_ms: int) -> None:
        self.replica_manager = replica_manager
        self._max_bytes = max_bytes
        self._backoff_s = backoff_ms / 1000
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            if not self.replica_manager.has_future_logs():
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                copied = self.replica_manager.move_future_logs(now_ms(), self._max_bytes)
            except Exception:
                # As Kafka's fetcher threads: the failure is logged and the moves are retried after a back-off.
                logger.exception("moving replicas between log dirs failed")
                copied = 0
            # Nothing copied while moves remain: a future log waiting for its partition (loaded at startup).
            await asyncio.sleep(0 if copied else self._backoff_s)
