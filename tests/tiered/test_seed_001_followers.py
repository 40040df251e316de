"""The three follower stories of docs/tiered-storage.md (KIP-405's BuildingRemoteLogAuxState) on real brokers.

Each topic lives on brokers 2 and 3 (2 the preferred leader) of a three-broker cluster; node 1 is the
controller and never holds a replica, so killing a replica never takes the controller with it. Closed segments
leave the leader's disk as soon as they are copied (local.retention.bytes=1), so a follower that needs old
offsets finds them only in the remote tier and must rebuild its epoch history from there.
"""

from __future__ import annotations

from pathlib import Path

from cluster_helpers import replica_state
from tiered_helpers import (
    TIERING_S,
    alter_topic_config,
    consume_all,
    create_topic,
    leader_of,
    lose_replica_disk,
    produce,
    record_values,
    segment_start,
    tiered_topic_configs,
    wait_in_sync,
    wait_tiered,
)

from tierlog.testing.local_cluster import LocalCluster, wait_until

LEADER, FOLLOWER = 2, 3


def _epoch_checkpoint(cluster: LocalCluster, node_id: int, topic: str) -> str:
    return (cluster.base_dir / f"broker-{node_id}" / f"{topic}-0" / "leader-epoch-checkpoint").read_text()


def test_seed_001_scenario_1_brand_new_follower_builds_its_state_from_the_remote_tier(
    file_tiered_cluster: LocalCluster,
) -> None:
    cluster = file_tiered_cluster
    topic = "new-follower"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    lose_replica_disk(cluster, FOLLOWER, topic)
    values = record_values("new", 2000)
    produce(cluster.bootstrap, topic, values)
    leader_state = wait_tiered(cluster, LEADER, topic, local_start_above=1000)

    cluster.restart(FOLLOWER)
    follower_state = wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    # It fetched only the leader's local data: its local log starts where (or after) the leader's did.
    assert follower_state["log_start_offset"] == 0
    assert follower_state["local_log_start_offset"] >= leader_state["local_log_start_offset"]
    assert _epoch_checkpoint(cluster, FOLLOWER, topic) == _epoch_checkpoint(cluster, LEADER, topic)

    # The rebuilt follower leads and serves the whole log, the remote part included.
    cluster.kill(LEADER)
    assert leader_of(cluster, topic) == FOLLOWER
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(values))] == values


def test_seed_001_scenario_2_out_of_sync_follower_whose_data_expired_on_the_leader(
    file_tiered_cluster: LocalCluster,
) -> None:
    cluster = file_tiered_cluster
    topic = "out-of-sync"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    first = record_values("first", 300)
    produce(cluster.bootstrap, topic, first)
    wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    cluster.kill(FOLLOWER)
    second = record_values("second", 2000)
    produce(cluster.bootstrap, topic, second)
    # The leader copied and deleted locally everything the follower is missing.
    wait_tiered(cluster, LEADER, topic, local_start_above=len(first) + 100)

    cluster.restart(FOLLOWER)
    follower_state = wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    assert follower_state["log_start_offset"] == 0
    assert follower_state["local_log_start_offset"] > len(first)
    assert _epoch_checkpoint(cluster, FOLLOWER, topic) == _epoch_checkpoint(cluster, LEADER, topic)
    cluster.kill(LEADER)
    assert leader_of(cluster, topic) == FOLLOWER
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(first) + len(second))] == first + second


def test_seed_001_scenario_3_multiple_hard_failures_lose_nothing_and_leave_no_orphans(
    file_tiered_cluster: LocalCluster, remote_dir: Path
) -> None:
    cluster = file_tiered_cluster
    topic = "hard-failures"
    create_topic(
        cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "1"}), assignment=[[LEADER, FOLLOWER]]
    )
    acknowledged: list[bytes] = []
    for round_number, (crashing, surviving) in enumerate(((LEADER, FOLLOWER), (FOLLOWER, LEADER), (LEADER, FOLLOWER))):
        batch = record_values(f"round{round_number}", 800)
        produce(cluster.bootstrap, topic, batch)
        acknowledged += batch
        wait_in_sync(cluster, topic, crashing, surviving)
        wait_tiered(cluster, crashing, topic, local_start_above=len(acknowledged) - 400)
        cluster.kill(crashing)
        assert leader_of(cluster, topic) == surviving
        cluster.restart(crashing)
        wait_in_sync(cluster, topic, surviving, crashing)

    final_leader = leader_of(cluster, topic)
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(acknowledged))] == acknowledged
    # The last leader's epoch reaches its follower's checkpoint with the first record written in it.
    produce(cluster.bootstrap, topic, record_values("epoch-marker", 1))
    acknowledged += record_values("epoch-marker", 1)
    wait_in_sync(cluster, topic, final_leader, LEADER if final_leader == FOLLOWER else FOLLOWER)
    assert _epoch_checkpoint(cluster, LEADER, topic) == _epoch_checkpoint(cluster, FOLLOWER, topic)

    # Everything expires: every remote object goes, duplicate copies by deposed leaders included.

    alter_topic_config(cluster.bootstrap, topic, "retention.ms", "1000")
    produce(cluster.bootstrap, topic, record_values("tail", 300))  # rolls segments past the expired ones

    def remote_segment_starts() -> list[int]:
        return sorted(
            segment_start(p.name) for p in remote_dir.rglob("*.log") if p.parent.name.startswith(f"{topic}-0")
        )

    def only_recent_segments_left() -> bool:
        state = replica_state(cluster, final_leader, topic)
        expired = state is not None and state["log_start_offset"] >= len(acknowledged)
        return expired and all(start >= len(acknowledged) - 1000 for start in remote_segment_starts())

    wait_until(
        only_recent_segments_left,
        TIERING_S,
        lambda: (
            f"remote segments below {len(acknowledged) - 1000} gone: {remote_segment_starts()}, "
            f"{replica_state(cluster, final_leader, topic)}"
        ),
    )
