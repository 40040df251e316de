"""`tierlog produce TOPIC`: records from arguments or stdin lines, as `kcat -P` and `rpk topic produce`."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import click
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import ConfigResource
from rich.table import Table

from tierlog.cli.clients import (
    ClientOptions,
    CliError,
    admin_client,
    broker_refusal,
    client_options,
    connect,
    flag_settings,
    kafka_error_message,
    output_console,
    parse_key_values,
    unescape,
)

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
# librdkafka's partitioners. murmur2_random is the Java producer's: a key goes to murmur2(key) % partitions,
# so a keyed record lands where a Java client would put it; records without a key go to a random one.
PARTITIONERS = ("murmur2_random", "murmur2", "consistent_random", "consistent", "fnv1a_random", "fnv1a", "random")
DEFAULT_PARTITIONER = "murmur2_random"
# The flush after the last record waits this much past the records' own delivery timeout, so that timeout,
# which says which records failed, is the one told.
_FLUSH_GRACE_S = 1.0


@dataclass
class PartitionAcks:
    records: int = 0
    # Offsets stay None with acks=0: the broker sends nothing back.
    first_offset: int | None = None
    last_offset: int | None = None

    def offsets(self) -> str:
        if self.first_offset is None or self.last_offset is None:
            return "unknown (acks=0)"
        if self.first_offset == self.last_offset:
            return str(self.first_offset)
        return f"{self.first_offset}-{self.last_offset}"


@dataclass
class DeliveryReport:
    """What the broker acknowledged, per partition, as the delivery callbacks arrive."""

    acknowledged: int = 0
    partitions: dict[int, PartitionAcks] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # one-line message -> how many records
    # Records without a key refused as INVALID_RECORD: their reason is told once the topic's policy is known.
    keyless_refused: int = 0

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        # An exception escaping a librdkafka callback surfaces as a SystemError from flush(): nothing here
        # may raise.
        if error is not None:
            if error.code() == KafkaError.INVALID_RECORD and message.key() is None:
                self.keyless_refused += 1
                return
            text = kafka_error_message(error, f"topic {message.topic()!r}")
            self.errors[text] = self.errors.get(text, 0) + 1
            return
        self.acknowledged += 1
        acks = self.partitions.setdefault(message.partition(), PartitionAcks())
        acks.records += 1
        offset = message.offset()
        if offset is not None and offset >= 0:
            acks.first_offset = offset if acks.first_offset is None else min(acks.first_offset, offset)
            acks.last_offset = offset if acks.last_offset is None else max(acks.last_offset, offset)


def _inputs(values: tuple[str, ...]) -> Iterator[bytes]:
    """The --value arguments, else stdin lines as they arrive (so `tail -f log | tierlog produce t` streams)."""
    if values:
        yield from (v.encode() for v in values)
        return
    for line in sys.stdin.buffer:
        yield line.removesuffix(b"\n")


@click.command()
@click.argument("topic")
@click.option("-v", "--value", "values", multiple=True, help="A record value (repeatable); without it, stdin lines.")
@click.option("-k", "--key", help="Key of every record.")
@click.option(
    "-K", "--key-separator", help=r"Split each value at the first SEP into key and value (as kcat -K; '\t' works)."
)
@click.option("-H", "--header", "headers", multiple=True, metavar="KEY=VALUE", help="Header of every record.")
@click.option("-p", "--partition", type=click.IntRange(min=0), help="Partition (default: chosen by the key's hash).")
@click.option("--acks", type=click.Choice(["0", "1", "all", "-1"]), default="all", show_default=True)
@click.option("-z", "--compression", type=click.Choice(COMPRESSION_TYPES), default="none", show_default=True)
@click.option(
    "--partitioner",
    type=click.Choice(PARTITIONERS),
    default=DEFAULT_PARTITIONER,
    show_default=True,
    help="How a record without -p finds its partition (librdkafka's names); the default is the Java client's.",
)
@client_options
def produce(
    topic: str,
    values: tuple[str, ...],
    key: str | None,
    key_separator: str | None,
    headers: tuple[str, ...],
    partition: int | None,
    acks: str,
    compression: str,
    partitioner: str,
    client: ClientOptions,
) -> None:
    """Produce records from -v values or stdin lines.

    Each -v is one record; without -v, each line of stdin is one record (sent as it is read). With -v the
    whole call takes at most --timeout; reading stdin, each record has --timeout to be acknowledged."""
    if key is not None and key_separator is not None:
        raise click.UsageError("give either --key or --key-separator, not both")
    separator = unescape(key_separator).encode() if key_separator else None
    record_headers = [(k, v.encode()) for k, v in parse_key_values(headers, "--header")]
    defaults, given = flag_settings(
        {
            "acks": ("acks", acks),
            "compression.type": ("compression", compression),
            "partitioner": ("partitioner", partitioner),
        }
    )
    defaults["delivery.timeout.ms"] = int(client.timeout_s * 1000)
    producer = connect(Producer, client, client.config(defaults, given))
    report = DeliveryReport()
    target = {"partition": partition} if partition is not None else {}
    sent = 0
    for raw in _inputs(values):
        record_key: bytes | None = key.encode() if key is not None else None
        value = raw
        if separator is not None:
            head, sep, tail = raw.partition(separator)
            record_key, value = (head, tail) if sep else (None, raw)
        produce_bounded(
            producer,
            client.timeout_s,
            topic=topic,
            key=record_key,
            value=value,
            headers=record_headers,
            on_delivery=report,
            **target,
        )
        sent += 1
        producer.poll(0)
    # Each record has delivery.timeout.ms to be acknowledged or fail, which the wait for the last of them
    # leaves room for; -v values were all sent at the start, so they are bounded by the call's deadline.
    unresolved = producer.flush((client.remaining_s() if values else client.timeout_s) + _FLUSH_GRACE_S)
    if report.keyless_refused:
        # The cause first: the rest of their batches failed with them.
        report.errors = {_keyless_refusal(client, topic): report.keyless_refused, **report.errors}
    _print_report(topic, report)
    if report.errors or unresolved:
        failed = sent - report.acknowledged
        reasons = "; ".join(
            text if len(report.errors) == 1 else f"{text} ({_records(n)})" for text, n in report.errors.items()
        )
        reasons = reasons or broker_refusal() or "no answer from the broker"
        raise CliError(f"{failed} of {_records(sent)} not acknowledged: {reasons}")


def _keyless_refusal(client: ClientOptions, topic: str) -> str:
    """Why records without a key were refused. The broker's produce response names the reason for each
    record, but confluent-kafka leaves that text out of a producer's delivery reports; the reason is Kafka's
    key check when the topic is compacted, so its cleanup.policy tells."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = admin_client(client)
    timeout_s = client.remaining_s()
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s + 1)
        compacted = "compact" in configs["cleanup.policy"].value.split(",")
    except (KafkaException, FutureTimeout, KeyError):
        compacted = False
    if compacted:
        return f"topic {topic!r} is compacted: every record needs a key (-k or -K) (INVALID_RECORD)"
    return kafka_error_message(KafkaError(KafkaError.INVALID_RECORD), f"topic {topic!r}")


def produce_bounded(producer: Producer, timeout_s: float, **record: object) -> None:
    """Producer.produce, waiting while librdkafka's local queue is full, but no longer than timeout_s (the
    queue fills when records come faster than the broker acknowledges them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.produce(**record)
            return
        except BufferError:
            if time.monotonic() >= deadline:
                raise CliError(
                    f"the producer queue stayed full for {timeout_s:g}s: is the broker keeping up?"
                ) from None
            producer.poll(0.1)


def _print_report(topic: str, report: DeliveryReport) -> None:
    console = output_console()
    console.print(f"Produced {_records(report.acknowledged)} to [bold]{topic}[/bold]")
    if not report.partitions:
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("PARTITION", justify="right")
    table.add_column("RECORDS", justify="right")
    table.add_column("OFFSETS")
    for partition, acks in sorted(report.partitions.items()):
        table.add_row(str(partition), str(acks.records), acks.offsets())
    console.print(table)


def _records(n: int) -> str:
    return "1 record" if n == 1 else f"{n} records"
