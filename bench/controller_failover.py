"""Controller failover on a local tierlog cluster: 3 dedicated controller voters (nodes 3000-3002) and 3 brokers,
with a confluent-kafka producer (acks=all, enable.idempotence=true) writing all the time to a topic with 3
replicas and min.insync.replicas=2.

`--iterations` times (default 10) the active controller (the quorum's leader, asked with DescribeQuorum as
`tierlog quorum status --bootstrap-controller` does) is killed with SIGKILL, and right after it the leader of
one of the topic's partitions (a broker). From the moment of the controller's kill it measures:

- *new active controller*: until a voter answers DescribeQuorum as the leader of a later epoch;
- *CreateTopics*: until a new topic (3 partitions, 3 replicas) is created and every partition of it has a
  leader: the new controller decides and commits again;
- *partitions led again*: until every partition of the produced topic has a leader other than the killed
  broker: the new controller fenced the broker (after broker.session.timeout.ms) and elected new leaders;

then restarts the killed controller and times until it caught up with the quorum (its log end offset reaches
the high watermark), and restarts the killed broker and waits until it is back in every ISR.

At the end the producer stops and every acknowledged record must be read back (none lost; duplicates are
counted too), and every topic must still be there, the ones created during the failovers included.

    python bench/controller_failover.py                 # 10 failovers, ~4 minutes
    python bench/controller_failover.py --quick         # 2 failovers, for a smoke run

Writes `bench/results/controller_failover.json` (machine, parameters, every failover, the distribution of
each time) and `bench/results/controller_failover.png`.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import TIMEOUT_S, argument_parser, machine_info, write_report
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.cli.clients import CliError, bootstrap_addresses
from tierlog.cli.quorum import QuorumStatus, describe_quorum
from tierlog.client.security import PLAINTEXT
from tierlog.testing.local_cluster import LocalCluster

BROKERS = 3
CONTROLLERS = 3
TOPIC = "failover-events"
PARTITIONS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
POLL_S = 0.05
# Kafka's defaults for the quorum (controller.quorum.election.timeout.ms=1000, fetch.timeout.ms=2000); the
# broker session is shortened as in `tierlog demo`, or fencing a killed broker (Kafka's 9 s) would dominate.
OVERRIDES = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
MEASURES = (
    ("new_controller_s", "new active controller (DescribeQuorum)", "tab:blue"),
    ("create_topics_s", "CreateTopics succeeds, partitions led", "tab:green"),
    ("partitions_led_again_s", "killed broker's partitions led again", "tab:orange"),
    ("controller_caught_up_s", "restarted controller caught up", "tab:gray"),
)


class ContinuousProducer:
    """A paced idempotent acks=all producer in a thread of its own; every value is its sequence number."""

    def __init__(self, bootstrap: str, rate: float) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                # Long enough to ride out any failover here: a record is either acknowledged or reported failed.
                "message.timeout.ms": int(TIMEOUT_S * 1000),
            }
        )
        self.rate = rate
        self.sent = 0
        self.acknowledged: set[int] = set()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error.str())
        else:
            self.acknowledged.add(int(message.value()))

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            # Catch up with the schedule, so a slow poll does not lower the rate.
            due = int((time.monotonic() - started) * self.rate) + 1
            while self.sent < due:
                try:
                    self.producer.produce(TOPIC, str(self.sent).encode(), on_delivery=self._on_delivery)
                    self.sent += 1
                except BufferError:
                    break
            self.producer.poll(0.01)

    def stop(self) -> int:
        """Stop producing and wait for every delivery report; the number still unresolved."""
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        return self.producer.flush(TIMEOUT_S)


def quorum_status(cluster: LocalCluster, timeout_s: float = 2.0) -> QuorumStatus:
    """DescribeQuorum to every voter at once, the leader's answer; CliError while none leads."""
    addresses = bootstrap_addresses(",".join(cluster.controller_addresses))
    return asyncio.run(describe_quorum(addresses, PLAINTEXT, ask_cluster_id=False, timeout_s=timeout_s))


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(POLL_S)


def current_quorum(cluster: LocalCluster) -> QuorumStatus:
    found: list[QuorumStatus] = []

    def answered() -> bool:
        try:
            found.append(quorum_status(cluster))
        except CliError:
            return False
        return True

    wait_for(answered, "no voter leads the controller quorum")
    return found[-1]


def topic_partitions(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int]]] | None:
    """partition -> (leader, ISR) as a broker's Metadata says, None without an answer."""
    try:
        metadata = admin.list_topics(topic=topic, timeout=2).topics.get(topic)
    except KafkaException:
        return None
    if metadata is None or metadata.error is not None:
        return None
    return {p.id: (p.leader, list(p.isrs)) for p in metadata.partitions.values()}


