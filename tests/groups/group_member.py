"""One consumer-group member in a process of its own, so a test can close it, add it or kill -9 it.

    python tests/groups/group_member.py --client confluent-kafka --assignor range \
        --bootstrap 127.0.0.1:9092 --topic orders --group billing

It subscribes TOPIC in GROUP with the given client library and assignor and writes JSON lines to stdout:

    {"ev": "assigned", "partitions": [0, 3]}              its whole assignment, each time it changes
    {"ev": "rec", "p": 0, "o": 41, "v": "17"}             a record, written (and flushed) before its commit
    {"ev": "commit", "offsets": {"0": 42}}                a synchronous commit the coordinator accepted
    {"ev": "commit_failed", "error": "..."}               a commit refused (a rebalance took the partition)
    {"ev": "closed"}                                      after SIGTERM: consumer closed (and group left,
                                                          unless it is a static member: --instance-id)

Records are processed (printed) and then committed synchronously, so everything before a committed offset
was printed: at-least-once, the contract the tests check. SIGTERM is a clean shutdown (close(): the member
leaves the group at once); SIGKILL is a crash the coordinator only notices when the session times out.
Auto-commit is off, so the commits in the output are the only ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from typing import Any

HEARTBEAT_INTERVAL_MS = 1000
# The rebalance timeout (Java and librdkafka take max.poll.interval.ms): how long a rebalance waits for a
# member that stopped polling. Bounded well below the default 5 minutes so a test cannot hang on one.
MAX_POLL_INTERVAL_MS = 30000
POLL_S = 0.2
METADATA_WAIT_S = 30.0


class Output:
    def __init__(self) -> None:
        self.assignment: list[int] | None = None

    @staticmethod
    def emit(**event: Any) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def assigned(self, partitions: set[int]) -> None:
        current = sorted(partitions)
        if current != self.assignment:
            self.assignment = current
            self.emit(ev="assigned", partitions=current)

    def records(self, records: list[tuple[int, int, bytes | None]]) -> dict[int, int]:
        """Print records; the offsets to commit (the next offset per partition)."""
        positions: dict[int, int] = {}
        for partition, offset, value in records:
            self.emit(ev="rec", p=partition, o=offset, v=None if value is None else value.decode())
            positions[partition] = offset + 1
        return positions


class Stop:
    """Set by SIGTERM; the poll loop ends at its next turn."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True


def run_confluent(args: argparse.Namespace, out: Output) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    stop = Stop()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": args.name,
            "partition.assignment.strategy": args.assignor,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            **({"group.instance.id": args.instance_id} if args.instance_id else {}),
        }
    )
    consumer.subscribe([args.topic])
    try:
        while not stop.requested:
            messages = consumer.consume(num_messages=500, timeout=POLL_S)
            out.assigned({tp.partition for tp in consumer.assignment()})
            batch = []
            for m in messages:
                if m.error() is not None:
                    out.emit(ev="error", error=m.error().str())
                    continue
                batch.append((m.partition(), m.offset(), m.value()))
            positions = out.records(batch)
            if positions:
                offsets = [TopicPartition(args.topic, p, o) for p, o in positions.items()]
                try:
                    consumer.commit(offsets=offsets, asynchronous=False)
                    out.emit(ev="commit", offsets=positions)
                except KafkaException as e:
                    out.emit(ev="commit_failed", error=str(e))
    finally:
        consumer.close()
    out.emit(ev="closed")


def run_kafka_python(args: argparse.Namespace, out: Output) -> None:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    assignors = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }
    stop = Stop()
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        partition_assignment_strategy=[assignors[args.assignor]],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        group_instance_id=args.instance_id,
    )
    # kafka-python 3.0.12 orphans a join when a rejoin was asked for by a metadata change (its leader first
    # assigned without the topic's partitions) and poll()'s timeout ends while the JoinGroup/SyncGroup round
    # is in flight: by the next poll its assignment snapshot matches the metadata, need_rejoin() is False,
    # and the finished join is never applied (no assignment, heartbeats off, until its session expires).
    # Knowing the topic's partitions before the first join avoids that rejoin.
    deadline = time.monotonic() + METADATA_WAIT_S
    while not consumer.partitions_for_topic(args.topic):
        if time.monotonic() > deadline:
            raise SystemExit(f"no metadata for topic {args.topic} within {METADATA_WAIT_S}s")
        time.sleep(0.1)
    consumer.subscribe([args.topic])
    try:
        while not stop.requested:
            polled = consumer.poll(timeout_ms=int(POLL_S * 1000))
            out.assigned({tp.partition for tp in consumer.assignment()})
            batch = [(r.partition, r.offset, r.value) for records in polled.values() for r in records]
            positions = out.records(batch)
            if positions:
                offsets = {TopicPartition(args.topic, p): OffsetAndMetadata(o, "", -1) for p, o in positions.items()}
                try:
                    consumer.commit(offsets)
                    out.emit(ev="commit", offsets=positions)
                except KafkaError as e:
                    out.emit(ev="commit_failed", error=repr(e))
    finally:
        consumer.close(autocommit=False)
    out.emit(ev="closed")


async def run_aiokafka(args: argparse.Namespace, out: Output) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.errors import KafkaError

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        partition_assignment_strategy=(assignors[args.assignor],),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        rebalance_timeout_ms=MAX_POLL_INTERVAL_MS,
        group_instance_id=args.instance_id,
    )
    await consumer.start()
    try:
        while not stopping.is_set():
            polled = await consumer.getmany(timeout_ms=int(POLL_S * 1000))
            out.assigned({tp.partition for tp in consumer.assignment()})
            batch = [(r.partition, r.offset, r.value) for records in polled.values() for r in records]
            positions = out.records(batch)
            if positions:
                try:
                    await consumer.commit({TopicPartition(args.topic, p): o for p, o in positions.items()})
                    out.emit(ev="commit", offsets=positions)
                except KafkaError as e:
                    out.emit(ev="commit_failed", error=repr(e))
    finally:
        await consumer.stop()
    out.emit(ev="closed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True, choices=["confluent-kafka", "kafka-python", "aiokafka"])
    parser.add_argument("--assignor", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", default="group-member")
    parser.add_argument("--instance-id", help="group.instance.id: a static member (KIP-345)")
    # The broker's group.min.session.timeout.ms is 6000.
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    args = parser.parse_args()
    # The clients' own account of rebalances goes to stderr, which the test prints when it fails.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    out = Output()
    if args.client == "confluent-kafka":
        run_confluent(args, out)
    elif args.client == "kafka-python":
        run_kafka_python(args, out)
    else:
        asyncio.run(run_aiokafka(args, out))


if __name__ == "__main__":
    main()
