"""ISR membership (docs/replication.md#isr-shrink, #isr-expand), min.insync.replicas, acks=all produces
waiting for the HW (#acks-all), and the fetchers the ReplicaManager keeps per leader broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_helpers import NOW, TOPIC_ID, TP, Cluster, batch, caught_up_pair, count_reads, single_topic_image

from tierlog.common import TopicPartition
from tierlog.metadata.image import PartitionRegistration
from tierlog.replication.partition import AlterPartitionProposal, Partition
from tierlog.replication.replica_manager import (
    AppendResult,
    FetchParams,
    FetchPartitionResult,
    PartitionFetchInfo,
    ReplicaManager,
)
from tierlog.replication.trace import ISR_EXPAND, ISR_SHRINK
from tierlog.storage.log_manager import LogManager

LAG = 30_000


def test_lagging_follower_is_shrunk_out_only_once_the_controller_commits(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    leader = cluster.managers[1]
    partition = leader.get_partition(TP)
    cluster.produce(1, b"m1", acks=1)
    # Behind, but caught up within replica.lag.time.max.ms of its last fetch at the LEO: nothing to do yet.
    caught_up_ms = partition.remote_replicas[2].last_caught_up_time_ms
    assert leader.maybe_shrink_isr(caught_up_ms + LAG) == 0
    cluster.now = caught_up_ms + LAG + 1
    assert leader.maybe_shrink_isr(cluster.now) == 1
    assert leader.maybe_shrink_isr(cluster.now) == 0  # one proposal in flight at a time
    # Until committed, the follower still holds the HW back.
    assert partition.isr == [1, 2] and partition.maximal_isr == [1, 2]
    assert cluster.log(1).high_watermark == 1
    assert leader.under_replicated_partitions() == 0
    cluster.commit_alter_partition(1)
    assert leader.take_alter_partition_proposals() == []
    assert partition.isr == [1]
    assert cluster.log(1).high_watermark == 2
    assert (leader.isr_shrinks, leader.isr_expands) == (1, 0)
    assert leader.under_replicated_partitions() == 1
    assert ("ISR", ISR_SHRINK, [1, 2], [1]) in cluster.trace()


def test_follower_that_catches_up_rejoins_and_counts_for_the_hw_at_once(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1])
    cluster.publish()
    leader = cluster.managers[1]
    partition = leader.get_partition(TP)
    cluster.produce(1, b"m0", b"m1", acks=1)
    assert cluster.log(1).high_watermark == 2
    cluster.fetch(2)  # fetch offset 0 < HW 2: not yet
    assert partition.maximal_isr == [1]
    cluster.produce(1, b"m2", acks=1)
    assert cluster.log(1).high_watermark == 3
    cluster.fetch(2)  # fetch offset 2 < HW 3 (the leader went on): not yet
    assert partition.maximal_isr == [1]
    cluster.fetch(2)  # fetch offset 3 >= HW 3
    assert partition.isr == [1] and partition.maximal_isr == [1, 2]
    # The expansion in flight already holds the HW back for the joining follower.
    cluster.produce(1, b"m3", acks=1)
    assert cluster.log(1).high_watermark == 3
    cluster.commit_alter_partition(1)
    assert partition.isr == [1, 2]
    assert (leader.isr_shrinks, leader.isr_expands) == (0, 1)
    assert ("ISR", ISR_EXPAND, [1], [1, 2]) in cluster.trace()
    cluster.fetch(2)
    cluster.fetch(2)
    assert cluster.log(1).high_watermark == cluster.log(2).high_watermark == 4


def proposed_expansion(root: Path) -> tuple[Cluster, AlterPartitionProposal]:
    """Leader 1 with follower 2 outside the ISR, on an empty log: 2's first fetch is at the LEO, so the leader
    proposes the ISR [1, 2]. The cluster and that proposal, taken from the leader and not answered yet."""
    cluster = Cluster(root, [1, 2], isr=[1])
    cluster.publish()
    cluster.fetch(2)
    (proposal,) = cluster.managers[1].take_alter_partition_proposals()
    return cluster, proposal


def test_alter_partition_answer_over_the_wire_leaves_the_replica_set_alone(tmp_path: Path) -> None:
    cluster, proposal = proposed_expansion(tmp_path)
    leader = cluster.managers[1]
    partition = leader.get_partition(TP)
    # The AlterPartition response carries ISR and epochs only (QuorumControllerChannel leaves replicas empty).
    r = cluster.registration
    answer = PartitionRegistration([], proposal.new_isr, r.leader, r.leader_epoch, r.partition_epoch + 1)
    leader.on_alter_partition_response(TP, answer, None, cluster.now)
    assert (partition.replicas, partition.isr, partition.partition_epoch) == ([1, 2], [1, 2], 1)
    assert set(partition.remote_replicas) == {2}
    cluster.produce(1, b"m0", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    assert cluster.log(1).high_watermark == 1


def test_follower_behind_the_start_of_the_leader_epoch_cannot_rejoin(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path, configs={"min.insync.replicas": "2"})
    cluster.produce(1, b"m1", b"m2", acks=1)
    # The controller drops the follower from the ISR and bumps the leader epoch (LEO 3); with the ISR
    # below min.insync.replicas the HW stays at 1.
    cluster.elect(1, [1])
    partition = cluster.managers[1].get_partition(TP)
    assert cluster.log(1).high_watermark == 1
    cluster.fetch(2)  # at offset 1 >= HW, but below 3 where epoch 1 starts
    assert partition.maximal_isr == [1]
    cluster.fetch(2)  # at offset 3
    assert partition.maximal_isr == [1, 2]
    cluster.commit_alter_partition(1)
    assert cluster.log(1).high_watermark == 3


def test_new_leader_epoch_does_not_wait_for_a_follower_outside_the_isr_that_stopped_fetching(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2, 3])
    cluster.publish()
    cluster.produce(1, b"m0", acks=1)
    for follower in (2, 3, 2, 3):
        cluster.fetch(follower)
    assert cluster.log(1).high_watermark == 1
    # Broker 3 stops fetching (still registered and unfenced); the leader starts a new epoch without it.
    cluster.elect(1, [1, 2])
    partition = cluster.managers[1].get_partition(TP)
    assert {b: s.log_end_offset for b, s in partition.remote_replicas.items()} == {2: -1, 3: -1}
    cluster.produce(1, b"m1", acks=1)
    cluster.fetch(2)
    cluster.fetch(2)
    # Only the ISR member holds the HW: broker 3's LEO is unknown, and it was not caught up in this epoch.
    assert cluster.log(1).high_watermark == 2


def test_only_a_registered_unfenced_broker_not_shutting_down_is_proposed_into_the_isr(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1])
    broker = cluster.brokers.pop(2)
    cluster.publish()
    partition = cluster.managers[1].get_partition(TP)
    cluster.fetch(2)  # unknown to the metadata image
    assert partition.maximal_isr == [1]
    cluster.brokers[2] = broker
    broker.fenced = True
    cluster.publish()
    cluster.fetch(2)
    assert partition.maximal_isr == [1]
    broker.fenced, broker.in_controlled_shutdown = False, True
    cluster.publish()
    cluster.fetch(2)
    assert partition.maximal_isr == [1]
    broker.in_controlled_shutdown = False
    cluster.publish()
    cluster.fetch(2)
    assert partition.maximal_isr == [1, 2]


def test_refused_alter_partition_is_dropped_and_proposed_again(tmp_path: Path) -> None:
    cluster, proposal = proposed_expansion(tmp_path)
    leader = cluster.managers[1]
    partition = leader.get_partition(TP)
    assert proposal.new_isr == [1, 2]
    leader.on_alter_partition_response(TP, None, "INELIGIBLE_REPLICA", cluster.now)
    assert partition.maximal_isr == [1]
    cluster.fetch(2)
    assert len(leader.take_alter_partition_proposals()) == 1
    # A controller holding a newer state: wait for it to arrive as metadata.
    leader.on_alter_partition_response(TP, None, "INVALID_UPDATE_VERSION", cluster.now)
    assert partition.alter_partition_in_flight
    cluster.fetch(2)
    assert leader.take_alter_partition_proposals() == []
    cluster.registration.isr = [1, 2]
    cluster.registration.partition_epoch += 1
    cluster.publish()
    assert partition.isr == [1, 2] and not partition.alter_partition_in_flight


def test_acks_all_is_refused_below_min_insync_replicas_and_hw_waits(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1], configs={"min.insync.replicas": "2"})
    cluster.publish()
    answers, delayed = cluster.produce(1, b"a", acks=-1)
    assert delayed is None and answers[0][TP].error == "NOT_ENOUGH_REPLICAS"
    assert cluster.log(1).log_end_offset == 0
    answers, _ = cluster.produce(1, b"a", acks=1)
    assert answers[0][TP].error is None
    # acks=1 is written, but not committed while the ISR is below min.insync.replicas.
    assert cluster.log(1).high_watermark == 0


def test_not_enough_replicas_after_append_when_the_hw_passes_with_too_small_an_isr(tmp_path: Path) -> None:
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    log = log_manager.get_or_create_log(TP, TOPIC_ID, {"min.insync.replicas": "2"}, NOW)
    partition = Partition(TP, TOPIC_ID, log, 1, is_replica_eligible=lambda broker_id: True)
    partition.make_leader(PartitionRegistration([1], [1], 1), NOW)
    partition.append_records_to_leader(batch(b"a"), 1, NOW)
    # One replica: the HW rule needs min(2, 1) members, so HW moves, but the ISR is below the minimum.
    assert partition.check_enough_replicas_reached(1) == (True, "NOT_ENOUGH_REPLICAS_AFTER_APPEND")
    assert partition.check_enough_replicas_reached(2) == (False, None)


def test_acks_all_produce_completes_when_the_follower_moves_the_hw(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    answers, delayed = cluster.produce(1, b"a", b"b", acks=-1)
    assert answers == [] and delayed is not None
    cluster.fetch(2)
    assert answers == []
    cluster.fetch(2)
    ((result,),) = [list(a.values()) for a in answers]
    assert result.error is None and result.info is not None and result.info.first_offset == 1
    cluster.advance(60_000)
    assert len(answers) == 1


def test_consumer_fetch_waits_for_the_hw_and_is_not_reread_for_appends_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = caught_up_pair(tmp_path)
    leader = cluster.managers[1]
    reads = count_reads(leader.get_partition(TP), monkeypatch)
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0)
    assert leader.fetch_messages(params, [(TP, PartitionFetchInfo(1, 1 << 20))], cluster.now, answers.append)
    cluster.produce(1, b"m1", acks=1)
    assert answers == [] and reads == [(-1, 1)]  # above the HW: nothing a consumer may read yet
    cluster.fetch(2)
    cluster.fetch(2)  # the follower's second fetch moves the HW to 2
    ((result,),) = answers
    assert result.read is not None and result.read.size > 0 and result.read.high_watermark == 2
    assert [offset for replica_id, offset in reads if replica_id == -1] == [1, 1]


def test_acks_all_produce_times_out_without_the_follower(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    answers, delayed = cluster.produce(1, b"a", acks=-1, timeout_ms=5_000)
    assert delayed is not None and delayed.deadline_ms == cluster.now + 5_000
    cluster.advance(4_999)
    assert answers == []
    cluster.advance(1)
    assert answers[0][TP].error == "REQUEST_TIMED_OUT"
    assert cluster.log(1).log_end_offset == 2  # written, only not acknowledged


def test_waiting_produce_answers_not_leader_when_leadership_moves(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    answers, _ = cluster.produce(1, b"a", acks=-1)
    cluster.elect(2, [1, 2])
    assert answers[0][TP].error == "NOT_LEADER_OR_FOLLOWER"


def test_single_replica_acks_all_answers_at_once(tmp_path: Path) -> None:
    log_manager = LogManager([tmp_path], {})
    log_manager.startup({}, NOW)
    manager = ReplicaManager(1, log_manager)
    manager.apply_metadata(single_topic_image(PartitionRegistration([1], [1], 1)), NOW)
    answers: list[dict[TopicPartition, AppendResult]] = []
    assert manager.append_records({TP: batch(b"a")}, -1, 30_000, NOW, answers.append) is None
    assert len(answers) == 1


def test_fetchers_follow_leadership(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2, 3])
    cluster.publish()
    assert set(cluster.managers[2].fetchers) == {1}
    assert set(cluster.managers[1].fetchers) == set()
    cluster.elect(3, [1, 2, 3])
    assert set(cluster.managers[2].fetchers) == {3}
    assert set(cluster.managers[1].fetchers) == {3}
    assert set(cluster.managers[3].fetchers) == set()
    assert cluster.managers[2].fetchers[3].partitions[TP].current_leader_epoch == 1
    # Offline (no eligible leader): nobody fetches.
    cluster.elect(-1, [3])
    assert all(not m.fetchers for m in cluster.managers.values())
    status = {d["role"] for m in cluster.managers.values() for d in m.describe_partitions()}
    assert status == {"follower"}


def test_describe_shows_the_leader_view_of_its_followers(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path)
    (leader_status,) = cluster.managers[1].describe_partitions()
    assert leader_status["role"] == "leader"
    assert leader_status["isr"] == [1, 2] and leader_status["high_watermark"] == 1
    assert leader_status["remote_replicas"] == {"2": {"log_end_offset": 1, "last_caught_up_time_ms": NOW}}
    (follower_status,) = cluster.managers[2].describe_partitions()
    assert follower_status["role"] == "follower" and "remote_replicas" not in follower_status
    assert follower_status["leader"] == 1 and follower_status["log_end_offset"] == 1


def test_an_expansion_committed_in_a_newer_leader_epoch_keeps_the_hw_waiting_until_the_metadata_comes(
    tmp_path: Path,
) -> None:
    """The controller committed the leader's ISR expansion and with it completed a reassignment that removed a
    replica, bumping the leader epoch. The answer cannot be taken up before that epoch's metadata, but the joining
    follower is in the committed ISR: the HW must not pass it meanwhile, or electing it loses committed records
    (simulator seed 207903 with --brokers 4 --reassign)."""
    cluster, proposal = proposed_expansion(tmp_path)
    leader = cluster.managers[1]
    partition = leader.get_partition(TP)
    r = cluster.registration
    answer = PartitionRegistration([], proposal.new_isr, r.leader, r.leader_epoch + 1, r.partition_epoch + 1)
    leader.on_alter_partition_response(TP, answer, None, cluster.now)
    assert partition.isr == [1] and partition.maximal_isr == [1, 2]
    cluster.produce(1, b"m0", acks=1)
    assert cluster.log(1).high_watermark == 0
