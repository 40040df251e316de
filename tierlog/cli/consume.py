"""`tierlog consume TOPIC`: print records, as `kcat -C` and `rpk topic consume`.

Like both of them it follows the topic until interrupted; `--exit/-e` stops at the end of the partitions
and `--count/-n` after that many records. By default partitions are assigned directly (no group membership,
no offset commits), so consuming never changes anything on the broker. With `--group/-g` it consumes as a
member of that consumer group, as `kcat -G` and `kafka-console-consumer --group` do: the group's
coordinator assigns the partitions, consumption starts at the group's committed offsets, and every printed
record is committed before the next are read, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import IO

import click
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from tierlog.cli.clients import (
    CliError,
    client_config,
    client_options,
    ensure_reachable,
    kafka_error_message,
    topic_metadata,
    unescape,
)

# librdkafka's RD_KAFKA_OFFSET_TAIL(n): start n records before the end of the partition.
_OFFSET_TAIL_BASE = -2000
_BATCH = 500
_POLL_S = 0.2

DEFAULT_FORMAT = r"%k\t%v\n"
FORMAT_HELP = (
    "'json' (one object per record) or a kcat-style format: %t topic, %p partition, %o offset, %k key, "
    r"%v value, %T timestamp (ms), %h headers (k=v,...), %K key length, %S value length, %% percent; "
    r"\n \t \r \\ escapes."
)


def parse_start_offset(text: str) -> int:
    """beginning|start, end, N (absolute) or -N (N records before the end), as librdkafka offsets."""
    if text in ("beginning", "start", "oldest"):
        return OFFSET_BEGINNING
    if text in ("end", "newest"):
        return OFFSET_END
    try:
        value = int(text)
    except ValueError:
        raise click.BadParameter("must be beginning, end, N or -N", param_hint="--offset") from None
    return _OFFSET_TAIL_BASE + value if value < 0 else value


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 date/time (local time unless it carries an offset)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            "must be milliseconds since the epoch or an ISO-8601 time", param_hint="--from-timestamp"
        ) from None


def _text(data: bytes | None) -> str | None:
    # Keys and values are usually UTF-8; other bytes stay visible (and distinguishable) as \xNN escapes.
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def _timestamp(message: Message) -> int:
    kind, value = message.timestamp()
    return -1 if kind == TIMESTAMP_NOT_AVAILABLE else value


def _json_record(message: Message) -> bytes:
    record = {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": _timestamp(message),
        "key": _text(message.key()),
        "value": _text(message.value()),
        "headers": [{"key": k, "value": _text(v)} for k, v in message.headers() or []],
    }
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


_FIELDS: dict[str, Callable[[Message], bytes]] = {
    "t": lambda m: (m.topic() or "").encode(),
    "p": lambda m: str(m.partition()).encode(),
    "o": lambda m: str(m.offset()).encode(),
    "k": lambda m: m.key() or b"",
    "v": lambda m: m.value() or b"",
    "T": lambda m: str(_timestamp(m)).encode(),
    "h": lambda m: b",".join(k.encode() + b"=" + (v or b"") for k, v in m.headers() or []),
    "K": lambda m: str(len(m.key()) if m.key() is not None else -1).encode(),
    "S": lambda m: str(len(m.value()) if m.value() is not None else -1).encode(),
    "%": lambda m: b"%",
}


def compile_format(fmt: str) -> Callable[[Message], bytes]:
    """A renderer for `json` or a kcat-style format string; unknown %-tokens are a usage error."""
    if fmt == "json":
        return _json_record
    parts: list[bytes | Callable[[Message], bytes]] = []
    for literal, token in re.findall(r"([^%]*)(%.?)?", unescape(fmt)):
        if literal:
            parts.append(literal.encode())
        if token:
            if token[1:] not in _FIELDS:
                raise click.BadParameter(f"unknown token {token!r}", param_hint="--format")
            parts.append(_FIELDS[token[1:]])
    return lambda m: b"".join(p if isinstance(p, bytes) else p(m) for p in parts)


@click.command()
@click.argument("topic")
@click.option("-o", "--offset", help="Where to start: beginning (default), end, N, or -N (N before the end).")
@click.option("--from-timestamp", help="Start at the first record at or after this time (ms or ISO-8601).")
@click.option("-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True, help="Default: all.")
@click.option("-n", "--count", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("-e", "--exit", "exit_at_end", is_flag=True, help="Stop at the end of the partitions.")
@click.option("-f", "--format", "fmt", default=DEFAULT_FORMAT, show_default=True, help=FORMAT_HELP)
@click.option(
    "-g",
    "--group",
    help="Consume as a member of this consumer group, from its committed offsets, committing what is printed.",
)
@client_options
def consume(
    topic: str,
    offset: str | None,
    from_timestamp: str | None,
    partitions: tuple[int, ...],
    count: int | None,
    exit_at_end: bool,
    fmt: str,
    group: str | None,
    bootstrap: str,
    timeout_s: float,
) -> None:
    """Print the records of a topic.

    Starts at the beginning and follows TOPIC until Ctrl-C, as kcat -C and rpk do; -e stops at the end of
    the partitions, -n after COUNT records. With -g GROUP the group's coordinator assigns the partitions
    and the group's committed offsets say where to start (--offset beginning|end only applies to
    partitions the group has no offset for)."""
    if offset is not None and from_timestamp is not None:
        raise click.UsageError("give either --offset or --from-timestamp, not both")
    render = compile_format(fmt)
    start = parse_start_offset(offset or "beginning")
    start_ms = parse_timestamp_ms(from_timestamp) if from_timestamp is not None else None
    if group is not None:
        _check_group_options(group, start, from_timestamp, partitions)
        ensure_reachable(bootstrap, timeout_s)
        _consume_in_group(topic, group, start, render, count, exit_at_end, bootstrap, timeout_s)
        return
    ensure_reachable(bootstrap, timeout_s)
    consumer = Consumer(
        client_config(
            bootstrap,
            **{
                # Required by librdkafka, harmless here: nothing joins the group or commits to it.
                "group.id": "tierlog-cli",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
            },
        )
    )
    try:
        assignment = _assignment(consumer, topic, partitions, start, start_ms, timeout_s)
        consumer.assign(assignment)
        _print_records(consumer, _EndTracker({tp.partition for tp in assignment}), render, count, exit_at_end)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a following consume ends, as with kcat.
    finally:
        consumer.close()


def _check_group_options(group: str, start: int, from_timestamp: str | None, partitions: tuple[int, ...]) -> None:
    """A group member takes its partitions from the coordinator and its positions from the group's commits."""
    if not group:
        raise click.BadParameter("must not be empty", param_hint="--group")
    if partitions:
        raise click.UsageError("--partition assigns partitions directly: the group's coordinator does with --group")
    if from_timestamp is not None or start not in (OFFSET_BEGINNING, OFFSET_END):
        raise click.UsageError(
            "with --group, consumption starts at the group's committed offsets; --offset may only be beginning "
            "or end (where partitions without a committed offset start)"
        )


