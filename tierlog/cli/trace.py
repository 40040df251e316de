"""`tierlog trace TOPIC PARTITION`: watch a partition's replication state change, broker by broker.

Every broker streams the trace events of its replica (GET /v1/trace: the retained backlog, then live
events as NDJSON). This command reads all streams at once and prints one row per change
(docs/replication.md#trace): attribute, phase, old value, new value, why; with the time and the broker in front,
since the rows of all replicas are merged into one timeline ordered by (time, broker, seq).
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click
from rich.console import Console
from rich.text import Text

from tierlog.cli.clients import DEFAULT_TIMEOUT_S, CliError, output_console, timeout_option
from tierlog.cli.cluster import (
    HttpError,
    dir_option,
    gather_reports,
    http_get,
    read_cluster_info,
    split_address,
)

# An event waits this long after it arrived before it is printed, so that an earlier event of another
# broker that arrives a little later (its stream is read by another task) still goes before it.
HOLD_MS = 200
# --no-follow: the backlogs are in once no stream has sent anything for this long.
IDLE_S = 0.5
_TICK_S = 0.05
_RECONNECT_S = 1.0
# Bounds on what one stream may buffer: a trace event is a line of a few hundred bytes.
_MAX_LINE_BYTES = 1 << 20
_QUEUE_EVENTS = 10_000

Value = int | list[int] | None

COLUMNS = ("time", "broker", "attribute", "phase", "old", "new", "why")
# Widths fit the longest usual value ("Remote LEO (broker 10)", an ISR of five); a longer value still keeps
# two spaces before the next column, so a row always splits on runs of two spaces.
_WIDTHS = (12, 6, 22, 20, 12, 12)
_GAP = "  "


@dataclass(frozen=True)
class TraceEvent:
    """One change of one replica's state, as a broker's /v1/trace sends it."""

    seq: int
    time_ms: int
    broker_id: int
    topic: str
    partition: int
    attribute: str
    phase: str
    old: Value
    new: Value
    why: str

    @property
    def order(self) -> tuple[int, int, int]:
        return self.time_ms, self.broker_id, self.seq


def _value(raw: Any, name: str) -> Value:
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    if isinstance(raw, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        return list(raw)
    raise ValueError(f"{name} is neither an int nor a list of ints: {raw!r}")


def parse_event(line: bytes | str) -> TraceEvent:
    """One NDJSON line of /v1/trace; ValueError if it is not a trace event."""
    try:
        raw = json.loads(line)
        return TraceEvent(
            seq=int(raw["seq"]),
            time_ms=int(raw["time_ms"]),
            broker_id=int(raw["broker_id"]),
            topic=str(raw["topic"]),
            partition=int(raw["partition"]),
            attribute=str(raw["attribute"]),
            phase=str(raw["phase"]),
            old=_value(raw["old"], "old"),
            new=_value(raw["new"], "new"),
            why=str(raw.get("why") or ""),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a trace event ({e!r})") from None


class EventMerger:
    """Merges the event streams of several brokers into one timeline ordered by (time_ms, broker_id, seq).

    An event is released `hold_ms` after it arrived (`now_ms` is any clock, as long as it is the same for
    `push` and `pop_ready`), and only once everything before it is released. An event a broker already sent
    is dropped: a stream that reconnects sends its backlog again. Per broker, events come in (time_ms, seq)
    order; a restarted broker starts seq again but at a later time."""

    def __init__(self, hold_ms: int = HOLD_MS) -> None:
        self.hold_ms = hold_ms
        self._heap: list[tuple[tuple[int, int, int], int, TraceEvent]] = []
        self._last_seen: dict[int, tuple[int, int]] = {}

    def push(self, event: TraceEvent, now_ms: int) -> bool:
        """Queue `event`; False if it was seen already."""
        position = (event.time_ms, event.seq)
        last = self._last_seen.get(event.broker_id)
        if last is not None and position <= last:
            return False
        self._last_seen[event.broker_id] = position
        heapq.heappush(self._heap, (event.order, now_ms, event))
        return True

    def pop_ready(self, now_ms: int) -> list[TraceEvent]:
        ready = []
        while self._heap and self._heap[0][1] <= now_ms - self.hold_ms:
            ready.append(heapq.heappop(self._heap)[2])
        return ready

    def drain(self) -> list[TraceEvent]:
        ready = [entry[2] for entry in sorted(self._heap)]
        self._heap.clear()
        return ready


def format_value(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def format_time(time_ms: int, tz: tzinfo | None = None) -> str:
    """HH:MM:SS.mmm in `tz` (default: local time, as in the broker logs)."""
    return datetime.fromtimestamp(time_ms / 1000, tz).strftime("%H:%M:%S.%f")[:-3]


def header_row() -> Text:
    return _row(list(COLUMNS), [""] * len(COLUMNS), "bold")


def event_row(event: TraceEvent, tz: tzinfo | None = None) -> Text:
    """One row: time, broker, attribute, phase, old, new, why. The new value is bold when it differs from the
    old one; `.plain` is the row as text."""
    cells = [
        format_time(event.time_ms, tz),
        str(event.broker_id),
        event.attribute,
        event.phase,
        format_value(event.old),
        format_value(event.new),
        event.why,
    ]
    changed = "bold" if event.old != event.new else ""
    return _row(cells, ["dim", "cyan", "", "", "", changed, "dim"], "")


def _row(cells: Sequence[str], styles: Sequence[str], base_style: str) -> Text:
    text = Text(style=base_style)
    for cell, style, width in zip(cells, styles, _WIDTHS, strict=False):
        text.append(cell.ljust(width), style=style)
        text.append(_GAP)
    text.append(cells[-1], style=styles[-1])
    return text


# --- reading the streams -----------------------------------------------------------------------------------


def trace_path(topic: str, partition: int) -> str:
    return "/v1/trace?" + urlencode({"topic": topic, "partition": partition})


@dataclass
class Stream:
    """One broker's /v1/trace: `settled` once it answered (or failed to), `done` once it will send no more."""

    address: str
    settled: bool = False
    done: bool = False
    connected_once: bool = False
    failing: bool = False
    bad_line_seen: bool = False
    errors: list[str] = field(default_factory=list)


