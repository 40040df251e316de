"""Produce and consume throughput of one local tierlog broker, measured with confluent-kafka (librdkafka).

For every message size x partition count it creates a topic, produces for about `--seconds` with
acks=1, linger.ms=5, batch.size=1 MB and no compression, then consumes every message back from the
beginning (assign, no consumer group). Throughput counts message payload bytes (1 MB = 10^6 bytes).

    python bench/throughput.py            # 1 KiB and 100 B messages, 1 and 8 partitions, ~6 s each
    python bench/throughput.py --quick    # ~1.5 s each, for a smoke run
    python bench/throughput.py --cprofile /tmp/broker.prof   # the broker runs under cProfile

Writes `bench/results/throughput.json` (machine, parameters, results) and `bench/results/throughput.png`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
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
    write_report,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierlog.testing.local_cluster import BrokerProcess


@dataclass
class Phase:
    messages: int
    payload_bytes: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    def to_json(self) -> dict[str, float | int]:
        return {
            **asdict(self),
            "msgs_per_s": round(self.msgs_per_s),
            "mb_per_s": round(self.mb_per_s, 2),
        }


class ProfiledBrokerProcess(BrokerProcess):
    """The same broker under cProfile; the profile is written when the broker exits after SIGTERM."""

    def __init__(self, *args: Any, profile_path: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_path = profile_path

    def command(self) -> list[str]:
        args = super().command()
        assert args[1:3] == ["-m", "tierlog"]
        return [args[0], "-m", "cProfile", "-o", str(self.profile_path), "-m", "tierlog", *args[3:]]


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        meta = admin.list_topics(topic=name, timeout=TIMEOUT_S).topics.get(name)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {name} has no metadata after {TIMEOUT_S}s")
        time.sleep(0.05)


def produce(
    bootstrap: str, topic: str, size: int, seconds: float, max_messages: int | None, client: Mapping[str, Any] = {}
) -> Phase:
    """`client`: more librdkafka settings (security.protocol, ssl.*, ...)."""
    producer = Producer({**producer_config(bootstrap, 1, linger_ms=5, queue=1_000_000, timeout_s=TIMEOUT_S), **client})
    payload = os.urandom(size)
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    started = time.perf_counter()
    sent = produce_flat_out(producer, topic, payload, on_delivery, seconds, max_messages)
    remaining = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if remaining or failures:
        raise RuntimeError(f"{remaining} undelivered, {len(failures)} failed, first: {failures[:1]}")
    return Phase(sent, sent * size, elapsed)


def consume(
    bootstrap: str, topic: str, partitions: int, expected: int, size: int, client: Mapping[str, Any] = {}
) -> Phase:
    consumer = Consumer({**consumer_config(bootstrap, 8 * 1024 * 1024), **client})
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        received = 0
        payload_bytes = 0
        deadline = time.monotonic() + TIMEOUT_S
        while received < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {received} of {expected} messages in {TIMEOUT_S}s")
            for msg in consumer.consume(num_messages=100_000, timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                received += 1
                payload_bytes += len(msg.value())
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if payload_bytes != expected * size:
        raise RuntimeError(f"consumed {payload_bytes} payload bytes, expected {expected * size}")
    return Phase(received, payload_bytes, elapsed)


PHASE_COLORS = (("produce", "#3b7dd8"), ("consume", "#e07b39"))


def draw_phases(axes: Sequence[Any], results: list[dict[str, Any]]) -> None:
    """Produce and consume side by side, in MB/s and in messages/s."""
    for ax, metric, unit in ((axes[0], "mb_per_s", "MB/s"), (axes[1], "msgs_per_s", "messages/s")):
        series = [(phase, [r[phase][metric] for r in results], color) for phase, color in PHASE_COLORS]
        paired_bars(ax, series, "{:,.0f}")
        ax.set_ylabel(unit)
        ax.set_title(unit)


def main() -> None:
    parser = argument_parser(__doc__, "throughput", "about 1.5 s of producing per configuration")
    parser.add_argument("--seconds", type=float, default=6.0, help="produce for this long per configuration")
    parser.add_argument("--messages", type=int, default=None, help="produce exactly this many instead")
    parser.add_argument("--sizes", default="1024,100", help="message sizes in bytes, comma-separated")
    parser.add_argument("--partitions", default="1,8", help="partition counts, comma-separated")
    parser.add_argument("--cprofile", type=Path, default=None, help="run the broker under cProfile, write here")
    args = parser.parse_args()
    seconds = 1.5 if args.quick else args.seconds
    sizes = [int(s) for s in args.sizes.split(",")]
    partition_counts = [int(p) for p in args.partitions.split(",")]

    work_dir = Path(tempfile.mkdtemp(prefix="tierlog-bench-"))
    overrides = {"log.retention.check.interval.ms": "300000"}
    if args.cprofile is not None:
        broker: BrokerProcess = ProfiledBrokerProcess(
            work_dir / "data", overrides=overrides, profile_path=args.cprofile.resolve()
        )
    else:
        broker = BrokerProcess(work_dir / "data", overrides=overrides)
    results: list[dict[str, Any]] = []
    try:
        broker.start()
        broker.wait_ready(60)
        for size in sizes:
            for partitions in partition_counts:
                topic = f"bench-{size}b-{partitions}p"
                create_topic(broker.bootstrap, topic, partitions)
                produced = produce(broker.bootstrap, topic, size, seconds, args.messages)
                consumed = consume(broker.bootstrap, topic, partitions, produced.messages, size)
                row = {
                    "message_bytes": size,
                    "partitions": partitions,
                    "produce": produced.to_json(),
                    "consume": consumed.to_json(),
                }
                results.append(row)
                print(
                    f"{size:>5} B x {partitions} partition(s): {produced.messages:>9,} messages  "
                    f"produce {produced.mb_per_s:7.1f} MB/s {produced.msgs_per_s:>10,.0f} msg/s  "
                    f"consume {consumed.mb_per_s:7.1f} MB/s {consumed.msgs_per_s:>10,.0f} msg/s",
                    flush=True,
                )
    finally:
        exit_code = broker.stop(60)
        shutil.rmtree(work_dir, ignore_errors=True)
    if exit_code not in (0, None):
        print(f"warning: the broker exited with code {exit_code}", file=sys.stderr)

    report = {
        "benchmark": "tierlog produce/consume throughput, confluent-kafka client, one local broker",
        "machine": machine_info(),
        "parameters": {
            "produce_seconds": None if args.messages else seconds,
            "messages": args.messages,
            "message_sizes": sizes,
            "partition_counts": partition_counts,
            "producer": {"acks": 1, "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none"},
            "consumer": "assign() from the beginning, no consumer group, queued.min.messages=1000000",
            "units": "MB = 10^6 payload bytes (keys are null; record overhead not counted)",
            "cprofile": args.cprofile is not None,
        },
        "results": results,
    }
    write_report(
        args.out,
        "throughput",
        report,
        title=f"tierlog throughput ({report['machine']['cpu']}, {report['machine']['cpu_count']} CPUs)",
        labels=[f"{r['message_bytes']} B\n{r['partitions']} partition(s)" for r in results],
        panels=2,
        figsize=(12, 4.8),
        draw=lambda axes: draw_phases(axes, results),
    )


if __name__ == "__main__":
    main()
