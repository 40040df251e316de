"""Partition reassignment plans, pure: Kafka's reassignment JSON (kafka-reassign-partitions.sh's files), the
throttles Kafka's tool sets for a reassignment, what `--verify` says of each partition, and the planner of
`tierlog cluster rebalance` and `topic reassign --generate`.

The planner spreads replicas evenly over the brokers given with as few moves as possible: per topic every
broker holds ⌊R/B⌋ or ⌈R/B⌉ of the topic's R replicas, and over all topics each broker is within one replica of
the mean too (the brokers that get a topic's spare replica take turns). A replica only moves off a broker holding
more than its share, onto one holding less, so a balanced cluster gets an empty plan; a broker left out (a
decommissioned one) has a share of nothing. Preferred leaders (the first replica) are spread the same way over
each partition's new replicas, keeping the current preferred leader where its share allows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tierlog.common import TopicPartition

REASSIGNMENT_JSON_VERSION = 1
ANY_LOG_DIR = "any"  # Kafka's log_dirs entry for "wherever the broker puts it"

# Kafka's throttle configs (QuotaConfig): per broker the rates, per topic the replicas they apply to.
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
BROKER_THROTTLES = (LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE)
TOPIC_THROTTLES = (LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS)

Assignment = dict[TopicPartition, list[int]]


class PlanError(ValueError):
    """A reassignment file or plan that cannot be used; the message is one line for a person."""


def sorted_partitions(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    return sorted(partitions, key=lambda tp: (tp.topic, tp.partition))


# --- Kafka's JSON files ---------------------------------------------------------------------------------------


def reassignment_json(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """kafka-reassign-partitions.sh's reassignment JSON, compact and sorted as Kafka writes it."""
    partitions = [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            "replicas": list(assignment[tp]),
            "log_dirs": [ANY_LOG_DIR] * len(assignment[tp]),
        }
        for tp in sorted_partitions(assignment)
    ]
    return json.dumps({"version": REASSIGNMENT_JSON_VERSION, "partitions": partitions}, separators=(",", ":"))


def _load_json(text: str) -> dict[str, object]:
    try:
        document = json.loads(text)
    except ValueError as e:
        raise PlanError(f"the input is not valid JSON ({e})") from None
    if not isinstance(document, dict):
        raise PlanError("the input is not a JSON object")
    version = document.get("version", REASSIGNMENT_JSON_VERSION)
    if version != REASSIGNMENT_JSON_VERSION:
        raise PlanError(f"Not supported version field value {version}")
    return document


def parse_topics_to_move(text: str) -> list[str]:
    """The topics of a --topics-to-move-json-file: {"topics": [{"topic": "foo"}], "version": 1}."""
    entries = _load_json(text).get("topics", [])
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("topic"), str) for e in entries
    ):
        raise PlanError('"topics" must be a list of {"topic": NAME} objects')
    topics = [e["topic"] for e in entries]
    duplicates = sorted(t for t, n in Counter(topics).items() if n > 1)
    if duplicates:
        raise PlanError(f"List of topics to reassign contains duplicate entries: {', '.join(duplicates)}")
    if not topics:
        raise PlanError("the file lists no topics")
    return topics


def parse_broker_list(text: str) -> list[int]:
    """--broker-list 1,2,3."""
    try:
        brokers = [int(item) for item in text.split(",")]
    except ValueError:
        raise PlanError(f"{text!r} is not a comma-separated list of broker ids") from None
    duplicates = sorted(b for b, n in Counter(brokers).items() if n > 1)
    if duplicates:
        raise PlanError(f"Broker list contains duplicate entries: {', '.join(map(str, duplicates))}")
    return brokers