async def read_stream(
    stream: Stream,
    path: str,
    timeout_s: float,
    follow: bool,
    queue: asyncio.Queue[TraceEvent],
    notice: Callable[[str], None],
) -> None:
    """Put the events of one broker's trace stream on `queue`. Following, a stream that ends or fails is
    opened again every second (a restarted broker's events keep coming); otherwise the first end is final."""
    try:
        while True:
            error = None
            try:
                async with http_get(stream.address, path, timeout_s) as body:
                    if stream.failing:
                        notice(f"{stream.address}: trace stream open again")
                    stream.settled = stream.connected_once = True
                    stream.failing = False
                    await _read_events(body, stream, queue, notice)
            except HttpError as e:
                error = str(e)
            except (OSError, asyncio.IncompleteReadError) as e:
                error = f"{stream.address} broke off its trace stream ({e.__class__.__name__})"
            stream.settled = True
            if not follow:
                if error is not None:
                    stream.errors.append(error)
                    notice(error)
                return
            if not stream.failing:
                stream.failing = True
                stream.errors.append(error or f"{stream.address} ended its trace stream")
                notice(f"{stream.errors[-1]}; reconnecting every {_RECONNECT_S:g}s")
            await asyncio.sleep(_RECONNECT_S)
    finally:
        stream.settled = stream.done = True


