"""TraceLog: numbered events, a bounded backlog, subscriptions that see a partition's backlog then its live
events without gaps or repeats, slow subscribers told what they lost instead of blocking the broker, and
the NDJSON route over a real HTTP connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import pytest
from asyncio_helpers import run_bounded

from tierlog.common import TopicPartition
from tierlog.replication.trace import TraceEvent
from tierlog.server.http_server import HttpServer
from tierlog.server.trace_log import NDJSON_CONTENT_TYPE, TraceLog, trace_stream_route

HOST = "127.0.0.1"
WAIT_S = 5.0


def event(topic: str, partition: int, new: int, *, attribute: str = "Leader LEO") -> TraceEvent:
    return TraceEvent(
        TopicPartition(topic, partition), 1, attribute, "PRODUCE", new - 1, new, f"append to {new}", 1000 + new
    )


async def take(events: AsyncGenerator[dict[str, Any], None], count: int) -> list[dict[str, Any]]:
    return [await asyncio.wait_for(anext(events), WAIT_S) for _ in range(count)]


def test_record_numbers_events_and_flattens_them_into_the_wire_shape() -> None:
    log = TraceLog(broker_id=1)
    log.record(event("orders", 0, 5))
    shrink = TraceEvent(TopicPartition("orders", 0), 1, "ISR", "ISR shrink", [1, 2, 3], [1, 2], "broker 3 lagged", 77)
    log.record(shrink)

    async def scenario() -> list[dict[str, Any]]:
        events = log.subscribe("orders", 0)
        try:
            return await take(events, 2)
        finally:
            await events.aclose()

    first, second = run_bounded(scenario)
    assert first == {
        "seq": 0,
        "time_ms": 1005,
        "broker_id": 1,
        "topic": "orders",
        "partition": 0,
        "attribute": "Leader LEO",
        "phase": "PRODUCE",
        "old": 4,
        "new": 5,
        "why": "append to 5",
    }
    assert list(first) == [
        "seq",
        "time_ms",
        "broker_id",
        "topic",
        "partition",
        "attribute",
        "phase",
        "old",
        "new",
        "why",
    ]
    assert (second["seq"], second["old"], second["new"], second["time_ms"]) == (1, [1, 2, 3], [1, 2], 77)


def test_a_subscription_sees_its_partitions_backlog_then_live_events_in_order() -> None:
    log = TraceLog(broker_id=1)
    for offset in range(1, 4):
        log.record(event("orders", 0, offset))
        log.record(event("orders", 1, offset))
        log.record(event("payments", 0, offset))

    async def scenario() -> list[dict[str, Any]]:
        events = log.subscribe("orders", 0)
        try:
            backlog = await take(events, 3)
            log.record(event("orders", 1, 4))
            log.record(event("orders", 0, 4))
            log.record(event("orders", 0, 5))
            return backlog + await take(events, 2)
        finally:
            await events.aclose()

    received = run_bounded(scenario)
    assert [(e["topic"], e["partition"], e["new"]) for e in received] == [("orders", 0, n) for n in range(1, 6)]
    seqs = [e["seq"] for e in received]
    assert seqs == sorted(seqs) and seqs[:3] == [0, 3, 6]


def test_events_recorded_while_the_backlog_is_read_are_neither_missed_nor_repeated() -> None:
    log = TraceLog(broker_id=1)
    log.record(event("t", 0, 1))
    log.record(event("t", 0, 2))

    async def scenario() -> list[int]:
        events = log.subscribe("t", 0)
        try:
            first = await take(events, 1)  # the subscription starts here
            log.record(event("t", 0, 3))
            return [e["new"] for e in first + await take(events, 2)]
        finally:
            await events.aclose()

    assert run_bounded(scenario) == [1, 2, 3]


def test_only_the_last_capacity_events_are_retained() -> None:
    log = TraceLog(broker_id=1, capacity=4)
    for offset in range(1, 7):
        log.record(event("t", 0, offset))
    log.record(event("other", 0, 1))

    async def scenario() -> list[int]:
        events = log.subscribe("t", 0)
        try:
            backlog = await take(events, 3)
            log.record(event("t", 0, 7))
            return [e["seq"] for e in backlog + await take(events, 1)]
        finally:
            await events.aclose()

    # Retained: seq 3, 4, 5 of t-0 and seq 6 of other-0; then seq 7 live.
    assert run_bounded(scenario) == [3, 4, 5, 7]


def test_a_slow_subscriber_gets_a_dropped_count_where_events_were_lost() -> None:
    log = TraceLog(broker_id=2, subscriber_queue=3)

    async def scenario() -> list[dict[str, Any]]:
        events = log.subscribe("t", 0)
        try:
            waiting = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0)  # the subscription is registered and waits
            # record() is synchronous: all ten arrive before the subscriber runs again, without blocking.
            for offset in range(1, 11):
                log.record(event("t", 0, offset))
            received = [await asyncio.wait_for(waiting, WAIT_S), *await take(events, 3)]
            log.record(event("t", 0, 11))
            return received + await take(events, 1)
        finally:
            await events.aclose()

    received = run_bounded(scenario)
    assert [e.get("new") for e in received] == [1, 2, 3, None, 11]
    assert received[3] == {"dropped": 7, "broker_id": 2}


def test_closing_a_subscription_unregisters_it() -> None:
    log = TraceLog(broker_id=1)
    log.record(event("t", 0, 1))

    async def scenario() -> None:
        events = log.subscribe("t", 0)
        await take(events, 1)
        assert log._subscribers
        await events.aclose()
        assert not log._subscribers
        log.record(event("t", 0, 2))  # nobody to hand it to; still retained

    run_bounded(scenario)


# --- the HTTP route -------------------------------------------------------------------------------------


async def serve(log: TraceLog, body: Callable[[int], Awaitable[Any]]) -> Any:
    server = HttpServer([trace_stream_route(log)])
    port = await server.start(HOST, 0)
    try:
        return await body(port)
    finally:
        await server.stop()


async def exchange(port: int, request: bytes) -> tuple[bytes, bytes]:
    """The head and the body of the answer to `request` (which asks for Connection: close)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(request)
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, b"missing query parameter: topic\n"),
        ({"topic": ""}, b"missing query parameter: topic\n"),
        ({"topic": "t"}, b"missing query parameter: partition\n"),
        ({"topic": "t", "partition": "x"}, b"partition must be a non-negative integer, got 'x'\n"),
        ({"topic": "t", "partition": "-1"}, b"partition must be a non-negative integer, got '-1'\n"),
        ({"topic": "t", "partition": "\u0663"}, b"partition must be a non-negative integer, got '\xd9\xa3'\n"),
    ],
)
def test_the_route_refuses_a_missing_or_invalid_partition_with_400(query: dict[str, str], message: bytes) -> None:
    log = TraceLog(broker_id=1)
    request = f"GET /v1/trace?{urlencode(query)} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
    head, body = run_bounded(lambda: serve(log, lambda port: exchange(port, request)))
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Content-Type: text/plain; charset=utf-8\r\n" in head
    assert body == message
    assert not log._subscribers