def parse_reassignment(text: str) -> Assignment:
    """The target replicas of a --reassignment-json-file, checked as Kafka's tool checks them."""
    entries = _load_json(text).get("partitions", [])
    if not isinstance(entries, list):
        raise PlanError('"partitions" must be a list')
    targets: list[tuple[TopicPartition, list[int]]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise PlanError('each of "partitions" must be an object with "topic", "partition" and "replicas"')
        topic, partition, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas")
        if not isinstance(topic, str) or not isinstance(partition, int) or not isinstance(replicas, list):
            raise PlanError(f'{json.dumps(entry)} needs "topic" (a string), "partition" and "replicas" (a list)')
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas):
            raise PlanError(f"the replicas of {topic}-{partition} must be broker ids")
        tp = TopicPartition(topic, partition)
        log_dirs = entry.get("log_dirs", [ANY_LOG_DIR] * len(replicas))
        if not isinstance(log_dirs, list) or len(log_dirs) != len(replicas):
            raise PlanError(
                f"Size of replicas list {replicas} is different from size of log dirs list {log_dirs} "
                f"for partition {tp}"
            )
        if any(d != ANY_LOG_DIR for d in log_dirs):
            raise PlanError(
                f"{tp}: log_dirs other than {ANY_LOG_DIR!r} (a replica moved between a broker's log dirs, "
                "AlterReplicaLogDirs) are not done by this tool yet: give 'any'"
            )
        targets.append((tp, list(replicas)))
    if not targets:
        raise PlanError("Partition reassignment list cannot be empty")
    if any(not replicas for _, replicas in targets):
        raise PlanError("Partition replica list cannot be empty")
    duplicated = sorted_partitions(tp for tp, n in Counter(tp for tp, _ in targets).items() if n > 1)
    if duplicated:
        raise PlanError(f"Partition reassignment contains duplicate topic partitions: {','.join(map(str, duplicated))}")
    repeated = [
        f"{tp} contains multiple entries for {','.join(str(b) for b, n in sorted(Counter(r).items()) if n > 1)}"
        for tp, r in targets
        if len(set(r)) != len(r)
    ]
    if repeated:
        raise PlanError(f"Partition replica lists may not contain duplicate entries: {'. '.join(repeated)}")
    return dict(targets)


# --- throttles ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionMove:
    """Where a partition's data comes from (its replicas before the move) and goes to (the new ones)."""

    sources: frozenset[int]
    destinations: frozenset[int]


@dataclass(frozen=True)
class InProgress:
    """A reassignment the controller reports (ListPartitionReassignments): all replicas, the adding ones and the
    removing ones."""

    replicas: list[int]
    adding: list[int]
    removing: list[int]


def partition_moves(
    targets: Mapping[TopicPartition, Sequence[int]],
    current: Mapping[TopicPartition, Sequence[int]],
    in_progress: Mapping[TopicPartition, InProgress],
) -> dict[TopicPartition, PartitionMove]:
    """Kafka's move map: every reassignment in progress (its sources are the replicas that are not being added),
    then each target, whose sources are those of its reassignment in progress if it has one, else its current
    replicas."""
    moves = {
        tp: PartitionMove(frozenset(r.replicas) - frozenset(r.adding), frozenset(r.adding))
        for tp, r in in_progress.items()
    }
    for tp, replicas in targets.items():
        sources = moves[tp].sources if tp in moves else frozenset(current[tp])
        moves[tp] = PartitionMove(sources, frozenset(replicas) - sources)
    return moves


@dataclass(frozen=True)
class Throttles:
    """What `--execute --throttle` sets, as Kafka's tool: the rates on every broker a move reads from or writes
    to, and per topic the replicas they throttle (leaders: `partition:broker` of every source; followers: of
    every destination)."""

    brokers: list[int]
    topic_replicas: dict[str, dict[str, str]]  # topic -> {leader/follower.replication.throttled.replicas: list}


