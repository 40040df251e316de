"""`tierlog consume TOPIC`: print records, as `kcat -C` and `rpk topic consume`.

Like both of them it follows the topic until interrupted; `--exit/-e` stops at the end of the partitions
and `--count/-n` after that many records. By default partitions are assigned directly (no group membership,
no offset commits), so consuming never changes anything on the broker. With `--group/-g` it consumes as a
member of that consumer group, as `kcat -G` and `kafka-console-consumer --group` do: the group's
coordinator assigns the partitions, consumption starts at the group's committed offsets, and every printed
record is committed before the next are read, so an interrupted run resumes where it stopped.

Keys, values and header values are bytes. `--encoding text` (the default) writes them as they are in a
kcat-style format, and in `-f json` as a JSON string when they are UTF-8 and as `{"base64": "..."}` when they
are not, so no two different byte strings print alike; `--encoding base64` writes every one of them base64
(in a format and in JSON), which suits topics of binary records. kcat's own -J envelope has no such choice
and mangles bytes that are not UTF-8 (edenhill/kcat#111).
"""

from __future__ import annotations

import base64
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
    ClientOptions,
    CliError,
    client_options,
    connect,
    flag_settings,
    kafka_error_message,
    topic_metadata,
    unescape,
)

# librdkafka's RD_KAFKA_OFFSET_TAIL(n): start n records before the end of the partition.
_OFFSET_TAIL_BASE = -2000
_BATCH = 500
_POLL_S = 0.2
# -e needs librdkafka to say when a partition's end is reached.
_REQUIRED = {"enable.partition.eof": True}
ENCODINGS = ("text", "base64")

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


def _json_bytes(data: bytes | None, encoding: str) -> str | dict[str, str] | None:
    """Bytes as a JSON value: null when absent; with `text`, the string they are in UTF-8 or, when they are
    not UTF-8, {"base64": ...}; with `base64`, always the base64 string."""
    if data is None:
        return None
    if encoding == "text":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode("ascii")}
    return base64.b64encode(data).decode("ascii")


def _timestamp(message: Message) -> int:
    kind, value = message.timestamp()
    return -1 if kind == TIMESTAMP_NOT_AVAILABLE else value


def _json_renderer(encoding: str) -> Callable[[Message], bytes]:
    def render(message: Message) -> bytes:
        record = {
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "timestamp": _timestamp(message),
            "key": _json_bytes(message.key(), encoding),
            "value": _json_bytes(message.value(), encoding),
            "headers": [{"key": k, "value": _json_bytes(v, encoding)} for k, v in message.headers() or []],
        }
        return json.dumps(record, ensure_ascii=False).encode() + b"\n"

    return render


def _format_fields(encoding: str) -> dict[str, Callable[[Message], bytes]]:
    encode: Callable[[bytes], bytes] = base64.b64encode if encoding == "base64" else bytes
    return {
        "t": lambda m: (m.topic() or "").encode(),
        "p": lambda m: str(m.partition()).encode(),
        "o": lambda m: str(m.offset()).encode(),
        "k": lambda m: encode(m.key() or b""),
        "v": lambda m: encode(m.value() or b""),
        "T": lambda m: str(_timestamp(m)).encode(),
        "h": lambda m: b",".join(k.encode() + b"=" + encode(v or b"") for k, v in m.headers() or []),
        "K": lambda m: str(len(m.key()) if m.key() is not None else -1).encode(),
        "S": lambda m: str(len(m.value()) if m.value() is not None else -1).encode(),
        "%": lambda m: b"%",
    }


