"""What the broker shows of its replicas: the callbacks of its metrics (read at every scrape of /metrics) and
the replicas' status on /v1/partitions, both read from the ReplicaManager and, with the remote tier on,
the RemoteLogManager (`RemoteLogTasks`)."""

from __future__ import annotations

from collections.abc import Callable

from tierlog.replication.partition import Partition
from tierlog.replication.replica_manager import ReplicaManager
from tierlog.server.clock import now_ms
from tierlog.server.metrics import BrokerMetrics
from tierlog.server.remote_log_tasks import RemoteLogStats, RemoteLogTasks
from tierlog.tiered.remote_log_manager import copy_lag_bytes
from tierlog.tiered.segment_metadata import RemoteLogSegmentState

Samples = Callable[[], list[tuple[dict[str, str], float]]]


def wire_broker_metrics(metrics: BrokerMetrics, rm: ReplicaManager, remote_log: RemoteLogTasks | None) -> None:
    """Point the callbacks of `metrics` at the state the broker keeps anyway."""
    metrics.under_replicated_partitions.callback(lambda: rm.under_replicated_partitions())
    metrics.isr_shrinks_total.callback(lambda: rm.isr_shrinks)
    metrics.isr_expands_total.callback(lambda: rm.isr_expands)
    metrics.leader_replication_byte_rate.callback(lambda: rm.leader_quota.byte_rate(now_ms()))
    metrics.follower_replication_byte_rate.callback(lambda: rm.follower_quota.byte_rate(now_ms()))

    def per_partition(value: Callable[[Partition], int]) -> Samples:
        return lambda: [
            ({"topic": tp.topic, "partition": str(tp.partition)}, float(value(p)))
            for tp, p in list(rm.partitions.items())
        ]

    metrics.partition_high_watermark.callback(per_partition(lambda p: p.log.high_watermark))
    metrics.partition_log_end_offset.callback(per_partition(lambda p: p.log.log_end_offset))
    metrics.partition_hw_lag.callback(per_partition(lambda p: p.log.log_end_offset - p.log.high_watermark))
    metrics.partition_log_start_offset.callback(per_partition(lambda p: p.log.log_start_offset))
    metrics.partition_local_log_start_offset.callback(per_partition(lambda p: p.log.local_log_start_offset))
    metrics.partition_local_log_size_bytes.callback(per_partition(lambda p: p.log.size_in_bytes))

    # The remote tier: without one its partition gauges have no samples and its counters stay 0.
    def per_tiered_partition(value: Callable[[Partition, RemoteLogTasks], int]) -> Samples:
        def samples() -> list[tuple[dict[str, str], float]]:
            if remote_log is None:
                return []
            return [
                ({"topic": tp.topic, "partition": str(tp.partition)}, float(value(p, remote_log)))
                for tp, p in list(rm.partitions.items())
                if p.log.remote_log_enabled
            ]

        return samples

    def remote_size(partition: Partition, tasks: RemoteLogTasks) -> int:
        cache = tasks.cache_of(partition)
        return cache.remote_size_in_bytes if cache is not None else 0

    metrics.partition_remote_log_end_offset.callback(
        per_tiered_partition(lambda p, _: p.log.highest_offset_in_remote_storage)
    )
    metrics.partition_remote_log_size_bytes.callback(per_tiered_partition(remote_size))
    metrics.partition_remote_copy_lag_bytes.callback(per_tiered_partition(lambda p, _: copy_lag_bytes(p.log)))

    def remote_stat(value: Callable[[RemoteLogStats], int]) -> Callable[[], float]:
        return lambda: float(value(remote_log.stats)) if remote_log is not None else 0.0

    metrics.remote_copy_bytes_total.callback(remote_stat(lambda s: s.copy_bytes))
    metrics.remote_copy_segments_total.callback(remote_stat(lambda s: s.copy_segments))
    metrics.remote_copy_errors_total.callback(remote_stat(lambda s: s.copy_errors))
    metrics.remote_fetch_bytes_total.callback(remote_stat(lambda s: s.fetch_bytes))
    metrics.remote_fetch_requests_total.callback(remote_stat(lambda s: s.fetch_requests))
    metrics.remote_fetch_errors_total.callback(remote_stat(lambda s: s.fetch_errors))
    metrics.remote_fetch_prefetch_bytes_total.callback(
        lambda: float(remote_log.reader.bytes_prefetched) if remote_log is not None else 0.0
    )
    metrics.remote_fetch_chunk_cache_hit_bytes_total.callback(
        lambda: float(remote_log.reader.bytes_served_from_cache) if remote_log is not None else 0.0
    )
    metrics.remote_delete_segments_total.callback(remote_stat(lambda s: s.delete_segments))
    metrics.remote_delete_errors_total.callback(remote_stat(lambda s: s.delete_errors))


def describe_partitions(rm: ReplicaManager, remote_log: RemoteLogTasks | None) -> list[dict[str, object]]:
    """GET /v1/partitions: each replica as Partition.describe() has it and, where the remote tier is on for
    it, that tier: remote_size_bytes and remote_segments (COPY_SEGMENT_FINISHED, as this broker's remote
    log metadata has them) and copy_lag_bytes (rolled local segments below the HW above Ry)."""
    described = []
    for tp in sorted(rm.partitions):
        partition = rm.partitions[tp]
        status = partition.describe()
        if remote_log is not None and partition.log.remote_log_enabled:
            cache = remote_log.cache_of(partition)
            segments = cache.list_remote_log_segments() if cache is not None else []
            status["remote_size_bytes"] = cache.remote_size_in_bytes if cache is not None else 0
            status["remote_segments"] = sum(
                1 for s in segments if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
            )
            status["copy_lag_bytes"] = copy_lag_bytes(partition.log)
        described.append(status)
    return described
