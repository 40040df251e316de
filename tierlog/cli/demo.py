"""`tierlog demo`: the README's main job. A local 3-broker cluster, a replicated topic, 10,000 events
through real clients, a leader killed with SIGKILL on the way, every event verified on the way back, and a
look at the segment files they landed in.

The demo is a list of steps sharing one `DemoRun`; later issues add steps (three brokers, tiered storage,
a Spark pipeline) without touching the ones here. Every step works against the run's deadline, so a
broker that hangs turns into a clear failure, never into a demo that waits forever.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

import click
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tierlog.cli.clients import CliError, client_config, kafka_error_message, progress_bar, timeout_option
from tierlog.cli.cluster import gather_reports, merge_partition_reports, status_table
from tierlog.cli.dump_log import dump_log
from tierlog.cli.local_cluster import CONTROLLER_NODE_ID, BrokerStartError, LocalCluster
from tierlog.cli.produce import produce_bounded
from tierlog.records.record_batch import iter_batches

TOPIC = "demo-events"
PARTITIONS = 3
BROKERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
# A killed broker is fenced after broker.session.timeout.ms (Kafka's 9 s); 3 s keeps the demo brisk.
CLUSTER_OVERRIDES = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
USERS = 100
EVENT_TYPES = ("page_view", "add_to_cart", "purchase", "search")
SOURCE_HEADER = ("source", b"tierlog-demo")
EVENT_ID_HEADER = "event-id"
DUMP_EXCERPT_LINES = 6  # the file, its base offset, a batch and its first records


class DemoError(Exception):
    """A step failed; the message says what was expected and what happened."""


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


@dataclass
class DemoRun:
    """What the steps share: where the data lives, the cluster, the deadline, and what was measured."""

    console: Console
    root: Path
    events: int
    deadline: float
    cluster: LocalCluster | None = None
    killed: int | None = None
    partitions: dict[int, PartitionStats] = field(default_factory=dict)

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DemoError("the demo ran out of time (raise --timeout if this machine is slow)")
        return left

    def started_cluster(self) -> LocalCluster:
        if self.cluster is None:
            raise DemoError("no cluster was started")
        return self.cluster

    def partition_dir(self, partition: int) -> Path:
        return self.started_cluster().broker(CONTROLLER_NODE_ID).log_dir / f"{TOPIC}-{partition}"


def start_cluster(run: DemoRun) -> None:
    run.cluster = LocalCluster(run.root, brokers=BROKERS, overrides=CLUSTER_OVERRIDES)
    with progress_bar(run.console) as progress:
        task = progress.add_task(f"starting {BROKERS} brokers (registered with the controller)", total=BROKERS)
        try:
            run.cluster.start(
                min(60.0, run.remaining()), progress=lambda p: progress.update(task, completed=p.registered)
            )
        except BrokerStartError as e:
            raise DemoError(str(e)) from None
    for node_id in run.cluster.node_ids:
        broker = run.cluster.broker(node_id)
        role = "broker + controller" if node_id == CONTROLLER_NODE_ID else "broker"
        run.console.print(
            f"node {node_id} ({role}, pid {broker.pid}) serves {broker.bootstrap}, data in {broker.log_dir}"
        )
    run.console.print(f"bootstrap servers: [bold]{run.cluster.bootstrap}[/bold]")


def create_topic(run: DemoRun) -> None:
    bootstrap = run.started_cluster().bootstrap
    admin = AdminClient(client_config(bootstrap))
    timeout_s = min(15.0, run.remaining())
    # compression.type=producer is Kafka's default, spelled out because the demo shows it on disk: the
    # log keeps each batch in the codec the producer chose.
    future = admin.create_topics(
        [
            NewTopic(
                TOPIC,
                num_partitions=PARTITIONS,
                replication_factor=REPLICATION_FACTOR,
                config={"compression.type": "producer", "min.insync.replicas": str(MIN_INSYNC_REPLICAS)},
            )
        ],
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


def produce_events(run: DemoRun) -> None:
    bootstrap = run.started_cluster().bootstrap
    timeout_s = run.remaining()
    producer = Producer(
        client_config(
            bootstrap,
            acks="all",
            **{"compression.type": "lz4", "linger.ms": 5, "delivery.timeout.ms": int(timeout_s * 1000)},
        )
    )
    errors: list[str] = []
    started = time.monotonic()
    with progress_bar(run.console) as progress:
        task = progress.add_task(f"producing to {TOPIC} (lz4, acks=all)", total=run.events)

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(kafka_error_message(error, f"event to {TOPIC}-{message.partition()}"))
            else:
                progress.advance(task)

        for event_id in range(run.events):
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
    run.console.print(
        f"{run.events:,} events acknowledged in {produce_seconds:.2f}s{_rate(run.events, produce_seconds)}"
    )


def consume_and_verify(run: DemoRun) -> None:
    """Read everything back from the beginning and check each event: key, value, headers, no duplicates,
    and per-key order (one key lands in one partition, where offsets keep the order it was sent in)."""
    bootstrap = run.started_cluster().bootstrap
    consumer = Consumer(
        client_config(
            bootstrap, **{"group.id": "tierlog-demo", "enable.auto.commit": False, "enable.auto.offset.store": False}
        )
    )
    seen: set[int] = set()
    last_by_key: dict[bytes, int] = {}
    run.partitions = {p: PartitionStats() for p in range(PARTITIONS)}
    started = time.monotonic()
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        with progress_bar(run.console) as progress:
            task = progress.add_task(f"consuming {TOPIC} from the beginning", total=run.events)
            while len(seen) < run.events:
                if time.monotonic() >= run.deadline:
                    raise DemoError(f"only {len(seen):,} of {run.events:,} events came back before the deadline")
                for message in consumer.consume(num_messages=1000, timeout=min(0.2, run.remaining())):
                    event_id = _verify(message, seen, last_by_key)
                    seen.add(event_id)
                    stats = run.partitions[message.partition()]
                    stats.records += 1
                    stats.first_offset = message.offset() if stats.first_offset < 0 else stats.first_offset
                    stats.last_offset = message.offset()
                    progress.advance(task)
        consume_seconds = time.monotonic() - started
        _verify_nothing_more(run, consumer)
    finally:
        consumer.close()
    run.console.print(
        f"{len(seen):,} events read back and verified in {consume_seconds:.2f}s"
        f"{_rate(len(seen), consume_seconds)}: keys, values, headers, per-key order, no gaps or extras"
    )


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


def show_summary(run: DemoRun) -> None:
    """Per partition: what the consumer saw, and what the segment files hold (read from the files, so the
    compression column shows what the producer really sent: the log stores batches as they arrive)."""
    table = Table(title=f"{TOPIC} on disk", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("partition", "records", "offsets", "segments", "batches", "codec", "bytes"):
        table.add_column(column, justify="left" if column == "codec" else "right")
    total_bytes = total_batches = 0
    for partition, stats in sorted(run.partitions.items()):
        segments = sorted(run.partition_dir(partition).glob("*.log"))
        size = sum(s.stat().st_size for s in segments)
        codecs: Counter[str] = Counter()
        for segment in segments:
            data = segment.read_bytes()
            if data:
                codecs.update(header.compression_type.name.lower() for header in iter_batches(data))
        total_bytes += size
        total_batches += codecs.total()
        table.add_row(
            str(partition),
            f"{stats.records:,}",
            f"{stats.first_offset}-{stats.last_offset}",
            str(len(segments)),
            f"{codecs.total():,}",
            ", ".join(sorted(codecs)),
            f"{size:,}",
        )
    total_records = sum(s.records for s in run.partitions.values())
    table.add_section()
    table.add_row("all", f"{total_records:,}", "", "", f"{total_batches:,}", "", f"{total_bytes:,}")
    run.console.print(table)


def show_replication(run: DemoRun) -> None:
    """Every broker's own view of its replicas (GET /v1/partitions), as `tierlog cluster status` shows it."""
    cluster = run.started_cluster()
    addresses = {n: cluster.http_address(n) for n in cluster.node_ids}
    reports = asyncio.run(gather_reports(addresses, min(5.0, run.remaining())))
    run.console.print(status_table(reports, merge_partition_reports(reports)))


