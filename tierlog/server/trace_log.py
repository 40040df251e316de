"""The broker's replication trace: the last events of every partition, and live streams of one partition.

Partitions hand `TraceEvent`s (replication/trace.py) to `TraceLog.record`, their injected sink, on the
broker's hot paths; recording must never block them. Each subscriber therefore has a bounded queue of its
own, and one that falls behind loses events: it is told how many with a `{"dropped": n, "broker_id": b}`
entry where they would have been, rather than the broker waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncGenerator
from http import HTTPStatus
from typing import Any

from aiohttp import web

from tierlog.common import TopicPartition
from tierlog.replication.trace import TraceEvent
from tierlog.server.http_server import stream_response, text_response

__all__ = ["NDJSON_CONTENT_TYPE", "TraceLog", "trace_stream_route"]

NDJSON_CONTENT_TYPE = "application/x-ndjson"
# Events one subscriber may have waiting: the backlog of a busy partition streams out in well under a
# second, so a subscriber this far behind is stalled, not slow.
DEFAULT_SUBSCRIBER_QUEUE = 10_000


class _Subscription:
    def __init__(self, broker_id: int, max_queued: int) -> None:
        self.broker_id = broker_id
        self.max_queued = max_queued
        # Events, and `{"dropped": n}` entries standing where events were lost.
        self.queue: deque[dict[str, Any]] = deque()
        self.ready = asyncio.Event()

    def offer(self, entry: dict[str, Any]) -> None:
        if len(self.queue) < self.max_queued:
            self.queue.append(entry)
        elif "dropped" in self.queue[-1]:
            self.queue[-1]["dropped"] += 1
        else:
            # One slot over the bound: the marker of the gap, which later losses only count into. The broker
            # id tells whose stream lost them when a viewer merges several brokers' streams.
            self.queue.append({"dropped": 1, "broker_id": self.broker_id})
        self.ready.set()


class TraceLog:
    """Keeps the last `capacity` events (all partitions) and streams one partition's events to subscribers."""

    def __init__(
        self, broker_id: int, capacity: int = 10_000, subscriber_queue: int = DEFAULT_SUBSCRIBER_QUEUE
    ) -> None:
        self.broker_id = broker_id
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._subscriber_queue = subscriber_queue
        self._next_seq = 0
        self._subscribers: dict[TopicPartition, set[_Subscription]] = {}

    def record(self, event: TraceEvent) -> None:
        """Number and keep `event`, and hand it to the partition's subscribers; never blocks."""
        topic_partition = event.topic_partition
        entry: dict[str, Any] = {
            "seq": self._next_seq,
            "time_ms": event.time_ms,
            "broker_id": event.broker_id,
            "topic": topic_partition.topic,
            "partition": topic_partition.partition,
            "attribute": event.attribute,
            "phase": event.phase,
            "old": event.old,
            "new": event.new,
            "why": event.why,
        }
        self._next_seq += 1
        self._events.append(entry)
        for subscription in self._subscribers.get(topic_partition, ()):
            subscription.offer(entry)

    async def subscribe(self, topic: str, partition: int) -> AsyncGenerator[dict[str, Any], None]:
        """The retained events of topic-partition, then its live events, until closed (`aclose`).

        The subscription starts with the first `anext`: the backlog is what is retained then, and every
        later event is live, none missed or repeated. The dicts are shared: do not modify them.
        """
        topic_partition = TopicPartition(topic, partition)
        subscription = _Subscription(self.broker_id, self._subscriber_queue)
        backlog = [entry for entry in self._events if entry["topic"] == topic and entry["partition"] == partition]
        self._subscribers.setdefault(topic_partition, set()).add(subscription)
        try:
            for entry in backlog:
                yield entry
            while True:
                while subscription.queue:
                    yield subscription.queue.popleft()
                subscription.ready.clear()
                await subscription.ready.wait()
        finally:
            subscribers = self._subscribers[topic_partition]
            subscribers.discard(subscription)
            if not subscribers:
                del self._subscribers[topic_partition]


def trace_stream_route(trace_log: TraceLog) -> web.RouteDef:
    """`GET /v1/trace?topic=T&partition=P`: the partition's events as NDJSON, backlog first, then live."""

    async def handle(request: web.Request) -> web.StreamResponse:
        topic = request.query.get("topic")
        partition = request.query.get("partition")
        if not topic:
            return text_response(HTTPStatus.BAD_REQUEST, "missing query parameter: topic")
        if partition is None:
            return text_response(HTTPStatus.BAD_REQUEST, "missing query parameter: partition")
        if not (partition.isascii() and partition.isdigit()):
            return text_response(HTTPStatus.BAD_REQUEST, f"partition must be a non-negative integer, got {partition!r}")
        return await stream_response(request, NDJSON_CONTENT_TYPE, _ndjson(trace_log.subscribe(topic, int(partition))))

    # A stream has no head to show short of opening it, so HEAD is refused (405) rather than left waiting.
    return web.get("/v1/trace", handle, allow_head=False)


async def _ndjson(events: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[bytes, None]:
    # Closing the stream must end the subscription now, not whenever the generator is collected.
    async with contextlib.aclosing(events):
        async for event in events:
            yield json.dumps(event, separators=(",", ":")).encode() + b"\n"