def time_until(condition: Callable[[], bool], since: float, stopped: threading.Event) -> float | None:
    """Seconds from `since` (monotonic) until `condition` holds, polled; None if `stopped` first."""
    while not stopped.is_set():
        if condition():
            return time.monotonic() - since
        stopped.wait(POLL_S)
    return None


def fail_over(cluster: LocalCluster, admin: AdminClient, iteration: int) -> dict[str, Any]:
    before = current_quorum(cluster)
    leaders = topic_partitions(admin, TOPIC)
    if leaders is None:
        raise RuntimeError(f"no metadata for {TOPIC}")
    partition = iteration % PARTITIONS
    broker = leaders[partition][0]
    probe_topic = f"failover-probe-{iteration}"

    def new_controller() -> bool:
        try:
            status = quorum_status(cluster)
        except CliError:
            return False
        return status.leader_id != before.leader_id and status.leader_epoch > before.leader_epoch

    def topic_created() -> bool:
        future = admin.create_topics(
            [NewTopic(probe_topic, PARTITIONS, REPLICATION_FACTOR)], request_timeout=2, operation_timeout=2
        )[probe_topic]
        try:
            future.result(timeout=5)
        except KafkaException as e:
            # A request that timed out may have been carried out: then the retry finds the topic there.
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                return False
        created = topic_partitions(admin, probe_topic)
        return created is not None and len(created) == PARTITIONS and all(lead >= 0 for lead, _ in created.values())

    def partitions_led_again() -> bool:
        now = topic_partitions(admin, TOPIC)
        return now is not None and all(lead not in (broker, -1) for lead, _ in now.values())

    killed_at = time.monotonic()
    cluster.kill(before.leader_id)
    cluster.kill(broker)
    stopped = threading.Event()
    with ThreadPoolExecutor(max_workers=3) as pool:
        watches = [pool.submit(time_until, check, killed_at, stopped) for check in (new_controller, topic_created)]
        watches.append(pool.submit(time_until, partitions_led_again, killed_at, stopped))
        try:
            times = [watch.result(timeout=TIMEOUT_S) for watch in watches]
        finally:
            stopped.set()
    after = current_quorum(cluster)

    restarted_at = time.monotonic()
    cluster.restart(before.leader_id, TIMEOUT_S)

    def caught_up() -> bool:
        try:
            status = quorum_status(cluster)
        except CliError:
            return False
        voter = next(v for v in status.voters if v.node_id == before.leader_id)
        return voter.log_end_offset >= status.high_watermark

    wait_for(caught_up, f"controller {before.leader_id} catching up")
    caught_up_s = time.monotonic() - restarted_at
    cluster.restart(broker, TIMEOUT_S)

    def back_in_every_isr() -> bool:
        now = topic_partitions(admin, TOPIC)
        return now is not None and all(broker in isr for _, isr in now.values())

    wait_for(back_in_every_isr, f"broker {broker} rejoining every ISR of {TOPIC}")
    new_controller_s, create_topics_s, partitions_led_again_s = times
    return {
        "killed_controller": before.leader_id,
        "epoch_before": before.leader_epoch,
        "new_controller": after.leader_id,
        "epoch_after": after.leader_epoch,
        "killed_broker": broker,
        "led_partition": partition,
        "new_controller_s": round_s(new_controller_s),
        "create_topics_s": round_s(create_topics_s),
        "partitions_led_again_s": round_s(partitions_led_again_s),
        "controller_caught_up_s": round_s(caught_up_s),
    }


def round_s(seconds: float | None) -> float:
    if seconds is None:
        raise RuntimeError("a watch stopped before its condition held")
    return round(seconds, 3)


def distribution(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "median": round(statistics.median(ordered), 3),
        # Nearest rank: the time that 90% of the failovers did not exceed (the 9th of 10).
        "p90": ordered[math.ceil(0.9 * len(ordered)) - 1],
        "max": ordered[-1],
    }


