"""What the consumer-group tests share: group members in processes of their own (`Member`, running
group_member.py), a producer that keeps producing while members come and go (`ContinuousProducer`), the
admin calls that read a group's state and committed offsets, and the __consumer_offsets partition of a group
(Java's String.hashCode, as Kafka computes it), to choose a group whose coordinator a test may kill.

Every wait is bounded (`wait_until`); every process a helper started is killed when its test ends.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, NewTopic

from tierlog.testing.local_cluster import LocalCluster, wait_until

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 6

# What Kafka users set for group tests: no initial rebalance delay, a small __consumer_offsets replicated
# on every broker, and fast fencing of a killed broker so the coordinator fails over within seconds.
CLUSTER_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "auto.create.topics.enable": "false",
}

ADMIN_TIMEOUT_S = 20.0
# A rebalance after a kill -9 waits for the member's session timeout (6 s) plus a join round.
REBALANCE_S = 60.0
CATCH_UP_S = 90.0
MEMBER_EXIT_S = 30.0
MEMBER_SCRIPT = Path(__file__).with_name("group_member.py")


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: over UTF-16 code units, 32-bit two's complement arithmetic."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def offsets_partition(group_id: str, partitions: int = OFFSETS_PARTITIONS) -> int:
    """The __consumer_offsets partition of a group: Utils.abs(groupId.hashCode) % partitions, where Kafka's
    Utils.abs is Math.abs except for Integer.MIN_VALUE, which gives 0."""
    h = java_string_hash(group_id)
    return (0 if h == -(2**31) else abs(h)) % partitions


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str, partitions: int = 6, replication_factor: int = 3) -> None:
    admin = admin_client(bootstrap)
    future = admin.create_topics([NewTopic(name, partitions, replication_factor)], operation_timeout=ADMIN_TIMEOUT_S)
    future[name].result(timeout=ADMIN_TIMEOUT_S)

    def led() -> bool:
        leaders = [p.leader for p in _partitions(admin, name).values()]
        return len(leaders) == partitions and all(leader > 0 for leader in leaders)

    wait_until(led, ADMIN_TIMEOUT_S, f"a leader for every partition of {name}")


def _partitions(admin: AdminClient, topic: str) -> dict[int, Any]:
    try:
        metadata = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
    except KafkaException:
        return {}
    if metadata is None or metadata.error is not None:
        return {}
    return dict(metadata.partitions)


def partition_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    return {p: m.leader for p, m in _partitions(admin_client(bootstrap), topic).items()}


def describe_group(bootstrap: str, group: str, timeout_s: float = ADMIN_TIMEOUT_S) -> ConsumerGroupDescription:
    admin = admin_client(bootstrap)
    future = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    description: ConsumerGroupDescription = future.result(timeout=timeout_s + 1)
    return description


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """partition -> committed offset, -1 when none (OffsetFetch's -1; librdkafka says OFFSET_INVALID, -1001)."""
    admin = admin_client(bootstrap)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=ADMIN_TIMEOUT_S)
    return {tp.partition: max(tp.offset, -1) for tp in result.topic_partitions}


def end_offsets(bootstrap: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """partition -> high watermark (ListOffsets latest)."""
    from confluent_kafka.admin import OffsetSpec

    admin = admin_client(bootstrap)
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions})
    return {tp.partition: f.result(timeout=ADMIN_TIMEOUT_S).offset for tp, f in futures.items()}


def warm_up_offsets_topic(cluster: LocalCluster) -> None:
    """Have the coordinator create __consumer_offsets (FindCoordinator does, on first use) and wait until
    every partition of it has a leader, so a test can choose a group by its coordinator."""

    def ready() -> bool:
        try:
            describe_group(cluster.bootstrap, "warm-up", timeout_s=5.0)
        except (KafkaException, TimeoutError):
            return False
        leaders = partition_leaders(cluster.bootstrap, OFFSETS_TOPIC)
        return len(leaders) == OFFSETS_PARTITIONS and all(leader > 0 for leader in leaders.values())

    wait_until(ready, 60.0, "__consumer_offsets with a leader for every partition", interval_s=0.5)


def group_coordinated_by(cluster: LocalCluster, nodes: set[int], prefix: str) -> tuple[str, int]:
    """A fresh group id whose __consumer_offsets partition is led by one of `nodes` now, and that node."""
    leaders = partition_leaders(cluster.bootstrap, OFFSETS_TOPIC)
    for _ in range(1000):
        group = unique(prefix)
        leader = leaders.get(offsets_partition(group))
        if leader in nodes:
            return group, leader
    raise AssertionError(f"no __consumer_offsets partition is led by {sorted(nodes)}: leaders {leaders}")


@dataclass(frozen=True, order=True)
class Consumed:
    partition: int
    offset: int
    value: str


