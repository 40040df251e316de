"""Replicated produce throughput and latency on a three-broker local tierlog cluster, with confluent-kafka.

Each configuration (replication factor, acks) gets a topic of its own on the same `LocalCluster` and is
measured twice:

- *saturated*: produce as fast as the client can for about `--seconds` (linger.ms=5, batch.size=1 MB, at
  most `--queue` messages waiting in the client), giving MB/s and msg/s; its latencies include the time a
  message waits in the client's queue behind the ones before it.
- *paced*: a fixed `--rate` messages/s with linger.ms=0 for `--paced-seconds`, far below saturation, so
  the latency is that of one produce request: for acks=all the leader append, the followers' fetches and
  the HW advance that releases the request from the produce purgatory.

Latency is librdkafka's per-message figure (`Message.latency()`): from produce() to the delivery report.
Throughput counts message payload bytes (1 MB = 10^6 bytes). Every message must be acknowledged. The saturated
phase also records the CPU time of every broker process: CPU ms per MB varies less than MB/s on a shared machine.

Before/after: `--compare-with DIR` runs the brokers of the tierlog tree DIR for the "before" rounds and this
tree's for the "after" rounds, alternating (before, after, before, after: `--rounds` each), every round on a
fresh cluster, recording the load average around each round. `--profile DIR` records every broker with py-spy
during the RF=3 acks=all saturated phase (raw collapsed stacks, DIR/<round>-broker<N>.txt) and reports the top
frames per broker.

    python bench/replication.py --compare-with ../tierlog-baseline           # ~4-6 minutes: 2 rounds per build
    python bench/replication.py --compare-with ../tierlog-baseline --quick   # ~1.5 minutes: 1 round, 2 s phases
    python bench/replication.py --profile /tmp/repl-prof --partitions 1    # this tree only, profiled

Run it with a Python that has confluent-kafka and matplotlib (e.g. PYTHONPATH=. .venv/bin/python ...).
Writes `bench/results/replication.json` (machine, parameters, every round of each build and their medians)
and `bench/results/replication.png` (before vs after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
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
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import LocalCluster

BROKERS = 3
# (replication factor, acks, min.insync.replicas of the topic): the replicated case and the baseline.
CONFIGURATIONS = ((3, "all", 2), (3, "1", 2), (1, "1", 1))
OVERRIDES = {"log.retention.check.interval.ms": "300000"}


@dataclass
class Run:
    """One measured phase: counts, wall time and every message's produce-to-acknowledgement latency."""

    messages: int
    payload_bytes: int
    seconds: float
    latencies_s: list[float]

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)

        def percentile_ms(q: float) -> float:
            # Nearest rank: the latency that q of the messages did not exceed.
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

        return {
            "messages": self.messages,
            "payload_bytes": self.payload_bytes,
            "seconds": round(self.seconds, 3),
            "msgs_per_s": round(self.messages / self.seconds),
            "mb_per_s": round(self.payload_bytes / self.seconds / 1e6, 2),
            "latency_ms": {
                "mean": round(statistics.fmean(ordered) * 1000, 2),
                "p50": percentile_ms(0.50),
                "p90": percentile_ms(0.90),
                "p99": percentile_ms(0.99),
                "max": round(ordered[-1] * 1000, 2),
            },
        }


class Deliveries:
    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.failures: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failures.append(err)
            return
        latency = msg.latency()
        if latency is not None:
            self.latencies_s.append(latency)


def finish(producer: Producer, deliveries: Deliveries, sent: int, size: int, started: float) -> Run:
    remaining = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if remaining or deliveries.failures or len(deliveries.latencies_s) != sent:
        raise RuntimeError(
            f"{remaining} undelivered, {len(deliveries.failures)} failed (first: {deliveries.failures[:1]}), "
            f"{len(deliveries.latencies_s)} of {sent} acknowledged with a latency"
        )
    return Run(sent, sent * size, elapsed, deliveries.latencies_s)


