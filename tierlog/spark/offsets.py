"""Which partitions and offset ranges a batch query reads, resolved once on the driver.

Topics, partitions and their leaders come from the brokers' metadata, the earliest/latest offsets from
ListOffsets (librdkafka's watermark query); ranges are then split as Spark's KafkaOffsetRangeCalculator
splits them for minPartitions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tierlog.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, TimestampSpec

# Bound on each metadata or offsets request the driver makes.
DRIVER_REQUEST_TIMEOUT_S = 30.0
NO_CLIENT_SETTINGS: Mapping[str, str] = MappingProxyType({})


class BrokerRefusalError(RuntimeError):
    """The brokers refused the job's security settings: its credentials, or the TLS handshake."""


# The errors librdkafka reports through error_cb (a metadata call only fails with a transport error).
_REFUSALS = {KafkaError._AUTHENTICATION: "the brokers refused the job's credentials", KafkaError._SSL: "TLS failed"}


class DataLossError(RuntimeError):
    """Offsets the query needs are no longer in the log (deleted by retention, or the log was truncated)."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # inclusive
    end: int  # exclusive
    leader: str  # host:port of the partition's leader when the query was planned

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    leader: str
    earliest: int
    latest: int
    # The first offsets at or after the query's starting/ending timestamps, when it gives them; -1 when no
    # record is that recent.
    starting_at_time: int | None = None
    ending_at_time: int | None = None


@contextmanager
def driver_consumer(bootstrap_servers: str, client_settings: Mapping[str, str]) -> Iterator[Consumer]:
    """A consumer for metadata and watermarks with the job's kafka.* settings (security among them), closed on
    leaving; it never commits or joins its group. A call that fails because the brokers refused the job's
    credentials or TLS settings raises BrokerRefusalError saying so, not librdkafka's transport error."""
    refusals: list[str] = []

    def on_error(error: KafkaError) -> None:
        if error.code() in _REFUSALS:
            refusals.append(f"{_REFUSALS[error.code()]}: {error.str()}")

    consumer = Consumer(
        {
            "group.id": "tierlog-spark-driver",
            **client_settings,
            "bootstrap.servers": bootstrap_servers,
            "enable.auto.commit": False,
            "error_cb": on_error,
        }
    )
    try:
        yield consumer
    except KafkaException:
        consumer.poll(0)  # serves error_cb
        if refusals:
            raise BrokerRefusalError(refusals[0]) from None
        raise
    finally:
        consumer.close()


def partition_states(options: SourceOptions) -> list[PartitionState]:
    """Every partition the query subscribes to, with its leader and its earliest and latest offsets."""
    with driver_consumer(options.bootstrap_servers, dict(options.client_settings)) as consumer:
        metadata = consumer.list_topics(timeout=DRIVER_REQUEST_TIMEOUT_S)
        brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
        if options.assign is not None:
            wanted = list(options.assign)
        else:
            if options.subscribe is not None:
                topics = [t for t in options.subscribe if t in metadata.topics]
            else:
                pattern = re.compile(options.subscribe_pattern or "")
                # Kafka's pattern subscription matches the whole topic name, and never internal topics.
                topics = [t for t in metadata.topics if pattern.fullmatch(t) and not t.startswith("__")]
            wanted = [(t, p) for t in sorted(topics) for p in sorted(metadata.topics[t].partitions)]
        states = []
        for topic, partition in wanted:
            topic_metadata = metadata.topics.get(topic)
            if topic_metadata is None or partition not in topic_metadata.partitions:
                raise ValueError(f"partition {topic}-{partition} does not exist")
            leader = brokers.get(topic_metadata.partitions[partition].leader)
            if leader is None:
                raise RuntimeError(f"partition {topic}-{partition} has no leader")
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=DRIVER_REQUEST_TIMEOUT_S, cached=False
            )
            states.append(PartitionState(topic, partition, leader, low, high))
        return [
            replace(
                state,
                starting_at_time=_offset_for_time(consumer, state, options.starting_timestamps, "startingTimestamp"),
                ending_at_time=_offset_for_time(consumer, state, options.ending_timestamps, "endingTimestamp"),
            )
            for state in states
        ]


def _offset_for_time(consumer: Consumer, state: PartitionState, spec: TimestampSpec | None, name: str) -> int | None:
    if spec is None:
        return None
    timestamp = _for_partition(spec, state, name, "a timestamp")
    # ListOffsets with a timestamp: the earliest offset whose timestamp is at or after it, -1 if none.
    (answer,) = consumer.offsets_for_times(
        [TopicPartition(state.topic, state.partition, timestamp)], timeout=DRIVER_REQUEST_TIMEOUT_S
    )
    if answer.error is not None:
        raise RuntimeError(f"looking up {name} {timestamp} in {state.topic}-{state.partition} failed: {answer.error}")
    return int(answer.offset)


