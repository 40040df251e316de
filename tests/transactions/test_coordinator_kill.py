"""The transaction coordinator killed with SIGKILL in the middle of a transaction: the broker that becomes leader of
its __transaction_state partition loads the transaction from the log, the producer's commit goes to it, and every
record of the transaction becomes visible to read_committed readers, on each of three partitions; the killed broker
comes back and a next transaction commits too (docs/transactions.md#proof)."""

from __future__ import annotations

import signal
from typing import Any

from cluster_helpers import ClusterFactory
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import NewTopic
from txn_helpers import (
    STATE_PARTITIONS,
    commit_retrying,
    find_coordinator,
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
