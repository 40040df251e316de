"""What the transaction tests share: the broker settings for transactions, a confluent-kafka transactional
producer, reading a topic whole as read_committed or read_uncommitted, the latest offsets per isolation level
(ListOffsets: the high watermark, or the last stable offset for read_committed) and the coordinator of a
transactional id."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence

from cluster_helpers import send_request
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as find_coordinator_v3

from tierlog.testing.local_cluster import wait_until

TIMEOUT_S = 30.0
TRANSACTION_STATE_TOPIC = "__transaction_state"
STATE_PARTITIONS = 5
# One broker: __transaction_state and __consumer_offsets with one replica, a few partitions each, and expired
# transactions looked for every 0.5 s so a timeout test waits seconds, not Kafka's 10 s interval.
BROKER_OVERRIDES = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": str(STATE_PARTITIONS),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "group.initial.rebalance.delay.ms": "0",
}
# (partition, offset, value) as a consumer read it
Read = tuple[int, int, bytes]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def transactional_producer(bootstrap: str, transactional_id: str, **config: object) -> Producer:
    """A confluent-kafka producer of `transactional_id` whose init_transactions has completed."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            **{key.replace("_", "."): value for key, value in config.items()},
        }
    )
    producer.init_transactions(TIMEOUT_S)
    return producer


def commit_retrying(producer: Producer, timeout_s: float = 60.0) -> None:
    """commit_transaction, called again while it fails with a retriable error (a coordinator moving)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.commit_transaction(10.0)
            return
        except KafkaException as exception:
            if not exception.args[0].retriable() or time.monotonic() > deadline:
                raise


def read_whole(bootstrap: str, topic: str, partitions: Iterable[int], isolation: str) -> list[Read]:
    """Every record of `partitions` from the start to the end of each (its end-of-partition: the last stable
    offset for read_committed), sorted by (partition, offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        wanted = set(partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted])
        records: list[Read] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while at_end != wanted:
            assert time.monotonic() < deadline, f"{isolation} read of {topic} ended only {sorted(at_end)}"
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                at_end.add(message.partition() or 0)
                continue
            records.append((message.partition() or 0, message.offset() or 0, message.value() or b""))
        return sorted(records)
    finally:
        consumer.close()


def values(records: Sequence[Read]) -> list[bytes]:
    return [value for _, _, value in records]


def latest_offsets(bootstrap: str, topic: str, partitions: Iterable[int], isolation: IsolationLevel) -> dict[int, int]:
    """ListOffsets LATEST of each partition: the high watermark, or the last stable offset for read_committed."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
        isolation_level=isolation,
        request_timeout=TIMEOUT_S,
    )
    return {tp.partition: future.result(TIMEOUT_S).offset for tp, future in futures.items()}


def group_offsets(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """The group's committed offsets, stable (KIP-447's require_stable: asked again while a partition answers
    UNSTABLE_OFFSET_COMMIT, a transaction's markers being on their way); a partition without one is left out."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        result = admin.list_consumer_group_offsets([request], require_stable=True)[group].result(TIMEOUT_S)
        unstable = [tp for tp in result.topic_partitions if tp.error is not None]
        if not unstable:
            return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}
        assert time.monotonic() < deadline, f"offsets still unstable after {TIMEOUT_S}s: {unstable}"
        time.sleep(0.1)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit overflow)."""
    h = 0
    encoded = text.encode("utf-16-be")
    for i in range(0, len(encoded), 2):
        h = (31 * h + int.from_bytes(encoded[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def state_partition(transactional_id: str, partitions: int = STATE_PARTITIONS) -> int:
    """The __transaction_state partition of a transactional id (Kafka's Utils.abs(hashCode) % partitions)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def find_coordinator(address: str, key: str, key_type: int) -> int:
    """The node FindCoordinator (v3, asked of the broker at `address`) names for a group (key type 0) or a
    transactional id (1)."""
    found = send_request(address, find_coordinator_v3.FindCoordinatorRequest(key=key, key_type=key_type))
    assert found.error_code == ErrorCode.none, found
    node_id: int = found.node_id
    return node_id


def state_leaders(bootstrap: str) -> dict[int, int]:
    """__transaction_state partition -> its leader (-1: none), from Metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = admin.list_topics(TRANSACTION_STATE_TOPIC, timeout=TIMEOUT_S).topics.get(TRANSACTION_STATE_TOPIC)
    if topic is None or topic.error is not None:
        return {}
    return {p: meta.leader for p, meta in topic.partitions.items()}


def warm_up_transaction_state(bootstrap: str, partitions: int = STATE_PARTITIONS) -> None:
    """Have the coordinator create __transaction_state (a transactional producer's first FindCoordinator does)
    and wait until every partition of it has a leader."""
    producer = transactional_producer(bootstrap, unique("warm-up"))
    producer.flush(1)
    wait_until(
        lambda: (leaders := state_leaders(bootstrap)) and len(leaders) == partitions and min(leaders.values()) > 0,
        60.0,
        "__transaction_state with a leader for every partition",
        interval_s=0.5,
    )
