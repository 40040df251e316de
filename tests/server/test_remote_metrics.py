"""The remote tier on /metrics and /v1/partitions (issue 4): the broker's wiring (server/broker_metrics.py)
read over real logs and a real remote log metadata cache, with the RemoteLogManager and the ReplicaManager
stubbed to what the wiring reads (their `stats`, `cache_of` and `partitions`)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from storage_helpers import open_log

from tierlog.common import TopicPartition
from tierlog.records.codec import build_batch
from tierlog.replication.partition import Partition
from tierlog.server.broker_metrics import describe_partitions, wire_broker_metrics
from tierlog.server.metrics import broker_metrics
from tierlog.server.remote_log_tasks import RemoteLogStats
from tierlog.storage.log import Log
from tierlog.storage.log_config import LogConfig
from tierlog.tiered.remote_log_metadata_cache import RemoteLogMetadataCache, RemoteLogMetadataStore
from tierlog.tiered.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

T0 = 1_700_000_000_000
TIERED = TopicPartition("tiered", 0)
LOCAL = TopicPartition("local", 0)
BATCH = build_batch([(b"k", b"v" * 16, (), T0)])
BATCH_BYTES = len(BATCH)


class StubRemoteLog:
    """What the wiring reads of RemoteLogTasks: its counters, its reader's and each partition's metadata cache."""

    def __init__(self, stats: RemoteLogStats) -> None:
        self.stats = stats
        self.store = RemoteLogMetadataStore()
        self.reader = SimpleNamespace(bytes_prefetched=4096, bytes_served_from_cache=3072)

    def cache_of(self, partition: Partition) -> RemoteLogMetadataCache | None:
        return self.store.cache(TopicIdPartition(partition.topic_id, partition.topic_partition))


def open_partition_log(directory: Path, tp: TopicPartition, *, remote: bool) -> Log:
    """One batch per segment, so every append rolls; a tiered log keeps only what is not yet copied."""
    props = {"segment.bytes": str(BATCH_BYTES)}
    if remote:
        props |= {"remote.storage.enable": "true", "local.retention.bytes": "1"}
    config = LogConfig.from_props(props, {})
    return open_log(directory / str(tp), config, topic_partition=tp, now_ms=T0, remote_log_enabled=remote)


def fill(log: Log, batches: int) -> None:
    for _ in range(batches):
        log.append_as_leader(bytearray(BATCH), 0, T0)
    log.update_high_watermark(log.log_end_offset)


def remote_segment(
    partition: Partition, start: int, end: int, *, finished: bool, store: RemoteLogMetadataStore
) -> None:
    segment_id = RemoteLogSegmentId(TopicIdPartition(partition.topic_id, partition.topic_partition), uuid.uuid4())
    store.apply(
        RemoteLogSegmentMetadata(segment_id, start, end, T0, 1, T0, BATCH_BYTES * (end - start + 1), ((0, start),))
    )
    if finished:
        store.apply(RemoteLogSegmentMetadataUpdate(segment_id, T0, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1))


@dataclass
class Wired:
    """Metrics wired as the broker wires them, in a registry of their own."""

    replica_manager: Any
    remote_log: Any
    registry: CollectorRegistry


def wire(replica_manager: Any, remote_log: Any) -> Wired:
    registry = CollectorRegistry()
    wire_broker_metrics(broker_metrics(registry), replica_manager, remote_log)
    return Wired(replica_manager, remote_log, registry)


@pytest.fixture
def broker(tmp_path: Path) -> Wired:
    """The wiring over two partitions. `tiered` has offsets 0..4 in five one-batch segments: 0 and 1 copied
    (Ry = 1) and deleted locally (Lx = 2, Rx = 0), 2 being copied (COPY_SEGMENT_STARTED), 3 rolled and waiting,
    4 the active segment. `local` has no remote tier."""
    tiered_log = open_partition_log(tmp_path, TIERED, remote=True)
    fill(tiered_log, 5)
    tiered_log.update_highest_offset_in_remote_storage(1)
    assert tiered_log.delete_old_segments(T0) == 2
    local_log = open_partition_log(tmp_path, LOCAL, remote=False)
    fill(local_log, 3)
    partitions = {
        tp: Partition(tp, uuid.uuid4(), log, 1, is_replica_eligible=lambda _: True)
        for tp, log in ((TIERED, tiered_log), (LOCAL, local_log))
    }
    remote_log = StubRemoteLog(RemoteLogStats(1000, 2, 1, 300, 7, 2, 4, 3))
    remote_segment(partitions[TIERED], 0, 0, finished=True, store=remote_log.store)
    remote_segment(partitions[TIERED], 1, 1, finished=True, store=remote_log.store)
    remote_segment(partitions[TIERED], 2, 2, finished=False, store=remote_log.store)

    replica_manager = SimpleNamespace(
        partitions=partitions, under_replicated_partitions=lambda: 0, isr_shrinks=0, isr_expands=0
    )
    return wire(replica_manager, remote_log)


def render(broker: Wired) -> str:
    return generate_latest(broker.registry).decode()


def samples(text: str, name: str) -> dict[str, float]:
    """topic-partition (or "" for an unlabelled sample) -> value, of metric `name`."""
    sample = re.compile(rf'{name}(?:\{{partition="([^"]*)",topic="([^"]*)"\}})? (\S+)')
    found: dict[str, float] = {}
    for line in text.splitlines():
        if match := sample.fullmatch(line):
            partition, topic, value = match.groups()
            found[f"{topic}-{partition}" if topic is not None else ""] = float(value)
    return found


def test_per_partition_tier_gauges(broker: Wired) -> None:
    text = render(broker)
    assert samples(text, "tierlog_log_start_offset") == {"tiered-0": 0, "local-0": 0}
    assert samples(text, "tierlog_local_log_start_offset") == {"tiered-0": 2, "local-0": 0}
    assert samples(text, "kafka_cluster_partition_highwatermark") == {"tiered-0": 5, "local-0": 3}
    assert samples(text, "kafka_log_log_logendoffset") == {"tiered-0": 5, "local-0": 3}
    assert samples(text, "tierlog_local_log_size_bytes") == {"tiered-0": 3 * BATCH_BYTES, "local-0": 3 * BATCH_BYTES}
    # Only partitions with the remote tier on have remote samples.
    assert samples(text, "tierlog_remote_log_end_offset") == {"tiered-0": 1}
    # Segments 0 and 1; segment 2 is still being copied.
    assert samples(text, "tierlog_remote_log_size_bytes") == {"tiered-0": 2 * BATCH_BYTES}
    # Segments 2 and 3 are rolled, below the HW and above Ry; 4 is active.
    assert samples(text, "tierlog_remote_copy_lag_bytes") == {"tiered-0": 2 * BATCH_BYTES}
    assert "# TYPE tierlog_remote_copy_lag_bytes gauge\n" in text


def test_remote_log_manager_counters(broker: Wired) -> None:
    text = render(broker)
    expected = {
        "tierlog_remote_copy_bytes_total": 1000,
        "tierlog_remote_copy_segments_total": 2,
        "tierlog_remote_copy_errors_total": 1,
        "tierlog_remote_fetch_bytes_total": 300,
        "tierlog_remote_fetch_requests_total": 7,
        "tierlog_remote_fetch_errors_total": 2,
        "tierlog_remote_delete_segments_total": 4,
        "tierlog_remote_delete_errors_total": 3,
        "tierlog_remote_fetch_prefetch_bytes_total": 4096,
        "tierlog_remote_fetch_chunk_cache_hit_bytes_total": 3072,
    }
    for name, value in expected.items():
        assert f"# TYPE {name} counter\n" in text
        assert samples(text, name) == {"": value}, name
    # Read at every scrape: the RemoteLogManager's counts move, the next scrape shows them.
    broker.remote_log.stats.copy_bytes += 24
    assert samples(render(broker), "tierlog_remote_copy_bytes_total") == {"": 1024}


def test_without_a_remote_tier_the_counters_are_zero_and_remote_gauges_empty(broker: Wired) -> None:
    text = render(wire(broker.replica_manager, None))
    assert samples(text, "tierlog_remote_copy_bytes_total") == {"": 0}
    assert samples(text, "tierlog_remote_fetch_errors_total") == {"": 0}
    assert samples(text, "tierlog_remote_log_end_offset") == {}
    assert samples(text, "tierlog_remote_log_size_bytes") == {}
    assert samples(text, "tierlog_remote_copy_lag_bytes") == {}
    assert samples(text, "tierlog_local_log_start_offset") == {"tiered-0": 2, "local-0": 0}


def test_copy_lag_falls_as_segments_are_copied(broker: Wired) -> None:
    log = broker.replica_manager.partitions[TIERED].log
    log.update_highest_offset_in_remote_storage(2)
    assert samples(render(broker), "tierlog_remote_copy_lag_bytes") == {"tiered-0": BATCH_BYTES}
    log.update_highest_offset_in_remote_storage(3)
    assert samples(render(broker), "tierlog_remote_copy_lag_bytes") == {"tiered-0": 0}


def test_v1_partitions_reports_the_remote_tier_of_tiered_partitions(broker: Wired) -> None:
    local, tiered = describe_partitions(broker.replica_manager, broker.remote_log)  # sorted: "local" < "tiered"
    assert (local["topic"], tiered["topic"]) == ("local", "tiered")
    assert {"remote_size_bytes", "remote_segments", "copy_lag_bytes"}.isdisjoint(local)
    assert {key: tiered[key] for key in ("log_start_offset", "highest_offset_in_remote_storage")} == {
        "log_start_offset": 0,
        "highest_offset_in_remote_storage": 1,
    }
    assert (tiered["local_log_start_offset"], tiered["high_watermark"], tiered["log_end_offset"]) == (2, 5, 5)
    assert tiered["local_size_bytes"] == 3 * BATCH_BYTES
    assert tiered["remote_size_bytes"] == 2 * BATCH_BYTES
    assert tiered["remote_segments"] == 2  # the one still being copied does not count
    assert tiered["copy_lag_bytes"] == 2 * BATCH_BYTES


def test_v1_partitions_of_a_tiered_partition_with_no_remote_metadata_yet(broker: Wired, tmp_path: Path) -> None:
    fresh = TopicPartition("fresh", 0)
    log = open_partition_log(tmp_path, fresh, remote=True)
    fill(log, 2)
    broker.replica_manager.partitions[fresh] = Partition(
        fresh, uuid.uuid4(), log, 1, is_replica_eligible=lambda _: True
    )
    [status] = [s for s in describe_partitions(broker.replica_manager, broker.remote_log) if s["topic"] == "fresh"]
    assert (status["remote_size_bytes"], status["remote_segments"]) == (0, 0)
    assert status["highest_offset_in_remote_storage"] == -1
    assert status["copy_lag_bytes"] == BATCH_BYTES  # segment 0; segment 1 is active