class Member:
    """A group_member.py process; its JSON lines are collected by a reader thread."""

    def __init__(
        self,
        name: str,
        *,
        client: str,
        assignor: str,
        bootstrap: str,
        topic: str,
        group: str,
        log_dir: Path,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.stderr_file = log_dir / f"{name}.stderr"
        command = [sys.executable, str(MEMBER_SCRIPT), "--client", client, "--assignor", assignor]
        command += ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--name", name, *extra_args]
        with self.stderr_file.open("wb") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            with self._lock:
                self._events.append(event)

    def events(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if e["ev"] == kind]

    @property
    def assignment(self) -> set[int]:
        assigned = self.events("assigned")
        return set(assigned[-1]["partitions"]) if assigned else set()

    @property
    def records(self) -> list[Consumed]:
        return [Consumed(e["p"], e["o"], e["v"]) for e in self.events("rec")]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def leave(self) -> None:
        """SIGTERM: the member closes its consumer (leaving the group) and exits 0."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(MEMBER_EXIT_S)
        self._reader.join(MEMBER_EXIT_S)
        assert code == 0, f"{self.name} exited {code}: {self.stderr_tail()}"
        assert self.events("closed"), f"{self.name} did not close its consumer: {self.stderr_tail()}"

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait(MEMBER_EXIT_S)

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.stderr_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def describe(self) -> str:
        return f"{self.name} (alive {self.alive}, assigned {sorted(self.assignment)}, {len(self.records)} records)"


class MemberPool:
    """Starts members of one group on one topic with one client and assignor; kills leftovers at the end."""

    def __init__(self, *, client: str, assignor: str, bootstrap: str, topic: str, group: str, log_dir: Path) -> None:
        self.settings = {"client": client, "assignor": assignor, "bootstrap": bootstrap, "topic": topic}
        self.group = group
        self.log_dir = log_dir
        self.members: list[Member] = []

    def start(self, name: str, *extra_args: str) -> Member:
        """A new member; `extra_args` go to group_member.py (e.g. "--instance-id", "s1")."""
        member = Member(name, group=self.group, log_dir=self.log_dir, extra_args=extra_args, **self.settings)
        self.members.append(member)
        return member

    @property
    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive]

    def consumed(self) -> list[Consumed]:
        return [r for m in self.members for r in m.records]

    def wait_balanced(self, members: list[Member], partitions: int, timeout_s: float = REBALANCE_S) -> None:
        """Until `members` (and no one else alive) own every partition between them, each exactly once, and
        each owns at least one: the group has settled on an assignment."""

        def balanced() -> bool:
            if any(not m.alive for m in members) or set(self.live) != set(members):
                return False
            owned = [p for m in members for p in m.assignment]
            return sorted(owned) == list(range(partitions)) and all(m.assignment for m in members)

        wait_until(balanced, timeout_s, lambda: "a balanced assignment: " + "; ".join(map(Member.describe, members)))

    def close(self) -> None:
        for member in self.members:
            member.kill()
            if member.process.stdout is not None:
                member.process.stdout.close()


@contextmanager
def member_pool(**settings: Any) -> Iterator[MemberPool]:
    pool = MemberPool(**settings)
    try:
        yield pool
    finally:
        pool.close()
        for member in pool.members:
            print(f"\n---- {member.describe()}; last lines of its stderr ----\n{member.stderr_tail()}")


class ContinuousProducer:
    """Produces "0", "1", ... round-robin over the partitions from a thread (acks=all, idempotence off so
    these tests depend on the group coordinator alone) until stopped; `acked` holds what the brokers
    acknowledged. A record whose delivery failed (a leader killed mid-flight) is not in `acked`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.01) -> None:
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 5,
                "message.timeout.ms": 30000,
            }
        )
        self.acked: list[Consumed] = []
        self.failed = 0
        self._sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{topic}", daemon=True)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(Consumed(msg.partition(), msg.offset(), msg.value().decode()))
        else:
            self.failed += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.produce_one()
            self.producer.poll(0)
            self._stop.wait(self.interval_s)

    def produce_one(self) -> None:
        value = str(self._sent)
        self.producer.produce(
            self.topic, value=value.encode(), partition=self._sent % self.partitions, on_delivery=self._on_delivery
        )
        self._sent += 1

    def produce(self, count: int) -> None:
        """Produce `count` records now (the thread must be stopped) and wait for their acknowledgements."""
        for _ in range(count):
            self.produce_one()
        self.flush()

    def start(self) -> ContinuousProducer:
        self._thread.start()
        return self

    def flush(self) -> None:
        remaining = self.producer.flush(60.0)
        assert remaining == 0, f"{remaining} records of {self.topic} still undelivered after 60 s"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30.0)
        self.flush()


def new_topic_and_producer(bootstrap: str, prefix: str, partitions: int) -> tuple[str, ContinuousProducer]:
    """A new topic (`prefix-...`) with a leader for each of its `partitions`, and a ContinuousProducer for it, not
    started yet."""
    topic = unique(prefix)
    create_topic(bootstrap, topic, partitions)
    return topic, ContinuousProducer(bootstrap, topic, partitions)


def wait_for_progress(count: Callable[[], int], more: int, timeout_s: float, what: str) -> None:
    """Until `count()` has grown by `more` from its value now."""
    start = count()
    wait_until(lambda: count() >= start + more, timeout_s, lambda: f"{what}: {count() - start} of {more}")


def wait_committed_at_end(bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float) -> dict[int, int]:
    """Until the group's committed offsets equal the end offsets of every partition; returns them."""
    ends = end_offsets(bootstrap, topic, range(partitions))
    last: dict[int, int] = {}

    def caught_up() -> bool:
        nonlocal last
        try:
            last = committed_offsets(bootstrap, group, topic, range(partitions))
        except KafkaException:
            return False
        return last == ends

    wait_until(caught_up, timeout_s, lambda: f"committed offsets {last} of {group} to reach the ends {ends}")
    return ends


def group_in_partition(partition: int, prefix: str) -> str:
    """A fresh group id that lives in `partition` of __consumer_offsets (so it shares a coordinator)."""
    for _ in range(1000):
        group = unique(prefix)
        if offsets_partition(group) == partition:
            return group
    raise AssertionError(f"no group id of 1000 tried lives in partition {partition}")
