"""Moving a partition with a long history to another broker (AlterPartitionReassignments, KIP-455), tiered and
not tiered, on a local 2-broker tierlog cluster backed by a local S3 server (SeaweedFS `weed mini`).

Two topics of one partition each, one replica on broker 1, get the same records (`--megabytes` of
`--size`-byte records, segment.bytes=`--segment-bytes`):

- `tiered`: remote.storage.enable=true and local.retention.bytes=1: once every closed segment is copied to S3
  (copy lag 0) only the active segment stays on broker 1's disk;
- `local`: no remote storage, every segment on broker 1's disk.

Then each partition is moved from broker 1 to broker 2 (replicas [1] -> [2]) and timed from the request until
ListPartitionReassignments no longer lists it and broker 2 leads it with every record (its log end offset is
the produced count). *Bytes moved* is what broker 2's copy holds on disk when the move completes: a new replica
of a tiered partition starts at the leader's local log start (BuildingRemoteLogAuxState,
docs/reassignment.md), so it copies the local tail only and reads the rest from the remote tier when asked.
Afterwards every record of each topic is read back from offset 0 (the tiered one partly from S3).

    python bench/reassignment.py            # 1 GB per topic (~3-5 minutes)
    python bench/reassignment.py --quick    # 50 MB per topic, for a smoke run

Writes `bench/results/reassignment.json` (machine, parameters, results) and `bench/results/reassignment.png`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
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
    consumer_config,
    machine_info,
    paired_bars,
    produce_flat_out,
    producer_config,
    tiered_broker_overrides,
    write_report,
)
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.client.connection import KafkaConnection
from tierlog.client.requests import alter_partition_reassignments_request, list_partition_reassignments_request
from tierlog.common import TopicPartition as Partition
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server

MiB = 1 << 20
BUCKET = "tierlog-bench"
PREFIX = "reassignment"
TIERED_TOPIC, LOCAL_TOPIC = "tiered", "local"
SOURCE, DESTINATION = 1, 2
TASK_INTERVAL_MS = 500


def partition_state(cluster: LocalCluster, broker: int, topic: str) -> dict[str, Any] | None:
    """The broker's own view of `topic`-0 (its /v1/partitions), None while it holds no replica of it."""
    with urllib.request.urlopen(f"http://{cluster.http_address(broker)}/v1/partitions", timeout=5) as answer:
        for state in json.load(answer)["partitions"]:
            if state["topic"] == topic and state["partition"] == 0:
                return dict(state)
    return None


def leads(cluster: LocalCluster, broker: int, topic: str) -> bool:
    state = partition_state(cluster, broker, topic)
    return state is not None and state["role"] == "leader"


def copy_lag_bytes(cluster: LocalCluster, topic: str) -> float | None:
    with urllib.request.urlopen(f"http://{cluster.http_address(SOURCE)}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    # prometheus_client writes label names in alphabetical order.
    sample = f'tierlog_remote_copy_lag_bytes{{partition="0",topic="{topic}"}} '
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line.removeprefix(sample))
    return None


def local_bytes(cluster: LocalCluster, broker: int, topic: str) -> int:
    """The bytes of the partition's segment files (.log) on the broker's disk."""
    return sum(path.stat().st_size for path in (cluster.base_dir / f"broker-{broker}" / f"{topic}-0").glob("*.log"))


def produce(bootstrap: str, topic: str, size: int, count: int) -> float:
    producer = Producer(producer_config(bootstrap, 1, linger_ms=5, queue=1_000_000, timeout_s=TIMEOUT_S))
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    started = time.perf_counter()
    sent = produce_flat_out(producer, topic, os.urandom(size), on_delivery, TIMEOUT_S * 10, max_messages=count)
    remaining = producer.flush(TIMEOUT_S)
    if remaining or failures or sent != count:
        raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed of {sent}, first: {failures[:1]}")
    return time.perf_counter() - started


