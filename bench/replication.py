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
Throughput counts message payload bytes (1 MB = 10^6 bytes). Every message must be acknowledged.

    python bench/replication.py            # ~1.5 minutes
    python bench/replication.py --quick    # a smoke run

Writes `bench/results/replication.json` (machine, parameters, results) and `bench/results/replication.png`.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    TIMEOUT_S,
    argument_parser,
    machine_info,
    paired_bars,
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


LATENCY_COLORS = (("p50", "tab:green"), ("p99", "tab:red"))


def draw_configurations(axes: Sequence[Any], results: list[dict[str, Any]]) -> None:
    """Saturated throughput, then the p50 and p99 produce latency of the paced and the saturated phase."""
    throughput = [r["saturated"]["mb_per_s"] for r in results]
    bars = axes[0].bar(range(len(results)), throughput, 0.6, color="tab:blue")
    axes[0].bar_label(
        bars,
        labels=[
            f"{v:,.1f} MB/s\n{r['saturated']['msgs_per_s']:,} msg/s" for v, r in zip(throughput, results, strict=True)
        ],
        fontsize=8,
    )
    axes[0].set_title("saturated throughput (MB/s)")
    axes[0].set_ylim(0, max(throughput) * 1.2)  # room for the two-line labels above the bars
    axes[0].set_ylabel("MB/s (10^6 payload bytes)")

    for ax, phase, what in ((axes[1], "paced", "paced"), (axes[2], "saturated", "saturated, incl. client queueing")):
        series = [(q, [r[phase]["latency_ms"][q] for r in results], color) for q, color in LATENCY_COLORS]
        paired_bars(ax, series, "{:,.1f}")
        ax.set_title(f"produce latency, {what} (ms)")
        ax.set_ylabel("ms, produce() to delivery report")


def main() -> None:
    parser = argument_parser(__doc__, "replication", "about 2 s per phase, for a smoke run")
    parser.add_argument("--seconds", type=float, default=10.0, help="saturated phase length per configuration")
    parser.add_argument("--paced-seconds", type=float, default=8.0, help="paced phase length per configuration")
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s of the paced phase")
    parser.add_argument("--size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic (leaders spread out)")
    parser.add_argument("--queue", type=int, default=20_000, help="queue.buffering.max.messages, saturated")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    paced_seconds = 2.0 if args.quick else args.paced_seconds

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-replication-"))
    overrides = {"log.retention.check.interval.ms": "300000"}
    cluster = LocalCluster(work_dir, brokers=BROKERS, overrides=overrides)
    results: list[dict[str, Any]] = []
    try:
        cluster.start(TIMEOUT_S)
        for rf, acks, min_isr in CONFIGURATIONS:
            topic = f"bench-rf{rf}-acks{acks}"
            leaders = create_topic(cluster, topic, args.partitions, rf, min_isr)
            # Connections, metadata and the followers' first fetches are set up before anything is timed.
            produce_paced(cluster.bootstrap, topic, acks, args.size, 0.5, args.rate)
            paced = produce_paced(cluster.bootstrap, topic, acks, args.size, paced_seconds, args.rate)
            saturated = produce_saturated(cluster.bootstrap, topic, acks, args.size, seconds, args.queue)
            row = {
                "replication_factor": rf,
                "acks": acks,
                "min_insync_replicas": min_isr,
                "leaders": {str(p): node for p, node in sorted(leaders.items())},
                "saturated": saturated.to_json(),
                "paced": paced.to_json(),
            }
            results.append(row)
            s, p = row["saturated"], row["paced"]
            print(
                f"RF={rf} acks={acks:>3}: saturated {s['mb_per_s']:6.1f} MB/s {s['msgs_per_s']:>8,} msg/s "
                f"p50 {s['latency_ms']['p50']:7.1f} ms p99 {s['latency_ms']['p99']:7.1f} ms | "
                f"paced {args.rate:.0f}/s p50 {p['latency_ms']['p50']:6.1f} ms p99 {p['latency_ms']['p99']:6.1f} ms",
                flush=True,
            )
    finally:
        cluster.stop(60)
        exit_codes = {n: cluster.broker(n).wait_stopped(1) for n in cluster.node_ids}
        shutil.rmtree(work_dir, ignore_errors=True)
    if any(code not in (0, None) for code in exit_codes.values()):
        print(f"warning: broker exit codes {exit_codes}", file=sys.stderr)

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
            "saturated": {
                "seconds": seconds,
                "linger.ms": 5,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": args.queue,
            },
            "paced": {"seconds": paced_seconds, "messages_per_s": args.rate, "linger.ms": 0},
            "producer": {"enable.idempotence": False, "compression.type": "none"},
            "latency": "librdkafka Message.latency(): produce() to delivery report; percentiles by nearest rank",
            "units": "MB = 10^6 payload bytes (keys are null; record overhead and replication traffic not counted)",
            "broker_settings": "defaults (replica.fetch.wait.max.ms=500, replica.fetch.min.bytes=1) plus "
            + json.dumps(overrides),
        },
        "results": results,
    }
    machine = report["machine"]
    write_report(
        args.out,
        "replication",
        report,
        title=(
            f"tierlog replication, {BROKERS} brokers on one host ({machine['cpu']}, {machine['cpu_count']} CPUs), "
            f"{args.size} B messages, {args.partitions} partitions"
        ),
        labels=[f"RF={r['replication_factor']}\nacks={r['acks']}" for r in results],
        panels=3,
        figsize=(15, 4.8),
        draw=lambda axes: draw_configurations(axes, results),
    )


if __name__ == "__main__":
    main()