def _leaders(run: DemoRun) -> dict[int, tuple[int, list[int]]]:
    admin = AdminClient(client_config(run.started_cluster().bootstrap))
    metadata = admin.list_topics(topic=TOPIC, timeout=min(5.0, run.remaining())).topics[TOPIC]
    return {p.id: (p.leader, list(p.isrs)) for p in metadata.partitions.values()}


def kill_a_leader(run: DemoRun) -> None:
    """SIGKILL the leader of a partition (not node 1, whose controller the survivors need): the controller
    fences it when its heartbeats stop and elects the next in-sync replica, with a new leader epoch."""
    cluster = run.started_cluster()
    before = _leaders(run)
    partition, (victim, _) = next((p, v) for p, v in sorted(before.items()) if v[0] != CONTROLLER_NODE_ID)
    cluster.kill(victim)
    run.killed = victim
    run.console.print(f"kill -9 broker {victim}, leader of {TOPIC}-{partition}")
    started = time.monotonic()
    while True:
        after = _leaders(run)
        if all(leader not in (victim, -1) and victim not in isr for leader, isr in after.values()):
            break
        time.sleep(min(0.2, run.remaining()))
    seconds = time.monotonic() - started
    for p in sorted(after):
        (old, _), (new, isr) = before[p], after[p]
        moved = f"leader {old} -> {new}" if old != new else f"leader {new}"
        run.console.print(f"  {TOPIC}-{p}: {moved}, ISR {isr}")
    run.console.print(f"new leaders elected {seconds:.1f}s after the kill (broker.session.timeout.ms=3000)")


