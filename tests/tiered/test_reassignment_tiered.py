"""A replica that a reassignment adds to a tiered partition starts from the leader's local log start
(BuildingRemoteLogAuxState, docs/tiered-storage.md), never copying the part in the remote tier, and serves the
whole log once it leads (docs/reassignment.md#tiered-partitions). The remote tier is SeaweedFS's S3."""

from __future__ import annotations

from typing import Any

from cluster_helpers import replica_state, send_request
from kio.schema.errors import ErrorCode
from tiered_helpers import (
    TIERING_S,
    consume_all,
    create_topic,
    produce,
    record_values,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.client.requests import alter_partition_reassignments_request, list_partition_reassignments_request
from tierlog.common import TopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until

OLD, NEW = 2, 3


def test_a_replica_added_to_a_tiered_partition_starts_at_the_leaders_local_log_start(
    s3_tiered_cluster: LocalCluster,
) -> None:
    cluster = s3_tiered_cluster
    topic = "moved-tiered"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[OLD]])
    values = record_values("moved", 2000)
    produce(cluster.bootstrap, topic, values)
    # Every closed segment copied and gone from OLD's disk: its local log is the active segment alone.
    before = wait_tiered(cluster, OLD, topic, local_start_above=1000, settled=True)

    tp = TopicPartition(topic, 0)
    answer = send_request(
        cluster.broker(NEW).bootstrap, alter_partition_reassignments_request({tp: [NEW]}, timeout_ms=30_000)
    )
    assert answer.error_code == ErrorCode.none
    assert [(p.partition_index, p.error_code) for t in answer.responses for p in t.partitions] == [(0, ErrorCode.none)]

    def leading_on_new() -> dict[str, Any] | None:
        state = replica_state(cluster, NEW, topic)
        return state if state is not None and state["role"] == "leader" and state["isr"] == [NEW] else None

    after = wait_until(leading_on_new, TIERING_S, lambda: f"broker {NEW} leading: {replica_state(cluster, NEW, topic)}")
    # The new replica fetched only what the leader had locally: the remote part stayed remote.
    assert after["local_log_start_offset"] == before["local_log_start_offset"] > 0
    assert after["log_start_offset"] == 0
    assert after["log_end_offset"] == before["log_end_offset"] == len(values)
    listed = send_request(cluster.broker(OLD).bootstrap, list_partition_reassignments_request(None, timeout_ms=30_000))
    assert listed.error_code == ErrorCode.none and listed.topics == ()
    # The old replica is deleted (renamed `-delete` at once, removed log.segment.delete.delay.ms later).
    wait_until(
        lambda: not (cluster.base_dir / f"broker-{OLD}" / f"{topic}-0").exists(),
        TIERING_S,
        lambda: f"broker {OLD}'s directory of {topic}-0 deleted",
    )
    assert list((cluster.base_dir / f"broker-{OLD}").glob(f"{topic}-0.*-delete"))
    # The new leader serves the whole log, the remote part included.
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(values))] == values
