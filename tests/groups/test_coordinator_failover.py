"""The broker that coordinates a group is killed -9 while its members consume and commit: the leadership
of the group's __consumer_offsets partition moves to another replica, which loads the group's offsets
from its copy of the partition, and the group carries on there. Commits made before the kill are all still
there, consumption goes on, and in the end every record is consumed and committed.

Node 1 also runs the (single) controller and is never the one killed: each test picks a group whose
__consumer_offsets partition (Java's String.hashCode of the group id, as Kafka) is led by node 2 or 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from group_helpers import (
    CATCH_UP_S,
    OFFSETS_TOPIC,
    REBALANCE_S,
    admin_client,
    committed_offsets,
    describe_group,
    group_coordinated_by,
    group_in_partition,
    java_string_hash,
    member_pool,
    new_topic_and_producer,
    offsets_partition,
    partition_leaders,
    unique,
    wait_committed_at_end,
    wait_for_progress,
)

from tierlog.testing.local_cluster import LocalCluster, wait_until

PARTITIONS = 6
PROGRESS = 60
RESTART_S = 60.0

CASES = [("confluent-kafka", "range"), ("kafka-python", "range"), ("aiokafka", "roundrobin")]


def test_a_groups_offsets_partition_is_computed_as_kafka_does() -> None:
    # Java's String.hashCode, known values: over UTF-16 code units (an emoji is a surrogate pair), and
    # Integer.MIN_VALUE, which Math.abs would leave negative: Kafka's Utils.abs masks the sign bit.
    assert [java_string_hash(s) for s in ("", "hello", "\N{GRINNING FACE}")] == [0, 99162322, 31 * 0xD83D + 0xDE00]
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert offsets_partition("polygenelubricants", 50) == 0
    assert offsets_partition("hello", 50) == 99162322 % 50


def _coordinator(bootstrap: str, group: str) -> int | None:
    try:
        return describe_group(bootstrap, group).coordinator.id
    except KafkaException:
        return None


@pytest.mark.parametrize(("client", "assignor"), CASES, ids=[c for c, _ in CASES])
def test_group_carries_on_when_its_coordinator_is_killed(
    cluster: LocalCluster, tmp_path: Path, client: str, assignor: str
) -> None:
    bootstrap = cluster.bootstrap
    group, coordinator = group_coordinated_by(cluster, {2, 3}, f"failover-{client}")
    assert _coordinator(bootstrap, group) == coordinator
    # A group with nothing but a standalone commit, coordinated by the same partition: its offsets must come
    # back exactly, not merely "at least as far".
    idle_group = group_in_partition(offsets_partition(group), "idle")
    topic, producer = new_topic_and_producer(bootstrap, "failover", PARTITIONS)
    idle_offsets = [TopicPartition(topic, p, 10 + p) for p in range(PARTITIONS)]
    admin = admin_client(bootstrap)
    altered = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(idle_group, idle_offsets)])
    altered[idle_group].result(timeout=30)

    settings = {"client": client, "assignor": assignor, "bootstrap": bootstrap, "topic": topic, "group": group}
    with member_pool(log_dir=tmp_path, **settings) as pool:
        producer.start()
        a, b = pool.start("a"), pool.start("b")
        pool.wait_balanced([a, b], PARTITIONS)
        wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed before the kill")
        # Records are printed before they are committed: wait for the commits of every partition.
        before = wait_until(
            lambda: (o := committed_offsets(bootstrap, group, topic, range(PARTITIONS))) and min(o.values()) >= 0 and o,
            CATCH_UP_S,
            "a commit of every partition before the kill",
        )

        cluster.broker(coordinator).kill()
        try:
            new_coordinator = wait_until(
                lambda: (n := _coordinator(bootstrap, group)) not in (None, coordinator) and n,
                REBALANCE_S,
                f"a new coordinator for {group} after node {coordinator} was killed",
            )
            assert new_coordinator == partition_leaders(bootstrap, OFFSETS_TOPIC)[offsets_partition(group)]
            wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed after the kill")

            after = committed_offsets(bootstrap, group, topic, range(PARTITIONS))
            assert all(after[p] >= before[p] for p in before), (before, after)
            assert committed_offsets(bootstrap, idle_group, topic, range(PARTITIONS)) == {
                tp.partition: tp.offset for tp in idle_offsets
            }

            producer.stop()
            wait_committed_at_end(bootstrap, group, topic, PARTITIONS, CATCH_UP_S)
            consumed = {(r.partition, r.offset) for r in pool.consumed()}
            missing = [r for r in producer.acked if (r.partition, r.offset) not in consumed]
            assert not missing, f"{len(missing)} acknowledged records never consumed, e.g. {missing[:5]}"
            a.leave()
            b.leave()
        finally:
            producer.stop()
            killed = cluster.broker(coordinator)
            killed.start()
            killed.wait_ready(RESTART_S)
            cluster.wait_for_brokers(3, timeout_s=RESTART_S)


def test_groups_and_offsets_survive_a_restart_of_every_broker(cluster: LocalCluster, tmp_path: Path) -> None:
    """Every broker stops (SIGTERM) and starts again: each __consumer_offsets leader loads its groups from
    its own log, and a member of a group that had committed resumes exactly where the commits were."""
    bootstrap = cluster.bootstrap
    topic, producer = new_topic_and_producer(bootstrap, "restart", PARTITIONS)
    group = unique("restart")
    producer.produce(6 * PARTITIONS)
    settings = {"client": "confluent-kafka", "assignor": "range", "bootstrap": bootstrap, "topic": topic}
    with member_pool(log_dir=tmp_path, group=group, **settings) as pool:
        before = pool.start("before")
        ends = wait_committed_at_end(bootstrap, group, topic, PARTITIONS, CATCH_UP_S)
        before.leave()

    cluster.stop(timeout_s=RESTART_S)
    cluster.start(RESTART_S)
    assert (
        wait_until(
            lambda: _committed_or_none(bootstrap, group, topic), RESTART_S, f"the offsets of {group} after the restart"
        )
        == ends
    )

    producer.produce(2 * PARTITIONS)
    with member_pool(log_dir=tmp_path, group=group, **settings) as pool:
        after = pool.start("after")
        wait_for_progress(lambda: len(after.records), 2 * PARTITIONS, CATCH_UP_S, "the new records")
        assert sorted((r.partition, r.offset) for r in after.records) == [
            (p, o) for p in range(PARTITIONS) for o in (ends[p], ends[p] + 1)
        ]
        after.leave()


def _committed_or_none(bootstrap: str, group: str, topic: str) -> dict[int, int] | None:
    try:
        return committed_offsets(bootstrap, group, topic, range(PARTITIONS))
    except (KafkaException, TimeoutError):
        return None