def produce_saturated(bootstrap: str, topic: str, acks: str, size: int, seconds: float, queue: int) -> Run:
    producer = Producer(producer_config(bootstrap, acks, linger_ms=5, queue=queue, timeout_s=TIMEOUT_S))
    payload = os.urandom(size)
    deliveries = Deliveries()
    started = time.perf_counter()
    sent = produce_flat_out(producer, topic, payload, deliveries, seconds)
    return finish(producer, deliveries, sent, size, started)


def produce_paced(bootstrap: str, topic: str, acks: str, size: int, seconds: float, rate: float) -> Run:
    producer = Producer(producer_config(bootstrap, acks, linger_ms=0, queue=100_000, timeout_s=TIMEOUT_S))
    payload = os.urandom(size)
    deliveries = Deliveries()
    sent = 0
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + seconds:
        # Catch up with the schedule (rate x elapsed), so a slow poll does not lower the rate.
        due = int((now - started) * rate) + 1
        while sent < due:
            producer.produce(topic, payload, on_delivery=deliveries)
            sent += 1
        producer.poll(0.001)
    return finish(producer, deliveries, sent, size, started)


def partitions_report(cluster: LocalCluster, node_id: int) -> list[dict[str, Any]]:
    url = f"http://{cluster.http_address(node_id)}/v1/partitions"
    with urllib.request.urlopen(url, timeout=5) as answer:
        partitions: list[dict[str, Any]] = json.load(answer)["partitions"]
    return partitions


def leaders_with_full_isr(cluster: LocalCluster, topic: str, partitions: int, rf: int) -> dict[int, int] | None:
    """partition -> leader once each partition's leader reports an ISR of all `rf` replicas."""
    leaders: dict[int, int] = {}
    for node_id in cluster.node_ids:
        for p in partitions_report(cluster, node_id):
            if p["topic"] == topic and p["role"] == "leader" and len(p["isr"]) == rf:
                leaders[p["partition"]] = node_id
    return leaders if len(leaders) == partitions else None