def read_back(bootstrap: str, topic: str, count: int, timeout_s: float) -> float:
    """Seconds to read offsets [0, count) of `topic`-0; every offset must arrive, in order."""
    consumer = Consumer(consumer_config(bootstrap, 8 * MiB))
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 0)])
        next_offset = 0
        deadline = time.monotonic() + timeout_s
        while next_offset < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {next_offset} of {count} records of {topic} in {timeout_s:.0f} s")
            for msg in consumer.consume(num_messages=min(10_000, count - next_offset), timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                if msg.offset() != next_offset:
                    raise RuntimeError(f"{topic}: offset {msg.offset()} arrived where {next_offset} was expected")
                next_offset += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


async def _reassign(host: str, port: int, topic: str, replicas: Sequence[int] | None) -> None:
    connection = await KafkaConnection.open(host, port, client_id="bench-reassignment", timeout_s=TIMEOUT_S)
    try:
        request = alter_partition_reassignments_request({Partition(topic, 0): replicas}, timeout_ms=30_000)
        response = await connection.send(request, timeout_s=TIMEOUT_S)
        errors = [
            (p.error_code, p.error_message) for t in response.responses for p in t.partitions if p.error_code != 0
        ]
        if response.error_code != 0 or errors:
            raise RuntimeError(f"AlterPartitionReassignments of {topic}-0: {response.error_code} {errors}")
    finally:
        await connection.close()


async def _in_progress(host: str, port: int, topic: str) -> bool:
    connection = await KafkaConnection.open(host, port, client_id="bench-reassignment", timeout_s=TIMEOUT_S)
    try:
        request = list_partition_reassignments_request([Partition(topic, 0)], timeout_ms=30_000)
        response = await connection.send(request, timeout_s=TIMEOUT_S)
        if response.error_code != 0:
            raise RuntimeError(f"ListPartitionReassignments: error {response.error_code}")
        return any(t.partitions for t in response.topics)
    finally:
        await connection.close()


def move(cluster: LocalCluster, topic: str, records: int, timeout_s: float) -> dict[str, Any]:
    """Move `topic`-0 from SOURCE to DESTINATION and time it until done (see the module's doc)."""
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    started = time.perf_counter()
    asyncio.run(_reassign(host, int(port), topic, [DESTINATION]))

    def done() -> bool:
        state = partition_state(cluster, DESTINATION, topic)
        return (
            leads(cluster, DESTINATION, topic)
            and state is not None
            and state["log_end_offset"] == records
            and not asyncio.run(_in_progress(host, int(port), topic))
        )

    wait_until(done, timeout_s, f"{topic}-0 moved to broker {DESTINATION}", interval_s=0.1)
    seconds = time.perf_counter() - started
    state = partition_state(cluster, DESTINATION, topic)
    assert state is not None
    return {
        "seconds": round(seconds, 2),
        "bytes_moved": local_bytes(cluster, DESTINATION, topic),
        "destination_local_log_start_offset": state["local_log_start_offset"],
        "source_replica_left": partition_state(cluster, SOURCE, topic) is not None
        or (cluster.base_dir / f"broker-{SOURCE}" / f"{topic}-0").exists(),
    }


def draw(axes: Sequence[Any], results: dict[str, dict[str, Any]]) -> None:
    topics = (TIERED_TOPIC, LOCAL_TOPIC)
    seconds = [results[t]["move"]["seconds"] for t in topics]
    bars = axes[0].bar(range(len(topics)), seconds, 0.5, color="tab:blue")
    axes[0].bar_label(bars, labels=[f"{s:.1f}" for s in seconds], fontsize=8, padding=2)
    axes[0].set_ylabel("seconds to move the partition")
    paired_bars(
        axes[1],
        [
            ("history", [results[t]["history_bytes"] / 1e6 for t in topics], "tab:gray"),
            ("copied to the new broker", [results[t]["move"]["bytes_moved"] / 1e6 for t in topics], "tab:orange"),
        ],
        "{:.0f}",
    )
    axes[1].set_ylabel("MB")


def main() -> None:
    parser = argument_parser(__doc__, "reassignment", "50 MB per topic, for a smoke run")
    parser.add_argument("--megabytes", type=float, default=1000.0, help="payload produced to each topic (10^6 B)")
    parser.add_argument("--size", type=int, default=1024, help="record value size in bytes")
    parser.add_argument("--segment-bytes", type=int, default=64 * MiB, help="segment.bytes of both topics")
    parser.add_argument("--timeout", type=float, default=900.0, help="longest wait for tiering or a move, seconds")
    args = parser.parse_args()
    megabytes = 50.0 if args.quick else args.megabytes
    segment_bytes = 4 * MiB if args.quick else args.segment_bytes
    records = int(megabytes * 1e6) // args.size

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-reassignment-"))
    s3 = LocalS3Server(work_dir / "s3")
    overrides = tiered_broker_overrides(s3.rsm_properties(BUCKET, PREFIX), brokers=2, task_interval_ms=TASK_INTERVAL_MS)
    cluster = LocalCluster(work_dir / "cluster", brokers=2, overrides=overrides)
    configs = {
        TIERED_TOPIC: {
            "remote.storage.enable": "true",
            "segment.bytes": str(segment_bytes),
            "local.retention.bytes": "1",
        },
        LOCAL_TOPIC: {"segment.bytes": str(segment_bytes)},
    }
    results: dict[str, dict[str, Any]] = {}
    exit_code: int | None = None
    try:
        s3.start(60)
        s3.create_bucket(BUCKET)
        cluster.start(TIMEOUT_S)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        new_topics = [NewTopic(t, 1, replica_assignment=[[SOURCE]], config=c) for t, c in configs.items()]
        for future in admin.create_topics(new_topics, request_timeout=30).values():
            future.result(TIMEOUT_S)
        for topic in configs:
            wait_until(
                lambda topic=topic: (
                    (s := partition_state(cluster, SOURCE, topic)) is not None and s["role"] == "leader"
                ),
                TIMEOUT_S,
                f"broker {SOURCE} leading {topic}-0",
            )
            seconds = produce(cluster.bootstrap, topic, args.size, records)
            print(f"produced {records:,} x {args.size} B to {topic} in {seconds:.1f} s", flush=True)
        wait_until(
            lambda: (
                (s := partition_state(cluster, SOURCE, TIERED_TOPIC)) is not None
                and s["local_log_start_offset"] > 0
                and s["highest_offset_in_remote_storage"] == s["local_log_start_offset"] - 1
                and copy_lag_bytes(cluster, TIERED_TOPIC) == 0
            ),
            args.timeout,
            f"{TIERED_TOPIC}-0 tiered up to its active segment",
            interval_s=0.5,
        )
        # Both topics hold the same records; the untiered one still has all of them on disk.
        history = local_bytes(cluster, SOURCE, LOCAL_TOPIC)
        for topic in (TIERED_TOPIC, LOCAL_TOPIC):
            source_local = local_bytes(cluster, SOURCE, topic)
            moved = move(cluster, topic, records, args.timeout)
            read_s = read_back(cluster.bootstrap, topic, records, args.timeout)
            results[topic] = {
                "history_bytes": history,
                "source_local_bytes": source_local,
                "move": moved,
                "read_back_all_seconds": round(read_s, 2),
            }
            print(
                f"{topic}: moved in {moved['seconds']} s, {moved['bytes_moved'] / 1e6:.1f} MB copied of "
                f"{history / 1e6:.0f} MB of history; all {records:,} records read back in {read_s:.1f} s",
                flush=True,
            )
        report = {
            "benchmark": "reassignment",
            "machine": machine_info(),
            "parameters": {
                "megabytes": megabytes,
                "record_bytes": args.size,
                "records": records,
                "segment_bytes": segment_bytes,
                "move": f"replicas [{SOURCE}] -> [{DESTINATION}]",
            },
            "results": results,
        }
        write_report(
            args.out,
            "reassignment",
            report,
            title=f"Moving a partition with {megabytes:.0f} MB of history to another broker",
            labels=[TIERED_TOPIC, LOCAL_TOPIC],
            panels=2,
            figsize=(10, 4),
            draw=lambda axes: draw(axes, results),
        )
    except Exception as e:
        print(f"failed: {e}; logs kept in {work_dir}", file=sys.stderr)
        exit_code = 1
    finally:
        cluster.stop()
        s3.stop()
        if exit_code is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    if exit_code:
        sys.exit(exit_code)


if __name__ == "__main__":
    main()