def _for_partition(spec: OffsetSpec | TimestampSpec, state: PartitionState, name: str, what: str) -> int:
    """Option `name`'s value for `state`'s partition: the one value, or the partition's entry of a JSON option,
    which (as Kafka's source has it) must name every partition the query reads."""
    if not isinstance(spec, dict):
        return spec
    key = (state.topic, state.partition)
    if key not in spec:
        raise ValueError(f"option '{name}' does not specify {what} for {state.topic}-{state.partition}")
    return spec[key]


def _position(spec: OffsetSpec, state: PartitionState, default: int, name: str) -> int:
    value = _for_partition(spec, state, name, "an offset")
    if value == EARLIEST:
        return state.earliest
    if value == LATEST:
        return state.latest
    return value if value >= 0 else default


def starting_offset(options: SourceOptions, state: PartitionState) -> int:
    """Where the query starts in `state`'s partition, from its starting timestamp or offsets option."""
    if state.starting_at_time is None:
        return _position(options.starting, state, state.earliest, "startingOffsets")
    if state.starting_at_time >= 0:
        return state.starting_at_time
    if options.starting_timestamp_strategy == "latest":
        return state.latest
    raise ValueError(
        f"{state.topic}-{state.partition}: no record at or after the starting timestamp; set the option "
        "startingOffsetsByTimestampStrategy to latest to start at the end instead"
    )


def batch_ranges(options: SourceOptions, states: list[PartitionState]) -> list[OffsetRange]:
    """One [start, end) per partition (the reader cuts them into Spark partitions), checked against the log: a
    start before the log start (records deleted) or after the end fails the query when failOnDataLoss is true,
    else is clamped."""
    ranges = []
    for state in states:
        start = starting_offset(options, state)
        if state.ending_at_time is None:
            end = _position(options.ending, state, state.latest, "endingOffsets")
        else:
            # As Kafka's source: an ending timestamp after the last record reads to the end.
            end = state.ending_at_time if state.ending_at_time >= 0 else state.latest
        if start < state.earliest:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"{state.topic}-{state.partition}: offsets {start} to {state.earliest - 1} were deleted "
                    f"(the log now starts at {state.earliest}); some data may have been lost. Set the option "
                    "failOnDataLoss to false to read what remains."
                )
            start = state.earliest
        if end > state.latest:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"{state.topic}-{state.partition}: endingOffsets {end} is beyond the end of the log "
                    f"({state.latest}); the log may have been truncated. Set the option failOnDataLoss to false "
                    "to read what exists."
                )
            end = state.latest
        if start > end:
            raise ValueError(f"{state.topic}-{state.partition}: startingOffsets {start} is after endingOffsets {end}")
        ranges.append(OffsetRange(state.topic, state.partition, start, end, state.leader))
    return ranges


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """KafkaOffsetRangeCalculator: empty ranges are dropped; with fewer ranges than minPartitions, each is
    cut into parts in proportion to its share of all offsets (at least one part each)."""
    non_empty = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(non_empty) >= min_partitions:
        return non_empty
    total = sum(r.size for r in non_empty)
    out = []
    for r in non_empty:
        # Scala's math.round rounds halves up, Python's round() would round them to even.
        parts = max(math.floor(r.size / total * min_partitions + 0.5), 1)
        for i in range(parts):
            start = r.start + int(r.size * i / parts)
            end = r.end if i == parts - 1 else r.start + int(r.size * (i + 1) / parts)
            out.append(OffsetRange(r.topic, r.partition, start, end, r.leader))
    return out


def current_leader(
    bootstrap_servers: str, topic: str, partition: int, client_settings: Mapping[str, str] = NO_CLIENT_SETTINGS
) -> str | None:
    """host:port of the partition's leader now, or None when it has none (an election under way) or no broker
    answers."""
    try:
        with driver_consumer(bootstrap_servers, client_settings) as consumer:
            metadata = consumer.list_topics(topic, timeout=DRIVER_REQUEST_TIMEOUT_S / 3)
    except (KafkaException, BrokerRefusalError):
        return None
    partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
    broker = metadata.brokers.get(partitions[partition].leader) if partition in partitions else None
    return None if broker is None else f"{broker.host}:{broker.port}"
