"""Many partitions: 1,000 partitions over 3 local brokers (RF 3), 10 of them busy, with confluent-kafka.

One round starts a fresh `LocalCluster` of 3 brokers (node 1 is also the controller) and measures:

- *memory per partition*: each broker's RSS with a handful of partitions (a 10-partition "busy" topic and a
  1-partition "reference" topic, RF 3) and again once a topic of `--partitions - 10` idle partitions is created
  and every partition has its full ISR; the difference divided by the partitions added (every broker holds a
  replica of each). The creation time (CreateTopics to every partition fully in sync) is recorded too.
- *idle CPU*: each broker's CPU (utime + stime from /proc/<pid>/stat, in % of one core) over `--idle-seconds`
  with no client traffic, with the handful of partitions and with all of them.
- *throughput*: the same producer (acks=all, linger.ms 5, batch 1 MB, 1 KiB records) for `--seconds` into the
  10 busy partitions and into the 1-partition reference topic of the same cluster, then a consumer reading
  each back; MB = 10^6 payload bytes.
- *restart after kill -9*: `--data-gb` GB of records (payload; RF 3, so each broker holds that much) are
  produced into the busy partitions, then broker 3 is SIGKILLed and started again at once: the time to
  answer ApiVersions, and to every partition having its full ISR again (broker 3 caught up and re-admitted).
  The data was written after the last flush, so everything after the recovery points is recovered, as Kafka
  would after an unclean shutdown.
- *restart after SIGTERM*: then broker 3 is stopped with SIGTERM (controlled shutdown: its leaderships move
  first; the time from the signal to the process's exit) and started again: the time to ApiVersions and to
  every partition fully in sync, with the same data on disk, recovered by nothing after a clean shutdown.

Goals (issue 20): idle CPU under 10% of a core per broker; busy-partition produce throughput within 20% of the
1-partition figure; restart after kill -9 within 30 s (to every partition in sync).

With `--compare-with DIR` the rounds alternate between the brokers of DIR (the "before" build, e.g. the
baseline worktree, run with PYTHONPATH=DIR) and of this tree ("after"): before, after, before, after, ...,
`--rounds` of each. The JSON keeps every round, the load average before each, and both trees' commits.

    python bench/many_partitions.py --compare-with ../tierlog-baseline   # 2 rounds of each build, 0.5 GB per broker
    python bench/many_partitions.py --data-gb 10 --rounds 1            # the issue's 10 GB on the restarted broker
    python bench/many_partitions.py --quick                            # 300 partitions, 0.2 GB, one round

A round takes 2-5 minutes (the restarts dominate: 4.5 minutes at a load average of 10 on 2 cores), so the
compare run takes 10-20; producing 10 GB adds about 4 minutes per round at the 40 MB/s seen here.

Writes `bench/results/many_partitions.json` and `bench/results/many_partitions.png`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import (
    TIMEOUT_S,
    argument_parser,
    brokers_from,
    commit_of,
    machine_info,
    produce_flat_out,
    producer_config,
    write_report,
)
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import LocalCluster, wait_until

BROKERS = 3
RESTARTED = 3  # not node 1, the only controller: restarting it would stop the whole cluster's metadata
BUSY_PARTITIONS = 10
IDLE_TOPIC_PARTITIONS = 100
MESSAGE_BYTES = 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
THIS_TREE = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the line, 12 and 13 after "pid (comm) state".
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def broker_pids(cluster: LocalCluster) -> dict[int, int]:
    pids = {node: cluster.broker(node).pid for node in cluster.broker_ids}
    return {node: pid for node, pid in pids.items() if pid is not None}


def idle_cpu_percent(cluster: LocalCluster, seconds: float) -> dict[str, float]:
    """% of one core each broker used over `seconds` with no client traffic."""
    pids = broker_pids(cluster)
    before = {node: cpu_seconds(pid) for node, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {str(node): round((cpu_seconds(pid) - before[node]) / elapsed * 100, 2) for node, pid in pids.items()}


def partitions_report(cluster: LocalCluster, node_id: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{cluster.http_address(node_id)}/v1/partitions", timeout=10) as answer:
        partitions: list[dict[str, Any]] = json.load(answer)["partitions"]
    return partitions


def fully_in_sync(cluster: LocalCluster, expected: int) -> bool:
    """Every one of the `expected` partitions has a leader reporting an ISR of all three replicas."""
    in_sync: set[tuple[str, int]] = set()
    for node_id in cluster.broker_ids:
        if not cluster.broker(node_id).running:
            continue
        try:
            report = partitions_report(cluster, node_id)
        except OSError:
            continue
        in_sync.update(
            (p["topic"], p["partition"]) for p in report if p["role"] == "leader" and len(p["isr"]) == BROKERS
        )
    return len(in_sync) >= expected


def wait_in_sync(cluster: LocalCluster, expected: int, timeout_s: float) -> float:
    started = time.monotonic()
    # Polled once a second: each poll serialises every partition on every broker, which the brokers feel.
    wait_until(lambda: fully_in_sync(cluster, expected), timeout_s, f"{expected} partitions in sync", 1.0)
    return time.monotonic() - started


def create_topics(cluster: LocalCluster, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, count, BROKERS, config={"min.insync.replicas": "2"}) for name, count in topics.items()],
        request_timeout=TIMEOUT_S,
    )
    for name, future in futures.items():
        try:
            future.result(TIMEOUT_S)
        except Exception as e:  # a retried CreateTopics that the first attempt already carried out
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating {name}: {e}") from None


def idle_topics(partitions: int) -> dict[str, int]:
    """The idle partitions as topics of at most IDLE_TOPIC_PARTITIONS, created one after the other: a broker applies
    a new topic's partitions in one go on its event loop, and 1,000 at once stall it past broker.session.timeout.ms
    (docs/performance.md#many-partitions)."""
    names = {}
    for index, start in enumerate(range(0, partitions, IDLE_TOPIC_PARTITIONS)):
        names[f"idle-{index}"] = min(IDLE_TOPIC_PARTITIONS, partitions - start)
    return names


def produce(bootstrap: str, topic: str, seconds: float, acks: str, max_messages: int | None = None) -> dict[str, Any]:
    producer = Producer(producer_config(bootstrap, acks, linger_ms=5, queue=20_000, timeout_s=TIMEOUT_S))
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    payload = os.urandom(MESSAGE_BYTES)
    started = time.perf_counter()
    sent = produce_flat_out(producer, topic, payload, delivered, seconds, max_messages)
    remaining = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"{topic}: {remaining} undelivered, {len(failures)} failed (first: {failures[:1]})")
    return {"messages": sent, "seconds": round(elapsed, 3), "mb_per_s": round(sent * MESSAGE_BYTES / elapsed / 1e6, 2)}