def _consume_in_group(
    topic: str,
    group: str,
    start: int,
    render: Callable[[Message], bytes],
    count: int | None,
    exit_at_end: bool,
    bootstrap: str,
    timeout_s: float,
) -> None:
    consumer = Consumer(
        client_config(
            bootstrap,
            **{
                "group.id": group,
                # Commits are ours, after printing: auto-commit could commit records not yet written out.
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest" if start == OFFSET_BEGINNING else "latest",
                "enable.partition.eof": True,
            },
        )
    )
    tracker = _EndTracker(None)
    try:
        topic_metadata(consumer, topic, timeout_s)
        consumer.subscribe([topic], on_assign=tracker.assigned, on_revoke=tracker.revoked)
        _print_records(consumer, tracker, render, count, exit_at_end, commit=_commit)
    except KeyboardInterrupt:
        pass
    finally:
        # Leaves the group at once, so the other members get its partitions without waiting for a timeout.
        consumer.close()


def _commit(consumer: Consumer, written: Sequence[Message]) -> None:
    """Commit the records just printed. A refused commit (the partition moved to another member in a
    rebalance) is told, not fatal: that member starts at the last commit, so the records are printed again
    rather than lost."""
    positions = {(m.topic(), m.partition()): m.offset() + 1 for m in written}
    offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as e:
        click.echo(f"% {kafka_error_message(e.args[0], 'commit')}", err=True)


class _EndTracker:
    """The assigned partitions that have not reached their end yet, for --exit. Assigned directly they are
    known at once; a group member learns them from the rebalance callbacks."""

    def __init__(self, partitions: set[int] | None) -> None:
        self.known = partitions is not None
        self.not_at_end = set(partitions or ())

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.known = True
        self.not_at_end |= {tp.partition for tp in partitions}

    def revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.not_at_end -= {tp.partition for tp in partitions}

    @property
    def at_end(self) -> bool:
        return self.known and not self.not_at_end


def _assignment(
    consumer: Consumer,
    topic: str,
    partitions: tuple[int, ...],
    start: int,
    start_ms: int | None,
    timeout_s: float,
) -> list[TopicPartition]:
    metadata = topic_metadata(consumer, topic, timeout_s)
    missing = sorted(set(partitions) - set(metadata.partitions))
    if missing:
        raise CliError(f"topic {topic!r} has no partition {missing[0]} (it has {len(metadata.partitions)})")
    chosen = sorted(partitions or metadata.partitions)
    if start_ms is None:
        return [TopicPartition(topic, p, start) for p in chosen]
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, p, start_ms) for p in chosen], timeout=timeout_s)
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], f"offsets by time of topic {topic!r}")) from None
    # No record at or after the time: start at the end, where the next one will be.
    return [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found]


def _print_records(
    consumer: Consumer,
    tracker: _EndTracker,
    render: Callable[[Message], bytes],
    count: int | None,
    exit_at_end: bool,
    commit: Callable[[Consumer, Sequence[Message]], None] | None = None,
) -> None:
    out = sys.stdout.buffer
    printed = 0
    while True:
        messages = consumer.consume(num_messages=_BATCH, timeout=_POLL_S)
        written = _write(out, messages, render, tracker.not_at_end, count - printed if count is not None else None)
        out.flush()
        printed += len(written)
        if commit is not None and written:
            commit(consumer, written)
        if count is not None and printed >= count:
            return
        if exit_at_end and tracker.at_end:
            return


def _write(
    out: IO[bytes],
    messages: Iterable[Message],
    render: Callable[[Message], bytes],
    not_at_end: set[int],
    limit: int | None,
) -> list[Message]:
    """Write records (at most `limit`); track which partitions reached their end. Returns the records written."""
    written: list[Message] = []
    for message in messages:
        error = message.error()
        if error is None:
            if limit is not None and len(written) >= limit:
                break
            out.write(render(message))
            written.append(message)
            not_at_end.add(message.partition())
        elif error.code() == KafkaError._PARTITION_EOF:
            not_at_end.discard(message.partition())
        elif error.fatal() or error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_ID):
            raise CliError(kafka_error_message(error, f"topic {message.topic()!r}"))
        else:
            # Transient (a broker restarting, a leader moving): librdkafka retries, as kcat we just tell.
            click.echo(f"% {kafka_error_message(error, f'topic {message.topic()!r}')}", err=True)
    return written
