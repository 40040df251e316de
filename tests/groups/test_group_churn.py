"""Three consumers share six partitions while records keep coming; one leaves, one joins, one is killed -9.
Every acknowledged record is consumed, the committed offsets end at the log end offsets, and a consumer
started afterwards resumes exactly at the committed offsets: nothing committed is read again, nothing is
skipped.

Each client library runs the story with an eager assignor and, where it has one, with cooperative-sticky
(KIP-429 incremental rebalancing, which the broker only relays: the protocol's name and metadata pass
through JoinGroup and SyncGroup untouched):
- confluent-kafka (librdkafka): range and cooperative-sticky;
- kafka-python 3.0: range and cooperative-sticky (kafka.coordinator.assignors.cooperative_sticky);
- aiokafka 0.14: roundrobin only; it implements no cooperative protocol (its assignors are range,
  roundrobin and an eager sticky one).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState
from group_helpers import (
    CATCH_UP_S,
    REBALANCE_S,
    committed_offsets,
    describe_group,
    member_pool,
    new_topic_and_producer,
    unique,
    wait_committed_at_end,
    wait_for_progress,
)

from tierlog.testing.local_cluster import LocalCluster, wait_until

PARTITIONS = 6
# Records each stage must see consumed before the next change, so every member really worked.
PROGRESS = 60
RESUMED = 30

CASES = [
    ("confluent-kafka", "range"),
    ("confluent-kafka", "cooperative-sticky"),
    ("kafka-python", "range"),
    ("kafka-python", "cooperative-sticky"),
    ("aiokafka", "roundrobin"),
]


@pytest.mark.parametrize(("client", "assignor"), CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_members_leave_join_and_crash_and_every_record_is_consumed_and_committed(
    cluster: LocalCluster, tmp_path: Path, client: str, assignor: str
) -> None:
    bootstrap = cluster.bootstrap
    topic, producer = new_topic_and_producer(bootstrap, "churn", PARTITIONS)
    group = unique(f"churn-{client}-{assignor}")
    settings = {"client": client, "assignor": assignor, "bootstrap": bootstrap, "topic": topic, "group": group}
    with member_pool(log_dir=tmp_path, **settings) as pool:
        producer.start()
        a, b, c = pool.start("a"), pool.start("b"), pool.start("c")
        pool.wait_balanced([a, b, c], PARTITIONS)
        # The protocol the members voted for, relayed by the coordinator as they named it (DescribeGroups
        # names it only while the group is Stable, as Kafka's GroupMetadata.summary does).
        stable = wait_until(
            lambda: (d := describe_group(bootstrap, group)).state == ConsumerGroupState.STABLE and d,
            REBALANCE_S,
            f"{group} Stable",
        )
        assert stable.partition_assignor == assignor
        wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed by a, b and c")

        a.leave()
        pool.wait_balanced([b, c], PARTITIONS)
        wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed after a left")

        d = pool.start("d")
        pool.wait_balanced([b, c, d], PARTITIONS)
        wait_for_progress(lambda: len(d.records), 1, CATCH_UP_S, "a first record consumed by d")

        b.kill()
        # The coordinator notices only when b's session times out; c and d then take its partitions.
        pool.wait_balanced([c, d], PARTITIONS, timeout_s=REBALANCE_S)
        wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed after b died")

        producer.stop()
        ends = wait_committed_at_end(bootstrap, group, topic, PARTITIONS, CATCH_UP_S)
        assert producer.failed == 0
        consumed = {(r.partition, r.offset): r.value for r in pool.consumed()}
        missing = [r for r in producer.acked if consumed.get((r.partition, r.offset)) != r.value]
        assert not missing, f"{len(missing)} acknowledged records never consumed, e.g. {missing[:5]}"

        description = describe_group(bootstrap, group)
        assert {m.client_id for m in description.members} == {"c", "d"}
        c.leave()
        d.leave()
        wait_until(
            lambda: describe_group(bootstrap, group).state == ConsumerGroupState.EMPTY, REBALANCE_S, f"{group} empty"
        )
        assert committed_offsets(bootstrap, group, topic, range(PARTITIONS)) == ends

        # A member started now resumes at the committed offsets: it reads the new records and only those.
        producer.produce(RESUMED)
        e = pool.start("e")
        wait_for_progress(lambda: len(e.records), RESUMED, CATCH_UP_S, "the new records consumed by e")
        new = sorted(r for r in producer.acked if r.offset >= ends[r.partition])
        assert len(new) == RESUMED
        assert sorted(e.records) == new
        first_read = {p: min(r.offset for r in e.records if r.partition == p) for p in {r.partition for r in new}}
        assert first_read == {p: ends[p] for p in first_read}
        wait_committed_at_end(bootstrap, group, topic, PARTITIONS, CATCH_UP_S)
        e.leave()


STATIC_CASES = [("confluent-kafka", "range"), ("kafka-python", "range"), ("aiokafka", "roundrobin")]
# Long enough that a killed static member's successor is back before the coordinator gives up on it.
STATIC_SESSION_MS = "20000"


@pytest.mark.parametrize(("client", "assignor"), STATIC_CASES, ids=[c for c, _ in STATIC_CASES])
def test_a_static_member_restarted_within_its_session_takes_its_partitions_back_without_a_rebalance(
    cluster: LocalCluster, tmp_path: Path, client: str, assignor: str
) -> None:
    """KIP-345: a member with a group.instance.id that comes back (with a new member id) before its session
    times out replaces its old self; the coordinator hands it the same partitions and the other members
    see no rebalance. It resumes at its predecessor's commits."""
    bootstrap = cluster.bootstrap
    partitions = 4
    topic, producer = new_topic_and_producer(bootstrap, "static", partitions)
    group = unique(f"static-{client}")
    settings = {"client": client, "assignor": assignor, "bootstrap": bootstrap, "topic": topic, "group": group}
    with member_pool(log_dir=tmp_path, **settings) as pool:
        producer.start()
        static = ("--session-timeout-ms", STATIC_SESSION_MS)
        first = pool.start("first", "--instance-id", "one", *static)
        other = pool.start("other", "--instance-id", "two", *static)
        pool.wait_balanced([first, other], partitions)
        wait_for_progress(lambda: len(pool.consumed()), PROGRESS, CATCH_UP_S, "records consumed by both")
        owned = first.assignment
        rebalances_seen_by_other = len(other.events("assigned"))
        # The story is "resumes at its predecessor's commits": a partition the first member has not committed
        # yet would make the successor start at the reset position instead, which proves nothing.
        wait_until(
            lambda: min(committed_offsets(bootstrap, group, topic, owned).values()) > 0,
            CATCH_UP_S,
            lambda: f"the first member to commit each of {owned}",
        )

        first.kill()
        committed_at_kill = committed_offsets(bootstrap, group, topic, owned)
        second = pool.start("second", "--instance-id", "one", *static)
        pool.wait_balanced([second, other], partitions)
        assert second.assignment == owned
        wait_for_progress(lambda: len(second.records), PROGRESS // 2, CATCH_UP_S, "records consumed by the successor")
        for p in owned:
            assert min(r.offset for r in second.records if r.partition == p) == committed_at_kill[p], p
        assert len(other.events("assigned")) == rebalances_seen_by_other
        assert {m.group_instance_id for m in describe_group(bootstrap, group).members} == {"one", "two"}

        producer.stop()
        wait_committed_at_end(bootstrap, group, topic, partitions, CATCH_UP_S)
        consumed = {(r.partition, r.offset) for r in pool.consumed()}
        assert not [r for r in producer.acked if (r.partition, r.offset) not in consumed]
        second.leave()
        other.leave()
