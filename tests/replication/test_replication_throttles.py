"""Replication throttles (docs/replication.md#throttles, Kafka's KIP-73): the windowed rate of the
ReplicationQuotaManager, the throttled-replicas configs, a leader answering a throttled follower no records
while its quota is exceeded, and a follower leaving a throttled partition out of its Fetch. No clock: time is
the cluster's `now`."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_helpers import NOW, TP, Cluster, caught_up_pair

from tierlog.common import Idle, TopicPartition
from tierlog.config_def import ConfigException
from tierlog.replication.fetcher import IDLE_POLL_MS, FetcherConfig
from tierlog.replication.replica_manager import FetchParams, FetchPartitionResult, PartitionFetchInfo
from tierlog.replication.replication_quota import (
    UNLIMITED_RATE,
    ReplicationQuotaConfig,
    ReplicationQuotaManager,
    WindowedRate,
)
from tierlog.storage.log_config import ALL_REPLICAS, throttled_partitions_of, validate_topic_config

LEADER_THROTTLED = {"leader.replication.throttled.replicas": "0:1"}
FOLLOWER_THROTTLED = {"follower.replication.throttled.replicas": "*"}


def test_rate_is_the_windowed_sum_over_the_time_since_the_oldest_sample_never_less_than_one_sample() -> None:
    rate = WindowedRate(window_num=11, window_ms=1000)
    assert rate.measure(NOW) == 0
    rate.record(1000, NOW)
    # The first sample counts as a whole window, so a first burst is not an enormous rate.
    assert rate.measure(NOW) == 1000
    assert rate.measure(NOW + 500) == 1000
    assert rate.measure(NOW + 2000) == 500
    for second in range(1, 21):
        rate.record(1000, NOW + second * 1000)
    # Samples of seconds 10..20 are in the window (11 of them, 11000 bytes), the oldest started at second 10.
    assert rate.measure(NOW + 20_000) == pytest.approx(11_000 / 10)
    assert rate.measure(NOW + 20_500) == pytest.approx(11_000 / 10.5)
    # A sample with no event for the whole window (11 s) no longer counts.
    assert rate.measure(NOW + 31_000) == 0


def test_quota_is_exceeded_only_above_its_rate_and_never_when_unlimited() -> None:
    quota = ReplicationQuotaManager(ReplicationQuotaConfig(), 1, "leader.replication.throttled.replicas")
    assert quota.bytes_per_second == UNLIMITED_RATE
    quota.record(10**12, NOW)
    assert not quota.is_quota_exceeded(NOW)
    quota = ReplicationQuotaManager(ReplicationQuotaConfig(), 1, "leader.replication.throttled.replicas")
    quota.update_quota(1000)
    quota.record(1000, NOW)
    assert not quota.is_quota_exceeded(NOW)  # equal to the bound is fine (Kafka's Quota.upperBound)
    quota.record(1, NOW)
    assert quota.is_quota_exceeded(NOW)
    assert not quota.is_quota_exceeded(NOW + 2000)  # 1001 bytes over two seconds
    assert quota.byte_rate(NOW + 2000) == pytest.approx(500.5)


def test_a_shorter_window_forgets_sooner() -> None:
    quota = ReplicationQuotaManager(ReplicationQuotaConfig(window_num=2, window_size_seconds=1), 1, "x")
    quota.update_quota(100)
    quota.record(1000, NOW)
    assert quota.is_quota_exceeded(NOW + 1999)
    assert not quota.is_quota_exceeded(NOW + 2000)


@pytest.mark.parametrize("value", ["", "*", " * ", "0:1", "0:1,1:2", "0:1, 12:3", "0:1,,1:2"])
def test_throttled_replicas_accept_kafkas_forms(value: str) -> None:
    validate_topic_config("leader.replication.throttled.replicas", value)
    validate_topic_config("follower.replication.throttled.replicas", value)


@pytest.mark.parametrize("value", ["0", "a:1", "0:1:2", "*,0:1", "0:-1", "all", "0;1"])
def test_throttled_replicas_refuse_anything_else_with_kafkas_message(value: str) -> None:
    with pytest.raises(ConfigException) as refused:
        validate_topic_config("follower.replication.throttled.replicas", value)
    assert str(refused.value) == (
        f"Invalid value {value} for configuration follower.replication.throttled.replicas: must be the literal "
        "'*' or a list of replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."
    )


def test_throttled_partitions_are_the_entries_naming_this_broker_or_all() -> None:
    assert throttled_partitions_of("*", 1) == ALL_REPLICAS
    assert throttled_partitions_of("0:1, 1:2,2:1", 1) == {0, 2}
    assert throttled_partitions_of("0:1,1:2", 3) == frozenset()
    quota = ReplicationQuotaManager(ReplicationQuotaConfig(), 2, "follower.replication.throttled.replicas")
    quota.update_throttled_partitions(
        {
            "a": {"follower.replication.throttled.replicas": "0:1,1:2"},
            "b": {"follower.replication.throttled.replicas": "*"},
            "c": {"leader.replication.throttled.replicas": "*"},
        }
    )
    throttled = [tp for tp in [TopicPartition(t, p) for t in "abc" for p in range(3)] if quota.is_throttled(tp)]
    assert throttled == [TopicPartition("a", 1), TopicPartition("b", 0), TopicPartition("b", 1), TopicPartition("b", 2)]
    # A topic whose config is removed (or that is deleted) is no longer throttled.
    quota.update_throttled_partitions({"a": {}, "b": {"follower.replication.throttled.replicas": "*"}})
    assert not quota.is_throttled(TopicPartition("a", 1)) and quota.is_throttled(TopicPartition("b", 0))


def follower_fetch(cluster: Cluster, leader: int, follower: int, fetch_offset: int) -> FetchPartitionResult:
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(follower, 0, 1, 1 << 20, 0)
    cluster.managers[leader].fetch_messages(
        params, [(TP, PartitionFetchInfo(fetch_offset, 1 << 20))], cluster.now, answers.append
    )
    ((result,),) = answers
    return result


def test_leader_answers_a_throttled_follower_outside_the_isr_no_records_while_its_quota_is_exceeded(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1], configs=LEADER_THROTTLED)
    cluster.publish()
    leader = cluster.managers[1]
    leader.leader_quota.update_quota(100)
    cluster.produce(1, b"a" * 200, acks=1)
    cluster.produce(1, b"b" * 200, acks=1)
    first = follower_fetch(cluster, 1, 2, 0)
    # Not exceeded yet: the records go, and are counted.
    assert first.read is not None and first.read.size > 200
    assert leader.leader_quota.byte_rate(cluster.now) == first.read.size
    throttled = follower_fetch(cluster, 1, 2, 1)
    assert throttled.error is None and throttled.read is not None
    assert throttled.read.records is None and throttled.read.size == 0
    assert (throttled.read.high_watermark, throttled.read.log_end_offset) == (2, 2)
    # Its position is still recorded on the leader.
    assert leader.get_partition(TP).remote_replicas[2].log_end_offset == 1
    # A consumer is never throttled.
    answers: list[list[FetchPartitionResult]] = []
    leader.fetch_messages(
        FetchParams(-1, 0, 1, 1 << 20, 0), [(TP, PartitionFetchInfo(1, 1 << 20))], cluster.now, answers.append
    )
    assert answers[0][0].read is not None and answers[0][0].read.size > 0
    # Once the rate falls under the quota (the window moves on), the follower gets its records again.
    cluster.now += 11_000
    again = follower_fetch(cluster, 1, 2, 1)
    assert again.read is not None and again.read.size > 200


def test_leader_throttles_only_the_replicas_it_is_told_to(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1], configs={"leader.replication.throttled.replicas": "0:2"})
    cluster.publish()
    leader = cluster.managers[1]
    leader.leader_quota.update_quota(0)
    leader.leader_quota.record(1, cluster.now)
    cluster.produce(1, b"a", acks=1)
    # 0:2 names the replica on broker 2, not this leader's (broker 1): nothing is throttled here.
    read = follower_fetch(cluster, 1, 2, 0).read
    assert read is not None and read.size > 0
    assert leader.leader_quota.byte_rate(cluster.now) == 1  # and unthrottled bytes are not counted


def test_leader_never_throttles_a_follower_in_the_isr_but_counts_its_bytes(tmp_path: Path) -> None:
    cluster = caught_up_pair(tmp_path, configs=LEADER_THROTTLED)
    leader = cluster.managers[1]
    leader.leader_quota.update_quota(0)
    leader.leader_quota.record(1, cluster.now)
    assert leader.leader_quota.is_quota_exceeded(cluster.now)
    counted = leader.leader_quota.byte_rate(cluster.now)
    cluster.produce(1, b"m1", acks=-1)
    (response,) = cluster.fetch(2)
    assert response.records
    assert leader.leader_quota.byte_rate(cluster.now) == counted + len(response.records)
    cluster.fetch(2)
    assert cluster.log(1).high_watermark == 2 and leader.get_partition(TP).isr == [1, 2]


def test_a_parked_fetch_of_a_throttled_partition_is_not_completed_by_new_records(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, [1, 2], isr=[1], configs=LEADER_THROTTLED)
    cluster.publish()
    leader = cluster.managers[1]
    leader.leader_quota.update_quota(0)
    leader.leader_quota.record(1, cluster.now)
    answers: list[list[FetchPartitionResult]] = []
    params = FetchParams(2, 500, 1, 1 << 20, 0)
    assert leader.fetch_messages(params, [(TP, PartitionFetchInfo(0, 1 << 20))], cluster.now, answers.append)
    cluster.produce(1, b"a", acks=1)
    assert not answers
    cluster.advance(500)
    ((result,),) = answers
    assert result.read is not None and result.read.size == 0 and result.read.log_end_offset == 1


def lagging_follower(tmp_path: Path, batches: int) -> Cluster:
    """Leader 1 (ISR [1]) holding `batches` one-record batches, follower 2 fetching one batch per Fetch."""
    cluster = Cluster(tmp_path, [1, 2], isr=[1], configs=FOLLOWER_THROTTLED)
    cluster.managers[2].fetcher_config = FetcherConfig(replica_id=2, partition_max_bytes=1)
    cluster.publish()
    for i in range(batches):
        cluster.produce(1, b"x" * 100 + bytes([i]), acks=1)
    return cluster


def test_follower_leaves_a_throttled_partition_behind_the_hw_out_of_its_fetch_while_its_quota_is_exceeded(
    tmp_path: Path,
) -> None:
    cluster = lagging_follower(tmp_path, 3)
    follower = cluster.managers[2]
    follower.follower_quota.update_quota(100)
    ((_, fetcher),) = follower.fetchers.items()
    (response,) = cluster.fetch(2)
    assert response.records is not None
    assert follower.follower_quota.byte_rate(cluster.now) == len(response.records)
    # One batch of three fetched: 2 behind the leader's HW, and the quota (100 B/s) is exceeded.
    assert cluster.log(2).log_end_offset == 1 and fetcher.partitions[TP].lag == 2
    assert fetcher.build_fetch_request(cluster.now) is None
    assert fetcher.poll(cluster.now) == Idle(cluster.now + IDLE_POLL_MS)
    # The window moves on: fetching again.
    cluster.now += 11_000
    request = fetcher.build_fetch_request(cluster.now)
    assert request is not None and [p.topic_partition for p in request.partitions] == [TP]


def test_follower_that_reached_the_hw_is_never_throttled(tmp_path: Path) -> None:
    cluster = lagging_follower(tmp_path, 1)
    follower = cluster.managers[2]
    ((_, fetcher),) = follower.fetchers.items()
    cluster.fetch(2)
    assert fetcher.partitions[TP].lag == 0 and fetcher.partitions[TP].is_replica_in_sync
    follower.follower_quota.update_quota(0)
    follower.follower_quota.record(1, cluster.now)
    assert follower.follower_quota.is_quota_exceeded(cluster.now)
    assert fetcher.build_fetch_request(cluster.now) is not None


def test_follower_fetches_unthrottled_partitions_whatever_the_quota(tmp_path: Path) -> None:
    cluster = lagging_follower(tmp_path, 3)
    follower = cluster.managers[2]
    cluster.configs = {}
    cluster.publish()
    follower.follower_quota.update_quota(0)
    follower.follower_quota.record(1, cluster.now)
    for expected_end in (1, 2, 3):
        cluster.fetch(2)
        assert cluster.log(2).log_end_offset == expected_end
    assert follower.follower_quota.byte_rate(cluster.now) == 1


def test_follower_already_at_the_hw_is_in_sync_after_an_answer_without_records(tmp_path: Path) -> None:
    """Kafka sets the lag from every answer: a follower that restarts with everything is never held back, though no
    record has come since."""
    cluster = lagging_follower(tmp_path, 0)
    follower = cluster.managers[2]
    ((_, fetcher),) = follower.fetchers.items()
    (response,) = cluster.fetch(2)
    assert not response.records
    assert fetcher.partitions[TP].is_replica_in_sync
    follower.follower_quota.update_quota(0)
    follower.follower_quota.record(1, cluster.now)
    assert fetcher.build_fetch_request(cluster.now) is not None
