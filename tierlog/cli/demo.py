"""`tierlog demo`: the README's main job. A local S3 server, a 3-broker cluster whose remote tier (KIP-405
tiered storage) lives on it and whose brokers are the 3 voters of the controller quorum, a replicated topic,
10,000 events through real clients while the active controller is killed with SIGKILL halfway, closed segments
moving to S3 and leaving the brokers' disks, a leader killed with SIGKILL, every event read back from offset 0
(the older ones from S3, through the brokers) and verified, a Spark pipeline into Parquet, and a look inside a
segment object in the bucket.

The demo is a list of steps sharing one `DemoRun`; one of the last runs the Spark ETL pipeline over the topic
(reading its S3 segments straight from the bucket) and shows the Parquet table it wrote. Every step works
against the run's deadline, so a broker or an S3 server that hangs turns into a clear failure, never into a
demo that waits forever; whatever was started is stopped on the way out, on success, failure, Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click
from botocore.exceptions import BotoCoreError, ClientError
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tierlog.cli.clients import (
    CliError,
    bootstrap_addresses,
    client_config,
    kafka_error_message,
    progress_bar,
    timeout_option,
)
from tierlog.cli.cluster import gather_reports, merge_partition_reports, secure_cluster_lines, status_table
from tierlog.cli.dump_log import dump_log
from tierlog.cli.produce import produce_bounded
from tierlog.cli.quorum import QuorumStatus, describe_quorum
from tierlog.client.security import PLAINTEXT
from tierlog.testing.local_cluster import CONTROLLER_NODE_ID, BrokerStartError, LocalCluster
from tierlog.testing.local_s3 import LocalS3Server, S3StartError
from tierlog.testing.local_security import LocalSecurity

TOPIC = "demo-events"
PARTITIONS = 3
BROKERS = 3
# The brokers are the controller quorum's voters too (process.roles=broker,controller, as `cluster up
# --controllers 3 --combined`): a quorum that survives losing its active controller, without three more
# processes (and their start-up) on the demo's machine.
QUORUM_VOTERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
S3_BUCKET = "tierlog-demo"
S3_PREFIX = "tierlog"
# 10,000 events are about 240 KB in lz4: 16 KiB segments make several per partition, so most of each
# partition goes to S3 and only the active segment stays on the brokers' disks.
SEGMENT_BYTES = 16 * 1024
# librdkafka counts batch.size before compression; its default (1 MB) would put a whole partition in one
# batch, bigger than a segment. Batches of 8 KiB (about 2 KiB in lz4) fill the segments evenly.
PRODUCER_BATCH_BYTES = 8 * 1024
# The remote log manager copies and the retention check deletes every 500 ms (Kafka: 30 s and 5 min).
TIERING_INTERVAL_MS = 500
CLUSTER_OVERRIDES = {
    # A killed broker is fenced after broker.session.timeout.ms (Kafka's 9 s); 3 s keeps the demo brisk.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": str(TIERING_INTERVAL_MS),
    "log.retention.check.interval.ms": str(TIERING_INTERVAL_MS),
    # The remote log metadata topic (Kafka's default: 50 partitions) is created at start-up; 3 is plenty.
    "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
    "rlmm.config.remote.log.metadata.topic.replication.factor": str(REPLICATION_FACTOR),
}
TOPIC_CONFIGS = {
    # Kafka's default, spelled out because the demo shows it: the log keeps each batch in the codec the
    # producer chose, on disk and in S3.
    "compression.type": "producer",
    "min.insync.replicas": str(MIN_INSYNC_REPLICAS),
    "remote.storage.enable": "true",
    "segment.bytes": str(SEGMENT_BYTES),
    # Keep (almost) nothing locally: a closed segment leaves the disk as soon as it is in S3.
    "local.retention.bytes": "1",
}
USERS = 100
EVENT_TYPES = ("page_view", "add_to_cart", "purchase", "search")
SOURCE_HEADER = ("source", b"tierlog-demo")
EVENT_ID_HEADER = "event-id"
DUMP_EXCERPT_LINES = 6  # the file, its base offset, a batch and its first records
POLL_S = 0.2


class DemoError(Exception):
    """A step failed; the message says what was expected and what happened."""


class Terminated(Exception):
    """SIGTERM arrived: stop like on Ctrl-C, cleaning up on the way out."""


def event_key(event_id: int) -> bytes:
    return f"user-{event_id % USERS:03d}".encode()


def event_value(event_id: int) -> bytes:
    """Deterministic in the id, so the consumer can check every byte without keeping what was sent."""
    event = {
        "event_id": event_id,
        "user": event_key(event_id).decode(),
        "type": EVENT_TYPES[(event_id * 7) % len(EVENT_TYPES)],
        "amount_cents": (event_id * 37) % 10_000,
    }
    return json.dumps(event, separators=(",", ":")).encode()


@dataclass
class PartitionStats:
    records: int = 0
    first_offset: int = -1
    last_offset: int = -1
    from_s3: int = 0


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    partition: int
    start_offset: int
    suffix: str


@dataclass
class DemoRun:
    """What the steps share: where the data lives, the S3 server, the cluster, the deadline, and what was
    measured."""

    console: Console
    root: Path
    events: int
    deadline: float
    # --secure: clients (the demo's own, Spark's) reach the cluster on SASL_SSL with these credentials.
    secure: bool = False
    s3: LocalS3Server | None = None
    cluster: LocalCluster | None = None
    killed: int | None = None
    partitions: dict[int, PartitionStats] = field(default_factory=dict)

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DemoError("the demo ran out of time (raise --timeout if this machine is slow)")
        return left

    def started_s3(self) -> LocalS3Server:
        if self.s3 is None:
            raise DemoError("no S3 server was started")
        return self.s3

    def started_cluster(self) -> LocalCluster:
        if self.cluster is None:
            raise DemoError("no cluster was started")
        return self.cluster

    def client_settings(self) -> dict[str, str]:
        """The librdkafka security settings of the cluster's client listener (none for PLAINTEXT)."""
        security = self.started_cluster().security
        return {} if security is None else security.client_settings()

    def client(self, **settings: Any) -> dict[str, Any]:
        """A demo client's librdkafka settings: the cluster's bootstrap and security, and `settings`."""
        return client_config(self.started_cluster().bootstrap, **self.client_settings(), **settings)

    def partition_dir(self, partition: int, node_id: int = CONTROLLER_NODE_ID) -> Path:
        return self.started_cluster().broker(node_id).log_dir / f"{TOPIC}-{partition}"