def throttles_of(moves: Mapping[TopicPartition, PartitionMove]) -> Throttles:
    leaders: dict[str, set[tuple[int, int]]] = {}
    followers: dict[str, set[tuple[int, int]]] = {}
    brokers: set[int] = set()
    for tp, move in moves.items():
        leaders.setdefault(tp.topic, set()).update((tp.partition, b) for b in move.sources)
        followers.setdefault(tp.topic, set()).update((tp.partition, b) for b in move.destinations - move.sources)
        brokers |= move.sources | move.destinations

    def listed(replicas: set[tuple[int, int]]) -> str:
        # Kafka sorts the "p:b" strings themselves (a TreeSet of strings).
        return ",".join(sorted(f"{p}:{b}" for p, b in replicas))

    return Throttles(
        brokers=sorted(brokers),
        topic_replicas={
            topic: {
                LEADER_THROTTLED_REPLICAS: listed(leaders[topic]),
                FOLLOWER_THROTTLED_REPLICAS: listed(followers[topic]),
            }
            for topic in sorted(leaders)
        },
    )


# --- --verify -------------------------------------------------------------------------------------------------

COMPLETE, IN_PROGRESS, FAILED = "complete", "in progress", "failed"


@dataclass(frozen=True)
class PartitionState:
    state: str  # COMPLETE, IN_PROGRESS or FAILED
    current: list[int]
    target: list[int]

    def line(self, tp: TopicPartition) -> str:
        """Kafka's line for the partition in --verify."""
        if self.state == IN_PROGRESS:
            return f"Reassignment of partition {tp} is still in progress."
        if self.state == COMPLETE:
            return f"Reassignment of partition {tp} is completed."
        return (
            f"There is no active reassignment of partition {tp}, but replica set is "
            f"{','.join(map(str, self.current))} rather than {','.join(map(str, self.target))}."
        )


def partition_states(
    targets: Mapping[TopicPartition, Sequence[int]],
    current: Mapping[TopicPartition, Sequence[int]],
    in_progress: Mapping[TopicPartition, InProgress],
) -> dict[TopicPartition, PartitionState]:
    """Each target partition: in progress while the controller lists its reassignment, else complete when its
    replicas are the target's (in order: the first is the preferred leader), else failed (cancelled, or its
    replicas changed since)."""
    states = {}
    for tp in sorted_partitions(targets):
        target = list(targets[tp])
        if tp in in_progress:
            states[tp] = PartitionState(IN_PROGRESS, list(in_progress[tp].replicas), target)
        else:
            now = list(current.get(tp, []))
            states[tp] = PartitionState(COMPLETE if now == target else FAILED, now, target)
    return states


# --- planning -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The target of every partition whose replicas or preferred leader change, and how many bytes each
    partition's new replicas will copy (None: its size is unknown)."""

    current: Assignment
    targets: Assignment
    sizes: Mapping[TopicPartition, int] = field(default_factory=dict)

    def adding(self, tp: TopicPartition) -> list[int]:
        return [b for b in self.targets[tp] if b not in self.current[tp]]

    def removing(self, tp: TopicPartition) -> list[int]:
        return [b for b in self.current[tp] if b not in self.targets[tp]]

    def bytes_to_move(self, tp: TopicPartition) -> int | None:
        size = self.sizes.get(tp)
        return None if size is None else size * len(self.adding(tp))

    @property
    def replica_moves(self) -> int:
        return sum(len(self.adding(tp)) for tp in self.targets)


def _shares(
    totals: Mapping[str, int], brokers: Sequence[int], held: Mapping[str, Counter[int]], first: Collection[str]
) -> dict[str, Counter[int]]:
    """Per topic how many of its `totals[topic]` replicas each broker should hold: ⌊total/B⌋, and one more for
    `total mod B` of them, chosen among the brokers given the fewest spare ones so far (so that over all topics
    no broker has two more than another), preferring those that hold the most of the topic now (fewest moves).
    The topics in `first` choose first."""
    extras: Counter[int] = Counter({b: 0 for b in brokers})
    shares: dict[str, Counter[int]] = {}
    for topic in sorted(totals, key=lambda t: (t not in first, -(totals[t] % len(brokers)), t)):
        base, spare = divmod(totals[topic], len(brokers))
        lucky = set(sorted(brokers, key=lambda b: (extras[b], -held[topic][b], b))[:spare])
        for b in lucky:
            extras[b] += 1
        shares[topic] = Counter({b: base + (b in lucky) for b in brokers})
    return shares


