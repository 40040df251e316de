"""Three brokers whose every listener, the inter-broker one and the controller's included, is SASL_PLAINTEXT: they
register with the controller, replicate a topic of replication factor 3 and acknowledge acks=all writes, each
authenticating with its JAAS config's username and password, with PLAIN, or with SCRAM-SHA-256 once the brokers'
user has been created in the metadata log (docs/security.md#sasl)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from sasl_helpers import PLAIN_JAAS

from tierlog.testing.local_cluster import BrokerProcess, free_ports, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT_S = 60.0
HOST = "127.0.0.1"


@contextlib.contextmanager
def sasl_cluster(
    base_dir: Path,
    overrides: Mapping[str, str] | None = None,
    before_the_others: Callable[[BrokerProcess], None] = lambda controller: None,
) -> Iterator[list[BrokerProcess]]:
    """Node 1 (controller and broker) starts first; `before_the_others` runs once it answers, then nodes 2 and 3
    start."""
    controller_port, *ports = free_ports(4)
    common = {
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.controller.plain.sasl.jaas.config": PLAIN_JAAS,
        "min.insync.replicas": "2",
        "log.segment.bytes": str(1024 * 1024),
        **(overrides or {}),
    }
    brokers = []
    for node_id, port in enumerate(ports, start=1):
        listeners = f"SASL_PLAINTEXT://{HOST}:{port}"
        if node_id == 1:
            listeners += f",CONTROLLER://{HOST}:{controller_port}"
        settings = {
            **common,
            "process.roles": "broker,controller" if node_id == 1 else "broker",
            "listeners": listeners,
        }
        brokers.append(
            BrokerProcess(base_dir / f"broker-{node_id}" / "data", node_id=node_id, port=port, overrides=settings)
        )
    try:
        brokers[0].start()
        brokers[0].wait_ready(TIMEOUT_S)
        before_the_others(brokers[0])
        for broker in brokers[1:]:
            broker.start()
        for broker in brokers[1:]:
            broker.wait_ready(TIMEOUT_S)
        yield brokers
    finally:
        # The controller (node 1) last: the others' controlled shutdown asks it.
        for broker in reversed(brokers):
            if broker.running:
                broker.stop()
            print(f"\n---- last lines of {broker.log_file} ----\n{broker.log_tail(40)}")


def client_config(brokers: list[BrokerProcess]) -> dict[str, Any]:
    return {
        "bootstrap.servers": ",".join(broker.bootstrap for broker in brokers),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }


def assert_replicates_with_acks_all(brokers: list[BrokerProcess]) -> None:
    """A topic of replication factor 3 created, written with acks=all and read back, its ISR whole throughout."""
    admin = AdminClient(client_config(brokers))
    wait_until(lambda: len(admin.list_topics(timeout=5).brokers) == 3, TIMEOUT_S, "all three brokers registered")
    topic = f"sasl-rf3-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])[topic].result(TIMEOUT_S)

    def fully_replicated() -> bool:
        partition = admin.list_topics(topic, timeout=5).topics[topic].partitions.get(0)
        return partition is not None and sorted(partition.isrs) == [1, 2, 3]

    wait_until(fully_replicated, TIMEOUT_S, "every replica in the ISR")
    producer = Producer({**client_config(brokers), "acks": "all", "enable.idempotence": True})
    acknowledged: list[int] = []
    for i in range(50):
        producer.produce(
            topic, value=f"v{i}".encode(), partition=0, on_delivery=lambda e, m: acknowledged.append(m.offset())
        )
    assert producer.flush(TIMEOUT_S) == 0
    assert acknowledged == list(range(50))
    # Every follower fetched the records over SASL: the ISR is still whole after the acks=all writes.
    wait_until(fully_replicated, TIMEOUT_S, "every replica in the ISR after the writes")
    consumer = Consumer({**client_config(brokers), "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 50 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(50)]
    for broker in brokers:
        assert "Failed authentication" not in broker.log_tail(400), f"broker {broker.node_id} refused a peer"


def test_three_sasl_brokers_with_plain_replicate_with_acks_all(tmp_path: Path) -> None:
    with sasl_cluster(tmp_path) as brokers:
        assert_replicates_with_acks_all(brokers)


BROKER_SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="b-s";'


def create_the_brokers_scram_user(controller: BrokerProcess) -> None:
    admin = AdminClient({**client_config([controller]), "sasl.username": "admin", "sasl.password": "admin-secret"})
    upsertion = UserScramCredentialUpsertion("broker", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"b-s")
    admin.alter_user_scram_credentials([upsertion])["broker"].result(timeout=TIMEOUT_S)


def test_three_sasl_brokers_with_scram_between_them_replicate_once_their_user_exists(tmp_path: Path) -> None:
    scram = {
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
        "sasl.mechanism.controller.protocol": "SCRAM-SHA-256",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": BROKER_SCRAM_JAAS,
        "listener.name.controller.scram-sha-256.sasl.jaas.config": BROKER_SCRAM_JAAS,
    }
    with sasl_cluster(tmp_path, scram, before_the_others=create_the_brokers_scram_user) as brokers:
        assert_replicates_with_acks_all(brokers)