def check_alive(run: DemoRun) -> None:
    """Fail at once, with the log's tail, when a broker (other than the one the demo killed) or the S3 server
    has exited, rather than wait for the deadline."""
    if run.s3 is not None and not run.s3.running:
        raise DemoError(f"the S3 server exited; last lines of {run.s3.log_file}:\n{run.s3.log_tail(15)}")
    if run.cluster is None:
        return
    for node_id in run.cluster.node_ids:
        broker = run.cluster.broker(node_id)
        if node_id == run.killed and not broker.running:
            continue
        try:
            broker.check_alive()
        except BrokerStartError as e:
            raise DemoError(str(e)) from None


def spinner(console: Console) -> Progress:
    """A rich progress display for work that is not counted: spinner, description, time elapsed."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console)


def start_s3(run: DemoRun) -> None:
    run.s3 = LocalS3Server(run.root / "s3")
    with spinner(run.console) as progress:
        progress.add_task("starting the S3 server (SeaweedFS weed mini) and creating a bucket", total=None)
        try:
            run.s3.start(min(60.0, run.remaining()))
            run.s3.create_bucket(S3_BUCKET)
        except (S3StartError, FileNotFoundError, BotoCoreError, ClientError) as e:
            raise DemoError(f"the S3 server: {e}") from None
    run.console.print(
        f"S3 server (SeaweedFS, pid {run.s3.pid}) serves [bold]{run.s3.endpoint_url}[/bold], data in {run.s3.data_dir}"
    )
    run.console.print(f"bucket [bold]{S3_BUCKET}[/bold]: the remote tier goes to s3://{S3_BUCKET}/{S3_PREFIX}/")


def start_cluster(run: DemoRun) -> None:
    overrides = {**CLUSTER_OVERRIDES, **run.started_s3().rsm_properties(S3_BUCKET, S3_PREFIX)}
    security = LocalSecurity.generate(run.root / "security") if run.secure else None
    run.cluster = LocalCluster(
        run.root, brokers=BROKERS, overrides=overrides, security=security, controllers=QUORUM_VOTERS, combined=True
    )
    with progress_bar(run.console) as progress:
        task = progress.add_task("brokers registered with the controller", total=BROKERS)
        try:
            run.cluster.start(
                min(60.0, run.remaining()), progress=lambda p: progress.update(task, completed=p.registered)
            )
        except BrokerStartError as e:
            raise DemoError(str(e)) from None
    for node_id in run.cluster.node_ids:
        broker = run.cluster.broker(node_id)
        role = "broker + controller" if node_id in run.cluster.controller_ids else "broker"
        run.console.print(
            f"node {node_id} ({role}, pid {broker.pid}) serves {broker.bootstrap}, data in {broker.log_dir}"
        )
    run.console.print(f"bootstrap servers: [bold]{run.cluster.bootstrap}[/bold]")
    quorum = controller_quorum(run)
    run.console.print(
        f"controller quorum: voters {', '.join(str(v.node_id) for v in quorum.voters)}, "
        f"active controller node {quorum.leader_id} (epoch {quorum.leader_epoch})"
    )
    if security is not None:
        for line in secure_cluster_lines(security, run.cluster.internal_bootstrap):
            run.console.print(line, highlight=False)
    run.console.print(
        f"remote tier: s3://{S3_BUCKET}/{S3_PREFIX} at {run.started_s3().endpoint_url} "
        f"(copy and retention checks every {TIERING_INTERVAL_MS} ms)"
    )


def create_topic(run: DemoRun) -> None:
    admin = AdminClient(run.client())
    timeout_s = min(15.0, run.remaining())
    future = admin.create_topics(
        [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=REPLICATION_FACTOR, config=dict(TOPIC_CONFIGS))],
        request_timeout=timeout_s,
        operation_timeout=timeout_s,
    )[TOPIC]
    try:
        future.result(timeout=timeout_s + 1)
        # CreateTopics may answer before every partition has a leader; produce once metadata shows them.
        while True:
            metadata = admin.list_topics(topic=TOPIC, timeout=min(5.0, run.remaining())).topics.get(TOPIC)
            if metadata is not None and metadata.error is None and len(metadata.partitions) == PARTITIONS:
                leaders = {p.id: p.leader for p in metadata.partitions.values()}
                if all(leader >= 0 for leader in leaders.values()):
                    break
            check_alive(run)
            time.sleep(min(0.05, run.remaining()))
    except KafkaException as e:
        raise DemoError(kafka_error_message(e.args[0], f"creating topic {TOPIC!r}")) from None
    except FutureTimeout:
        raise DemoError(f"creating topic {TOPIC!r}: the broker did not answer within {timeout_s:.0f}s") from None
    described = ", ".join(f"{p}→broker {leaders[p]}" for p in sorted(leaders))
    run.console.print(
        f"topic [bold]{TOPIC}[/bold]: {PARTITIONS} partitions x {REPLICATION_FACTOR} replicas "
        f"(min.insync.replicas={MIN_INSYNC_REPLICAS}), leaders {described}"
    )
    run.console.print(
        f"remote.storage.enable=true, segment.bytes={SEGMENT_BYTES:,}, local.retention.bytes=1: "
        "closed segments go to S3 and leave the brokers' disks"
    )


def produce_events(run: DemoRun) -> None:
    """Produce every event (acks=all, idempotent) and SIGKILL the active controller halfway, the second half
    produced after the kill: the voters left elect a new one, which fences the killed node (a broker too) and
    moves its partitions' leadership, so every event is still acknowledged, each once."""
    timeout_s = run.remaining()
    producer = Producer(
        run.client(
            acks="all",
            **{
                # A batch the killed leader wrote but never acknowledged is sent again to the next leader:
                # idempotence makes that retry no duplicate.
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 5,
                "batch.size": PRODUCER_BATCH_BYTES,
                "delivery.timeout.ms": int(timeout_s * 1000),
            },
        )
    )
    before = controller_quorum(run)
    errors: list[str] = []
    acknowledged = 0
    failover: ControllerKill | None = None
    stop_watching = threading.Event()
    started = time.monotonic()
    with progress_bar(run.console) as progress, ThreadPoolExecutor(max_workers=1) as watcher:
        task = progress.add_task(f"producing to {TOPIC} (lz4, acks=all)", total=run.events)

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            nonlocal acknowledged
            if error is not None:
                errors.append(kafka_error_message(error, f"event to {TOPIC}-{message.partition()}"))
            else:
                acknowledged += 1
                progress.advance(task)

        def kill_active_controller(sent: int) -> ControllerKill:
            # Once the cluster has acknowledged a good part of what was sent (it serves), so the kill lands
            # with events in flight, and everything from here on is produced after it.
            while acknowledged < sent // 2 and not errors:
                producer.poll(min(POLL_S, run.remaining()))
            run.started_cluster().kill(before.leader_id)
            run.killed = before.leader_id
            run.console.print(
                f"kill -9 node {before.leader_id}, the active controller (epoch {before.leader_epoch}), "
                f"with {acknowledged:,} of the {run.events:,} events acknowledged"
            )
            elected = watcher.submit(_new_active_controller, run, before, stop_watching)
            return ControllerKill(time.monotonic(), acknowledged, elected)

        try:
            for event_id in range(run.events):
                if event_id == run.events // 2:
                    failover = kill_active_controller(event_id)
                try:
                    produce_bounded(
                        producer,
                        run.remaining(),
                        topic=TOPIC,
                        key=event_key(event_id),
                        value=event_value(event_id),
                        headers=[SOURCE_HEADER, (EVENT_ID_HEADER, str(event_id).encode())],
                        on_delivery=on_delivery,
                    )
                except CliError as e:
                    raise DemoError(e.message) from None
                producer.poll(0)
            unresolved = producer.flush(run.remaining())
            produce_seconds = time.monotonic() - started
            if errors or unresolved:
                first = errors[0] if errors else "no answer from the broker"
                raise DemoError(f"{len(errors) + unresolved} of {run.events} events were not acknowledged: {first}")
            if failover is None:
                raise DemoError("no event was produced, so no controller was killed")
            try:
                new_controller = failover.elected.result(timeout=run.remaining())
            except FutureTimeout:
                new_controller = None
        finally:
            # Also on a failure or Ctrl-C: the watcher stops asking, so leaving the executor does not wait for it.
            stop_watching.set()
    if new_controller is None:
        raise DemoError(f"no new active controller was elected after node {before.leader_id} was killed")
    after, elected_at = new_controller
    run.console.print(
        f"node {after.leader_id} is the active controller now: epoch {before.leader_epoch} -> {after.leader_epoch}, "
        f"elected {elected_at - failover.killed_at:.1f}s after the kill"
    )
    run.console.print(
        f"{run.events:,} events acknowledged in {produce_seconds:.2f}s{_rate(run.events, produce_seconds)}, "
        f"{run.events - failover.acknowledged:,} of them after the kill: producing went on through the failover"
    )