def plan_even_spread(
    current: Mapping[TopicPartition, Sequence[int]],
    brokers: Iterable[int],
    sizes: Mapping[TopicPartition, int] | None = None,
) -> Plan:
    """The fewest replica moves that spread `current`'s replicas (and preferred leaders) evenly over `brokers`;
    replicas on brokers not in `brokers` all move off. PlanError if a partition has more replicas than there are
    brokers."""
    targets_brokers = sorted(set(brokers))
    if not targets_brokers:
        raise PlanError("no broker to place the replicas on")
    sizes = dict(sizes or {})
    by_topic: dict[str, list[TopicPartition]] = {}
    for tp in sorted_partitions(current):
        by_topic.setdefault(tp.topic, []).append(tp)
        if len(current[tp]) > len(targets_brokers):
            raise PlanError(
                f"{tp} has {len(current[tp])} replicas but there are only {len(targets_brokers)} brokers to place "
                f"them on ({','.join(map(str, targets_brokers))})"
            )
    replicas = {tp: list(current[tp]) for tp in current}

    held = {t: Counter(b for tp in tps for b in replicas[tp]) for t, tps in by_topic.items()}
    # A topic of one replica per partition leads where its replicas are: those topics choose their spare replicas
    # first, so that they spread evenly among themselves and leave the leaders of the others room to even out.
    single_replica_topics = [t for t, tps in by_topic.items() if all(len(current[tp]) == 1 for tp in tps)]
    replica_shares = _shares(
        {t: sum(len(replicas[tp]) for tp in tps) for t, tps in by_topic.items()},
        targets_brokers,
        held,
        first=single_replica_topics,
    )
    for topic, tps in by_topic.items():
        _move_replicas(tps, replicas, held[topic], replica_shares[topic], sizes)

    _spread_leaders(by_topic, replicas, targets_brokers, single_replica_topics)
    changed = {tp: replicas[tp] for tp in sorted_partitions(current) if replicas[tp] != list(current[tp])}
    return Plan({tp: list(current[tp]) for tp in changed}, changed, {tp: sizes[tp] for tp in changed if tp in sizes})


def _move_replicas(
    partitions: list[TopicPartition],
    replicas: dict[TopicPartition, list[int]],
    held: Counter[int],
    share: Counter[int],
    sizes: Mapping[TopicPartition, int],
) -> None:
    """Move one replica at a time from a broker above its share to one below it, in place: the new replica takes
    the old one's position in the list. Of the partitions that could move, one that has no moved replica yet goes
    first (it keeps more of its replicas in sync meanwhile), a follower replica before a preferred leader's, and a
    small partition before a large one."""
    moved: Counter[TopicPartition] = Counter()

    def surplus() -> list[int]:
        return sorted((b for b in held if held[b] > share[b]), key=lambda b: (share[b] > 0, -held[b] + share[b], b))

    def deficit() -> list[int]:
        return sorted((b for b in share if held[b] < share[b]), key=lambda b: (held[b] - share[b], b))

    # A move lowers the total surplus by one, or (a detour through a broker at its share) sets up one that does.
    for _ in range(2 * sum(held.values()) + 1):
        givers, takers = surplus(), deficit()
        if not givers:
            return
        move = _direct_move(partitions, replicas, givers, takers, sizes, moved)
        if move is None:
            # Every partition of a giver already has a replica on every taker: hand one to a broker at its share
            # that lacks it; that broker then gives one of its others to a taker.
            at_share = [b for b in share if held[b] == share[b]]
            move = _direct_move(partitions, replicas, givers, at_share, sizes, moved)
            if move is None:
                break
        tp, giver, taker = move
        replicas[tp][replicas[tp].index(giver)] = taker
        held[giver] -= 1
        held[taker] += 1
        moved[tp] += 1
    raise PlanError(f"cannot spread the replicas of topic {partitions[0].topic} evenly")