def read_back(bootstrap: str) -> list[int]:
    """Every value in the topic, from offset 0 to each partition's high watermark."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False}
    )  # group.id is required by librdkafka; assign() only
    values: list[int] = []
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        positions = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + TIMEOUT_S
        while any(positions[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {TOPIC} back: at {positions}, high watermarks {ends}")
            for message in consumer.consume(num_messages=10_000, timeout=1):
                if message.error() is not None:
                    raise RuntimeError(f"reading {TOPIC} back: {message.error()}")
                values.append(int(message.value()))
                positions[message.partition()] = message.offset() + 1
    finally:
        consumer.close()
    return values


def draw(axes: Sequence[Any], failovers: list[dict[str, Any]]) -> None:
    ax = axes[0]
    width = 0.8 / len(MEASURES)
    for i, (key, label, color) in enumerate(MEASURES):
        values = [f[key] for f in failovers]
        shift = (i - (len(MEASURES) - 1) / 2) * width
        ax.bar([x + shift for x in range(len(values))], values, width, label=label, color=color)
        ax.axhline(statistics.median(values), color=color, linestyle="--", linewidth=0.8)
    ax.set_xlabel("failover (killed controller -> new active controller)")
    ax.set_ylabel("seconds from the kill (caught up: from the restart); dashed: median")
    ax.legend(fontsize=8)


def main() -> None:
    parser = argument_parser(__doc__, "controller_failover", "2 failovers, for a smoke run")
    parser.add_argument("--iterations", type=int, default=10, help="failovers to measure")
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s the producer sends meanwhile")
    args = parser.parse_args()
    iterations = 2 if args.quick else args.iterations

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-failover-"))
    cluster = LocalCluster(work_dir, brokers=BROKERS, overrides=OVERRIDES, controllers=CONTROLLERS)
    failovers: list[dict[str, Any]] = []
    try:
        cluster.start(TIMEOUT_S)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        config = {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, REPLICATION_FACTOR, config=config)])[TOPIC].result(TIMEOUT_S)
        wait_for(
            lambda: (
                (now := topic_partitions(admin, TOPIC)) is not None
                and all(len(isr) == REPLICATION_FACTOR for _, isr in now.values())
            ),
            f"{TOPIC} fully in sync",
        )
        producer = ContinuousProducer(cluster.bootstrap, args.rate)
        producer.start()
        time.sleep(1.0)  # the producer has its connections and idempotent producer id before the first kill
        for iteration in range(iterations):
            failover = fail_over(cluster, admin, iteration)
            failovers.append(failover)
            print(
                f"{iteration + 1:>2}: controller {failover['killed_controller']} (epoch {failover['epoch_before']})"
                f" -> {failover['new_controller']} (epoch {failover['epoch_after']}) in "
                f"{failover['new_controller_s']:.2f}s; CreateTopics {failover['create_topics_s']:.2f}s; "
                f"broker {failover['killed_broker']}'s partitions led again {failover['partitions_led_again_s']:.2f}s;"
                f" caught up {failover['controller_caught_up_s']:.2f}s",
                flush=True,
            )
        unresolved = producer.stop()
        values = read_back(cluster.bootstrap)
        topics = set(admin.list_topics(timeout=10).topics)
    finally:
        cluster.stop(60)
        shutil.rmtree(work_dir, ignore_errors=True)

    read = set(values)
    lost = sorted(producer.acknowledged - read)
    expected_topics = {TOPIC, *(f"failover-probe-{i}" for i in range(iterations))}
    durability = {
        "sent": producer.sent,
        "acknowledged": len(producer.acknowledged),
        "failed": len(producer.failures),
        "first_failure": producer.failures[0] if producer.failures else None,
        "unresolved": unresolved,
        "read_back": len(values),
        "acknowledged_lost": len(lost),
        "first_lost": lost[:10],
        "duplicates": len(values) - len(read),
        "topics_missing": sorted(expected_topics - topics),
    }
    print(f"durability: {durability}")
    report = {
        "benchmark": "tierlog controller failover: 3 dedicated controller voters, 3 brokers, confluent-kafka "
        "idempotent acks=all producer meanwhile",
        "machine": machine_info(),
        "parameters": {
            "brokers": BROKERS,
            "controllers": CONTROLLERS,
            "iterations": iterations,
            "topic": {
                "partitions": PARTITIONS,
                "replication_factor": REPLICATION_FACTOR,
                "min.insync.replicas": MIN_INSYNC_REPLICAS,
            },
            "producer": {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "messages_per_s": args.rate},
            "broker_settings": OVERRIDES,
            "quorum_settings": "Kafka's defaults: controller.quorum.election.timeout.ms=1000, fetch.timeout.ms=2000",
            "times": "seconds from the SIGKILL of the active controller (the partition leader broker is killed right "
            "after it); controller_caught_up_s from the restart of the killed controller; p90 by nearest rank",
        },
        "distribution_s": {key: distribution([f[key] for f in failovers]) for key, _, _ in MEASURES},
        "durability": durability,
        "failovers": failovers,
    }
    machine = report["machine"]
    write_report(
        args.out,
        "controller_failover",
        report,
        title=(
            f"tierlog controller failover, {CONTROLLERS} controllers + {BROKERS} brokers on one host "
            f"({machine['cpu']}, {machine['cpu_count']} CPUs)"
        ),
        labels=[f"{f['killed_controller']}->{f['new_controller']}" for f in failovers],
        panels=1,
        figsize=(12, 5),
        draw=lambda axes: draw(axes, failovers),
    )
    if lost or durability["topics_missing"]:
        print(f"FAILED: {len(lost)} acknowledged records lost, topics missing {durability['topics_missing']}")
        sys.exit(1)


if __name__ == "__main__":
    main()