@dataclass(frozen=True)
class ControllerKill:
    killed_at: float  # monotonic
    acknowledged: int  # events acknowledged by then
    elected: Future[tuple[QuorumStatus, float] | None]  # the new active controller, and when


# --- the controller quorum ---------------------------------------------------------------------------------


def controller_quorum(run: DemoRun) -> QuorumStatus:
    """The quorum as its leader describes it; while no voter can (an election), asks again."""
    while True:
        try:
            return _describe_quorum(run)
        except CliError:
            check_alive(run)
            time.sleep(min(POLL_S, run.remaining()))


def _describe_quorum(run: DemoRun) -> QuorumStatus:
    """DescribeQuorum to every voter's controller listener at once, the leader's answer taken (as `tierlog quorum
    status --bootstrap-controller` asks); CliError when none can answer."""
    # The controller listeners are PLAINTEXT on 127.0.0.1, with --secure too.
    addresses = bootstrap_addresses(",".join(run.started_cluster().controller_addresses))
    return asyncio.run(describe_quorum(addresses, PLAINTEXT, ask_cluster_id=False, timeout_s=min(2.0, run.remaining())))


def _new_active_controller(
    run: DemoRun, before: QuorumStatus, stopped: threading.Event
) -> tuple[QuorumStatus, float] | None:
    """The quorum once a voter other than `before`'s leader leads it in a later epoch, and when (monotonic);
    None if `stopped` is set first."""
    while not stopped.wait(POLL_S):
        try:
            status = _describe_quorum(run)
        except CliError:
            continue  # no voter leads yet
        if status.leader_id != before.leader_id and status.leader_epoch > before.leader_epoch:
            return status, time.monotonic()
    return None


