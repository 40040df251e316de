"""The three follower stories of docs/tiered-storage.md (KIP-405's BuildingRemoteLogAuxState) on real brokers.

Each topic lives on brokers 2 and 3 (2 the preferred leader) of a three-broker cluster; node 1 is the
controller and never holds a replica, so killing a replica never takes the controller with it. Closed segments
leave the leader's disk as soon as they are copied (local.retention.bytes=1), so a follower that needs old
offsets finds them only in the remote tier and must rebuild its epoch history from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from tiered_helpers import (
    TIERING_S,
    ClusterFactory,
    consume_all,
    create_topic,
    leader_of,
    lose_replica_disk,
    produce,
    record_values,
    replica_state,
    tiered_overrides,
    tiered_topic_configs,
    wait_tiered,
)

from tierlog.testing.local_cluster import LocalCluster, wait_until

LEADER, FOLLOWER = 2, 3


def _cluster(start_cluster: ClusterFactory, tmp_path: Path) -> LocalCluster:
    return start_cluster(tiered_overrides({"rsm.config.url": f"file://{tmp_path / 'remote'}"}))


def _epoch_checkpoint(cluster: LocalCluster, node_id: int, topic: str) -> str:
    return (cluster.base_dir / f"broker-{node_id}" / f"{topic}-0" / "leader-epoch-checkpoint").read_text()


def _wait_in_sync(cluster: LocalCluster, topic: str, leader: int, follower: int) -> dict[str, Any]:
    """The follower's state once it is in the ISR with the leader's LEO and HW."""

    def in_sync() -> dict[str, Any] | None:
        lead = replica_state(cluster, leader, topic)
        follow = replica_state(cluster, follower, topic)
        if lead is None or follow is None or follower not in lead["isr"]:
            return None
        same = (follow["log_end_offset"], follow["high_watermark"]) == (lead["log_end_offset"], lead["high_watermark"])
        return follow if same else None

    return wait_until(
        in_sync,
        TIERING_S,
        lambda: (
            f"broker {follower} in sync with {leader}: {replica_state(cluster, leader, topic)} / "
            f"{replica_state(cluster, follower, topic)}"
        ),
    )


def test_seed_001_scenario_1_brand_new_follower_builds_its_state_from_the_remote_tier(
    start_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = _cluster(start_cluster, tmp_path)
    topic = "new-follower"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    lose_replica_disk(cluster, FOLLOWER, topic)
    values = record_values("new", 2000)
    produce(cluster.bootstrap, topic, values)
    leader_state = wait_tiered(cluster, LEADER, topic, local_start_above=1000)

    cluster.restart(FOLLOWER)
    follower_state = _wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    # It fetched only the leader's local data: its local log starts where (or after) the leader's did.
    assert follower_state["log_start_offset"] == 0
    assert follower_state["local_log_start_offset"] >= leader_state["local_log_start_offset"]
    assert _epoch_checkpoint(cluster, FOLLOWER, topic) == _epoch_checkpoint(cluster, LEADER, topic)

    # The rebuilt follower leads and serves the whole log, the remote part included.
    cluster.kill(LEADER)
    assert leader_of(cluster, topic) == FOLLOWER
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(values))] == values


def test_seed_001_scenario_2_out_of_sync_follower_whose_data_expired_on_the_leader(
    start_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = _cluster(start_cluster, tmp_path)
    topic = "out-of-sync"
    create_topic(cluster.bootstrap, topic, tiered_topic_configs(), assignment=[[LEADER, FOLLOWER]])
    first = record_values("first", 300)
    produce(cluster.bootstrap, topic, first)
    _wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    cluster.kill(FOLLOWER)
    second = record_values("second", 2000)
    produce(cluster.bootstrap, topic, second)
    # The leader copied and deleted locally everything the follower is missing.
    wait_tiered(cluster, LEADER, topic, local_start_above=len(first) + 100)

    cluster.restart(FOLLOWER)
    follower_state = _wait_in_sync(cluster, topic, LEADER, FOLLOWER)
    assert follower_state["log_start_offset"] == 0
    assert follower_state["local_log_start_offset"] > len(first)
    assert _epoch_checkpoint(cluster, FOLLOWER, topic) == _epoch_checkpoint(cluster, LEADER, topic)
    cluster.kill(LEADER)
    assert leader_of(cluster, topic) == FOLLOWER
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(first) + len(second))] == first + second


def test_seed_001_scenario_3_multiple_hard_failures_lose_nothing_and_leave_no_orphans(
    start_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = _cluster(start_cluster, tmp_path)
    topic = "hard-failures"
    create_topic(
        cluster.bootstrap, topic, tiered_topic_configs(**{"min.insync.replicas": "1"}), assignment=[[LEADER, FOLLOWER]]
    )
    acknowledged: list[bytes] = []
    for round_number, (crashing, surviving) in enumerate(((LEADER, FOLLOWER), (FOLLOWER, LEADER), (LEADER, FOLLOWER))):
        batch = record_values(f"round{round_number}", 800)
        produce(cluster.bootstrap, topic, batch)
        acknowledged += batch
        _wait_in_sync(cluster, topic, crashing, surviving)
        wait_tiered(cluster, crashing, topic, local_start_above=len(acknowledged) - 400)
        cluster.kill(crashing)
        assert leader_of(cluster, topic) == surviving
        cluster.restart(crashing)
        _wait_in_sync(cluster, topic, surviving, crashing)

    final_leader = leader_of(cluster, topic)
    assert [v for _, v in consume_all(cluster.bootstrap, topic, len(acknowledged))] == acknowledged
    # The last leader's epoch reaches its follower's checkpoint with the first record written in it.
    produce(cluster.bootstrap, topic, record_values("epoch-marker", 1))
    acknowledged += record_values("epoch-marker", 1)
    _wait_in_sync(cluster, topic, final_leader, LEADER if final_leader == FOLLOWER else FOLLOWER)
    assert _epoch_checkpoint(cluster, LEADER, topic) == _epoch_checkpoint(cluster, FOLLOWER, topic)

    # Everything expires: every remote object goes, duplicate copies by deposed leaders included.

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    produce(cluster.bootstrap, topic, record_values("tail", 300))  # rolls segments past the expired ones
    remote = tmp_path / "remote"

    def remote_segment_starts() -> list[int]:
        return sorted(
            int(p.name.split("-")[0]) for p in remote.rglob("*.log") if p.parent.name.startswith(f"{topic}-0")
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
