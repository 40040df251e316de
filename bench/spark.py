"""Spark reading a tiered topic: rows/s into the `noop` sink, three ways, in one run.

(a) `spark.read.format("tierlog")` with direct remote-tier reads: executors read the S3 segments straight from
    the bucket (tierlog.remote.read=direct), the local tails through the brokers;
(b) the same with tierlog.remote.read=broker: every offset through the brokers' Fetch (the broker reads S3);
(c) the same rows written once as Parquet, read with spark.read.parquet: the ceiling of what Spark reads here.

One broker (RF 1) with its remote tier on a local S3 server (SeaweedFS), a topic whose closed segments are all
in S3, one local Spark (local[*]) on the same host. Each round starts its own Spark driver in a subprocess; after
a warm-up query of each way (not kept), each way runs --repeats times; the median of every kept run is reported.
A query's time includes its planning on the driver (for direct reads: reading the remote log metadata); each
round also times the direct plan alone, PLANS times in one process (`direct_plan` in the results: the first plan,
and the later ones, which reuse what the process kept), with its task count.

Before/after in one run: `--compare-with DIR` alternates rounds of the tierlog in DIR ("before": the broker is
restarted on its data from DIR, and the Spark driver and its Python workers import tierlog from DIR) and of this
tree ("after"), --rounds of each, B A B A ...; the load average is recorded at every round. The lead's command:

    PYTHONPATH=$PWD .venv/bin/python bench/spark.py --compare-with ../tierlog-baseline

(~6 minutes; --quick: 200,000 records in 1 MiB segments, one round each, ~1-2 minutes.)
Writes `bench/results/spark.json` and `bench/results/spark.png`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import (
    argument_parser,
    commit_of,
    machine_info,
    produce_flat_out,
    producer_config,
    tiered_broker_overrides,
    write_report,
)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

BUCKET = "tierlog-bench"
PREFIX = "spark"
TOPIC = "bench-spark"
PARTITIONS = 4
NODE = 1
TIMEOUT_S = 300.0
PLANS = 3  # direct plans timed per round
WAYS = (
    ("direct", "(a) tierlog, remote tier read directly", "tab:green"),
    ("broker", "(b) tierlog, everything through the brokers", "tab:blue"),
    ("parquet", "(c) Parquet (ceiling)", "tab:gray"),
)
THIS_TREE = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()


def partition_states(cluster: LocalCluster) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{cluster.http_address(NODE)}/v1/partitions", timeout=5) as answer:
        return [p for p in json.load(answer)["partitions"] if p["topic"] == TOPIC]


def all_closed_segments_in_s3(cluster: LocalCluster, segment_bytes: int) -> bool:
    """Every partition led, everything below its local log start in S3, and only the active segment (at most
    segment.bytes) left locally: the records in S3 only stay as they are while the benchmark reads."""
    states = partition_states(cluster)
    return len(states) == PARTITIONS and all(
        s["role"] == "leader"
        and s["local_log_start_offset"] == s["highest_offset_in_remote_storage"] + 1 > 0
        and s["local_size_bytes"] <= segment_bytes
        for s in states
    )


def remote_fetches(http_address: str) -> float:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as answer:
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


def measure_round(spec: dict[str, Any]) -> dict[str, Any]:
    """One round, in a subprocess whose PYTHONPATH names the tree under test: a Spark driver (whose Python workers
    inherit that PYTHONPATH), a warm-up query of each way, then `repeats` timed queries of each way."""
    from tierlog.spark.options import parse_batch_options
    from tierlog.spark.pipeline import spark_session
    from tierlog.spark.source import RemoteSlicePartition, TierlogBatchReader

    options = spec["options"]
    # The direct plan on its own (the driver's share of a direct query), timed in this process: the first plan
    # pays what a process does once (clients, caches), the later ones what every further query pays.
    plan_seconds = []
    for _ in range(PLANS):
        started = time.perf_counter()
        planned = TierlogBatchReader(parse_batch_options(options | {"tierlog.remote.read": "direct"})).partitions()
        plan_seconds.append(round(time.perf_counter() - started, 3))
    runs: dict[str, list[float]] = {key: [] for key, _, _ in WAYS}
    spark = spark_session("tierlog-bench-spark")
    try:
        # Which tierlog the Python workers import: the point of a before/after round.
        workers = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("tierlog").__file__).collect()[0]
        parquet = spec["parquet"]
        if not Path(parquet).exists():
            spark.read.format("tierlog").options(**options).load().write.parquet(parquet)
        for repeat in range(spec["repeats"] + 1):
            for key, _, _ in WAYS:
                if key == "parquet":
                    frame = spark.read.parquet(parquet)
                else:
                    frame = spark.read.format("tierlog").options(**options, **{"tierlog.remote.read": key}).load()
                before = remote_fetches(spec["http"])
                started = time.perf_counter()
                frame.write.format("noop").mode("overwrite").save()
                seconds = time.perf_counter() - started
                served = remote_fetches(spec["http"]) - before
                if key == "direct" and served:
                    raise RuntimeError(f"the direct read made the broker serve {served} remote fetches")
                if repeat:  # the first query of each way warms up (Python workers, JIT, connections)
                    runs[key].append(seconds)
                warm = "" if repeat else " (warm-up, not kept)"
                line = f"  {key:>8}: {spec['records'] / seconds:>12,.0f} rows/s ({seconds:.2f} s){warm}"
                print(line, file=sys.stderr, flush=True)  # stdout is for the round's result
    finally:
        spark.stop()
    return {
        "tierlog_on_driver": __import__("tierlog").__file__,
        "tierlog_in_workers": workers,
        "direct_tasks": len(planned),
        "direct_tasks_reading_s3": sum(isinstance(p, RemoteSlicePartition) for p in planned),
        "direct_plan_seconds": plan_seconds,
        "runs_seconds": runs,
    }


def run_round(tree: Path, cluster: LocalCluster, spec: dict[str, Any]) -> dict[str, Any]:
    """The broker restarted on its data with tierlog from `tree`, then measure_round in a subprocess on `tree`."""
    # `python -m` (the broker, Spark's Python workers) puts the working directory ahead of PYTHONPATH on
    # sys.path: both name the tree, for the broker, the round's Spark driver and its workers.
    os.environ["PYTHONPATH"] = str(tree)
    os.chdir(tree)
    cluster.restart(NODE, TIMEOUT_S)
    wait_until(
        lambda: all_closed_segments_in_s3(cluster, spec["segment_bytes"]),
        TIMEOUT_S,
        lambda: f"{TOPIC} led again after the restart: {partition_states(cluster)}",
    )
    load = os.getloadavg()
    answer = subprocess.run(
        [sys.executable, str(HERE), "--round", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        cwd=tree,
    )
    if answer.returncode:
        raise RuntimeError(f"the round on {tree} failed (exit {answer.returncode})")
    result = json.loads(answer.stdout.strip().splitlines()[-1])
    for where in ("tierlog_on_driver", "tierlog_in_workers"):
        if not result[where].startswith(f"{tree}/"):
            raise RuntimeError(f"the round on {tree} ran {where} from {result[where]}")
    return {"tree": str(tree), "commit": commit_of(tree), "load_average_1_5_15_min": load, **result}


def summary(rounds: list[dict[str, Any]], records: int) -> dict[str, Any]:
    """Per way: the median of every kept run over the rounds, as seconds and rows/s, and every run."""
    out: dict[str, Any] = {}
    for key, _, _ in WAYS:
        runs = [s for r in rounds for s in r["runs_seconds"][key]]
        median = statistics.median(runs)
        out[key] = {"seconds": round(median, 3), "rows_per_s": round(records / median), "runs_seconds": runs}
    out["direct_plan"] = {
        "first_seconds_median": statistics.median(r["direct_plan_seconds"][0] for r in rounds),
        "later_seconds_median": statistics.median(s for r in rounds for s in r["direct_plan_seconds"][1:]),
        "tasks": rounds[-1]["direct_tasks"],
        "tasks_reading_s3": rounds[-1]["direct_tasks_reading_s3"],
    }
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--round":
        print(json.dumps(measure_round(json.loads(sys.argv[2]))))
        return
    parser = argument_parser(__doc__, "spark", "200,000 records in 1 MiB segments, 1 round of each tree")
    parser.add_argument("--records", type=int, default=2_000_000, help="records produced (over 4 partitions)")
    parser.add_argument("--size", type=int, default=100, help="record value size in bytes")
    parser.add_argument("--segment-bytes", type=int, default=8 * 1024 * 1024, help="segment.bytes of the topic")
    parser.add_argument("--repeats", type=int, default=2, help="timed queries of each way per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each tree (alternating with --compare-with)")
    parser.add_argument("--compare-with", type=Path, help='a tierlog tree (e.g. ../tierlog-baseline) to run "before"')
    args = parser.parse_args()
    out = args.out.resolve()  # the rounds change the working directory
    records = 200_000 if args.quick else args.records
    repeats = 1 if args.quick else args.repeats
    rounds = 1 if args.quick else args.rounds
    segment_bytes = 1024 * 1024 if args.quick else args.segment_bytes
    trees = [("after", THIS_TREE)] if args.compare_with is None else [("before", args.compare_with.resolve())]
    if args.compare_with is not None:
        trees.append(("after", THIS_TREE))

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-spark-"))
    s3 = LocalS3Server(work_dir / "s3")
    rsm = s3.rsm_properties(BUCKET, PREFIX)
    # A remote read the broker cannot finish within remote.fetch.max.wait.ms is answered empty and fetched again;
    # on a loaded machine the default 500 ms made every broker-path query a loop of empty answers (and the
    # baseline's reader gave up on them): the benchmark measures reading, not that timeout.
    overrides = tiered_broker_overrides(rsm, brokers=1) | {"remote.fetch.max.wait.ms": "5000"}
    cluster = LocalCluster(work_dir / "cluster", brokers=1, overrides=overrides)
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
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
            lambda: all_closed_segments_in_s3(cluster, segment_bytes),
            TIMEOUT_S,
            lambda: f"every closed segment of {TOPIC} in S3: {partition_states(cluster)}",
        )
        in_s3 = sum(s["local_log_start_offset"] for s in partition_states(cluster))
        print(f"{in_s3:,} of {records:,} records are in S3 only", flush=True)
        spec = {
            "options": {
                "kafka.bootstrap.servers": cluster.bootstrap,
                "subscribe": TOPIC,
                # The broker path gets as many tasks as the direct one has segments, so both use every core.
                "minPartitions": str(max(2 * (os.cpu_count() or 1), 8)),
                **{f"tierlog.remote.{key}": value for key, value in rsm.items()},
            },
            "parquet": str(work_dir / "parquet"),
            "http": cluster.http_address(NODE),
            "records": records,
            "repeats": repeats,
            "segment_bytes": segment_bytes,
        }
        for round_number in range(rounds):
            for name, tree in trees:
                print(f"round {round_number + 1}/{rounds}, {name}: tierlog from {tree}", flush=True)
                measured[name].append(run_round(tree, cluster, spec))
        in_s3_after = sum(s["local_log_start_offset"] for s in partition_states(cluster))
        if in_s3_after != in_s3:
            raise RuntimeError(f"the records in S3 only changed during the run: {in_s3:,} -> {in_s3_after:,}")
    finally:
        try:
            cluster.stop(60)
        finally:
            s3.stop()
            shutil.rmtree(work_dir, ignore_errors=True)

    results = {name: summary(measured[name], records) for name, _ in trees}
    after = results["after"]
    report = {
        "benchmark": "Spark batch reads into the noop sink: tierlog direct remote-tier reads vs through the brokers "
        "vs Parquet, one local broker, SeaweedFS and Spark local[*] on the same host",
        "machine": machine_info(),
        "parameters": {
            "records": records,
            "record_bytes": args.size,
            "partitions": PARTITIONS,
            "segment_bytes": segment_bytes,
            "records_in_s3_only": in_s3,
            "rounds_per_tree": rounds,
            "repeats_per_round": repeats,
            "spark_master": "local[*]",
            "direct_tasks": measured["after"][-1]["direct_tasks"],
            "direct_tasks_reading_s3": measured["after"][-1]["direct_tasks_reading_s3"],
        },
        "results": results,
        "rounds": measured,
        "direct_over_parquet": round(after["direct"]["rows_per_s"] / after["parquet"]["rows_per_s"], 2),
        "direct_over_broker": round(after["direct"]["rows_per_s"] / after["broker"]["rows_per_s"], 2),
        "goal": "direct >= 0.5x Parquet (direct_over_parquet >= 0.5) and direct >= broker (direct_over_broker >= 1)",
    }
    series = [(name, tree) for name, tree in trees]
    colors = {"before": "tab:gray", "after": "tab:green"}

    def draw(axes: Any) -> None:
        ax = axes[0]
        width = 0.8 / len(series)
        for index, (name, _) in enumerate(series):
            values = [results[name][key]["rows_per_s"] for key, _, _ in WAYS]
            shift = (index - (len(series) - 1) / 2) * width
            bars = ax.bar([i + shift for i in range(len(WAYS))], values, width, label=name, color=colors[name])
            ax.bar_label(bars, labels=[f"{v / 1e3:,.0f}k" for v in values], fontsize=8, padding=2)
        ax.set_ylabel("rows/s into the noop sink (median of every run)")
        ax.legend()

    ratio = report["direct_over_parquet"]
    write_report(
        out,
        "spark",
        report,
        title=f"Spark reading {records:,} records of {args.size} B ({in_s3:,} in S3): direct is {ratio:.2f}x Parquet",
        labels=[label for _, label, _ in WAYS],
        panels=1,
        figsize=(10, 4.8),
        draw=draw,
    )


if __name__ == "__main__":
    sys.exit(main())
