"""Tiered storage end to end on a real three-broker cluster (docs/tiered-storage.md, KIP-405): closed segments
move to the remote tier and leave the brokers' disks, yet every client reads the whole log from offset 0,
ListOffsets gives Kafka's answers for -2/-4/-5/-1 and timestamps, and all of it survives restarts."""

from __future__ import annotations

import time
from pathlib import Path

from tiered_helpers import (
    CLIENT_TIMEOUT_S,
    EARLIEST,
    EARLIEST_LOCAL,
    LATEST,
    LATEST_TIERED,
    consume_all,
    create_topic,
    leader_of,
    list_offsets,
    produce,
    record_values,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.testing.local_cluster import LocalCluster

RECORDS = 3000


def test_segments_move_to_the_remote_tier_and_every_record_reads_back_from_offset_0(
    file_tiered_cluster: LocalCluster, remote_dir: Path
) -> None:
    cluster = file_tiered_cluster
    topic = "tiered"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "2"}))
    base_ts = int(time.time() * 1000) - RECORDS
    timestamps = [base_ts + i for i in range(RECORDS)]
    values = record_values("record", RECORDS)
    produce(cluster.bootstrap, topic, values, timestamps=timestamps)

    leader = leader_of(cluster, topic)
    state = wait_tiered(cluster, leader, topic, local_start_above=RECORDS // 2)
    local_start = state["local_log_start_offset"]
    assert state["log_start_offset"] == 0
    assert state["highest_offset_in_remote_storage"] >= local_start - 1
    assert any(remote_dir.rglob("*.log")), "no segment object in the remote tier"

    records = consume_all(cluster.bootstrap, topic, RECORDS)
    assert [offset for offset, _ in records] == list(range(RECORDS))
    assert [value for _, value in records] == values

    leader_address = cluster.broker(leader).bootstrap
    assert list_offsets(leader_address, topic, EARLIEST)[:2] == (0, 0)
    error, earliest_local, _ = list_offsets(leader_address, topic, EARLIEST_LOCAL)
    assert error == 0 and earliest_local >= local_start
    error, latest_tiered, _ = list_offsets(leader_address, topic, LATEST_TIERED)
    assert error == 0 and earliest_local - 1 <= latest_tiered < RECORDS
    assert list_offsets(leader_address, topic, LATEST)[:2] == (0, RECORDS)
    # Timestamps in the remote tier, at the boundary and in the local tier.
    for target in (5, local_start - 1, RECORDS - 3):
        assert list_offsets(leader_address, topic, timestamps[target])[:2] == (0, target)

    cluster.stop(timeout_s=CLIENT_TIMEOUT_S)
    cluster.start()
    records = consume_all(cluster.bootstrap, topic, RECORDS)
    assert [value for _, value in records] == values
