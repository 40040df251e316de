"""Coordinators killed with SIGKILL. The transaction coordinator, in the middle of a transaction: the broker that
becomes leader of its __transaction_state partition loads the transaction from the log, the producer's commit goes
to it, and every record of the transaction becomes visible to read_committed readers, on each of three partitions;
the killed broker comes back and a next transaction commits too. The group coordinator, between transactions that
carry the group's offsets: the broker that takes over its __consumer_offsets partition answers the last committed
transaction's offsets, and the next transaction's offsets commit with it (docs/transactions.md#proof)."""

from __future__ import annotations

import signal
import time
from typing import Any

from cluster_helpers import ClusterFactory
from confluent_kafka import Consumer, IsolationLevel, KafkaException
from confluent_kafka.admin import NewTopic
from txn_helpers import (
    STATE_PARTITIONS,
    commit_retrying,
    find_coordinator,
    group_offsets,
    latest_offsets,
    read_whole,
    transactional_producer,
    unique,
    values,
    warm_up_transaction_state,
)

from tierlog.testing.local_cluster import wait_until

OVERRIDES = {
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": str(STATE_PARTITIONS),
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
}


def transactional_id_coordinated_by(address: str, nodes: set[int]) -> tuple[str, int]:
    """A fresh transactional id whose coordinator (FindCoordinator) is one of `nodes` now, and that node."""
    for _ in range(100):
        candidate = unique("killed-coordinator")
        coordinator = find_coordinator(address, candidate, key_type=1)
        if coordinator in nodes:
            return candidate, coordinator
    raise AssertionError(f"no transactional id is coordinated by {sorted(nodes)}")


def test_a_transaction_survives_its_coordinator_killed_mid_transaction(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    cluster = cluster_factory(OVERRIDES, brokers=3)
    bootstrap = cluster.bootstrap
    warm_up_transaction_state(bootstrap)
    topic = kafka.topic_name()
    admin = kafka.admin(bootstrap)
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    # Node 1 is the controller too: kill a coordinator that is a broker only.
    transactional_id, coordinator = transactional_id_coordinated_by(cluster.broker(1).bootstrap, {2, 3})
    producer = transactional_producer(bootstrap, transactional_id, request_timeout_ms=5000)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, b"before-kill-%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    cluster.broker(coordinator).kill(signal.SIGKILL)
    for i in range(3):
        producer.produce(topic, b"after-kill-%d" % i, partition=i)
    commit_retrying(producer)
    expected = sorted([b"before-kill-%d" % i for i in range(6)] + [b"after-kill-%d" % i for i in range(3)])
    assert sorted(values(read_whole(bootstrap, topic, range(3), "read_committed"))) == expected
    cluster.restart(coordinator)
    producer.begin_transaction()
    producer.produce(topic, b"after-restart", partition=0)
    commit_retrying(producer)
    wait_until(
        lambda: (
            latest_offsets(bootstrap, topic, range(3), IsolationLevel.READ_COMMITTED)
            == latest_offsets(bootstrap, topic, range(3), IsolationLevel.READ_UNCOMMITTED)
        ),
        30.0,
        "every last stable offset at its high watermark",
        interval_s=0.5,
    )
    assert sorted(values(read_whole(bootstrap, topic, range(3), "read_committed"))) == sorted(
        [*expected, b"after-restart"]
    )


def coordinator_when_ready(address: str, key: str, key_type: int) -> int:
    """FindCoordinator's node once it names one (the first asks create the internal topic)."""
    found: list[int] = []

    def named() -> bool:
        try:
            found.append(find_coordinator(address, key, key_type))
        except AssertionError:
            return False
        return True

    wait_until(named, 60.0, f"a coordinator for {key!r}", interval_s=0.5)
    return found[-1]


def test_transactional_offsets_survive_their_group_coordinator_killed(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    cluster = cluster_factory(
        {**OVERRIDES, "offsets.topic.replication.factor": "3", "offsets.topic.num.partitions": "5"},
        brokers=3,
        group_initial_rebalance_delay_ms=0,
    )
    bootstrap, address = cluster.bootstrap, cluster.broker(1).bootstrap
    warm_up_transaction_state(bootstrap)
    source, sink = kafka.topic_name("-in"), kafka.topic_name("-out")
    admin = kafka.admin(bootstrap)
    for future in admin.create_topics([NewTopic(source, 1, 3), NewTopic(sink, 1, 3)]).values():
        future.result(30)
    kafka.produce(bootstrap, source, [{"value": b"in-%d" % i} for i in range(15)])
    coordinator_when_ready(address, unique("warm-up"), key_type=0)
    group, coordinator = "", 0
    for _ in range(100):
        group = unique("ctp")
        coordinator = coordinator_when_ready(address, group, key_type=0)
        if coordinator != 1:  # node 1 is the controller too
            break
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = transactional_producer(bootstrap, unique("ctp"), request_timeout_ms=5000)
    try:
        consumer.subscribe([source])
        for batch in range(3):
            if batch == 2:
                cluster.broker(coordinator).kill(signal.SIGKILL)
                _wait_for_offsets(bootstrap, group, source, {0: 10})
            inputs = _consume(consumer, 5)
            assert [m.offset() for m in inputs] == list(range(5 * batch, 5 * batch + 5))
            producer.begin_transaction()
            for message in inputs:
                producer.produce(sink, b"out-" + (message.value() or b""))
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            commit_retrying(producer)
            assert _offsets_or_none(bootstrap, group, source) == {0: 5 * batch + 5}
    finally:
        consumer.close()
    cluster.restart(coordinator)
    assert _offsets_or_none(bootstrap, group, source) == {0: 15}
    assert sorted(values(read_whole(bootstrap, sink, [0], "read_committed"))) == sorted(
        b"out-in-%d" % i for i in range(15)
    )


def _wait_for_offsets(bootstrap: str, group: str, topic: str, expected: dict[int, int]) -> None:
    answers: list[object] = []

    def answered() -> bool:
        answers.append(_offsets_or_none(bootstrap, group, topic))
        return answers[-1] == expected

    wait_until(answered, 60.0, lambda: f"the group's offsets to be {expected} (the last answers: {answers[-3:]})", 0.5)


def _offsets_or_none(bootstrap: str, group: str, topic: str) -> dict[int, int] | str:
    """The group's committed offsets, or the error that answered."""
    try:
        return group_offsets(bootstrap, group, topic, [0])
    except KafkaException as error:
        return str(error)


def _consume(consumer: Consumer, count: int) -> list[Any]:
    messages: list[Any] = []
    deadline = time.monotonic() + 60.0
    while len(messages) < count:
        assert time.monotonic() < deadline, f"consumed {len(messages)} of {count}"
        messages.extend(m for m in consumer.consume(count - len(messages), 0.5) if m.error() is None)
    return messages
