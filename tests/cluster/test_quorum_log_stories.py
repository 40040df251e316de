"""The Raft log stories of docs/quorum.md on real controller processes (three dedicated voters, SIGSTOP/SIGCONT):

- a deposed leader holding records that never reached a majority drops them on the new leader's diverging
  epoch (#divergence), and they never become visible;
- a voter that lost its disk starts with an empty log and cannot be elected while the others hold committed
  records (#elections): it catches up from the leader instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cluster_helpers import ClusterFactory, quorum_leader, send_request

from tierlog.client.requests import create_topics_request, metadata_request
from tierlog.records.codec import decode_batches
from tierlog.testing.local_cluster import LocalCluster, wait_until

# Bounds well above what each step takes (an election is a few seconds at Kafka's default timeouts).
ELECTION_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> LocalCluster:
    return cluster_factory(brokers=1, controllers=3)


def voters(cluster: LocalCluster) -> list[int]:
    return [node for node in cluster.node_ids if node not in cluster.broker_ids]


def metadata_log_bytes(cluster: LocalCluster, node: int) -> bytes:
    """Every segment of the node's metadata log, as on disk (the process may be running)."""
    directory = cluster.broker(node).log_dir / "__cluster_metadata-0"
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def epochs_writing(cluster: LocalCluster, node: int, text: bytes) -> list[int]:
    """The leader epochs of the batches of the node's metadata log whose records mention `text`."""
    return [
        batch.header.partition_leader_epoch
        for batch in decode_batches(metadata_log_bytes(cluster, node))
        if any(text in (record.value or b"") for record in batch.records)
    ]


def create_topic(cluster: LocalCluster, name: str, timeout_s: float = REQUEST_TIMEOUT_S) -> int | None:
    """CreateTopics through the broker (forwarded to the active controller): the topic's error code, None if no
    answer came in time."""
    request = create_topics_request(name, 1, 1, {}, timeout_ms=int(timeout_s * 1000))
    try:
        response = send_request(cluster.bootstrap, request, timeout_s=timeout_s)
    except Exception:
        return None
    return int(response.topics[0].error_code)


def topic_exists(cluster: LocalCluster, name: str) -> bool:
    response = send_request(cluster.bootstrap, metadata_request([name]), timeout_s=REQUEST_TIMEOUT_S)
    return response.topics[0].error_code == 0


def test_a_deposed_leader_drops_its_uncommitted_records_on_the_new_leaders_diverging_epoch(
    cluster: LocalCluster,
) -> None:
    found = wait_until(lambda: quorum_leader(cluster, voters(cluster)), ELECTION_TIMEOUT_S, "a quorum leader")
    old_leader, old_epoch = found
    followers = [v for v in voters(cluster) if v != old_leader]
    for follower in followers:
        cluster.pause(follower)
    # The leader appends the topic's records but no majority can take them: they are not committed in its epoch,
    # and it resigns once it hears from no majority (check quorum).
    create_topic(cluster, "doomed", timeout_s=2.0)
    assert epochs_writing(cluster, old_leader, b"doomed") == [old_epoch]
    cluster.pause(old_leader)
    for follower in followers:
        cluster.resume(follower)
    new_leader, new_epoch = wait_until(
        lambda: quorum_leader(cluster, followers), ELECTION_TIMEOUT_S, "a leader among the two voters resumed"
    )
    assert new_leader in followers and new_epoch > old_epoch
    wait_until(lambda: create_topic(cluster, "committed") == 0, ELECTION_TIMEOUT_S, "a topic created on the new leader")

    cluster.resume(old_leader)
    # The old leader fetches with its last epoch, learns where its log diverges and truncates there: its log
    # becomes the new leader's, byte for byte. (The broker may have forwarded the CreateTopics again, to the new
    # leader, which decides it afresh in its own epoch: that is a new write, not the old one kept.)
    wait_until(
        lambda: metadata_log_bytes(cluster, old_leader) == metadata_log_bytes(cluster, new_leader),
        ELECTION_TIMEOUT_S,
        "the deposed leader's log to become the new leader's",
    )
    assert old_epoch not in epochs_writing(cluster, old_leader, b"doomed")
    for voter in voters(cluster):
        assert old_epoch not in epochs_writing(cluster, voter, b"doomed")
    assert topic_exists(cluster, "committed")


def test_a_voter_that_lost_its_disk_catches_up_rather_than_leads(cluster: LocalCluster) -> None:
    leader, _ = wait_until(lambda: quorum_leader(cluster, voters(cluster)), ELECTION_TIMEOUT_S, "a quorum leader")
    assert wait_until(lambda: create_topic(cluster, "before-the-loss") == 0, ELECTION_TIMEOUT_S, "a topic")
    lost = next(v for v in voters(cluster) if v != leader)
    cluster.kill(lost)
    directory: Path = cluster.broker(lost).log_dir
    shutil.rmtree(directory / "__cluster_metadata-0")
    # The leader goes too: the voter with the empty log and the third voter are left to elect one of them.
    cluster.kill(leader)
    cluster.restart(lost)
    elected, _ = wait_until(
        lambda: quorum_leader(cluster, [v for v in voters(cluster) if v != leader]),
        ELECTION_TIMEOUT_S * 2,
        "a leader among the two voters left",
    )
    # Its empty log loses every vote to the voter holding the committed records.
    assert elected != lost
    wait_until(
        lambda: b"before-the-loss" in metadata_log_bytes(cluster, lost),
        ELECTION_TIMEOUT_S,
        "the voter that lost its disk to fetch the committed log",
    )
    assert topic_exists(cluster, "before-the-loss")