def consume(bootstrap: str, topic: str, partitions: int, messages: int) -> dict[str, Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-unused",  # required by librdkafka; we only assign(), never join or commit
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "fetch.max.bytes": 50 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "queued.min.messages": 1_000_000,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    received = 0
    started = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while received < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: consumed {received} of {messages} within {TIMEOUT_S}s")
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    raise RuntimeError(f"{topic}: {message.error()}")
                received += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return {
        "messages": received,
        "seconds": round(elapsed, 3),
        "mb_per_s": round(received * MESSAGE_BYTES / elapsed / 1e6, 2),
    }


def restart_figures(cluster: LocalCluster, expected: int, *, kill: bool) -> dict[str, Any]:
    """Stop broker RESTARTED (SIGKILL or SIGTERM), start it again, and time it back to ApiVersions and to every
    partition in sync."""
    broker = cluster.broker(RESTARTED)
    figures: dict[str, Any] = {}
    stopping = time.monotonic()
    if kill:
        broker.kill()
    else:
        broker.terminate()
        exit_code = broker.wait_stopped(TIMEOUT_S)
        figures["controlled_shutdown_s"] = round(time.monotonic() - stopping, 2)
        figures["exit_code"] = exit_code
    started = time.monotonic()
    broker.start()
    broker.wait_ready(TIMEOUT_S)
    figures["to_api_versions_s"] = round(time.monotonic() - started, 2)
    wait_in_sync(cluster, expected, TIMEOUT_S * 2)
    figures["to_all_in_sync_s"] = round(time.monotonic() - started, 2)
    return figures


def disk_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def one_round(tree: Path, partitions: int, idle_seconds: float, seconds: float, data_gb: float) -> dict[str, Any]:
    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-many-"))
    cluster = LocalCluster(work_dir, brokers=BROKERS)
    result: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()]}
    try:
        with brokers_from(tree):
            cluster.start(TIMEOUT_S)
            create_topics(cluster, {"busy": BUSY_PARTITIONS, "reference": 1})
            handful = BUSY_PARTITIONS + 1
            wait_in_sync(cluster, handful, TIMEOUT_S)
            time.sleep(2)
            pids = broker_pids(cluster)
            rss_small = {node: rss_mb(pid) for node, pid in pids.items()}
            result["idle_cpu_percent_handful"] = idle_cpu_percent(cluster, min(idle_seconds, 10))

            created = time.monotonic()
            for name, count in idle_topics(partitions - BUSY_PARTITIONS).items():
                create_topics(cluster, {name: count})
            wait_in_sync(cluster, partitions + 1, TIMEOUT_S * 3)
            result["create_to_all_in_sync_s"] = round(time.monotonic() - created, 2)
            time.sleep(5)  # the last ISR changes and checkpoints settle
            result["idle_cpu_percent"] = idle_cpu_percent(cluster, idle_seconds)
            rss_many = {node: rss_mb(pid) for node, pid in pids.items()}
            added = partitions - BUSY_PARTITIONS
            result["rss_mb_handful"] = {str(n): round(v, 1) for n, v in rss_small.items()}
            result["rss_mb"] = {str(n): round(v, 1) for n, v in rss_many.items()}
            result["kb_per_partition"] = {
                str(n): round((rss_many[n] - rss_small[n]) * 1024 / added, 1) for n in rss_many
            }

            busy = produce(cluster.bootstrap, "busy", seconds, "all")
            reference = produce(cluster.bootstrap, "reference", seconds, "all")
            result["produce"] = {"busy": busy, "reference": reference}
            result["consume"] = {
                "busy": consume(cluster.bootstrap, "busy", BUSY_PARTITIONS, busy["messages"]),
                "reference": consume(cluster.bootstrap, "reference", 1, reference["messages"]),
            }

            fill_messages = int(data_gb * 1e9 / MESSAGE_BYTES)
            result["fill"] = produce(cluster.bootstrap, "busy", 0, "1", max_messages=fill_messages)
            result["restarted_broker_disk_gb"] = round(disk_gb(work_dir / f"broker-{RESTARTED}"), 2)
            result["restart_after_kill"] = restart_figures(cluster, partitions + 1, kill=True)
            result["restart_after_sigterm"] = restart_figures(cluster, partitions + 1, kill=False)
    finally:
        cluster.stop(60)
        shutil.rmtree(work_dir, ignore_errors=True)
    return result


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of one build, and the goals checked on them."""

    def median(values: Sequence[float]) -> float:
        return round(statistics.median(values), 2)

    idle = median([max(r["idle_cpu_percent"].values()) for r in rounds])
    ratio = median([r["produce"]["busy"]["mb_per_s"] / r["produce"]["reference"]["mb_per_s"] for r in rounds])
    kill_restart = median([r["restart_after_kill"]["to_all_in_sync_s"] for r in rounds])
    return {
        "idle_cpu_percent_busiest_broker": idle,
        "idle_cpu_percent_mean_broker": median([statistics.fmean(r["idle_cpu_percent"].values()) for r in rounds]),
        "busy_over_reference_produce": ratio,
        "busy_over_reference_consume": median(
            [r["consume"]["busy"]["mb_per_s"] / r["consume"]["reference"]["mb_per_s"] for r in rounds]
        ),
        "kb_per_partition": median([statistics.fmean(r["kb_per_partition"].values()) for r in rounds]),
        "create_to_all_in_sync_s": median([r["create_to_all_in_sync_s"] for r in rounds]),
        "controlled_shutdown_s": median([r["restart_after_sigterm"]["controlled_shutdown_s"] for r in rounds]),
        "sigterm_restart_to_all_in_sync_s": median([r["restart_after_sigterm"]["to_all_in_sync_s"] for r in rounds]),
        "kill_restart_to_all_in_sync_s": kill_restart,
        "goals": {
            "idle_cpu_under_10_percent_per_broker": idle < 10,
            "busy_throughput_within_20_percent": ratio >= 0.8,
            "kill_restart_within_30_s": kill_restart <= 30,
        },
    }


PANELS = (
    ("idle CPU, busiest broker (% of a core)", "idle_cpu_percent_busiest_broker"),
    ("busy / 1-partition produce MB/s", "busy_over_reference_produce"),
    ("memory per partition (KB)", "kb_per_partition"),
    ("controlled shutdown (s)", "controlled_shutdown_s"),
    ("SIGTERM restart to all in sync (s)", "sigterm_restart_to_all_in_sync_s"),
    ("kill -9 restart to all in sync (s)", "kill_restart_to_all_in_sync_s"),
)


def draw(axes: Sequence[Any], builds: dict[str, dict[str, Any]]) -> None:
    colors = {"before": "tab:gray", "after": "tab:blue"}
    for ax, (title, key) in zip(axes, PANELS, strict=True):
        names = list(builds)
        values = [builds[name]["summary"][key] for name in names]
        bars = ax.bar(range(len(names)), values, 0.6, color=[colors[name] for name in names])
        ax.bar_label(bars, labels=[f"{v:,.2f}" for v in values], fontsize=8)
        ax.set_title(title, fontsize=9)


def main() -> None:
    parser = argument_parser(__doc__, "many_partitions", "300 partitions, 8 s idle, 2 s produce, 0.2 GB, 1 round")
    parser.add_argument("--compare-with", type=Path, help="a tree whose brokers are the 'before' build")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each build (they alternate)")
    parser.add_argument("--partitions", type=int, default=1000, help="partitions in all, 10 of them busy")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="how long idle CPU is measured")
    parser.add_argument("--seconds", type=float, default=4.0, help="produce phase per topic")
    parser.add_argument(
        "--data-gb", type=float, default=0.5, help="GB of payload produced before the restarts (on every broker)"
    )
    args = parser.parse_args()
    if args.quick:
        partitions, idle_seconds, seconds, data_gb, rounds = 300, 8.0, 2.0, 0.2, 1
    else:
        partitions, idle_seconds, seconds, data_gb, rounds = (
            args.partitions,
            args.idle_seconds,
            args.seconds,
            args.data_gb,
            args.rounds,
        )
    trees = {"after": THIS_TREE}
    if args.compare_with is not None:
        trees = {"before": args.compare_with.resolve(), "after": THIS_TREE}
    builds: dict[str, dict[str, Any]] = {
        name: {"tree": str(tree), "commit": commit_of(tree), "rounds": []} for name, tree in trees.items()
    }
    for round_number in range(rounds):
        for name, tree in trees.items():
            print(f"round {round_number + 1}/{rounds}, {name} ({tree}) ...", flush=True)
            result = one_round(tree, partitions, idle_seconds, seconds, data_gb)
            builds[name]["rounds"].append(result)
            print(
                f"  idle CPU {result['idle_cpu_percent']} % | busy {result['produce']['busy']['mb_per_s']} MB/s vs "
                f"1-partition {result['produce']['reference']['mb_per_s']} MB/s | "
                f"{statistics.fmean(result['kb_per_partition'].values()):.0f} KB/partition | "
                f"kill -9 {result['restart_after_kill']} | SIGTERM {result['restart_after_sigterm']}",
                flush=True,
            )
    for build in builds.values():
        build["summary"] = summary(build["rounds"])
        print(f"{build['tree']}: {json.dumps(build['summary'])}")

    report = {
        "benchmark": "tierlog with many partitions: 3 local brokers, RF 3, 10 busy partitions, confluent-kafka",
        "machine": machine_info(),
        "parameters": {
            "brokers": BROKERS,
            "partitions": partitions,
            "busy_partitions": BUSY_PARTITIONS,
            "replication_factor": BROKERS,
            "min.insync.replicas": 2,
            "message_bytes": MESSAGE_BYTES,
            "idle_seconds": idle_seconds,
            "produce_seconds": seconds,
            "producer": "acks=all, linger.ms 5, batch.size 1 MB, no compression, no idempotence",
            "data_gb_per_broker": data_gb,
            "restarted_broker": RESTARTED,
            "rounds_per_build": rounds,
            "order": "rounds alternate between the builds, 'before' first",
            "broker_settings": "defaults",
            "units": "CPU % of one core; MB = 10^6 payload bytes; KB per partition = RSS difference / partitions added",
        },
        "builds": builds,
    }
    write_report(
        args.out,
        "many_partitions",
        report,
        title=f"tierlog, {partitions} partitions on 3 brokers (RF 3), {data_gb} GB per broker, medians of {rounds}",
        labels=list(builds),
        panels=len(PANELS),
        figsize=(20, 4.2),
        draw=lambda axes: draw(axes, builds),
    )
    if not all(all(b["summary"]["goals"].values()) for b in builds.values()):
        print("some goals are not met (see summary.goals)", file=sys.stderr)


if __name__ == "__main__":
    main()
