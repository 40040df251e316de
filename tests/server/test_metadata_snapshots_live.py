"""Metadata snapshots in running nodes (docs/quorum.md#snapshots): with a tiny
metadata.log.max.record.bytes.between.snapshots every controller writes `.checkpoint` files as topics are created
and its log starts at the latest one, so a broker that fetches the metadata log from the start loads the leader's
snapshot (FetchSnapshot) and a voter whose disk was wiped catches up from it."""

from __future__ import annotations

import shutil
from pathlib import Path

from cluster_helpers import ClusterFactory
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.raft.snapshot import parse_snapshot_file_name
from tierlog.testing.local_cluster import FIRST_DEDICATED_CONTROLLER_ID, LocalCluster, wait_until

TIMEOUT_S = 60.0
TOPICS = [f"snapshotted-{i}" for i in range(40)]
CONTROLLER_IDS = [FIRST_DEDICATED_CONTROLLER_ID + i for i in range(3)]


def snapshot_offsets(directory: Path) -> list[int]:
    """The end offsets of the `.checkpoint` files of a node's metadata log."""
    found = (parse_snapshot_file_name(path.name) for path in (directory / "__cluster_metadata-0").glob("*.checkpoint"))
    return sorted(snapshot_id.offset for snapshot_id in found if snapshot_id is not None)


def active_controller(cluster: LocalCluster) -> int | None:
    """The controller whose log says it became the active one last."""
    latest: tuple[str, int] | None = None
    for node_id in CONTROLLER_IDS:
        for line in cluster.broker(node_id).log_file.read_text().splitlines():
            if "active in epoch" in line and (latest is None or line[:25] > latest[0]):
                latest = (line[:25], node_id)
    return None if latest is None else latest[1]


def topics_seen_by(cluster: LocalCluster, node_id: int) -> set[str]:
    admin = AdminClient({"bootstrap.servers": cluster.broker(node_id).bootstrap})
    return set(admin.list_topics(timeout=5).topics)


def test_a_restarted_broker_and_a_wiped_voter_catch_up_from_the_controllers_snapshots(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory({"metadata.log.max.record.bytes.between.snapshots": "4096"}, brokers=2, controllers=3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 3, 2) for topic in TOPICS]).values():
        future.result(timeout=TIMEOUT_S)

    # Every voter, leader or follower, snapshotted its committed log, and only the latest snapshot is kept.
    for node_id in CONTROLLER_IDS:
        directory = cluster.broker(node_id).log_dir
        wait_until(lambda directory=directory: snapshot_offsets(directory), TIMEOUT_S, f"a snapshot on {node_id}")
        assert len(snapshot_offsets(directory)) == 1, snapshot_offsets(directory)
        assert (
            f"[Controller id={node_id}] wrote the metadata snapshot at offset"
            in cluster.broker(node_id).log_file.read_text()
        )

    # A broker fetches the metadata log from offset 0 when it starts; the log starts later now, so it is answered
    # with the leader's snapshot.
    cluster.restart(2)
    wait_until(lambda: set(TOPICS) <= topics_seen_by(cluster, 2), TIMEOUT_S, "broker 2 to see every topic")
    assert "[Broker id=2] loaded the metadata snapshot at offset" in cluster.broker(2).log_file.read_text()

    # A voter that lost its disk fetches the leader's snapshot (its own log cannot be replayed from the leader's).
    active = wait_until(lambda: active_controller(cluster), TIMEOUT_S, "an active controller")
    wiped_id = next(node_id for node_id in CONTROLLER_IDS if node_id != active)
    wiped = cluster.broker(wiped_id)
    wiped.stop()
    leader_snapshot = snapshot_offsets(cluster.broker(active).log_dir)[-1]
    shutil.rmtree(wiped.log_dir)
    wiped.start()
    wiped.wait_ready(TIMEOUT_S)
    wait_until(
        lambda: any(offset >= leader_snapshot for offset in snapshot_offsets(wiped.log_dir)),
        TIMEOUT_S,
        f"voter {wiped_id} to hold the leader's snapshot at offset {leader_snapshot}",
    )
    # It follows again: a topic created now reaches every broker through a quorum it is part of.
    admin.create_topics([NewTopic("after-the-wipe", 1, 2)])["after-the-wipe"].result(timeout=TIMEOUT_S)
    wait_until(lambda: "after-the-wipe" in topics_seen_by(cluster, 1), TIMEOUT_S, "broker 1 to see the new topic")


def test_the_broker_on_a_voters_node_loads_its_own_snapshot(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(
        {"metadata.log.max.record.bytes.between.snapshots": "4096"}, brokers=3, controllers=3, combined=True
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1) for topic in TOPICS]).values():
        future.result(timeout=TIMEOUT_S)
    wait_until(lambda: snapshot_offsets(cluster.broker(2).log_dir), TIMEOUT_S, "a snapshot on node 2")

    # Restarted, node 2's log starts at its snapshot; its broker side reads that snapshot, then the log after it.
    cluster.restart(2)
    wait_until(lambda: set(TOPICS) <= topics_seen_by(cluster, 2), TIMEOUT_S, "broker 2 to see every topic")
    assert "[Broker id=2] loaded the metadata snapshot at offset" in cluster.broker(2).log_file.read_text()
