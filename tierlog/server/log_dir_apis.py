"""The log-dir APIs `kafka-log-dirs.sh` and `kafka-reassign-partitions.sh` use (docs/replication.md#log-dirs):
DescribeLogDirs and AlterReplicaLogDirs, answered as Kafka's KafkaApis does. The replicas' state comes from the
core (LogManager, ReplicaManager); the size of each log dir's file system is read here, in the shell.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from tierlog.common import TopicPartition
from tierlog.protocol.codec import Request
from tierlog.protocol.errors import error_code
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.security.acl import AclOperation
from tierlog.server.auth_helper import AuthHelper
from tierlog.server.entities import NO_THROTTLE, ResponseSchema, response_schema
from tierlog.storage.log_manager import LogDirDescription

API_DESCRIBE_LOG_DIRS = 35

logger = logging.getLogger(__name__)


class LogDirApis:
    def __init__(self, replica_manager: ReplicaManager, auth: AuthHelper) -> None:
        self.replica_manager = replica_manager
        self.auth = auth
        self.handlers = {API_DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs}

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
