"""Spark reading a tiered topic: rows/s into the `noop` sink, three ways, in one run.

(a) `spark.read.format("tierlog")` with direct remote-tier reads: executors read the S3 segments straight from
    the bucket (tierlog.remote.read=direct), the local tails through the brokers;
(b) the same with tierlog.remote.read=broker: every offset through the brokers' Fetch (the broker reads S3);
(c) the same rows written once as Parquet, read with spark.read.parquet: the ceiling of what Spark reads here.

One broker (RF 1) with its remote tier on a local S3 server (SeaweedFS), a topic whose closed segments are all
in S3, one local Spark (local[*]) on the same host. After a warm-up round, each way runs --repeats times; the
median is kept. A query's time includes its planning on the driver (for direct reads: reading the remote log
metadata).
Writes `bench/results/spark.json` and `bench/results/spark.png`.
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
from pathlib import Path
from typing import Any

from common import (
    argument_parser,
    machine_info,
    produce_flat_out,
    producer_config,
    tiered_broker_overrides,
    write_report,
)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.spark.options import parse_batch_options
from tierlog.spark.pipeline import spark_session
from tierlog.spark.source import RemoteSlicePartition, TierlogBatchReader
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

BUCKET = "tierlog-bench"
PREFIX = "spark"
TOPIC = "bench-spark"
PARTITIONS = 4
NODE = 1
TIMEOUT_S = 300.0
WAYS = (
    ("direct", "(a) tierlog, remote tier read directly", "tab:green"),
    ("broker", "(b) tierlog, everything through the brokers", "tab:blue"),
    ("parquet", "(c) Parquet (ceiling)", "tab:gray"),
)


def partition_states(cluster: LocalCluster) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{cluster.http_address(NODE)}/v1/partitions", timeout=5) as answer:
        return [p for p in json.load(answer)["partitions"] if p["topic"] == TOPIC]


def remote_fetches(cluster: LocalCluster) -> float:
    with urllib.request.urlopen(f"http://{cluster.http_address(NODE)}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return sum(
        float(line.rpartition(" ")[2]) for line in lines if line.startswith("tierlog_remote_fetch_requests_total")
    )


def produce(bootstrap: str, records: int, size: int) -> None:
    producer = Producer(producer_config(bootstrap, 1, linger_ms=5, queue=1_000_000, timeout_s=TIMEOUT_S))
    # JSON-ish values of `size` bytes, the shape an ETL job reads.
    payload = json.dumps({"user": "user-042", "type": "purchase", "pad": "x" * max(size - 40, 0)}).encode()[:size]
    failures: list[Any] = []
    sent = produce_flat_out(
        producer, TOPIC, payload, lambda e, _m: failures.append(e) if e else None, TIMEOUT_S, max_messages=records
    )
    if producer.flush(TIMEOUT_S) or failures or sent != records:
        raise RuntimeError(f"producing failed: {failures[:1]}")


def main() -> None:
    parser = argument_parser(__doc__, "spark", "200,000 records in 1 MiB segments, 1 round, for a smoke run")
    parser.add_argument("--records", type=int, default=2_000_000, help="records produced (over 4 partitions)")
    parser.add_argument("--size", type=int, default=100, help="record value size in bytes")
    parser.add_argument("--segment-bytes", type=int, default=8 * 1024 * 1024, help="segment.bytes of the topic")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every measurement; the median is kept")
    args = parser.parse_args()
    records = 200_000 if args.quick else args.records
    repeats = 1 if args.quick else args.repeats
    segment_bytes = 1024 * 1024 if args.quick else args.segment_bytes

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-spark-"))
    s3 = LocalS3Server(work_dir / "s3")
    rsm = s3.rsm_properties(BUCKET, PREFIX)
    overrides = tiered_broker_overrides(rsm, brokers=1)
    cluster = LocalCluster(work_dir / "cluster", brokers=1, overrides=overrides)
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {key: [] for key, _, _ in WAYS}
    plan: dict[str, Any] = {}
    try:
        s3.start(60)
        s3.create_bucket(BUCKET)
        cluster.start(TIMEOUT_S)
        configs = {
            "remote.storage.enable": "true",
            "segment.bytes": str(segment_bytes),
            "local.retention.bytes": "1",
        }
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=configs)])[TOPIC].result(TIMEOUT_S)
        started = time.perf_counter()
        produce(cluster.bootstrap, records, args.size)
        print(f"produced {records:,} x {args.size} B in {time.perf_counter() - started:.1f} s", flush=True)
        wait_until(
            lambda: (
                len(states := partition_states(cluster)) == PARTITIONS
                and all(s["local_log_start_offset"] == s["highest_offset_in_remote_storage"] + 1 > 0 for s in states)
            ),
            TIMEOUT_S,
            lambda: f"every closed segment of {TOPIC} in S3: {partition_states(cluster)}",
        )
        in_s3 = sum(s["local_log_start_offset"] for s in partition_states(cluster))
        print(f"{in_s3:,} of {records:,} records are in S3 only", flush=True)

        options = {
            "kafka.bootstrap.servers": cluster.bootstrap,
            "subscribe": TOPIC,
            # The broker path gets as many tasks as the direct one has segments, so both use every core.
            "minPartitions": str(max(2 * (os.cpu_count() or 1), 8)),
            **{f"tierlog.remote.{key}": value for key, value in rsm.items()},
        }
        planned = TierlogBatchReader(parse_batch_options(options | {"tierlog.remote.read": "direct"})).partitions()
        plan = {
            "direct_tasks": len(planned),
            "direct_tasks_reading_s3": sum(isinstance(p, RemoteSlicePartition) for p in planned),
        }
        spark = spark_session("tierlog-bench-spark")
        try:
            parquet = str(work_dir / "parquet")
            spark.read.format("tierlog").options(**options).load().write.parquet(parquet)
            # Round 0 warms up (Python workers, JIT, connections) and is not kept.
            for round_number in range(repeats + 1):
                for key, _, _ in WAYS:
                    if key == "parquet":
                        frame = spark.read.parquet(parquet)
                    else:
                        frame = spark.read.format("tierlog").options(**options, **{"tierlog.remote.read": key}).load()
                    before = remote_fetches(cluster)
                    started = time.perf_counter()
                    frame.write.format("noop").mode("overwrite").save()
                    seconds = time.perf_counter() - started
                    served = remote_fetches(cluster) - before
                    if key == "direct" and served:
                        raise RuntimeError(f"the direct read made the broker serve {served} remote fetches")
                    if round_number:
                        runs[key].append(seconds)
                    warm = "" if round_number else " (warm-up, not kept)"
                    print(f"{key:>8}: {records / seconds:>12,.0f} rows/s ({seconds:.2f} s){warm}", flush=True)
        finally:
            spark.stop()
    finally:
        try:
            cluster.stop(60)
        finally:
            s3.stop()
            shutil.rmtree(work_dir, ignore_errors=True)

    results = {key: {"seconds": round(statistics.median(runs[key]), 3)} for key, _, _ in WAYS}
    for key in results:
        results[key]["rows_per_s"] = round(records / results[key]["seconds"])
        results[key]["runs_seconds"] = [round(s, 3) for s in runs[key]]
    ratio = results["parquet"]["rows_per_s"] / results["direct"]["rows_per_s"]
    machine = machine_info()
    machine["load_average_1_5_15_min"] = {"before": load_before, "after": os.getloadavg()}
    report = {
        "benchmark": "Spark batch reads into the noop sink: tierlog direct remote-tier reads vs through the brokers "
        "vs Parquet, one local broker, SeaweedFS and Spark local[*] on the same host",
        "machine": machine,
        "parameters": {
            "records": records,
            "record_bytes": args.size,
            "partitions": PARTITIONS,
            "segment_bytes": segment_bytes,
            "records_in_s3_only": in_s3,
            "repeats": repeats,
            "spark_master": "local[*]",
            **plan,
        },
        "results": results,
        "parquet_over_direct": round(ratio, 2),
        "goal": "direct within 2x of Parquet (parquet_over_direct <= 2)",
    }

    def draw(axes: Any) -> None:
        ax = axes[0]
        values = [results[key]["rows_per_s"] for key, _, _ in WAYS]
        bars = ax.bar(range(len(WAYS)), values, color=[color for _, _, color in WAYS])
        ax.bar_label(bars, labels=[f"{v / 1e3:,.0f}k" for v in values], fontsize=9, padding=2)
        ax.set_ylabel("rows/s into the noop sink")

    write_report(
        args.out,
        "spark",
        report,
        title=f"Spark reading {records:,} records of {args.size} B ({in_s3:,} in S3): Parquet is {ratio:.1f}x direct",
        labels=[label for _, label, _ in WAYS],
        panels=1,
        figsize=(9, 4.5),
        draw=draw,
    )


if __name__ == "__main__":
    sys.exit(main())