def compile_format(fmt: str, encoding: str) -> Callable[[Message], bytes]:
    """A renderer for `json` or a kcat-style format string, writing bytes per `encoding` (see the module's
    docstring); unknown %-tokens are a usage error."""
    if fmt == "json":
        return _json_renderer(encoding)
    fields = _format_fields(encoding)
    parts: list[bytes | Callable[[Message], bytes]] = []
    for literal, token in re.findall(r"([^%]*)(%.?)?", unescape(fmt)):
        if literal:
            parts.append(literal.encode())
        if token:
            if token[1:] not in fields:
                raise click.BadParameter(f"unknown token {token!r}", param_hint="--format")
            parts.append(fields[token[1:]])
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
    "--encoding",
    type=click.Choice(ENCODINGS),
    default="text",
    show_default=True,
    help='Keys, values and header values: text (as they are; in json a UTF-8 string, or {"base64": ...} '
    "for other bytes) or base64 (always base64).",
)
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
    encoding: str,
    group: str | None,
    client: ClientOptions,
) -> None:
    """Print the records of a topic.

    Starts at the beginning and follows TOPIC until Ctrl-C, as kcat -C and rpk do; -e stops at the end of
    the partitions, -n after COUNT records. With -g GROUP the group's coordinator assigns the partitions
    and the group's committed offsets say where to start (--offset beginning|end only applies to
    partitions the group has no offset for).

    -o N past the end of a partition is said in one line on stderr; then, as with kcat, librdkafka's
    auto.offset.reset moves it (to the end unless -X says otherwise) and the exit code stays 0.
    --timeout bounds connecting and the requests before the first record; then records are read as they
    come."""
    if offset is not None and from_timestamp is not None:
        raise click.UsageError("give either --offset or --from-timestamp, not both")
    render = compile_format(fmt, encoding)
    start = parse_start_offset(offset or "beginning")
    start_ms = parse_timestamp_ms(from_timestamp) if from_timestamp is not None else None
    if group is not None:
        _check_group_options(group, start, from_timestamp, partitions)
        _consume_in_group(topic, group, start, render, count, exit_at_end, client)
        return
    defaults = {
        # Required by librdkafka, harmless here: nothing joins the group or commits to it.
        "group.id": "tierlog-cli",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    }
    consumer = connect(Consumer, client, client.config(defaults, required=_REQUIRED))
    try:
        assignment = _assignment(consumer, topic, partitions, start, start_ms, client)
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
    client: ClientOptions,
) -> None:
    defaults, given = flag_settings(
        {
            "group.id": ("group", group),
            "auto.offset.reset": ("offset", "earliest" if start == OFFSET_BEGINNING else "latest"),
        }
    )
    # Commits are ours, after printing: auto-commit could commit records not yet written out.
    defaults["enable.auto.commit"] = False
    consumer = connect(Consumer, client, client.config(defaults, given, required=_REQUIRED))
    tracker = _EndTracker(None)
    try:
        topic_metadata(consumer, topic, client.remaining_s())
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
    client: ClientOptions,
) -> list[TopicPartition]:
    metadata = topic_metadata(consumer, topic, client.remaining_s())
    missing = sorted(set(partitions) - set(metadata.partitions))
    if missing:
        raise CliError(f"topic {topic!r} has no partition {missing[0]} (it has {len(metadata.partitions)})")
    chosen = sorted(partitions or metadata.partitions)
    if start_ms is None:
        if start >= 0:
            for partition in chosen:
                _tell_if_past_the_end(consumer, TopicPartition(topic, partition), start, client)
        return [TopicPartition(topic, p, start) for p in chosen]
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, start_ms) for p in chosen], timeout=client.remaining_s()
        )
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], f"offsets by time of topic {topic!r}")) from None
    # No record at or after the time: start at the end, where the next one will be.
    return [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found]


def _tell_if_past_the_end(consumer: Consumer, partition: TopicPartition, offset: int, client: ClientOptions) -> None:
    """Say so when an absolute start offset is past the partition's end: the fetch will be out of range and
    librdkafka resets the position without a word to the application (kcat shows its log line)."""
    try:
        _, end = consumer.get_watermark_offsets(partition, timeout=client.remaining_s())
    except KafkaException as e:
        raise CliError(kafka_error_message(e.args[0], f"{partition.topic}-{partition.partition}")) from None
    if offset > end:
        click.echo(
            f"% offset {offset} is past the end of {partition.topic}-{partition.partition} (end offset {end}); "
            "auto.offset.reset moves it (to the end, unless -X says otherwise)",
            err=True,
        )


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
