"""KIP-320 on the broker: a client's Fetch, ListOffsets and OffsetsForLeaderEpoch carry the leader epoch it
knows, and a replica judges that epoch before anything else (Kafka's Partition.getLocalLog): older than
its own is FENCED_LEADER_EPOCH, newer is UNKNOWN_LEADER_EPOCH, and only at the same epoch (or without one)
does leadership decide. Seed 70147 of the simulator is the story: a leader cut off from the controller was
deposed without knowing it, and a consumer that had read further at the new leader asked it for more."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_helpers import TP, Cluster

from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.errors import FencedLeaderEpochError, NotLeaderOrFollowerError, UnknownLeaderEpochError
from tierlog.replication.replica_manager import FetchParams, FetchPartitionResult, PartitionFetchInfo

CONSUMER = -1


def consumer_fetch(cluster: Cluster, broker_id: int, offset: int, current_leader_epoch: int) -> FetchPartitionResult:
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(CONSUMER, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0)
    info = PartitionFetchInfo(offset, 1 << 20, current_leader_epoch)
    cluster.managers[broker_id].fetch_messages(params, [(TP, info)], cluster.now, answers.append)
    ((result,),) = answers
    return result


def deposed_leader(tmp_path: Path) -> Cluster:
    """Broker 1 led epoch 0 and holds offsets 0..1; brokers 2 and 3 heard of epoch 1 (broker 2 leading, broker 1
    out of the ISR) and broker 2 has committed offsets 2..3 since. Broker 1 never heard: it still leads epoch 0."""
    cluster = Cluster(tmp_path, [1, 2, 3])
    cluster.publish()
    cluster.produce(1, b"a", b"b", acks=1)
    for follower in (2, 3):
        cluster.fetch(follower)
    r = cluster.registration
    cluster.registration = PartitionRegistration(r.replicas, [2, 3], 2, r.leader_epoch + 1, r.partition_epoch + 1)
    for broker_id in (2, 3):
        cluster.managers[broker_id].apply_metadata(cluster.image(), cluster.now)
    cluster.produce(2, b"c", b"d", acks=1)
    cluster.fetch(3)
    cluster.fetch(3)
    assert cluster.log(2).high_watermark == 4
    assert cluster.managers[1].get_partition(TP).is_leader and cluster.log(1).log_end_offset == 2
    return cluster


def test_a_deposed_leader_refuses_a_consumer_that_knows_the_new_epoch(tmp_path: Path) -> None:
    cluster = deposed_leader(tmp_path)
    assert consumer_fetch(cluster, 2, 4, current_leader_epoch=1).error is None
    # The consumer read to offset 4 in epoch 1; the deposed leader has not heard of epoch 1, so it says so
    # instead of judging the offset by its shorter log.
    assert consumer_fetch(cluster, 1, 4, current_leader_epoch=1).error == "UNKNOWN_LEADER_EPOCH"
    # A client that sends no epoch cannot be told: it hears OFFSET_OUT_OF_RANGE, as from Kafka.
    assert consumer_fetch(cluster, 1, 4, current_leader_epoch=-1).error == "OFFSET_OUT_OF_RANGE"


def test_a_follower_judges_the_clients_epoch_before_its_own_role(tmp_path: Path) -> None:
    cluster = deposed_leader(tmp_path)
    follower = cluster.managers[3].get_partition(TP)
    assert consumer_fetch(cluster, 3, 0, current_leader_epoch=0).error == "FENCED_LEADER_EPOCH"
    assert consumer_fetch(cluster, 3, 0, current_leader_epoch=1).error == "NOT_LEADER_OR_FOLLOWER"
    assert consumer_fetch(cluster, 3, 0, current_leader_epoch=2).error == "UNKNOWN_LEADER_EPOCH"
    assert consumer_fetch(cluster, 3, 0, current_leader_epoch=-1).error == "NOT_LEADER_OR_FOLLOWER"
    with pytest.raises(UnknownLeaderEpochError):
        follower.fetch_offset_for_timestamp(-1, isolation_level=0, current_leader_epoch=2, from_consumer=True)
    with pytest.raises(FencedLeaderEpochError):
        follower.fetch_offset_for_timestamp(-1, isolation_level=0, current_leader_epoch=0, from_consumer=True)


def test_offsets_for_leader_epoch_is_answered_by_the_leader_of_the_clients_epoch_only(tmp_path: Path) -> None:
    cluster = deposed_leader(tmp_path)
    leader, follower, deposed = (cluster.managers[b].get_partition(TP) for b in (2, 3, 1))
    # Epoch 0 ends where epoch 1 began (offset 2); the latest epoch ends at the leader's LEO.
    assert leader.last_offset_for_leader_epoch(1, 0) == (0, 2)
    assert leader.last_offset_for_leader_epoch(1, 1) == (1, 4)
    assert leader.last_offset_for_leader_epoch(-1, 7) == (-1, -1)
    with pytest.raises(FencedLeaderEpochError):
        leader.last_offset_for_leader_epoch(0, 0)
    # The follower's log may lag or hold a diverging tail: it does not answer for the leader.
    with pytest.raises(NotLeaderOrFollowerError):
        follower.last_offset_for_leader_epoch(1, 0)
    with pytest.raises(UnknownLeaderEpochError):
        deposed.last_offset_for_leader_epoch(1, 0)