def test_head_of_the_route_is_405_and_subscribes_nothing() -> None:
    log = TraceLog(broker_id=1)
    request = b"HEAD /v1/trace?topic=t&partition=0 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    head, body = run_bounded(lambda: serve(log, lambda port: exchange(port, request)))
    assert head.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"Allow: GET\r\n" in head
    assert body == b""
    assert not log._subscribers


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
    return (await reader.readexactly(size + 2))[:-2]


async def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")
        await asyncio.sleep(0.01)


def test_get_v1_trace_streams_backlog_then_live_events_and_a_hangup_ends_the_subscription() -> None:
    log = TraceLog(broker_id=1)
    log.record(event("orders", 0, 1))
    log.record(event("orders", 1, 1))

    async def scenario() -> list[dict[str, Any]]:
        server = HttpServer([trace_stream_route(log)])
        port = await server.start(HOST, 0)
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(b"GET /v1/trace?topic=orders&partition=0 HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert f"Content-Type: {NDJSON_CONTENT_TYPE}\r\n".encode() in head
            lines = [await read_chunk(reader)]
            log.record(event("orders", 0, 2))
            lines.append(await read_chunk(reader))
            writer.close()
            await poll(lambda: not log._subscribers, "the subscription to end after the hangup")
            return [json.loads(line) for line in lines]
        finally:
            await server.stop()

    received = run_bounded(scenario)
    assert [(e["seq"], e["partition"], e["new"]) for e in received] == [(0, 0, 1), (2, 0, 2)]


def test_stopping_the_server_ends_a_trace_stream_cleanly() -> None:
    log = TraceLog(broker_id=1)

    async def scenario() -> bytes:
        server = HttpServer([trace_stream_route(log)])
        port = await server.start(HOST, 0)
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"GET /v1/trace?topic=t&partition=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await poll(lambda: bool(log._subscribers), "the subscription to start")
        await server.stop()
        assert not log._subscribers
        last = await read_chunk(reader)
        writer.close()
        return last

    assert run_bounded(scenario) == b""
