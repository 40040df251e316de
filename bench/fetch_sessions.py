"""Broker CPU of followers fetching many idle partitions: fetch sessions (KIP-227, docs/performance.md#fetch-sessions)
against the same cluster without them.

A three-broker local cluster (RF 3) with one topic of `--partitions` partitions, leaders spread over the brokers,
every replica in sync and nothing produced: each broker follows two thirds of the partitions and its fetchers ask
their leaders for them whenever a parked fetch ends (replica.fetch.wait.max.ms, 500 ms). Without sessions each of
those fetches names, reads and answers every partition; with them, an idle partition is neither sent nor answered.
The figure is each broker process's CPU time (utime + stime from /proc) over `--seconds` of idling, as % of one
core; every broker is a leader and a follower alike.

`--compare-with TREE` measures the brokers of another source tree too (e.g. main before fetch sessions), round by
round alternately with this one (A B A B ...), each round a fresh cluster; the brokers of a round run with
PYTHONPATH=TREE, the benchmark itself only uses what both trees have (LocalCluster, /v1/partitions).

    python bench/fetch_sessions.py --compare-with ../tierlog-baseline          # ~4 minutes, 2 rounds each
    python bench/fetch_sessions.py --compare-with ../tierlog-baseline --quick  # ~1.5 minutes

Writes `bench/results/fetch_sessions.json` (machine, parameters, every round with the load average) and
`bench/results/fetch_sessions.png`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import TIMEOUT_S, argument_parser, brokers_from, commit_of, machine_info, paired_bars, write_report
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import LocalCluster

BROKERS = 3
TOPIC = "idle"
THIS_TREE = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def in_sync_partitions(cluster: LocalCluster) -> int:
    """How many partitions of the topic have a leader reporting all three replicas in sync."""
    count = 0
    for node_id in cluster.node_ids:
        with urllib.request.urlopen(f"http://{cluster.http_address(node_id)}/v1/partitions", timeout=10) as answer:
            partitions = json.load(answer)["partitions"]
        count += sum(1 for p in partitions if p["topic"] == TOPIC and p["role"] == "leader" and len(p["isr"]) == 3)
    return count


def measure(tree: Path, partitions: int, settle_s: float, seconds: float) -> dict[str, Any]:
    """One round: a fresh cluster whose brokers run `tree`'s code, idle with the topic in sync."""
    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-fetch-sessions-"))
    with brokers_from(tree):  # the brokers' code; this process keeps its own
        cluster = LocalCluster(work_dir, brokers=BROKERS, overrides={"log.retention.check.interval.ms": "300000"})
        try:
            cluster.start(TIMEOUT_S)
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            try:
                admin.create_topics([NewTopic(TOPIC, partitions, 3)], request_timeout=60)[TOPIC].result(TIMEOUT_S)
            except KafkaException as error:
                # A creation slower than the client's timeout is retried by it, and the retry finds the topic.
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            deadline = time.monotonic() + 4 * TIMEOUT_S
            while in_sync_partitions(cluster) < partitions:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{TOPIC} not fully in sync after {4 * TIMEOUT_S:.0f}s")
                time.sleep(0.5)
            time.sleep(settle_s)
            pids = {node_id: cluster.broker(node_id).pid for node_id in cluster.node_ids}
            started = {node_id: cpu_seconds(pid) for node_id, pid in pids.items() if pid is not None}
            began = time.monotonic()
            time.sleep(seconds)
            elapsed = time.monotonic() - began
            used = {node_id: cpu_seconds(pids[node_id]) - cpu for node_id, cpu in started.items()}  # type: ignore[arg-type]
            load = os.getloadavg()
        finally:
            cluster.stop(60)
            shutil.rmtree(work_dir, ignore_errors=True)
    per_broker = {str(node_id): round(100 * cpu / elapsed, 2) for node_id, cpu in used.items()}
    return {
        "cpu_percent_per_broker": per_broker,
        "cpu_percent_mean": round(statistics.fmean(per_broker.values()), 2),
        "seconds": round(elapsed, 2),
        "loadavg": [round(x, 2) for x in load],
    }


def main() -> None:
    parser = argument_parser(__doc__, "fetch_sessions", "100 partitions, 8 s idle per round, for a smoke run")
    parser.add_argument("--partitions", type=int, default=300, help="partitions of the idle topic (RF 3)")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time measured per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per build (alternating)")
    parser.add_argument("--compare-with", type=Path, help="source tree measured as 'before', e.g. ../tierlog-baseline")
    args = parser.parse_args()
    partitions = 100 if args.quick else args.partitions
    seconds = 8.0 if args.quick else args.seconds
    builds = {"after": THIS_TREE}
    if args.compare_with is not None:
        builds = {"before": args.compare_with.resolve(), "after": THIS_TREE}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in builds}
    for round_number in range(args.rounds):
        for name, tree in builds.items():
            result = measure(tree, partitions, settle_s=3.0, seconds=seconds)
            rounds[name].append(result)
            print(
                f"round {round_number + 1} {name:>6}: broker CPU {result['cpu_percent_per_broker']} % of a core "
                f"(mean {result['cpu_percent_mean']}), load {result['loadavg'][0]}",
                flush=True,
            )
    summary = {
        name: {
            "cpu_percent_mean_per_broker": round(statistics.fmean(r["cpu_percent_mean"] for r in results), 2),
            "commit": commit_of(builds[name]),
            "tree": str(builds[name]),
        }
        for name, results in rounds.items()
    }
    report = {
        "benchmark": "broker CPU with followers fetching many idle partitions, with and without fetch sessions",
        "machine": machine_info(),
        "parameters": {
            "brokers": BROKERS,
            "replication_factor": 3,
            "partitions": partitions,
            "idle_seconds_per_round": seconds,
            "rounds_per_build": args.rounds,
            "order": "alternating, " + " ".join(builds) + " per round",
            "broker_settings": "defaults (replica.fetch.wait.max.ms=500, replica.fetch.min.bytes=1)",
            "cpu": "utime + stime of each broker process over the idle window, % of one core",
        },
        "summary": summary,
        "rounds": rounds,
    }
    labels = list(builds)

    def draw(axes: Any) -> None:
        means = [summary[name]["cpu_percent_mean_per_broker"] for name in labels]
        low = [min(r["cpu_percent_mean"] for r in rounds[name]) for name in labels]
        paired_bars(axes[0], [("mean of rounds", means, "tab:blue"), ("lowest round", low, "tab:gray")], "{:.1f}")
        axes[0].set_title(f"CPU per broker, {partitions} idle partitions, RF 3 (% of a core)")
        axes[0].set_ylabel("% of one core")

    write_report(
        args.out,
        "fetch_sessions",
        report,
        title="followers fetching idle partitions: before / after fetch sessions",
        labels=labels,
        panels=1,
        figsize=(7, 4.5),
        draw=draw,
    )


if __name__ == "__main__":
    main()
