"""An idempotent producer (confluent-kafka, enable.idempotence=true) while leaders are SIGKILLed and restarted:
every partition ends with exactly the values sent, each once, in send order.

Three real brokers; each partition has three replicas and min.insync.replicas=2, and is led by node 2 or 3
(node 1 runs the single controller and is never killed). A crash loses the leader's responses in flight, so
the producer resends its batches to the new leader, which must recognise those it already has from the
producer state it built as a follower (KIP-98's duplicate detection), and answer them with their original
offsets instead of writing them twice.

Every wait is bounded and names what it waited for; the brokers' log tails are printed at the end.
"""

from __future__ import annotations

import time
from typing import Any

from cluster_helpers import (
    BackgroundProducer,
    ClusterFactory,
    confirmed_leader,
    create_topic_with_leaders,
    describe_partitions,
    wait_confirmed_leader,
)
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import NewTopic

from tierlog.testing.local_cluster import wait_until

TOPIC = "idempotent"
# Replica order decides elections: a partition moves between nodes 2 and 3, node 1 is the last resort.
ASSIGNMENT = {0: [2, 3, 1], 1: [3, 2, 1]}
PARTITIONS = tuple(ASSIGNMENT)
BROKERS = (1, 2, 3)
KILLABLE = (2, 3)
OVERRIDES = {
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "5000",
    "min.insync.replicas": "2",
    "log.segment.bytes": str(64 * 1024),
}
# (partition whose leader dies, seconds it stays down): some restarts come before the session timeout.
ROUNDS = ((0, 0.5), (1, 2.5), (0, 1.5), (1, 0.3))
BURST = 5
PRODUCE_TICK_S = 0.02
MAX_QUEUED = 2000

RESTART_S = 45.0
REJOIN_S = 30.0
LEADER_S = 30.0
FLUSH_S = 60.0
SETTLE_S = 1.5


class ProducerThread(BackgroundProducer):
    """Sends `{partition}-{n}` for n = 0, 1, 2, ... to every partition until finished."""

    def __init__(self, bootstrap: str) -> None:
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "request.timeout.ms": 5000,
            # Nothing may fail: a message that expired would be a gap the test could not tell apart.
            "message.timeout.ms": 120_000,
            "retry.backoff.ms": 100,
            "retry.backoff.max.ms": 500,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        super().__init__("idempotent-producer", config, tick_s=PRODUCE_TICK_S, max_queued=MAX_QUEUED, flush_s=FLUSH_S)
        self.sent: dict[int, list[bytes]] = {p: [] for p in PARTITIONS}
        self.acked = 0
        self.failed: list[str] = []

    def on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed.append(f"p{message.partition()}: {error}")
        else:
            self.acked += 1

    def produce_burst(self) -> None:
        for _ in range(BURST):
            for partition in PARTITIONS:
                value = f"{partition}-{len(self.sent[partition])}".encode()
                self.producer.produce(TOPIC, value=value, partition=partition, on_delivery=self.on_delivery)
                self.sent[partition].append(value)


def test_idempotent_producer_sends_every_record_once_in_order_while_leaders_crash(
    cluster_factory: ClusterFactory, kafka: Any
) -> None:
    cluster = cluster_factory(OVERRIDES, brokers=len(BROKERS))
    producer: ProducerThread | None = None
    kills: list[tuple[int, int, int]] = []
    try:
        new_topic = NewTopic(
            TOPIC,
            num_partitions=len(PARTITIONS),
            replica_assignment=[ASSIGNMENT[p] for p in PARTITIONS],
            config={"min.insync.replicas": "2"},
        )
        create_topic_with_leaders(cluster, new_topic, len(PARTITIONS), LEADER_S)
        producer = ProducerThread(cluster.bootstrap)
        producer.start()
        wait_until(lambda: producer.acked >= 200, 30, lambda: f"200 acknowledgements (have {producer.acked})")

        for round_no, (partition, down_s) in enumerate(ROUNDS, 1):
            leader, epoch = wait_confirmed_leader(cluster, TOPIC, partition, LEADER_S, f"round {round_no}: ")
            assert leader in KILLABLE, f"round {round_no}: p{partition} is led by node {leader}, the controller"
            cluster.kill(leader)
            time.sleep(down_s)
            cluster.restart(leader, timeout_s=RESTART_S)
            wait_until(
                lambda p=partition, e=epoch: (lambda c: c is not None and c[1] > e)(
                    confirmed_leader(cluster, TOPIC, p)
                ),
                REJOIN_S,
                lambda n=leader, r=round_no: (
                    f"round {r}: broker {n} back in the ISR under a new epoch ({describe_partitions(cluster, TOPIC)})"
                ),
            )
            kills.append((partition, leader, epoch))
            print(f"round {round_no}: killed broker {leader} (leader of p{partition}, epoch {epoch}) for {down_s}s")
            time.sleep(SETTLE_S)

        producer.finish()
        sent = producer.sent
        summary = (
            f"{producer.acked} acknowledged of {sum(map(len, sent.values()))} sent, {len(producer.failed)} failed "
            f"(first {producer.failed[:3]}), {producer.unflushed} unflushed, kills {kills}"
        )
        print(summary, flush=True)
        assert not producer.failed and producer.unflushed == 0, summary
        assert producer.acked == sum(map(len, sent.values())), summary

        consumed = kafka.consume_all(cluster.bootstrap, TOPIC, PARTITIONS)
        for partition in PARTITIONS:
            values = [r.value for r in consumed if r.partition == partition]
            offsets = [r.offset for r in consumed if r.partition == partition]
            assert offsets == list(range(len(offsets))), f"p{partition}: offsets have gaps"
            duplicates = len(values) - len(set(values))
            missing = set(sent[partition]) - set(values)
            assert values == sent[partition], (
                f"p{partition}: {len(values)} records stored for {len(sent[partition])} sent, {duplicates} duplicates, "
                f"{len(missing)} missing (first {sorted(missing)[:3]}), first difference at index "
                f"{next((i for i, (a, b) in enumerate(zip(values, sent[partition], strict=False)) if a != b), None)}; "
                f"{summary}"
            )
    finally:
        if producer is not None:
            producer.close()