# --- the two tiers ---------------------------------------------------------------------------------------


def _partition_views(run: DemoRun) -> dict[int, dict[int, dict[str, Any]]]:
    """partition -> node id -> that broker's own report of its replica (GET /v1/partitions), for every
    broker that answers."""
    cluster = run.started_cluster()
    addresses = {n: cluster.http_address(n) for n in cluster.node_ids if cluster.broker(n).running}
    reports = asyncio.run(gather_reports(addresses, min(5.0, run.remaining())))
    views: dict[int, dict[int, dict[str, Any]]] = {}
    for report in reports:
        for entry in report.partitions or []:
            if entry.get("topic") == TOPIC:
                views.setdefault(int(entry["partition"]), {})[report.node_id] = entry
    return views


def _leader_view(views: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """(node id, report) of the replica that says it leads, with the newest leader epoch."""
    leaders = [(node, view) for node, view in views.items() if view.get("role") == "leader"]
    return max(leaders, key=lambda item: item[1]["leader_epoch"], default=None)


def _segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segment files in a partition directory, ascending; the last is the active one."""
    return sorted(int(path.stem) for path in directory.glob("*.log") if path.stem.isdigit())


@dataclass(frozen=True)
class TieringState:
    copied: int  # offsets in S3 (each leader's Ry + 1), summed over partitions
    to_copy: int  # offsets below each leader's active segment: what closed segments hold
    left_on_disk: int  # segments, on any replica, wholly in S3 and not yet deleted
    missing: str | None  # a partition without a leader report, if any

    @property
    def done(self) -> bool:
        return self.missing is None and self.copied >= self.to_copy and self.left_on_disk == 0


def _tiering_state(run: DemoRun) -> TieringState:
    views = _partition_views(run)
    copied = to_copy = left = 0
    for partition in range(PARTITIONS):
        leader = _leader_view(views.get(partition, {}))
        if leader is None:
            return TieringState(0, 1, 0, f"{TOPIC}-{partition} has no leader report yet")
        leader_id, view = leader
        # No more produce: the leader's active segment stays the last, and everything below it is closed.
        active_base = _segment_bases(run.partition_dir(partition, leader_id))[-1:] or [0]
        remote_end = int(view["highest_offset_in_remote_storage"])
        to_copy += active_base[0]
        copied += min(remote_end + 1, active_base[0])
        for node_id in views[partition]:
            bases = _segment_bases(run.partition_dir(partition, node_id))
            # A closed segment [base, next base - 1] wholly in S3 is one local retention deletes.
            left += sum(1 for following in bases[1:] if following - 1 <= remote_end)
    return TieringState(copied, to_copy, left, None)


def move_to_s3(run: DemoRun) -> None:
    """Wait until every closed segment is in S3 (each leader's Ry reaches its active segment) and gone from
    every replica's disk (local retention deleted it), polling the brokers' /v1/partitions."""
    started = time.monotonic()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=run.console) as progress:
        task = progress.add_task("copying to S3 (offsets)", total=None)
        while True:
            check_alive(run)
            state = _tiering_state(run)
            progress.update(
                task,
                total=max(state.to_copy, 1) if state.missing is None else None,
                completed=state.copied if state.to_copy else 1,
                description=(
                    f"copying to S3 (offsets), {state.left_on_disk} to delete on disk"
                    if state.missing is None
                    else state.missing
                ),
            )
            if state.done:
                break
            if time.monotonic() + POLL_S >= run.deadline:
                raise DemoError(
                    f"closed segments did not move to S3 in time: {state.copied:,} of {state.to_copy:,} offsets "
                    f"copied, {state.left_on_disk} copied segments still on local disks"
                )
            time.sleep(POLL_S)
    seconds = time.monotonic() - started
    segments = sum(1 for o in _bucket_objects(run) if o.suffix == ".log")
    run.console.print(
        f"{segments} closed segments ({state.to_copy:,} events) copied to s3://{S3_BUCKET}/{S3_PREFIX} and "
        f"deleted from every replica's disk in {seconds:.1f}s; "
        "the brokers keep only each partition's active segment"
    )


_OBJECT_KEY = re.compile(rf"^{re.escape(S3_PREFIX)}/{re.escape(TOPIC)}-(\d+)-[^/]+/(\d{{20}})-[^/.]+(\.[a-z_]+)$")


def _bucket_objects(run: DemoRun) -> list[S3Object]:
    """Every object of the topic in the bucket: `<prefix>/<topic>-<partition>-<topic id>/<20-digit start
    offset>-<segment uuid><suffix>`, a .log, .index, .timeindex, .leader_epoch_checkpoint and producer .snapshot
    per segment."""
    client = run.started_s3().client()
    objects = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=f"{S3_PREFIX}/"):
            for item in page.get("Contents", []):
                match = _OBJECT_KEY.match(item["Key"])
                if match is not None:
                    partition, start, suffix = match.groups()
                    objects.append(S3Object(item["Key"], int(item["Size"]), int(partition), int(start), suffix))
    except (BotoCoreError, ClientError) as e:
        raise DemoError(f"listing s3://{S3_BUCKET}/{S3_PREFIX}/: {e}") from None
    finally:
        client.close()
    return sorted(objects, key=lambda o: (o.partition, o.start_offset, o.suffix))


def _range(first: int, last: int) -> str:
    return f"{first}..{last}" if last >= first else "-"


def show_tiers(run: DemoRun) -> None:
    """Per partition, as its leader reports it (GET /v1/partitions): the offsets in S3 (Rx..Ry) and on its
    disk (Lx..Lz, both inclusive here), the HW, and the bytes in each tier; the S3 side (objects, bytes) is
    counted from the bucket itself."""
    views = _partition_views(run)
    objects = _bucket_objects(run)
    # Narrow enough for an 80-column terminal.
    table = Table(
        title=f"{TOPIC}: two tiers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False
    )
    for column in ("partition", "leader", "in S3", "on disk", "HW", "S3\nobjects", "S3\nbytes", "disk\nbytes"):
        table.add_column(column, justify="right", no_wrap=True)
    objects_total = s3_total = disk_total = remote_total = hw_total = 0
    for partition in range(PARTITIONS):
        leader = _leader_view(views.get(partition, {}))
        if leader is None:
            raise DemoError(f"no broker reports leading {TOPIC}-{partition}")
        leader_id, view = leader
        mine = [o for o in objects if o.partition == partition]
        s3_bytes = sum(o.size for o in mine)
        remote_end = int(view["highest_offset_in_remote_storage"])
        table.add_row(
            str(partition),
            str(leader_id),
            _range(int(view["log_start_offset"]), remote_end),
            _range(int(view["local_log_start_offset"]), int(view["log_end_offset"]) - 1),
            str(view["high_watermark"]),
            str(len(mine)),
            f"{s3_bytes:,}",
            f"{int(view['local_size_bytes']):,}",
        )
        objects_total += len(mine)
        s3_total += s3_bytes
        disk_total += int(view["local_size_bytes"])
        remote_total += remote_end + 1
        hw_total += int(view["high_watermark"])
    table.add_section()
    table.add_row(
        "all",
        "",
        f"{remote_total:,}",
        f"{hw_total - remote_total:,}",
        f"{hw_total:,}",
        str(objects_total),
        f"{s3_total:,}",
        f"{disk_total:,}",
    )
    run.console.print(table)
    share = 100 * s3_total / (s3_total + disk_total) if s3_total + disk_total else 0
    run.console.print(
        f"S3 holds {remote_total:,} of the {hw_total:,} events in {objects_total} objects "
        f"(.log, .index, .timeindex, .leader_epoch_checkpoint, .snapshot per segment): {share:.0f}% of the bytes; "
        f"each broker keeps about {disk_total:,} bytes on its disk (one replica of each partition)"
    )


# --- the fault story -------------------------------------------------------------------------------------


def consume_and_verify(run: DemoRun) -> None:
    """Read everything back from the beginning and check each event: key, value, headers, no duplicates,
    and per-key order (one key lands in one partition, where offsets keep the order it was sent in). What
    lies below a leader's local log start comes from S3, read by that leader for the consumer."""
    local_starts = _leaders_local_starts(run)
    consumer = Consumer(
        run.client(**{"group.id": "tierlog-demo", "enable.auto.commit": False, "enable.auto.offset.store": False})
    )
    seen: set[int] = set()
    last_by_key: dict[bytes, int] = {}
    run.partitions = {p: PartitionStats() for p in range(PARTITIONS)}
    started = time.monotonic()
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        with progress_bar(run.console) as progress:
            task = progress.add_task("consuming from offset 0 (S3, then local)", total=run.events)
            while len(seen) < run.events:
                if time.monotonic() >= run.deadline:
                    raise DemoError(f"only {len(seen):,} of {run.events:,} events came back before the deadline")
                check_alive(run)
                for message in consumer.consume(num_messages=1000, timeout=min(0.2, run.remaining())):
                    event_id = _verify(message, seen, last_by_key)
                    seen.add(event_id)
                    stats = run.partitions[message.partition()]
                    stats.records += 1
                    stats.first_offset = message.offset() if stats.first_offset < 0 else stats.first_offset
                    stats.last_offset = message.offset()
                    if message.offset() < local_starts[message.partition()]:
                        stats.from_s3 += 1
                    progress.advance(task)
        consume_seconds = time.monotonic() - started
        _verify_nothing_more(run, consumer)
    finally:
        consumer.close()
    from_s3 = sum(s.from_s3 for s in run.partitions.values())
    run.console.print(
        f"{len(seen):,} events read back and verified in {consume_seconds:.2f}s"
        f"{_rate(len(seen), consume_seconds)}: keys, values, headers, per-key order, no gaps or extras"
    )
    run.console.print(
        f"{from_s3:,} of them from S3 (below each leader's local log start, fetched by the leader from the "
        f"bucket), {len(seen) - from_s3:,} from the leaders' disks"
    )


def _leaders_local_starts(run: DemoRun) -> dict[int, int]:
    """partition -> the local log start its leader (as Metadata names it) reports, once every leader reports
    leading: a newly elected leader may not have applied its election when Metadata already names it."""
    while True:
        views = _partition_views(run)
        leaders = _leaders(run)
        starts = {
            partition: int(view["local_log_start_offset"])
            for partition, (leader, _) in leaders.items()
            if (view := views.get(partition, {}).get(leader)) is not None and view.get("role") == "leader"
        }
        if len(starts) == PARTITIONS:
            return starts
        check_alive(run)
        time.sleep(min(POLL_S, run.remaining()))


def _verify_nothing_more(run: DemoRun, consumer: Consumer) -> None:
    """The topic is fresh, so each partition must hold exactly offsets 0..last: its high watermark is the
    next offset after the last event read, with no gap and nothing beyond."""
    for partition, stats in sorted(run.partitions.items()):
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(TOPIC, partition), timeout=min(5.0, run.remaining()), cached=False
            )
        except KafkaException as e:
            raise DemoError(kafka_error_message(e.args[0], f"offsets of {TOPIC}-{partition}")) from None
        if stats.records != stats.last_offset + 1 or high != stats.records:
            raise DemoError(
                f"{TOPIC}-{partition}: read {stats.records} events up to offset {stats.last_offset}, "
                f"but its high watermark is {high}"
            )


def _verify(message: Message, seen: set[int], last_by_key: dict[bytes, int]) -> int:
    error = message.error()
    if error is not None:
        raise DemoError(kafka_error_message(error, f"consuming {TOPIC}-{message.partition()}"))
    where = f"{TOPIC}-{message.partition()} offset {message.offset()}"
    headers = message.headers() or []
    ids = [value for name, value in headers if name == EVENT_ID_HEADER]
    if len(ids) != 1 or ids[0] is None or not ids[0].isdigit():
        raise DemoError(f"{where}: expected one {EVENT_ID_HEADER} header, got headers {headers}")
    event_id = int(ids[0])
    if SOURCE_HEADER not in headers:
        raise DemoError(f"{where}: header {SOURCE_HEADER[0]}={SOURCE_HEADER[1]!r} is missing")
    if event_id in seen:
        raise DemoError(f"{where}: event {event_id} was read twice")
    key = event_key(event_id)
    if message.key() != key or message.value() != event_value(event_id):
        raise DemoError(f"{where}: event {event_id} came back as key={message.key()!r} value={message.value()!r}")
    if last_by_key.get(key, -1) > event_id:
        raise DemoError(f"{where}: event {event_id} of {key.decode()} came after event {last_by_key[key]}")
    last_by_key[key] = event_id
    return event_id


def show_replication(run: DemoRun) -> None:
    """Every broker's own view of its replicas (GET /v1/partitions), as `tierlog cluster status` shows it."""
    cluster = run.started_cluster()
    addresses = {n: cluster.http_address(n) for n in cluster.node_ids}
    reports = asyncio.run(gather_reports(addresses, min(5.0, run.remaining())))
    # The remote log metadata topic is the brokers' business; the demo shows its own topic.
    statuses = [status for status in merge_partition_reports(reports) if status.topic == TOPIC]
    # The tiers have a step and a table of their own.
    run.console.print(status_table(reports, statuses, tier_columns=False))


def _leaders(run: DemoRun) -> dict[int, tuple[int, list[int]]]:
    admin = AdminClient(run.client())
    metadata = admin.list_topics(topic=TOPIC, timeout=min(5.0, run.remaining())).topics[TOPIC]
    return {p.id: (p.leader, list(p.isrs)) for p in metadata.partitions.values()}


def kill_a_leader(run: DemoRun) -> None:
    """SIGKILL the leader of a partition (not the active controller, whose failover the demo showed already):
    the controller fences it when its heartbeats stop and elects the next in-sync replica, with a new leader
    epoch."""
    cluster = run.started_cluster()
    before = _leaders(run)
    active_controller = controller_quorum(run).leader_id
    partition, (victim, _) = next((p, v) for p, v in sorted(before.items()) if v[0] != active_controller)
    cluster.kill(victim)
    run.killed = victim
    run.console.print(f"kill -9 broker {victim}, leader of {TOPIC}-{partition}")
    started = time.monotonic()
    with spinner(run.console) as progress:
        progress.add_task(f"waiting for the controller to fence broker {victim} and elect new leaders", total=None)
        while True:
            after = _leaders(run)
            if all(leader not in (victim, -1) and victim not in isr for leader, isr in after.values()):
                break
            check_alive(run)
            time.sleep(min(0.2, run.remaining()))
    seconds = time.monotonic() - started
    for p in sorted(after):
        (old, _), (new, isr) = before[p], after[p]
        moved = f"leader {old} -> {new}" if old != new else f"leader {new}"
        run.console.print(f"  {TOPIC}-{p}: {moved}, ISR {isr}")
    run.console.print(f"new leaders elected {seconds:.1f}s after the kill (broker.session.timeout.ms=3000)")


def restart_killed_broker(run: DemoRun) -> None:
    """Restart the node killed last and wait until it is back in every ISR and, as a voter, has caught up with
    the quorum's leader."""
    cluster = run.started_cluster()
    victim = run.killed
    if victim is None:
        raise DemoError("no broker was killed")
    with spinner(run.console) as progress:
        progress.add_task(f"restarting node {victim}; it catches up and rejoins every ISR and the quorum", total=None)
        try:
            cluster.restart(victim, min(30.0, run.remaining()))
        except BrokerStartError as e:
            raise DemoError(str(e)) from None
        while not all(victim in isr for _, isr in _leaders(run).values()):
            check_alive(run)
            time.sleep(min(0.2, run.remaining()))
        # Caught up: it holds everything committed (the leader's own log end moves on with every no-op record).
        quorum = controller_quorum(run)
        while next(v for v in quorum.voters if v.node_id == victim).log_end_offset < quorum.high_watermark:
            time.sleep(min(0.2, run.remaining()))
            quorum = controller_quorum(run)
    run.console.print(f"broker {victim} restarted, truncated by leader epoch, caught up and is back in every ISR")
    run.console.print(
        f"voter {victim} caught up with the metadata log (offset {quorum.high_watermark:,}); "
        f"node {quorum.leader_id} stays the active controller (epoch {quorum.leader_epoch})"
    )


def restart_and_show_replication(run: DemoRun) -> None:
    restart_killed_broker(run)
    show_replication(run)


def run_spark_pipeline(run: DemoRun) -> None:
    """The ETL pipeline of `tierlog pipeline run` over the demo's topic: Spark reads the S3 part of each
    partition straight from the bucket and the rest from the brokers, into a Parquet table, which is then
    checked against what was produced and summarised."""
    # pyspark takes a second to import: the demo pays for it only when it gets here.
    from tierlog.spark.options import parse_batch_options
    from tierlog.spark.pipeline import PipelineConfig, spark_session, stream_to_parquet
    from tierlog.spark.source import RemoteSlicePartition, TierlogBatchReader

    settings = run.started_s3().rsm_properties(S3_BUCKET, S3_PREFIX)
    table = run.root / "pipeline" / "demo-events"
    config = PipelineConfig(
        bootstrap_servers=run.started_cluster().bootstrap,
        topic=TOPIC,
        output=str(table),
        remote_storage={key.removeprefix("rsm.config."): value for key, value in settings.items()},
        client_settings=run.client_settings(),
    )
    spark_log = run.root / "spark.log"
    # The JVM, and librdkafka when the planner's clients close, write to stderr.
    with _stderr_to(spark_log):
        planned = TierlogBatchReader(parse_batch_options(config.source_options())).partitions()
        with spinner(run.console) as progress:
            progress.add_task("starting Spark (local, one JVM)", total=None)
            spark = spark_session("tierlog-demo")
    from_s3 = sum(isinstance(p, RemoteSlicePartition) for p in planned)
    try:
        run.console.print(
            f"Spark plans {len(planned)} tasks: {from_s3} read segments straight from s3://{S3_BUCKET} "
            f"(no broker involved), {len(planned) - from_s3} read the local tails from the brokers"
        )
        query = stream_to_parquet(spark, config, str(run.root / "pipeline" / "_checkpoint"))
        try:
            with progress_bar(run.console) as progress:
                task = progress.add_task("streaming events into Parquet (date/hour)", total=run.events)
                while query.isActive:
                    query.awaitTermination(min(0.5, run.remaining()))
                    rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
                    progress.update(task, completed=rows)
        finally:
            query.stop()
        if query.exception() is not None:
            raise DemoError(f"the Spark pipeline failed: {query.exception()} (Spark's log: {spark_log})")
        events = spark.read.parquet(str(table))
        counts = events.selectExpr("count(*) AS rows", "count(DISTINCT event_id) AS ids").first()
        if counts is None or counts["rows"] != run.events or counts["ids"] != run.events:
            raise DemoError(f"the Parquet table holds {counts} rows/ids, expected {run.events:,} events once each")
        summary = events.groupBy("date", "hour", "type").agg({"*": "count", "amount_cents": "sum"})
        rows = summary.orderBy("date", "hour", "type").collect()
    finally:
        spark.stop()
    shown = Table("date", "hour", "type", "events", "amount", box=box.SIMPLE_HEAD)
    for row in rows:
        shown.add_row(
            str(row["date"]),
            f"{row['hour']:02d}",
            row["type"],
            f"{row['count(1)']:,}",
            f"{row['sum(amount_cents)'] / 100:,.2f}",
        )
    run.console.print(shown)
    run.console.print(
        f"Parquet table {table}: {run.events:,} events, each exactly once "
        "(the offsets are in the checkpoint: running the pipeline again reads only new events)"
    )


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point this process's stderr (file descriptor 2) at `path` meanwhile, so the processes started inside
    write theirs there for good: the JVM's warnings and Spark's and librdkafka's log lines would otherwise
    break into the demo's output, past the width of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def show_segment(run: DemoRun) -> None:
    """The first segment of partition 0, as it lies in S3: a Kafka segment file, which `dump-log` reads as
    kafka-dump-log.sh would. Without one in S3 (too few events to close a segment), the local one."""
    first = next((o for o in _bucket_objects(run) if o.partition == 0 and o.suffix == ".log"), None)
    if first is not None:
        segment = run.root / "from-s3" / f"{first.start_offset:020d}.log"
        segment.parent.mkdir(parents=True, exist_ok=True)
        client = run.started_s3().client()
        try:
            body = client.get_object(Bucket=S3_BUCKET, Key=first.key)["Body"]
            try:
                segment.write_bytes(body.read())
            finally:
                body.close()
        except (BotoCoreError, ClientError) as e:
            raise DemoError(f"downloading s3://{S3_BUCKET}/{first.key}: {e}") from None
        finally:
            client.close()
        # The key is longer than a terminal line: its directory (the partition and topic id) and its name
        # (start offset and segment id) each get one.
        directory, _, name = first.key.rpartition("/")
        run.console.print(f"the first segment object of {TOPIC}-0 ({first.size:,} bytes):", highlight=False)
        run.console.print(f"  s3://{S3_BUCKET}/{directory}/\n  {name}", highlight=False)
        run.console.print(f"downloaded to {segment}", highlight=False)
    else:
        found = min(run.partition_dir(0).glob("*.log"), default=None)
        if found is None:
            raise DemoError(f"no segment of {TOPIC}-0 in S3 nor in {run.partition_dir(0)}")
        segment = found
        run.console.print(f"no segment of {TOPIC}-0 in S3 yet (too few events to close one); the local one")
    out = io.StringIO()
    dump_log(segment, print_data_log=True, out=out)
    lines = out.getvalue().splitlines()
    run.console.print(f"$ tierlog dump-log --print-data-log \\\n    --files {segment}", highlight=False)
    excerpt = Text("\n".join(lines[:DUMP_EXCERPT_LINES]))
    run.console.print(Panel(excerpt, subtitle=f"first {DUMP_EXCERPT_LINES} of {len(lines):,} lines"))


def stop_all(run: DemoRun) -> None:
    """The brokers first (controlled shutdown), then the S3 server they write to."""
    cluster = run.started_cluster()
    started = time.monotonic()
    with spinner(run.console) as progress:
        progress.add_task(f"stopping {BROKERS} brokers (controlled shutdown)", total=None)
        cluster.stop()
    marker = cluster.broker(CONTROLLER_NODE_ID).log_dir / ".kafka_cleanshutdown"
    state = "wrote " + marker.name if marker.exists() else "no clean-shutdown marker"
    run.console.print(f"{BROKERS} brokers shut down cleanly ({state}) in {time.monotonic() - started:.1f}s")
    started = time.monotonic()
    with spinner(run.console) as progress:
        progress.add_task("stopping the S3 server", total=None)
        run.started_s3().stop()
    run.console.print(f"S3 server stopped in {time.monotonic() - started:.1f}s")


STEPS: tuple[tuple[str, Callable[[DemoRun], None]], ...] = (
    ("Start a local S3 server", start_s3),
    (f"Start {BROKERS} brokers, also the controller quorum, their remote tier on S3", start_cluster),
    (f"Create topic {TOPIC} with remote storage on", create_topic),
    ("Produce events (lz4, acks=all); kill -9 the active controller halfway", produce_events),
    ("Restart the killed controller: back in the quorum and every ISR", restart_killed_broker),
    ("Replication: leader, epoch, ISR, HW and every replica's LEO", show_replication),
    ("Tiering: closed segments go to S3, then leave the brokers' disks", move_to_s3),
    ("Two tiers per partition: S3 and local disk", show_tiers),
    ("Kill a leader with SIGKILL", kill_a_leader),
    ("Consume every event from offset 0 on the survivors, old ones from S3", consume_and_verify),
    ("Restart it: it rejoins the ISR", restart_and_show_replication),
    ("Spark pipeline: the topic into Parquet, old segments straight from S3", run_spark_pipeline),
    ("Look inside a segment in S3 (dump-log)", show_segment),
    ("Stop the cluster and the S3 server", stop_all),
)


def _rate(count: int, seconds: float) -> str:
    return f" ({count / seconds:,.0f}/s)" if seconds > 0 else ""


@contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    """SIGTERM (e.g. `timeout` or a CI runner) stops the demo as Ctrl-C does, through the cleanup."""

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        # Once: a second SIGTERM must not cut the cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _shut_down(run: DemoRun) -> None:
    """Stop whatever still runs, the brokers before the S3 server they write to; each is bounded, and a
    failure stopping one does not leave the other running."""
    try:
        if run.cluster is not None:
            run.cluster.stop()
    finally:
        if run.s3 is not None:
            run.s3.stop()


@click.command()
@click.option("--events", type=click.IntRange(min=1), default=10_000, show_default=True, help="Events to produce.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the brokers' and the S3 server's data and logs here (must be empty or absent); "
    "default: a temporary directory.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary data directory afterwards.")
@click.option(
    "--secure",
    is_flag=True,
    help="Run it secured, as `tierlog cluster up --secure`: every client (producer, consumer, Spark) on SASL_SSL "
    "with SASL/PLAIN; the brokers talk to each other on PLAINTEXT, 127.0.0.1 only.",
)
@timeout_option(240, "Seconds in all.", minimum=1)
def demo(events: int, data_dir: Path | None, keep: bool, secure: bool, timeout_s: float) -> None:
    """Run a local 3-broker cluster with tiered storage on a local S3 server, and 10,000 events through it.

    Starts an S3 server (SeaweedFS) and three brokers on free ports, also the 3 voters of the controller
    quorum, creates a topic with 3 replicas and remote storage on, produces events with keys, headers and lz4
    (acks=all) and kills the active controller halfway (a new one is elected, producing goes on), restarts
    it and waits until it caught up, waits until the closed
    segments are in S3 and gone from the brokers' disks, shows both tiers, kills a leader, consumes and
    verifies every event from offset 0 (the older ones come from S3), restarts the killed broker, runs the
    Spark pipeline (S3 segments read straight from the bucket) into a Parquet table and shows it, dumps a
    segment from the bucket, and stops everything (also on failure or Ctrl-C)."""
    console = Console()
    if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
        raise click.BadParameter(f"{data_dir} is not empty; give an empty or new directory", param_hint="--data-dir")
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="tierlog-demo-"))
    started = time.monotonic()
    run = DemoRun(console=console, root=root, events=events, deadline=started + timeout_s, secure=secure)
    failed = False
    exit_code = 0
    with _sigterm_as_exception():
        try:
            for number, (title, step) in enumerate(STEPS, start=1):
                console.rule(f"[bold]{number}/{len(STEPS)}  {title}", align="left")
                step(run)
        except DemoError as e:
            failed, exit_code = True, 1
            console.print(f"[red bold]demo failed:[/red bold] {e}", highlight=False)
        except (KeyboardInterrupt, Terminated) as e:
            exit_code = 130 if isinstance(e, KeyboardInterrupt) else 143
            what = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
            console.print(f"[yellow bold]{what}:[/yellow bold] stopping the brokers and the S3 server")
        except Exception:
            failed = True  # a bug: keep the data and the logs for whoever looks into it
            raise
        finally:
            _shut_down(run)
            if data_dir is None and not keep and not failed:
                shutil.rmtree(root, ignore_errors=True)
            else:
                console.print(f"data and logs kept in {root}")
    if exit_code:
        raise click.exceptions.Exit(exit_code)
    console.rule(
        f"[green bold]demo finished in {time.monotonic() - started:.1f}s: every event came back intact",
        align="left",
    )