def restart_killed_broker(run: DemoRun) -> None:
    cluster = run.started_cluster()
    victim = run.killed
    if victim is None:
        raise DemoError("no broker was killed")
    try:
        cluster.restart(victim, min(30.0, run.remaining()))
    except BrokerStartError as e:
        raise DemoError(str(e)) from None
    while not all(victim in isr for _, isr in _leaders(run).values()):
        time.sleep(min(0.2, run.remaining()))
    run.console.print(f"broker {victim} restarted, truncated by leader epoch, caught up and is back in every ISR")
    show_replication(run)


def stop_cluster(run: DemoRun) -> None:
    cluster = run.started_cluster()
    cluster.stop()
    broker = cluster.broker(CONTROLLER_NODE_ID)
    marker = broker.log_dir / ".kafka_cleanshutdown"
    state = "wrote " + marker.name if marker.exists() else "no clean-shutdown marker"
    run.console.print(f"{BROKERS} brokers shut down cleanly ({state})")


def show_segment(run: DemoRun) -> None:
    """The same view as kafka-dump-log.sh gives of a Kafka broker's files."""
    segment = min(run.partition_dir(0).glob("*.log"), default=None)
    if segment is None:
        raise DemoError(f"no segment file in {run.partition_dir(0)}")
    out = io.StringIO()
    dump_log(segment, print_data_log=True, out=out)
    lines = out.getvalue().splitlines()
    run.console.print(f"$ tierlog dump-log --files {segment} --print-data-log", highlight=False, soft_wrap=True)
    excerpt = Text("\n".join(lines[:DUMP_EXCERPT_LINES]))
    run.console.print(Panel(excerpt, subtitle=f"first {DUMP_EXCERPT_LINES} of {len(lines):,} lines"))


STEPS: tuple[tuple[str, Callable[[DemoRun], None]], ...] = (
    (f"Start a local cluster of {BROKERS} brokers", start_cluster),
    (f"Create topic {TOPIC}", create_topic),
    ("Produce events with keys, headers and lz4 compression (acks=all)", produce_events),
    ("Replication: leader, epoch, ISR, HW and every replica's LEO", show_replication),
    ("Kill a leader with SIGKILL", kill_a_leader),
    ("Consume them back from the survivors and verify every one", consume_and_verify),
    ("Restart it: it rejoins the ISR", restart_killed_broker),
    # The files are read after a clean shutdown: complete, closed, and what a restart would recover.
    ("Stop the cluster", stop_cluster),
    ("What is on disk", show_summary),
    ("Look inside a segment (dump-log)", show_segment),
)


def _rate(count: int, seconds: float) -> str:
    return f" ({count / seconds:,.0f}/s)" if seconds > 0 else ""


@click.command()
@click.option("--events", type=click.IntRange(min=1), default=10_000, show_default=True, help="Events to produce.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the broker's data and log here (must be empty or absent); default: a temporary directory.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary data directory afterwards.")
@timeout_option(120, "Seconds in all.", minimum=1)
def demo(events: int, data_dir: Path | None, keep: bool, timeout_s: float) -> None:
    """Run a local 3-broker cluster and 10,000 events through it.

    Starts three brokers on free ports, creates a topic with 3 replicas, produces events with keys, headers
    and lz4 (acks=all), kills a leader, consumes and verifies every one from the survivors, restarts the
    killed broker, shows what is on disk, and stops the cluster."""
    console = Console()
    if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
        raise click.BadParameter(f"{data_dir} is not empty; give an empty or new directory", param_hint="--data-dir")
    root = data_dir if data_dir is not None else Path(tempfile.mkdtemp(prefix="tierlog-demo-"))
    run = DemoRun(console=console, root=root, events=events, deadline=time.monotonic() + timeout_s)
    failed = False
    try:
        for number, (title, step) in enumerate(STEPS, start=1):
            console.rule(f"[bold]{number}/{len(STEPS)}  {title}", align="left")
            step(run)
    except DemoError as e:
        failed = True
        console.print(f"[red bold]demo failed:[/red bold] {e}", highlight=False)
    finally:
        if run.cluster is not None:
            run.cluster.stop()
        if data_dir is None and not keep and not failed:
            shutil.rmtree(root, ignore_errors=True)
        else:
            console.print(f"data and broker log kept in {root}")
    if failed:
        raise click.exceptions.Exit(1)
    console.rule("[green bold]demo finished: every event came back intact", align="left")
