"""The reassignment plans of `tierlog topic reassign` and `tierlog cluster rebalance`: Kafka's JSON files, the
throttles Kafka's tool sets, the states --verify reports, and the even spread with the fewest moves."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from tierlog.cli.reassignment_plan import (
    COMPLETE,
    FAILED,
    FOLLOWER_THROTTLED_REPLICAS,
    IN_PROGRESS,
    LEADER_THROTTLED_REPLICAS,
    InProgress,
    PlanError,
    parse_broker_list,
    parse_reassignment,
    parse_topics_to_move,
    partition_moves,
    partition_states,
    plan_even_spread,
    reassignment_json,
    throttles_of,
)
from tierlog.common import TopicPartition


def tp(name: str) -> TopicPartition:
    return TopicPartition.parse_dir_name(name)


def assignment(**partitions: Sequence[int]) -> dict[TopicPartition, list[int]]:
    """assignment(orders_0=[1, 2]) -> {orders-0: [1, 2]}."""
    return {tp(name.replace("_", "-")): list(replicas) for name, replicas in partitions.items()}


def applied(current: Mapping[TopicPartition, Sequence[int]], brokers: Sequence[int]) -> dict[TopicPartition, list[int]]:
    plan = plan_even_spread(current, brokers)
    return {p: list(plan.targets.get(p, current[p])) for p in current}


def assert_even(result: Mapping[TopicPartition, Sequence[int]], brokers: Sequence[int]) -> None:
    """Per topic and overall, every broker within one replica and one preferred leader of every other."""
    topics = {p.topic for p in result}
    for scope in [*({t} for t in topics), topics]:
        replicas = Counter({b: 0 for b in brokers})
        leaders = Counter({b: 0 for b in brokers})
        for p, rs in result.items():
            if p.topic in scope:
                replicas.update(rs)
                leaders[rs[0]] += 1
        assert set(replicas) == set(brokers), f"replicas outside {brokers}: {replicas}"
        assert max(replicas.values()) - min(replicas.values()) <= 1, (scope, replicas)
        assert max(leaders.values()) - min(leaders.values()) <= 1, (scope, leaders)
    for rs in result.values():
        assert len(set(rs)) == len(rs)


def test_reassignment_json_is_kafkas_compact_sorted_form() -> None:
    text = reassignment_json({tp("b-0"): [2, 1], tp("a-1"): [3], tp("a-0"): [1]})
    assert text == (
        '{"version":1,"partitions":[{"topic":"a","partition":0,"replicas":[1],"log_dirs":["any"]},'
        '{"topic":"a","partition":1,"replicas":[3],"log_dirs":["any"]},'
        '{"topic":"b","partition":0,"replicas":[2,1],"log_dirs":["any","any"]}]}'
    )
    assert parse_reassignment(text) == {tp("a-0"): [1], tp("a-1"): [3], tp("b-0"): [2, 1]}


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ("{", "the input is not valid JSON"),
        ('{"version": 2, "partitions": []}', "Not supported version field value 2"),
        ('{"version": 1, "partitions": []}', "Partition reassignment list cannot be empty"),
        ('{"partitions": [{"topic": "a", "partition": 0, "replicas": []}]}', "Partition replica list cannot be empty"),
        (
            '{"partitions": [{"topic": "a", "partition": 0, "replicas": [1]}, {"topic": "a", "partition": 0, '
            '"replicas": [2]}]}',
            "Partition reassignment contains duplicate topic partitions: a-0",
        ),
        (
            '{"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 1]}]}',
            "Partition replica lists may not contain duplicate entries: a-0 contains multiple entries for 1",
        ),
        (
            '{"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"]}]}',
            "Size of replicas list [1, 2] is different from size of log dirs list ['any'] for partition a-0",
        ),
        (
            '{"partitions": [{"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/data/2"]}]}',
            "a-0: log_dirs other than 'any' (a replica moved between a broker's log dirs, AlterReplicaLogDirs)",
        ),
        ('{"partitions": [{"topic": "a", "replicas": [1]}]}', '{"topic": "a", "replicas": [1]} needs "topic"'),
    ],
)
def test_a_bad_reassignment_file_is_refused_in_one_line(document: str, error: str) -> None:
    with pytest.raises(PlanError) as refused:
        parse_reassignment(document)
    assert str(refused.value).startswith(error)
    assert "\n" not in str(refused.value)


def test_topics_to_move_and_broker_list() -> None:
    assert parse_topics_to_move('{"topics": [{"topic": "a"}, {"topic": "b"}], "version": 1}') == ["a", "b"]
    with pytest.raises(PlanError, match="duplicate entries: a"):
        parse_topics_to_move('{"topics": [{"topic": "a"}, {"topic": "a"}]}')
    assert parse_broker_list("3,1,2") == [3, 1, 2]
    with pytest.raises(PlanError, match="Broker list contains duplicate entries: 1"):
        parse_broker_list("1,2,1")
    with pytest.raises(PlanError, match="not a comma-separated list"):
        parse_broker_list("1,x")


def test_throttles_name_every_source_as_leader_and_every_new_replica_as_follower() -> None:
    current = assignment(a_0=[1, 2], a_1=[2, 3], b_0=[1])
    targets = assignment(a_0=[1, 4], a_1=[3, 2], b_0=[5])
    throttles = throttles_of(partition_moves(targets, current, {}))
    assert throttles.brokers == [1, 2, 3, 4, 5]
    assert throttles.topic_replicas == {
        "a": {LEADER_THROTTLED_REPLICAS: "0:1,0:2,1:2,1:3", FOLLOWER_THROTTLED_REPLICAS: "0:4"},
        "b": {LEADER_THROTTLED_REPLICAS: "0:1", FOLLOWER_THROTTLED_REPLICAS: "0:5"},
    }


def test_a_reassignment_in_progress_keeps_its_sources_and_its_moves_stay_throttled() -> None:
    current = assignment(a_0=[1, 2, 3], a_1=[1, 2])
    in_progress = {tp("a-0"): InProgress(replicas=[1, 2, 3], adding=[3], removing=[1])}
    moves = partition_moves(assignment(a_1=[2, 4]), current, in_progress)
    assert moves[tp("a-0")].sources == {1, 2} and moves[tp("a-0")].destinations == {3}
    assert throttles_of(moves).topic_replicas["a"][FOLLOWER_THROTTLED_REPLICAS] == "0:3,1:4"


def test_verify_states_and_kafkas_lines() -> None:
    targets = assignment(a_0=[2, 1], a_1=[3], a_2=[1, 2])
    current = assignment(a_0=[2, 1], a_1=[1, 3], a_2=[1, 3])
    states = partition_states(targets, current, {tp("a-1"): InProgress([1, 3], [3], [1])})
    assert [s.state for s in states.values()] == [COMPLETE, IN_PROGRESS, FAILED]
    assert [s.line(p) for p, s in states.items()] == [
        "Reassignment of partition a-0 is completed.",
        "Reassignment of partition a-1 is still in progress.",
        "There is no active reassignment of partition a-2, but replica set is 1,3 rather than 1,2.",
    ]


def test_a_balanced_cluster_needs_no_move() -> None:
    current = assignment(a_0=[1, 2], a_1=[2, 3], a_2=[3, 1])
    plan = plan_even_spread(current, [1, 2, 3])
    assert plan.targets == {}
    assert plan.replica_moves == 0


def test_two_new_brokers_get_their_share_with_the_fewest_moves() -> None:
    # 6 partitions x RF 3 = 18 replicas on brokers 1-3; over 5 brokers three hold 4 and two hold 3, so the fewest
    # moves keep 4 on each old broker and move 6.
    current = {TopicPartition("t", p): [1 + p % 3, 1 + (p + 1) % 3, 1 + (p + 2) % 3] for p in range(6)}
    plan = plan_even_spread(current, [1, 2, 3, 4, 5])
    result = {p: plan.targets.get(p, current[p]) for p in current}
    assert_even(result, [1, 2, 3, 4, 5])
    held = Counter(b for rs in result.values() for b in rs)
    assert held[4] + held[5] == plan.replica_moves  # every move lands on a new broker
    assert plan.replica_moves == 6
    assert (held[4], held[5]) == (3, 3)
    # A move replaces one replica in place; no partition loses more than it must.
    assert all(len(target) == 3 for target in plan.targets.values())


def test_excluded_brokers_are_emptied() -> None:
    current = {TopicPartition("t", p): [1 + p % 5, 1 + (p + 1) % 5, 1 + (p + 2) % 5] for p in range(10)}
    result = applied(current, [1, 2, 3])
    assert_even(result, [1, 2, 3])
    assert not {4, 5} & {b for rs in result.values() for b in rs}
    # Only the replicas on brokers 4 and 5 moved: every kept replica stayed where it was.
    for p, rs in result.items():
        assert set(current[p]) & {1, 2, 3} <= set(rs)


def test_several_topics_balance_per_topic_and_overall() -> None:
    # Three topics of one partition each, RF 1, all on broker 1: per topic any broker may hold it, but overall
    # each of three brokers should hold one.
    current = assignment(a_0=[1], b_0=[1], c_0=[1])
    result = applied(current, [1, 2, 3])
    assert sorted(rs[0] for rs in result.values()) == [1, 2, 3]
    assert_even(result, [1, 2, 3])


def test_skewed_topics_and_leaders_even_out() -> None:
    current = {
        **{TopicPartition("big", p): [1, 2, 3] for p in range(8)},
        **{TopicPartition("small", p): [2, 1] for p in range(3)},
        **{TopicPartition("one", p): [4] for p in range(5)},
    }
    assert_even(applied(current, [1, 2, 3, 4]), [1, 2, 3, 4])


def test_preferred_leaders_spread_without_moving_data() -> None:
    current = {TopicPartition("t", p): [1, 2, 3] for p in range(6)}
    plan = plan_even_spread(current, [1, 2, 3])
    assert plan.replica_moves == 0  # the replicas are already even: only the order changes
    result = {p: plan.targets.get(p, current[p]) for p in current}
    assert Counter(rs[0] for rs in result.values()) == {1: 2, 2: 2, 3: 2}
    assert all(sorted(rs) == [1, 2, 3] for rs in result.values())
    # Partitions whose leader may stay keep it.
    assert sum(rs[0] == 1 for rs in plan.targets.values()) == 0


def test_sizes_give_the_bytes_each_partition_copies() -> None:
    current = assignment(a_0=[1, 2], a_1=[1, 2])
    plan = plan_even_spread(current, [1, 2, 3, 4], sizes={tp("a-0"): 100, tp("a-1"): 50})
    assert sorted(plan.bytes_to_move(p) for p in plan.targets) == [50, 100]
    assert plan.replica_moves == 2


def test_more_replicas_than_brokers_is_refused() -> None:
    with pytest.raises(PlanError, match=r"a-0 has 3 replicas but there are only 2 brokers to place them on \(1,2\)"):
        plan_even_spread(assignment(a_0=[1, 2, 3]), [1, 2])


def test_the_plan_is_a_reassignment_file() -> None:
    plan = plan_even_spread(assignment(a_0=[1], a_1=[1]), [1, 2])
    # Both are leaders of the same (unknown) size: the first moves.
    assert json.loads(reassignment_json(plan.targets))["partitions"] == [
        {"topic": "a", "partition": 0, "replicas": [2], "log_dirs": ["any"]}
    ]


def random_cluster(seed: int, *, uniform: bool) -> tuple[dict[TopicPartition, list[int]], list[int]]:
    """Up to 4 topics of up to 12 partitions on brokers 1..6, and the 3 to 7 of brokers 1..8 to spread them on;
    every topic of one replication factor, or each its own."""
    rng = random.Random(seed)
    brokers_before = list(range(1, rng.randint(2, 6) + 1))
    brokers_after = sorted(rng.sample(range(1, 9), rng.randint(3, 7)))
    factor = rng.randint(1, min(3, len(brokers_before)))
    current: dict[TopicPartition, list[int]] = {}
    for t in range(rng.randint(1, 4)):
        rf = factor if uniform else rng.randint(1, min(3, len(brokers_before)))
        for p in range(rng.randint(1, 12)):
            current[TopicPartition(f"t{t}", p)] = rng.sample(brokers_before, rf)
    return current, brokers_after


@pytest.mark.parametrize("seed", range(300))
def test_random_clusters_of_one_replication_factor_end_even(seed: int) -> None:
    current, brokers = random_cluster(seed, uniform=True)
    if max(len(rs) for rs in current.values()) > len(brokers):
        return
    result = applied(current, brokers)
    assert_even(result, brokers)
    assert {p: len(rs) for p, rs in result.items()} == {p: len(rs) for p, rs in current.items()}


@pytest.mark.parametrize("seed", range(300))
def test_random_clusters_of_mixed_replication_factors_end_even_per_topic(seed: int) -> None:
    # Overall, preferred leaders may not even out: topics of one replica lead where their replicas are, and a
    # topic of 3 replicas on 2 partitions may have its spare replicas only on brokers that already lead others.
    current, brokers = random_cluster(seed, uniform=False)
    if max(len(rs) for rs in current.values()) > len(brokers):
        return
    result = applied(current, brokers)
    for topic in {p.topic for p in result}:
        assert_even({p: rs for p, rs in result.items() if p.topic == topic}, brokers)
    overall = Counter({b: 0 for b in brokers})
    overall.update(b for rs in result.values() for b in rs)
    assert max(overall.values()) - min(overall.values()) <= 1