def _dropped_count(line: bytes) -> int | None:
    """n for the `{"dropped": n, "broker_id": b}` line a broker sends where a slow reader lost events."""
    if b'"dropped"' not in line:
        return None
    try:
        raw = json.loads(line)
        return int(raw["dropped"]) if isinstance(raw, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


async def _read_events(
    body: AsyncIterator[bytes], stream: Stream, queue: asyncio.Queue[TraceEvent], notice: Callable[[str], None]
) -> None:
    buffer = b""
    async for chunk in body:
        *lines, buffer = (buffer + chunk).split(b"\n")
        if len(buffer) > _MAX_LINE_BYTES:
            raise HttpError(f"{stream.address} sent a line longer than {_MAX_LINE_BYTES} bytes")
        for line in lines:
            if not line.strip():
                continue
            dropped = _dropped_count(line)
            if dropped is not None:
                notice(f"{stream.address} dropped {dropped} trace events: this reader fell behind its stream")
                continue
            try:
                await queue.put(parse_event(line))
            except ValueError as e:
                # Said once: a broker that sends one bad line likely sends more of them.
                if not stream.bad_line_seen:
                    stream.bad_line_seen = True
                    notice(f"{stream.address} sent a line that is not a trace event, skipped: {e}")


async def run_trace(
    addresses: Sequence[str],
    topic: str,
    partition: int,
    *,
    follow: bool,
    timeout_s: float,
    emit: Callable[[TraceEvent], None],
    notice: Callable[[str], None],
) -> list[Stream]:
    """Read every address's trace stream concurrently and `emit` the merged events in order. Without
    `follow`, return once every stream answered and none sent anything for IDLE_S; with it, run until
    cancelled (Ctrl-C)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[TraceEvent] = asyncio.Queue(_QUEUE_EVENTS)
    merger = EventMerger()
    path = trace_path(topic, partition)
    streams = [Stream(address) for address in addresses]
    tasks = [asyncio.create_task(read_stream(s, path, timeout_s, follow, queue, notice)) for s in streams]
    last_activity = loop.time()
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), _TICK_S)
                merger.push(event, int(loop.time() * 1000))
                last_activity = loop.time()
            except TimeoutError:
                pass
            for ready in merger.pop_ready(int(loop.time() * 1000)):
                emit(ready)
            if not all(s.settled for s in streams):
                last_activity = loop.time()
            elif queue.empty() and (
                all(s.done for s in streams) or (not follow and loop.time() - last_activity >= IDLE_S)
            ):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for ready in merger.drain():
        emit(ready)
    return streams


async def _require_replica(addresses: Sequence[str], topic: str, partition: int, timeout_s: float) -> None:
    """Fail in one line when every broker lists its replicas (GET /v1/partitions) and none has one of
    topic-partition: its trace would stay empty for ever. Should a broker not answer, it may hold one, so
    the trace goes on (and says what that broker did)."""
    reports = await gather_reports(dict(enumerate(addresses)), timeout_s)
    if not all(report.up for report in reports):
        return
    hosted = {(p.get("topic"), p.get("partition")) for report in reports for p in report.partitions or []}
    if (topic, partition) in hosted:
        return
    partitions = {p for t, p in hosted if t == topic}
    if partitions:
        raise CliError(f"topic {topic!r} has no partition {partition} (it has {len(partitions)})")
    raise CliError(
        f"topic {topic!r} does not exist: no broker has a replica of it (`tierlog topic list` shows the topics)"
    )


@click.command()
@click.argument("topic")
@click.argument("partition", type=click.IntRange(min=0))
@dir_option("Directory of a `tierlog cluster up` cluster: trace all its brokers.")
@click.option(
    "--http",
    "http_addresses",
    multiple=True,
    metavar="HOST:PORT",
    help="A broker's tierlog.http.listener (repeatable); instead of --dir.",
)
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Keep printing live events until Ctrl-C, or stop once the backlogs are printed.",
)
@timeout_option(DEFAULT_TIMEOUT_S, "Seconds to wait for a broker to answer.")
def trace(
    topic: str, partition: int, directory: Path, http_addresses: tuple[str, ...], follow: bool, timeout_s: float
) -> None:
    """Print every change of LEO, HW, remote LEO, ISR and leader epoch of one partition, on every broker."""
    if http_addresses:
        for address in http_addresses:
            try:
                split_address(address)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--http") from None
        addresses = list(http_addresses)
    else:
        # Dedicated controllers have no partitions and no HTTP listener.
        addresses = [node.http for node in read_cluster_info(directory).nodes if node.is_broker]

    asyncio.run(_require_replica(addresses, topic, partition, timeout_s))
    console = output_console()
    errors = Console(stderr=True)
    printed = 0

    def emit(event: TraceEvent) -> None:
        nonlocal printed
        if printed == 0:
            console.print(header_row())
        console.print(event_row(event))
        printed += 1

    def notice(message: str) -> None:
        errors.print(Text(message, style="dim"))

    try:
        streams = asyncio.run(
            run_trace(addresses, topic, partition, follow=follow, timeout_s=timeout_s, emit=emit, notice=notice)
        )
    except KeyboardInterrupt:
        return  # Ctrl-C is how a followed trace ends, as with `consume`.
    if not any(s.connected_once for s in streams):
        raise CliError(f"no broker answered GET /v1/trace ({'; '.join(e for s in streams for e in s.errors)})")
    if printed == 0:
        errors.print(f"no trace events for {topic}-{partition} yet (does the partition exist?)")
