"""Kafka's admin API on consumer groups, as kafka-consumer-groups.sh and operators use it: list and describe
groups (state, members, assignment, coordinator), read committed offsets, commit offsets for a group
without members (a standalone commit, `--reset-offsets`), delete offsets (OffsetDelete) and groups
(DeleteGroups): refused while the group has members, and afterwards nothing of it is left.

confluent-kafka's AdminClient has no OffsetDelete call; kafka-python's KafkaAdminClient.delete_group_offsets
sends it.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from group_helpers import (
    ADMIN_TIMEOUT_S,
    OFFSETS_TOPIC,
    REBALANCE_S,
    admin_client,
    committed_offsets,
    describe_group,
    member_pool,
    new_topic_and_producer,
    offsets_partition,
    partition_leaders,
    unique,
    wait_committed_at_end,
)
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.admin import KafkaAdminClient

from tierlog.testing.local_cluster import LocalCluster, wait_until

PARTITIONS = 6


def listed_groups(bootstrap: str, states: set[ConsumerGroupState] | None = None) -> dict[str, ConsumerGroupState]:
    kwargs = {"states": states} if states is not None else {}
    admin = admin_client(bootstrap)  # kept until the answer is in: a destroyed client fails its requests
    result = admin.list_consumer_groups(**kwargs).result(timeout=ADMIN_TIMEOUT_S)
    assert not result.errors, result.errors
    return {listing.group_id: listing.state for listing in result.valid}


def delete_group(bootstrap: str, group: str) -> int | None:
    """DeleteGroups: None when deleted, else the error code."""
    admin = admin_client(bootstrap)
    future = admin.delete_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group]
    try:
        future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as e:
        code: int = e.args[0].code()
        return code
    return None


def offsets_deleted(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, str]:
    """OffsetDelete through kafka-python: partition -> error name."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(ADMIN_TIMEOUT_S * 1000))
    try:
        result = admin.delete_group_offsets(group, [KafkaPythonTopicPartition(topic, p) for p in partitions])
    finally:
        admin.close()
    return {tp.partition: error.__name__ for tp, error in result.items()}


def test_a_stable_group_is_listed_described_and_cannot_be_deleted_until_it_is_empty(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    topic, producer = new_topic_and_producer(bootstrap, "admin", PARTITIONS)
    group = unique("admin")
    producer.produce(4 * PARTITIONS)
    settings = {"client": "confluent-kafka", "assignor": "range", "bootstrap": bootstrap, "topic": topic}
    with member_pool(log_dir=tmp_path, group=group, **settings) as pool:
        a, b = pool.start("a"), pool.start("b")
        pool.wait_balanced([a, b], PARTITIONS)
        ends = wait_committed_at_end(bootstrap, group, topic, PARTITIONS, REBALANCE_S)
        assert ends == {p: 4 for p in range(PARTITIONS)}

        assert listed_groups(bootstrap)[group] == ConsumerGroupState.STABLE
        assert group in listed_groups(bootstrap, {ConsumerGroupState.STABLE})
        assert group not in listed_groups(bootstrap, {ConsumerGroupState.EMPTY})

        description = describe_group(bootstrap, group)
        assert (description.state, description.partition_assignor) == (ConsumerGroupState.STABLE, "range")
        assert not description.is_simple_consumer_group
        assert description.coordinator.id == partition_leaders(bootstrap, OFFSETS_TOPIC)[offsets_partition(group)]
        assigned = {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in description.members}
        assert assigned == {"a": a.assignment, "b": b.assignment}
        assert all(tp.topic == topic for m in description.members for tp in m.assignment.topic_partitions)

        assert delete_group(bootstrap, group) == KafkaError.NON_EMPTY_GROUP
        # OffsetDelete of a topic the Stable group subscribes to is refused per partition.
        assert offsets_deleted(bootstrap, group, topic, [0]) == {0: "GroupSubscribedToTopicError"}
        assert committed_offsets(bootstrap, group, topic, range(PARTITIONS)) == ends

        a.leave()
        b.leave()
    wait_until(lambda: describe_group(bootstrap, group).state == ConsumerGroupState.EMPTY, REBALANCE_S, "Empty")
    assert listed_groups(bootstrap)[group] == ConsumerGroupState.EMPTY
    assert describe_group(bootstrap, group).members == []

    assert offsets_deleted(bootstrap, group, topic, [0]) == {0: "NoError"}
    assert committed_offsets(bootstrap, group, topic, range(PARTITIONS)) == {**ends, 0: -1}

    assert delete_group(bootstrap, group) is None
    assert committed_offsets(bootstrap, group, topic, range(PARTITIONS)) == {p: -1 for p in range(PARTITIONS)}
    assert group not in listed_groups(bootstrap)
    assert describe_group(bootstrap, group).state == ConsumerGroupState.DEAD
    assert delete_group(bootstrap, group) == KafkaError.GROUP_ID_NOT_FOUND


def test_offsets_committed_for_a_group_without_members_are_where_its_first_member_starts(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    topic, producer = new_topic_and_producer(bootstrap, "standalone", 2)
    group = unique("standalone")
    producer.produce(20)
    admin = admin_client(bootstrap)
    reset = [TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 8)]
    altered = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, reset)])[group]
    assert {tp.partition: tp.offset for tp in altered.result(timeout=ADMIN_TIMEOUT_S).topic_partitions} == {0: 3, 1: 8}
    assert committed_offsets(bootstrap, group, topic, [0, 1]) == {0: 3, 1: 8}
    # A group known only by its offsets is Empty, of no protocol type (a "simple" consumer group).
    assert listed_groups(bootstrap)[group] == ConsumerGroupState.EMPTY
    description = describe_group(bootstrap, group)
    assert (description.state, description.members) == (ConsumerGroupState.EMPTY, [])

    settings = {"client": "confluent-kafka", "assignor": "range", "bootstrap": bootstrap, "topic": topic}
    with member_pool(log_dir=tmp_path, group=group, **settings) as pool:
        member = pool.start("first")
        wait_until(lambda: len(member.records) >= 9, REBALANCE_S, lambda: f"records from 3 and 8: {member.describe()}")
        assert sorted((r.partition, r.offset) for r in member.records) == [(0, o) for o in range(3, 10)] + [
            (1, o) for o in range(8, 10)
        ]
        # While the group has a member, a standalone commit is refused (Kafka: UNKNOWN_MEMBER_ID).
        rewind = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])]
        refused = admin.alter_consumer_group_offsets(rewind)[group].result(timeout=ADMIN_TIMEOUT_S)
        assert [tp.error and tp.error.code() for tp in refused.topic_partitions] == [KafkaError.UNKNOWN_MEMBER_ID]
        assert wait_committed_at_end(bootstrap, group, topic, 2, REBALANCE_S) == {0: 10, 1: 10}
        member.leave()