def create_topic(cluster: LocalCluster, topic: str, partitions: int, rf: int, min_isr: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new_topic = NewTopic(topic, partitions, rf, config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([new_topic], request_timeout=30)[topic].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while (leaders := leaders_with_full_isr(cluster, topic, partitions, rf)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no leader with a full ISR after {TIMEOUT_S}s")
        time.sleep(0.1)
    return leaders


BuildLabel = str  # "before" (the --compare-with tree) or "after" (this tree)
BUILD_COLORS = {"before": "tab:gray", "after": "tab:blue"}
PROFILED = (3, "all", 2)  # the configuration whose saturated phase --profile records
TOP_FRAMES = 8


def brokers_usage(cluster: LocalCluster) -> dict[int, tuple[float, int]]:
    """(user + system CPU seconds, minor page faults) each broker process has had so far (/proc/<pid>/stat): on a
    shared machine the CPU a megabyte costs is steadier than the MB/s, which depends on what else runs; page
    faults per MB show buffers the allocator hands back to the kernel and takes again."""
    ticks = os.sysconf("SC_CLK_TCK")
    usage = {}
    for node_id in cluster.node_ids:
        fields = Path(f"/proc/{cluster.broker(node_id).pid}/stat").read_text().rpartition(")")[2].split()
        usage[node_id] = ((int(fields[11]) + int(fields[12])) / ticks, int(fields[7]))  # utime, stime; minflt
    return usage


def start_profilers(cluster: LocalCluster, seconds: float, out_dir: Path, name: str) -> dict[int, tuple[Any, Path]]:
    """One `py-spy record --format raw` per broker for `seconds`: collapsed stacks, one `frame;frame;... count`
    a line, so a profile can be grepped, diffed or turned into a flame graph (flamegraph.pl, speedscope)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    profilers = {}
    for node_id in cluster.node_ids:
        path = out_dir / f"{name}-broker{node_id}.txt"
        command = [py_spy, "record", "--format", "raw", "--nonblocking", "--rate", "200"]
        command += ["--duration", str(max(1, round(seconds))), "--output", str(path)]
        command += ["--pid", str(cluster.broker(node_id).pid)]
        profilers[node_id] = (subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), path)
    return profilers


def top_frames(path: Path) -> dict[str, Any]:
    """The frames a raw py-spy profile spent the most samples in: by self time (the innermost frame) and by
    inclusive time among tierlog's own functions (what to optimise)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            if "tierlog/" in frame:
                inclusive[frame] += count
    # The process's entry frames (main, run_node, the event loop's task runner) are in nearly every sample.
    for frame in [f for f, n in inclusive.items() if n >= 0.9 * total]:
        del inclusive[frame]

    def shares(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "share": round(n / total, 3)} for f, n in counter.most_common(TOP_FRAMES)]

    return {"samples": total, "self": shares(own), "inclusive_tierlog": shares(inclusive)}


def finish_profilers(profilers: dict[int, tuple[Any, Path]], leaders: dict[int, int]) -> dict[str, Any]:
    summary = {}
    for node_id, (process, path) in profilers.items():
        _, stderr = process.communicate(timeout=TIMEOUT_S)
        if process.returncode != 0 or not path.exists():
            raise RuntimeError(f"py-spy on broker {node_id} failed: {stderr.decode(errors='replace').strip()}")
        led = sorted(p for p, leader in leaders.items() if leader == node_id)
        summary[str(node_id)] = {"file": str(path), "leads_partitions": led, **top_frames(path)}
    return summary


def run_round(args: argparse.Namespace, tree: Path, name: str) -> dict[str, Any]:
    """A fresh cluster running `tree`'s brokers; every configuration measured paced, then saturated."""
    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-replication-"))
    cluster = LocalCluster(work_dir, brokers=BROKERS, overrides=OVERRIDES)
    results: list[dict[str, Any]] = []
    profile: dict[str, Any] = {}
    load_before = os.getloadavg()
    try:
        with brokers_from(tree):
            cluster.start(TIMEOUT_S)
        for rf, acks, min_isr in CONFIGURATIONS:
            topic = f"bench-rf{rf}-acks{acks}"
            leaders = create_topic(cluster, topic, args.partitions, rf, min_isr)
            # Connections, metadata and the followers' first fetches are set up before anything is timed.
            produce_paced(cluster.bootstrap, topic, acks, args.size, 0.5, args.rate)
            paced = produce_paced(cluster.bootstrap, topic, acks, args.size, args.paced_seconds, args.rate)
            profiling = args.profile is not None and (rf, acks, min_isr) == PROFILED
            profilers = start_profilers(cluster, args.seconds, args.profile, name) if profiling else {}
            usage_before = brokers_usage(cluster)
            saturated = produce_saturated(cluster.bootstrap, topic, acks, args.size, args.seconds, args.queue)
            usage = brokers_usage(cluster)
            cpu = {n: usage[n][0] - usage_before[n][0] for n in usage}
            faults = sum(usage[n][1] - usage_before[n][1] for n in usage)
            if profiling:
                profile = finish_profilers(profilers, leaders)
            row = {
                "replication_factor": rf,
                "acks": acks,
                "min_insync_replicas": min_isr,
                "leaders": {str(p): node for p, node in sorted(leaders.items())},
                "saturated": {
                    **saturated.to_json(),
                    "broker_cpu_s": {str(n): round(seconds, 2) for n, seconds in cpu.items()},
                    "broker_cpu_ms_per_mb": round(sum(cpu.values()) * 1000 / (saturated.payload_bytes / 1e6), 3),
                    "broker_minor_faults_per_mb": round(faults / (saturated.payload_bytes / 1e6), 1),
                },
                "paced": paced.to_json(),
            }
            results.append(row)
            s, p = row["saturated"], row["paced"]
            print(
                f"{name:>9} RF={rf} acks={acks:>3}: saturated {s['mb_per_s']:6.1f} MB/s {s['msgs_per_s']:>8,} msg/s "
                f"p50 {s['latency_ms']['p50']:7.1f} ms p99 {s['latency_ms']['p99']:7.1f} ms "
                f"{s['broker_cpu_ms_per_mb']:5.2f} broker CPU ms/MB {s['broker_minor_faults_per_mb']:6.1f} faults/MB | "
                f"paced {args.rate:.0f}/s p50 {p['latency_ms']['p50']:6.1f} ms p99 {p['latency_ms']['p99']:6.1f} ms",
                flush=True,
            )
    finally:
        cluster.stop(60)
        exit_codes = {n: cluster.broker(n).wait_stopped(1) for n in cluster.node_ids}
        shutil.rmtree(work_dir, ignore_errors=True)
    if any(code not in (0, None) for code in exit_codes.values()):
        print(f"warning: broker exit codes {exit_codes}", file=sys.stderr)
    for node_id, frames in profile.items():
        print(f"  profile broker {node_id} (leads {frames['leads_partitions']}), self time:")
        for top in frames["self"][:5]:
            print(f"    {top['share']:6.1%} {top['frame']}")
    round_report = {
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    if profile:
        round_report["profile"] = profile
    return round_report


def medians(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration, the median over rounds of saturated MB/s and the paced and saturated percentiles."""
    summary = []
    for i, (rf, acks, _) in enumerate(CONFIGURATIONS):
        rows = [r["results"][i] for r in rounds]
        summary.append(
            {
                "replication_factor": rf,
                "acks": acks,
                "saturated_mb_per_s": statistics.median(r["saturated"]["mb_per_s"] for r in rows),
                "saturated_broker_cpu_ms_per_mb": statistics.median(
                    r["saturated"]["broker_cpu_ms_per_mb"] for r in rows
                ),
                "saturated_broker_minor_faults_per_mb": statistics.median(
                    r["saturated"]["broker_minor_faults_per_mb"] for r in rows
                ),
                **{
                    f"{phase}_{q}_ms": statistics.median(r[phase]["latency_ms"][q] for r in rows)
                    for phase in ("paced", "saturated")
                    for q in ("p50", "p99")
                },
            }
        )
    return summary


def draw_builds(axes: Sequence[Any], summaries: dict[BuildLabel, list[dict[str, Any]]]) -> None:
    """Per configuration, one bar per build (medians over its rounds): saturated MB/s, paced p50 and p99."""
    panels = (
        ("saturated_mb_per_s", "saturated throughput (MB/s)", "{:,.0f}"),
        ("saturated_broker_cpu_ms_per_mb", "saturated: CPU of all brokers per MB (ms)", "{:,.2f}"),
        ("paced_p50_ms", "paced produce latency p50 (ms)", "{:,.1f}"),
        ("paced_p99_ms", "paced produce latency p99 (ms)", "{:,.1f}"),
    )
    width = 0.8 / len(summaries)
    for ax, (key, title, value_format) in zip(axes, panels, strict=True):
        for j, (build, summary) in enumerate(summaries.items()):
            shift = (j - (len(summaries) - 1) / 2) * width
            values = [row[key] for row in summary]
            bars = ax.bar(
                [i + shift for i in range(len(values))], values, width, label=build, color=BUILD_COLORS[build]
            )
            ax.bar_label(bars, labels=[value_format.format(v) for v in values], fontsize=8, padding=2)
        ax.set_title(title)
        ax.legend()
    axes[0].set_ylabel("MB/s (10^6 payload bytes), median of rounds")
    axes[1].set_ylabel("broker CPU ms per MB of payload, median of rounds")
    axes[2].set_ylabel("ms, produce() to delivery report, median of rounds")


def main() -> None:
    parser = argument_parser(__doc__, "replication", "2 s phases, one round per build: about a minute")
    parser.add_argument("--seconds", type=float, default=8.0, help="saturated phase length per configuration")
    parser.add_argument("--paced-seconds", type=float, default=6.0, help="paced phase length per configuration")
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s of the paced phase")
    parser.add_argument("--size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic (leaders spread out)")
    parser.add_argument("--queue", type=int, default=20_000, help="queue.buffering.max.messages, saturated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per build, alternating before and after")
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="DIR",
        help="a tierlog tree (e.g. ../tierlog-baseline) whose brokers run the 'before' rounds, alternating",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy every broker during the RF=3 acks=all saturated phase; raw collapsed stacks go to DIR",
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds = args.paced_seconds = 2.0
        args.rounds = 1
    this_tree = Path(__file__).resolve().parent.parent
    builds: dict[BuildLabel, Path] = {"after": this_tree}
    if args.compare_with is not None:
        if not (args.compare_with / "tierlog" / "__init__.py").exists():
            parser.error(f"--compare-with {args.compare_with}: no tierlog package there")
        builds = {"before": args.compare_with.resolve(), "after": this_tree}

    rounds: dict[BuildLabel, list[dict[str, Any]]] = {build: [] for build in builds}
    for n in range(args.rounds):
        for build, tree in builds.items():
            rounds[build].append(run_round(args, tree, f"{build}-{n + 1}"))

    summaries = {build: medians(build_rounds) for build, build_rounds in rounds.items()}
    report = {
        "benchmark": "tierlog replicated produce throughput and latency, confluent-kafka client, 3 local brokers",
        "machine": machine_info(),
        "parameters": {
            "brokers": BROKERS,
            "message_bytes": args.size,
            "partitions_per_topic": args.partitions,
            "configurations": [
                {"replication_factor": rf, "acks": a, "min.insync.replicas": m} for rf, a, m in CONFIGURATIONS
            ],
            "rounds_per_build": args.rounds,
            "order": "rounds alternate the builds (before, after, before, after, ...), each on a fresh cluster",
            "saturated": {
                "seconds": args.seconds,
                "linger.ms": 5,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": args.queue,
            },
            "paced": {"seconds": args.paced_seconds, "messages_per_s": args.rate, "linger.ms": 0},
            "producer": {"enable.idempotence": False, "compression.type": "none"},
            "latency": "librdkafka Message.latency(): produce() to delivery report; percentiles by nearest rank",
            "units": "MB = 10^6 payload bytes (keys are null; record overhead and replication traffic not counted)",
            "broker_settings": "defaults (replica.fetch.wait.max.ms=500, replica.fetch.min.bytes=1) plus "
            + json.dumps(OVERRIDES),
        },
        "builds": {
            build: {"tree": str(tree), "commit": commit_of(tree), "median": summaries[build], "rounds": rounds[build]}
            for build, tree in builds.items()
        },
    }
    for build, summary in summaries.items():
        for row in summary:
            print(
                f"{build:>6} median RF={row['replication_factor']} acks={row['acks']:>3}: "
                f"saturated {row['saturated_mb_per_s']:6.1f} MB/s "
                f"{row['saturated_broker_cpu_ms_per_mb']:5.2f} CPU ms/MB | "
                f"paced p50 {row['paced_p50_ms']:5.1f} ms p99 {row['paced_p99_ms']:5.1f} ms"
            )
    machine = report["machine"]
    write_report(
        args.out,
        "replication",
        report,
        title=(
            f"tierlog replication, {BROKERS} brokers on one host ({machine['cpu']}, {machine['cpu_count']} CPUs), "
            f"{args.size} B messages, {args.partitions} partitions, {args.rounds} round(s) per build"
        ),
        labels=[f"RF={rf}\nacks={acks}" for rf, acks, _ in CONFIGURATIONS],
        panels=4,
        figsize=(19, 4.8),
        draw=lambda axes: draw_builds(axes, summaries),
    )


if __name__ == "__main__":
    main()
