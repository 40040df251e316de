"""A transaction's offsets across a failover of the group's coordinator: the broker that took a TxnOffsetCommit
is killed -9 before the transaction ends; the replica that becomes the leader of the group's __consumer_offsets
partition loads the producer's transactional batch as pending (require_stable answers UNSTABLE_OFFSET_COMMIT,
the previous offset stays the committed one), and the COMMIT marker the transaction coordinator then writes to
it makes the offset committed (docs/transactions.md#offsets-load).

Requests are raw kio entities on tierlog's client connection, sent to the broker that must answer them.
"""

from __future__ import annotations

from cluster_helpers import send_request
from group_helpers import OFFSETS_TOPIC, REBALANCE_S, create_topic, group_coordinated_by, offsets_partition, unique
from kio.schema.errors import ErrorCode

from tierlog.client.requests import (
    COORDINATOR_KEY_GROUP,
    TxnMarker,
    find_coordinator_request,
    request_schema,
    write_txn_markers_request,
)
from tierlog.common import TopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until

TIMEOUT_S = 20.0
RESTART_S = 60.0
PRODUCER_ID = 6000


def coordinator_of(cluster: LocalCluster, group: str) -> int | None:
    """The node FindCoordinator (asked of node 1, never killed) names for `group`, None while there is none."""
    request = find_coordinator_request(group, COORDINATOR_KEY_GROUP)
    (found,) = send_request(cluster.broker(1).bootstrap, request).coordinators
    return int(found.node_id) if found.error_code == ErrorCode.none else None


def commit(cluster: LocalCluster, node: int, group: str, topic: str, offset: int, producer_id: int = -1) -> ErrorCode:
    """TxnOffsetCommit of `producer_id`, or a plain OffsetCommit when it is -1."""
    if producer_id < 0:
        s = request_schema(8, 8)
        partition = s.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
        )
        request = s.OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=(s.OffsetCommitRequestTopic(name=topic, partitions=(partition,)),),
        )
    else:
        s = request_schema(28, 3)
        request = s.TxnOffsetCommitRequest(
            transactional_id="txn-failover",
            group_id=group,
            producer_id=producer_id,
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                s.TxnOffsetCommitRequestTopic(
                    name=topic,
                    partitions=(
                        s.TxnOffsetCommitRequestPartition(
                            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        )
    ((answer,),) = [t.partitions for t in send_request(cluster.broker(node).bootstrap, request).topics]
    return ErrorCode(answer.error_code)


def fetch(cluster: LocalCluster, node: int, group: str, topic: str, require_stable: bool) -> tuple[ErrorCode, int]:
    """(the group's error, else the partition's error, and the offset) from `node`."""
    s = request_schema(9, 8)
    request = s.OffsetFetchRequest(
        groups=(
            s.OffsetFetchRequestGroup(
                group_id=group, topics=(s.OffsetFetchRequestTopics(name=topic, partition_indexes=(0,)),)
            ),
        ),
        require_stable=require_stable,
    )
    (answer,) = send_request(cluster.broker(node).bootstrap, request).groups
    if answer.error_code != ErrorCode.none:
        return ErrorCode(answer.error_code), -1
    ((partition,),) = [t.partitions for t in answer.topics]
    return ErrorCode(partition.error_code), partition.committed_offset


def write_commit_marker(cluster: LocalCluster, node: int, group: str) -> ErrorCode:
    marker = TxnMarker(
        PRODUCER_ID,
        0,
        committed=True,
        coordinator_epoch=0,
        partitions=[TopicPartition(OFFSETS_TOPIC, offsets_partition(group))],
    )
    request = write_txn_markers_request([marker])
    (marker,) = send_request(cluster.broker(node).bootstrap, request).markers
    ((answer,),) = [t.partitions for t in marker.topics]
    return ErrorCode(answer.error_code)


def test_a_transaction_s_offsets_survive_the_coordinator_s_kill_and_its_marker_commits_them(
    cluster: LocalCluster,
) -> None:
    group, coordinator = group_coordinated_by(cluster, {2, 3}, "txn-failover")
    topic = unique("txn-failover")
    create_topic(cluster.bootstrap, topic, partitions=1)
    assert commit(cluster, coordinator, group, topic, 5) == ErrorCode.none
    assert commit(cluster, coordinator, group, topic, 42, PRODUCER_ID) == ErrorCode.none
    assert fetch(cluster, coordinator, group, topic, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)

    cluster.broker(coordinator).kill()
    try:
        new_coordinator = wait_until(
            lambda: (n := coordinator_of(cluster, group)) not in (None, coordinator) and n,
            REBALANCE_S,
            f"a new coordinator for {group} after node {coordinator} was killed",
        )
        # Once loaded, the new coordinator holds the transaction pending, as the old one did.
        wait_until(
            lambda: (
                fetch(cluster, new_coordinator, group, topic, require_stable=True)[0]
                not in (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator)
            ),
            REBALANCE_S,
            f"node {new_coordinator} loading {group}",
        )
        assert fetch(cluster, new_coordinator, group, topic, True) == (ErrorCode.unstable_offset_commit, -1)
        assert fetch(cluster, new_coordinator, group, topic, False) == (ErrorCode.none, 5)
        assert write_commit_marker(cluster, new_coordinator, group) == ErrorCode.none
        assert fetch(cluster, new_coordinator, group, topic, True) == (ErrorCode.none, 42)
    finally:
        killed = cluster.broker(coordinator)
        killed.start()
        killed.wait_ready(RESTART_S)
        cluster.wait_for_brokers(3, timeout_s=RESTART_S)