def _direct_move(
    partitions: list[TopicPartition],
    replicas: Mapping[TopicPartition, list[int]],
    givers: list[int],
    takers: list[int],
    sizes: Mapping[TopicPartition, int],
    moved: Counter[TopicPartition],
) -> tuple[TopicPartition, int, int] | None:
    for giver in givers:
        candidates = [tp for tp in partitions if giver in replicas[tp]]
        candidates.sort(key=lambda tp: (moved[tp], replicas[tp][0] == giver, sizes.get(tp, 0), tp.partition))
        for tp in candidates:
            for taker in takers:
                if taker not in replicas[tp]:
                    return tp, giver, taker
    return None


def _spread_leaders(
    by_topic: Mapping[str, list[TopicPartition]],
    replicas: dict[TopicPartition, list[int]],
    brokers: Sequence[int],
    single_replica_topics: Collection[str],
) -> None:
    """Reorder each partition's replicas (in place) so that its first, the preferred leader, is spread like the
    replicas: per topic every broker leads ⌊P/B⌋ or ⌈P/B⌉ of its P partitions, and overall no broker leads two
    more than another. A partition keeps its preferred leader unless the spread needs it elsewhere.

    Each broker's share of each topic's leaders is chosen as for the replicas (`_shares`). Per topic: the current
    leaders where no broker exceeds its share; a partition that finds no room takes a leadership from another
    along a chain of hand-overs (augmenting paths); then chains of hand-overs raise every broker below its share.
    Where the replicas make the shares impossible, the topic's bounds ⌊P/B⌋ and ⌈P/B⌉ replace them, and last,
    over all topics, chains lower a broker that leads two more than another."""
    leading = Counter({b: 0 for b in brokers})
    per_topic = {t: Counter({b: 0 for b in brokers}) for t in by_topic}
    bounds = {t: (len(tps) // len(brokers), -(-len(tps) // len(brokers))) for t, tps in by_topic.items()}
    led_by: dict[TopicPartition, int] = {}
    leaders_now = {t: Counter(replicas[tp][0] for tp in tps) for t, tps in by_topic.items()}
    shares = _shares({t: len(tps) for t, tps in by_topic.items()}, brokers, leaders_now, single_replica_topics)

    def hand_over(tp: TopicPartition, taker: int) -> None:
        if tp in led_by:
            leading[led_by[tp]] -= 1
            per_topic[tp.topic][led_by[tp]] -= 1
        led_by[tp] = taker
        leading[taker] += 1
        per_topic[tp.topic][taker] += 1

    def within_topic(topic: str) -> Callable[[int], list[tuple[TopicPartition, int]]]:
        """The leaderships of `topic` a broker can hand to another replica. Along a chain each broker but the
        first and the last takes one and gives one, so only the ends' counts change."""

        def of(giver: int, _taken: str | None) -> list[tuple[TopicPartition, int]]:
            return [
                (tp, taker)
                for tp in by_topic[topic]
                if led_by.get(tp) == giver
                for taker in replicas[tp]
                if taker != giver
            ]

        return of

    def across_topics(giver: int, taken: str | None) -> list[tuple[TopicPartition, int]]:
        """The leaderships a broker can hand to another replica. Handing on one of the topic it took changes none
        of its counts; of another topic, that topic must stay within its bounds, and the one it took too."""
        if taken is not None and per_topic[taken][giver] + 1 > bounds[taken][1]:
            return [
                (tp, taker)
                for tp in by_topic[taken]
                if led_by.get(tp) == giver
                for taker in replicas[tp]
                if taker != giver
            ]
        return [
            (tp, taker)
            for topic, tps in by_topic.items()
            if topic == taken or per_topic[topic][giver] - 1 >= bounds[topic][0]
            for tp in tps
            if led_by.get(tp) == giver
            for taker in replicas[tp]
            if taker != giver
        ]

    def spread(topic: str, most: Mapping[int, int], least: Mapping[int, int]) -> bool:
        """Lead `topic`'s partitions with each broker b between least[b] and most[b]; False if the chains run out."""
        for tp in by_topic[topic]:
            room = [b for b in replicas[tp] if per_topic[topic][b] < most.get(b, 0)]
            if not room:
                # Every replica leads its most: one of them hands one of its other partitions on, down a chain
                # that ends at a broker with room.
                chain = _leadership_chain(
                    list(replicas[tp]), within_topic(topic), lambda b, _: per_topic[topic][b] < most.get(b, 0)
                )
                if chain is None:
                    return False
                room = [led_by[chain[0][0]]]
                for moved, taker in chain:
                    hand_over(moved, taker)
            hand_over(tp, room[0])  # the current first replica where it has room
        for short in brokers:
            while per_topic[topic][short] < least[short]:
                chain = _leadership_chain(
                    [b for b in brokers if per_topic[topic][b] > least[b]],
                    within_topic(topic),
                    lambda b, _, short=short: b == short,
                )
                if chain is None:
                    return False
                for moved, taker in chain:
                    hand_over(moved, taker)
        return True

    for topic, tps in by_topic.items():
        if spread(topic, shares[topic], shares[topic]):
            continue
        for tp in tps:
            if tp in led_by:
                leading[led_by[tp]] -= 1
                per_topic[topic][led_by.pop(tp)] -= 1
        low, high = bounds[topic]
        if not spread(topic, dict.fromkeys(brokers, high), dict.fromkeys(brokers, low)):
            raise PlanError(f"cannot spread the preferred leaders of topic {topic} evenly")

    for _ in range(len(replicas)):
        most, fewest = max(leading.values()), min(leading.values())
        if most - fewest <= 1:
            break
        chain = _leadership_chain(
            [b for b in brokers if leading[b] == most],
            across_topics,
            lambda b, topic, m=most: leading[b] <= m - 2 and per_topic[topic][b] + 1 <= bounds[topic][1],
        )
        if chain is None:
            break
        for moved, taker in chain:
            hand_over(moved, taker)

    for tp, leader in led_by.items():
        replicas[tp].remove(leader)
        replicas[tp].insert(0, leader)


def _leadership_chain(
    starts: list[int],
    hand_overs: Callable[[int, str | None], list[tuple[TopicPartition, int]]],
    is_end: Callable[[int, str], bool],
) -> list[tuple[TopicPartition, int]] | None:
    """The shortest chain of hand-overs (breadth first) from one of `starts` to a broker that `is_end` accepts,
    given the topic of the leadership it takes, passing each broker once. `hand_overs(giver, taken)`: the
    leaderships the giver can hand on, and to whom, having taken one of topic `taken` (None: the first broker)."""
    Hop = tuple[int, str | None]  # a broker and the topic of the leadership it took
    came_from: dict[Hop, tuple[Hop, TopicPartition] | None] = {(b, None): None for b in starts}
    frontier: list[Hop] = list(came_from)
    while frontier:
        following = []
        for hop in frontier:
            for tp, taker in hand_overs(*hop):
                reached = (taker, tp.topic)
                if reached in came_from:
                    continue
                came_from[reached] = (hop, tp)
                chain = []
                node = reached
                while (back := came_from[node]) is not None:
                    chain.append((back[1], node[0]))
                    node = back[0]
                passed = [node[0], *(b for _, b in chain)]
                if len(set(passed)) < len(passed):
                    continue  # back at a broker already on the chain: its counts would be judged twice
                if is_end(taker, tp.topic):
                    return chain[::-1]
                following.append(reached)
        frontier = following
    return None
