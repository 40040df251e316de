"""A confluent-kafka consumer group against one broker process: records consumed through a subscription,
offsets committed, and after a restart (clean or kill -9) the broker loads them back from __consumer_offsets,
so a consumer of the same group resumes exactly where the first one committed."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tierlog.testing.local_cluster import BrokerProcess, wait_until

GROUP_SETTINGS = {
    "offsets_topic_replication_factor": 1,
    "offsets_topic_num_partitions": 5,
    "group_initial_rebalance_delay_ms": 0,
}
TIMEOUT_S = 30.0


def group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )


def consume(consumer: Consumer, count: int) -> list[tuple[int, int]]:
    """(partition, offset) of the next `count` records, bounded by TIMEOUT_S."""
    seen: list[tuple[int, int]] = []

    def read_all() -> bool:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            seen.append((message.partition(), message.offset()))
        return len(seen) >= count

    wait_until(read_all, TIMEOUT_S, lambda: f"{count} records (have {len(seen)})", 0)
    return seen


@pytest.mark.parametrize("restart", ["clean", "kill"])
def test_committed_offsets_survive_a_broker_restart(
    broker_factory: Callable[..., BrokerProcess], kafka: Any, restart: str
) -> None:
    broker = broker_factory(**GROUP_SETTINGS)
    topic = kafka.new_topic(broker.bootstrap, partitions=2)
    kafka.produce(broker.bootstrap, topic, [{"value": str(i).encode(), "partition": i % 2} for i in range(20)])
    group = f"{topic}-group"

    first = group_consumer(broker.bootstrap, group)
    try:
        first.subscribe([topic])
        seen = consume(first, 12)
        # Commit what was consumed, then read on without committing: those must come again.
        first.commit(asynchronous=False)
        committed = {tp.partition: tp.offset for tp in first.committed([TopicPartition(topic, p) for p in (0, 1)])}
        assert sum(committed.values()) == 12
        consume(first, 4)
    finally:
        first.close()

    if restart == "clean":
        broker.stop()
    else:
        broker.kill(signal.SIGKILL)
    broker.start()
    broker.wait_ready()

    second = group_consumer(broker.bootstrap, group)
    try:
        reloaded = second.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=TIMEOUT_S)
        assert {tp.partition: tp.offset for tp in reloaded} == committed
        second.subscribe([topic])
        rest = consume(second, 8)
    finally:
        second.close()
    # Exactly the records after the commit, each once: nothing lost, nothing consumed twice.
    assert sorted(rest) == sorted({(p, o) for p in (0, 1) for o in range(committed[p], 10)})
    assert not set(rest) & set(seen)
